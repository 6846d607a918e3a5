"""`gemmc-search tune --profile l2`: ncu profiles of the schedules a search measures, stored beside their times.

After each batch of measurements, one ncu run (gemmc.bench.ncu) profiles the batch's successful schedules; the
profiles go to the tuning DB's profiles table and ride on the measurements the strategy observes, where the
`time+l2` reward reads them. A failed ncu run leaves that batch without profiles (said once) and the tune goes on.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from typing import Optional, Sequence

from ..schedule import Schedule
from ..spec import GemmSpec

PROFILES = ("l2",)          # what `tune --profile` takes


class NcuProfiler:
    def __init__(self, calls: int = 1, ncu: Optional[str] = None):
        from ..bench.ncu import find_ncu
        self.ncu = find_ncu(ncu)        # a host without ncu: ProfileError now, before any measurement
        self.calls = calls
        self._warned = False

    def __call__(self, spec: GemmSpec, schedules: Sequence[Schedule]) -> dict:
        """{schedule: L2Profile} of those ncu profiled (the Runner has checked their output: no check here)."""
        from ..bench.ncu import ProfileError, ProfileJob, profile
        try:
            results = profile([ProfileJob(spec, s) for s in schedules], calls=self.calls, ncu=self.ncu, check=False)
        except ProfileError as e:
            if not self._warned:
                print(f"tune --profile l2: ncu failed, the batch goes unprofiled: {e}", file=sys.stderr)
                self._warned = True
            return {}
        return {r.job.schedule: r.profile for r in results if r.profile is not None}


def profile_batch(profiler, spec: GemmSpec, arch: str, measurements: list, db, gpu_name: str) -> list:
    """Profile the batch's successful measurements, store the profiles, and return the batch with them on."""
    from ..bench.ncu import TOOL
    ok = [m.schedule for m in measurements if m.ok]
    if profiler is None or not ok:
        return measurements
    profs = profiler(spec, ok)
    for s, p in profs.items():
        db.record_profile(spec, arch, gpu_name, s, p, tool=TOOL)
    return [replace(m, profile=profs[m.schedule]) if m.schedule in profs else m for m in measurements]


def with_stored_profiles(measurements: list, db, spec: GemmSpec, arch: str, gpu_name: str) -> list:
    """Stored rows (a resumed run's) with the profiles the DB holds for their schedules."""
    profs = db.profiles_of(spec, arch, gpu_name)
    return [replace(m, profile=profs[m.schedule]) if m.schedule in profs and m.profile is None else m
            for m in measurements]


# ---- `gemmc-search report`: the best schedules' profiles ----------------------------------------------------

def entry_spec(fields: dict) -> GemmSpec:
    """The problem of a BestEntry's fields (its epilogue left out: the compulsory bytes count a, b and out)."""
    return GemmSpec(fields["m"], fields["n"], fields["k"], batch=fields["batch"], dtype=fields["dtype"],
                    out_dtype=fields["out_dtype"], acc_dtype=fields["acc_dtype"], a_layout=fields["a_layout"],
                    b_layout=fields["b_layout"])


def entry_profiles(db, entry) -> tuple:
    """(the best schedule's profile, cuBLAS's) on the entry's GPU; None where none is stored."""
    import json
    profs = db.profiles(json.dumps(entry.fields, sort_keys=True, separators=(",", ":")), entry.gpu_name)
    return profs.get(entry.schedule), profs.get(None)


def profile_json(profile, spec: GemmSpec) -> Optional[dict]:
    return None if profile is None else {**profile.to_dict(), "dram_ratio": profile.dram_ratio(spec)}


PROFILE_HEADER = f"{'L2 hit':>7} {'DRAM/id':>7} {'SM MHz':>6} {'tens%':>5}"


def profile_cells(profile, spec: GemmSpec) -> str:
    """The report's profile columns of one schedule ('-' without a profile)."""
    import math
    if profile is None:
        return f"{'-':>7} {'-':>7} {'-':>6} {'-':>5}"

    def f(x, fmt, w):
        return f"{'-':>{w}}" if x is None or not math.isfinite(x) else format(x, fmt).rjust(w)
    return (f"{f(100 * profile.l2_hit_rate, '.1f', 6)}% {f(profile.dram_ratio(spec), '.2f', 7)} "
            f"{f(profile.sm_clock_mhz, '.0f', 6)} {f(profile.tensor_pipe_pct, '.0f', 5)}")
