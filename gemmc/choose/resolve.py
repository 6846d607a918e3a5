"""`gemmc.compile(schedule=...)` resolved, once: "auto", "heuristic", a gemmc.Schedule or a dict of its fields, to
the Schedule the compile lowers (not yet checked for validity), with `auto`'s Decision behind it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

from ..errors import SpecError
from ..schedule import Schedule
from ..spec import GemmSpec
from ..types import as_arch
from . import auto
from .decision import Decision
from .heuristic import choose_schedule

SCHEDULE_CHOICES = ("auto", "heuristic")


def tuning_db_for(cache_dir: Optional[Path]) -> Optional[Path]:
    """The tuning DB `auto` reads for a compile into `cache_dir`: GEMMC_TUNING_DB where set, else the one in
    that cache, as for GEMMC_CACHE_DIR (gemmc.choose.tuning_db_schema.default_path); None: resolve_auto's
    default."""
    if cache_dir is None or os.environ.get("GEMMC_TUNING_DB"):
        return None
    return cache_dir / "tuning.sqlite"


def resolve_schedule(spec: GemmSpec, schedule: Union[str, Schedule, dict], arch: Optional[str],
                     db=None) -> tuple[Schedule, Optional[Decision]]:
    """(the Schedule for `arch`, `auto`'s Decision or None for any other choice). `arch` None: the Schedule's,
    else sm_90a; one that contradicts a Schedule's is a SpecError, while a dict that names no arch takes it.
    `db`: the tuning DB "auto" reads (resolve_auto's `db`)."""
    if isinstance(schedule, dict):      # a dict that names no arch takes the explicit one
        schedule = Schedule.from_dict(schedule if arch is None or "arch" in schedule
                                      else {**schedule, "arch": as_arch(arch)})
    if isinstance(schedule, Schedule):
        # a Schedule always carries an arch (default sm_90a): an explicit arch= that differs contradicts it
        if arch is not None and as_arch(arch) != schedule.arch:
            want = as_arch(arch)
            raise SpecError(f"compile(arch={want!r}) contradicts the schedule's arch {schedule.arch!r} (a "
                            f"gemmc.Schedule carries its arch, default 'sm_90a'): build it for that arch, "
                            f"Schedule(..., arch={want!r}) or schedule.with_(arch={want!r}), or leave arch= out "
                            f"to compile for {schedule.arch!r}")
        return schedule, None
    if schedule not in SCHEDULE_CHOICES:
        raise SpecError(f"schedule={schedule!r}; use 'auto', 'heuristic' or a gemmc.Schedule(...)")
    arch = as_arch(arch or "sm_90a")
    if schedule == "auto":
        decision = auto.resolve_auto(spec, arch, db=db)
        return decision.schedule, decision
    return choose_schedule(spec, arch), None
