"""`gemmc build`: compile GEMM kernels into the kernel cache, on any machine (no GPU needed).

    gemmc build --m 4096 --n 4096 --k 4096 --dtype bf16 --arch sm_90a [--tile 128x256x64 ...]
                [--cache-dir DIR] [--ptx FILE]

Prints one line per kernel: its cache key and the directory holding kernel.so / kernel.ptx / kernel.py,
then the cache root. Copy that root to a GPU host (GEMMC_CACHE_DIR) and `gemmc.compile(...)` with the
same problem and schedule loads the .so from it without compiling.
"""
from __future__ import annotations

import os
import sys

from .cli import SCHEDULE_FLAGS, add_problem_and_schedule_args


def register(sub) -> None:
    p = sub.add_parser("build", help="compile kernels into the cache (works without a GPU)",
                       description="Build the kernel for a problem and schedule into the kernel cache.")
    add_problem_and_schedule_args(p)
    out = p.add_argument_group("output")
    out.add_argument("--cache-dir", default=None, help="cache root (default: $GEMMC_CACHE_DIR or ~/.cache/gemmc)")
    out.add_argument("--ptx", default=None, metavar="FILE", help="also write the PTX to FILE ('-': stdout)")
    p.set_defaults(func=run_build)


def run_build(args) -> int:
    if args.cache_dir:
        os.environ["GEMMC_CACHE_DIR"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    from .cache import default_cache
    from .compiler import compile
    from .schedule import default_schedule
    from .spec import GemmSpec

    spec = GemmSpec(m=args.m, n=args.n, k=args.k, batch=args.batch, dtype=args.dtype, out_dtype=args.out_dtype,
                    acc_dtype=args.acc_dtype, a_layout=args.a_layout, b_layout=args.b_layout, name=args.name)
    knobs = {f: getattr(args, f) for f in SCHEDULE_FLAGS if getattr(args, f) is not None}
    schedule = default_schedule(args.arch).with_(**knobs) if knobs else args.schedule
    k = compile(spec, schedule=schedule, arch=args.arch)
    art = k.artifact
    print(f"{art.key}  {k.schedule.short()} ({k.arch})  {art.directory}", flush=True)
    if k.m_buckets is not None:     # symbolic M under auto: every bucket's kernel, so any M runs from the cache
        from .cli import _bucket_runs
        for rng, d in _bucket_runs(k.m_buckets.table()):
            if d.use_cublas:
                print(f"  M {rng}: torch.matmul ({d.source}: cuBLAS faster), nothing to build", flush=True)
                continue
            a = k.m_buckets.kernel_for(d.schedule).artifact
            print(f"  M {rng}: {a.key}  {d.schedule.short()}  {a.directory}", flush=True)
    if args.ptx == "-":
        sys.stdout.write(art.ptx)
    elif args.ptx:
        with open(args.ptx, "w") as f:
            f.write(art.ptx)
    print(f"cache: {default_cache().root}")
    return 0
