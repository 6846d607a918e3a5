"""What a search strategy minimises: the time (`--reward time`), or the time with an L2 term (`time+l2`).

The strategies minimise the time_us of the measurements they observe; a Reward turns each measurement into
that figure. `time+l2` scales a measured time by its ncu profile (`Measurement.profile`, from `tune --profile
l2` or a dataset's recorded profiles):

    score = time_us * (1 + l2 * (1 - L2 hit rate) + dram * max(0, DRAM bytes / compulsory bytes - 1))

so among schedules of about the same time the one that keeps its tiles in L2 and moves fewer bytes from DRAM
ranks first: a tie-break toward schedules that leave L2 and HBM to the kernels around them. A measurement
without a profile scores its time. Only what the strategy sees changes: the tuning DB stores the times, and
the verdict (`gemmc-search report`, `schedule="auto"`) ranks by the paired times alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from ..choose.measurement import Measurement
from ..errors import GemmcError
from ..spec import GemmSpec

REWARDS = ("time", "time+l2")
DEFAULT_WEIGHTS = {"l2": 0.1, "dram": 0.1}


class RewardError(GemmcError, ValueError):
    """A --reward or --reward-weights value gemmc cannot read (the message says what it takes)."""


@dataclass(frozen=True)
class Reward:
    kind: str = "time"
    l2_weight: float = DEFAULT_WEIGHTS["l2"]
    dram_weight: float = DEFAULT_WEIGHTS["dram"]

    @property
    def uses_profiles(self) -> bool:
        return self.kind == "time+l2"

    def score(self, m: Measurement, spec: GemmSpec) -> Optional[float]:
        """The figure the strategy minimises (None for a failed measurement)."""
        if not m.ok:
            return None
        if not self.uses_profiles or m.profile is None:
            return m.time_us
        p = m.profile
        miss = 1.0 - p.l2_hit_rate if math.isfinite(p.l2_hit_rate) else 0.0
        ratio = p.dram_ratio(spec)
        excess = max(0.0, ratio - 1.0) if math.isfinite(ratio) else 0.0
        return m.time_us * (1.0 + self.l2_weight * max(0.0, miss) + self.dram_weight * excess)

    def shaped(self, m: Measurement, spec: GemmSpec) -> Measurement:
        """`m` as the strategy observes it: its time replaced by the score."""
        if not self.uses_profiles or not m.ok or m.profile is None:
            return m
        return replace(m, time_us=self.score(m, spec))

    def describe(self) -> str:
        if not self.uses_profiles:
            return "time"
        return f"time+l2 (l2={self.l2_weight:g}, dram={self.dram_weight:g})"


def parse_reward(kind: str, weights: Optional[str] = None) -> Reward:
    """`--reward KIND` with `--reward-weights l2=W,dram=W` (either may be left out: DEFAULT_WEIGHTS)."""
    if kind not in REWARDS:
        raise RewardError(f"--reward {kind!r}: use one of {', '.join(REWARDS)}")
    w = dict(DEFAULT_WEIGHTS)
    for part in (weights or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if name not in w or not (math.isfinite(number) and number >= 0):
            raise RewardError(f"--reward-weights {weights!r}: write l2=W,dram=W with weights >= 0 (default "
                              f"l2={DEFAULT_WEIGHTS['l2']:g},dram={DEFAULT_WEIGHTS['dram']:g})")
        w[name] = number
    if weights and kind == "time":
        raise RewardError("--reward-weights weigh the L2 term of --reward time+l2; --reward time has none")
    return Reward(kind, w["l2"], w["dram"])
