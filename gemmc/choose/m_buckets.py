"""schedule="auto" for a kernel whose M is symbolic: the choice is made per runtime M bucket.

One symbolic-M kernel serves every M, but the best schedule, and whether cuBLAS wins, depends on M: a
decode batch of 16 rows wants a swapped kernel with 8-wide activation tiles, a prefill of 4096 rows
wants 128x256 tiles.
A runtime M is rounded up to a power of two (M above the last bucket shares it). Each bucket is resolved
once with gemmc.choose.auto.resolve_auto at that M. Its kernel is compiled for the symbolic spec, so it
serves every M of the bucket, and is built on first use (or by `build()`). A bucket's cuBLAS fallback
holds for all its M.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from ..schedule import Schedule, is_valid
from ..spec import GemmSpec
from . import auto
from .decision import Decision

BUCKETS = tuple(2 ** i for i in range(17))          # 1 .. 65536 rows
# M_BUCKETS[i]: the runtime M that BUCKETS[i] takes, (lo, hi) inclusive; hi None for the last, which takes
# every larger M too
M_BUCKETS = tuple((b // 2 + 1, b) for b in BUCKETS[:-1]) + ((BUCKETS[-2] + 1, None),)


def bucket_of(m: int) -> int:
    """The smallest bucket >= m (the last bucket for anything larger)."""
    if m < 1:
        raise ValueError(f"M must be >= 1, got {m}")
    for b in BUCKETS:
        if m <= b:
            return b
    return BUCKETS[-1]


def range_label(lo: int, hi: Optional[int]) -> str:
    """A bucket's M range as `gemmc build` prints it: "3..4"; "32769.." for the last (no upper end)."""
    return f"{lo}.." if hi is None else f"{lo}..{hi}"


class MBuckets:
    """Per-bucket decisions and kernels of one symbolic-M `auto` compile.

    `make_kernel(schedule)` returns the compiled callable for the symbolic spec with that schedule;
    `default` is the one `gemmc.compile` returned (its schedule is reused when a bucket picks it).
    `db`: the tuning DB the buckets are resolved with (resolve_auto's `db`; None: its default).
    """

    def __init__(self, spec: GemmSpec, arch: str, default_schedule: Schedule, default_kernel,
                 make_kernel: Callable[[Schedule], object], db=None):
        self.spec = spec
        self.arch = arch
        self.db = db
        self._kernels = {default_schedule: default_kernel}
        self._make_kernel = make_kernel
        self._decisions: dict = {}
        self._routes: dict = {}           # runtime M -> (decision, kernel or None): the call path's cache
        self._lock = threading.Lock()
        self._default_schedule = default_schedule

    def decision(self, m: int):
        """The `auto` Decision of M's bucket (resolved once per bucket)."""
        b = bucket_of(m)
        d = self._decisions.get(b)
        if d is None:
            d = auto.resolve_auto(self.spec, self.arch, m=b, db=self.db)
            if not is_valid(d.schedule, self.spec):   # valid at M = b, not for every M: keep the default
                d = Decision(self._default_schedule, "heuristic", detail=f"bucket {b}: {d.schedule.short()} "
                             "is not valid for symbolic M")
            self._decisions[b] = d
        return d

    def kernel_for(self, schedule: Schedule):
        with self._lock:
            k = self._kernels.get(schedule)
            if k is None:
                k = self._kernels[schedule] = self._make_kernel(schedule)
            return k

    def route(self, m: int):
        """(decision, kernel) for a runtime M; kernel is None when the bucket runs cuBLAS."""
        r = self._routes.get(m)
        if r is None:
            d = self.decision(m)
            r = (d, None if d.use_cublas else self.kernel_for(d.schedule))
            if len(self._routes) >= 4096:    # a serving loop sees many distinct M: keep the cache bounded
                self._routes.clear()
            self._routes[m] = r
        return r

    def table(self) -> list[tuple[int, object]]:
        """[(bucket, Decision)] for every bucket: what `auto` does at each M."""
        return [(b, self.decision(b)) for b in BUCKETS]

    def describe(self) -> list[tuple[str, object, str]]:
        """[(M range label, Decision, schedule short name or "torch.matmul")] for every bucket, in M order."""
        return [(range_label(*rng), d, "torch.matmul" if d.use_cublas else d.schedule.short())
                for rng, (_, d) in zip(M_BUCKETS, self.table())]

    def kernels(self) -> list:
        """Every kernel some bucket launches, once each (built by `CompiledGemm.build`)."""
        schedules = dict.fromkeys(d.schedule for _, d in self.table() if not d.use_cublas)
        return [self.kernel_for(s) for s in schedules]


def runtime_m(spec: GemmSpec, args: tuple, kwargs: dict) -> Optional[int]:
    """M of a call, read from the A operand (the first positional argument, or `a=`); None if there is none."""
    a = args[0] if args else kwargs.get("a")
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) < 2:
        return None
    return int(shape[-2] if spec.a_layout == "mk" else shape[-1])
