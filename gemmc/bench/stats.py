"""Statistics of repeated timings and of speed ratios."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class Summary:
    """Median and spread of one quantity (microseconds per call) over repeats."""
    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        """IQR / median: the spread as a fraction, e.g. 0.01 = 1%."""
        return self.iqr / self.median if self.median else math.nan

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("summarize() needs at least one sample")
    if len(xs) == 1:
        q1 = q3 = xs[0]
    else:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return Summary(statistics.median(xs), q1, q3, xs[0], xs[-1], len(xs))


def tflops(flops: float, us: float) -> float:
    return flops / (us * 1e-6) / 1e12


def geomean(xs: Sequence[float]) -> float:
    xs = list(xs)
    if not xs:
        return math.nan
    if any(x <= 0 for x in xs):
        raise ValueError("geomean() of non-positive values")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def share_at_least(xs: Sequence[float], threshold: float = 1.0) -> float:
    xs = list(xs)
    return sum(x >= threshold for x in xs) / len(xs) if xs else math.nan


@dataclass(frozen=True)
class RatioSummary:
    """gemmc speed / cuBLAS speed (= cuBLAS time / gemmc time) over the shapes that ran."""
    geomean: float
    min: float
    max: float
    share_ge_1: float
    n_ok: int
    n_failed: int

    def line(self) -> str:
        if not self.n_ok:
            return f"no shape ran ({self.n_failed} failed)"
        return (f"geomean {self.geomean:.3f}x cuBLAS, min {self.min:.3f}x, max {self.max:.3f}x, "
                f"{100 * self.share_ge_1:.0f}% of {self.n_ok} shapes >= 1.0"
                + (f", {self.n_failed} failed" if self.n_failed else ""))

    def as_dict(self) -> dict:
        return asdict(self)


def ratio_summary(ratios: Sequence[float], n_failed: int = 0) -> RatioSummary:
    rs = [r for r in ratios if r is not None and math.isfinite(r)]
    if not rs:
        return RatioSummary(math.nan, math.nan, math.nan, math.nan, 0, n_failed)
    return RatioSummary(geomean(rs), min(rs), max(rs), share_at_least(rs, 1.0), len(rs), n_failed)
