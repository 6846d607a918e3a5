"""Mixture-of-experts problems: the models' expert shapes, seeded routing, and the grouped GEMMs they make.

A model's experts each hold an up-projection (a fused [gate; up] weight of 2 x width rows over the hidden size,
run as one gated grouped GEMM: silu(x @ gate.T) * (x @ up.T); in fp8, the [gate; up] product, gated after it)
and a down-projection (hidden rows over the width). `route` sends each of T tokens to `top_k` distinct experts;
the grouped GEMMs then see T x top_k rows, sorted by expert, with per-expert counts from it: uniform, Zipf
(expert popularity 1 / rank^s, ranks a seeded permutation) or Dirichlet (popularity drawn from
Dirichlet(alpha)). Routing is numpy on the host: the same on every machine for a seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..spec import GemmSpec


@dataclass(frozen=True)
class MoeModel:
    name: str
    hidden: int         # the model's hidden size: the up-projection's K, the down-projection's N
    width: int          # one expert's intermediate size: the up-projection's N (gate and up each), down's K
    experts: int
    top_k: int


MODELS = (
    MoeModel("deepseek-v3", 7168, 2048, 256, 8),
    MoeModel("qwen3-30b-a3b", 2048, 768, 128, 8),
    MoeModel("qwen3-235b-a22b", 4096, 1536, 128, 8),
    MoeModel("mixtral-8x7b", 4096, 14336, 8, 2),
)
TOKENS = (1, 64, 512, 4096, 16384)
ROUTINGS = ("uniform", "zipf", "dirichlet")
PROJECTIONS = ("up", "down")
ZIPF_S = 1.2
DIRICHLET_ALPHA = 0.3


def model(name: str) -> MoeModel:
    for m in MODELS:
        if m.name == name:
            return m
    raise SpecError(f"unknown MoE model {name!r}; use one of {', '.join(m.name for m in MODELS)}")


def spec_of(m: MoeModel, projection: str, layout: str = "contiguous", groups=None, dtype="bf16",
            scaling: str | None = None) -> GemmSpec:
    """The grouped GEMM of one projection of `m`'s experts (M symbolic: the routed rows), in `dtype`; with a
    `scaling` ("block"), in fp8: e4m3 operands with their scales, where the up-projection is the [gate; up]
    product of 2 x width columns, gated after it (gemmc builds no gated fp8 kernel; DeepSeek-V3's stack also
    runs SwiGLU as a kernel of its own)."""
    e = m.experts if groups is None else groups
    name = f"{m.name.replace('-', '_')}_{projection}"
    kw = dict(m="M", groups=e, group_layout=layout, name=name, dtype=dtype)
    if scaling is not None:
        kw.update(dtype="f8e4m3", scaling=scaling, name=f"{name}_fp8")
    if projection == "up":
        if scaling is not None:
            return GemmSpec(n=2 * m.width, k=m.hidden, **kw)
        return GemmSpec(n=m.width, k=m.hidden, gate="silu", **kw)
    if projection == "down":
        return GemmSpec(n=m.hidden, k=m.width, **kw)
    raise SpecError(f"projection {projection!r}; use one of {PROJECTIONS}")


def route(tokens: int, experts: int, top_k: int, routing: str = "uniform", seed: int = 0) -> np.ndarray:
    """Per-expert row counts (int64, summing to tokens x top_k) of `tokens` tokens each sent to `top_k` distinct
    experts (Gumbel top-k of the log popularities: sampling without replacement in proportion to them)."""
    if routing not in ROUTINGS:
        raise SpecError(f"routing {routing!r}; use one of {ROUTINGS}")
    if not 1 <= top_k <= experts:
        raise SpecError(f"top_k={top_k} with {experts} experts: use 1 .. {experts}")
    rng = np.random.default_rng(seed)
    if routing == "uniform":
        logp = np.zeros(experts)
    elif routing == "zipf":
        logp = -ZIPF_S * np.log(1.0 + rng.permutation(experts))
    else:
        logp = np.log(rng.dirichlet(np.full(experts, DIRICHLET_ALPHA)) + 1e-30)
    keys = logp[None, :] + rng.gumbel(size=(tokens, experts))
    chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
    return np.bincount(chosen.ravel(), minlength=experts).astype(np.int64)


def offsets_of(counts) -> np.ndarray:
    """The contiguous layout's E + 1 row offsets (int32) of per-group counts."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def tokens_per_expert_bucket(rows: int, experts: int) -> int:
    """The power of two at or above the mean rows per expert (1 at most one row each): the bucket `auto` and
    the tuning DB key grouped GEMMs by, with (E, N, K) (gemmc.choose.group_keys)."""
    from ..choose.group_keys import rows_bucket
    return rows_bucket(-(-rows // max(1, experts)))
