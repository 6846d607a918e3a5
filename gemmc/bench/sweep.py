"""The schedule sweep that records bench/data/: every valid SM90 schedule on every shape.

Plan (fits a few minutes of one H200):
  1. per shape, the valid schedules of a ScheduleSpace (gemmc.schedule.enumerate_schedules, the one
     validity predicate); their union is compiled ONCE each, on the symbolic spec, in parallel
     worker processes (compile_pool) -- M, N, K are runtime values, so one kernel serves every shape;
  2. meanwhile the parent times cuBLAS once per shape, to size the graphs and predict the cost;
  3. shapes run cheapest first. Per shape: inputs and the fp32 references are made once; every
     schedule is checked (NaN-filled output, timing.check_failure) and then timed in a short pass
     (a small graph replayed a few times; one eager call for kernels of a millisecond or more) whose
     own outputs, NaN-filled before the first replay, are checked after it; the top few are
     re-measured carefully, interleaved with cuBLAS, through inputs rotated over >= 2x L2 (the
     bench's rules), and each one's timed graph is replayed once more onto NaN and checked; the
     shape's records are written and flushed;
  4. a shape predicted not to fit the remaining budget is skipped; the file is always closed with
     a footer saying what was done. A watchdog ends a hung run, leaving the flushed shapes.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Callable, Optional, Sequence

import torch

from ..schedule import MODES, RASTERS, Schedule, ScheduleSpace, enumerate_schedules, resolve_stages
from ..spec import GemmSpec
from .dataset import DatasetWriter, best_record
from .suites import Shape, cuda_l2, dedupe, llm, square
from .timing import (Checker, CudaClock, TimingConfig, cublas_matmul, input_set_count, l2_bytes_of, launch_count,
                     make_input_sets, nan_fill, spin_up, time_interleaved, unit_calls)

SWEEP_SPACE = ScheduleSpace(tile_m=(64, 128, 256), tile_n=(64, 128, 192, 256), tile_k=(64,),
                            clusters=((1, 1), (2, 1), (1, 2)), modes=MODES, rasters=RASTERS, swizzles=(1, 8),
                            split_ks=(1, 2, 4), stages=("auto",))


@dataclass(frozen=True)
class SweepConfig:
    budget_s: float = 480.0         # the whole run, compile included
    compile_share: float = 0.5      # the compile phase ends by this share of the budget at the latest
    workers: int = max(1, (os.cpu_count() or 2) - 1)
    short_unit_us: float = 100.0    # short pass: a graph of >= this long...
    short_max_launches: int = 64    # ...of at most this many launches, over at most...
    short_max_sets: int = 64        # ...this many input sets (the careful pass rotates >= 2x L2)
    short_repeats: int = 3          # replays timed per point (after one warm-up replay)
    eager_above_us: float = 1000.0  # kernels this long are timed as one eager call (graphs gain nothing)
    top: int = 3                    # re-measured carefully per shape
    refine: TimingConfig = field(default_factory=lambda: TimingConfig(repeats=5, warmup=1, min_unit_us=1000,
                                                                      max_launches=200))
    tolerance: float = 1e-2         # cap on the relative Frobenius error (timing.check_failure)
    seed: int = 0
    dtype: str = "bf16"
    arch: str = "sm_90a"
    reserve_s: float = 10.0         # kept free at the end for writing
    stall_s: float = 120.0          # the watchdog ends the run after this long without progress

    def as_dict(self) -> dict:
        return asdict(self)


def sweep_shapes(cuda_l2_sample: int = 30, seed: int = 0) -> list[Shape]:
    """llm (64) + square (7) + a seeded cuda-l2 sample, deduplicated."""
    return dedupe(llm() + square() + cuda_l2(cuda_l2_sample, seed))


def plan(shapes: Sequence[Shape], space: ScheduleSpace = SWEEP_SPACE, dtype: str = "bf16",
         arch: str = "sm_90a") -> tuple[dict, list[Schedule]]:
    """({shape: its valid schedules}, the union in first-seen order)."""
    per_shape, union, seen = {}, [], set()
    for sh in shapes:
        spec = GemmSpec(m=sh.m, n=sh.n, k=sh.k, dtype=dtype)
        # a fixed stage count equal to what "auto" resolves to is the same kernel: keep "auto" only
        valid = [s for s in enumerate_schedules(spec, arch, space)
                 if s.stages == "auto" or "auto" not in space.stages
                 or resolve_stages(s.with_(stages="auto"), spec) != s.stages]
        per_shape[sh] = valid
        for s in valid:
            if s not in seen:
                seen.add(s)
                union.append(s)
    return per_shape, union


def roofline_us(shape: Shape, tflops: float = 700.0, tbps: float = 4.0, elem: int = 2) -> float:
    """A rough H200 time for planning before anything is measured."""
    bytes_ = (shape.m * shape.k + shape.n * shape.k + shape.m * shape.n) * elem
    return max(shape.flops / (tflops * 1e6), bytes_ / (tbps * 1e6), 3.0)


def short_launches(t_us: float, n_sets: int, cfg: SweepConfig) -> int:
    if t_us >= cfg.eager_above_us:
        return 1
    want = max(n_sets, math.ceil(cfg.short_unit_us / max(t_us, 1e-3)))
    return max(1, min(cfg.short_max_launches, want))


def predict_shape_s(t_us: float, n_schedules: int, cfg: SweepConfig) -> float:
    """Seconds one shape should take: per point a check + the timed replays + host overheads."""
    host = 1.5e-3 if t_us < cfg.eager_above_us else 4e-3
    if t_us >= cfg.eager_above_us:
        point = 2.6 * t_us * 1e-6 + host            # check, one timed call (+ slower schedules)
    else:
        launches = short_launches(t_us, 1, cfg)
        point = (t_us + (1 + cfg.short_repeats) * launches * t_us * 1.3) * 1e-6 + host + launches * 15e-6
    refine_unit = max(t_us, cfg.refine.min_unit_us) * 1e-6
    refine = (cfg.top + 1) * (cfg.refine.repeats + cfg.refine.warmup) * refine_unit + 0.3
    return n_schedules * point + refine


class Watchdog(threading.Thread):
    """Ends the process when the main loop stops making progress (a hung kernel cannot be
    interrupted from Python); what was flushed stays loadable."""

    def __init__(self, stall_s: float, hard_deadline: float):
        super().__init__(daemon=True)
        self.stall_s, self.hard_deadline = stall_s, hard_deadline
        self.last = time.perf_counter()
        self.what = "start"
        self._stop = threading.Event()

    def beat(self, what: str = ""):
        self.last = time.perf_counter()
        self.what = what

    def stop(self):
        self._stop.set()

    def run(self):
        while not self._stop.wait(2.0):
            now = time.perf_counter()
            if now - self.last > self.stall_s or now > self.hard_deadline:
                print(f"\nsweep: watchdog: no progress for {now - self.last:.0f} s (at {self.what}); exiting. "
                      "Shapes finished so far are in the dataset.", file=sys.stderr, flush=True)
                os._exit(3)


def _cuda_healthy() -> bool:
    if not torch.cuda.is_available():
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def _median_us(samples_ms: list, launches: int) -> float:
    return 1000 * statistics.median(samples_ms) / launches


def _worst_of(x: Optional[float], y: float) -> float:
    return y if x is None or math.isnan(y) else (x if math.isnan(x) else max(x, y))


def _sig3(x: float) -> float:
    """3 significant digits: a figure checked against 1 needs no more, and the dataset stays small."""
    return float(f"{x:.3g}")


def measure_shape(shape: Shape, schedules: Sequence[Schedule], kernels: dict, compile_info: dict, t_est_us: float,
                  cfg: SweepConfig, *, device, tdtype, elem: int, l2: int, graph_clock, eager_clock,
                  cublas: Callable = cublas_matmul, beat: Callable = lambda what: None) -> tuple[list, dict]:
    """Every schedule of one shape: (records, summary). `kernels[s]` is the loaded kernel or None
    (then `compile_info[s]["error"]` says why)."""
    n_full = input_set_count(shape, elem, l2, cfg.refine.l2_factor, cfg.refine.max_sets)
    sets = make_input_sets(shape, tdtype, device, n_full, cfg.seed)
    a0, b0, out0 = sets.a[0], sets.b[0], sets.out_gemmc[0]
    checker = Checker(sets, cublas, cfg.tolerance)   # references per input set, made once for every schedule
    n_short = min(sets.n, cfg.short_max_sets)
    eager = t_est_us >= cfg.eager_above_us
    launches = short_launches(t_est_us, n_short, cfg)
    base = shape.as_dict()
    recs: dict[Schedule, dict] = {}
    broken = False
    for s in schedules:
        info = compile_info.get(s) or {}
        rec = {**base, "schedule": s.to_dict(), "time_us": None, "error": None, "cublas_us": None,
               "compile_s": info.get("compile_s"), "rel_err": None, "elem_err": None, "refined": False}
        recs[s] = rec
        k = kernels.get(s)
        if k is None:
            err = str(info.get("error") or "not compiled")
            rec["error"] = err if err.startswith("load: ") else "compile: " + err
            continue
        if broken:
            rec["error"] = "run: skipped, the CUDA context failed earlier in this shape"
            continue
        beat(f"{shape} {s.short()}")
        try:
            first = checker.call(k)
            rec["rel_err"], rec["elem_err"] = first["rel_err"], _sig3(first["elem_err"])
            if first["error"]:
                rec["error"] = "check: " + first["error"]
                continue
            if eager:
                unit = eager_clock.prepare([partial(k, a0, b0, out=out0)])
                nan_fill(sets, 1)
                t_us = 1000 * eager_clock.time_ms(unit)
                post = checker.slots(1, 1)
            else:
                calls = [partial(k, sets.a[i % n_short], sets.b[i % n_short], out=sets.out_gemmc[i % n_short])
                         for i in range(launches)]
                unit = graph_clock.prepare(calls)
                nan_fill(sets, n_short)   # after the capture's eager warm-up call: the replays must write them
                graph_clock.time_ms(unit)  # warm-up replay
                t_us = _median_us([graph_clock.time_ms(unit) for _ in range(cfg.short_repeats)], launches)
                post = checker.slots(launches, n_short)
            del unit
            rec["timed_elem_err"] = _sig3(post["timed_elem_err"])
            if post["error"]:
                rec["error"] = "check: " + post["error"]
                continue
            rec["time_us"] = t_us
        except Exception as e:  # noqa: BLE001  recorded per point
            rec["error"] = f"run: {type(e).__name__}: {str(e)[:500]}"
            rec["time_us"] = None
            if not _cuda_healthy():
                broken = True

    # careful pass: the top few and cuBLAS, interleaved, inputs rotated over >= 2x L2
    timed = sorted((r["time_us"], i, s) for i, (s, r) in enumerate(recs.items()) if r["time_us"] is not None)
    top = [s for _, _, s in timed[: cfg.top]]
    summary = {"shape": str(shape), "points": len(schedules), "ok": len(timed), "cublas_est_us": t_est_us,
               "cublas_us": None, "best_us": None, "best": None, "broken": broken}
    cublas_us = t_est_us
    if not broken:
        try:
            beat(f"{shape} refine")
            lr = launch_count(timed[0][0] if timed else t_est_us, sets.n, cfg.refine)
            units = {"cublas": graph_clock.prepare(unit_calls(cublas, sets, sets.out_cublas, lr, False))}
            for s in top:
                units[s] = graph_clock.prepare(unit_calls(kernels[s], sets, sets.out_gemmc, lr, False))
            ms = time_interleaved(units, graph_clock, cfg.refine.repeats, cfg.refine.warmup)
            cublas_us = _median_us(ms["cublas"], lr)
            for s in top:
                r = recs[s]
                r["time_us_short"], r["time_us"], r["refined"] = r["time_us"], _median_us(ms[s], lr), True
                nan_fill(sets)     # the top schedules share the output slots: replay each timed graph onto NaN
                units[s]()
                post = checker.slots(lr)
                r["timed_elem_err"] = _sig3(_worst_of(r.get("timed_elem_err"), post["timed_elem_err"]))
                if post["error"]:
                    r["error"], r["time_us"] = "check (careful pass): " + post["error"], None
            del units
        except Exception as e:  # noqa: BLE001  the short-pass numbers stand
            summary["refine_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            summary["broken"] = broken = not _cuda_healthy()
    for r in recs.values():
        r["cublas_us"] = cublas_us
    best = best_record(recs.values())
    summary.update(ok=sum(r["time_us"] is not None for r in recs.values()), cublas_us=cublas_us,
                   best_us=best and best["time_us"],
                   best=best and Schedule.from_dict(best["schedule"]).short())
    del sets, checker
    return list(recs.values()), summary


def cublas_estimate_us(shape: Shape, *, device, tdtype, clock, cublas: Callable = cublas_matmul) -> float:
    """One warm eager cuBLAS call, timed twice; the faster one."""
    sets = make_input_sets(shape, tdtype, device, 1, 0)
    unit = clock.prepare([partial(cublas, sets.a[0], sets.b[0], out=sets.out_cublas[0])])
    clock.time_ms(unit)
    return 1000 * min(clock.time_ms(unit), clock.time_ms(unit))


def run_sweep(shapes: Sequence[Shape], cfg: SweepConfig, out_path, *, space: ScheduleSpace = SWEEP_SPACE,
              exclude: Optional[Callable[[Schedule], bool]] = None, device="cuda",
              start_compiles: Optional[Callable] = None, load_kernel: Optional[Callable] = None,
              cublas: Callable = cublas_matmul, graph_clock=None, eager_clock=None, l2_bytes: Optional[int] = None,
              environment: Optional[dict] = None, progress: bool = True, watchdog: bool = True) -> dict:
    """The whole sweep; returns the footer. `start_compiles(schedules) -> pool with .collect(deadline)`
    and `load_kernel(schedule) -> kernel` are injectable (CPU tests); the defaults use
    compile_pool and gemmc.compile."""
    from tqdm import tqdm

    from ..types import as_dtype, torch_dtype
    from .compile_pool import CompilePool, compile_schedule, result_for
    from .report import collect_environment, nvidia_smi

    t_start = time.perf_counter()
    deadline = t_start + cfg.budget_s
    log = partial(print, file=sys.stderr, flush=True)
    tdtype = torch_dtype(as_dtype(cfg.dtype))
    elem = torch.empty((), dtype=tdtype).element_size()
    l2 = l2_bytes or l2_bytes_of()
    graph_clock = graph_clock or CudaClock(graphs=True)
    eager_clock = eager_clock or CudaClock(graphs=False)

    per_shape, union = plan(shapes, space, cfg.dtype, cfg.arch)
    if exclude:
        per_shape = {sh: [s for s in v if not exclude(s)] for sh, v in per_shape.items()}
        union = [s for s in union if not exclude(s)]
    log(f"sweep: {len(shapes)} shapes, {sum(map(len, per_shape.values()))} points, {len(union)} distinct "
        f"schedules, budget {cfg.budget_s:.0f} s, {cfg.workers} compile workers")

    # 1+2: compile in the background while cuBLAS is timed per shape
    if start_compiles is None:
        def start_compiles(scheds):
            return CompilePool([s.to_dict() for s in scheds], cfg.workers, dtype=cfg.dtype, arch=cfg.arch)
    pool = start_compiles(union)
    dog = Watchdog(cfg.stall_s, deadline + 120) if watchdog else None
    if dog:
        dog.start()
    beat = dog.beat if dog else (lambda what="": None)
    t_est = {}
    for sh in tqdm(shapes, desc="cuBLAS baseline", unit="shape", file=sys.stderr, disable=not progress):
        beat(f"baseline {sh}")
        try:
            t_est[sh] = cublas_estimate_us(sh, device=device, tdtype=tdtype, clock=eager_clock, cublas=cublas)
        except Exception as e:  # noqa: BLE001
            log(f"sweep: cuBLAS failed on {sh}: {type(e).__name__}: {e}")
            t_est[sh] = roofline_us(sh, elem=elem)
    bar = tqdm(total=len(union), desc="compile", unit="kernel", file=sys.stderr, disable=not progress)
    compile_deadline = t_start + cfg.budget_s * cfg.compile_share
    results = pool.collect(compile_deadline, on_result=lambda r: (bar.update(1), beat("compile")))
    bar.close()
    compile_info = {s: result_for(results, s.to_dict()) for s in union}
    n_ok = sum(1 for i in compile_info.values() if i["ok"])
    compile_wall = time.perf_counter() - t_start
    log(f"sweep: compiled {n_ok}/{len(union)} schedules in {compile_wall:.0f} s")
    failures = [i["error"] for i in compile_info.values() if not i["ok"]]
    if failures:
        log(f"sweep: first compile error: {failures[0][:400]}")

    if load_kernel is None:
        def load_kernel(s):
            return compile_schedule(s.to_dict(), cfg.dtype, cfg.arch)
    kernels: dict = {}

    def kernel_for(s):
        if s not in kernels:
            info = compile_info[s]
            kernels[s] = None
            if info["ok"]:
                try:
                    kernels[s] = load_kernel(s)
                except Exception as e:  # noqa: BLE001
                    info.update(ok=False, error=f"load: {type(e).__name__}: {e}"[:2000])
        return kernels[s]

    env = environment or collect_environment()
    header = {"device": env.get("gpu"), "date": env.get("date"), "host": env.get("host"),
              "versions": env.get("versions"), "dtype": cfg.dtype, "arch": cfg.arch,
              "layout": "A [M,K] row-major, B [N,K] (a @ b.T), C [M,N] row-major",
              "method": {"text": METHOD_TEXT, "config": cfg.as_dict(), "l2_bytes": l2},
              "space": asdict(space), "shapes": [str(s) for s in shapes],
              "compile": {"workers": cfg.workers, "wall_s": round(compile_wall, 1), "ok": n_ok,
                          "failed": len(union) - n_ok}}
    writer = DatasetWriter(out_path, header)
    if str(device).startswith("cuda") and torch.cuda.is_available():
        spin_up(device=device)  # the GPU idled while the compiles finished: back to working clocks
    order = sorted(shapes, key=lambda sh: predict_shape_s(t_est[sh], len(per_shape[sh]), cfg))
    done, skipped, calib, total_ok = [], [], 1.0, 0
    stop_reason = None
    try:
        for sh in tqdm(order, desc="sweep", unit="shape", file=sys.stderr, disable=not progress):
            left = deadline - cfg.reserve_s - time.perf_counter()
            predicted = calib * predict_shape_s(t_est[sh], len(per_shape[sh]), cfg)
            if predicted > left:
                skipped.append(str(sh))
                continue
            scheds = per_shape[sh]
            for s in scheds:   # loads from the cache (the first shape loads most); not part of the timing
                kernel_for(s)
            t0 = time.perf_counter()
            recs, summ = measure_shape(sh, scheds, kernels, compile_info, t_est[sh], cfg, device=device,
                                       tdtype=tdtype, elem=elem, l2=l2, graph_clock=graph_clock,
                                       eager_clock=eager_clock, cublas=cublas, beat=beat)
            writer.write_many(recs)
            took = time.perf_counter() - t0
            calib = min(4.0, max(0.5, 0.7 * calib + 0.3 * took / max(predicted / calib, 1e-3)))
            done.append(str(sh))
            ratio = (summ["cublas_us"] / summ["best_us"]) if summ["best_us"] else float("nan")
            log(f"  {sh}: {summ['ok']}/{summ['points']} ok, best {summ['best']} {summ['best_us'] or float('nan'):.1f} us"
                f", cuBLAS {summ['cublas_us']:.1f} us, ratio {ratio:.3f}, {took:.1f} s")
            total_ok += summ["ok"]
            if summ["broken"]:
                stop_reason = f"CUDA context failed on {sh}"
                break
            if len(done) >= 2 and total_ok == 0:   # don't spend the budget recording only errors
                first = next((r["error"] for r in recs if r["error"]), "?")
                stop_reason = f"no schedule ran on the first {len(done)} shapes; first error: {first[:300]}"
                log(f"sweep: stopping: {stop_reason}")
                break
            if torch.cuda.is_available() and str(device).startswith("cuda"):
                torch.cuda.empty_cache()
    finally:
        if dog:
            dog.stop()
        footer = {"complete": not skipped and stop_reason is None and len(done) == len(shapes),
                  "elapsed_s": round(time.perf_counter() - t_start, 1), "shapes_done": len(done),
                  "shapes_skipped": skipped, "stop_reason": stop_reason or ("budget" if skipped else None),
                  "nvidia_smi_after": nvidia_smi() if str(device).startswith("cuda") else None}
        writer.close(footer)
    log(f"sweep: {len(done)} shapes done, {len(skipped)} skipped for the budget, "
        f"{writer.count} records -> {out_path} ({os.path.getsize(out_path) / 1e6:.2f} MB)")
    return footer


METHOD_TEXT = (
    "Every valid schedule (gemmc.schedule.enumerate_schedules over header.space) per shape; each schedule "
    "compiled once on the symbolic spec (M, N, K runtime) through gemmc.compile in parallel workers. Per shape: "
    "randn inputs; each point checked first (output NaN-filled; against the fp32 reference: relative Frobenius "
    "error <= 2 x cuBLAS's on the same inputs + 1e-4 and < tolerance, and every element within gemmc.reference's "
    "bound, elem_err <= 1), then a short pass: a CUDA graph of `launches` calls over up to short_max_sets input "
    "sets, one warm-up replay, median of short_repeats replays (kernels >= eager_above_us: one eager call between "
    "CUDA events); the timed launches' own outputs, NaN-filled before the first replay, are checked the same way "
    "after it (a failure is an error, not a time). The top `top` per shape are re-measured with cuBLAS "
    "(torch.matmul), interleaved, CUDA graphs over input sets rotated through >= 2x L2, median of refine.repeats "
    "(time_us; the short value is time_us_short), and each one's timed graph is replayed once more onto NaN and "
    "checked. cublas_us is that careful cuBLAS median for the shape.")


def default_out_path(gpu_name: Optional[str] = None) -> str:
    """bench/data/<date>-<gpu>-sweep.jsonl.gz, the GPU tag as in the bench reports (e.g. h200)."""
    from .report import default_output_path
    return str(default_output_path("sweep", gpu_name, root="bench/data")).replace(".json", ".jsonl.gz")
