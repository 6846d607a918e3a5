"""Timing grouped GEMMs on a GPU, beside torch._grouped_mm: the measuring rules of the bench (CUDA graphs,
sides interleaved repeat by repeat, the median) for calls that take their own inputs.

    time_sides({"gemmc": [call, ...], "grouped_mm": [...]})    {side: median seconds per call}
    measure_grouped(spec, kernel, rows)                         the tuner's measurement of one grouped kernel

A side is a list of zero-argument calls, one per input set (rotated through, so that L2 does not hold what the
next call reads); each side is captured once in a CUDA graph of enough calls for a replay of ~2 ms. The check
comes first: the kernel's output, NaN-filled, against each group's fp32 reference (gemmc.reference).
"""
from __future__ import annotations

import math
import statistics

REPLAY_S = 2e-3       # a replay is made of this many seconds of calls, at least (at most MAX_INNER rounds)
MAX_INNER = 50


def _graph_of(calls, inner: int):
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):      # warm up (and allocate) outside the graph
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            for c in calls:
                c()
    g.replay()
    torch.cuda.synchronize()
    return g


def _replay_s(g) -> float:
    import torch
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3


def time_sides(sides: dict, reps: int = 7) -> dict:
    """{side: median seconds per call}: each side's calls in a CUDA graph, the sides' replays interleaved."""
    graphs, calls_per_replay = {}, {}
    for name, calls in sides.items():
        once = max(_replay_s(_graph_of(calls, 1)), 1e-6)
        inner = max(1, min(MAX_INNER, math.ceil(REPLAY_S / once)))
        graphs[name], calls_per_replay[name] = _graph_of(calls, inner), inner * len(calls)
    times = {name: [] for name in sides}
    for _ in range(reps):
        for name, g in graphs.items():
            times[name].append(_replay_s(g) / calls_per_replay[name])
    return {name: statistics.median(t) for name, t in times.items()}


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
