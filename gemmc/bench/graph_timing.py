"""CUDA-graph timing of calls that take their own inputs: the bench's measuring rules (CUDA graphs, the sides
interleaved repeat by repeat, the median) for scripts and measurements whose calls are not an (A, B) GEMM.

    time_sides({"gemmc": [call, ...], "torch": [...]})    {side: median seconds per call}

A side is a list of zero-argument calls, one per input set (rotated through, so that L2 does not hold what the
next call reads); each side is captured once in a CUDA graph of enough calls for a replay of ~2 ms.
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
