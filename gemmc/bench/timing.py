"""Measuring gemmc against cuBLAS: input sets, the correctness check, and interleaved timing.

Everything that touches the device is behind two small seams, so CI can drive the same code on
the CPU with fake kernels and a virtual clock:
  - a kernel is any callable `fn(a, b, out=None) -> out` computing a @ b.T (gemmc's compiled
    kernels and `cublas_matmul` below both are);
  - a `Clock` turns a list of calls into one timed unit (`prepare`: a CUDA graph of them, or an
    eager loop) and times a unit (`time_ms`: CUDA events around it, synchronized).

The rules (the architecture's "Measuring"): gemmc and cuBLAS side by side in one process,
interleaved repeat by repeat; CUDA graphs of several launches so launch gaps don't count; input
sets rotated through at least `l2_factor` x the L2 size; randn inputs; the median of repeats and
the spread; and every gemmc result checked against an fp32 reference, output NaN-filled first:
one eager launch before timing, and the timed launches themselves (the graph replays' output slots,
NaN-filled before the first replay) after it. The check (`check_failure`): the relative Frobenius
error within CUBLAS_FACTOR x cuBLAS's own on the same inputs + CUBLAS_SLACK (capped at the
tolerance), and every element within the bound of gemmc.reference (output rounding + fp32
accumulation), so a localized error fails even where the norm hides it.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Callable, Optional, Protocol, Sequence

import torch

from ..quantize import Quantized
from ..reference import error_figures, fp32_matmul, gemm_bound, rel_frobenius
from ..schedule import Schedule
from .stats import summarize, tflops
from .suites import Shape

DEFAULT_L2_BYTES = 60 * 1024 * 1024   # H100/H200 L2, when the device does not say
SLOT_ALIGN_ELEMS = 64                 # input-set slots start 128-byte aligned (TMA needs 16)
# A plain GEMM's relative error (16-bit output) may be at most this x cuBLAS's on the same inputs, + the
# slack: a correct kernel's is cuBLAS's within a few % (both are mostly the output rounding), while a K tile
# dropped from one of 128 output tiles at 2048^2 x 8192, or a 1-column K tail, reads ~5x cuBLAS's in bf16,
# and an f16 output rounded through bf16 ~8x. The slack keeps accumulation noise from counting.
CUBLAS_FACTOR = 2.0
CUBLAS_SLACK = 1e-4

Kernel = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class TimingConfig:
    repeats: int = 10          # timed units per side, interleaved gemmc/cuBLAS/cuBLAS/gemmc...
    warmup: int = 1            # untimed units per side before the repeats
    min_unit_us: float = 1000  # one timed unit (graph) runs at least this long...
    min_launches: int = 1
    max_launches: int = 200    # ...with this many launches at most (raised to cover every input set)
    l2_factor: float = 2.0     # rotate through input sets totalling at least this x L2
    # ...in at most this many sets (one launch each per unit): enough for every suite shape, down to 64^3
    # (24 KiB a set: 5120 sets on a 60 MiB L2), on an L2 of up to 96 MiB; tinier shapes are flagged instead
    max_sets: int = 8192
    host_timing: bool = False  # eager user-style calls (host overhead included), no graphs
    tolerance: float = 1e-2    # cap on the relative Frobenius error against the fp32 reference (see check_failure)
    seed: int = 0
    aa_check: bool = False     # also time cuBLAS against itself (a third interleaved side): the noise floor
    # Seconds of back-to-back cuBLAS units before timing a shape whose call takes >= SETTLE_MIN_CALL_US:
    # long GEMMs are power-capped, and the clock steps down after a few hundred ms of load. Settling
    # times both sides in that sustained state instead of straddling the step (0: off).
    settle_s: float = 0.0
    # Seconds each side runs back to back before each of its timed units, for shapes whose call takes
    # >= SETTLE_MIN_CALL_US: every sample is then taken at that side's own power-capped clock. Under the
    # cap a kernel that spends more energy per call clocks lower, which short interleaved units do not see
    # (the clock they share is set by both). Replaces the interleaved timing of those shapes (0: off).
    sustained_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


# ---- clocks -----------------------------------------------------------------------------------

class Clock(Protocol):
    def prepare(self, calls: Sequence[Callable[[], object]]) -> Callable[[], None]: ...
    def time_ms(self, unit: Callable[[], None]) -> float: ...


class CudaClock:
    """CUDA events on torch's current stream. graphs=True captures the calls into one CUDA graph
    (launch gaps vanish); graphs=False runs them eagerly, host overhead included."""

    def __init__(self, graphs: bool = True):
        self.graphs = graphs
        self._side = None

    def prepare(self, calls):
        calls = list(calls)
        if not self.graphs:
            def unit():
                for c in calls:
                    c()
            return unit
        # Warm on a side stream first: libraries allocate workspaces lazily, which capture forbids.
        if self._side is None:          # one side stream: per-stream caches (workspaces) stay bounded
            self._side = torch.cuda.Stream()
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            calls[0]()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        def unit():  # the closure keeps the graph alive as long as the unit
            graph.replay()
        return unit

    def time_ms(self, unit) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        unit()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


# ---- kernels -------------------------------------------------------------------------------

def cublas_matmul(a: torch.Tensor, b: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The baseline: torch.matmul (cuBLAS on CUDA) of A [M, K] with B [N, K] transposed."""
    return torch.matmul(a, b.T, out=out)


# ---- input sets ----------------------------------------------------------------------------

@dataclass
class InputSets:
    """`n` independent (A, B) pairs and one output per pair and side, in 128B-aligned slots."""
    a: list
    b: list
    out_gemmc: list
    out_cublas: list
    set_bytes: int
    gemmc_block: Optional[torch.Tensor] = None   # (n, M*N) view of every gemmc slot: one NaN fill or scan

    @property
    def n(self) -> int:
        return len(self.a)

    @property
    def rotated_bytes(self) -> int:
        return self.n * self.set_bytes


def set_bytes(shape: Shape, elem_bytes: int, out_bytes: Optional[int] = None) -> int:
    """Bytes one call touches: A, B and its output."""
    out_bytes = elem_bytes if out_bytes is None else out_bytes
    return (shape.m * shape.k + shape.n * shape.k) * elem_bytes + shape.m * shape.n * out_bytes


def input_set_count(shape: Shape, elem_bytes: int, l2_bytes: int, l2_factor: float = 2.0,
                    max_sets: int = TimingConfig.max_sets) -> int:
    return max(1, min(max_sets, math.ceil(l2_factor * l2_bytes / set_bytes(shape, elem_bytes))))


def _slots(n: int, rows: int, cols: int, dtype, device, generator=None, randn: bool = False) -> tuple[list, object]:
    """(n slots of rows x cols, the (n, rows*cols) view of them all)."""
    size = rows * cols
    stride = -(-size // SLOT_ALIGN_ELEMS) * SLOT_ALIGN_ELEMS
    if randn:
        buf = torch.randn(n, stride, dtype=dtype, device=device, generator=generator)
    else:
        buf = torch.empty(n, stride, dtype=dtype, device=device)
    return [buf[i, :size].view(rows, cols) for i in range(n)], buf[:, :size]


def make_input_sets(shape: Shape, dtype: torch.dtype, device, n_sets: int, seed: int = 0) -> InputSets:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    m, n, k = shape.m, shape.n, shape.k
    elem = torch.empty((), dtype=dtype).element_size()
    out_gemmc, block = _slots(n_sets, m, n, dtype, device)
    return InputSets(
        a=_slots(n_sets, m, k, dtype, device, gen, randn=True)[0],
        b=_slots(n_sets, n, k, dtype, device, gen, randn=True)[0],
        out_gemmc=out_gemmc,
        out_cublas=_slots(n_sets, m, n, dtype, device)[0],
        set_bytes=set_bytes(shape, elem),
        gemmc_block=block,
    )


def make_fp8_input_sets(shape: Shape, mode: str, device, n_sets: int, seed: int = 0) -> InputSets:
    """InputSets of fp8 operands (gemmc.quantize.Quantized: e4m3 values and their `mode` scales, from
    gemmc.bench.fp8.quantized_operand) and bf16 output slots."""
    from .fp8 import OUT_DTYPE, quantized_operand
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    m, n, k = shape.m, shape.n, shape.k
    out_gemmc, block = _slots(n_sets, m, n, OUT_DTYPE, device)
    return InputSets(a=[quantized_operand(m, k, mode, False, device, gen) for _ in range(n_sets)],
                     b=[quantized_operand(n, k, mode, True, device, gen) for _ in range(n_sets)],
                     out_gemmc=out_gemmc, out_cublas=_slots(n_sets, m, n, OUT_DTYPE, device)[0],
                     set_bytes=set_bytes(shape, 1, OUT_DTYPE.itemsize), gemmc_block=block)


def l2_bytes_of(device=None) -> int:
    """The device's L2 size from torch, or 60 MB (H100/H200) when it cannot say."""
    try:
        if torch.cuda.is_available():
            size = int(getattr(torch.cuda.get_device_properties(device or 0), "L2_cache_size", 0))
            if size > 0:
                return size
    except Exception:  # a broken driver must not stop a CPU run
        pass
    return DEFAULT_L2_BYTES


# ---- correctness -----------------------------------------------------------------------------

def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 product of the upcast inputs (TF32 off, so the reference is exact to fp32)."""
    with fp32_matmul():
        return a.float() @ b.float().T


@dataclass
class Reference:
    """The fp32 reference of one input set and the elementwise bound a correct kernel's output meets."""
    ref: torch.Tensor
    bound: torch.Tensor


def reference_with_bound(a: torch.Tensor, b: torch.Tensor, out_dtype=None) -> Reference:
    """`reference(a, b)` and gemmc.reference's bound for an output of `out_dtype` (default a's): two fp32
    matmuls, the second of |a| and |b|. fp8 operands (gemmc.quantize.Quantized) are dequantized first."""
    fp8 = isinstance(a, Quantized)
    with fp32_matmul():
        a32, b32 = (a.dequantized(), b.dequantized()) if fp8 else (a.float(), b.float())
        ref = a32 @ b32.T
        abs_product = a32.abs() @ b32.abs().T
    return Reference(ref, gemm_bound(ref, abs_product, a.shape[-1], out_dtype or a.dtype, fp8=fp8))


def check_output(fn: Kernel, a, b, out, ref) -> float:
    """Run `fn` into a NaN-filled `out` and return its relative Frobenius error (gemmc.reference.rel_frobenius:
    inf where it leaves an element unwritten)."""
    out.fill_(float("nan"))
    fn(a, b, out=out)
    return rel_frobenius(out, ref)


def check_failure(rel_err: float, elem_err: float, tolerance: float,
                  cublas_rel_err: Optional[float] = None) -> Optional[str]:
    """None when the figures pass, else what was measured against which bound. Passing: rel_err below
    `tolerance` and, for a plain GEMM whose cuBLAS error on the same inputs is given, at most
    CUBLAS_FACTOR x that + CUBLAS_SLACK; and elem_err (max |out - ref| / gemmc.reference's bound) <= 1."""
    limit, how = tolerance, f"the cap {tolerance:g}"
    if cublas_rel_err is not None and math.isfinite(cublas_rel_err):
        limit = min(tolerance, CUBLAS_FACTOR * cublas_rel_err + CUBLAS_SLACK)
        how = f"{CUBLAS_FACTOR:g} x cuBLAS's {cublas_rel_err:.3g} + {CUBLAS_SLACK:g}, cap {tolerance:g}"
    if rel_err < tolerance and rel_err <= limit and elem_err <= 1.0:
        return None
    return (f"relative Frobenius error {rel_err:.3g} (limit {limit:.3g}: {how}), max elementwise error "
            f"{elem_err:.3g} x its bound (limit 1; bound: output rounding of |ref| + sqrt(K) fp32 accumulation "
            "of |a||b|) against the fp32 reference (NaN: output elements left unwritten)")


def _worst(x: float, y: float) -> float:
    return math.nan if math.isnan(x) or math.isnan(y) else max(x, y)


def nan_fill(sets: InputSets, count: Optional[int] = None) -> None:
    """NaN into the first `count` (default all) gemmc output slots: an element a launch leaves unwritten fails."""
    count = sets.n if count is None else count
    if sets.gemmc_block is not None:
        sets.gemmc_block[:count].fill_(float("nan"))
    else:
        for out in sets.out_gemmc[:count]:
            out.fill_(float("nan"))


def _nonfinite_slots(sets: InputSets, count: int) -> list:
    """The gemmc output slots among the first `count` holding a non-finite value (one scan of them all)."""
    if sets.gemmc_block is not None:
        ok = torch.isfinite(sets.gemmc_block[:count]).all(dim=1).tolist()
    else:
        ok = [bool(torch.isfinite(out).all()) for out in sets.out_gemmc[:count]]
    return [j for j, good in enumerate(ok) if not good]


class Checker:
    """The check of one shape's gemmc outputs: per input set the fp32 reference, its elementwise bound and
    cuBLAS's own error (one eager call), made on first use and kept. cuBLAS's error bounds gemmc's only for
    16-bit outputs, where the output rounding both share dominates it (an f32 output's is accumulation
    order, which may differ more than 2x between correct kernels)."""

    def __init__(self, sets: InputSets, cublas: Kernel, tolerance: float):
        self.sets, self.cublas, self.tolerance = sets, cublas, tolerance
        self._refs: dict = {}
        self._vs_cublas = sets.out_gemmc[0].element_size() <= 2

    def _failure(self, rel: float, elem: float, cublas_rel: float) -> Optional[str]:
        return check_failure(rel, elem, self.tolerance, cublas_rel if self._vs_cublas else None)

    def of(self, j: int) -> tuple[Reference, float, float]:
        """(reference, cuBLAS's rel_err, cuBLAS's elem_err) of input set j; runs cuBLAS into out_cublas[j]."""
        if j not in self._refs:
            s = self.sets
            r = reference_with_bound(s.a[j], s.b[j], s.out_gemmc[j].dtype)
            s.out_cublas[j].fill_(float("nan"))
            self.cublas(s.a[j], s.b[j], out=s.out_cublas[j])
            self._refs[j] = (r, *error_figures(s.out_cublas[j], r.ref, r.bound))
        return self._refs[j]

    def call(self, fn: Kernel, j: int = 0) -> dict:
        """One eager launch of `fn` on input set j into its NaN-filled gemmc slot, checked."""
        out = self.sets.out_gemmc[j]
        out.fill_(float("nan"))
        fn(self.sets.a[j], self.sets.b[j], out=out)
        r, cub_rel, cub_elem = self.of(j)
        rel, elem = error_figures(out, r.ref, r.bound)
        return {"rel_err": rel, "elem_err": elem, "cublas_rel_err": cub_rel, "cublas_elem_err": cub_elem,
                "error": self._failure(rel, elem, cub_rel)}

    def slots(self, launches: int, n_sets: Optional[int] = None) -> dict:
        """After timed replays of a unit of `launches` calls over the first `n_sets` input sets (call i writes
        slot i mod n_sets): every one of those slots finite, and the slots of its first and last call within
        the bound of their own input set."""
        n = self.sets.n if n_sets is None else n_sets
        checked = sorted({0, (launches - 1) % n})
        rel = elem = 0.0
        failure = None
        for j in checked:
            r, cub_rel, _ = self.of(j)
            rj, ej = error_figures(self.sets.out_gemmc[j], r.ref, r.bound)
            rel, elem = _worst(rel, rj), _worst(elem, ej)
            failure = failure or self._failure(rj, ej, cub_rel)
        bad = _nonfinite_slots(self.sets, n)
        if failure is None and bad:
            failure = f"non-finite output in {len(bad)} of {n} slots (first: slot {bad[0]}; NaN: left unwritten)"
        if failure is not None:
            failure = f"timed launches (slots {checked} of {n} checked after the replays): {failure}"
        return {"timed_rel_err": rel, "timed_elem_err": elem, "timed_slots": checked,
                "timed_nonfinite_slots": len(bad), "error": failure}


# ---- timing ----------------------------------------------------------------------------------

SETTLE_MIN_CALL_US = 100.0   # shorter calls do not reach the power cap within a timed unit
RESPIN_AFTER_COMPILE_S = 1.0   # a shape compiled in the loop for longer left the GPU idle: its clocks fell


def settle(unit: Callable[[], None], clock: Clock, seconds: float) -> int:
    """Run `unit` back to back for `seconds` (the GPU reaches its sustained, power-capped clock). Returns the
    number of units run."""
    t_end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < t_end:
        clock.time_ms(unit)
        n += 1
    return n


def paired_ratio(cublas_ms: Sequence[float], gemmc_ms: Sequence[float]) -> float:
    """Median over repeats of cuBLAS / gemmc, each pair timed back to back in one repeat. A clock step
    during the repeats (power cap, heat) moves both sides of a pair together, so it cancels here, while
    the ratio of the two medians can compare one side's fast half with the other's slow half."""
    return statistics.median(c / g for c, g in zip(cublas_ms, gemmc_ms))


def drift(samples: Sequence[float]) -> float:
    """Spread of one side's samples, max / min - 1: a clock step shows as > ~0.03."""
    return max(samples) / min(samples) - 1.0


def launch_count(est_us: float, n_sets: int, cfg: TimingConfig) -> int:
    """Launches per timed unit: enough for `min_unit_us`, within the bounds, and at least one per
    input set so every unit rotates through all of them."""
    want = math.ceil(cfg.min_unit_us / max(est_us, 1e-3))
    return max(n_sets, min(cfg.max_launches, max(cfg.min_launches, want)))


def _alternating_samples(units: dict, clock: Clock, repeats: int, hold_s: float = 0.0) -> dict:
    """ms per unit, for each named unit, `repeats` samples each, the order reversed every repeat so neither
    side always runs first; hold_s > 0 runs a unit back to back that long before each of its samples."""
    names = list(units)
    samples = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            if hold_s > 0:
                settle(units[name], clock, hold_s)
            samples[name].append(clock.time_ms(units[name]))
    return samples


def time_sustained(units: dict, clock: Clock, repeats: int, seconds: float) -> dict:
    """ms per unit, for each named unit: before every sample the unit runs back to back for `seconds`, so
    the GPU's clock has settled to what that unit alone draws. The order alternates every repeat."""
    return _alternating_samples(units, clock, repeats, hold_s=seconds)


def time_interleaved(units: dict, clock: Clock, repeats: int, warmup: int = 1) -> dict:
    """ms per unit, for each named unit, alternating the order every repeat so neither side
    always runs first (clock boost, L2 and power state are shared)."""
    for _ in range(warmup):
        for name in units:
            clock.time_ms(units[name])
    return _alternating_samples(units, clock, repeats)


def unit_calls(fn: Kernel, sets: InputSets, outs: list, launches: int, host_timing: bool) -> list:
    """The calls of one timed unit: launch i uses input set i mod n. Host timing makes the user's
    call (output allocated by the callee); otherwise output goes to the preallocated slot."""
    calls = []
    for i in range(launches):
        j = i % sets.n
        if host_timing:
            calls.append(partial(fn, sets.a[j], sets.b[j]))
        else:
            calls.append(partial(fn, sets.a[j], sets.b[j], out=outs[j]))
    return calls


def prepare_units(sides: dict, sets: InputSets, clock: Clock, cfg: TimingConfig, cublas: Kernel,
                  host_timing: bool) -> tuple[dict, int, float]:
    """One timed unit per side ({name: (kernel, output slots)}), all of the same launch count: enough calls
    for cfg.min_unit_us at one cuBLAS call's estimated time, rotating through every input set. Returns
    (units in `sides`' order, launches per unit, the estimate in us)."""
    probe = clock.prepare([partial(cublas, sets.a[0], sets.b[0], out=sets.out_cublas[0])])
    clock.time_ms(probe)   # the first replay of a fresh graph is slow: warm it, then the best of 3
    est_us = 1000 * min(clock.time_ms(probe) for _ in range(3))
    del probe
    launches = launch_count(est_us, sets.n, cfg)
    units = {name: clock.prepare(unit_calls(fn, sets, outs, launches, host_timing))
             for name, (fn, outs) in sides.items()}
    return units, launches, est_us


def describe_schedule(kernel) -> tuple[Optional[str], Optional[dict]]:
    """(short id, dict) of the schedule a compiled kernel runs, when it says. A `schedule="auto"` kernel
    that dispatches to torch.matmul (cuBLAS measured faster) says "cuBLAS" and keeps the schedule it set
    aside: a tuned one, or the heuristic's pick where the verdict came from measured neighbours."""
    s = getattr(kernel, "schedule", None)
    decision = getattr(kernel, "decision", None)
    if isinstance(s, Schedule) and getattr(decision, "use_cublas", False):
        what = "heuristic" if decision.source == "heuristic" else "tuned"
        return f"cuBLAS ({what} {s.short()})", {**s.to_dict(), "dispatch": "cublas"}
    if isinstance(s, Schedule):
        return s.short(), s.to_dict()
    if s is None and getattr(decision, "use_cublas", False):   # no kernel takes the shape: torch.matmul runs it
        return f"cuBLAS (no gemmc kernel: {decision.source})", {"dispatch": "cublas", "why": decision.detail}
    return (None if s is None else str(s)), None


def bench_shape(shape: Shape, kernel: Kernel, sets: InputSets, clock: Clock, cfg: TimingConfig,
                cublas: Kernel = cublas_matmul) -> dict:
    """Check, then time, one shape. Returns the record's measured fields (status, error, samples,
    summaries, TFLOP/s, ratio, and the checks' figures). A failed check is reported and not timed; the timed
    launches' own outputs are checked after timing (graph mode), and a failure there marks the shape
    check_failed too (its samples kept, for the diagnosis)."""
    rec: dict = {"status": "ok", "error": None, "input_sets": sets.n, "rotated_bytes": sets.rotated_bytes}
    checker = Checker(sets, cublas, cfg.tolerance)
    first = checker.call(kernel)
    rec.update((k, v) for k, v in first.items() if k != "error")
    if first["error"]:
        rec["status"], rec["error"] = "check_failed", first["error"]
        return rec

    sides = {"gemmc": (kernel, sets.out_gemmc), "cublas": (cublas, sets.out_cublas)}
    if cfg.aa_check:    # the same cuBLAS call, writing where gemmc writes: what "no difference" reads as
        sides["cublas_aa"] = (cublas, sets.out_gemmc)
    units, launches, est_us = prepare_units(sides, sets, clock, cfg, cublas, cfg.host_timing)
    if not cfg.host_timing:
        nan_fill(sets)   # after the capture's eager warm-up call: the replays alone must write every slot
    rec["settle_units"] = 0
    long_call = est_us >= SETTLE_MIN_CALL_US
    rec["sustained"] = cfg.sustained_s > 0 and long_call
    if rec["sustained"]:
        ms = time_sustained(units, clock, cfg.repeats, cfg.sustained_s)
    else:
        if cfg.settle_s > 0 and long_call:
            rec["settle_units"] = settle(units["cublas"], clock, cfg.settle_s)
        ms = time_interleaved(units, clock, cfg.repeats, cfg.warmup)
    rec["launches"] = launches
    for side in units:
        us = [1000 * t / launches for t in ms[side]]
        rec[f"{side}_samples_us"] = us
        rec[f"{side}_us"] = summarize(us).as_dict()
        rec[f"{side}_tflops"] = tflops(shape.flops, rec[f"{side}_us"]["median"])
    rec["ratio"] = paired_ratio(ms["cublas"], ms["gemmc"])
    rec["ratio_of_medians"] = rec["cublas_us"]["median"] / rec["gemmc_us"]["median"]
    rec["drift"] = {side: drift(ms[side]) for side in units}
    if cfg.aa_check:
        rec["aa_ratio"] = paired_ratio(ms["cublas"], ms["cublas_aa"])
    if not cfg.host_timing:   # (host timing's calls allocate their outputs: there is nothing to read back)
        if cfg.aa_check:      # cuBLAS wrote last into gemmc's slots: one more replay of gemmc's unit onto NaN
            nan_fill(sets)
            units["gemmc"]()
        timed = checker.slots(launches)
        rec.update((k, v) for k, v in timed.items() if k != "error")
        if timed["error"]:
            rec["status"], rec["error"] = "check_failed", timed["error"]
    return rec


def time_side_by_side(shape: Shape, kernels: dict, clock: Clock, *, checked: Optional[Sequence[str]] = None,
                      repeats: int = 7, cfg: TimingConfig = TimingConfig(), cublas: Kernel = cublas_matmul,
                      device="cuda", l2_bytes: Optional[int] = None) -> dict:
    """Diagnostic timing of several kernels of one shape beside cuBLAS, under the bench's rules (the edited
    kernels of scripts/gpu_floor.py and scripts/cta_trace.py). The kernels named in `checked` (default: all)
    are checked first against the fp32 reference, output NaN-filled (`check_failure`); a failure raises
    ValueError and nothing is timed. Then one unit per kernel and one for cuBLAS, over input sets rotated
    through cfg.l2_factor x L2, `repeats` times interleaved; after that each checked kernel's graph is replayed
    once more onto NaN and its outputs checked the same way (ValueError again). Returns {"us": {name: median us per call, "cublas": ...}, "rel_err", "units"
    (to replay one), "launches", "sets"} (the units' graphs read the sets: keep them while replaying)."""
    l2 = l2_bytes if l2_bytes is not None else l2_bytes_of(device)
    sets = make_input_sets(shape, torch.bfloat16, device,
                           input_set_count(shape, 2, l2, cfg.l2_factor, cfg.max_sets), cfg.seed)
    checker = Checker(sets, cublas, cfg.tolerance)
    names = list(kernels) if checked is None else list(checked)
    errs = {}
    for name in names:
        res = checker.call(kernels[name])
        errs[name] = res["rel_err"]
        if res["error"]:
            raise ValueError(f"{shape.m}x{shape.n}x{shape.k} {name}: {res['error']}")
    sides = {"cublas": (cublas, sets.out_cublas), **{name: (fn, sets.out_gemmc) for name, fn in kernels.items()}}
    units, launches, _ = prepare_units(sides, sets, clock, cfg, cublas, host_timing=False)
    ms = time_interleaved(units, clock, repeats, cfg.warmup)
    for name in names:   # the kernels share the output slots: each timed graph replayed once more onto NaN
        nan_fill(sets)
        units[name]()
        res = checker.slots(launches)
        if res["error"]:
            raise ValueError(f"{shape.m}x{shape.n}x{shape.k} {name}: {res['error']}")
    return {"us": {u: statistics.median(ms[u]) * 1000 / launches for u in units}, "rel_err": errs,
            "units": units, "launches": launches, "sets": sets}


def compile_job_of(shape: Shape, policy) -> dict:
    return {"m": shape.m, "n": shape.n, "k": shape.k,
            "policy": policy.to_dict() if isinstance(policy, Schedule) else policy}


def compile_gemmc(shape: Shape, policy, dtype: str = "bf16", arch: str = "sm_90a") -> Kernel:
    """The one way the bench reaches gemmc: gemmc.compile(GemmSpec(m, n, k, dtype), schedule=policy,
    arch), built now (so compile time is not counted in the first call)."""
    from .compile_pool import compile_job
    return compile_job(compile_job_of(shape, policy), dtype, arch)


def prebuild(shapes: Sequence[Shape], policy, dtype: str, arch: str, workers: int, progress: bool = True,
             timeout_s: float = 1800) -> dict:
    """Compile every shape's kernel in `workers` processes into the disk cache, so the measuring
    loop only loads them. {shape: worker result}; failures are re-raised by the loop's own compile."""
    from tqdm import tqdm

    from .compile_pool import CompilePool, result_for
    jobs = [compile_job_of(s, policy) for s in shapes]
    bar = tqdm(total=len(jobs), desc="compile", unit="kernel", file=sys.stderr, disable=not progress)
    results = CompilePool(jobs, workers, dtype=dtype, arch=arch).collect(
        time.perf_counter() + timeout_s, on_result=lambda r: bar.update(1))
    bar.close()
    return {s: result_for(results, j) for s, j in zip(shapes, jobs)}


def spin_up(seconds: float = 0.5, device="cuda") -> None:
    """Bring the GPU to its working clocks before the first measurement (idle clocks are low)."""
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device=device)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)


def rotation_fields(sets: InputSets, l2_bytes: int, cfg: TimingConfig) -> dict:
    """How far a shape's input sets cover the L2: a shape too small to reach cfg.l2_factor x L2 within
    cfg.max_sets sets is timed partly from a warm L2, which its record must say."""
    factor = sets.rotated_bytes / l2_bytes
    return {"rotated_l2_factor": factor, "below_l2_factor": factor < cfg.l2_factor}


def run_bench(shapes: Sequence[Shape], policy, cfg: TimingConfig, *, dtype: str = "bf16", arch: str = "sm_90a",
              device="cuda", compile_fn: Optional[Callable] = None, cublas: Kernel = cublas_matmul,
              clock: Optional[Clock] = None, l2_bytes: Optional[int] = None, progress: bool = True,
              compile_workers: int = 0, spin: Optional[Callable[[], None]] = None) -> list[dict]:
    """Bench every shape; never raises for one shape's failure (it is recorded instead).
    compile_workers > 1 prebuilds every kernel in parallel first (default compile path only). `spin` brings
    the GPU's clocks up (default with the real clock: spin_up) before the first shape and after a compile in
    the loop that took longer than RESPIN_AFTER_COMPILE_S."""
    from tqdm import tqdm

    from ..types import as_dtype, torch_dtype
    from .fp8 import baseline, fp8_call, fp8_scaling

    fp8 = fp8_scaling(dtype)        # "fp8-<scaling>": quantized operands, a torch fp8 baseline (bench/fp8.py)
    tdtype = torch_dtype(as_dtype(dtype)) if fp8 is None else torch.float8_e4m3fn
    if fp8 is not None and cublas is cublas_matmul:
        cublas = baseline(fp8)
    built = {}
    if compile_fn is None:
        if compile_workers > 1 and len(shapes) > 1:
            built = prebuild(shapes, policy, dtype, arch, compile_workers, progress)
        compile_fn = partial(compile_gemmc, policy=policy, dtype=dtype, arch=arch)
    if clock is None:
        clock = CudaClock(graphs=not cfg.host_timing)
        spin = spin or partial(spin_up, device=device)
    if spin is not None:
        spin()
    l2 = l2_bytes or l2_bytes_of()
    elem = torch.empty((), dtype=tdtype).element_size()
    results = []
    bar = tqdm(shapes, desc="gemmc bench", unit="shape", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    for shape in bar:
        bar.set_postfix_str(str(shape))
        rec = {"shape": str(shape), **shape.as_dict(), "flops": shape.flops, "schedule": None,
               "schedule_dict": None, "compile_s": None}
        crashed = (built.get(shape) or {}).get("error") or ""
        if crashed.startswith("compile worker crashed"):     # compiling it here would take the bench down too
            rec.update(status="compile_error", error=crashed)
            results.append(rec)
            continue
        try:
            t0 = time.perf_counter()
            kernel = compile_fn(shape)
            rec["compile_s"] = time.perf_counter() - t0
            if spin is not None and rec["compile_s"] > RESPIN_AFTER_COMPILE_S:
                spin()
            if built.get(shape, {}).get("ok"):
                rec["compile_s"] = built[shape]["compile_s"]   # the worker's build, not the cache load
            rec["schedule"], rec["schedule_dict"] = describe_schedule(kernel)
        except Exception as e:  # recorded per shape; the run goes on
            rec.update(status="compile_error", error=f"{type(e).__name__}: {e}")
            results.append(rec)
            continue
        sets = None
        try:
            n_sets = input_set_count(shape, elem, l2, cfg.l2_factor, cfg.max_sets)
            sets = (make_input_sets(shape, tdtype, device, n_sets, cfg.seed) if fp8 is None
                    else make_fp8_input_sets(shape, fp8, device, n_sets, cfg.seed))
            rec.update(rotation_fields(sets, l2, cfg))
            rec.update(bench_shape(shape, kernel if fp8 is None else fp8_call(kernel), sets, clock, cfg, cublas))
        except Exception as e:
            rec.update(status="run_error", error=f"{type(e).__name__}: {e}")
        finally:
            del sets
            if torch.cuda.is_available() and str(device).startswith("cuda"):
                torch.cuda.empty_cache()
        results.append(rec)
    return results
