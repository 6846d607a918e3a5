"""Timing grouped GEMMs on a GPU, beside torch._grouped_mm, with gemmc.bench.graph_timing's rules.

    measure_grouped(spec, kernel, rows)                         the tuner's measurement of one grouped kernel

The check comes first: the kernel's output, NaN-filled, against each group's fp32 reference (gemmc.reference).
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


def measure_grouped(spec, kernel, rows: int, sets: int = 2, seed: int = 0) -> dict:
    """One kernel of a contiguous or masked grouped `spec` (int groups) at `rows` rows in every group: its check
    against the reference, then its median time and torch._grouped_mm's (contiguous only) in one interleaved
    run. {"ok", "of_bound", "gemmc_us", "grouped_mm_us" (or None)}."""
    import torch

    from ..reference import error_figures, grouped_reference_and_bound, make_grouped_inputs
    from ..types import torch_dtype
    e = spec.groups
    gen = torch.Generator(device="cuda").manual_seed(seed)
    data = [make_grouped_inputs(spec, [rows] * e, spec.n, spec.k, generator=gen) for _ in range(sets)]
    outs = [torch.full(a.shape[:-1] + (spec.n,), math.nan, device="cuda", dtype=torch_dtype(spec.out_dtype))
            for a, *_ in data]
    a, b, groups, extra = data[0]
    kernel(a, b, groups, *extra, out=outs[0])
    torch.cuda.synchronize()
    _, of_bound = error_figures(outs[0], *grouped_reference_and_bound(spec, a, b, groups, extra))
    if not of_bound <= 1.0:
        return {"ok": False, "of_bound": of_bound, "gemmc_us": None, "grouped_mm_us": None}
    sides = {"gemmc": [lambda d=d, o=o: kernel(d[0], d[1], d[2], *d[3], out=o) for d, o in zip(data, outs)]}
    if spec.group_layout == "contiguous" and not spec.epilogue:
        sides["grouped_mm"] = [grouped_mm_call(d[0], d[1], d[2], spec) for d in data]
    t = time_sides(sides)
    return {"ok": True, "of_bound": of_bound, "gemmc_us": t["gemmc"] * 1e6,
            "grouped_mm_us": t["grouped_mm"] * 1e6 if "grouped_mm" in t else None}
