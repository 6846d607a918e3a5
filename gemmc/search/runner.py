"""The Runner: measures a built schedule on the GPU with the bench harness's timing rules.

Default path (GPU): `gemmc.compile(spec, schedule=s, arch=...)` (a cache hit after the Builder),
then `gemmc.bench.timing.bench_shape`, which checks the output against the fp32 reference before
timing and times gemmc and cuBLAS interleaved in CUDA graphs over rotated input sets. A failed
check is an error, never a time. Tests inject `measure_fn` instead.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..schedule import Schedule
from ..spec import GemmSpec
from .strategy import SUSTAINED, Measurement

MeasureFn = Callable[[GemmSpec, Schedule, str], Measurement]


class Runner:
    def __init__(self, measure_fn: Optional[MeasureFn] = None, timing=None, device: str = "cuda"):
        self.measure_fn = measure_fn
        self.timing = timing          # gemmc.bench.timing.TimingConfig (default: the bench's)
        self.device = device
        self._sets = {}
        self._clock = None

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
        key = (spec.m, spec.n, spec.k, str(spec.dtype))
        if key not in self._sets:
            self._sets.clear()
            torch.cuda.empty_cache()
            shape = Shape(spec.m, spec.n, spec.k)
            n = input_set_count(shape, spec.dtype.bytes, l2_bytes_of(), self.timing.l2_factor, self.timing.max_sets)
            self._sets[key] = (shape, make_input_sets(shape, torch_dtype(spec.dtype), self.device, n, self.timing.seed))
        return self._sets[key]

    def _measure_gpu(self, spec: GemmSpec, schedule: Schedule, arch: str, kernel_spec: GemmSpec) -> Measurement:
        import gemmc
        from ..bench.timing import CudaClock, TimingConfig, bench_shape, spin_up
        if spec.has_epilogue or spec.a_layout != "mk" or spec.b_layout != "nk" or spec.batch is not None:
            raise NotImplementedError("the GPU Runner measures plain A[M,K] @ B[N,K].T GEMMs (the bench's "
                                      "timing rules); epilogue problems need their own reference")
        if self.timing is None:
            self.timing = TimingConfig()
        if self._clock is None:
            self._clock = CudaClock(graphs=not self.timing.host_timing)
            spin_up(device=self.device)
        try:
            kernel = gemmc.compile(kernel_spec, schedule=schedule, arch=arch)
            shape, sets = self._inputs(spec)
            rec = bench_shape(shape, kernel, sets, self._clock, self.timing)
        except Exception as e:
            return Measurement(schedule, None, f"run: {type(e).__name__}: {e}"[:2000])
        if rec.get("status") != "ok":
            return Measurement(schedule, None, f"check: {rec.get('error')}")
        # cublas_us is the cuBLAS time paired with this gemmc time: gemmc median x the median per-repeat
        # ratio, so the DB's cublas_us / time_us is the bench's drift-proof ratio
        gemmc_us = rec["gemmc_us"]["median"]
        return Measurement(schedule, gemmc_us, None, cublas_us=gemmc_us * rec["ratio"],
                           timing=SUSTAINED if rec.get("sustained") else None)
