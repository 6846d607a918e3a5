"""A fused epilogue (scale, residual add, f32 output) and how to see and steer gemmc's decisions.

    python examples/residual_epilogue.py [--m 512]

It compiles one @gemmc.kernel three ways: with schedule="auto" (printing k.decision and the choice
per runtime M: which step chose and why), with an explicit gemmc.Schedule (printing its final IR,
where the tile, cluster, stages and copies are visible), and with a schedule over the shared-memory
budget, which gemmc refuses with a ScheduleError before anything is built or launched. On a CPU-only
machine that is all (set CUTE_DSL_ARCH=sm_90a there); with a GPU it also runs the `auto` and the
explicit kernel and checks both against an fp32 torch reference.
"""
import argparse
import sys

import gemmc

N, K = 4096, 4096


@gemmc.kernel
def scaled_residual(x: gemmc.Tensor[("M", K), gemmc.bf16],
                    w: gemmc.Tensor[(N, K), gemmc.bf16],
                    residual: gemmc.Tensor[("M", N), gemmc.bf16],
                    scale: gemmc.Scalar):
    return (x @ w.T * scale + residual).to(gemmc.f32)


def describe(decision) -> str:
    return f"{decision.schedule.short()}  [source: {decision.source}] {decision.detail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--m", type=int, default=512, help="M to run with on a GPU (M is symbolic in the kernel)")
    args = ap.parse_args()

    # 1. see: what "auto" decided, and why; with a symbolic M it decides per runtime M bucket
    auto = gemmc.compile(scaled_residual, schedule="auto", arch=args.arch)
    print(f"# auto: {describe(auto.decision)}")
    for m in (16, 128, args.m, 8192):
        decision, _ = auto.for_m(m)
        print(f"#   M={m:<5} runs {describe(decision)}")

    # 2. steer: the same kernel with a schedule of your own; the final IR shows what it became
    mine = gemmc.Schedule(tile=(128, 128, 64), cluster=(1, 2), mode="cooperative", stages=4, raster="n",
                          arch=args.arch)
    explicit = gemmc.compile(scaled_residual, schedule=mine, arch=args.arch)
    print(f"\n# explicit: {explicit.schedule.short()}, "
          f"{explicit.plan.pipeline.smem_bytes} B shared memory, {explicit.plan.threads} threads")
    print(f"// ----- IR after {explicit.passes[-1]} -----")
    print(explicit.ir(after=explicit.passes[-1]))

    # 3. an invalid schedule is refused by the validity predicate, before any pass, build or launch
    too_deep = gemmc.Schedule(tile=(128, 256, 64), cluster=(1, 2), mode="cooperative", stages=6, arch=args.arch)
    print(f"# check_schedule({too_deep.short()}) -> {len(gemmc.check_schedule(too_deep, scaled_residual.spec))} "
          "violation(s)")
    try:
        gemmc.compile(scaled_residual, schedule=too_deep, arch=args.arch)
        print("# unexpected: the over-budget schedule compiled", file=sys.stderr)
        return 1
    except gemmc.ScheduleError as e:
        print(f"# refused {too_deep.short()}: {e}")

    import torch
    if not torch.cuda.is_available():
        print("\n# no GPU here: compiled and inspected only. On a GPU host this also runs and checks both kernels.")
        return 0
    torch.manual_seed(0)
    x = torch.randn(args.m, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    residual = torch.randn(args.m, N, device="cuda", dtype=torch.bfloat16)
    scale = 0.5
    ref = x.float() @ w.float().T * scale + residual.float()
    failed = False
    for name, k in (("auto", auto), ("explicit", explicit)):
        out = torch.full((args.m, N), float("nan"), device="cuda", dtype=torch.float32)
        k(x, w, residual, scale, out=out)     # the first call builds (or loads from the cache) the kernel
        torch.cuda.synchronize()
        err = ((out - ref).norm() / ref.norm()).item()
        failed |= not err < 1e-2      # a NaN left in `out` fails too
        print(f"# {name}: ran on {torch.cuda.get_device_name()}, M={args.m}, relative error vs fp32 torch = {err:.2e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
