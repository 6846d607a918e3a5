"""`gemmc-search`: tune on the GPU, report, export/import, simulate on recorded data.

  gemmc-search tune --suite llm --dtype bf16 --strategy bayes --budget 24
  gemmc-search report
  gemmc-search export tuned.json.gz / import tuned.json.gz
  gemmc-search train-policy [--gpu NAME]
  gemmc-search simulate --data bench/data --quick     (every strategy on 10 shapes, under a minute)
  gemmc-search simulate --data bench/data --strategy all --seeds 20 [--json]   (all 100 shapes: minutes)
  gemmc-search synth bench/data/synthetic.jsonl.gz     (a synthetic dataset, for CPU development)
  gemmc-search tune --suite llm --profile l2 --reward time+l2   (ncu profiles, and the L2 term in the reward)
  gemmc-search simulate --data D --reward time,time+l2 [--profiles-from DB]   (the rewards side by side)

The verdict is paired: each measurement times gemmc and cuBLAS interleaved in the same CUDA-graph
runs, and a problem's best schedule is the one with the highest geometric mean of cuBLAS / gemmc over
its own measurements, or the median one from three on (problems with no cuBLAS time, such as fused
epilogues, rank by time). That figure decides schedule="auto"'s fallback to torch.matmul. After each
shape's search, `tune` re-measures the best --confirm schedules once more, until the best rest on two
measurements within 2% of each other or on three, so the verdict rests on repeats. A schedule measured
only by an older gemmc (its kernels may have changed) is re-measured when it is among the best.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from .. import __version__
from ..errors import GemmcError
from .profiling import PROFILE_HEADER, PROFILES, entry_profiles, entry_spec, profile_cells, profile_json
from .registry import STRATEGIES
from .reward import DEFAULT_WEIGHTS, RewardError, parse_reward
from .tuning import tune


class UsageError(GemmcError):
    """A flag's value cannot work: `main` prints it on one line and exits 2, as argparse does."""


def _budgets(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: use comma-separated integers, e.g. 4,8,16,32")
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: budgets must be positive")
    return out


def _at_least(low: int, what: str):
    """An argparse type: a whole number >= `low`; the error says what the number counts."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"{text!r}: use a whole number >= {low} ({what})")
        return n
    return parse


_count = _at_least(0, "0 turns it off")


def _seconds(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use a number of seconds > 0")
    return x


def _schedule_list(text: str) -> list:
    from ..bench.policy import PolicyError, parse_schedule
    try:
        return [parse_schedule(t) for t in text.split(",") if t.strip()]
    except PolicyError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _strategies(text: str) -> list[str]:
    names = list(STRATEGIES) if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: name at least one strategy: {', '.join(STRATEGIES)}, or all")
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown strategy {bad[0]!r}; use {', '.join(STRATEGIES)} or all")
    return list(dict.fromkeys(names))     # a name given twice runs once


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gemmc-search", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help="tuning database (default: $GEMMC_TUNING_DB or <cache dir>/tuning.sqlite); "
                                "tune and import create it, the other commands read an existing one")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument("--version", action="version", version=f"gemmc-search {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tune", help="search schedules on the GPU and store every measurement",
                       description="Search each shape's schedules (--budget of them), then re-measure the "
                                   "--confirm best once more, until the best rest on two measurements within "
                                   "2% of each other or on three. Every measurement times gemmc and cuBLAS "
                                   "interleaved in the same runs; the final table ranks schedules by that "
                                   "paired speedup (geometric mean over a schedule's measurements, the median "
                                   "one from three on). A killed run resumes from the database.")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--suite", help="a bench suite: square, llm, cuda-l2, or moe (grouped GEMMs of the "
                     "mixture-of-experts models at each rows-per-expert bucket, against torch._grouped_mm)")
    src.add_argument("--shapes", help="a file of 'M N K' lines")
    t.add_argument("--sample", type=_at_least(1, "shapes"), metavar="N",
                   help="a seeded sample of N of the suite's shapes")
    t.add_argument("--dtype", default="bf16", help="A/B element type: bf16, f16 or fp8 (e4m3, with --scaling; "
                                                   "timed against torch's fp8 GEMM) (default bf16)")
    t.add_argument("--scaling", choices=("tensor", "row", "block"),
                   help="with --dtype fp8 (required there): per tensor, per row, or per block (DeepSeek-V3)")
    t.add_argument("--arch", default="sm_90a", help="sm_90a or sm_80 (default sm_90a)")
    t.add_argument("--strategy", default="bayes", choices=STRATEGIES, help="(default bayes)")
    t.add_argument("--budget", type=_at_least(0, "schedules per shape; 0: only --also and the confirmations"),
                   default=24,
                   help="schedules measured per shape by the search (default 24; stored ones count: resume; "
                        "with --fresh, only this gemmc version's; 0: no search, only --also and the confirmations)")
    t.add_argument("--confirm", type=_count, default=3, metavar="N",
                   help="then re-measure the N best schedules of each shape once more, and again where the "
                        "N best hold a schedule measured once or two measurements more than 2%% apart (at most "
                        "three per schedule; extra to --budget; a resumed run skips those stored); 0: no "
                        "confirmation (default 3)")
    t.add_argument("--batch", type=_at_least(1, "schedules per batch"), default=4,
                   help="schedules proposed and compiled together (default 4)")
    t.add_argument("--workers", type=_at_least(1, "processes"), default=4, help="compile worker processes (default 4)")
    t.add_argument("--compile-timeout", type=_seconds, default=600.0, metavar="S",
                   help="seconds one schedule may take to compile (default 600)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--settle-s", type=float, default=0.0, metavar="S",
                   help="before each measurement of a shape whose cuBLAS call takes >= 100 us, run cuBLAS back to "
                        "back for S seconds, so schedules are judged at the sustained (power-capped) clock a long "
                        "job runs at; costs S seconds per such measurement (default 0: off)")
    t.add_argument("--sustained-s", type=float, default=0.0, metavar="S",
                   help="for a shape whose cuBLAS call takes >= 100 us, run each side back to back for S seconds "
                        "before each of its timed units, so a schedule is judged at the power-capped clock its "
                        "own load sets (one that draws more power per call clocks lower); costs about 2 x S x "
                        "repeats seconds per such measurement. Rows are stored as timed so; where a problem has "
                        "them, only they rank, and its interleaved rows do not count toward --budget "
                        "(default 0: off)")
    t.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="timed units per side in each measurement (default: gemmc bench's, 10); fewer make an "
                        "own-clock (--sustained-s) measurement cheaper, at the cost of its noise")
    t.add_argument("--also", type=_schedule_list, default=[], metavar="S1,S2,...",
                   help="also measure these schedules (schedule strings, e.g. 128x16x64_pp_s12_swap) on every "
                        "shape where they are valid, after the search; stored with strategy 'also', extra to "
                        "--budget, ranked with the search's rows; a resumed run skips those stored. For schedules "
                        "outside the strategies' space")
    t.add_argument("--fresh", action="store_true",
                   help="count toward --budget only this gemmc version's measurements, so the search runs "
                        "again after a kernel change (older rows stay in the ranking, marked stale, and the "
                        "confirmations re-measure those that reach the top)")
    t.add_argument("--no-train-policy", action="store_true",
                   help="skip retraining the policy at the end (on the rows of the GPU tuned on)")
    t.add_argument("--symbolic", action="store_true",
                   help="compile each schedule once for symbolic M, N, K (shared by every shape)")
    t.add_argument("--profile", choices=PROFILES, default=None,
                   help="l2: also profile each searched schedule under ncu (Nsight Compute; one ncu run per batch) "
                        "and store its L2 hit rate, DRAM bytes, SM clock and tensor-pipe use beside its times")
    t.add_argument("--ncu", default=None, help="the ncu --profile runs (default: $GEMMC_NCU, PATH, "
                                               "/usr/local/cuda/bin/ncu)")
    _reward_args(t, "what the strategy minimises: time, or time+l2 (the time scaled up by the L2 misses and the "
                    "DRAM bytes past the compulsory ones; needs --profile l2 or stored profiles); the DB and the "
                    "verdict keep the times (default time)")

    r = sub.add_parser("report", help="what is tuned, and the paired speed-ups over cuBLAS")
    r.add_argument("--json", action="store_true")

    e = sub.add_parser("export", help="write every measurement and the policies to FILE (gzipped JSON)")
    e.add_argument("file", help="the file to write, e.g. tuned.json.gz (not the DB itself)")
    i = sub.add_parser("import", help="merge an export into this database")
    i.add_argument("file", help="a file `gemmc-search export` wrote")

    tp = sub.add_parser("train-policy", help="(re)train the rl policy on the database's rows of one GPU")
    tp.add_argument("--gpu", metavar="NAME",
                    help="train on the rows measured on this GPU, named as torch.cuda.get_device_name() does "
                         "(default: $GEMMC_GPU, else the visible GPU; with neither, every GPU's rows, and the "
                         "policy's GPU is unknown unless they are all one GPU's); schedule='auto' uses the policy "
                         "only on that GPU")
    tp.add_argument("--epochs", type=_at_least(1, "passes over the data"), default=60, help="(default 60)")
    tp.add_argument("--seed", type=int, default=0)

    s = sub.add_parser("simulate", help="replay a recorded dataset through the strategies (CPU only)",
                       description="Replay recorded measurements through the search strategies, printing progress "
                                   "per strategy, seed and rl fold to stderr. The whole of bench/data takes "
                                   "minutes (bayes and rl's training dominate); --quick is a form that runs in "
                                   "under a minute.")
    s.add_argument("--data", required=True, help="a dataset file or a bench/data/<dataset> folder")
    s.add_argument("--strategy", type=_strategies, default="all",
                   help=f"all, or a comma list of: {', '.join(STRATEGIES)} (default all; rl trains on some "
                        f"recorded problems and is scored on the others, so with fewer than two it is left out, "
                        f"with a note)")
    s.add_argument("--budget", type=_budgets, default=None,
                   help="comma list of measurement counts to report each strategy at (default 4,8,16,32; with "
                        "--quick 4,8,16; budget 1, the first pick, is always reported)")
    s.add_argument("--seeds", type=_at_least(1, "runs"), default=None,
                   help="runs per strategy with a random element, each with its own seed, averaged per problem "
                        "(default 20, with --quick 2; deterministic ones run once)")
    s.add_argument("--batch", type=_at_least(1, "schedules per proposal"), default=1,
                   help="schedules a strategy proposes at a time (default 1)")
    s.add_argument("--folds", type=_at_least(2, "rl trains on all folds but one"), default=4,
                   help="rl: shapes are split (by N, K) into this many folds (default 4)")
    s.add_argument("--epochs", type=_at_least(1, "passes over the data"), default=60,
                   help="rl: training epochs over the training shapes (default 60)")
    s.add_argument("--max-shapes", type=_at_least(1, "recorded problems"), metavar="N",
                   help="use a seeded sample of N recorded problems (default: all; with --quick 10)")
    s.add_argument("--quick", action="store_true",
                   help="a replay that finishes in under a minute: --max-shapes 10 --seeds 2 --budget 4,8,16 "
                        "(flags given as well win)")
    s.add_argument("--no-heuristic", action="store_true",
                   help="bayes: start from a random space-filling design, not the heuristic's ranking")
    _reward_args(s, "comma list of rewards to replay each strategy under: time, time+l2 (the recorded profiles: "
                    "a record's own, or --profiles-from's; without any, time+l2 replays as time) (default time)",
                 many=True)
    s.add_argument("--profiles-from", metavar="DB",
                   help="a tuning DB whose profiles (tune --profile l2, gemmc profile --record) the replay adds to "
                        "the recorded schedules")
    s.add_argument("--json", action="store_true")

    g = sub.add_parser("synth", help="write a synthetic dataset (analytic H200-like model) for development")
    g.add_argument("file")
    g.add_argument("--shapes", type=int, default=40)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--noise", type=float, default=0.02)
    g.add_argument("--profiles", action="store_true",
                   help="give each record the model's ncu-like profile (L2 hit rate, DRAM bytes), for replays "
                        "under --reward time+l2 (synthetic: it says nothing about a GPU)")
    return p


def _reward_args(p, help_text: str, many: bool = False) -> None:
    p.add_argument("--reward", default="time", help=help_text)
    p.add_argument("--reward-weights", default=None, metavar="l2=W,dram=W",
                   help=f"the L2 term's weights (default l2={DEFAULT_WEIGHTS['l2']:g},dram={DEFAULT_WEIGHTS['dram']:g})")


def _rewards(args) -> list:
    """The --reward (a comma list for simulate) and --reward-weights, read; UsageError if they do not read."""
    kinds = [k.strip() for k in args.reward.split(",") if k.strip()] or ["time"]
    try:        # the weights are the L2 term's: given with time alone they are a mistake (parse_reward says so)
        return [parse_reward(k, args.reward_weights if k != "time" or kinds == ["time"] else None) for k in kinds]
    except RewardError as e:
        raise UsageError(str(e)) from None


def _db_path(args) -> Path:
    from ..choose.tuning_db_schema import default_path
    return Path(args.db) if args.db else default_path()


def _db(args):
    """The DB for a command that writes measurements (tune, import): created if missing."""
    from .db import TuningDB
    return TuningDB(_db_path(args))


def _existing_db(args):
    """The DB, read-only, for a command that reads it (report, export, train-policy): TuningDBError if the
    file is missing or not gemmc's, so a mistyped --db creates nothing and a foreign file stays untouched."""
    from .db import TuningDB
    return TuningDB(_db_path(args), create=False)


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


PAIRED_NOTE = """\
paired = cuBLAS us / gemmc us, timed interleaved in the same runs; gemmc us, cuBLAS us and paired are
geometric means over the best schedule's `rows` measurements, or the median row's from three rows on.
The best schedule is the one with the highest paired speedup (the fastest where no cuBLAS time was
paired)."""


def _geomean_line(sps: list[float], what: str) -> str:
    return (f"geomean paired speedup over cuBLAS: {_geomean(sps):.3f}x{what}; with the cuBLAS fallback: "
            f"{_geomean([max(1.0, s) for s in sps]):.3f}x")


def _nothing_tuned(db, disqualified) -> str:
    """Why the report is empty: no measurement yet, only failed ones (and the commonest error), or only
    disqualified schedules (listed after it)."""
    n = db.count()
    if not n:
        return f"{db.path}: nothing tuned yet (gemmc-search tune ...)"
    if any(d.n_ok for d in disqualified):
        return (f"{db.path}: nothing tuned yet: {n} measurement{'s' if n > 1 else ''}, and every schedule that ran "
                f"was disqualified (below)")
    fails = db.failures()
    line = f"{db.path}: nothing tuned yet: {n} measurement{'s' if n > 1 else ''}, none successful"
    if fails:
        error, times = fails[0]
        error = error.strip().splitlines()[0][:200] if error.strip() else "(no message)"
        line += f" (most often, {times} of them: {error})"
    return line + "; `gemmc-search export FILE` writes every row with its error"


def _problem_id(fields: dict, gpu: str) -> tuple:
    return json.dumps(fields, sort_keys=True), gpu


def _shape_text(f: dict) -> str:
    return f"{f['m']}x{f['n']}x{f['k']}" + (f" L{f['batch']}" if f['batch'] else "")


DISQUALIFIED_SHOWN = 20      # the report lists this many disqualified schedules; export has every row


def _print_disqualified(disqualified) -> None:
    """Which schedules failed their correctness check, so that no pick can be one of them, and why."""
    from ..choose.tuning_db_verdict import CHECK_FAILED
    if not disqualified:
        return
    n = len(disqualified)
    print(f"{n} schedule{'s' if n > 1 else ''} disqualified: {'they' if n > 1 else 'it'} failed the correctness "
          f"check (output against the fp32 reference) at the newest gemmc that measured "
          f"{'them' if n > 1 else 'it'}, so {'they' if n > 1 else 'it'} cannot be picked whatever the times:")
    for d in disqualified[:DISQUALIFIED_SHOWN]:
        passed = f", though it passed {d.n_ok} time{'s' if d.n_ok > 1 else ''}" if d.n_ok else ""
        why = d.error[len(CHECK_FAILED):].strip().splitlines()[0][:200] if d.error.strip() else "(no message)"
        print(f"  {_shape_text(d.fields)} {d.fields['dtype']} {d.gpu_name}: {d.schedule.short()}: "
              f"{d.n_failed} failed check{'s' if d.n_failed > 1 else ''} (gemmc {d.version}){passed}: {why}")
    if n > DISQUALIFIED_SHOWN:
        print(f"  ... and {n - DISQUALIFIED_SHOWN} more (`gemmc-search export FILE` writes every row with its error)")


def _print_policies(policies) -> None:
    """The stored rl policies, one per GPU (and one of unknown GPU), each with the problems it was trained on."""
    from ..choose.tuning_db_schema import policy_name
    if not policies:
        return
    print("rl policies (schedule='auto' and `tune --strategy rl` use the target GPU's, else the unknown GPU's):")
    for p in policies:
        name = "" if p.name == policy_name(p.gpu_name) else f" [{p.name}]"
        print(f"  {p.gpu_name or 'unknown GPU'}{name}: trained on {p.trained_shapes} problems "
              f"(gemmc {p.gemmc_version})")


def cmd_report(args) -> int:
    with _existing_db(args) as db:
        rows = db.best_all()
        disqualified = db.disqualified()
        policies = db.policies()
        if args.json:
            out = {}
            for d in disqualified:
                out.setdefault(_problem_id(d.fields, d.gpu_name), []).append(
                    {"schedule": d.schedule.to_dict(), "error": d.error, "gemmc_version": d.version,
                     "failed_checks": d.n_failed, "ok_rows": d.n_ok})
            profs = [entry_profiles(db, e) for e in rows]
            print(json.dumps([{**e.fields, "gpu": e.gpu_name, "schedule": e.schedule.to_dict(), "time_us": e.time_us,
                               "cublas_us": e.cublas_us, "speedup": e.speedup, "paired": e.cublas_us is not None,
                               "rows": e.n_rows, "measured": e.n_measured, "gemmc_version": e.version,
                               "stale": e.stale, "timing": "sustained" if e.own_clock else "interleaved",
                               "disqualified": out.get(_problem_id(e.fields, e.gpu_name), []),
                               "profile": profile_json(p[0], entry_spec(e.fields)),
                               "cublas_profile": profile_json(p[1], entry_spec(e.fields))}
                              for e, p in zip(rows, profs)]))
            return 0
        if not rows:
            print(_nothing_tuned(db, disqualified))
            _print_disqualified(disqualified)
            _print_policies(policies)
            return 0
        count = db.count()
        profs = [entry_profiles(db, e)[0] for e in rows]
    print(f"{db.path}: {count} measurements, {len(rows)} tuned problems")
    gpus = sorted({e.gpu_name for e in rows})
    gw = max(len(g) for g in gpus + ["gpu"])
    shown = any(p is not None for p in profs)     # the ncu columns, once any best schedule was profiled
    print(f"{'shape':>20} {'dtype':>5} {'epilogue':>10} {'arch':>6} {'gpu':<{gw}} {'gemmc us':>10} {'cuBLAS us':>10} "
          f"{'paired':>8} {'rows':>4} {'n':>4}" + (f" {PROFILE_HEADER}" if shown else "") + "  schedule")
    for e, prof in zip(rows, profs):
        f = e.fields
        sp = f"{e.speedup:.3f}" if e.speedup else "-"
        cub = f"{e.cublas_us:.2f}" if e.cublas_us else "-"
        print(f"{_shape_text(f):>20} {f['dtype']:>5} {f['epilogue_class'][:10]:>10} {f['arch']:>6} {e.gpu_name:<{gw}} "
              f"{e.time_us:10.2f} {cub:>10} {sp:>8} {e.n_rows:4d} {e.n_measured:4d}"
              + (f" {profile_cells(prof, entry_spec(f))}" if shown else "") + f"  {e.schedule.short()}"
              + (f"  (gemmc {e.version})" if e.stale else "") + ("  [own clock]" if e.own_clock else ""))
    # one geomean per GPU: speedups measured on different GPUs do not average into anything
    for gpu in gpus:
        sps = [e.speedup for e in rows if e.speedup and e.gpu_name == gpu]
        if sps:
            print(_geomean_line(sps, f" over {len(sps)} problems" + (f" on {gpu}" if len(gpus) > 1 else "")))
    if shown:
        print("L2 hit, DRAM/id (DRAM bytes / the compulsory bytes), SM MHz, tens% (tensor-pipe busy share): the best "
              "schedule's ncu profile (`tune --profile l2`, `gemmc profile --record`), L2 flushed before each "
              "kernel; '-' where none is stored.")
    print(f"{PAIRED_NOTE} n = the problem's successful measurements on that GPU."
          + (" [own clock]: timed by `tune --sustained-s`, each side at the power-capped clock its own load "
             "sets; those rows alone rank their problem." if any(e.own_clock for e in rows) else ""))
    stale = [e for e in rows if e.stale]
    if stale:
        print(f"{len(stale)} of the picks rest on measurements of an older gemmc (marked), whose kernels may have "
              f"run at another speed: `gemmc-search tune --budget 1` re-measures them with gemmc {__version__}.")
    _print_disqualified(disqualified)
    _print_policies(policies)
    return 0


def print_summary(summary) -> None:
    print(f"{'shape':>20} {'gemmc us':>10} {'cuBLAS us':>10} {'paired':>8} {'rows':>4}  schedule")
    for sh, e in summary:
        if e is None:
            print(f"{str(sh):>20} {'-':>10} {'-':>10} {'-':>8} {'-':>4}  (no schedule ran)")
            continue
        sp = f"{e.speedup:.3f}" if e.speedup else "-"
        print(f"{str(sh):>20} {e.time_us:10.2f} {e.cublas_us or float('nan'):10.2f} {sp:>8} {e.n_rows:4d}  "
              f"{e.schedule.short()}" + ("  [own clock]" if e.own_clock else ""))
    sps = [e.speedup for _, e in summary if e and e.speedup]
    if sps:
        print(_geomean_line(sps, f" over {len(sps)} shapes"))
    print(PAIRED_NOTE)


def _tune_shapes_checked(args) -> list:
    """The shapes `tune` is asked for, with --dtype and --arch checked on them: every flag error is
    reported before the GPU check (a wrong flag says so, not "no GPU")."""
    from ..bench.suites import get_suite, load_shapes
    from ..errors import SpecError
    from ..spec import GemmSpec
    from ..types import as_arch
    if args.shapes and args.sample is not None:
        raise UsageError("--sample draws from a --suite; a --shapes file is tuned whole (list only the shapes "
                         "you want in it)")
    try:
        shapes = get_suite(args.suite, args.sample, args.seed) if args.suite else load_shapes(args.shapes)
        arch = as_arch(args.arch)
    except SpecError as e:     # the suite, the shapes file or the arch: the message says which and how
        raise UsageError(str(e)) from None
    if (args.dtype == "fp8") != (args.scaling is not None):
        raise UsageError("--dtype fp8 needs --scaling tensor, row or block" if args.dtype == "fp8" else
                         f"--scaling {args.scaling} scales fp8 inputs: add --dtype fp8, or drop --scaling")
    if args.dtype == "fp8":
        from ..bench.fp8 import fp8_dtype
        if any(hasattr(sh, "spec") for sh in shapes) and args.scaling != "block":   # the moe suite's grouped ones
            raise UsageError(f"--dtype fp8 --scaling {args.scaling} with grouped problems (--suite moe): grouped "
                             "fp8 GEMMs are built with block scales (per-tensor and per-row ones are not); use "
                             "--scaling block")
        args.dtype = fp8_dtype(args.scaling)     # the problem class the tune loop reads (gemmc.bench.fp8)
        # (a grouped kernel keeps N and K static under --symbolic)
        if args.symbolic and args.scaling == "block" and not hasattr(shapes[0], "spec"):
            raise UsageError("--symbolic with --scaling block: block scales need a static N and K; drop --symbolic")
    try:
        from ..bench.fp8 import spec_kwargs
        if hasattr(shapes[0], "spec"):
            shapes[0].spec(args.dtype)
        else:
            GemmSpec(shapes[0].m, shapes[0].n, shapes[0].k, **spec_kwargs(args.dtype))
    except SpecError as e:
        raise UsageError(f"--dtype {args.dtype}: {e}") from None
    for flag in ("settle_s", "sustained_s"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0 (seconds; 0 turns it off)")
    if args.settle_s > 0 and args.sustained_s > 0:
        # both act only on long calls, where --sustained-s replaces the shared settle
        raise UsageError("--settle-s and --sustained-s both given: on the long calls they act on, --sustained-s "
                         "times each side at its own clock and --settle-s would be skipped; use one")
    if any(s.arch != arch for s in args.also):
        raise UsageError(f"--also schedules are read as sm_90a (swap_ab is SM90-only); they cannot run under "
                         f"--arch {args.arch}: drop --also or tune sm_90a")
    if args.repeats is not None and args.repeats < 1:
        raise UsageError("--repeats must be >= 1 (timed units per side)")
    return shapes


def cmd_tune(args) -> int:
    from ..bench.timing import TimingConfig
    from .builder import Builder
    from .runner import Runner
    shapes = _tune_shapes_checked(args)
    rewards = _rewards(args)
    if len(rewards) != 1:
        raise UsageError(f"--reward {args.reward!r}: tune searches under one reward: time or time+l2")
    reward = rewards[0]
    repeats = {} if args.repeats is None else {"repeats": args.repeats}
    runner = Runner(timing=TimingConfig(settle_s=args.settle_s, sustained_s=args.sustained_s, **repeats))
    gpu = runner.gpu_name()
    if gpu == "cpu":
        raise UsageError("no GPU is visible, and tune measures on one; `gemmc-search simulate` replays recorded "
                         "data through the strategies on the CPU")
    profiler = None
    if args.profile == "l2":
        from .profiling import NcuProfiler
        profiler = NcuProfiler(ncu=args.ncu)     # a host without ncu: a one-line error before anything runs
    elif reward.uses_profiles:
        print("gemmc-search tune: note: --reward time+l2 without --profile l2 reads only the profiles already "
              "stored; schedules without one are scored by their time", file=sys.stderr)
    db = _db(args)
    with Builder(workers=args.workers, timeout_s=args.compile_timeout) as builder:
        summary = tune(shapes, dtype=args.dtype, arch=args.arch, strategy=args.strategy, budget=args.budget,
                       batch=args.batch, db=db, builder=builder, runner=runner, gpu_name=gpu, seed=args.seed,
                       symbolic=args.symbolic, confirm=args.confirm, also=args.also,
                       fresh=args.fresh, sustained=args.sustained_s > 0, profiler=profiler,
                       reward=None if reward.kind == "time" else reward)
    if not args.no_train_policy and args.strategy != "rl":
        from .rl import train_policy_from_db
        try:
            pol = train_policy_from_db(db, gpu_name=gpu)      # only the rows of the GPU tuned on
            print(f"policy retrained on {pol.trained_shapes} problems measured on {gpu}", file=sys.stderr)
        except ValueError as e:
            print(f"policy not trained: {e}", file=sys.stderr)
    print_summary(summary)
    return 0


SIMULATE_DEFAULTS = {"max_shapes": None, "seeds": 20, "budget": [4, 8, 16, 32]}
SIMULATE_QUICK = {"max_shapes": 10, "seeds": 2, "budget": [4, 8, 16]}     # --quick: under a minute on 2 cores


def cmd_simulate(args) -> int:
    import random

    from .simulate import group_problems, load_records, simulate
    for flag, value in (SIMULATE_QUICK if args.quick else SIMULATE_DEFAULTS).items():
        if getattr(args, flag) is None:
            setattr(args, flag, value)
    header, records = load_records(args.data)
    problems = group_problems(records, header)
    if args.max_shapes is not None and args.max_shapes < len(problems):
        keep = sorted(random.Random(0).sample(range(len(problems)), args.max_shapes))
        problems = [problems[i] for i in keep]
    if not problems:
        raise GemmcError(f"{args.data}: no recorded problem has a successful measurement, so there is no best to "
                         f"compare with; replay a dataset whose sweep ran")
    strategies = list(args.strategy)
    if "rl" in strategies and len(problems) < 2:
        # rl is scored only on problems its policy was not trained on: one problem leaves none to train on
        if strategies == ["rl"]:
            raise GemmcError(f"{args.data}: rl needs at least two recorded problems (it trains on some and is "
                             f"scored on the others); this dataset has {len(problems)}")
        strategies.remove("rl")
        print(f"gemmc-search simulate: note: rl left out: it trains on some recorded problems and is scored on "
              f"the others, and this dataset has {len(problems)}", file=sys.stderr)
    rewards = _rewards(args)
    uses_profiles = any(r.uses_profiles for r in rewards)
    profiled = _attach_profiles(args, problems) if uses_profiles else (0, 0)
    t0 = time.perf_counter()
    progress = None if args.json else (lambda msg: print(f"  [{time.perf_counter() - t0:6.1f}s] {msg}",
                                                         file=sys.stderr))
    runs = {r.describe(): simulate(problems, strategies, args.budget, args.seeds, batch=args.batch,
                                   rl_folds=args.folds, rl_epochs=args.epochs, progress=progress,
                                   heuristic=not args.no_heuristic, reward=None if r.kind == "time" else r)
            for r in rewards}
    if args.json:       # one reward: {strategy: ...} as before; several: {reward: {strategy: ...}}
        print(json.dumps(next(iter(runs.values())) if len(runs) == 1 else runs))
        return 0
    res = {(name if len(runs) == 1 else f"{name} [{reward.split(' ')[0]}]"): row
           for reward, r in runs.items() for name, row in r.items()}
    budgets = sorted(res[next(iter(res))], key=int)
    print(f"{len(problems)} problems, {args.seeds} seeds, batch {args.batch}; fraction of the exhaustive best "
          f"(median over problems), score vs random in brackets (0 = random, 1 = optimum); budget 1 = first pick")
    if uses_profiles:
        print(f"rewards: {'; '.join(runs)}; ncu profiles on {profiled[0]} of {profiled[1]} recorded schedules "
              f"(time+l2 scores a schedule without one by its time); the fractions are of the recorded times")
    width = max(10, *(len(n) for n in res))
    print(f"{'strategy':>{width}} " + " ".join(f"{'@' + b:>14}" for b in budgets))
    for name, row in res.items():
        cells = []
        for b in budgets:
            c = row[b]
            s = "" if c["score_vs_random"] is None else f" ({c['score_vs_random']:+.2f})"
            cells.append(f"{c['median_fraction']:.3f}{s}".rjust(14))
        print(f"{name:>{width}} " + " ".join(cells))
    return 0


def _attach_profiles(args, problems) -> tuple[int, int]:
    """--profiles-from's profiles onto the recorded problems; (schedules with a profile, schedules)."""
    from .simulate import attach_profiles, profiled_share
    if args.profiles_from:
        from .db import TuningDB
        with TuningDB(args.profiles_from, create=False) as db:
            attach_profiles(problems, db)
    return profiled_share(problems)


def _counted(n: dict, new: str = "") -> str:
    """'3 measurements and 1 policies', with the profiles when there are any."""
    if n.get("profiles"):
        return f"{n['measurements']} {new}measurements, {n['policies']} policies and {n['profiles']} profiles"
    return f"{n['measurements']} {new}measurements and {n['policies']} policies"


def cmd_export(args) -> int:
    with _existing_db(args) as db:
        n = db.export(args.file)
    print(f"exported {_counted(n)} to {args.file}")
    return 0


def cmd_import(args) -> int:
    from .db import TuningDB
    data = TuningDB.read_export(args.file)     # a bad file is refused before the DB is created or opened
    with _db(args) as db:
        n = db.merge_export(data)
    print(f"imported {_counted(n, 'new ')} from {args.file}")
    return 0


def cmd_train_policy(args) -> int:
    from ..choose.gpu import target_gpu
    from .db import TuningDB
    from .rl import train_policy_from_db
    gpu = target_gpu(args.gpu)      # --gpu, else GEMMC_GPU, else the visible GPU; None: every GPU's rows
    with _existing_db(args) as db:
        try:
            pol = train_policy_from_db(db, epochs=args.epochs, seed=args.seed, save=False, gpu_name=gpu)
        except ValueError:          # no problem of that GPU has two or more measured schedules
            of = "" if gpu is None else f" measured on {gpu}"
            others = [g for g in db.gpus() if g != gpu] if gpu is not None else []
            hint = (f"; the DB holds rows of {', '.join(repr(g) for g in others)}: name one with --gpu" if others
                    else "")
            raise GemmcError(f"{db.path}: no problem{of} has two or more measured schedules, so there is nothing "
                             f"to rank; tune some shapes first (`gemmc-search tune`) or `gemmc-search import` "
                             f"measurements{hint}") from None
    with TuningDB(db.path) as out:      # opened for writing only to store the policy
        out.save_policy(pol)
    print(f"trained the policy on {pol.trained_shapes} problems measured on {pol.gpu_name or 'several GPUs'}; "
          f"saved in {db.path}")
    return 0


def cmd_synth(args) -> int:
    from .synthetic import make_synthetic_dataset
    path = make_synthetic_dataset(args.file, args.shapes, args.seed, args.noise, profiles=args.profiles)
    print(f"wrote {path} ({args.shapes} shapes, synthetic H200 model, noise {args.noise}"
          + (", with modelled profiles)" if args.profiles else ")"))
    return 0


def _error_line(e: BaseException, args) -> str | None:
    """The one line for an error the user can fix (a flag, a file, the DB); None for anything else, a bug,
    which keeps its traceback."""
    import sqlite3
    if isinstance(e, GemmcError):
        return str(e)
    if isinstance(e, sqlite3.DatabaseError):     # damaged after its first pages, or locked
        return (f"the tuning DB {_db_path(args)}: {e}; check it with `sqlite3 FILE 'PRAGMA integrity_check'`, "
                f"or point --db or GEMMC_TUNING_DB at another")
    if isinstance(e, OSError):
        return f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)
    return None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    handler = {"tune": cmd_tune, "report": cmd_report, "export": cmd_export, "import": cmd_import,
               "train-policy": cmd_train_policy, "simulate": cmd_simulate, "synth": cmd_synth}[args.cmd]
    try:
        return handler(args)
    except Exception as e:
        line = None if args.debug else _error_line(e, args)
        if line is None:
            raise
        print(f"gemmc-search {args.cmd}: error: {line}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
