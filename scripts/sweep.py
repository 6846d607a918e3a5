#!/usr/bin/env python3
"""Record the schedule-sweep dataset on one GPU (see gemmc/bench/sweep.py for the method).

    python3 scripts/sweep.py --budget-s 480 --out bench/data/2026-11-30-h200-sweep.jsonl.gz
    python3 scripts/sweep.py --dry-run            # CPU: the plan and a rough time estimate
    python3 scripts/sweep.py --smoke --out /tmp/smoke.jsonl.gz   # 3 shapes x 8 schedules, ~1 min
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def main(argv=None) -> int:
    from dataclasses import replace

    from gemmc.bench.sweep import (SWEEP_SPACE, SweepConfig, default_out_path, plan, predict_shape_s, roofline_us,
                                   run_sweep, sweep_shapes)

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="dataset path (default bench/data/<date>-h200-sweep.jsonl.gz)")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget, compile included (default 480)")
    p.add_argument("--compile-share", type=float, default=0.5,
                   help="the compile phase ends by this share of the budget at the latest (default 0.5)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="compile processes")
    p.add_argument("--cuda-l2-sample", type=int, default=30, help="shapes sampled from the cuda-l2 grid (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=3, help="schedules re-measured carefully per shape (default 3)")
    p.add_argument("--stages", default="auto",
                   help="stage counts to sweep, e.g. 'auto,3,4' (default auto: as many as fit; each extra value "
                        "adds up to one more kernel per schedule)")
    p.add_argument("--split-k", default="1,2,4", help="split-K values (default 1,2,4)")
    p.add_argument("--exclude", metavar="REGEX", help="skip schedules whose short id matches (e.g. '_k4$')")
    p.add_argument("--max-m", type=int, help="only shapes with M <= this (e.g. a split-K sweep of the small-M shapes)")
    p.add_argument("--max-shapes", type=int, help="only the first N shapes (smoke runs)")
    p.add_argument("--max-schedules", type=int, help="only the first N schedules of each shape (smoke runs)")
    p.add_argument("--smoke", action="store_true", help="3 shapes x 8 schedules, budget 120 s")
    p.add_argument("--dry-run", action="store_true", help="print the plan and a rough estimate; no GPU")
    p.add_argument("--stall-s", type=float, default=120.0, help="watchdog: exit after this long without progress")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)

    try:
        stages = tuple(x if x == "auto" else int(x) for x in args.stages.split(","))
        split_ks = tuple(int(x) for x in args.split_k.split(","))
    except ValueError:
        p.error("--stages takes 'auto' and integers, --split-k integers, comma-separated")
    space = replace(SWEEP_SPACE, stages=stages, split_ks=split_ks)
    shapes = sweep_shapes(args.cuda_l2_sample, args.seed)
    if args.smoke:
        shapes = [s for s in shapes if (s.m, s.n, s.k) in {(128, 4096, 4096), (4096, 4096, 4096), (1, 6144, 4096)}]
        args.max_schedules = args.max_schedules or 8
        args.budget_s = min(args.budget_s, 120.0)
    if args.max_m:
        shapes = [s for s in shapes if s.m <= args.max_m]
    if args.max_shapes:
        shapes = shapes[: args.max_shapes]
    cfg = SweepConfig(budget_s=args.budget_s, compile_share=args.compile_share, workers=args.workers,
                      top=args.top, seed=args.seed, stall_s=args.stall_s)
    pattern = re.compile(args.exclude) if args.exclude else None
    keep = None
    if args.max_schedules:
        per_shape, union = plan(shapes, space, cfg.dtype, cfg.arch)
        keep = set()
        for v in per_shape.values():
            keep.update(v[: args.max_schedules])

    def exclude(s):
        return bool(pattern and pattern.search(s.short())) or (keep is not None and s not in keep)

    if args.dry_run:
        per_shape, union = plan(shapes, space, cfg.dtype, cfg.arch)
        per_shape = {sh: [s for s in v if not exclude(s)] for sh, v in per_shape.items()}
        union = [s for s in union if not exclude(s)]
        est = sum(predict_shape_s(roofline_us(sh), len(v), cfg) for sh, v in per_shape.items())
        print(f"{len(shapes)} shapes, {len(union)} distinct schedules to compile, "
              f"{sum(map(len, per_shape.values()))} points; measuring ~{est:.0f} s at roofline speed "
              f"(+ compile ~{len(union) * 1.5 / max(1, cfg.workers):.0f} s on {cfg.workers} workers at ~1.5 s each)")
        for sh, v in per_shape.items():
            print(f"  {str(sh):>22}  {len(v):4d} schedules  ~{predict_shape_s(roofline_us(sh), len(v), cfg):6.1f} s")
        return 0

    import torch
    if not torch.cuda.is_available():
        print("sweep: no CUDA GPU visible; use --dry-run on a CPU host", file=sys.stderr)
        return 2
    out = args.out or default_out_path(torch.cuda.get_device_name(0))
    footer = run_sweep(shapes, cfg, out, space=space, exclude=exclude, progress=not args.quiet)
    return 0 if footer["shapes_done"] else 1


if __name__ == "__main__":
    sys.exit(main())
