"""Schedules measured on a known GPU and shipped with gemmc: what `schedule="auto"` uses before any
tuning of one's own (gemmc/choose/auto.py consults them after the user's tuning DB).

A table (gemmc/choose/pretuned_data/<gpu>.json) holds, per shape, the fastest schedule of a recorded sweep
(bench/data) and the cuBLAS time measured beside it; where a tuning-DB export of the same GPU has the
shape, its paired verdict (confirmed re-measurements, schedules the sweep never had, such as swap_ab)
wins. Its `checks` are measurements of the heuristic's own pick on shapes outside the table (`gemmc bench
--policy heuristic`): what an unmeasured shape will run, so they give the cuBLAS verdict there when any lies
near. It is built by `scripts/build_pretuned.py` and applies to the problem class it was measured on:
bf16 in and out, f32 accumulation, A [M, K] and B [N, K] (`a @ b.T`), unbatched. A GEMM with a fused epilogue of that class takes the schedule too (the
main loop is the same), but never the cuBLAS fallback: cuBLAS would need extra passes for the epilogue.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..schedule import Schedule
from ..spec import GemmSpec
from ..types import as_arch
from .gpu import target_gpu
from .neighbours import m_neighbours

FORMAT = "gemmc-pretuned/1"
DATA_DIR = Path(__file__).resolve().parent / "pretuned_data"
VERDICT_NEIGHBOURS = 5     # an unmeasured shape goes to cuBLAS if cuBLAS won at any of its 5 nearest measured ones...
VERDICT_MAX_LOG2 = 3.0     # ...within 8x (log2 distance over M, N, K)


@dataclass(frozen=True)
class PretunedEntry:
    m: int
    n: int
    k: int
    schedule: Schedule
    time_us: float
    cublas_us: float

    @property
    def cublas_faster(self) -> bool:
        return self.cublas_us < self.time_us


def _votes(pool: dict, spec: GemmSpec, k: int, max_log2: float) -> list:
    """cublas_faster of the `k` shapes of `pool` nearest to `spec` (log2 distance over M, N, K), those
    within `max_log2`; ties broken by the shape, so the answer is deterministic."""
    here = (math.log2(spec.m), math.log2(spec.n), math.log2(spec.k))
    near = sorted(((math.dist(here, (math.log2(e.m), math.log2(e.n), math.log2(e.k))), key), e)
                  for key, e in pool.items())
    return [e.cublas_faster for (d, _), e in near[:k] if d <= max_log2]


@dataclass(frozen=True)
class PretunedTable:
    gpu: str
    arch: str
    source: str
    entries: dict            # (m, n, k) -> PretunedEntry: the best schedule measured for the shape
    checks: dict = field(default_factory=dict)   # (m, n, k) -> PretunedEntry: the heuristic's pick, measured

    def covers(self, spec: GemmSpec) -> bool:
        """Is `spec` of the problem class the table was measured on (ungated GEMMs)?"""
        return (str(spec.dtype) == "bf16" and str(spec.out_dtype) == "bf16" and str(spec.acc_dtype) == "f32"
                and spec.a_layout == "mk" and spec.b_layout == "nk" and spec.batch is None and spec.gate is None
                and all(isinstance(d, int) for d in (spec.m, spec.n, spec.k)))

    def lookup(self, spec: GemmSpec, usable: Callable[[PretunedEntry], bool] = lambda e: True
               ) -> Optional[tuple[PretunedEntry, bool]]:
        """(entry, exact) for `spec`: the same shape's entry, else its nearest neighbour's (gemmc.choose.neighbours:
        same N and K, M within 2x), the first one `usable` accepts (dispatch: its schedule is valid for `spec`);
        None when the class is not covered or no entry is usable."""
        if not self.covers(spec):
            return None
        shape = (spec.m, spec.n, spec.k)
        exact = self.entries.get(shape)
        if exact is not None and usable(exact):
            return exact, True
        for e in m_neighbours(self.entries.values(), shape, lambda e: (e.m, e.n, e.k)):
            if usable(e):
                return e, False
        return None

    def predicted_cublas_faster(self, spec: GemmSpec, k: int = VERDICT_NEIGHBOURS,
                                max_log2: float = VERDICT_MAX_LOG2) -> Optional[bool]:
        """For a shape the table did not measure, which the heuristic will answer: did cuBLAS win at any of
        the `k` nearest measured shapes (log2 distance over M, N, K at most `max_log2`)? The checks vote
        where any lies that near (they measured the heuristic's picks, which this shape will run), else the
        entries (their tuned schedules). None when nothing is that near. tests/test_pretuned.py measures what
        it gains over the heuristic alone, left-one-out on the shipped table's checks."""
        return self.cublas_verdict(spec, k, max_log2)[0]

    def cublas_verdict(self, spec: GemmSpec, k: int = VERDICT_NEIGHBOURS,
                       max_log2: float = VERDICT_MAX_LOG2) -> tuple[Optional[bool], Optional[str]]:
        """`predicted_cublas_faster` with the measurements it read: "checks" or "entries" (None, None
        when the class is not covered or nothing is near)."""
        if not self.covers(spec):
            return None, None
        for name, pool in (("checks", self.checks), ("entries", self.entries)):
            votes = _votes(pool, spec, k, max_log2)
            if votes:
                return any(votes), name
        return None, None

    def to_json(self) -> dict:
        def rows(d):
            return [{"m": e.m, "n": e.n, "k": e.k, "schedule": e.schedule.to_dict(), "time_us": e.time_us,
                     "cublas_us": e.cublas_us} for _, e in sorted(d.items())]
        out = {"format": FORMAT, "gpu": self.gpu, "arch": self.arch, "source": self.source,
               "entries": rows(self.entries)}
        if self.checks:
            out["checks"] = rows(self.checks)
        return out


def table_from_json(obj: dict) -> PretunedTable:
    if obj.get("format") != FORMAT:
        raise ValueError(f"pretuned table format {obj.get('format')!r}, expected {FORMAT!r}")
    def rows(items):
        return {(e["m"], e["n"], e["k"]): PretunedEntry(e["m"], e["n"], e["k"], Schedule.from_dict(e["schedule"]),
                                                        float(e["time_us"]), float(e["cublas_us"]))
                for e in items}
    return PretunedTable(obj["gpu"], as_arch(obj["arch"]), obj.get("source", ""), rows(obj["entries"]),
                         rows(obj.get("checks", ())))


def build_table(records: Iterable[dict], gpu: str, arch: str, source: str) -> PretunedTable:
    """Best schedule per shape from sweep records (gemmc.bench.dataset format). Only the careful
    re-measurements (`refined`, timed interleaved with cuBLAS) compete, by their ratio to the cuBLAS
    time beside them: records of two sweeps of one shape then compare fairly; a short-pass time does not."""
    best: dict = {}
    for r in records:
        if r.get("error") or not r.get("refined") or r.get("time_us") is None or r.get("cublas_us") is None:
            continue
        key = (r["m"], r["n"], r["k"])
        if key not in best or r["cublas_us"] / r["time_us"] > best[key].cublas_us / best[key].time_us:
            best[key] = PretunedEntry(*key, Schedule.from_dict(r["schedule"]), float(r["time_us"]),
                                      float(r["cublas_us"]))
    return PretunedTable(gpu, as_arch(arch), source, best)


def with_entries(table: PretunedTable, entries: Iterable[PretunedEntry], source: str) -> PretunedTable:
    """`table` with `entries` laid over it: an entry of a shape the table has replaces the table's."""
    merged = dict(table.entries)
    merged.update({(e.m, e.n, e.k): e for e in entries})
    return PretunedTable(table.gpu, table.arch, ", ".join(x for x in (table.source, source) if x), merged,
                         {key: c for key, c in table.checks.items() if key not in merged})


def with_checks(table: PretunedTable, checks: Iterable[PretunedEntry], source: str) -> PretunedTable:
    """`table` with measured heuristic picks as its checks (shapes the table has are left out: an exact
    shape takes its entry, never the verdict)."""
    kept = {(c.m, c.n, c.k): c for c in checks if (c.m, c.n, c.k) not in table.entries}
    return PretunedTable(table.gpu, table.arch, ", ".join(x for x in (table.source, source) if x),
                         table.entries, {**table.checks, **kept})


@lru_cache(maxsize=None)
def load_tables(data_dir: str = str(DATA_DIR)) -> tuple[PretunedTable, ...]:
    return tuple(table_from_json(json.loads(p.read_text())) for p in sorted(Path(data_dir).glob("*.json")))


def table_for(arch: str, gpu_name: Optional[str] = None) -> Optional[PretunedTable]:
    """The table for this GPU: by name (`target_gpu(gpu_name)`); with no name (an ahead-of-time build on a
    machine with no GPU), the table of the arch. GEMMC_PRETUNED=0 turns the tables off."""
    if os.environ.get("GEMMC_PRETUNED", "1") == "0":
        return None
    arch = as_arch(arch)
    name = target_gpu(gpu_name)
    for t in load_tables():
        if t.arch == arch and (name is None or name == t.gpu):
            return t
    return None
