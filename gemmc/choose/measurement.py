"""One measured schedule (`Measurement`): a row of the tuning DB, and what a search strategy observes.

Both sides use it: gemmc.search records and searches with it, gemmc.choose.tuning_db reads rows back as it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Optional

from ..schedule import Schedule


def schedule_key(s: Schedule) -> str:
    """Canonical JSON of a schedule: the DB's and the dataset's identity for it."""
    return json.dumps(s.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Measurement:
    """One evaluated schedule: a time in microseconds, or the error that stopped it."""
    schedule: Schedule
    time_us: Optional[float] = None
    error: Optional[str] = None
    cublas_us: Optional[float] = None
    compile_s: Optional[float] = None
    timing: Optional[str] = None      # SUSTAINED: each side timed at its own power-capped clock; None: interleaved

    @property
    def ok(self) -> bool:
        return self.error is None and self.time_us is not None and math.isfinite(self.time_us) and self.time_us > 0


SUSTAINED = "sustained"     # Measurement.timing of a call timed by `--sustained-s` (bench_shape's `sustained`)
