"""`random`: uniform sampling without replacement; the baseline every other strategy must beat."""
from __future__ import annotations

import random

from .strategy import BaseStrategy, SearchProblem


class RandomStrategy(BaseStrategy):
    name = "random"
    deterministic = False

    def start(self, problem: SearchProblem) -> None:
        super().start(problem)
        self._order = list(problem.candidates)
        random.Random(self.seed).shuffle(self._order)

    def propose(self, n: int):
        return self._take([s for s in self._order if s not in self.proposed][:self._count(n)])
