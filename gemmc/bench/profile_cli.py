"""`gemmc profile`: a schedule of one problem (and cuBLAS on it, with --cublas) under Nsight Compute.

    gemmc profile --m 4096 --n 4096 --k 4096 [--schedule auto|heuristic] [--tile 128x256x64 ...] [--cublas]
                  [--calls 3] [--record [--db FILE]] [--json]

Runs the calls under `ncu --clock-control none --cache-control all` (gemmc/bench/ncu.py) and prints per side
the L2 hit rate, the DRAM bytes read and written against the problem's compulsory bytes, the SM clock the
kernels ran at, the tensor pipe's busy share and the call's time under the profiler. --record stores them in
the tuning DB beside the schedule's timings (`gemmc-search report` shows them). Needs a GPU and ncu; a host
without ncu gets a one-line error saying so.
"""
from __future__ import annotations

import json
import math

from ..cli import add_problem_and_schedule_args, schedule_from_args
from ..errors import GemmcError


def register(sub) -> None:
    p = sub.add_parser("profile", help="L2 hit rate, DRAM bytes, SM clock and tensor-pipe use of a kernel under ncu "
                                       "(on a GPU)",
                       description="Profile a schedule of one problem with Nsight Compute (ncu --clock-control "
                                   "none, L2 flushed before each kernel).")
    add_problem_and_schedule_args(p)
    g = p.add_argument_group("profiling")
    g.add_argument("--cublas", action="store_true", help="also profile torch.matmul (cuBLAS) on the problem")
    g.add_argument("--calls", type=int, default=3, help="calls profiled per side; the median call is reported "
                                                        "(default 3)")
    g.add_argument("--ncu", default=None, help="the ncu to run (default: $GEMMC_NCU, ncu on PATH, "
                                               "/usr/local/cuda/bin/ncu)")
    g.add_argument("--record", action="store_true",
                   help="store the profiles in the tuning DB (--db, default $GEMMC_TUNING_DB or <cache>/tuning.sqlite)")
    g.add_argument("--db", default=None, help="the tuning DB --record writes")
    g.add_argument("--json", action="store_true", help="print the profiles as JSON")
    p.set_defaults(func=run_profile)


def run_profile(args) -> int:
    from ..choose.resolve import resolve_schedule
    from ..schedule import Schedule
    from ..spec import GemmSpec
    from .ncu import ProfileJob, find_ncu, profile

    if not all(isinstance(d, int) for d in (args.m, args.n, args.k)):
        raise GemmcError(f"profile runs one concrete problem: give numbers for --m, --n and --k (got {args.m}, "
                         f"{args.n}, {args.k})")
    if args.calls < 1:
        raise GemmcError(f"--calls {args.calls}: profile at least one call")
    spec = GemmSpec(m=args.m, n=args.n, k=args.k, batch=args.batch, dtype=args.dtype, out_dtype=args.out_dtype,
                    acc_dtype=args.acc_dtype, a_layout=args.a_layout, b_layout=args.b_layout, name=args.name)
    if spec.batch is not None or (spec.a_layout, spec.b_layout) != ("mk", "nk") or spec.out_dtype != spec.dtype:
        raise GemmcError("profile runs plain GEMMs as the bench does: A [M, K] @ B [N, K].T, unbatched, the "
                         "output in the input dtype; drop --batch, --a-layout, --b-layout and --out-dtype")
    ncu = find_ncu(args.ncu)        # before any compile: a host without ncu says so at once
    schedule, _ = schedule_from_args(args, spec)
    if not isinstance(schedule, Schedule):      # auto or heuristic: the pick for this problem
        schedule, _ = resolve_schedule(spec, schedule, args.arch)
    jobs = [ProfileJob(spec, schedule)] + ([ProfileJob(spec, None)] if args.cublas else [])
    results = profile(jobs, calls=args.calls, ncu=ncu)
    if args.record:
        _record(args, spec, results)
    if args.json:
        print(json.dumps([{"side": r.job.side, "schedule": None if r.job.schedule is None else
                           r.job.schedule.to_dict(), "error": r.error,
                           "profile": None if r.profile is None else r.profile.to_dict(),
                           "dram_ratio": None if r.profile is None else r.profile.dram_ratio(spec)}
                          for r in results]))
    else:
        print_profiles(spec, results, args.calls)
    return 0 if all(r.error is None for r in results) else 1


def _record(args, spec, results) -> None:
    import torch

    from ..search.db import TuningDB
    from .ncu import TOOL
    gpu = torch.cuda.get_device_name()
    with TuningDB(args.db) as db:
        for r in results:
            if r.profile is not None:
                db.record_profile(spec, args.arch, gpu, r.job.schedule, r.profile, tool=TOOL)


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_profiles(spec, results, calls: int) -> None:
    print(f"{spec.m}x{spec.n}x{spec.k} {spec.dtype} under ncu: median of {calls} calls; L2 flushed before each "
          f"kernel, the SM clock not locked; ideal DRAM = every operand read and the output written once")
    print(f"{'side':<7} {'L2 hit':>7} {'DRAM rd MB':>11} {'DRAM wr MB':>11} {'/ideal':>7} {'SM MHz':>7} "
          f"{'tensor%':>8} {'ncu us':>9}  schedule")
    for r in results:
        name = "torch.matmul" if r.job.schedule is None else r.job.schedule.short()
        if r.profile is None:
            print(f"{r.job.side:<7} {'(failed)':>7}  {name}: {r.error}")
            continue
        p = r.profile
        print(f"{r.job.side:<7} {_fmt(100 * p.l2_hit_rate, '6.1f')}% {_fmt(p.dram_read_bytes / 1e6, '11.2f')} "
              f"{_fmt(p.dram_write_bytes / 1e6, '11.2f')} {_fmt(p.dram_ratio(spec), '7.2f')} "
              f"{_fmt(p.sm_clock_mhz, '7.0f')} {_fmt(p.tensor_pipe_pct, '8.1f')} {_fmt(p.duration_us, '9.2f')}  "
              f"{name}")
