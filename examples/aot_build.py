"""Ahead-of-time deployment: build every kernel a symbolic-M GEMM can launch into a cache folder, on a
machine with no GPU, then serve calls from that folder on a GPU host without compiling anything.

    CUTE_DSL_ARCH=sm_90a python examples/aot_build.py [--cache-dir DIR] [--n 4096 --k 4096]

With schedule="auto" and a symbolic M, gemmc decides per runtime M bucket (M rounded up to a power of
two); k.build() builds the kernel of every bucket that runs one into gemmc.compile(..., cache_dir=DIR)
(buckets where cuBLAS was measured faster run torch.matmul and need nothing; k.artifacts maps each
bucket to its cache entry). With no GPU visible, `auto` picks for the arch's shipped table
(the H200's for sm_90a; set GEMMC_GPU to pick for another GPU). It prints the per-M table and the
cache entries. With a GPU it then runs a few M values from that cache and checks them against torch.
This is what `gemmc build --m M --n N --k K --cache-dir DIR` does from the command line.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path


def kernel_files(root: Path) -> list:
    return sorted(root.rglob("kernel.so"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", default=None, help="the cache folder to fill (default: a new temp directory)")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--run-m", default="1,16,100,1000,4096", help="M values to run and check on a GPU")
    args = ap.parse_args()

    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="gemmc-aot-")).expanduser().resolve()
    import gemmc
    from gemmc.choose.m_buckets import M_BUCKETS, range_label

    spec = gemmc.GemmSpec(m="M", n=args.n, k=args.k, dtype="bf16", name="aot_gemm")
    # every kernel of this compile goes into `cache` (GEMMC_CACHE_DIR is left alone), and `auto` reads the
    # tuning DB there (cache/tuning.sqlite) unless GEMMC_TUNING_DB is set
    k = gemmc.compile(spec, schedule="auto", arch=args.arch, cache_dir=cache)
    t0 = time.perf_counter()
    k.build()           # the default kernel and every M bucket's
    entries = k.artifacts           # {M range: its cache entry, or None for torch.matmul}: built above
    print(f"# built {spec.name} (M x {args.n} x {args.k}, bf16, {args.arch}) in {time.perf_counter() - t0:.1f} s")

    # what a call with M rows runs: one row per run of buckets with the same route
    print("# auto per runtime M:")
    rows = []
    for (lo, hi), (label, decision, what) in zip(M_BUCKETS, k.m_buckets.describe()):
        art = entries[label]
        route = ("torch.matmul (cuBLAS faster here: nothing to build)" if art is None
                 else f"{what}  key {art.key[:12]}") + f"  [{decision.source}]"
        if rows and rows[-1][2] == route:
            rows[-1][1] = hi
        else:
            rows.append([lo, hi, route])
    for lo, hi, route in rows:
        print(f"#   M {range_label(lo, hi):<12} {route}")

    files = kernel_files(cache)
    print(f"\n# {len(files)} kernel(s) in {cache}:")
    for so in files:
        print(f"#   {so.relative_to(cache)}  ({so.stat().st_size // 1024} KiB)")
    print(f"\n# to deploy: copy {cache} to the GPU host (e.g. rsync -a {cache}/ gpu-host:/opt/gemmc-cache/),\n"
          "#   export GEMMC_CACHE_DIR=/opt/gemmc-cache there (or pass cache_dir='/opt/gemmc-cache'), and\n"
          "#   gemmc.compile() the same spec with schedule='auto': each call loads its bucket's kernel.so from\n"
          "#   the cache, compiling nothing.")

    import torch
    if not torch.cuda.is_available():
        print("\n# no GPU here: built only. On a GPU host this also runs the M values above from the cache.")
        return 0
    torch.manual_seed(0)
    b = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16) / args.k ** 0.5
    failed = False
    for m in (int(v) for v in args.run_m.split(",")):
        a = torch.randn(m, args.k, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, args.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        k(a, b, out=out)
        torch.cuda.synchronize()
        ref = a.float() @ b.float().T
        err = ((out.float() - ref).norm() / ref.norm()).item()
        failed |= not err < 1e-2        # a NaN left in `out` fails too
        decision, kernel = k.for_m(m)
        ran = "torch.matmul" if kernel is None else decision.schedule.short()
        print(f"# M={m:<5} ran {ran}: relative error vs fp32 torch = {err:.2e}")
    new = len(kernel_files(cache)) - len(files)
    print(f"# ran on {torch.cuda.get_device_name()}; kernels compiled while running: {new}")
    return 1 if failed or new else 0


if __name__ == "__main__":
    sys.exit(main())
