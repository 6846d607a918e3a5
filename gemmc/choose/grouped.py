"""`schedule="auto"` for grouped GEMMs: keyed by (E, N, K, rows per group), never another problem's entries.

A grouped GEMM's speed follows the rows each group holds (tokens per expert), not the total M: a decode step
spreads a few rows over many experts and streams their weights; a prefill gives each expert hundreds of rows
and is compute bound. So it is keyed by (E, N, K) and the rows-per-group bucket (gemmc.choose.group_keys), and a
plain problem's tables or DB rows never decide for it (their M is not its M). The order:
1. the tuning DB's best for this key (`gemmc-search tune --suite moe` records it), among the schedules this
   gemmc can run (db_steps.db_exact), on the GPU the calls run on; a known group count is needed;
2. the heuristic below.
Nothing goes to cuBLAS (torch._grouped_mm is not a route of `auto`).

The heuristic (a first cut, from the kernel's structure; the H200 sweep of `gemmc-search tune --suite moe`
replaces it): few rows per group (decode, <= 64) take ping-pong 64 x 128 tiles, so that the most CTAs stream
the touched experts' weights; up to 192 rows, cooperative 128 x 128 tiles with A multicast to two N tiles of
the group; more, cooperative 128 x 256 tiles (128 x 128 gated: two accumulators) with B multicast to two M
tiles of the group. Block-scaled fp8 takes the same tiles with K 128 (one k-tile per scale block), and 128 x 128
for the large ones (its promotion holds two accumulators, as a gated GEMM's).
"""
from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import Optional

from ..schedule import Schedule, check_schedule
from ..spec import SCALE_BLOCK, GemmSpec
from .db_steps import db_exact, open_db, skip_db
from .decision import Decision
from .gpu import target_gpu
from .group_keys import rows_bucket, rows_per_group

DECODE_ROWS = 64
MID_ROWS = 192


def candidates(spec: GemmSpec, rows: Optional[int], arch: str) -> list[Schedule]:
    """The heuristic's schedules for `rows` per group, best first (the module docstring's rule)."""
    # block-scaled fp8: one k-tile per scale block, and two accumulators (as gated) in tiles of at most 128 columns
    block = spec.scaling is not None and spec.scaling.mode == "block"
    bk = SCALE_BLOCK if block else 64
    decode = Schedule(tile=(64, 128, bk), mode="pingpong", arch=arch)
    mid = [Schedule(tile=(128, 128, bk), cluster=(1, 2), arch=arch), Schedule(tile=(128, 128, bk), arch=arch)]
    large = [Schedule(tile=(128, 128 if spec.gate or block else 256, bk), cluster=(2, 1), arch=arch)]
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


def grouped_decision(spec: GemmSpec, arch: str, m: Optional[int] = None, db=None,
                     gpu_name: Optional[str] = None) -> Decision:
    """`auto`'s Decision for a grouped GEMM at runtime `m` (see the module docstring); `db` and `gpu_name` as
    resolve_auto's."""
    m = m if m is not None else (spec.m if isinstance(spec.m, int) else None)
    known = m is not None and all(isinstance(d, int) for d in (spec.n, spec.k, spec.groups))
    passed: list = []
    if known:
        conc = replace(spec, m=int(m))
        tdb, owned = open_db(db)
        try:
            if tdb is not None:
                best, passed = db_exact(tdb, conc, arch, target_gpu(gpu_name))
                if best is not None:
                    return Decision(best.schedule, "db", detail=f"tuning DB: the best of {best.n_rows} schedules "
                                    f"at {rows_bucket(rows_per_group(conc))} rows per group on {best.gpu_name}")
        except sqlite3.DatabaseError as e:
            skip_db(tdb.path, f"reading {tdb.path} failed ({e})")
        finally:
            if owned and tdb is not None:
                tdb.close()
    schedule, why = heuristic_schedule(spec, arch, m)
    if passed:
        why += "; passed over the DB's " + ", ".join(passed)
    return Decision(schedule, "heuristic", detail=why)
