"""tma-cluster-layout: how each operand reaches shared memory, and the store path.

SM90: A is shared by the CTAs of one cluster row, so each of the cluster's N-extent CTAs loads a
1/cluster_n slice and multicasts it (along n); B likewise along m. One TMA box per operand; its
smem swizzle is the widest of 128/64/32 B that the tile's contiguous extent fills. C goes
registers -> smem -> TMA store in epilogue sub-tiles.
L2 cache hints (the schedule's l2_a, l2_b, l2_out): by default ("auto") A and B loads are evict-first in
L2 in the calls whose grid loads each of their tiles once (`first_once`: the kernel decides per call, from
M and N): H200 decode shapes, weights read once, ran 1.9% faster (M <= 128, 32 llm shapes), and M >= 1024
is unchanged; the store has no hint. A schedule may instead hint every copy of an operand first, normal or
last (the store too, when the kernel stores with TMA).
SM80: 16-byte cp.async into swizzled smem; the epilogue stores straight from registers.
Swapped A and B (schedule swap_ab, SM90): the kernel's A is the problem's b (tile rows bm, multicast
along n) and its B is a (rows bn, along m); the epilogue stores each element from registers at its
transposed coordinate, and full epilogue inputs are read the same way (ldg).
Grouped GEMMs (SM90): a tile's last rows may belong to the next group (contiguous) or lie past its group's count
(masked), which must not be written, and a TMA store writes whole boxes: the epilogue stores each element from
registers (st_global, store direct), predicated on its row being one of the group's. The simplest store that is
right on every tile; interior tiles could take the TMA store, a later choice of this pass.
fp8 scales are read from global memory by the consumers (ldg, one f32 each): per tensor one value per tile
and per row the tile's rows of A's scales and columns of B's, in the epilogue, as column and row epilogue
inputs are; per block, each k-tile's scales of the tile's rows of A and B's one scale of the tile, at the
k-tile's promotion. Their boxes are in the problem's terms (rows of A x columns of the output).
The swizzle is counted in bytes, so an fp8 tile of K 128 fills a 128-byte swizzle atom with 128 elements."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

from ..ir.kernel import ClusterOp, CopyOp
from ..schedule import Schedule, epilogue_tile, splits_n
from ..spec import GemmSpec
from ..types import DType
from .common import kernel_op, layout_schedule

VECTOR_BYTES = 16


def swizzle_bytes(contiguous_elems: int, dtype: DType) -> int:
    """Widest swizzle (128/64/32 B) whose span the contiguous extent fills; 0 if under 32 B."""
    nbytes = contiguous_elems * dtype.bytes
    for width in (128, 64, 32):
        if nbytes % width == 0:
            return width
    return 0


def _operand_box(rows: int, cols: int, dtype: DType, swizzle: int) -> tuple[int, int]:
    # a swizzled TMA box spans at most one swizzle width in its contiguous dim
    return rows, min(cols, swizzle // dtype.bytes) if swizzle else cols


# the L2 hint a TMA copy takes when its schedule field is "auto": loads the per-call rule, the store none
AUTO_L2 = {"load": "first_once", "store": ""}


def l2_policy(choice: str, copy: str) -> str:
    """The `kernel.copy ... l2` word of a schedule's L2 field (`choice`) for a TMA "load" or "store"."""
    return AUTO_L2[copy] if choice == "auto" else choice


SCALE_BYTES = 4     # an f32 scale, read one at a time


def scale_copies(s: Schedule, spec: GemmSpec) -> list[CopyOp]:
    """An fp8 kernel's scale reads (module doc); none for other kernels."""
    if spec.scaling is None:
        return []
    bm, bn, _ = s.tile
    rows, cols = (bn, bm) if s.swap_ab else (bm, bn)    # the problem's rows and columns of a (swapped) tile
    boxes = {"tensor": ((1, 1), (1, 1)), "row": ((rows, 1), (1, cols)), "block": ((rows, 1), (1, 1))}
    return [CopyOp.make(operand=name, kind="ldg", box=box, swizzle_bytes=0, vector_bytes=SCALE_BYTES)
            for name, box in zip(spec.scaling.names, boxes[spec.scaling.mode])]


def operand_copies(s: Schedule, spec: GemmSpec) -> list[CopyOp]:
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    copies = []
    sm90 = s.arch == "sm_90a"
    roles = (("a", spec.a_major == "k", bm, cn, "n"), ("b", spec.b_major == "k", bn, cm, "m"))
    if s.swap_ab:   # the kernel's A is b, its B is a
        roles = (("b", spec.b_major == "k", bm, cn, "n"), ("a", spec.a_major == "k", bn, cm, "m"))
    for operand, k_major, extent, multicast, along in roles:
        if sm90:
            slice_ = extent // multicast
            rows, cols = (slice_, bk) if k_major else (bk, slice_)
            sw = swizzle_bytes(cols, spec.dtype)
            copies.append(CopyOp.make(operand=operand, kind="tma", box=_operand_box(rows, cols, spec.dtype, sw),
                                      swizzle_bytes=sw, multicast=multicast,
                                      multicast_along=along if multicast > 1 else "",
                                      l2_policy=l2_policy(getattr(s, f"l2_{operand}"), "load")))
        else:
            rows, cols = (extent, bk) if k_major else (bk, extent)
            copies.append(CopyOp.make(operand=operand, kind="cp_async", box=(rows, cols),
                                      swizzle_bytes=swizzle_bytes(cols, spec.dtype), vector_bytes=VECTOR_BYTES))
    copies += scale_copies(s, spec)
    em, en = epilogue_tile(s) if sm90 else (bm, bn)
    # a sub-tile split between two warpgroups' columns: its swizzle atoms must tile each half
    sw_cols = en // 2 if sm90 and splits_n(s) else en
    if sm90 and stores_from_registers(s, spec):
        copies.append(CopyOp.make(operand="out", kind="st_global", box=(1, 1), swizzle_bytes=0,
                                  vector_bytes=spec.out_dtype.bytes))
    elif sm90:
        copies.append(CopyOp.make(operand="out", kind="tma_store", box=(em, en),
                                  swizzle_bytes=swizzle_bytes(sw_cols, spec.out_dtype),
                                  l2_policy=l2_policy(s.l2_out, "store")))
    for x in spec.inputs:
        if x.kind == "full":
            if sm90 and not s.swap_ab:   # loaded per epilogue sub-tile, through the same smem staging as C
                copies.append(CopyOp.make(operand=x.name, kind="tma", box=(em, en),
                                          swizzle_bytes=swizzle_bytes(sw_cols, x.dtype)))
            else:
                copies.append(CopyOp.make(operand=x.name, kind="ldg", box=(bm, bn), swizzle_bytes=0,
                                          vector_bytes=VECTOR_BYTES))
        elif x.kind in ("row", "col"):
            box = (1, bn) if x.kind == "row" else (bm, 1)
            copies.append(CopyOp.make(operand=x.name, kind="ldg", box=box, swizzle_bytes=0,
                                      vector_bytes=min(VECTOR_BYTES, max(box) * x.dtype.bytes)))
    return copies


def stores_from_registers(s: Schedule, spec: GemmSpec) -> bool:
    """The SM90 epilogue stores from registers (each element at its coordinate) rather than through smem and a
    TMA store: swapped A/B (the output transposed), and grouped GEMMs (each row predicated on its group)."""
    return s.swap_ab or spec.grouped


@dataclass(frozen=True)
class TmaClusterLayout(ModulePass):
    name = "tma-cluster-layout"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kernel = kernel_op(op, self.name)
        spec, s = layout_schedule(kernel, self.name)
        kernel.drop_facts(ClusterOp, CopyOp)
        kernel.add_fact(ClusterOp.make(shape=s.cluster))
        for copy in operand_copies(s, spec):
            kernel.add_fact(copy)
        kernel.epilogue_op.properties["store"] = StringAttr("tma" if s.arch == "sm_90a"
                                                            and not stores_from_registers(s, spec) else "direct")
