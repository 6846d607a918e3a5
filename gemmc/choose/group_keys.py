"""How grouped GEMMs are keyed for `auto` and the tuning DB: by the rows a group holds, bucketed.

A grouped GEMM's speed follows the rows each group holds (tokens per expert), not its total M, so its key is
(E, N, K) and the power of two at or above the mean rows per group (`rows_bucket`): every M of a bucket shares
one tuning DB entry and one decision.
"""
from __future__ import annotations

import math
from typing import Optional

from ..spec import GemmSpec


def rows_per_group(spec: GemmSpec, m: Optional[int] = None) -> Optional[int]:
    """The mean rows a group holds at `m` rows (the runtime M; a static M by default): M itself for masked
    groups (M is the rows each group may hold), M / E for contiguous ones. None while unknown."""
    m = m if m is not None else (spec.m if isinstance(spec.m, int) else None)
    if m is None:
        return None
    if spec.group_layout == "masked":
        return m
    return math.ceil(m / spec.groups) if isinstance(spec.groups, int) else m


def rows_bucket(rows: int) -> int:
    """The power of two at or above `rows` (at least 1)."""
    return 1 << (max(1, rows) - 1).bit_length()
