"""Grouped GEMMs (mixture-of-experts) on a GPU: correctness first, then speed beside torch._grouped_mm, a loop of
torch.matmul per expert and (where importable) quack's varlen_m GEMM, then the masked decode's HBM bandwidth.

    python3 scripts/gpu_grouped.py                   # all three parts; JSON under $OUT (else ./grouped_out)
    python3 scripts/gpu_grouped.py --compile-only    # CPU: compile every checked variant, check its PTX
    python3 scripts/gpu_grouped.py --no-timing       # correctness only (e.g. under compute-sanitizer)
    python3 scripts/gpu_grouped.py --only contiguous_coop_c2x1 --no-timing --no-decode
    python3 scripts/gpu_grouped.py --no-check --models qwen3-30b-a3b --tokens 64,4096 --routings zipf
    python3 scripts/gpu_grouped.py --dtypes fp8 --models deepseek-v3 --no-decode   # fp8 (block scales) only

Correctness: every variant (layout x mode x cluster x gate x epilogue) against each expert's fp32 reference
(gemmc.reference.grouped_reference_and_bound), the output NaN-filled first: rows of no expert must stay NaN,
every other element within the elementwise bound. Speed: the models of gemmc.bench.moe (up: the fused [gate; up]
SwiGLU projection, one gated kernel; down), routed with seeded uniform / Zipf / Dirichlet imbalance; each side
in a CUDA graph over input sets rotated past 2x L2 (different routings, the weights shared), interleaved repeat
by repeat, the median kept; gemmc runs `auto`'s kernel for the rows, and its output is checked in the timed
run. torch._grouped_mm computes the [gate; up] product and torch gates it (the same output as the fused kernel;
its matmul alone is recorded too). Decode: the masked layout at 1..64 tokens, the bytes of the touched experts'
weights (and the rows in and out) over the time, against a device-to-device copy's bandwidth measured here.
`--budget-s` stops starting new timing cases past that many seconds, so one call stays under 10 minutes.

fp8 (`--dtypes fp8`, with DeepSeek-V3's block scales: e4m3 activations per 1 x 128 block, each expert's e4m3
weight per 128 x 128 block): the variants fp8_* against each expert's fp32 reference of the dequantized operands;
timing of each model's projections in fp8 (the up-projection is the [gate; up] product, 2 x width columns: gemmc
builds no gated fp8 kernel, and every side leaves the gating out) beside two torch baselines, as there is no
torch grouped fp8 GEMM: `grouped_mm_bf16`, torch._grouped_mm on the operands dequantized to bf16 ahead of time
(the bf16 GEMM alone), and `grouped_mm_dequant`, the same with both operands dequantized in every call (what a
stack without a blockwise grouped kernel runs on fp8 weights); the masked decode's bandwidth over fp8 weights.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemmc.bench.graph_timing import time_sides  # noqa: E402
from gemmc.bench.moe import MODELS, ROUTINGS, TOKENS, model, offsets_of, route, spec_of  # noqa: E402
from gemmc.bench.watchdog import Watchdog  # noqa: E402
from gemmc.schedule import Schedule  # noqa: E402
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref  # noqa: E402

L2_BYTES = 60 * 2**20
S = Schedule
FP8 = dict(dtype="f8e4m3", scaling="block")
SCALE = dict(inputs=(EpilogueInput("alpha", "scalar"),),
             epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))), EpilogueOp("silu", (Ref.node(0),))))
# name -> (spec kwargs, schedule); N = 448, K = 520: edge tiles along N, a partial last k-tile
VARIANTS = {
    "contiguous_coop": (dict(group_layout="contiguous"), S((128, 128, 64))),
    "contiguous_coop_c2x1": (dict(group_layout="contiguous"), S((128, 256, 64), (2, 1))),
    "contiguous_coop_256_c1x2": (dict(group_layout="contiguous"), S((256, 128, 64), (1, 2))),
    "contiguous_coop_c2x2_n": (dict(group_layout="contiguous"), S((128, 64, 64), (2, 2), raster="n")),
    "contiguous_pp": (dict(group_layout="contiguous"), S((64, 128, 64), mode="pingpong")),
    "contiguous_pp_c2x1_n": (dict(group_layout="contiguous"), S((128, 128, 64), (2, 1), mode="pingpong", raster="n")),
    "contiguous_swiglu_c2x1": (dict(group_layout="contiguous", gate="silu"), S((128, 128, 64), (2, 1))),
    "contiguous_swiglu_pp": (dict(group_layout="contiguous", gate="silu"), S((64, 128, 64), mode="pingpong")),
    "contiguous_epi_f32": (dict(group_layout="contiguous", out_dtype="f32", **SCALE), S((128, 128, 64))),
    "masked_coop": (dict(group_layout="masked"), S((128, 128, 64))),
    "masked_coop_c1x2": (dict(group_layout="masked"), S((128, 128, 64), (1, 2))),
    "masked_pp": (dict(group_layout="masked"), S((64, 128, 64), mode="pingpong")),
    "masked_pp_nopdl": (dict(group_layout="masked"), S((64, 96, 128), mode="pingpong", pdl=False, stages=3)),
    "masked_swiglu_c2x1": (dict(group_layout="masked", gate="silu"), S((128, 128, 64), (2, 1))),
    # fp8, DeepSeek-V3's block scales: K tiles of 128 (one scale block), tiles of at most 128 columns
    "fp8_contiguous_coop": (dict(group_layout="contiguous", **FP8), S((128, 128, 128))),
    "fp8_contiguous_coop_c2x1": (dict(group_layout="contiguous", **FP8), S((128, 128, 128), (2, 1))),
    "fp8_contiguous_coop_c1x2_n": (dict(group_layout="contiguous", **FP8), S((128, 64, 128), (1, 2), raster="n")),
    "fp8_contiguous_pp": (dict(group_layout="contiguous", **FP8), S((64, 128, 128), mode="pingpong")),
    "fp8_contiguous_e5m2_256": (dict(group_layout="contiguous", b_dtype="f8e5m2", **FP8), S((256, 64, 128))),
    "fp8_masked_coop": (dict(group_layout="masked", **FP8), S((128, 128, 128))),
    "fp8_masked_pp_c2x1": (dict(group_layout="masked", **FP8), S((64, 128, 128), (2, 1), mode="pingpong")),
    "fp8_contiguous_epi_f32": (dict(group_layout="contiguous", out_dtype="f32", **FP8, **SCALE), S((128, 128, 128))),
}
N, K = 448, 520
K_FP8 = 528         # fp8 rows are 16-byte aligned at 16 elements: a partial last k-tile of 16
# rows per group: empty groups, single rows, groups past one tile; then one token over 256 experts (decode)
CHECK_ROWS = [[0, 1, 130, 0, 0, 7, 300, 64, 0, 1, 257], [3],
              [1 if g in (3, 17, 40, 41, 128, 200, 254, 255) else 0 for g in range(256)]]
DECODE_TOKENS = (1, 4, 16, 64)


def variant_spec(name: str) -> tuple[GemmSpec, Schedule]:
    kw, sched = VARIANTS[name]
    return GemmSpec(m="M", n=N, k=K_FP8 if "scaling" in kw else K, groups="E", name=name, **kw), sched


def variant_dtype(name: str) -> str:
    return "fp8" if "scaling" in VARIANTS[name][0] else "bf16"


def check_ptx(name: str, ptx: str, sched: Schedule, spec: GemmSpec | None = None) -> list[str]:
    import re
    errs = [f"{name}: PTX lacks {w}" for w in ("wgmma.mma_async", "cp.async.bulk.tensor", "shfl.sync.up",
                                               "vote.sync.ballot", "st.global") if w not in ptx]
    if (".multicast::cluster" in ptx) != (sched.cluster[0] * sched.cluster[1] > 1):
        errs.append(f"{name}: multicast in the PTX does not follow the cluster {sched.cluster}")
    if spec is not None and spec.scaling is not None:     # the fp8 WGMMA, each k-tile waited for and promoted
        b = "e5m2" if str(spec.b_dtype) == "f8e5m2" else "e4m3"
        if not re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.{b}", ptx):
            errs.append(f"{name}: PTX lacks the fp8 WGMMA (k32, e4m3 x {b})")
        if not re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx):
            errs.append(f"{name}: PTX never waits for a k-tile's WGMMAs (the promotion reads them)")
    return errs


# ---- correctness ----------------------------------------------------------------------------------

def check(name, fn, spec, log, watchdog):
    import torch
    from gemmc.reference import error_figures, grouped_call_args, grouped_reference_and_bound, make_grouped_inputs
    from gemmc.types import torch_dtype
    results = []
    for rows in CHECK_ROWS:
        gen = torch.Generator(device="cuda").manual_seed(len(rows))
        extra_m = 9 if spec.group_layout == "contiguous" else 3       # rows of no group, or past every count
        a, b, groups, extra = make_grouped_inputs(spec, rows, N, spec.k, m=(sum(rows) if spec.group_layout ==
                                                  "contiguous" else max(rows)) + extra_m, generator=gen)
        out = torch.full(a.shape[:-1] + (N,), math.nan, device="cuda", dtype=torch_dtype(spec.out_dtype))
        watchdog.arm(f"{name} {len(rows)} groups", 60)
        fn(*grouped_call_args(spec, a, b, groups, extra), out=out)
        torch.cuda.synchronize()
        rel, elem = error_figures(out, *grouped_reference_and_bound(spec, a, b, groups, extra))
        ok = elem <= 1.0
        results.append({"variant": name, "groups": len(rows), "rows": sum(rows), "rel_err": rel,
                        "of_bound": elem, "ok": ok})
        log(f"  {name:28s} {len(rows):3d} groups {sum(rows):4d} rows: rel {rel:.2e}, {elem:.3f} of the bound "
            f"{'OK' if ok else 'FAIL (NaN: a row of no group was written)' if math.isnan(elem) else 'FAIL'}")
    return results


# ---- timing ---------------------------------------------------------------------------------------

def quack_gemm():
    try:
        from quack.gemm_interface import gemm
        return gemm, None
    except Exception as e:      # not installed on the GPU host (no package index there): recorded, not fatal
        return None, f"{type(e).__name__}: {e}"


def budgeted_cases(args, t_start, watchdog, skipped, what):
    """The (tokens, routing) cases of one projection, in order, while the time budget lasts, each armed in the
    watchdog; those past the budget are listed in `skipped` instead."""
    for tokens in args.tokens:
        for routing in args.routings:
            if time.time() - t_start > args.budget_s:
                skipped.append(f"{what} {tokens} {routing}")
                continue
            watchdog.arm(f"timing {what} {tokens} {routing}", 240)
            yield tokens, routing


def speed(args, log, watchdog, t_start):
    import torch
    import torch.nn.functional as F
    import gemmc
    from gemmc.reference import error_figures, grouped_reference_and_bound
    quack, quack_why = quack_gemm()
    rows_out, skipped = [], []
    for mdl in [model(m) for m in args.models] if "bf16" in args.dtypes else []:
        for proj in ("up", "down"):
            spec = spec_of(mdl, proj)
            n_rows = 2 * mdl.width if proj == "up" else mdl.hidden      # B's rows per expert
            k = mdl.hidden if proj == "up" else mdl.width
            w = (torch.randn(mdl.experts, n_rows, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k))
            kernel = gemmc.compile(spec, schedule="auto")
            for tokens, routing in budgeted_cases(args, t_start, watchdog, skipped, f"{mdl.name} {proj}"):
                rows_out.append(speed_case(mdl, proj, spec, w, kernel, tokens, routing, quack, F, log,
                                           error_figures, grouped_reference_and_bound))
            del w, kernel
            torch.cuda.empty_cache()
    return rows_out, skipped, quack_why


def speed_case(mdl, proj, spec, w, kernel, tokens, routing, quack, F, log, error_figures, reference):
    import torch
    e, n_rows, k = w.shape
    n = spec.n
    counts0 = route(tokens, e, mdl.top_k, routing, seed=0)
    touched = int((counts0 > 0).sum()) * n_rows * k * 2
    total = tokens * mdl.top_k
    sets = 1 if touched >= 2 * L2_BYTES else min(8, math.ceil(2 * L2_BYTES / max(touched, 1)))
    data = []
    for i in range(sets):
        counts = route(tokens, e, mdl.top_k, routing, seed=i)
        offs = torch.tensor(offsets_of(counts), device="cuda")
        x = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
        data.append(dict(counts=counts, offs=offs, x=x, out=torch.empty(total, n, device="cuda", dtype=x.dtype),
                         wide=torch.empty(total, n_rows, device="cuda", dtype=x.dtype)))
    run = kernel.runner_for(total)

    def gate(y):
        g, u = y.chunk(2, dim=-1)
        return F.silu(g) * u

    def loop(d):
        bounds = offsets_of(d["counts"]).tolist()
        def call():
            for g in range(e):
                if bounds[g + 1] > bounds[g]:
                    torch.mm(d["x"][bounds[g]:bounds[g + 1]], w[g].T, out=d["wide"][bounds[g]:bounds[g + 1]])
            if proj == "up":
                d["out"].copy_(gate(d["wide"]))
        return call

    sides = {"gemmc": [lambda d=d: run(d["x"], w, d["offs"], out=d["out"]) for d in data],
             "grouped_mm": [lambda d=d: (gate if proj == "up" else (lambda y: y))(
                 torch._grouped_mm(d["x"], w.mT, offs=d["offs"][1:])) for d in data],
             "loop": [loop(d) for d in data]}
    if proj == "up":
        sides["grouped_mm_matmul_only"] = [lambda d=d: torch._grouped_mm(d["x"], w.mT, offs=d["offs"][1:])
                                           for d in data]
    if quack is not None:
        sides["quack"] = [lambda d=d: (gate if proj == "up" else (lambda y: y))(
            quack(d["x"], w.mT, cu_seqlens_m=d["offs"], tuned=False)) for d in data]
    data[0]["out"].fill_(math.nan)
    t = time_sides(sides)
    torch.cuda.synchronize()
    ref, bound = reference(spec, data[0]["x"], w, data[0]["offs"], [])
    _, of_bound = error_figures(data[0]["out"], ref, bound)
    del ref, bound
    flops = 2.0 * total * n_rows * k
    row = {"model": mdl.name, "proj": proj, "tokens": tokens, "routing": routing, "rows": total, "input_sets": sets,
           "max_rows_per_expert": int(counts0.max()), "experts_touched": int((counts0 > 0).sum()),
           "schedule": kernel.for_m(total)[0].schedule.short(), "of_bound": of_bound, "ok": of_bound <= 1.0,
           **{f"{s}_us": v * 1e6 for s, v in t.items()},
           "gemmc_tflops": flops / t["gemmc"] / 1e12, "ratio_vs_grouped_mm": t["grouped_mm"] / t["gemmc"],
           "ratio_vs_loop": t["loop"] / t["gemmc"]}
    if "quack" in t:
        row["ratio_vs_quack"] = t["quack"] / t["gemmc"]
    log(f"  {mdl.name:16s} {proj:4s} {tokens:5d} {routing:9s}: gemmc {t['gemmc'] * 1e6:9.1f} us "
        f"({row['gemmc_tflops']:5.0f} TF/s) grouped_mm {t['grouped_mm'] * 1e6:9.1f} loop {t['loop'] * 1e6:9.1f} "
        f"x{row['ratio_vs_grouped_mm']:.3f} {row['schedule']} {'OK' if row['ok'] else 'FAIL'}")
    return row


def quantized_experts(experts: int, rows: int, k: int):
    """Each expert's [rows, k] weight (randn / sqrt(k)), quantized to e4m3 per 128 x 128 block: (w8, sw)."""
    import torch
    from gemmc.quantize import quantize
    w8 = torch.empty(experts, rows, k, device="cuda", dtype=torch.float8_e4m3fn)
    sw = torch.empty(experts, -(-rows // 128), -(-k // 128), device="cuda")
    for g in range(experts):
        w8[g], sw[g] = quantize(torch.randn(rows, k, device="cuda") / math.sqrt(k), "block", weight=True)
    return w8, sw


def speed_fp8(args, log, watchdog, t_start):
    """Each model's projections in fp8 (block scales) beside torch._grouped_mm on bf16-dequantized operands,
    ahead of time and in the call (module doc)."""
    import torch
    import gemmc
    from gemmc.quantize import dequantize_blocks
    rows_out, skipped = [], []
    for mdl in [model(m) for m in args.models]:
        for proj in ("up", "down"):
            spec = spec_of(mdl, proj, scaling="block")
            w8, sw = quantized_experts(mdl.experts, spec.n, spec.k)
            w16 = dequantize_blocks(w8, sw, torch.bfloat16)       # the bf16 baseline's weights, ahead of time
            kernel = gemmc.compile(spec, schedule="auto")
            for tokens, routing in budgeted_cases(args, t_start, watchdog, skipped, f"fp8 {mdl.name} {proj}"):
                rows_out.append(speed_case_fp8(mdl, proj, spec, (w8, sw, w16), kernel, tokens, routing, log))
            del w8, sw, w16, kernel
            torch.cuda.empty_cache()
    return rows_out, skipped


def speed_case_fp8(mdl, proj, spec, weights, kernel, tokens, routing, log):
    import torch
    from gemmc.bench.grouped_timing import dequantizing_grouped_mm_call, grouped_mm_call
    from gemmc.quantize import dequantize_blocks, quantize
    from gemmc.reference import error_figures, grouped_reference_and_bound
    w8, sw, w16 = weights
    e, n, k = w8.shape
    counts0 = route(tokens, e, mdl.top_k, routing, seed=0)
    touched = int((counts0 > 0).sum()) * n * k
    total = tokens * mdl.top_k
    sets = 1 if touched >= 2 * L2_BYTES else min(8, math.ceil(2 * L2_BYTES / max(touched, 1)))
    data = []
    for i in range(sets):
        offs = torch.tensor(offsets_of(route(tokens, e, mdl.top_k, routing, seed=i)), device="cuda")
        x8, sx = quantize(torch.randn(total, k, device="cuda"), "block")
        data.append(dict(offs=offs, x8=x8, sx=sx, x16=dequantize_blocks(x8, sx, torch.bfloat16),
                         out=torch.empty(total, n, device="cuda", dtype=torch.bfloat16)))
    run = kernel.runner_for(total)
    sides = {"gemmc": [lambda d=d: run(d["x8"], w8, d["sx"], sw, d["offs"], out=d["out"]) for d in data],
             "grouped_mm_bf16": [grouped_mm_call(d["x16"], w16, d["offs"], spec) for d in data],
             "grouped_mm_dequant": [dequantizing_grouped_mm_call(d["x8"], w8, d["sx"], sw, d["offs"], spec)
                                    for d in data]}
    data[0]["out"].fill_(math.nan)
    t = time_sides(sides)
    torch.cuda.synchronize()
    ref, bound = grouped_reference_and_bound(spec, data[0]["x8"], w8, data[0]["offs"], [data[0]["sx"], sw])
    _, of_bound = error_figures(data[0]["out"], ref, bound)
    del ref, bound
    flops = 2.0 * total * n * k
    row = {"dtype": "fp8", "model": mdl.name, "proj": proj, "tokens": tokens, "routing": routing, "rows": total,
           "input_sets": sets, "max_rows_per_expert": int(counts0.max()), "experts_touched": int((counts0 > 0).sum()),
           "schedule": kernel.for_m(total)[0].schedule.short(), "of_bound": of_bound, "ok": of_bound <= 1.0,
           **{f"{side}_us": v * 1e6 for side, v in t.items()}, "gemmc_tflops": flops / t["gemmc"] / 1e12,
           "ratio_vs_grouped_mm_bf16": t["grouped_mm_bf16"] / t["gemmc"],
           "ratio_vs_grouped_mm_dequant": t["grouped_mm_dequant"] / t["gemmc"]}
    log(f"  fp8 {mdl.name:16s} {proj:4s} {tokens:5d} {routing:9s}: gemmc {t['gemmc'] * 1e6:9.1f} us "
        f"({row['gemmc_tflops']:5.0f} TF/s) bf16 grouped_mm {t['grouped_mm_bf16'] * 1e6:9.1f} with dequant "
        f"{t['grouped_mm_dequant'] * 1e6:9.1f} x{row['ratio_vs_grouped_mm_bf16']:.3f} {row['schedule']} "
        f"{'OK' if row['ok'] else 'FAIL'}")
    return row


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 2 GiB (read + write), the HBM figure decode is held to."""
    import torch
    src = torch.empty(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = time_sides({"copy": [lambda: dst.copy_(src)]})["copy"]
    return 2 * src.numel() * 2 / t


def decode(args, log, watchdog):
    """The masked layout at decode sizes: the touched experts' weight bytes (and rows in/out) over the time."""
    import torch
    import gemmc
    peak = copy_bandwidth()
    log(f"  device-to-device copy: {peak / 1e12:.2f} TB/s")
    rows = []
    for dtype in args.dtypes:
        fp8 = dtype == "fp8"
        for mdl in [model(m) for m in args.models]:
            for proj in ("up", "down"):
                spec = spec_of(mdl, proj, layout="masked", scaling="block" if fp8 else None)
                n_rows = spec.b_rows
                k = spec.k
                scales = ()
                if fp8:         # e4m3 weights with their 128 x 128 block scales; activations per 1 x 128 block
                    w, sw = quantized_experts(mdl.experts, n_rows, k)
                else:
                    w = torch.randn(mdl.experts, n_rows, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
                kernel = gemmc.compile(spec, schedule="auto")
                for tokens in DECODE_TOKENS:
                    watchdog.arm(f"decode {dtype} {mdl.name} {proj} {tokens}", 120)
                    counts = route(tokens, mdl.experts, mdl.top_k, "uniform", seed=0)
                    cap = max(8, -(-int(counts.max()) // 8) * 8)
                    x = torch.randn(mdl.experts, cap, k, device="cuda", dtype=torch.bfloat16)
                    if fp8:
                        from gemmc.quantize import quantize
                        x, sx = quantize(x.reshape(-1, k), "block")
                        x, scales = x.reshape(mdl.experts, cap, k), (sx.reshape(mdl.experts, cap, -1), sw)
                    c = torch.tensor(counts, dtype=torch.int32, device="cuda")
                    out = torch.empty(mdl.experts, cap, spec.n, device="cuda", dtype=torch.bfloat16)
                    run = kernel.runner_for(cap)
                    call = functools.partial(run, x, w, *scales, c, out=out)
                    t = time_sides({"gemmc": [call]})["gemmc"]
                    touched = int((counts > 0).sum())
                    # the touched experts' weights, and the rows in (fp8: 1 byte an element) and out (bf16)
                    moved = touched * n_rows * k * w.element_size() + int(counts.sum()) * (k * x.element_size()
                                                                                          + spec.n * 2)
                    row = {"dtype": dtype, "model": mdl.name, "proj": proj, "tokens": tokens,
                           "experts_touched": touched, "us": t * 1e6, "bytes": moved, "tb_per_s": moved / t / 1e12,
                           "of_copy_bw": moved / t / peak, "schedule": kernel.for_m(cap)[0].schedule.short()}
                    rows.append(row)
                    log(f"  {dtype} {mdl.name:16s} {proj:4s} {tokens:3d} tokens: {row['us']:8.1f} us "
                        f"{row['tb_per_s']:.2f} TB/s = {row['of_copy_bw']:.2f} of the copy's {row['schedule']}")
                del w, kernel
                torch.cuda.empty_cache()
    return rows, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated VARIANTS to check")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--models", default=",".join(m.name for m in MODELS))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--routings", default="uniform,zipf")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--dtypes", default="bf16,fp8", help="bf16 and/or fp8 (block scales): the variants checked, "
                    "the problems timed and the decode")
    args = ap.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    if not set(args.dtypes) <= {"bf16", "fp8"}:
        ap.error(f"--dtypes {','.join(args.dtypes)}: use bf16, fp8 or both")
    args.models = [m for m in args.models.split(",") if m]
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    args.routings = [r for r in args.routings.split(",") if r]
    if not all(r in ROUTINGS for r in args.routings):
        ap.error(f"--routings {','.join(args.routings)}: use some of {', '.join(ROUTINGS)}")
    t_start = time.time()
    out_dir = Path(os.environ.get("OUT", "grouped_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    from gemmc import build
    from gemmc.backends import emit
    from gemmc.compiler import lower
    names = [n for n in args.only.split(",") if n] or [n for n in VARIANTS if variant_dtype(n) in args.dtypes]
    report = {"errors": [], "check": [], "speed": [], "speed_fp8": [], "decode": [], "skipped": []}
    fns = {}
    for name in names:
        spec, sched = variant_spec(name)
        try:
            emitted = emit(lower(spec, sched, "sm_90a")[1])
            t0 = time.time()
            if args.compile_only:
                _, ptx = build.compile_with_ptx(emitted)
                errs = check_ptx(name, ptx, sched, spec)
                report["errors"] += errs
                log(f"compiled {name} in {time.time() - t0:.1f}s: {'; '.join(errs) or 'PTX ok'}")
            else:
                fns[name] = (spec, build.jit_callable(emitted))
                log(f"compiled {name} in {time.time() - t0:.1f}s")
        except Exception as e:     # keep going: report every variant
            report["errors"].append(f"{name}: {type(e).__name__}: {str(e)[:2000]}")
            log(f"ERROR {name}: {type(e).__name__}: {str(e)[:500]}")
    if not args.compile_only:
        import torch
        report["device"] = torch.cuda.get_device_name()
        watchdog = Watchdog(log)
        if not args.no_check:
            for name, (spec, fn) in fns.items():
                try:
                    report["check"] += check(name, fn, spec, log, watchdog)
                except Exception as e:
                    report["errors"].append(f"{name} (run): {type(e).__name__}: {str(e)[:2000]}")
                    log(f"ERROR {name} (run): {type(e).__name__}: {str(e)[:500]}")
        if not args.no_timing:
            report["speed"], report["skipped"], report["quack"] = speed(args, log, watchdog, t_start)
            ratios = [r["ratio_vs_grouped_mm"] for r in report["speed"]]
            if ratios:
                report["geomean_vs_grouped_mm"] = math.exp(sum(map(math.log, ratios)) / len(ratios))
                report["min_vs_grouped_mm"] = min(ratios)
            if "fp8" in args.dtypes:
                report["speed_fp8"], skipped = speed_fp8(args, log, watchdog, t_start)
                report["skipped"] += skipped
                for side in ("bf16", "dequant"):
                    ratios = [r[f"ratio_vs_grouped_mm_{side}"] for r in report["speed_fp8"]]
                    if ratios:
                        report[f"fp8_geomean_vs_grouped_mm_{side}"] = math.exp(sum(map(math.log, ratios))
                                                                               / len(ratios))
        if not args.no_decode:
            report["decode"], report["copy_bytes_per_s"] = decode(args, log, watchdog)
    (out_dir / "grouped_results.json").write_text(json.dumps(report, indent=1))
    (out_dir / "grouped_log.txt").write_text("\n".join(lines) + "\n")
    print("\n== summary ==")
    timed = report["speed"] + report["speed_fp8"]
    fails = [c for c in report["check"] if not c["ok"]] + [r for r in timed if not r["ok"]]
    print(f"checks: {len(report['check'])} ({sum(not c['ok'] for c in report['check'])} failed); timed: "
          f"{len(timed)} ({sum(not r['ok'] for r in timed)} failed their check); errors: "
          f"{len(report['errors'])}; skipped for time: {len(report['skipped'])}")
    for e in report["errors"]:
        print("  ERR", e[:300])
    if report["speed"]:
        print(f"{'model':16s} {'proj':4s} {'tok':>5s} {'routing':9s} {'gemmc us':>9s} {'gmm us':>9s} {'loop us':>9s} "
              f"{'x gmm':>6s} {'x loop':>6s}")
        for r in report["speed"]:
            print(f"{r['model']:16s} {r['proj']:4s} {r['tokens']:5d} {r['routing']:9s} {r['gemmc_us']:9.1f} "
                  f"{r['grouped_mm_us']:9.1f} {r['loop_us']:9.1f} {r['ratio_vs_grouped_mm']:6.3f} "
                  f"{r['ratio_vs_loop']:6.2f}")
        print(f"geomean vs torch._grouped_mm: {report['geomean_vs_grouped_mm']:.3f}, lowest "
              f"{report['min_vs_grouped_mm']:.3f}; quack: {report.get('quack') or 'timed'}")
    if report["speed_fp8"]:
        print(f"fp8 {'model':16s} {'proj':4s} {'tok':>5s} {'routing':9s} {'gemmc us':>9s} {'bf16 us':>9s} "
              f"{'deq us':>9s} {'x bf16':>6s} {'x deq':>6s}")
        for r in report["speed_fp8"]:
            print(f"fp8 {r['model']:16s} {r['proj']:4s} {r['tokens']:5d} {r['routing']:9s} {r['gemmc_us']:9.1f} "
                  f"{r['grouped_mm_bf16_us']:9.1f} {r['grouped_mm_dequant_us']:9.1f} "
                  f"{r['ratio_vs_grouped_mm_bf16']:6.3f} {r['ratio_vs_grouped_mm_dequant']:6.2f}")
        print(f"fp8 geomean vs torch._grouped_mm of bf16 operands dequantized ahead: "
              f"{report.get('fp8_geomean_vs_grouped_mm_bf16', math.nan):.3f}; with the dequantization in the call: "
              f"{report.get('fp8_geomean_vs_grouped_mm_dequant', math.nan):.3f}")
    for r in report["decode"]:
        print(f"decode {r['dtype']} {r['model']:16s} {r['proj']:4s} {r['tokens']:3d} tokens: {r['of_copy_bw']:.2f} "
              f"of the copy's bandwidth ({r['tb_per_s']:.2f} TB/s)")
    return 1 if (fails or report["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
