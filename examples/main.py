"""The main example: a Linear + bias + GELU layer as one fused GEMM.

On a CPU-only machine it compiles the kernel for Hopper (sm_90a) and prints the IR after every pass,
then the start of the emitted CuTe DSL source. With a GPU it also runs the kernel and checks it
against torch.
"""
import argparse
import os
import sys
import time

import gemmc

N, K = 4096, 4096


@gemmc.kernel
def linear_gelu(x: gemmc.Tensor[("M", K), gemmc.bf16],
                w: gemmc.Tensor[(N, K), gemmc.bf16],
                bias: gemmc.Tensor[(N,), gemmc.bf16]):
    return gemmc.gelu(x @ w.T + bias, approximate="tanh")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--m", type=int, default=4096, help="M to run with on a GPU (M is symbolic in the kernel)")
    ap.add_argument("--quiet-ir", action="store_true", help="print only the final IR")
    args = ap.parse_args()

    k = gemmc.compile(linear_gelu, schedule="heuristic", arch=args.arch)
    print(f"# spec: {k.spec}\n# schedule: {k.schedule}\n")
    stages = [None, *k.passes] if not args.quiet_ir else [k.passes[-1]]
    for after in stages:
        print(f"// ----- IR {'(input)' if after is None else 'after ' + after} -----")
        print(k.ir(after=after))
        print()

    t0 = time.perf_counter()
    try:
        k.build()  # compiles on the CPU (CuTe DSL, TVM-FFI export), cached on disk
    except gemmc.BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    print(f"// built in {time.perf_counter() - t0:.1f} s (cache: {os.environ.get('GEMMC_CACHE_DIR', '~/.cache/gemmc')})")
    src = k.source.splitlines()
    print("// ----- emitted CuTe DSL source (first 40 of %d lines; k.source has it all) -----" % len(src))
    print("\n".join(src[:40]))
    ptx = k.ptx
    for needle in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg", "mbarrier"):
        print(f"// PTX has {needle}: {needle in ptx}")

    import torch
    if not torch.cuda.is_available():
        print("\n// no GPU here: compiled and inspected only. On a GPU host this also runs and checks the kernel.")
        return 0
    torch.manual_seed(0)
    x = torch.randn(args.m, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = torch.full((args.m, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    k(x, w, bias, out=out)
    ref = torch.nn.functional.gelu(x.float() @ w.float().T + bias.float(), approximate="tanh")
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"\n// ran on {torch.cuda.get_device_name()}: M={args.m}, relative error vs fp32 torch = {err:.2e}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
