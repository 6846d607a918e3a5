"""`Schedule`: every knob of a kernel, as one frozen record; and `Violation`, one rule a schedule breaks."""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields, replace
from typing import Union

from ..errors import ScheduleError
from ..types import as_arch


@dataclass(frozen=True)
class Schedule:
    """Every knob of a kernel. Frozen: it is a dictionary key and a cache-key input."""
    tile: tuple[int, int, int] = (128, 128, 64)
    cluster: tuple[int, int] = (1, 1)
    stages: Union[int, str] = "auto"
    mode: str = "cooperative"
    raster: str = "m"
    swizzle: int = 1
    split_k: int = 1
    arch: str = "sm_90a"
    # programmatic dependent launch (the prologue overlaps the previous kernel); ignored on sm_80
    pdl: bool = True
    # swap A and B (sm_90a): the kernel computes out^T = b @ a^T, so `tile` and `cluster` read (N, M, K) and
    # (N, M): decode shapes fill the 64-row WGMMA with B's rows; the output is stored from registers.
    swap_ab: bool = False
    # stream-K (sm_90a, cooperative, split_k 1): whole waves run data-parallel, the last partial wave's tiles
    # and one full wave's are shared out as equal (tile, k-tile) runs; the last CTA of a split tile sums them.
    stream_k: bool = False
    # L2 eviction priority of the TMA loads of the problem's a and b, and of the TMA store (sm_90a): "auto" is
    # gemmc's rule (a load is evict-first in the calls whose grid loads each of its tiles once, the store has no
    # hint); "first", "normal" or "last" hints every copy of that operand
    l2_a: str = "auto"
    l2_b: str = "auto"
    l2_out: str = "auto"
    # PDL (sm_90a): k-tiles of the weights (the problem's b) of each CTA's first tile that the kernel prefetches
    # into L2 before it waits for the previous kernel (0: none); "auto": 2 k-tiles of a and b, and only in the
    # grids that let the next kernel launch early (pipeline-staging's PDL bands)
    l2_prefetch: Union[int, str] = "auto"

    def __post_init__(self):
        # lossless normalization only (lists to tuples, numpy ints to int, "4" to 4): a malformed value stays
        # as given, for check_schedule to name instead of truncating 3.7 stages to 3
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("tile", _as_ints(self.tile))
        set_("cluster", _as_ints(self.cluster))
        set_("arch", as_arch(self.arch))
        if isinstance(self.stages, str) and self.stages.isdigit():    # the IR and the CLI write stages as text
            set_("stages", int(self.stages))
        elif self.stages != "auto":
            set_("stages", _as_int(self.stages))
        set_("swizzle", _as_int(self.swizzle))
        set_("split_k", _as_int(self.split_k))
        if isinstance(self.l2_prefetch, str) and self.l2_prefetch.isdigit():
            set_("l2_prefetch", int(self.l2_prefetch))
        elif self.l2_prefetch != "auto":
            set_("l2_prefetch", _as_int(self.l2_prefetch))

    def to_dict(self) -> dict:
        """`pdl` appears only when off, so the dicts recorded before it existed (datasets, tuning DBs,
        the shipped tables) still equal the ones written now; `from_dict` reads a missing key as on."""
        d = asdict(self)
        if d["pdl"] is True:
            del d["pdl"]
        if d["swap_ab"] is False:      # likewise: only present when on
            del d["swap_ab"]
        if d["stream_k"] is False:
            del d["stream_k"]
        for f in L2_FIELDS:            # the L2 fields likewise: only present when not "auto"
            if d[f] == "auto":
                del d[f]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        """The inverse of `to_dict`; also what `gemmc.compile(spec, {...})` reads. A key that is not a field
        raises ScheduleError naming it."""
        _require_fields(d)
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})

    def short(self) -> str:
        """Compact id, e.g. '128x256x64_c2x1_coop_s4_rm_sw1_k1' ('_nopdl' appended when pdl is off, '_swap'
        when A and B are swapped, '_streamk' under stream-K, '_l2a-last' (l2_b: '_l2b-', l2_out: '_l2o-') for an L2
        eviction priority other than auto, '_pf8' for 8 prefetched k-tiles)."""
        bm, bn, bk = self.tile
        mode = "coop" if self.mode == "cooperative" else "pp"
        return (f"{bm}x{bn}x{bk}_c{self.cluster[0]}x{self.cluster[1]}_{mode}_s{self.stages}"
                f"_r{self.raster}_sw{self.swizzle}_k{self.split_k}" + ("" if self.pdl else "_nopdl")
                + ("_swap" if self.swap_ab else "") + ("_streamk" if self.stream_k else "")
                + "".join(f"_{tok}-{getattr(self, f)}" for f, tok in L2_TOKENS.items() if getattr(self, f) != "auto")
                + ("" if self.l2_prefetch == "auto" else f"_pf{self.l2_prefetch}"))

    def with_(self, **kw) -> "Schedule":
        _require_fields(kw)
        return replace(self, **kw)


# the L2 fields that default to "auto", and their tokens in `short()` (`_l2a-last`)
L2_FIELDS = ("l2_a", "l2_b", "l2_out", "l2_prefetch")
L2_TOKENS = {"l2_a": "l2a", "l2_b": "l2b", "l2_out": "l2o"}


def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _as_int(x):
    return int(x) if is_int(x) else x


def _as_ints(value):
    return tuple(_as_int(x) for x in value) if isinstance(value, (tuple, list)) else value


def is_sizes(value, n: int) -> bool:
    return isinstance(value, tuple) and len(value) == n and all(is_int(x) for x in value)


def _require_fields(d) -> None:
    names = [f.name for f in fields(Schedule)]
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ScheduleError([Violation("schedule field", repr(k), f"Schedule has no such field: use {', '.join(names)}")
                             for k in unknown])


@dataclass(frozen=True)
class Violation:
    """One broken rule: which limit, the offending value, and what to change."""
    limit: str
    value: object
    fix: str

    def __str__(self) -> str:
        return f"{self.limit}: got {self.value}; {self.fix}"
