"""The analytic heuristic (gemmc/choose/heuristic.py) as a prior ordering for the search.

Imported lazily: the search works (with a space-filling start) when the heuristic is absent or
its call fails, and says so once through `warnings`.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Optional

from ..schedule import Schedule
from .strategy import SearchProblem

_warned = False


def heuristic_available() -> bool:
    try:
        from ..choose.heuristic import rank_schedules  # noqa: F401
        return True
    except ImportError:
        return False


def heuristic_order(problem: SearchProblem) -> Optional[list[Schedule]]:
    """The feasible candidates, best-first by the heuristic; None if the heuristic is unavailable."""
    global _warned
    try:
        from ..choose import heuristic
        rank = heuristic.rank_schedules
        params = inspect.signature(rank).parameters
        kw = {}
        if "arch" in params:
            kw["arch"] = problem.arch
        for name in ("candidates", "schedules"):
            if name in params:
                kw[name] = list(problem.candidates)
        ranked = rank(problem.spec, **kw)
    except Exception as e:  # the heuristic is optional for the search
        if not _warned:
            warnings.warn(f"gemmc.choose.heuristic.rank_schedules unavailable ({type(e).__name__}: {e}); "
                          "the search starts from a space-filling design instead", stacklevel=2)
            _warned = True
        return None
    allowed = set(problem.candidates)
    order: list[Schedule] = []
    for item in ranked:
        s = item if isinstance(item, Schedule) else next((x for x in item if isinstance(x, Schedule)), None) \
            if isinstance(item, (tuple, list)) else getattr(item, "schedule", None)
        if s is not None and s in allowed and s not in order:
            order.append(s)
    seen = set(order)
    return order + [s for s in problem.candidates if s not in seen]
