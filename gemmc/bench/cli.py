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
from ..output_file import check_output_file

DESCRIPTION = ("Benchmark gemmc against cuBLAS (torch.matmul) on a shape suite: CUDA graphs, interleaved, "
               "inputs rotated through 2x L2, each result checked before it is timed. Writes a JSON report "
               "and a PNG plot, prints a table and a summary line.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--suite", choices=("square", "llm", "cuda-l2"),
                     help="square: 256^3..16384^3; llm: Llama-3 8B/70B projections x 8 M; cuda-l2: the 10^3 grid")
    src.add_argument("--shapes", metavar="FILE",
                     help="one 'M N K' per line (spaces, tabs, commas or semicolons; '#' comments)")
    src.add_argument("--show", metavar="REPORT",
                     help="print the table and summary of a recorded report JSON (and re-plot it with --plot); no GPU; "
                          "takes no measuring option")
    p.add_argument("--sample", type=int, metavar="N", help="a seeded random sample of N shapes of the suite")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample and of the randn inputs (default 0)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N shapes (after --sample)")
    p.add_argument("--policy", default="heuristic",
                   help="heuristic | auto | a fixed schedule like 128x256x64_c2x1_coop|pp[_s4][_rn][_sw8][_k2]"
                        "[_nopdl][_swap][_streamk] (default heuristic)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "fp8"),
                   help="input and output dtype (default bf16); fp8: e4m3 A and B with --scaling's scales, bf16 out, "
                        "against torch._scaled_mm (per tensor, per row) or a torch blockwise implementation")
    p.add_argument("--scaling", choices=("tensor", "row", "block"),
                   help="with --dtype fp8 (required there): one scale per tensor, per row of A and column of B, or "
                        "per 1x128 block of A and 128x128 block of B (DeepSeek-V3)")
    p.add_argument("--arch", default="sm_90a",
                   help="target arch passed to gemmc.compile: sm_90a | sm_80 (default sm_90a)")
    p.add_argument("--repeats", type=int, default=10, help="timed units per side (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed units per side first (default 1)")
    p.add_argument("--min-unit-us", type=float, default=1000.0,
                   help="a timed unit (one graph) runs at least this long (default 1000 us)")
    p.add_argument("--max-launches", type=int, default=200, help="launches per timed unit at most (default 200)")
    p.add_argument("--l2-factor", type=float, default=2.0,
                   help="rotate inputs through this x L2 (default 2; a shape too small to reach it within the cap on "
                        "input sets is flagged in the table and its record)")
    p.add_argument("--aa-check", action="store_true",
                   help="also time cuBLAS against itself per shape (a third interleaved side) and report the "
                        "A/A ratio: the noise floor of this GPU and method")
    p.add_argument("--settle-s", type=float, default=0.0, metavar="S",
                   help="before timing a shape whose call takes >= 100 us, run cuBLAS back to back for S seconds so "
                        "both sides are timed at the sustained (power-capped) clock (default 0: off; not with "
                        "--sustained-s)")
    p.add_argument("--sustained-s", type=float, default=0.0, metavar="S",
                   help="for a shape whose call takes >= 100 us, run each side back to back for S seconds before "
                        "each of its timed units, so each is timed at the power-capped clock its own load sets "
                        "(default 0: off; a kernel that draws more power per call clocks lower under the cap)")
    p.add_argument("--host-timing", action="store_true",
                   help="time eager user calls with host overhead included (no CUDA graphs)")
    p.add_argument("--compile-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="processes that build the kernels before measuring (default: CPUs - 1; 1: build inline)")
    p.add_argument("--out", metavar="PATH",
                   help="JSON report path (default bench/results/<date>-<gpu>-<suite>[-host].json, with -2, -3, ... "
                        "added where that file exists)")
    p.add_argument("--plot", metavar="PATH",
                   help="PNG plot path (default: the JSON path with .png; needs matplotlib)")
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
        shapes = shapes[: args.limit]
    return name, shapes


def _fail(message: str) -> int:
    print(f"gemmc bench: error: {message}", file=sys.stderr)
    return 2


# ---- checks made before anything is compiled or launched -----------------------------------------------

SHOW_OPTIONS = ("show", "plot", "no_plot", "quiet")    # the options --show reads; the rest measure


def check_show_options(args) -> None:
    """--show only prints a recorded report: a measuring option given with it would be silently ignored."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    defaults = vars(p.parse_args(["--show", "-"]))
    given = [d for d, v in defaults.items() if d not in SHOW_OPTIONS and getattr(args, d, v) != v]
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        raise GemmcError(f"--show prints a recorded report and measures nothing: {flags} would have no effect; "
                         "drop it (only --plot PATH applies)")


def check_numbers(args) -> None:
    """Counts and durations that would otherwise run nothing, or run something other than what was asked."""
    at_least = {"repeats": 1, "max_launches": 1, "limit": 1, "warmup": 0, "compile_workers": 1}
    for flag, low in at_least.items():
        value = getattr(args, flag)
        if value is not None and value < low:
            raise GemmcError(f"--{flag.replace('_', '-')} {value}: must be >= {low}")
    for flag in ("min_unit_us", "l2_factor"):
        if not getattr(args, flag) > 0:
            raise GemmcError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be > 0")
    for flag in ("settle_s", "sustained_s"):
        if getattr(args, flag) < 0:
            raise GemmcError(f"--{flag.replace('_', '-')} must be >= 0 (seconds; 0 turns it off)")


def problem_dtype(args) -> str:
    """The bench's dtype name: bf16, f16, or fp8-<scaling> (gemmc.bench.fp8); --scaling goes with fp8 only."""
    if args.dtype != "fp8":
        if args.scaling is not None:
            raise GemmcError(f"--scaling {args.scaling} scales fp8 inputs: add --dtype fp8, or drop --scaling")
        return args.dtype
    if args.scaling is None:
        raise GemmcError("--dtype fp8 needs --scaling tensor, row or block (how the fp8 inputs are scaled)")
    from .fp8 import fp8_dtype
    return fp8_dtype(args.scaling)


def check_flag_conflicts(args) -> None:
    if args.plot and args.no_plot:
        raise GemmcError(f"--plot {args.plot} and --no-plot contradict each other: drop one")
    if args.settle_s > 0 and args.sustained_s > 0:
        # both act only on long calls, where sustained timing replaces the shared settle: settle would do nothing
        raise GemmcError("--settle-s and --sustained-s both given: on the long calls they act on, --sustained-s "
                         "times each side at its own clock and the shared --settle-s would be skipped; use one")


def warn_below_house_rotation(args) -> None:
    if args.l2_factor < 2:
        print(f"gemmc bench: warning: --l2-factor {args.l2_factor:g} rotates inputs through less than 2x L2: "
              "small shapes then run partly from L2 and read faster than cold", file=sys.stderr)


def check_policy_fits(policy, shapes, dtype: str) -> None:
    """A fixed schedule that no shape can run would only record a compile error per shape: say so now."""
    from ..schedule import Schedule, check_schedule
    from ..spec import GemmSpec
    if not isinstance(policy, Schedule) or not shapes:
        return
    first = None
    for sh in shapes:
        from .fp8 import spec_kwargs
        problems = check_schedule(policy, GemmSpec(m=sh.m, n=sh.n, k=sh.k, **spec_kwargs(dtype)))
        if not problems:
            return
        first = first or (sh, problems)
    sh, problems = first
    raise GemmcError(f"--policy {policy.short()} is invalid on every shape (on {sh}: "
                     f"{'; '.join(map(str, problems))}); give a schedule these shapes can run, or heuristic / auto")


def check_writable_file(path: Path, flag: str, example: str = "report.json") -> None:
    """`path` can be created or replaced as a file (the report is written only after the whole run)."""
    check_output_file(path, f"{flag} {path}", example)


def plot_path(args, out: Path):
    """The PNG path, or None with --no-plot."""
    if args.no_plot:
        return None
    return Path(args.plot) if args.plot else out.with_suffix(".png")


def check_output_paths(out: Path, png) -> None:
    check_writable_file(out, "--out")
    if png is None:
        return
    check_writable_file(png, "--plot", "report.png")
    if png.absolute() == out.absolute():
        raise GemmcError(f"the plot and the report would both be written to {out}: give --out a .json path or "
                         "--plot another path")
    check_plotting_available()


def check_plotting_available() -> None:
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise GemmcError("the plot needs matplotlib, which is not installed: pip install 'gemmc[bench]' "
                         "(or matplotlib), or pass --no-plot")


# ---- the two modes ---------------------------------------------------------------------------------------

def show(args) -> int:
    from .report import format_table, load_json, plot_ratios
    try:
        check_show_options(args)
        if args.plot:
            check_writable_file(Path(args.plot), "--plot", "report.png")
            if Path(args.plot).absolute() == Path(args.show).absolute():
                raise GemmcError(f"--plot {args.plot} would overwrite the report it plots: give the PNG another path")
            check_plotting_available()
        report = load_json(args.show)
    except (OSError, ValueError, GemmcError) as e:
        return _fail(str(e))
    gpu = ((report.get("environment") or {}).get("gpu") or {}).get("name", "?")
    print(f"{args.show}: suite {report['suite']}, policy {report['policy']}, {report['dtype']}, {gpu}, "
          f"{report['method']['timing']}")
    print(format_table(report["results"]))
    print(f"\n{report['summary_line']}")
    if args.plot:
        print(f"plot:   {plot_ratios(report, args.plot)}")
    return 0


def write_report(report: dict, out: Path) -> Path:
    """Writes the report to `out`; where that fails at the end of a run, to the temp dir instead (the run's
    numbers are not lost), saying so."""
    import tempfile

    from .report import write_json
    try:
        return write_json(report, out)
    except OSError as e:
        fallback = Path(tempfile.gettempdir()) / out.name
        print(f"gemmc bench: error: cannot write {out} ({e.strerror or e}); writing {fallback} instead",
              file=sys.stderr)
        return write_json(report, fallback)


def run(args) -> int:
    from ..types import as_arch
    from .policy import parse_policy, policy_name
    from .report import collect_environment, default_output_path, format_table, make_report, plot_ratios, unused_path

    if args.show:
        return show(args)

    try:
        args.arch = as_arch(args.arch)
        args.dtype = problem_dtype(args)
        check_numbers(args)
        check_flag_conflicts(args)
        policy = parse_policy(args.policy, args.arch)
        suite, shapes = _shapes(args)
        check_policy_fits(policy, shapes, args.dtype)
        if args.out:
            check_output_paths(Path(args.out), plot_path(args, Path(args.out)))
    except GemmcError as e:
        return _fail(str(e))
    warn_below_house_rotation(args)

    import torch
    if not torch.cuda.is_available():
        return _fail("no CUDA GPU visible to torch; the bench measures on a GPU "
                     "(use `gemmc build` to compile without one)")

    from .timing import TimingConfig, run_bench
    env = collect_environment()
    gpu_name = (env.get("gpu") or {}).get("name")
    out = Path(args.out) if args.out else unused_path(default_output_path(suite, gpu_name, args.host_timing))
    png = plot_path(args, out)
    if not args.out:
        try:
            check_output_paths(out, png)
        except GemmcError as e:
            return _fail(f"{e} (the default report path; pass --out)")

    cfg = TimingConfig(repeats=args.repeats, warmup=args.warmup, min_unit_us=args.min_unit_us,
                       max_launches=args.max_launches, l2_factor=args.l2_factor, host_timing=args.host_timing,
                       seed=args.seed, aa_check=args.aa_check, settle_s=args.settle_s,
                       sustained_s=args.sustained_s)
    from .report import nvidia_smi
    results = run_bench(shapes, policy, cfg, dtype=args.dtype, arch=args.arch, progress=not args.quiet,
                        compile_workers=args.compile_workers)
    if env.get("gpu"):
        env["gpu"]["nvidia_smi_after"] = nvidia_smi()  # clocks under load, right after the last shape
    report = make_report(results, suite=suite, policy=policy_name(policy), dtype=args.dtype, arch=args.arch,
                         cfg=cfg, environment=env)
    print(format_table(results))   # first: the numbers reach the terminal whatever happens to the files
    print(f"\n{report['summary_line']}")
    out = write_report(report, out)
    print(f"report: {out}")
    if png is not None:
        plot_ratios(report, png)
        print(f"plot:   {png}")
    return exit_status(report)


def exit_status(report: dict) -> int:
    """1 when a shape's output failed its check (gemmc computed a wrong result) or no shape was timed, else 0.
    Compile or run errors of single shapes (e.g. a fixed --policy some shapes cannot take) are reported in the
    table and the JSON but do not fail the run."""
    wrong = [r for r in report["results"] if r.get("status") == "check_failed"]
    if wrong:
        shapes = ", ".join(f"{r['m']}x{r['n']}x{r['k']}" for r in wrong[:5]) + (", ..." if len(wrong) > 5 else "")
        print(f"gemmc bench: error: {len(wrong)} shape(s) failed the correctness check: {shapes}", file=sys.stderr)
        return 1
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
