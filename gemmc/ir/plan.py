"""`KernelPlan`: the lowered kernel IR read back as plain, frozen data.

The backends emit from a KernelPlan and nothing else. Each field is decided by exactly one pass
(named in its comment) and written into the kernel-level IR; `plan_from_module` (gemmc/ir/extract.py)
reads it back. A backend never recomputes any of these facts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ..spec import EpilogueInput, EpilogueOp
from ..types import DType

Dim = Union[int, str]


@dataclass(frozen=True)
class ProblemInfo:                      # from the gemm-level op (the spec)
    m: Dim
    n: Dim
    k: Dim
    batch: Optional[Dim]
    a_dtype: DType
    b_dtype: DType
    out_dtype: DType
    acc_dtype: DType
    a_major: str                        # "k" | "m"
    b_major: str                        # "k" | "n"
    name: str = "gemm"
    gate: Optional[str] = None          # a gated GEMM's gate activation: B is [gate; up], 2N x K
    groups: Optional[Dim] = None        # a grouped GEMM's group count E (B is E x N x K) and layout:
    group_layout: Optional[str] = None  # "contiguous" (A M x K, E + 1 offsets) | "masked" (A E x M x K, E counts)


@dataclass(frozen=True)
class WarpGroup:                        # assign-warpgroup-roles
    role: str                           # "producer" | "consumer" | "epilogue" | "uniform" (SM80 warps)
    index: int                          # warpgroup index in the CTA (warps 4*index .. 4*index+3)
    regs: int                           # setmaxnreg budget (SM80: 0 = compiler's choice)
    warps: int = 4


@dataclass(frozen=True)
class OperandCopy:                      # tma-cluster-layout
    operand: str                        # "a" | "b" | "out" (the store) | an epilogue input name
    kind: str                           # "tma" | "tma_store" | "cp_async" | "ldg" (plain loads: vectors)
                                        # | "st_global" (plain stores from registers: swapped A/B)
    box: tuple[int, int]                # TMA box (rows, cols) in elements; cp.async: the CTA tile
    swizzle_bytes: int                  # 128 | 64 | 32 | 0
    multicast: int                      # number of CTAs receiving each load (1: none)
    multicast_along: str = ""           # "n" (A: CTAs of one cluster row) | "m" (B) | ""
    vector_bytes: int = 16              # cp.async width (SM80)
    # the L2 eviction priority of a TMA copy's cache hint: "first" | "normal" | "last" on every copy;
    # "first_once" (A and B loads): evict-first whenever the grid loads each of this operand's tiles once (one
    # tile, or one cluster, across the other operand's extent: decode weights stream through L2); "": no hint
    l2_policy: str = ""


@dataclass(frozen=True)
class Pipeline:                         # pipeline-staging
    stages: int                         # A/B ring depth
    barriers: tuple[str, ...]           # e.g. ("full", "empty") per stage; SM80: ("cp.async.group",)
    epi_stages: int                     # C staging buffers in smem
    epi_tile: tuple[int, int]           # (rows, cols) of one epilogue sub-tile
    smem_bytes: int                     # total the CTA uses
    ring_smem_bytes: int = 0            # SM80: the A/B rings as allocated (each at a 1024 B boundary)
    compile_arch: str = ""              # SM80: the target it is built for (gemmc.schedule.SM80_COMPILE_ARCHS)


@dataclass(frozen=True)
class TileScheduler:                    # lowering of the schedule (pipeline-staging reads it)
    persistent: bool
    raster: str                         # "m" | "n"
    swizzle: int                        # group size along the raster's slow dim
    split_k: int
    # "none" | "serial": a second kernel sums the f32 partials in split order | "fixup" (sm_90a): inside the
    # GEMM kernel, the last CTA to finish a tile sums them (in split order) and runs the epilogue | "stream"
    # (sm_90a, split_k 1): stream-K, the last CTA of a split tile sums its partials
    split_k_mode: str = "none"
    pdl: bool = False                   # programmatic dependent launch (griddepcontrol; sm_90a only)
    # PDL: grids of at most pdl_early_ctas CTAs, or of at least pdl_full_ctas (when > 0), let the next
    # kernel launch once their last load is issued; the others once their last stage is released
    pdl_early_ctas: int = 0
    pdl_full_ctas: int = 0
    # PDL: grids first prefetch this many k-tiles of their first tile into L2, then wait: of both operands
    # ("ab") or of b, the weights ("b"); in the grids of those two bands (banded) or in every grid
    pdl_prefetch_k_tiles: int = 0
    pdl_prefetch_of: str = "ab"
    pdl_prefetch_banded: bool = True
    # a persistent grid's size cap: the clusters of this shape resident at once (ArchLimits; 0: not persistent)
    max_active_clusters: int = 0


@dataclass(frozen=True)
class GroupMapping:                     # map-groups (grouped GEMMs only)
    layout: str                         # "contiguous" | "masked"
    groups: Dim                         # E
    order: str                          # "m" | "n": a group's cluster tiles, M or N fastest
    group_walk: str                     # "warp_scan": how a CTA finds the group of its next work unit
    descriptors: str                    # "shared": one TMA descriptor per operand, groups in its coordinates


@dataclass(frozen=True)
class Mma:                              # assign-warpgroup-roles
    kind: str                           # "wgmma" | "mma.sync"
    inst_shape: tuple[int, int, int]    # e.g. (64, 256, 16) | (16, 8, 16)
    atom_layout: tuple[int, int, int]   # MMA atoms (warpgroups / warps) tiled over M, N, K
    a_source: str = "smem"              # "smem" | "rmem"


@dataclass(frozen=True)
class Scaling:                          # fp8: the problem's scaling; how it applies (assign-warpgroup-roles)
    mode: str                           # "tensor" | "row" | "block" (gemmc.spec.Scaling)
    a: str                              # the names of A's and B's scale params
    b: str
    promote: int = 0                    # K elements per promotion into the f32 sum (0: never; block: 128)
    accumulators: int = 1               # 2 when promoting: the WGMMA's and the f32 sum

    @property
    def in_epilogue(self) -> bool:
        """The scales multiply the whole sum in the epilogue (per tensor, per row), not each promotion."""
        return self.mode != "block"


@dataclass(frozen=True)
class Epilogue:                         # from the gemm-level epilogue region
    inputs: tuple[EpilogueInput, ...]
    ops: tuple[EpilogueOp, ...]
    store: str                          # "tma" (through smem) | "direct" (vectorized st.global)


@dataclass(frozen=True)
class KernelPlan:
    arch: str                           # "sm_90a" | "sm_80"
    problem: ProblemInfo
    tile: tuple[int, int, int]
    cluster: tuple[int, int]
    mode: str                           # "cooperative" | "pingpong" | "multistage" (SM80)
    threads: int
    warpgroups: tuple[WarpGroup, ...]
    copies: tuple[OperandCopy, ...]
    pipeline: Pipeline
    scheduler: TileScheduler
    mma: Mma
    epilogue: Epilogue
    # the schedule's swap_ab: tile, cluster and copies are in the kernel's (N, M) terms; the host passes b
    # as the kernel's A, a as its B, and a transposed view of out
    swap_ab: bool = False
    groups: Optional[GroupMapping] = None   # a grouped GEMM's tile -> group mapping
    scaling: Optional[Scaling] = None   # fp8 kernels' (their scale copies are among `copies`)

    def copy(self, operand: str) -> OperandCopy:
        for c in self.copies:
            if c.operand == operand:
                return c
        raise KeyError(operand)

    def role(self, role: str) -> tuple[WarpGroup, ...]:
        return tuple(w for w in self.warpgroups if w.role == role)
