"""Which measured shapes count as a problem's neighbours, for the tuning DB's step and the shipped table's alike.

A neighbour has the same N and K and an M within 2x (`NEAR_LOG2_M`); the nearest M comes first (log2 distance),
the smaller M first on a tie. Its pick is lent only where it is valid for the problem: an invalid one gives way to
the next neighbour. Beyond that, the tuning DB lends a farther tuned shape, within `FAR_LOG2` over (M, N, K), after
its policy.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, TypeVar

NEAR_LOG2_M = 1.0    # same N and K, M within 2x
FAR_LOG2 = 3.0       # the DB's farther neighbours: log2 distance over (M, N, K) at most 3 (8x in one dim)

T = TypeVar("T")


def log2_distance(there: tuple, here: tuple) -> float:
    """The distance between two shapes (M, N, K): the Euclidean norm of their dims' log2 ratios."""
    return math.sqrt(sum(math.log2(a / b) ** 2 for a, b in zip(there, here)))


def m_neighbours(items: Iterable[T], shape: tuple, dims: Callable[[T], tuple]) -> list[T]:
    """The items whose shape (`dims(item)`: (M, N, K)) neighbours `shape` = (M, N, K): the same N and K, another M
    within 2x; the nearest M first, the smaller M first on a tie."""
    m, n, k = shape
    near = []
    for item in items:
        im, i_n, ik = dims(item)
        if (i_n, ik) == (n, k) and im != m:
            d = abs(math.log2(im / m))
            if d <= NEAR_LOG2_M:
                near.append((d, im, item))
    near.sort(key=lambda t: (t[0], t[1]))
    return [item for _, _, item in near]
