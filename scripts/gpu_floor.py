"""How far is a kernel from its own floors? Times each shape's SM90 kernel beside two diagnostic variants
of it, and torch.matmul (cuBLAS), interleaved in one process. A variant is the same generated module built
over an edited copy of the kernel modules (scripts/kernel_edit.py):

  stream : the WGMMA loop removed; TMA ring, barriers, scheduler and epilogue store kept. Its time is
           the kernel's streaming floor (launch + loads + store), what no change to the math can beat.
  mma    : no loads; the producer issues no TMA and the consumers neither wait for nor release stages,
           so the WGMMAs run back to back on whatever the smem ring holds (launch + MMA + store). With
           no memory traffic the SMs draw less power and may clock higher, so this floor is optimistic.

    python3 scripts/gpu_floor.py plan.json              # GPU: JSON under $OUT (or ./floor_out), table last
    python3 scripts/gpu_floor.py plan.json --compile-only   # CPU: emit, edit and compile every variant

plan.json: {"MxNxK": ["<schedule string>", ...]}; the first schedule of each shape is measured. The
variants compute garbage and are timed only; the unedited kernel is checked first against an fp32
reference of the upcast inputs, its output NaN-filled. Timing: bf16 randn inputs, CUDA graphs, input
sets rotated through >= 2x L2, median over repeats (gemmc.bench.timing).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemmc  # noqa: E402
from gemmc.bench.policy import parse_schedule  # noqa: E402
from kernel_edit import edited_kernel, expect, kernel_sources  # noqa: E402

VARIANTS = ("stream", "mma")
# the k-block loop and its body (every line indented deeper than its header): one WGMMA chain, or two when gated
_MMA_LOOP = re.compile(r"\n( *)for kb in cutlass\.range_constexpr\(num_k_blocks\):\n(?:\1 +[^\n]*\n)+")
_PRODUCER_LOOP = "for kt in range(work.k_count):"
_STAGE_WAIT = "ab_pipeline.consumer_wait(read_state)"
_STAGE_RELEASE = "ab_pipeline.consumer_release(release_state)"


def edit_modules(variant: str, sources: Optional[dict] = None) -> dict:
    """The SM90 kernel modules' source (`sources`, default gemmc's) with the variant's part removed (module
    docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: use one of {VARIANTS}")
    out = dict(sources or kernel_sources())
    if variant == "stream":
        out["consumer"], n = _MMA_LOOP.subn("\n", out["consumer"])
        expect(n, 1, "the WGMMA loop", "gpu_floor.py")
        return out
    producer, consumer = out["producer"], out["consumer"]
    expect(producer.count(_PRODUCER_LOOP), 1, "the producer's k-loop", "gpu_floor.py")
    expect(consumer.count(_STAGE_WAIT), 1, "the consumer's stage wait", "gpu_floor.py")
    expect(consumer.count(_STAGE_RELEASE), 2, "the consumer's stage releases", "gpu_floor.py")
    out["producer"] = producer.replace(_PRODUCER_LOOP, "for kt in range(0):")
    out["consumer"] = consumer.replace(_STAGE_WAIT, "pass").replace(_STAGE_RELEASE, "pass")
    return out


def kernels(name: str) -> dict:
    spec = gemmc.GemmSpec(m="M", n="N", k="K")
    k = gemmc.compile(spec, schedule=parse_schedule(name))
    if k.arch != "sm_90a":
        raise SystemExit(f"{name}: the floors are for SM90 kernels")
    out = {"kernel": k}
    for v in VARIANTS:
        out[v] = edited_kernel(k, edit_modules(v), "gpu_floor.py")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    plan = json.loads(Path(args.plan).read_text())
    names = sorted({v[0] for v in plan.values()})
    t0 = time.time()
    built = {}
    for i, n in enumerate(names, 1):
        built[n] = kernels(n)
        for kk in built[n].values():
            kk.build()
        print(f"[{i}/{len(names)}] built {n} and its variants ({time.time() - t0:.0f} s)", flush=True)
    if args.compile_only:
        return

    import torch
    from gemmc.bench.suites import Shape
    from gemmc.bench.timing import CudaClock, spin_up, time_side_by_side
    out_dir = Path(os.environ.get("OUT", "floor_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = CudaClock(graphs=True)
    spin_up(1.0)
    rows = []
    for shape, (name, *_) in plan.items():
        m, n, k = map(int, shape.split("x"))
        try:    # the variants compute garbage: only the unedited kernel is checked
            res = time_side_by_side(Shape(m, n, k), built[name], clock, checked=["kernel"], repeats=args.repeats)
        except ValueError as e:
            print(f"{e} -- not timed", flush=True)
            continue
        row = {"shape": shape, "schedule": name, "rel_err": res["rel_err"]["kernel"], **res["us"]}
        rows.append(row)
        print(f"{shape:18s} {name:40s} " + " ".join(f"{u} {row[u]:9.2f}" for u in res["us"]), flush=True)
        del res
        torch.cuda.empty_cache()
        (out_dir / "floor.json").write_text(json.dumps(rows, indent=1))

    def gm(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))
    print(f"\n{'shape':18s} {'us: cublas':>10s} {'kernel':>9s} {'stream':>9s} {'mma':>9s}   cuBLAS / kernel, stream, mma")
    for r in rows:
        print(f"{r['shape']:18s} {r['cublas']:10.2f} {r['kernel']:9.2f} {r['stream']:9.2f} {r['mma']:9.2f}   "
              f"{r['cublas'] / r['kernel']:.3f} {r['cublas'] / r['stream']:.3f} {r['cublas'] / r['mma']:.3f}")
    if rows:
        print(f"{'geomean':18s} {'':40s}   " + " ".join(
            f"{gm([r['cublas'] / r[u] for r in rows]):.3f}" for u in ("kernel", "stream", "mma")))


if __name__ == "__main__":
    main()
