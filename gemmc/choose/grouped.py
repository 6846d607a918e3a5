"""`schedule="auto"` for grouped GEMMs: keyed by (E, N, K, rows per group), never another problem's entries.

A grouped GEMM's speed follows the rows each group holds (tokens per expert), not the total M: a decode step
spreads a few rows over many experts and streams their weights; a prefill gives each expert hundreds of rows
and is compute bound. So it is keyed by (E, N, K) and the rows-per-group bucket (the power of two at or above
the mean rows per group), and a plain problem's tables or DB rows never decide for it (their M is not its M).
Nothing goes to cuBLAS (torch._grouped_mm is not a route of `auto`).

The heuristic (a first cut, from the kernel's structure; the H200 sweep of `gemmc-search tune --suite moe`
replaces it): few rows per group (decode, <= 64) take ping-pong 64 x 128 tiles, so that the most CTAs stream
the touched experts' weights; up to 192 rows, cooperative 128 x 128 tiles with A multicast to two N tiles of
the group; more, cooperative 128 x 256 tiles (128 x 128 gated: two accumulators) with B multicast to two M
tiles of the group.
"""
from __future__ import annotations

import math
from typing import Optional

from ..schedule import Schedule, check_schedule
from ..spec import GemmSpec
from .decision import Decision

DECODE_ROWS = 64
MID_ROWS = 192


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
    """The power of two at or above `rows` (at least 1): the DB's and the heuristic's key."""
    return 1 << (max(1, rows) - 1).bit_length()


def candidates(spec: GemmSpec, rows: Optional[int], arch: str) -> list[Schedule]:
    """The heuristic's schedules for `rows` per group, best first (the module docstring's rule)."""
    decode = Schedule(tile=(64, 128, 64), mode="pingpong", arch=arch)
    mid = [Schedule(tile=(128, 128, 64), cluster=(1, 2), arch=arch), Schedule(tile=(128, 128, 64), arch=arch)]
    large = [Schedule(tile=(128, 128 if spec.gate else 256, 64), cluster=(2, 1), arch=arch)]
    if rows is None or rows > MID_ROWS:
        order = large + mid + [decode]
    elif rows > DECODE_ROWS:
        order = mid + large + [decode]
    else:
        order = [decode] + mid + large
    return order


def heuristic_schedule(spec: GemmSpec, arch: str, m: Optional[int] = None) -> tuple[Schedule, str]:
    """(the first valid candidate, why) for `spec` at runtime `m`."""
    rows = rows_per_group(spec, m)
    tried = []
    for s in candidates(spec, rows, arch):
        problems = check_schedule(s, spec)
        if not problems:
            where = "rows per group unknown" if rows is None else f"~{rows} rows per group"
            return s, f"grouped heuristic ({where}): {s.short()}" + (f"; passed over {', '.join(tried)}"
                                                                      if tried else "")
        tried.append(f"{s.short()} ({problems[0].limit})")
    return candidates(spec, rows, arch)[0], "grouped heuristic: no candidate is valid (" + "; ".join(tried) + ")"


def grouped_decision(spec: GemmSpec, arch: str, m: Optional[int] = None) -> Decision:
    """`auto`'s Decision for a grouped GEMM at runtime `m` (see the module docstring)."""
    schedule, why = heuristic_schedule(spec, arch, m)
    return Decision(schedule, "heuristic", detail=why)
