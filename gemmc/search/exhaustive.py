"""`exhaustive`: every feasible schedule, in the predicate's enumeration order."""
from __future__ import annotations

from .strategy import BaseStrategy


class ExhaustiveStrategy(BaseStrategy):
    name = "exhaustive"

    def propose(self, n: int):
        return self._take(self.remaining()[:self._count(n)])
