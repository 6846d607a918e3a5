"""Hash the emitted kernel source of every schedule the standard spaces admit, over a fixed set of specs.

A change meant to leave the kernels alone (a refactor, a move) runs this before and after: equal digests
mean no kernel changed, so no GPU re-run is needed for it.

    python scripts/source_hashes.py            # prints one digest per spec and the overall digest
    python scripts/source_hashes.py --each     # also one line per schedule
"""
import argparse
import hashlib
import sys

import gemmc
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref


def specs() -> dict:
    bias_gelu = GemmSpec(m="M", n=4096, k=4096, inputs=(EpilogueInput("bias", "row", gemmc.bf16),),
                         epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                                   EpilogueOp("gelu_tanh", (Ref.node(0),))), name="linear_gelu")
    residual = GemmSpec(m="M", n=2048, k=1024, inputs=(EpilogueInput("res", "full", gemmc.bf16),
                                                      EpilogueInput("scale", "scalar")),
                        epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("scale"))),
                                  EpilogueOp("add", (Ref.node(0), Ref.input("res")))),
                        out_dtype=gemmc.f32, name="scaled_residual")
    return {
        "plain_sm90": (GemmSpec(m="M", n=4096, k=4096), "sm_90a"),
        "bias_gelu_sm90": (bias_gelu, "sm_90a"),
        "residual_sm90": (residual, "sm_90a"),
        "batched_kn_sm90": (GemmSpec(m=512, n=512, k=256, b_layout="kn", batch="L"), "sm_90a"),
        "plain_sm80": (GemmSpec(m="M", n=4096, k=4096), "sm_80"),
        "bias_gelu_sm80": (bias_gelu, "sm_80"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--each", action="store_true", help="print one line per schedule")
    args = ap.parse_args()
    overall = hashlib.sha256()
    total = 0
    for name, (spec, arch) in specs().items():
        h = hashlib.sha256()
        schedules = gemmc.enumerate_schedules(spec, arch)
        for s in schedules:
            src = gemmc.compile(spec, schedule=s, arch=arch).source
            digest = hashlib.sha256(src.encode()).hexdigest()
            h.update(f"{s.short()} {digest}\n".encode())
            if args.each:
                print(f"{name} {s.short()} {digest[:16]}")
        total += len(schedules)
        overall.update(h.digest())
        print(f"{name}: {len(schedules)} schedules, {h.hexdigest()[:16]}", file=sys.stderr if args.each else sys.stdout)
    print(f"all: {total} schedules, {overall.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
