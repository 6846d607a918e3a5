"""The paired verdict: from the rows of one problem on one GPU to each schedule's figure, and the ranking.

The verdict is paired: a row's gemmc and cuBLAS times were measured interleaved in the same CUDA-graph runs,
so they share the GPU's clocks and temperature, which drift by up to ~30% over a long tune. The best schedule
of a problem on a GPU is the one with the highest geometric mean of its rows' cublas_us / time_us, or, from
three paired rows on, the median row's (one run whose cuBLAS or gemmc side was slow cannot carry it); rows
without a cuBLAS time (problems the Runner cannot pair, such as fused epilogues) rank by the geometric mean of
their times. Comparing the fastest row with the fastest cuBLAS row of the whole run (schema 1's view) judged
a thermal state, not a schedule.

A schedule's figure uses only its rows from the newest gemmc version that measured it: a new version's
kernels may run at another speed, so its rows supersede the older ones (which stay stored). A figure
whose rows all predate the running version is `stale`, and `gemmc-search tune --confirm` re-measures it
when it is among the best.

A schedule whose correctness check failed (`failed_check`) in a row of that newest version is
disqualified: a kernel that once computed a wrong result cannot be the pick, whatever its times, so it
leaves the ranking, `best`, the report's picks and the policy's positives (`disqualified` says which and
why). A compile failure, a compile timeout or a run error says nothing about the results, and does not.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterable, Optional

from .. import __version__
from ..schedule import Schedule
from .measurement import SUSTAINED

# two paired rows of one schedule whose speedups differ by more than this (relative) get a third
# (`gemmc-search tune`): H200 cuBLAS runs of one shape read up to 7% apart between measurements
CONFIRM_SPREAD = 0.02


def version_key(version: str) -> tuple:
    """'0.10.1' -> (0, 10, 1): versions order by their numeric parts (a non-numeric part counts 0)."""
    return tuple(int(p) if p.isdigit() else 0 for p in str(version).split("."))


def older_than_running(version: str) -> bool:
    """Rows of this gemmc version predate the running one: its kernels may have run at another speed."""
    return version_key(version) < version_key(__version__)


CHECK_FAILED = "check: "   # how the Runner words a failed correctness check (bench status check_failed)


def failed_check(error: Optional[str]) -> bool:
    """Is this stored error a failed correctness check (the kernel ran and its output was wrong against the
    fp32 reference)? Only the Runner's "check: ..." rows are; "compile: ...", "compile timed out ...",
    "compile worker ...", "run: ..." and "no time" rows failed before a result could be judged."""
    return isinstance(error, str) and error.startswith(CHECK_FAILED)


def succeeded(r) -> bool:
    return r["error"] is None and r["time_us"] is not None and r["time_us"] > 0


def parse_schedule(text: str, cache: dict) -> Schedule:
    if text not in cache:
        cache[text] = Schedule.from_dict(json.loads(text))
    return cache[text]


def disqualifying(rows: list) -> dict:
    """{Schedule: its failed-check row} for the schedules of `rows` that failed their check at the newest
    gemmc version that measured them (successful rows and failed checks; a newer version's clean rows
    requalify a schedule, whose kernel may have been fixed)."""
    parsed: dict[str, Schedule] = {}
    newest: dict[Schedule, tuple] = {}
    for r in rows:
        if succeeded(r) or failed_check(r["error"]):
            s = parse_schedule(r["schedule"], parsed)
            newest[s] = max(newest.get(s, ()), version_key(r["gemmc_version"]))
    out: dict[Schedule, object] = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        if failed_check(r["error"]):
            s = parse_schedule(r["schedule"], parsed)
            if version_key(r["gemmc_version"]) == newest[s]:
                out.setdefault(s, r)      # the first failure at that version says why
    return out


def _geomean(xs: list[float]) -> float:
    # one row stays exact: a single measurement reads back as stored
    return xs[0] if len(xs) == 1 else math.exp(math.fsum(map(math.log, xs)) / len(xs))


class PairedFigure:
    """What a figure's time_us, cublas_us and version say (ScheduleFigure, tuning_db.BestEntry)."""

    @property
    def speedup(self) -> Optional[float]:
        return self.cublas_us / self.time_us if self.cublas_us else None

    @property
    def stale(self) -> bool:
        """Measured only by an older gemmc, whose kernels may have run at another speed (`gemmc-search tune
        --budget 1` re-measures it)."""
        return older_than_running(self.version)


@dataclass(frozen=True)
class ScheduleFigure(PairedFigure):
    """One schedule's standing in a problem: geometric means over its paired rows (cuBLAS timed in the
    same run), the median row's times from three paired rows on, or geometric means over all its rows
    when none is paired (then cublas_us is None)."""
    schedule: Schedule
    time_us: float
    cublas_us: Optional[float]
    n_rows: int             # the rows behind the figure
    first_id: int           # ties go to the schedule measured first
    spread: float = 0.0     # max / min - 1 of the paired rows' speedups (0 with fewer than two)
    version: str = __version__  # the gemmc version of the rows behind the figure (the newest that measured it)
    own_clock: bool = False     # the rows were timed at their own power-capped clock (`timing` SUSTAINED)

    @property
    def unsettled(self) -> bool:
        """Two paired rows that disagree by more than CONFIRM_SPREAD: a third decides (median)."""
        return self.n_rows == 2 and self.cublas_us is not None and self.spread > CONFIRM_SPREAD


def timing_of(r) -> Optional[str]:
    """A row's `timing`; None for a row of an older file opened read-only (no such column)."""
    return r["timing"] if "timing" in r.keys() else None


def schedule_figures(rows: Iterable) -> list[ScheduleFigure]:
    """Per schedule, from the rows of ONE problem on ONE GPU (mappings with id, schedule, time_us, cublas_us,
    error and gemmc_version; failed rows are skipped): only the rows of the newest version that measured
    the schedule count, and a schedule that failed its correctness check at that version has no figure
    (module docstring). Where the problem has rows timed at their own clock (`timing` SUSTAINED: a long
    call, each side run alone under the power cap), only those count: interleaved units let a kernel that
    spends more energy per call borrow the clock cuBLAS's load sets, so their verdict does not hold in a
    long job."""
    rows = list(rows)
    out_of_it = disqualifying(rows)
    parsed: dict[str, Schedule] = {}
    rows = [r for r in rows if succeeded(r) and parse_schedule(r["schedule"], parsed) not in out_of_it]
    own_clock = any(timing_of(r) == SUSTAINED for r in rows)
    if own_clock:
        rows = [r for r in rows if timing_of(r) == SUSTAINED]
    by_schedule: dict[Schedule, list] = {}    # by the Schedule, not its JSON: as `TuningDB.prior` does
    for r in sorted(rows, key=lambda r: r["id"]):
        by_schedule.setdefault(parse_schedule(r["schedule"], parsed), []).append(r)
    out = []
    for schedule, rs in by_schedule.items():
        version = max((r["gemmc_version"] for r in rs), key=version_key)
        rs = [r for r in rs if r["gemmc_version"] == version]
        paired = [r for r in rs if r["cublas_us"] is not None and r["cublas_us"] > 0]
        use = paired or rs
        ratios = sorted((r["cublas_us"] / r["time_us"], r["id"]) for r in paired)
        spread = ratios[-1][0] / ratios[0][0] - 1 if len(ratios) > 1 else 0.0
        if len(paired) >= 3:     # the median row (the lower one of an even count): an outlier cannot move it
            mid = next(r for r in paired if r["id"] == ratios[(len(ratios) - 1) // 2][1])
            time_us, cublas_us = mid["time_us"], mid["cublas_us"]
        else:
            time_us = _geomean([r["time_us"] for r in use])
            cublas_us = _geomean([r["cublas_us"] for r in paired]) if paired else None
        out.append(ScheduleFigure(schedule, time_us, cublas_us, len(use), rs[0]["id"], spread, version, own_clock))
    return out


def rank_by_verdict(items: Iterable, tiebreak=lambda x: 0) -> list:
    """Best first: by paired speedup (highest first) when any item has one, else by time. An item without
    a paired cuBLAS time is then left out: its time came from other runs (another thermal state), so it
    cannot be set against the paired ones."""
    items = list(items)
    paired = [x for x in items if x.speedup is not None]
    if paired:
        return sorted(paired, key=lambda x: (-x.speedup, x.time_us, tiebreak(x)))
    return sorted(items, key=lambda x: (x.time_us, tiebreak(x)))

