"""map-groups: how a grouped GEMM's tiles map to its groups (kernel.group); nothing for any other GEMM.

Work units. Each group's output rows (its rows of A: offsets[g] .. offsets[g + 1] - 1, contiguous; its first
counts[g] rows, masked) are cut into cluster tiles, and the units of every group are numbered group after
group, so a group without rows has none and costs nothing. Inside a group they run in the schedule's raster
order (order m: M fastest, the group's rows share each B tile while it is in L2; order n: N fastest); the
schedule's swizzle does not apply (the predicate keeps it 1). The persistent grid walks the units as the
static scheduler walks its own: cluster z takes units z, z + G, ...

Walk (warp_scan). Every unit a CTA takes is past the one before, so each warp (the producer's, and every
consumer warp) keeps a cursor over the groups that only moves forward: 32 groups at a step, one per lane, each
lane reading its group's rows from the device tensor and a warp prefix sum giving the units before each; the
unit's group is the lanes whose units end at or before it. A CTA thus reads the offsets once, and nothing is
read on the host: no synchronisation, and the launch captures in a CUDA graph. The total (the walk's limit) is
the same sum over every group, taken once per warp.

Descriptors (shared). One TMA descriptor per operand, built on the host as for any GEMM: B is E x N x K, its
group the coordinate of its leading dim; A of a masked GEMM likewise (E x M x K). A of a contiguous GEMM is
the M x K matrix of every group's rows, and a tile's coordinates are offset by its group's first row; rows
past the group come from the next groups (or are zero past M) and only reach output rows that are not stored.
No tensormap is rewritten per group. The output store, which must stop at a group's last row, is
tma-cluster-layout's (from registers, each element predicated on its row).
"""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from ..ir.kernel import GroupOp
from ..schedule import Schedule
from ..spec import GemmSpec
from .common import kernel_op, layout_schedule

WALK = "warp_scan"
DESCRIPTORS = "shared"


def group_fact(s: Schedule, spec: GemmSpec) -> GroupOp | None:
    """The kernel.group fact of a grouped GEMM (None for any other)."""
    if not spec.grouped:
        return None
    return GroupOp.make(layout=spec.group_layout, groups=spec.groups, order=s.raster, group_walk=WALK,
                        descriptors=DESCRIPTORS)


@dataclass(frozen=True)
class MapGroups(ModulePass):
    name = "map-groups"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kernel = kernel_op(op, self.name)
        spec, s = layout_schedule(kernel, self.name)
        kernel.drop_facts(GroupOp)
        fact = group_fact(s, spec)
        if fact is not None:
            kernel.add_fact(fact)
