"""`gemmc bench` / `python -m gemmc.bench`: gemmc against cuBLAS over a suite of shapes.

    gemmc bench --suite llm --policy heuristic
    gemmc bench --suite cuda-l2 --sample 100 --seed 0 --policy auto
    gemmc bench --shapes my_shapes.txt --policy 128x256x64_c2x1_coop --host-timing
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import GemmcError

DESCRIPTION = ("Benchmark gemmc against cuBLAS (torch.matmul) on a shape suite: CUDA graphs, interleaved, "
               "inputs rotated through 2x L2, each result checked before it is timed. Writes a JSON report "
               "and a PNG plot, prints a table and a summary line.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--suite", choices=("square", "llm", "cuda-l2"),
                     help="square: 256^3..16384^3; llm: Llama-3 8B/70B projections x 8 M; cuda-l2: the 10^3 grid")
    src.add_argument("--shapes", metavar="FILE", help="one 'M N K' per line (spaces or commas, '#' comments)")
    src.add_argument("--show", metavar="REPORT",
                     help="print the table and summary of a recorded report JSON (and re-plot it with --plot); no GPU")
    p.add_argument("--sample", type=int, metavar="N", help="a seeded random sample of N shapes of the suite")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample and of the randn inputs (default 0)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N shapes")
    p.add_argument("--policy", default="heuristic",
                   help="heuristic | auto | a fixed schedule like 128x256x64_c2x1_coop|pp[_s4][_rn][_sw8][_k2]"
                        "[_nopdl][_swap][_streamk] (default heuristic)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16"), help="input and output dtype (default bf16)")
    p.add_argument("--arch", default="sm_90a", help="target arch passed to gemmc.compile (default sm_90a)")
    p.add_argument("--repeats", type=int, default=10, help="timed units per side (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed units per side first (default 1)")
    p.add_argument("--min-unit-us", type=float, default=1000.0,
                   help="a timed unit (one graph) runs at least this long (default 1000 us)")
    p.add_argument("--max-launches", type=int, default=200, help="launches per timed unit at most (default 200)")
    p.add_argument("--l2-factor", type=float, default=2.0, help="rotate inputs through this x L2 (default 2)")
    p.add_argument("--aa-check", action="store_true",
                   help="also time cuBLAS against itself per shape (a third interleaved side) and report the "
                        "A/A ratio: the noise floor of this GPU and method")
    p.add_argument("--settle-s", type=float, default=0.0, metavar="S",
                   help="before timing a shape whose call takes >= 100 us, run cuBLAS back to back for S seconds so "
                        "both sides are timed at the sustained (power-capped) clock (default 0: off)")
    p.add_argument("--sustained-s", type=float, default=0.0, metavar="S",
                   help="for a shape whose call takes >= 100 us, run each side back to back for S seconds before "
                        "each of its timed units, so each is timed at the power-capped clock its own load sets "
                        "(default 0: off; a kernel that draws more power per call clocks lower under the cap)")
    p.add_argument("--host-timing", action="store_true",
                   help="time eager user calls with host overhead included (no CUDA graphs)")
    p.add_argument("--compile-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="processes that build the kernels before measuring (default: CPUs - 1; 1: build inline)")
    p.add_argument("--out", metavar="PATH",
                   help="JSON report path (default bench/results/<date>-<gpu>-<suite>.json)")
    p.add_argument("--plot", metavar="PATH", help="PNG plot path (default: the JSON path with .png)")
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _shapes(args):
    from .suites import dedupe, get_suite, load_shapes
    if args.shapes:
        shapes = load_shapes(args.shapes)
        if args.sample is not None:
            import random
            if args.sample <= 0:
                raise GemmcError(f"--sample {args.sample}: use a positive number")
            idx = sorted(random.Random(args.seed).sample(range(len(shapes)), min(args.sample, len(shapes))))
            shapes = [shapes[i] for i in idx]
        name = Path(args.shapes).stem
    else:
        shapes = get_suite(args.suite, args.sample, args.seed)
        name = args.suite + (f"-{args.sample}" if args.sample is not None else "")
    shapes = dedupe(shapes)
    if args.limit is not None:
        shapes = shapes[: max(0, args.limit)]
    return name, shapes


def show(args) -> int:
    from .report import format_table, load_json, plot_ratios
    try:
        report = load_json(args.show)
    except (OSError, ValueError) as e:
        print(f"gemmc bench: error: {e}", file=sys.stderr)
        return 2
    gpu = ((report.get("environment") or {}).get("gpu") or {}).get("name", "?")
    print(f"{args.show}: suite {report['suite']}, policy {report['policy']}, {report['dtype']}, {gpu}, "
          f"{report['method']['timing']}")
    print(format_table(report["results"]))
    print(f"\n{report['summary_line']}")
    if args.plot:
        print(f"plot:   {plot_ratios(report, args.plot)}")
    return 0


def run(args) -> int:
    from .policy import parse_policy, policy_name
    from .report import collect_environment, default_output_path, format_table, make_report, plot_ratios, write_json
    from .timing import TimingConfig, run_bench

    if args.show:
        return show(args)

    try:
        policy = parse_policy(args.policy, args.arch)
        suite, shapes = _shapes(args)
    except GemmcError as e:
        print(f"gemmc bench: error: {e}", file=sys.stderr)
        return 2
    for flag in ("repeats", "max_launches"):
        if getattr(args, flag) < 1:
            print(f"gemmc bench: error: --{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    for flag in ("settle_s", "sustained_s"):
        if getattr(args, flag) < 0:
            print(f"gemmc bench: error: --{flag.replace('_', '-')} must be >= 0 (seconds; 0 turns it off)",
                  file=sys.stderr)
            return 2

    import torch
    if not torch.cuda.is_available():
        print("gemmc bench: error: no CUDA GPU visible to torch; the bench measures on a GPU "
              "(use `gemmc build` to compile without one)", file=sys.stderr)
        return 2

    cfg = TimingConfig(repeats=args.repeats, warmup=args.warmup, min_unit_us=args.min_unit_us,
                       max_launches=args.max_launches, l2_factor=args.l2_factor, host_timing=args.host_timing,
                       seed=args.seed, aa_check=args.aa_check, settle_s=args.settle_s,
                       sustained_s=args.sustained_s)
    env = collect_environment()
    from .report import nvidia_smi
    results = run_bench(shapes, policy, cfg, dtype=args.dtype, arch=args.arch, progress=not args.quiet,
                        compile_workers=args.compile_workers)
    if env.get("gpu"):
        env["gpu"]["nvidia_smi_after"] = nvidia_smi()  # clocks under load, right after the last shape
    report = make_report(results, suite=suite, policy=policy_name(policy), dtype=args.dtype, arch=args.arch,
                         cfg=cfg, environment=env)
    out = Path(args.out) if args.out else default_output_path(suite, (env.get("gpu") or {}).get("name"),
                                                               args.host_timing)
    write_json(report, out)
    print(format_table(results))
    print(f"\n{report['summary_line']}")
    print(f"report: {out}")
    if not args.no_plot:
        png = Path(args.plot) if args.plot else out.with_suffix(".png")
        plot_ratios(report, png)
        print(f"plot:   {png}")
    return 0 if report["summary"]["n_ok"] else 1


def register(subparsers) -> argparse.ArgumentParser:
    """Hook for gemmc/cli.py: adds the `bench` subcommand (its handler is `args.func(args)`)."""
    p = subparsers.add_parser("bench", help="benchmark gemmc against cuBLAS", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gemmc.bench", description=DESCRIPTION)
    add_arguments(p)
    return run(p.parse_args(argv))
