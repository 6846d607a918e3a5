"""Compile (on the CPU, no GPU needed) every schedule the standard spaces admit over the specs of
scripts/source_hashes.py, or a covering sample of them, and report the count compiled and the failures.

The safety net for a backend rewrite: every admitted schedule must still compile and carry its Hopper
(or Ampere) instructions.

    CUTE_DSL_ARCH=sm_90a python scripts/compile_schedules.py                 # every admitted SM90 schedule
    CUTE_DSL_ARCH=sm_90a python scripts/compile_schedules.py --sample        # a covering sample
    CUTE_DSL_ARCH=sm_90a python scripts/compile_schedules.py --stride 10     # every 10th schedule
    python scripts/compile_schedules.py --arch sm_80 --limit 20 --workers 2
"""
import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# instructions each arch's kernels must contain
NEEDED = {"sm_90a": ("wgmma.mma_async", "cp.async.bulk.tensor"), "sm_80": ("mma.sync",)}
# schedule fields whose pairs interact (mode x cluster, split-K x mode, swap x layout via the spec)
PAIRS = (("mode", "cluster"), ("split_k", "mode"), ("stream_k", "mode"), ("swap_ab", "spec"),
         ("tile", "mode"), ("split_k", "cluster"))


def features(spec_name: str, s) -> set:
    f = {("spec", spec_name)}
    for field in ("tile", "cluster", "stages", "mode", "raster", "swizzle", "split_k", "pdl", "swap_ab", "stream_k"):
        f.add((field, getattr(s, field, None)))
    for a, b in PAIRS:
        va = spec_name if a == "spec" else getattr(s, a, None)
        vb = spec_name if b == "spec" else getattr(s, b, None)
        f.add((a, b, va, vb))
    return f


def covering_sample(items):
    """Greedy cover: schedules until every value of every field and every interacting pair appears."""
    feats = [features(n, s) for n, _, s in items]
    todo = set().union(*feats) if feats else set()
    chosen = []
    while todo:
        i = max(range(len(items)), key=lambda j: len(feats[j] & todo))
        chosen.append(items[i])
        todo -= feats[i]
    return chosen


def compile_one(job):
    name, arch, schedule = job
    from source_hashes import specs
    from gemmc.backends import emit
    from gemmc.build import compile_with_ptx
    from gemmc.compiler import lower
    spec = specs()[name][0]
    try:
        _, plan = lower(spec, schedule, arch)
        ptx = compile_with_ptx(emit(plan))[1]
        missing = [i for i in NEEDED[arch] if i not in ptx]
        return job, (f"PTX lacks {missing}" if missing else None)
    except Exception as e:          # report every failure, do not stop at the first
        return job, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90a", choices=sorted(NEEDED))
    ap.add_argument("--sample", action="store_true", help="a covering sample instead of every schedule")
    ap.add_argument("--stride", type=int, default=1, help="every STRIDE-th admitted schedule (a spread sample)")
    ap.add_argument("--limit", type=int, default=0, help="compile at most this many (0: no limit)")
    ap.add_argument("--workers", type=int, default=1, help="compile processes (at most 2 on a shared machine)")
    args = ap.parse_args()
    import gemmc
    from source_hashes import specs
    os.environ.setdefault("CUTE_DSL_ARCH", args.arch)
    items = [(name, arch, s) for name, (spec, arch) in specs().items() if arch == args.arch
             for s in gemmc.enumerate_schedules(spec, arch)]
    admitted = len(items)
    if args.sample:
        items = covering_sample(items)
    items = items[::max(1, args.stride)]
    if args.limit:
        items = items[:args.limit]
    print(f"{admitted} admitted {args.arch} schedules; compiling {len(items)}", flush=True)
    t0, failures = time.time(), []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for (name, _, s), err in pool.map(compile_one, items):
            if err:
                failures.append((name, s, err))
                print(f"FAIL {name} {s.short()}: {err}", flush=True)
    print(f"compiled {len(items) - len(failures)}/{len(items)} in {time.time() - t0:.0f} s; "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
