"""The search strategies by name: `STRATEGIES` and `make_strategy`.

A module of its own because it imports every strategy, and every strategy imports `strategy` (the protocol and
the loop they share). The strategies are imported on first use: bayes and rl import torch.
"""
from __future__ import annotations

from .strategy import Strategy


STRATEGIES = ("exhaustive", "random", "bayes", "rl")


def make_strategy(name: str, seed: int = 0, **kw) -> Strategy:
    """Build a strategy by name. `rl` takes `policy=` (a trained `SchedulePolicy`)."""
    if name == "exhaustive":
        from .exhaustive import ExhaustiveStrategy
        return ExhaustiveStrategy(seed=seed, **kw)
    if name == "random":
        from .random_search import RandomStrategy
        return RandomStrategy(seed=seed, **kw)
    if name == "bayes":
        from .bayes import BayesStrategy
        return BayesStrategy(seed=seed, **kw)
    if name == "rl":
        from .rl import RLStrategy
        return RLStrategy(seed=seed, **kw)
    raise ValueError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")
