"""The schedule space: the axes the search and the heuristic enumerate, filtered by the predicate."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Union

from ..spec import GemmSpec
from ..types import as_arch
from .knobs import Schedule
from .limits import MODES, RASTERS
from .predicate import is_valid


# (l2_a, l2_b, l2_out, l2_prefetch): gemmc's rules, the space's default
L2_AUTO = ("auto", "auto", "auto", "auto")
# Decode (M <= SWAP_DECODE_MAX_M, swapped kernels): besides the rules, a deep weight prefetch under PDL (8
# k-tiles of b before the wait, in every grid), and the activations kept in L2 (a evict-last) while the weights
# stream evict-first in every call (the rule drops the hint once M outgrows one activation tile). Unmeasured:
# bench/decode_chain.py and the search measure them; the store is stored from registers (no hint) here.
DECODE_L2 = (L2_AUTO, ("auto", "auto", "auto", 8), ("last", "first", "auto", "auto"))


@dataclass(frozen=True)
class ScheduleSpace:
    """The axes the search and the heuristic enumerate. Cartesian product, filtered by the predicate."""
    tile_m: tuple[int, ...] = (64, 128, 256)
    # 96, 160 and 224 balance waves: N/BN lands near a multiple of the SM count (e.g. 28672/224 = 128
    # tiles on 132 SMs), where the powers of two strand SMs in a last partial wave (measured on the H200);
    # 192 and 208 fill the consumers' registers in 256-row tiles (the large-GEMM tiles)
    tile_n: tuple[int, ...] = (64, 96, 128, 160, 192, 208, 224, 256)
    tile_k: tuple[int, ...] = (64,)
    clusters: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 2), (2, 2))
    modes: tuple[str, ...] = MODES
    rasters: tuple[str, ...] = RASTERS
    swizzles: tuple[int, ...] = (1, 8)
    split_ks: tuple[int, ...] = (1, 2, 4)
    stages: tuple[Union[int, str], ...] = ("auto",)
    swap_ab: tuple[bool, ...] = (False,)
    # L2 choices, each (l2_a, l2_b, l2_out, l2_prefetch): whole presets, not a product of the four fields
    l2: tuple[tuple, ...] = (L2_AUTO,)

    @classmethod
    def for_arch(cls, arch: str) -> "ScheduleSpace":
        if as_arch(arch) == "sm_80":
            return cls(tile_m=(64, 128, 256), tile_n=(64, 128, 256), tile_k=(32, 64), clusters=((1, 1),),
                       modes=("cooperative",))
        return cls()

    @classmethod
    def for_fp8(cls, spec: GemmSpec) -> "ScheduleSpace":
        """sm_90a fp8: the standard tiles with K tiles of 64 and 128 (128 fp8 elements fill the 128-byte swizzle
        atom that 64 bf16 elements do); block scaling pins K to the 128 of its scale block and N to divisors
        of 128 (gemmc.schedule.predicate.fp8_violations)."""
        if spec.scaling is not None and spec.scaling.mode == "block":
            return cls(tile_n=(64, 128), tile_k=(128,))
        return cls(tile_k=(64, 128))

    @classmethod
    def swapped_decode(cls) -> "ScheduleSpace":
        """sm_90a kernels computing out^T = b @ a^T, for M <= SWAP_DECODE_MAX_M: the weights fill the 64/128-row
        MMA side, the activations an 8/16/32-wide tile, alone or two to a weight-multicasting 1x2 cluster; rings
        deeper than 'auto' (bench/results/heuristic-rules.md has the measurements); and the DECODE_L2 presets,
        where the weights stream from HBM and the L2 hints and the PDL prefetch can show."""
        return cls(tile_m=(64, 128), tile_n=(8, 16, 32), tile_k=(64, 128), clusters=((1, 1), (1, 2)), modes=MODES,
                   rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto", 10, 16), swap_ab=(True,),
                   l2=DECODE_L2)

    @classmethod
    def swapped_batch(cls) -> "ScheduleSpace":
        """Swapped kernels for SWAP_DECODE_MAX_M < M <= SWAP_MAX_M: 32/64-wide activation tiles, and 1x2 clusters
        whose two CTAs share one multicast weight tile (the weights stream once, over twice the CTAs); rings
        past 'auto', up to what fits: these kernels are memory-bound."""
        return cls(tile_m=(64, 128), tile_n=(32, 64), tile_k=(64, 128), clusters=((1, 1), (1, 2)), modes=MODES,
                   rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto", 9, 10, 13, 16), swap_ab=(True,))

    @classmethod
    def odd_n_tiles(cls) -> "ScheduleSpace":
        """Unswapped 64-row ping-pong tiles whose N is an odd multiple of 16 (48, 80, 112), K tile 128, for
        SWAP_DECODE_MAX_M < M <= SWAP_MAX_M: N splits into about whole waves where the standard widths strand
        SMs (6144 / 48 = 128 tiles on 132 SMs)."""
        return cls(tile_m=(64,), tile_n=(48, 80, 112), tile_k=(128,), clusters=((1, 1), (1, 2), (2, 1)),
                   modes=("pingpong",), rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto",))

    def __iter__(self) -> Iterator[tuple]:
        return itertools.product(self.tile_m, self.tile_n, self.tile_k, self.clusters, self.modes,
                                 self.rasters, self.swizzles, self.split_ks, self.stages, self.swap_ab, self.l2)



# the swapped spaces: 8/16/32-wide activation tiles up to SWAP_DECODE_MAX_M, 32/64-wide tiles up to
# SWAP_MAX_M; past that the unswapped kernels measured better (H200, M = 256)
SWAP_DECODE_MAX_M = 32
SWAP_MAX_M = 128


def standard_spaces(spec: GemmSpec, arch: str = "sm_90a") -> tuple[ScheduleSpace, ...]:
    """What the search enumerates for `spec`: the arch's standard space (fp8's on sm_90a), plus on sm_90a a
    swapped space when M is known and at most SWAP_MAX_M, and past SWAP_DECODE_MAX_M the odd-N tiles."""
    arch = as_arch(arch)
    spaces = (ScheduleSpace.for_fp8(spec) if spec.is_fp8 and arch == "sm_90a" else ScheduleSpace.for_arch(arch),)
    if arch == "sm_90a" and isinstance(spec.m, int) and spec.m <= SWAP_MAX_M:
        spaces += ((ScheduleSpace.swapped_decode(),) if spec.m <= SWAP_DECODE_MAX_M
                   else (ScheduleSpace.swapped_batch(), ScheduleSpace.odd_n_tiles()))
    return spaces


def enumerate_schedules(spec: GemmSpec, arch: str = "sm_90a", space: ScheduleSpace | None = None) -> list[Schedule]:
    """Every valid schedule in `space` (default: `standard_spaces(spec, arch)`)."""
    arch = as_arch(arch)
    out = []
    for sp in ((space,) if space is not None else standard_spaces(spec, arch)):
        for bm, bn, bk, cl, mode, raster, sw, sk, st, swap, (la, lb, lo, pf) in sp:
            s = Schedule((bm, bn, bk), cl, st, mode, raster, sw, sk, arch, swap_ab=swap, l2_a=la, l2_b=lb, l2_out=lo,
                         l2_prefetch=pf)
            if is_valid(s, spec):
                out.append(s)
    return out


def default_schedule(arch: str = "sm_90a") -> Schedule:
    return Schedule(arch=arch) if as_arch(arch) == "sm_90a" else Schedule(tile=(128, 128, 32), arch="sm_80")
