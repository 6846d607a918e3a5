"""The schedule search without a GPU: replay recorded H200 measurements through the search strategies.

    python examples/search_simulate.py [--shapes 10] [--budget 4,8,16] [--seeds 2]

bench/data/ holds sweeps recorded on an H200: for each of 100 GEMM shapes, the time of every schedule
the sweep tried. Replaying them, a strategy (exhaustive, random, bayes, rl) proposes schedules one
at a time and "measures" each by looking its record up, so one can see on the CPU how close each gets
to the exhaustive best (the fastest recorded valid schedule) within a budget of measurements. rl is
scored only on shapes it was not trained on; bayes starts from the heuristic's ranking, whose constants
may have been fitted to this same data (--no-heuristic starts it from a random design instead).
This is `gemmc-search simulate` through its Python API (gemmc.search), on a seeded sample of
the shapes so it takes well under a minute. At the end it prints the `gemmc-search tune` command that
runs the real search on a GPU; it never runs it.
"""
import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from gemmc.search import group_problems, load_records, simulate_strategies

DATA = Path(__file__).resolve().parent.parent / "bench" / "data"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA), help="a dataset file or folder (default: the repo's bench/data)")
    ap.add_argument("--strategies", default="exhaustive,random,bayes,rl")
    ap.add_argument("--budget", default="4,8,16", help="measurement counts to report each strategy at")
    ap.add_argument("--seeds", type=int, default=2, help="runs per randomized strategy, averaged per shape")
    ap.add_argument("--shapes", type=int, default=10, help="recorded shapes to replay (a seeded sample)")
    ap.add_argument("--rl-epochs", type=int, default=30, help="training epochs of the rl policy")
    ap.add_argument("--no-heuristic", action="store_true", help="bayes: start from a random design")
    args = ap.parse_args()

    header, records = load_records(args.data)
    problems = group_problems(records, header)
    total = len(problems)
    if args.shapes < total:     # a seeded sample keeps the run short and repeatable
        problems = [problems[i] for i in sorted(random.Random(0).sample(range(total), args.shapes))]
    strategies = args.strategies.split(",")
    budgets = [int(b) for b in args.budget.split(",")]
    print(f"# {len(records)} records, {total} recorded shapes; replaying {len(problems)}: "
          + ", ".join(f"{p.spec.m}x{p.spec.n}x{p.spec.k}" for p in problems))

    t0 = time.perf_counter()
    result = simulate_strategies(problems, strategies, budgets, args.seeds, rl_epochs=args.rl_epochs,
                                 heuristic=not args.no_heuristic)
    print(f"# simulated in {time.perf_counter() - t0:.1f} s; fraction of the exhaustive best reached "
          "(median over shapes; 1.0 = found the best), budget 1 = the first pick")
    columns = sorted(result[strategies[0]], key=int)
    print(f"{'strategy':>10} " + " ".join(f"{'@' + b:>7}" for b in columns))
    for name in strategies:
        print(f"{name:>10} " + " ".join(f"{result[name][b]['median_fraction']:7.3f}" for b in columns))
    if "exhaustive" in strategies:
        space = statistics.median(len(p.problem().candidates) for p in problems)
        print(f"# (exhaustive walks the space in a fixed order: it is sure of the best only after all {space:.0f} "
              "valid schedules of a median shape)")

    # the real search on a GPU, with the strategy that got closest at the largest budget (rl is left out:
    # tune runs it only from a policy already trained on a tuning DB)
    top = str(max(budgets))
    pick = max((s for s in strategies if s in ("random", "bayes")), key=lambda s: result[s][top]["median_fraction"],
               default="bayes")
    print("\n# on a GPU, `gemmc-search tune` runs the real search: it compiles and times each proposed schedule\n"
          "# against cuBLAS and stores every measurement in the tuning DB ($GEMMC_TUNING_DB, else\n"
          "# <GEMMC_CACHE_DIR>/tuning.sqlite), which schedule='auto' reads first. For these shapes (not run here):")
    print("printf '" + "\\n".join(f"{p.spec.m} {p.spec.n} {p.spec.k}" for p in problems) + "\\n' > shapes.txt")
    print(f"gemmc-search tune --shapes shapes.txt --strategy {pick} --budget {top} --confirm 3")
    print("gemmc-search report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
