"""The facts one SM90 kernel is built from: the KernelPlan's, as the generated module's constants name them.

The generated module (gemmc/backends/sm90/emit.py writes it) binds each fact to a module-level constant whose
comment names the pass that decided it, and hands them here with `KernelFacts.from_namespace(globals())`.
The kernel modules branch on these with `cutlass.const_expr`; nothing in them is decided per kernel.
This module does not import cutlass: the values are whatever the generated module put in (DSL types,
layout atom kinds, ints, bools).
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EpilogueInput:
    """An epilogue input as the kernel reads it: `name` (the generated module's private name), `kind` (row,
    col, full, scalar), its DSL element type, and for a full input that the plan TMA-loads into shared memory
    per epilogue sub-tile, the swizzled smem layout atom of its box (None: read from global memory)."""
    name: str
    kind: str
    dtype: Any
    smem_atom: Any = None

    @property
    def staged(self) -> bool:
        return self.smem_atom is not None


@dataclass(frozen=True)
class KernelFacts:
    A_DTYPE: Any
    B_DTYPE: Any
    ACC_DTYPE: Any
    STORE_DTYPE: Any                # the epilogue store's element type (f32 partials under split_k_mode serial)
    A_MAJOR: Any                    # OperandMajorMode of the kernel's A and B
    B_MAJOR: Any
    A_MAJOR_IS_K: bool
    B_MAJOR_IS_K: bool
    TILE_MNK: tuple
    CLUSTER_MN: tuple
    A_MULTICAST: int
    B_MULTICAST: int
    A_SMEM_ATOM: Any
    B_SMEM_ATOM: Any
    C_SMEM_ATOM: Any
    AB_STAGES: int
    EPI_STAGES: int
    EPI_TILE: tuple
    PRODUCER_WG: int
    PRODUCER_REGS: int
    CONSUMER_REGS: int
    NUM_CONSUMER_WG: int
    THREADS: int
    PINGPONG: bool
    MMA_INST_MN: tuple
    MMA_ATOM_LAYOUT: tuple
    RASTER_ALONG_M: bool
    SWIZZLE: int
    SPLIT_K: int
    SPLIT_K_MODE: str               # "none" | "serial" | "fixup" | "stream"
    REDUCE_KERNEL: bool
    MAX_ACTIVE_CLUSTERS: int
    SMEM_BYTES: int
    PDL: bool
    PDL_EARLY_CTAS: int
    PDL_FULL_CTAS: int
    PDL_PREFETCH_K_TILES: int
    PDL_PREFETCH_A: bool            # which of the kernel's operands the PDL prefetch warms
    PDL_PREFETCH_B: bool
    PDL_PREFETCH_BANDED: bool       # only in grids of the PDL bands (else in every grid)
    A_L2_POLICY: str                # L2 hints of the kernel's A and B loads and of the TMA store: "" (none),
    B_L2_POLICY: str                # "first_once" (evict-first when the grid loads each tile once), "first",
    C_L2_POLICY: str                # "normal", "last"
    SWAP_AB: bool
    BATCHED: bool
    GATED: bool                     # B is [gate; up]: two accumulators per tile, combined by gate_function
    GROUPED: bool                   # map-groups: E GEMMs in one launch, one weight per group (B's leading dim)
    GROUP_MASKED: bool              # masked groups: A and the output are E x M x .; else contiguous (M x .)
    GROUP_ORDER_M: bool             # map-groups: a group's cluster tiles M fastest (else N fastest)
    STORE_FROM_REGISTERS: bool      # tma-cluster-layout: the output is stored from registers (st_global)
    EPILOGUE_INPUTS: tuple          # EpilogueInput, in the plan's order (none staged when a reduce kernel applies them)
    # fp8 kernels only (a module without them is a bf16/f16 kernel's)
    MMA_INST_K: int = 16            # the WGMMA's K: 32 for fp8 operands
    SCALING: str = "none"           # "tensor" | "row" (scales in the epilogue, among EPILOGUE_INPUTS) | "block"
    PROMOTE_K: int = 0              # block scaling: K per promotion of the WGMMA result into the f32 sum

    @classmethod
    def from_namespace(cls, namespace: dict) -> "KernelFacts":
        missing = [f.name for f in fields(cls) if f.name not in namespace and f.default is MISSING]
        if missing:
            raise NameError(f"the generated SM90 kernel module lacks the facts {missing}; regenerate it with "
                            "gemmc.backends.emit(plan)")
        return cls(**{f.name: namespace[f.name] for f in fields(cls) if f.name in namespace})

    @property
    def BLOCK_SCALED(self) -> bool:
        """The consumers promote each k-tile into a second, f32 accumulator times its block scales."""
        return self.SCALING == "block"

    # ---- what the facts imply for the kernel's code paths ----
    @property
    def FIXUP(self) -> bool:
        """The last split of a tile sums the f32 partials in the kernel (split_k_mode fixup)."""
        return self.SPLIT_K_MODE == "fixup"

    @property
    def STREAM_K(self) -> bool:
        return self.SPLIT_K_MODE == "stream"

    @property
    def SUMS_PARTIALS(self) -> bool:
        """The kernel sums split tiles' f32 partials itself (a workspace and semaphores are passed)."""
        return self.SPLIT_K_MODE in ("fixup", "stream")

    @property
    def STAGED_INPUTS(self) -> tuple:
        return tuple(i for i in self.EPILOGUE_INPUTS if i.staged)

    @property
    def UNITS_M_FASTEST(self) -> bool:
        """Static scheduler: work units number cluster tiles M fastest (raster m, or any raster under a
        swizzle, whose order swizzled_tile applies afterwards), else N fastest."""
        return self.SWIZZLE > 1 or self.RASTER_ALONG_M

    @property
    def REORDERS(self) -> bool:
        """Whether tiles go through swizzled_tile: under a swizzle, and under stream-K (which enumerates
        tiles M-major itself) for raster n as well."""
        return self.SWIZZLE > 1 or (self.STREAM_K and not self.RASTER_ALONG_M)
