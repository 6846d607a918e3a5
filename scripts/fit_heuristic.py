"""Fit the heuristic's machine constants (gemmc/choose/heuristic.py MACHINES["sm_90a"]) to recorded sweeps.

The score of a set of constants is the geometric mean, over the recorded shapes, of best time / time of
the heuristic's pick (short-pass times; the pick is the model's favourite among the schedules recorded
on that shape). Coordinate descent over multiplicative steps per constant. CPU only.

    python3 scripts/fit_heuristic.py bench/data/2026-11-30-h200-sweep.jsonl.gz bench/data/...splitk.jsonl.gz
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import fields, replace

from gemmc.choose import heuristic
from gemmc.bench.dataset import by_shape, load_dataset, record_schedule, short_time_us
from gemmc.spec import GemmSpec

STEPS = (0.25, 0.5, 0.7, 1.4, 2.0, 4.0)
FITTED = ("dram_bw", "l2_bw", "dram_latency", "t_iter", "t_sync", "t_epi", "t_fix", "t_fill")


def problems(paths):
    recs = [r for p in paths for r in load_dataset(p)[1]]
    out = []
    for (m, n, k), rs in sorted(by_shape(recs).items()):
        times = {}
        for r in rs:
            t = short_time_us(r)
            if t:
                times[record_schedule(r)] = t
        if times:
            out.append((GemmSpec(m=m, n=n, k=k), times, min(times.values())))
    return out


def fractions(probs, machine) -> list[float]:
    saved = heuristic.MACHINES["sm_90a"]
    heuristic.MACHINES["sm_90a"] = machine
    try:
        out = []
        for spec, times, best in probs:
            pick = min(times, key=lambda s: (-heuristic.estimate(s, spec).tflops,) + heuristic._tie_break(s))
            out.append(best / times[pick])
        return out
    finally:
        heuristic.MACHINES["sm_90a"] = saved


def score(fr) -> float:
    return sum(map(math.log, fr)) / len(fr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="+")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--holdout", action="store_true", help="fit on every other shape, report the rest too")
    args = p.parse_args(argv)
    probs = problems(args.data)
    held = []
    if args.holdout:
        probs, held = probs[0::2], probs[1::2]
    machine = heuristic.MACHINES["sm_90a"]
    best = score(fractions(probs, machine))
    print(f"{len(probs)} shapes; start: geomean fraction of best {math.exp(best):.4f}", flush=True)
    t0 = time.time()
    for rnd in range(args.rounds):
        improved = False
        for name in FITTED:
            base = getattr(machine, name)
            for step in STEPS:
                cand = replace(machine, **{name: base * step})
                sc = score(fractions(probs, cand))
                if sc > best + 1e-4:
                    best, machine, improved = sc, cand, True
            print(f"  [{time.time() - t0:5.0f}s] round {rnd} {name} = {getattr(machine, name):.4g}: "
                  f"{math.exp(best):.4f}", flush=True)
        if not improved:
            break
    fr = fractions(probs, machine)
    print(f"fitted: geomean {math.exp(score(fr)):.4f}, min {min(fr):.3f}, "
          f">= 0.95 on {sum(f >= 0.95 for f in fr)}/{len(fr)} shapes")
    if held:
        h0, h1 = fractions(held, heuristic.MACHINES["sm_90a"]), fractions(held, machine)
        print(f"held-out {len(held)} shapes: geomean {math.exp(score(h0)):.4f} before, {math.exp(score(h1)):.4f} after")
    print("MachineModel(" + ", ".join(f"{f.name}={getattr(machine, f.name)!r}" for f in fields(machine)) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
