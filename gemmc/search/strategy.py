"""The `Strategy` protocol, the measurement history and the search loop they share.

A strategy is told the problem once (`start`), then alternates `propose(n)` and `observe(results)`.
It never compiles or measures anything itself: the loop (`run_search`) hands its proposals to an
evaluator (the Builder + Runner on a GPU, or the recorded dataset in simulation).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Protocol, Sequence

# the measurement a strategy observes is the tuning DB's row type, shared with gemmc.choose
from ..choose.measurement import SUSTAINED, Measurement, schedule_key  # noqa: F401
from ..schedule import Schedule, enumerate_schedules, is_valid
from ..spec import GemmSpec
from ..types import as_arch


@dataclass(frozen=True)
class SearchProblem:
    """What a strategy may know: the problem, the arch and the feasible schedules."""
    spec: GemmSpec
    arch: str
    candidates: tuple[Schedule, ...]

    @classmethod
    def of(cls, spec: GemmSpec, arch: str = "sm_90a", candidates: Optional[Iterable[Schedule]] = None,
           space=None) -> "SearchProblem":
        """Feasible set from the predicate; `candidates` (e.g. what a dataset recorded) is filtered by it."""
        arch = as_arch(arch)
        if not all(isinstance(d, int) for d in (spec.m, spec.n, spec.k)):
            raise ValueError(f"search needs concrete dims, got m={spec.m!r} n={spec.n!r} k={spec.k!r}: "
                             "use spec.with_dims(m=..., n=..., k=...)")
        if candidates is None:
            cands = enumerate_schedules(spec, arch, space)
        else:
            cands = [s for s in dict.fromkeys(candidates) if s.arch == arch and is_valid(s, spec)]
        if not cands:
            raise ValueError(f"no feasible schedule for {spec.m}x{spec.n}x{spec.k} on {arch}")
        return cls(spec, arch, tuple(cands))


class Strategy(Protocol):
    name: str

    def start(self, problem: SearchProblem) -> None:
        """Begin a new problem (forgets the previous problem's history)."""

    def propose(self, n: int) -> list[Schedule]:
        """Up to `n` not-yet-proposed schedules from `problem.candidates` (fewer when exhausted)."""

    def observe(self, results: Sequence[Measurement]) -> None:
        """Results of earlier proposals (or of a previous, resumed run)."""


class BaseStrategy:
    """Bookkeeping every strategy needs: the problem, what was proposed and what was measured."""
    name = "base"
    deterministic = True     # the same history gives the same proposals whatever the seed

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.problem: Optional[SearchProblem] = None
        self.history: list[Measurement] = []
        self.proposed: set[Schedule] = set()

    def start(self, problem: SearchProblem) -> None:
        self.problem = problem
        self.history = []
        self.proposed = set()

    def observe(self, results: Sequence[Measurement]) -> None:
        for r in results:
            self.proposed.add(r.schedule)
            self.history.append(r)

    def remaining(self) -> list[Schedule]:
        return [s for s in self.problem.candidates if s not in self.proposed]

    @staticmethod
    def _count(n: int) -> int:
        """`propose`'s `n`, checked: sliced as given, a negative count would mean 'all but the last few'."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"propose(n) needs a whole number of schedules, at least 0; got {n!r}")
        return int(n)

    def _take(self, picks: list[Schedule]) -> list[Schedule]:
        self.proposed.update(picks)
        return picks

    def best(self) -> Optional[Measurement]:
        ok = [h for h in self.history if h.ok]
        return min(ok, key=lambda h: h.time_us) if ok else None


Evaluator = Callable[[list[Schedule]], list[Measurement]]


def run_search(strategy: Strategy, problem: SearchProblem, evaluate: Evaluator, budget: int, batch: int = 1,
               prior: Sequence[Measurement] = (), on_result: Optional[Callable[[Measurement], None]] = None,
               reward=None) -> list[Measurement]:
    """Propose/evaluate/observe until `budget` new measurements (errors count) or the space is used up.

    `prior` (e.g. rows already in the tuning DB) is observed first and not re-measured: that is
    how an interrupted run resumes. `reward` (gemmc.search.reward.Reward; None: the time) is what the
    strategy observes of each measurement; the measurements returned keep their times."""
    if batch < 1:     # a batch of 0 would end the search at once, having measured nothing
        raise ValueError(f"run_search needs a batch of at least 1 schedule; got {batch}")

    def seen(results):
        return list(results) if reward is None else [reward.shaped(r, problem.spec) for r in results]
    strategy.start(problem)
    if prior:
        strategy.observe(seen(prior))
    done = {m.schedule for m in prior}
    out: list[Measurement] = []
    while len(out) < budget:
        want = min(batch, budget - len(out))
        picks = [s for s in strategy.propose(want) if s not in done][:want]
        if not picks:
            break
        results = evaluate(picks)
        for r in results:
            done.add(r.schedule)
            out.append(r)
            if on_result:
                on_result(r)
        strategy.observe(seen(results))
    return out


def best_so_far(results: Sequence[Measurement]) -> list[float]:
    """Running minimum of the time after each measurement (inf until the first success)."""
    cur, out = math.inf, []
    for r in results:
        if r.ok:
            cur = min(cur, r.time_us)
        out.append(cur)
    return out
