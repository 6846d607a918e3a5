"""Timing grouped GEMMs on a GPU, beside torch._grouped_mm, with gemmc.bench.graph_timing's rules.

    measure_grouped(spec, kernel, rows)                         the tuner's measurement of one grouped kernel

The check comes first: the kernel's output, NaN-filled, against each group's fp32 reference (gemmc.reference).
fp8 (block scaling) has no torch grouped kernel: its baselines are torch._grouped_mm on the operands dequantized
to bf16 ahead of time (`dequantized_operands`: the bf16 GEMM alone, what the tuner stores), and the same with
the dequantization in every call (`dequantizing_grouped_mm_call`: what a stack without a blockwise grouped
kernel runs on fp8 weights).
"""
from __future__ import annotations

import math

from .graph_timing import time_sides


def grouped_mm_call(x, w, groups, spec):
    """torch._grouped_mm computing what `spec`'s kernel computes (contiguous groups): the product, then torch's
    gating for a gated spec."""
    import torch

    from ..reference import _unary
    offs = groups[1:]

    def call():
        y = torch._grouped_mm(x, w.mT, offs=offs)
        if spec.gate is not None:
            g, u = y.chunk(2, dim=-1)
            y = _unary(spec.gate)(g) * u
        return y
    return call


def dequantized_operands(spec, a, b, extra):
    """torch._grouped_mm's operands for `spec`'s inputs (make_grouped_inputs'): a and b themselves, or fp8 ones
    dequantized to bf16 (each group's rows and weight times their block scales)."""
    if spec.scaling is None:
        return a, b
    import torch

    from ..quantize import dequantize_blocks
    return dequantize_blocks(a, extra[0], torch.bfloat16), dequantize_blocks(b, extra[1], torch.bfloat16)


def dequantizing_grouped_mm_call(x, w, sx, sw, groups, spec):
    """An fp8 grouped GEMM as torch runs it without a blockwise grouped kernel: both operands dequantized to bf16
    in the call (gemmc.quantize.dequantize_blocks), then torch._grouped_mm (module doc)."""
    import torch

    from ..quantize import dequantize_blocks

    def call():
        return grouped_mm_call(dequantize_blocks(x, sx, torch.bfloat16), dequantize_blocks(w, sw, torch.bfloat16),
                               groups, spec)()
    return call


def measure_grouped(spec, kernel, rows: int, sets: int = 2, seed: int = 0) -> dict:
    """One kernel of a contiguous or masked grouped `spec` (int groups) at `rows` rows in every group: its check
    against the reference, then its median time and torch._grouped_mm's (contiguous only; fp8: on the operands
    dequantized to bf16 ahead of time) in one interleaved run. {"ok", "of_bound", "gemmc_us", "grouped_mm_us"
    (or None)}."""
    import torch

    from ..reference import error_figures, grouped_call_args, grouped_reference_and_bound, make_grouped_inputs
    from ..types import torch_dtype
    e = spec.groups
    gen = torch.Generator(device="cuda").manual_seed(seed)
    data = [make_grouped_inputs(spec, [rows] * e, spec.n, spec.k, generator=gen) for _ in range(sets)]
    outs = [torch.full(a.shape[:-1] + (spec.n,), math.nan, device="cuda", dtype=torch_dtype(spec.out_dtype))
            for a, *_ in data]
    calls = [grouped_call_args(spec, *d) for d in data]
    kernel(*calls[0], out=outs[0])
    torch.cuda.synchronize()
    _, of_bound = error_figures(outs[0], *grouped_reference_and_bound(spec, *data[0]))
    if not of_bound <= 1.0:
        return {"ok": False, "of_bound": of_bound, "gemmc_us": None, "grouped_mm_us": None}
    sides = {"gemmc": [lambda c=c, o=o: kernel(*c, out=o) for c, o in zip(calls, outs)]}
    if spec.group_layout == "contiguous" and not spec.epilogue:
        sides["grouped_mm"] = [grouped_mm_call(*dequantized_operands(spec, d[0], d[1], d[3]), d[2], spec)
                               for d in data]
    t = time_sides(sides)
    return {"ok": True, "of_bound": of_bound, "gemmc_us": t["gemmc"] * 1e6,
            "grouped_mm_us": t["grouped_mm"] * 1e6 if "grouped_mm" in t else None}
