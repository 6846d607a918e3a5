"""`gemmc build`: compile GEMM kernels into the kernel cache, on any machine (no GPU needed).

    gemmc build --m 4096 --n 4096 --k 4096 --dtype bf16 --arch sm_90a [--tile 128x256x64 ...]
                [--cache-dir DIR] [--ptx FILE]

Prints one line per kernel as it is built (or found): its cache key, schedule, arch (and the arch it was
compiled for where GEMMC_SM80_COMPILE_ARCH makes that another) and the directory holding kernel.so /
kernel.ptx / kernel.py; under `auto` with a symbolic M, one more line per M bucket; then the cache root.
They go to stderr when `--ptx -` writes the PTX to stdout, so stdout is the PTX alone. `--ptx` writes the
PTX of the first line's kernel; a problem no kernel takes (auto runs torch.matmul) has none, and is then
an error. Copy the root to a GPU host and `gemmc.compile(...)` with the same problem and schedule, and that
cache as GEMMC_CACHE_DIR or `cache_dir=`, loads the .so from it without compiling. `auto` reads the tuning
DB of the cache it builds into (`<cache-dir>/tuning.sqlite`, unless GEMMC_TUNING_DB is set), as the GPU
host reading that cache will.
"""
from __future__ import annotations

import sys

from .cli import add_problem_and_schedule_args, schedule_from_args, spec_from_args
from .errors import GemmcError
from .output_file import check_output_file, make_parent


def register(sub) -> None:
    p = sub.add_parser("build", help="compile kernels into the cache (works without a GPU)",
                       description="Build the kernel for a problem and schedule into the kernel cache.")
    add_problem_and_schedule_args(p)
    out = p.add_argument_group("output")
    out.add_argument("--cache-dir", default=None, help="cache root (default: $GEMMC_CACHE_DIR or ~/.cache/gemmc); "
                     "`auto` reads the tuning DB there too, unless GEMMC_TUNING_DB is set")
    out.add_argument("--ptx", default=None, metavar="FILE",
                     help="also write the PTX of the (first) kernel to FILE ('-': stdout)")
    p.set_defaults(func=run_build)


def _arch_text(k) -> str:
    """The arch, and the one the kernel was compiled for where they differ (sm_80 built for Hopper)."""
    compiled_for = k.kernel.emitted.compile_arch or k.arch
    return k.arch if compiled_for == k.arch else f"{k.arch}, compiled for {compiled_for}"


def run_build(args) -> int:
    ptx_dest = None
    if args.ptx and args.ptx != "-":    # refused before the build, not after it
        ptx_dest = check_output_file(args.ptx, f"--ptx {args.ptx}", "kernel.ptx")
    # with the PTX on stdout, the status lines go to stderr: `gemmc build ... --ptx - > k.ptx` is PTX alone
    status = sys.stderr if args.ptx == "-" else sys.stdout
    from .compiler import as_cache_dir, compile

    # every kernel (each M bucket's too) goes into --cache-dir, and `auto` reads the tuning DB there
    cache_dir = as_cache_dir(args.cache_dir, flag="--cache-dir") if args.cache_dir else None
    spec = spec_from_args(args)
    # flags edit the --schedule pick, as in `gemmc compile`; auto's from that cache's tuning DB
    schedule, _ = schedule_from_args(args, spec, cache_dir=cache_dir)
    k = compile(spec, schedule=schedule, arch=args.arch, cache_dir=cache_dir)
    if k.schedule is None:          # auto on a problem no kernel takes (compiler.CublasOnlyGemm)
        if args.ptx:                # asked for a file that will not exist: a script must not read on
            raise GemmcError(f"--ptx {args.ptx}: there is no kernel, so no PTX: {k.decision.detail}. Drop --ptx "
                             "(the cache needs nothing for this problem), or change the problem as that says")
        print(f"nothing to build: {k.decision.detail}", file=status, flush=True)
        return 0
    art = k.artifact
    print(f"{art.key}  {k.schedule.short()} ({_arch_text(k)})  {art.directory}", file=status, flush=True)
    if k.m_buckets is not None:     # symbolic M under auto: every bucket's kernel, so any M runs from the cache
        from .cli import _bucket_runs
        for rng, d in _bucket_runs(k.m_buckets.table()):
            if d.use_cublas:
                print(f"  M {rng}: torch.matmul ({d.source}: cuBLAS faster), nothing to build", file=status, flush=True)
                continue
            a = k.m_buckets.kernel_for(d.schedule).artifact
            print(f"  M {rng}: {a.key}  {d.schedule.short()}  {a.directory}", file=status, flush=True)
    if args.ptx == "-":
        sys.stdout.write(k.ptx)
    elif args.ptx:
        ptx = k.ptx         # an entry served without its kernel.ptx raises here, saying how to restore it
        try:
            make_parent(ptx_dest, f"--ptx {args.ptx}")
            with open(ptx_dest, "w") as f:
                f.write(ptx)
        except OSError as e:      # checked before the build, but the disk can still fill up
            raise GemmcError(f"--ptx {args.ptx}: cannot write it: {e.strerror or e}; the kernel itself is in "
                             f"{art.directory}") from None
    print(f"cache: {k.kernel.cache.root}", file=status)
    return 0
