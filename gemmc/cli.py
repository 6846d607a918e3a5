"""The `gemmc` command.

    gemmc compile --m 4096 --n 4096 --k 4096 --dtype bf16 --arch sm_90a [--schedule auto|heuristic]
                  [--tile 128x128x64 --cluster 2x1 --mode pingpong ...]
                  [--print-ir-after-all | --print-ir-after PASS] [--emit ir|source]
    gemmc opt FILE -p assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources [-o OUT]
                  (FILE: MLIR text, whatever its name; - or none: stdin; -o -: stdout)

Schedule flags (--tile ...) replace those fields of the --schedule pick for the problem; the other fields keep
the pick's values.

Other subcommands register themselves in SUBCOMMANDS: name -> module path; the module defines
`register(subparsers)`, which adds its parser and sets `func=<callable(args) -> exit code>`.
A module that fails to import is left out of the command (its error is shown with --debug).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Optional, Sequence

from xdsl.xdsl_opt_main import xDSLOptMain

from .errors import GemmcError, ScheduleError
from .output_file import check_output_file, make_parent
from .schedule.limits import L2_POLICIES

SUBCOMMANDS: dict[str, str] = {
    "build": "gemmc.build_cli",
    "bench": "gemmc.bench.cli",
    "profile": "gemmc.bench.profile_cli",
}


def register_subcommand(name: str, module: str) -> None:
    SUBCOMMANDS[name] = module


# ---- gemmc compile ----------------------------------------------------------------------------

def _dim(text: str):
    return int(text) if text.isdigit() else text


def _shape(n: int):
    def parse(text: str) -> tuple[int, ...]:
        parts = text.lower().replace(",", "x").split("x")
        if len(parts) != n or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {n} sizes like {'x'.join(['128'] * n)}")
        return tuple(int(p) for p in parts)
    return parse


def _stages(text: str):
    return text if text == "auto" else int(text)


SCHEDULE_FLAGS = ("tile", "cluster", "stages", "mode", "raster", "swizzle", "split_k", "pdl", "swap_ab", "stream_k",
                  "l2_a", "l2_b", "l2_out", "l2_prefetch")


def add_problem_and_schedule_args(p) -> None:
    """The problem and schedule flags shared by `gemmc compile` and `gemmc build`."""
    prob = p.add_argument_group("problem")
    prob.add_argument("--m", type=_dim, default="M", help="int, or a name for a symbolic dim (default M)")
    prob.add_argument("--n", type=_dim, default="N")
    prob.add_argument("--k", type=_dim, default="K")
    prob.add_argument("--batch", type=_dim, default=None, help="leading batch dim L (int or name)")
    prob.add_argument("--dtype", default="bf16", help="A/B element type: bf16 | f16 | f8e4m3 (with --scaling)")
    prob.add_argument("--b-dtype", default=None, help="B's element type where it differs: f8e5m2 with fp8 A")
    prob.add_argument("--scaling", default=None, choices=("tensor", "row", "block"),
                      help="fp8 scales (named scale_a, scale_b): per tensor, per row, or per block (DeepSeek-V3)")
    prob.add_argument("--out-dtype", default=None, help="output type (default: --dtype; bf16 for fp8)")
    prob.add_argument("--acc-dtype", default="f32")
    prob.add_argument("--a-layout", default="mk", choices=("mk", "km"))
    prob.add_argument("--b-layout", default="nk", choices=("nk", "kn"))
    prob.add_argument("--name", default="gemm")
    pick = p.add_argument_group("target and schedule choice")
    pick.add_argument("--arch", default="sm_90a", help="sm_90a | sm_80")
    pick.add_argument("--schedule", default="auto", choices=("auto", "heuristic"),
                      help="how to pick the schedule (default auto: the tuning DB, the shipped table, then the "
                           "heuristic; with a symbolic M, per runtime M). Schedule fields given below replace those "
                           "fields of this pick for the problem; with a symbolic M, auto's pick is then the "
                           "heuristic's for the symbolic shape")
    sch = p.add_argument_group("schedule fields (each replaces that field of the --schedule pick; the others keep "
                               "the pick's values)")
    sch.add_argument("--tile", type=_shape(3), help="MxNxK, e.g. 128x128x64")
    sch.add_argument("--cluster", type=_shape(2), help="MxN CTAs, e.g. 2x1")
    sch.add_argument("--stages", type=_stages, help="int or auto")
    sch.add_argument("--mode", choices=("cooperative", "pingpong"))
    sch.add_argument("--raster", choices=("m", "n"))
    sch.add_argument("--swizzle", type=int)
    sch.add_argument("--split-k", type=int)
    sch.add_argument("--pdl", dest="pdl", action=argparse.BooleanOptionalAction, default=None,
                     help="programmatic dependent launch (sm_90a; the search and heuristic keep it on); --no-pdl "
                          "launches plainly (sm_80 kernels always launch plain)")
    sch.add_argument("--swap-ab", dest="swap_ab", action=argparse.BooleanOptionalAction, default=None,
                     help="swap A and B (sm_90a, split-K up to 4): the kernel computes out^T = b @ a^T, --tile and "
                          "--cluster read N first; for decode and small-batch shapes (M <= 128). The pick may "
                          "already be swapped: --no-swap-ab to unswap it")
    sch.add_argument("--stream-k", dest="stream_k", action=argparse.BooleanOptionalAction, default=None,
                     help="stream-K (sm_90a, cooperative, split-K 1): whole waves of tiles run data-parallel, and "
                          "the tiles of the last partial wave and one full wave are split into equal (tile, k-tile) "
                          "shares per cluster; for shapes whose tiles would leave SMs idle in a partial wave")
    for operand, what in (("a", "a's TMA loads"), ("b", "b's TMA loads (the weights)"), ("out", "the TMA store")):
        sch.add_argument(f"--l2-{operand}", dest=f"l2_{operand}", choices=L2_POLICIES,
                         help=f"L2 eviction priority of {what} (sm_90a): auto (gemmc's rule"
                              + (": evict-first when the grid loads each tile once)" if operand != "out" else
                                 ": no hint)") + ", or first, normal, last on every copy")
    sch.add_argument("--l2-prefetch", dest="l2_prefetch", type=_stages, metavar="N|auto",
                     help="k-tiles of the weights each CTA prefetches into L2 before waiting on the previous kernel "
                          "(sm_90a, PDL; 0: none); auto: 2 k-tiles of a and b, in the grids of the PDL bands")


def schedule_from_args(args, spec, cache_dir=None):
    """(schedule= for gemmc.compile, the pick the flags edited or None). No schedule flag: the --schedule
    choice itself. Otherwise that choice resolved for `spec` with the flagged fields replaced; with a symbolic
    M, auto resolves (as it does before its per-M buckets) to the heuristic's pick for the symbolic shape.
    `cache_dir`: the cache whose tuning DB auto reads (`gemmc build --cache-dir`)."""
    from .choose.resolve import resolve_schedule, tuning_db_for
    from .compiler import as_cache_dir
    from .schedule import default_schedule

    knobs = {f: getattr(args, f) for f in SCHEDULE_FLAGS if getattr(args, f) is not None}
    if not knobs:
        return args.schedule, None
    try:
        db = tuning_db_for(as_cache_dir(cache_dir)) if cache_dir is not None else None
        base, _ = resolve_schedule(spec, args.schedule, args.arch, db=db)
    except ScheduleError:
        # nothing in the heuristic's space fits this problem: the flags edit the default, and its check says why
        base = default_schedule(args.arch)
    return base.with_(**knobs), base


def add_compile_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a GEMM and print its IR (or kernel source)",
                       description="Compile a GEMM; print the IR after the passes you name.")
    add_problem_and_schedule_args(p)
    out = p.add_argument_group("output")
    out.add_argument("--print-ir-after-all", action="store_true", help="the input IR, then the IR after each pass")
    out.add_argument("--print-ir-after", action="append", default=[], metavar="PASS",
                     help="the IR after PASS (repeatable); 'input' for the gemm-level IR")
    out.add_argument("--emit", choices=("ir", "source"), default="ir",
                     help="ir: the final kernel IR; source: the CuTe DSL source of the kernel")
    p.set_defaults(func=run_compile)


def _banner(what: str) -> str:
    return f"// -----// IR {what} //----- //"


def _bucket_runs(table):
    """[("lo..hi", Decision)] merging neighbouring buckets that make the same choice from the same source
    (the label names it); the last run is written "lo.." because the last bucket takes every larger M too."""
    runs, lo = [], 1
    same = lambda x, y: (x.schedule, x.use_cublas, x.source) == (y.schedule, y.use_cublas, y.source)  # noqa: E731
    for b, d in table:
        if runs and same(runs[-1][2], d):
            runs[-1] = (runs[-1][0], b, runs[-1][2])
        else:
            runs.append((lo, b, d))
        lo = b + 1
    from .choose.m_buckets import range_label
    return [(range_label(lo, None if i == len(runs) - 1 else hi), d) for i, (lo, hi, d) in enumerate(runs)]


def spec_from_args(args):
    """The GemmSpec the problem flags describe (`gemmc compile` and `gemmc build`)."""
    from .spec import GemmSpec
    return GemmSpec(m=args.m, n=args.n, k=args.k, batch=args.batch, dtype=args.dtype, out_dtype=args.out_dtype,
                    acc_dtype=args.acc_dtype, a_layout=args.a_layout, b_layout=args.b_layout, name=args.name,
                    b_dtype=args.b_dtype, scaling=args.scaling)


def run_compile(args) -> int:
    from .compiler import compile

    spec = spec_from_args(args)
    schedule, base = schedule_from_args(args, spec)
    if base is not None:            # which pick the flags edited
        flagged = ", ".join(f for f in SCHEDULE_FLAGS if getattr(args, f) is not None)
        who = "auto (the heuristic: M is symbolic)" if args.schedule == "auto" and not isinstance(spec.m, int) \
            else args.schedule
        edited = f"{who} picked {base.short()}; set by flags: {flagged}"
    try:
        k = compile(spec, schedule=schedule, arch=args.arch, emit="kernel" if args.emit == "source" else "ir")
    except ScheduleError as e:
        if base is None:
            raise
        # a field the flags left alone may be what breaks (say the pick's 10 stages under a larger --tile)
        raise GemmcError(f"{e}\n  ({edited}; the other fields keep the pick's values: set them too)") from None
    if k.schedule is None:          # auto on a problem no kernel takes (compiler.CublasOnlyGemm)
        print(f"// auto: {k.decision.detail}; no kernel, no IR")
        return 0
    print(f"// schedule: {k.schedule.short()} ({k.arch})")
    if base is not None:
        print(f"// {edited}")
    if k.decision is not None:      # schedule="auto": which step chose, and whether cuBLAS runs instead
        d = k.decision
        print(f"// auto: from {d.source}" + (f" ({d.detail})" if d.detail else "")
              + ("; calls run torch.matmul" if d.use_cublas else ""))
    if k.m_buckets is not None:     # symbolic M: each call follows its M's bucket
        print("// auto per runtime M (rounded up to a power of two):")
        for rng, d in _bucket_runs(k.m_buckets.table()):
            what = "torch.matmul" if d.use_cublas else d.schedule.short()
            print(f"//   M {rng}: {what} [{d.source}]")
    wanted = list(args.print_ir_after)
    for name in wanted:
        if name != "input" and name not in k.passes:
            raise GemmcError(f"--print-ir-after {name}: no such pass; passes: input, {', '.join(k.passes)}")
    if args.print_ir_after_all:
        wanted = ["input", *k.passes]
    for name in wanted:
        print(_banner("input (gemm level)" if name == "input" else f"after {name}"))
        print(k.ir(None if name == "input" else name))
    if args.emit == "source":
        print(k.source)
    elif not wanted:
        print(k.ir(k.passes[-1]))
    return 0


# ---- gemmc opt --------------------------------------------------------------------------------

class GemmcOptMain(xDSLOptMain):
    """xdsl-opt with gemmc's dialects and passes registered."""

    def register_all_dialects(self):
        super().register_all_dialects()
        from .ir import DIALECTS
        for d in DIALECTS:
            if d.name not in self.ctx.registered_dialect_names:
                self.ctx.register_dialect(d.name, lambda d=d: d)

    def register_all_arguments(self, arg_parser):
        arg_parser.prog = "gemmc opt"          # not argv[0]: usage lines read as the command typed
        super().register_all_arguments(arg_parser)

    def register_all_passes(self):
        from .passes import PASSES
        for name, cls in PASSES.items():
            self.register_pass(name, lambda cls=cls: cls)

    def get_input_stream(self):
        # gemmc IR is MLIR text whatever the file is called (--frontend still picks another reader); "-" is stdin
        if self.args.input_file in (None, "-"):
            return sys.stdin.buffer, "mlir"
        return open(self.args.input_file, "rb"), "mlir"

    def get_input_name(self):
        return "stdin" if self.args.input_file in (None, "-") else self.args.input_file

    def prepare_output(self):
        if self.args.output_file in (None, "-"):
            return sys.stdout
        make_parent(Path(self.args.output_file), f"-o {self.args.output_file}")
        return open(self.args.output_file, "w")


def add_opt_parser(sub) -> None:
    p = sub.add_parser("opt", help="run gemmc passes over an IR file (xdsl-opt)", add_help=False,
                       description="Arguments are those of xdsl-opt: FILE -p PASS,PASS ... (gemmc opt -h)")
    p.add_argument("opt_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=run_opt)


def run_opt(args) -> int:
    from .passes import PIPELINE
    try:
        opt = GemmcOptMain(description="gemmc opt: run gemmc passes over IR", args=args.opt_args)
    except ValueError as e:     # xDSL's "Unrecognized passes: [...]", raised while it builds the pipeline
        if "Unrecognized passes" not in str(e):
            raise
        raise GemmcError(f"{e}; gemmc's passes are {', '.join(PIPELINE)} (-p takes them comma-separated)") from None
    out = opt.args.output_file
    if out not in (None, "-"):      # refused before any pass runs (gemmc/output_file.py's rule)
        opt.args.output_file = str(check_output_file(out, f"-o {out}", "out.mlir"))
    try:
        opt.run()
    except OSError as e:        # the input file (or -o's) cannot be opened
        raise GemmcError(f"cannot open {e.filename}: {e.strerror}; pass an existing IR file (or - for stdin)") \
            from None
    return 0


# ---- main -------------------------------------------------------------------------------------

def make_parser(debug_errors: Optional[list] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemmc", description="gemmc: a GEMM kernel compiler for NVIDIA GPUs")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"gemmc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_compile_parser(sub)
    add_opt_parser(sub)
    for name, module in SUBCOMMANDS.items():
        try:
            importlib.import_module(module).register(sub)
        except Exception as e:   # a subcommand still being written must not break the others
            if debug_errors is not None:
                debug_errors.append(f"gemmc {name}: not available ({type(e).__name__}: {e})")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    skipped: list[str] = []
    parser = make_parser(skipped)
    if "opt" in argv and all(a.startswith("-") for a in argv[:argv.index("opt")]):
        # everything after `opt` belongs to xdsl-opt's own parser (argparse's REMAINDER drops leading flags)
        i = argv.index("opt")
        args = parser.parse_args(argv[:i + 1])
        args.opt_args = argv[i + 1:]
    else:
        args = parser.parse_args(argv)
    if args.debug:
        for line in skipped:
            print(line, file=sys.stderr)
    try:
        return args.func(args)
    except GemmcError as e:
        if args.debug:
            raise
        print(f"gemmc {args.command}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
        if args.debug or not isinstance(e, (DiagnosticException, ParseError, VerifyException)):
            raise
        print(f"gemmc {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
