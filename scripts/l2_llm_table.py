"""The shipped picks of the llm suite under Nsight Compute, beside cuBLAS: per shape the L2 hit rate, the DRAM bytes
against the compulsory bytes, the SM clock and the tensor pipe's share, of both sides; and the pick's time against
cuBLAS's in the bench's paired timing.

    python scripts/l2_llm_table.py                       # on the H200: JSON under $OUT, the table printed last
    python scripts/l2_llm_table.py --shapes 16x4096x4096,4096x4096x4096 --no-timing
    python scripts/l2_llm_table.py --compile-only        # CPU: the picks, lowered and emitted; the ncu command

Picks: what `schedule="auto"` runs with no tuning DB of one's own (the shipped table; the heuristic where the
table has no entry), its kernel even where auto would hand the call to cuBLAS (`auto` says which, in the table's
`verdict` column). All picks are compiled first (--workers processes), then profiled in one ncu run (each side
--calls calls, the median call; L2 flushed before each kernel, the SM clock left to the GPU), then timed (the
bench's rules: CUDA graphs, input sets rotated through 2x L2, gemmc and cuBLAS interleaved, --repeats repeats,
the paired ratio cuBLAS / gemmc; each pick's output checked against the fp32 reference first).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FORMAT = "gemmc-l2-llm-table/1"
# a tuning DB that does not exist: auto picks from the shipped table
NO_TUNING_DB = Path(tempfile.gettempdir()) / "gemmc-l2-table-no-db" / "tuning.sqlite"


def shapes_of(args):
    from gemmc.bench.suites import Shape, get_suite
    if args.shapes:
        return [Shape(*(int(x) for x in s.lower().split("x"))) for s in args.shapes.split(",") if s.strip()]
    return get_suite("llm")


def picks(shapes) -> dict:
    """{shape: (schedule, auto's decision)} of the shipped H200 table (the heuristic where it has none)."""
    from gemmc.choose.auto import resolve_auto
    from gemmc.choose.heuristic import choose_schedule
    from gemmc.spec import GemmSpec
    out = {}
    for sh in shapes:
        spec = GemmSpec(sh.m, sh.n, sh.k)
        d = resolve_auto(spec, "sm_90a", db=NO_TUNING_DB, gpu_name="NVIDIA H200")
        out[sh] = (d.schedule if d.schedule is not None else choose_schedule(spec, "sm_90a"), d)
    return out


def compile_only(args, chosen, log) -> dict:
    from gemmc.backends.sm90 import emit
    from gemmc.bench.ncu import ProfileJob, ncu_command, TENSOR_METRICS
    from gemmc.compiler import lower
    from gemmc.spec import GemmSpec
    rows = []
    for sh, (s, d) in chosen.items():
        emitted = emit(lower(GemmSpec(sh.m, sh.n, sh.k), s)[1])
        rows.append({"shape": str(sh), "schedule": s.short(), "source": d.source, "use_cublas": d.use_cublas,
                     "entry": emitted.entry})
        log(f"{str(sh):>20} {d.source:>10} {'cuBLAS' if d.use_cublas else 'gemmc':>6}  {s.short()}")
    jobs = [ProfileJob(GemmSpec(sh.m, sh.n, sh.k), s) for sh, (s, _) in chosen.items()]
    cmd = ncu_command("ncu", ["python3", "-m", "gemmc.bench.profile_target", "JOBS.json", "MANIFEST.json"],
                      "ncu.csv", TENSOR_METRICS[0])
    log("ncu command: " + " ".join(cmd))
    return {"picks": rows, "jobs": len(jobs) * 2, "ncu_command": cmd}


def run_gpu(args, chosen, log, save) -> dict:
    import torch
    from gemmc.bench.compile_pool import CompilePool
    from gemmc.bench.ncu import ProfileJob, profile
    from gemmc.bench.report import collect_environment
    from gemmc.choose.measurement import ideal_dram_bytes
    from gemmc.bench.timing import (CudaClock, TimingConfig, bench_shape, compile_gemmc, input_set_count,
                                    l2_bytes_of, make_input_sets, spin_up)
    from gemmc.spec import GemmSpec

    t0 = time.time()
    jobs = [{"m": sh.m, "n": sh.n, "k": sh.k, "policy": s.to_dict()} for sh, (s, _) in chosen.items()]
    CompilePool(jobs, args.workers, dtype="bf16", arch="sm_90a").collect(time.perf_counter() + 600)
    log(f"compiled {len(jobs)} picks in {time.time() - t0:.0f}s")
    report = {"format": FORMAT, "environment": collect_environment(), "config": vars(args), "rows": []}
    t0 = time.time()
    pjobs = [j for sh, (s, _) in chosen.items() for j in (ProfileJob(GemmSpec(sh.m, sh.n, sh.k), s),
                                                          ProfileJob(GemmSpec(sh.m, sh.n, sh.k), None))]
    results = profile(pjobs, calls=args.calls, timeout_s=args.ncu_timeout_s)
    log(f"profiled {len(pjobs)} jobs under ncu in {time.time() - t0:.0f}s")
    report["profiles"] = [{"shape": str(r.job.spec.m) + "x" + str(r.job.spec.n) + "x" + str(r.job.spec.k),
                           "side": r.job.side, **_side(r, r.job.spec)} for r in results]
    save(report)                # the profiles survive a run cut short in the timing
    clock, cfg = CudaClock(graphs=True), TimingConfig(repeats=args.repeats)
    if not args.no_timing:
        spin_up()
    for i, (sh, (s, d)) in enumerate(chosen.items()):
        spec = GemmSpec(sh.m, sh.n, sh.k)
        ours, cub = results[2 * i], results[2 * i + 1]
        row = {"shape": str(sh), "m": sh.m, "n": sh.n, "k": sh.k, "schedule": s.to_dict(), "short": s.short(),
               "source": d.source, "auto_runs_cublas": d.use_cublas,
               "ideal_bytes": ideal_dram_bytes(spec), "gemmc": _side(ours, spec), "cublas": _side(cub, spec)}
        if not args.no_timing:
            try:
                n = input_set_count(sh, 2, l2_bytes_of(), cfg.l2_factor, cfg.max_sets)
                sets = make_input_sets(sh, torch.bfloat16, "cuda", n, cfg.seed)
                rec = bench_shape(sh, compile_gemmc(sh, s), sets, clock, cfg)
                row["timing"] = {"status": rec["status"], "error": rec.get("error"),
                                 "gemmc_us": rec.get("gemmc_us", {}).get("median"),
                                 "cublas_us": rec.get("cublas_us", {}).get("median"), "ratio": rec.get("ratio")}
                del sets
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001  one shape's failure is its row's
                row["timing"] = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:500]}"}
        report["rows"].append(row)
        save(report)
        log(f"{str(sh):>20} {_cells(row)}")
    return report


def _side(result, spec) -> dict:
    if result.profile is None:
        return {"error": result.error}
    p = result.profile
    return {**p.to_dict(), "dram_ratio": p.dram_ratio(spec)}


def _f(x, fmt) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _cells(row) -> str:
    g, c, t = row["gemmc"], row["cublas"], row.get("timing", {})
    hit = lambda side: _f(100 * side["l2_hit_rate"], ".1f") if "l2_hit_rate" in side else "err"  # noqa: E731
    return (f"{hit(g):>6} {hit(c):>6} {_f(g.get('dram_ratio'), '.2f'):>6} {_f(c.get('dram_ratio'), '.2f'):>6} "
            f"{_f(g.get('sm_clock_mhz'), '.0f'):>5} {_f(c.get('sm_clock_mhz'), '.0f'):>5} "
            f"{_f(g.get('tensor_pipe_pct'), '.0f'):>4} {_f(c.get('tensor_pipe_pct'), '.0f'):>4} "
            f"{_f(t.get('ratio'), '.3f'):>6} {'cuBLAS' if row['auto_runs_cublas'] else 'gemmc':>6}  {row['short']}")


def print_table(report) -> None:
    print("\n== the llm suite's shipped picks under ncu (gemmc | cuBLAS) ==")
    print("L2 hit %; DRAM / ideal = DRAM bytes / (a, b read and out written once); SM MHz the clock the kernels ran "
          "at (ncu --clock-control none); tens% the tensor pipe's busy share; ratio = cuBLAS us / gemmc us "
          "(paired, the bench's timing); verdict = what auto runs")
    print(f"{'shape':>20} {'L2 g':>6} {'L2 c':>6} {'DRAM g':>6} {'DRAM c':>6} {'MHz g':>5} {'MHz c':>5} "
          f"{'tn g':>4} {'tn c':>4} {'ratio':>6} {'runs':>6}  pick")
    for row in report["rows"]:
        print(f"{row['shape']:>20} {_cells(row)}")
    ratios = [r["timing"]["ratio"] for r in report["rows"] if r.get("timing", {}).get("ratio")]
    if ratios:
        print(f"geomean ratio cuBLAS / pick over {len(ratios)} shapes: "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="", help="comma list of MxNxK (default: the llm suite, 64 shapes)")
    ap.add_argument("--calls", type=int, default=1, help="calls profiled per side (default 1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per shape (default 5)")
    ap.add_argument("--no-timing", action="store_true", help="profile only")
    ap.add_argument("--workers", type=int, default=8, help="compile processes (default 8)")
    ap.add_argument("--ncu-timeout-s", type=float, default=420.0, help="the ncu run's limit (default 420)")
    ap.add_argument("--compile-only", action="store_true", help="CPU: the picks lowered and emitted, no GPU")
    ap.add_argument("--out", default=os.environ.get("OUT") or "l2_table_out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line):
        print(line, flush=True)
    chosen = picks(shapes_of(args))
    if args.compile_only:
        report = compile_only(args, chosen, log)
        (out / "l2_llm_table_compile.json").write_text(json.dumps(report, indent=1))
        print(f"\n== compile-only: {len(report['picks'])} picks emitted; {report['jobs']} ncu jobs would run ==")
        return 0
    def save(report):
        (out / "l2_llm_table.json").write_text(json.dumps(report, indent=1, default=str))
    report = run_gpu(args, chosen, log, save)
    save(report)
    print_table(report)
    bad = [r for r in report["rows"] if "error" in r["gemmc"] or r.get("timing", {}).get("status") not in
           (None, "ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
