"""The search under `--reward time+l2` against `--reward time` on the GPU, for the same budget.

    python scripts/l2_search_gpu.py --part 1/2          # on the H200: 4 of the 8 shapes; JSON and a dataset under $OUT
    python scripts/l2_search_gpu.py --part 2/2
    python scripts/l2_search_gpu.py --compile-only      # CPU: a dry run, the synthetic model standing in for the GPU
    gemmc-search simulate --data $OUT/l2_search_gpu.jsonl.gz --reward time,time+l2 --strategy bayes,random --seeds 10

Per shape, the strategy (bayes) searches once under each reward, `--budget` schedules each, `--batch` at a time.
A schedule is measured once and shared by both searches (the bench's paired timing through gemmc.search's Runner,
its output checked first), so they differ only in what they propose: time+l2's batches are profiled under ncu
before the strategy sees them (it needs the profiles to score them), the time search's afterwards, in one ncu run,
for the dataset. Reported per reward and budget (4, 8, 16): the best time found within that many measurements,
as a fraction of the best time either search measured (the exhaustive best is out of reach on the GPU; the replay
of the written dataset compares the strategies on these measured schedules with more seeds).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FORMAT = "gemmc-l2-search-gpu/1"
# decode, small and large batches of the llm suite's weights, where the schedules' L2 reuse differs (raster,
# swizzle, cluster, tile), each call at most ~2 ms on an H200 so that a search of 2 x 16 fits a GPU call
SHAPES = ((16, 6144, 4096), (64, 28672, 4096), (256, 4096, 14336), (1024, 57344, 8192),
          (2048, 28672, 4096), (4096, 4096, 14336), (4096, 8192, 8192), (8192, 8192, 8192))


class SharedMeasurements:
    """Every schedule measured once per shape, for both searches; profiled on demand."""

    def __init__(self, spec, measure, profiler, log):
        self.spec, self.measure, self.profiler, self.log = spec, measure, profiler, log
        self.cache: dict = {}

    def __call__(self, schedules, with_profiles: bool) -> list:
        new = [s for s in schedules if s not in self.cache]
        if new:
            for m in self.measure(self.spec, new):
                self.cache[m.schedule] = m
        if with_profiles:
            self.profile([s for s in schedules if self.cache[s].ok and self.cache[s].profile is None])
        return [self.cache[s] for s in schedules]

    def profile(self, schedules) -> None:
        from dataclasses import replace
        if not schedules:
            return
        profs = self.profiler(self.spec, schedules)
        for s, p in profs.items():
            self.cache[s] = replace(self.cache[s], profile=p)
        missing = len(schedules) - len(profs)
        if missing:
            self.log(f"  {missing} of {len(schedules)} schedules left unprofiled (ncu failed on them)")


def search_shape(shape, args, measure, profiler, log) -> tuple[dict, list]:
    from gemmc.search.registry import make_strategy
    from gemmc.search.reward import parse_reward
    from gemmc.search.strategy import SearchProblem, best_so_far, run_search
    from gemmc.spec import GemmSpec
    spec = GemmSpec(*shape)
    problem = SearchProblem.of(spec, "sm_90a")
    shared = SharedMeasurements(spec, measure, profiler, log)
    found = {}
    for kind in ("time+l2", "time"):
        reward = parse_reward(kind, args.reward_weights if kind != "time" else None)
        t0 = time.time()
        res = run_search(make_strategy(args.strategy, seed=args.seed), problem,
                         lambda ss, r=reward: shared(ss, r.uses_profiles), budget=max(args.budgets),
                         batch=args.batch, reward=None if kind == "time" else reward)
        found[kind] = {"order": [m.schedule.short() for m in res], "best_so_far_us": best_so_far(res)}
        log(f"  {kind:8}: {len(res)} measured, best {min(found[kind]['best_so_far_us']):.2f} us "
            f"({time.time() - t0:.0f}s)")
    shared.profile([s for s, m in shared.cache.items() if m.ok and m.profile is None])
    ok = [m.time_us for m in shared.cache.values() if m.ok]
    best = min(ok) if ok else math.inf
    row = {"shape": "x".join(map(str, shape)), "measured": len(shared.cache), "best_us": best, "rewards": {}}
    for kind, f in found.items():
        run = f["best_so_far_us"]
        row["rewards"][kind] = {str(b): (best / run[min(b, len(run)) - 1] if run and math.isfinite(run[min(b, len(
            run)) - 1]) else 0.0) for b in args.budgets}
        row["rewards"][kind]["order"] = f["order"]
    records = [{"m": shape[0], "n": shape[1], "k": shape[2], "dtype": "bf16", "out_dtype": "bf16", "a_layout": "mk",
                "b_layout": "nk", "arch": "sm_90a", "schedule": m.schedule.to_dict(), "time_us": m.time_us,
                "cublas_us": m.cublas_us, "error": m.error,
                **({"profile": m.profile.to_dict()} if m.profile is not None else {})} for m in shared.cache.values()]
    return row, records


def gpu_backends(args, log):
    """(measure(spec, schedules) -> [Measurement], profiler) on the GPU: Builder + Runner, and ncu."""
    from gemmc.bench.timing import TimingConfig
    from gemmc.search.builder import Builder
    from gemmc.search.profiling import NcuProfiler
    from gemmc.search.runner import Runner
    from gemmc.search.strategy import Measurement
    builder = Builder(workers=args.workers, timeout_s=600.0)
    runner = Runner(timing=TimingConfig(repeats=args.repeats))
    profiler = NcuProfiler(calls=1)

    def measure(spec, schedules):
        out = []
        for b in builder.build(spec, schedules, "sm_90a"):
            if not b.ok:
                out.append(Measurement(b.schedule, None, b.error, compile_s=b.compile_s))
                continue
            r = runner.measure(spec, b.schedule, "sm_90a")
            out.append(Measurement(b.schedule, r.time_us, r.error, r.cublas_us, b.compile_s, r.timing))
        return out
    return measure, profiler, builder


def synthetic_backends(log):
    """The CPU dry run: the synthetic model's times and profiles, and each proposal lowered and emitted."""
    from gemmc.backends.sm90 import emit
    from gemmc.compiler import lower
    from gemmc.search.strategy import Measurement
    from gemmc.search.synthetic import model_profile, model_time_us

    def measure(spec, schedules):
        for s in schedules:
            emit(lower(spec, s)[1])          # every proposal must lower and emit
        return [Measurement(s, model_time_us(s, spec), None, 1.1 * model_time_us(s, spec)) for s in schedules]

    def profiler(spec, schedules):
        return {s: model_profile(s, spec) for s in schedules}
    return measure, profiler, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="", help="comma list of MxNxK (default: the 8 shapes of SHAPES)")
    ap.add_argument("--part", default="1/1", help="i/n: the i-th of n equal parts of the shapes (default 1/1)")
    ap.add_argument("--budgets", default="4,8,16", help="budgets reported (default 4,8,16; the largest is searched)")
    ap.add_argument("--batch", type=int, default=4, help="schedules proposed at a time (default 4)")
    ap.add_argument("--strategy", default="bayes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reward-weights", default=None, metavar="l2=W,dram=W")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats per measurement (default 7)")
    ap.add_argument("--workers", type=int, default=8, help="compile processes (default 8)")
    ap.add_argument("--compile-only", action="store_true", help="CPU dry run: the synthetic model measures")
    ap.add_argument("--out", default=os.environ.get("OUT") or "l2_search_out")
    args = ap.parse_args(argv)
    args.budgets = sorted({int(b) for b in args.budgets.split(",") if b.strip()})
    shapes = ([tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",") if s.strip()]
              if args.shapes else list(SHAPES))
    i, n = (int(x) for x in args.part.split("/"))
    shapes = shapes[(i - 1) * len(shapes) // n: i * len(shapes) // n]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line):
        print(line, flush=True)
    measure, profiler, builder = synthetic_backends(log) if args.compile_only else gpu_backends(args, log)
    tag = "dry" if args.compile_only else f"part{i}of{n}"
    report = {"format": FORMAT, "synthetic": args.compile_only, "config": {**vars(args)}, "rows": []}
    records = []
    try:
        for shape in shapes:
            log(f"{'x'.join(map(str, shape))}:")
            row, recs = search_shape(shape, args, measure, profiler, log)
            report["rows"].append(row)
            records += recs
            (out / f"l2_search_gpu_{tag}.json").write_text(json.dumps(report, indent=1))
    finally:
        if builder is not None:
            builder.close()
    from gemmc.bench.dataset import write_dataset
    write_dataset(out / f"l2_search_gpu_{tag}.jsonl.gz", {"dtype": "bf16", "arch": "sm_90a", "synthetic":
                  args.compile_only, "method": {"script": "scripts/l2_search_gpu.py", "part": args.part}}, records)
    print(f"\n== {args.strategy}: best found within each budget / the best either search measured "
          f"({'synthetic model' if args.compile_only else 'H200 measurements'}) ==")
    print(f"{'shape':>20} {'measured':>8} " + " ".join(f"{r + ' @' + str(b):>14}" for r in ("time", "time+l2")
                                                          for b in args.budgets))
    for row in report["rows"]:
        print(f"{row['shape']:>20} {row['measured']:8d} " + " ".join(
            f"{row['rewards'][r][str(b)]:14.3f}" for r in ("time", "time+l2") for b in args.budgets))
    for r in ("time", "time+l2"):
        for b in args.budgets:
            vals = [row["rewards"][r][str(b)] for row in report["rows"]]
            if vals:
                report.setdefault("median", {}).setdefault(r, {})[str(b)] = sorted(vals)[len(vals) // 2]
    print("median over shapes: " + "; ".join(f"{r} " + ", ".join(f"@{b} {v:.3f}" for b, v in m.items())
                                             for r, m in report.get("median", {}).items()))
    (out / f"l2_search_gpu_{tag}.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
