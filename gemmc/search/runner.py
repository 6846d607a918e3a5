"""The Runner: measures a built schedule on the GPU with the bench harness's timing rules.

Default path (GPU): `gemmc.compile(spec, schedule=s, arch=...)` (a cache hit after the Builder),
then `gemmc.bench.timing.bench_shape`, which checks the output against the fp32 reference before
timing and times gemmc and cuBLAS interleaved in CUDA graphs over rotated input sets. A failed
check is an error, never a time. Tests inject `measure_fn` instead.

A measurement that raises is that schedule's error, unless it left the GPU unusable (a sticky CUDA
error such as an illegal address: every later call in the process fails too). Then the Runner raises
GpuLostError, so the tune stops instead of storing every later schedule as failed. The GPU is checked
before each measurement, so such an error is the current schedule's doing; a resumed run (a new
process, a new CUDA context) goes on after it.

The GPU idles while a batch compiles (up to minutes), and its clocks fall: a measurement that follows a
pause of more than RESPIN_AFTER_IDLE_S first brings them back (`bench.timing.spin_up`), as the bench's
sweep does after its compiles.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from ..errors import GemmcError
from ..schedule import Schedule
from ..spec import GemmSpec
from ..choose.tuning_db_verdict import CHECK_FAILED
from .strategy import SUSTAINED, Measurement

MeasureFn = Callable[[GemmSpec, Schedule, str], Measurement]

# measurements of one batch follow each other within a fraction of a second; a compile batch idles longer
RESPIN_AFTER_IDLE_S = 1.0

_RESUME = "run the same `gemmc-search tune` command again to resume (a new process gets a working GPU context)"


class GpuLostError(GemmcError):
    """The GPU cannot run anything more in this process (a sticky CUDA error). `measurement`: the failed
    row of the schedule that caused it, to store; None when the GPU was unusable before it started."""

    def __init__(self, message: str, measurement: Optional[Measurement] = None):
        super().__init__(message)
        self.measurement = measurement


class Runner:
    def __init__(self, measure_fn: Optional[MeasureFn] = None, timing=None, device: str = "cuda"):
        self.measure_fn = measure_fn
        self.timing = timing          # gemmc.bench.timing.TimingConfig (default: the bench's)
        self.device = device
        self._sets = {}
        self._clock = None
        self._busy_until: Optional[float] = None    # perf_counter() when the last GPU measurement ended

    @staticmethod
    def gpu_name() -> str:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"

    def measure(self, spec: GemmSpec, schedule: Schedule, arch: str,
                kernel_spec: Optional[GemmSpec] = None) -> Measurement:
        """Time `schedule` on the problem `spec`; the kernel is compiled for `kernel_spec` (default
        `spec`; the symbolic spec when one kernel serves every shape, as the Builder built it)."""
        if self.measure_fn is not None:
            return self.measure_fn(spec, schedule, arch)
        return self._measure_gpu(spec, schedule, arch, kernel_spec or spec)

    def _inputs(self, spec: GemmSpec):
        """Input sets per shape, kept across the schedules of one problem."""
        import torch

        from ..bench.suites import Shape
        from ..bench.timing import input_set_count, l2_bytes_of, make_input_sets
        from ..types import torch_dtype
        mode = spec.scaling.mode if spec.scaling is not None else None
        key = (spec.m, spec.n, spec.k, str(spec.dtype), mode)
        if key not in self._sets:
            self._sets.clear()
            torch.cuda.empty_cache()
            shape = Shape(spec.m, spec.n, spec.k)
            n = input_set_count(shape, spec.dtype.bytes, l2_bytes_of(), self.timing.l2_factor, self.timing.max_sets)
            if mode is not None:        # fp8: quantized operands with their scales (gemmc.bench.fp8)
                from ..bench.timing import make_fp8_input_sets
                self._sets[key] = (shape, make_fp8_input_sets(shape, mode, self.device, n, self.timing.seed))
            else:
                self._sets[key] = (shape, make_input_sets(shape, torch_dtype(spec.dtype), self.device, n,
                                                          self.timing.seed))
        return self._sets[key]

    def _gpu_fault(self) -> Optional[str]:
        """None while the GPU runs work; else the sticky error synchronize raises (it stays for the process)."""
        import torch
        try:
            torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001  torch raises RuntimeError (AcceleratorError in newer ones)
            return f"{type(e).__name__}: {e}".strip()[:500]
        return None

    def _respin(self) -> None:
        """After a compile batch (or the first time) the clocks are low: bring them back before timing."""
        from ..bench.timing import spin_up
        if self._busy_until is None or time.perf_counter() - self._busy_until > RESPIN_AFTER_IDLE_S:
            spin_up(device=self.device)

    def _guarded(self, where: str, schedule: Schedule, run):
        """(run(), None), or (None, the schedule's failed Measurement) where run raised. A GPU already unusable
        is not this schedule's doing: GpuLostError, nothing stored; one this schedule left unusable: GpuLostError
        carrying its failed Measurement."""
        fault = self._gpu_fault()
        if fault is not None:
            raise GpuLostError(f"the GPU was unusable before measuring {where} ({fault}); nothing more can be "
                               f"measured in this process, and {schedule.short()} was not stored: {_RESUME}")
        try:
            return run(), None
        except Exception as e:
            error = f"run: {type(e).__name__}: {e}"[:2000]
            fault = self._gpu_fault()
            if fault is not None:   # the GPU was fine before: this schedule broke it
                raise GpuLostError(
                    f"measuring {where} left the GPU unusable ({fault}); {schedule.short()} is stored as failed "
                    f"and nothing after it was measured: {_RESUME}",
                    Measurement(schedule, None, f"{error} [it left the GPU unusable: {fault}]"[:2000])) from e
            return None, Measurement(schedule, None, error)
        finally:
            self._busy_until = time.perf_counter()

    def _measure_gpu(self, spec: GemmSpec, schedule: Schedule, arch: str, kernel_spec: GemmSpec) -> Measurement:
        import gemmc
        from ..bench.fp8 import baseline, fp8_call
        from ..bench.timing import CudaClock, TimingConfig, bench_shape
        if spec.grouped:
            return self._measure_grouped(spec, schedule, arch, kernel_spec)
        fp8 = spec.scaling is not None
        plain = not spec.has_epilogue or (fp8 and not spec.epilogue and not spec.inputs)
        if not plain or spec.a_layout != "mk" or spec.b_layout != "nk" or spec.batch is not None:
            raise NotImplementedError("the GPU Runner measures plain A[M,K] @ B[N,K].T GEMMs (the bench's "
                                      "timing rules; fp8 ones against torch's fp8 GEMM, gemmc.bench.fp8); "
                                      "epilogue problems need their own reference")
        if self.timing is None:
            self.timing = TimingConfig()
        if self._clock is None:
            self._clock = CudaClock(graphs=not self.timing.host_timing)
        where = f"{schedule.short()} on {spec.m}x{spec.n}x{spec.k}"

        def run():
            kernel = gemmc.compile(kernel_spec, schedule=schedule, arch=arch)
            shape, sets = self._inputs(spec)
            self._respin()
            if fp8:
                return bench_shape(shape, fp8_call(kernel), sets, self._clock, self.timing,
                                   baseline(spec.scaling.mode))
            return bench_shape(shape, kernel, sets, self._clock, self.timing)
        rec, failed = self._guarded(where, schedule, run)
        if failed is not None:
            return failed
        if rec.get("status") != "ok":
            return Measurement(schedule, None, f"{CHECK_FAILED}{rec.get('error')}")   # db.failed_check reads it
        # cublas_us is the cuBLAS time paired with this gemmc time: gemmc median x the median per-repeat
        # ratio, so the DB's cublas_us / time_us is the bench's drift-proof ratio
        gemmc_us = rec["gemmc_us"]["median"]
        return Measurement(schedule, gemmc_us, None, cublas_us=gemmc_us * rec["ratio"],
                           timing=SUSTAINED if rec.get("sustained") else None)

    def _measure_grouped(self, spec: GemmSpec, schedule: Schedule, arch: str, kernel_spec: GemmSpec) -> Measurement:
        """A grouped problem (the moe suite): every group holds the problem's rows per group
        (gemmc.bench.grouped_timing.measure_grouped: the check, then gemmc and torch._grouped_mm interleaved in
        CUDA graphs); torch._grouped_mm's time is stored as the row's baseline (cublas_us): for an fp8 problem,
        its bf16 GEMM of the operands dequantized ahead of time."""
        import gemmc
        from ..bench.grouped_timing import measure_grouped
        from ..choose.group_keys import rows_per_group
        where = f"{schedule.short()} on {spec.name} ({spec.m} rows over {spec.groups} groups)"

        def run():
            kernel = gemmc.compile(kernel_spec, schedule=schedule, arch=arch)
            self._respin()
            return measure_grouped(spec, kernel, rows_per_group(spec))
        rec, failed = self._guarded(where, schedule, run)
        if failed is not None:
            return failed
        if not rec["ok"]:
            return Measurement(schedule, None, f"{CHECK_FAILED}{rec['of_bound']:.3g} of the elementwise bound "
                               "against each group's fp32 reference (NaN: a row of no group written)")
        return Measurement(schedule, rec["gemmc_us"], None, cublas_us=rec["grouped_mm_us"])
