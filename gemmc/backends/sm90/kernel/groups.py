"""Grouped GEMMs (GROUPED): which group and which of its tiles each work unit is, found on the device.

A group's rows: contiguous, rows offsets[g] .. offsets[g + 1] - 1 of A (M x K) and the output; masked, the first
counts[g] rows of its M (A is E x M x K). Both are clamped into [0, M], so no tile reaches past A or the output
whatever the offsets hold. A group of r rows has ceil(r / (BM * cluster M)) x clusters_n cluster tiles (units),
numbered group after group, inside a group in the plan's order (GROUP_ORDER_M: M fastest); a group without rows
has none. The persistent grid walks the units as the static scheduler does: cluster z takes z, z + G, ...

Every warp that walks them (the producer's, each consumer warp) keeps a cursor (the first group of a window of
32, and the units before it) that only moves forward: a window is one group per lane, its units and their
inclusive prefix sum over the lanes (five shuffles); a unit past the window's last moves the cursor 32 groups on.
The unit's group is the window's first lane whose prefix sum passes it (a ballot of the lanes at or below it,
counted). The walk's limit, the units of every group, is the same sum over all windows, taken once per warp
after the grid dependency is met (the offsets are the previous kernel's, under PDL).

The integer logic is plain Python over the names it reads (cutlass.min/max/select_/Int32, cute.arch's lane and
warp operations): tests/test_grouped_walk.py runs it for a whole warp at once with numpy arrays as the lanes.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute

from .scheduler import Walk, Work

LANES = 32


class GroupWalk(NamedTuple):
    """What a warp's walk over the groups reads: the offsets (or counts) tensor, the group count E, the rows M
    of A and the output (per group, masked), the cluster tiles along N, and the cursor (registers: the first
    group of the current window, the units before it)."""
    index: object
    count: object
    rows: object
    clusters_n: object
    cursor: object


class GroupScheduler:
    """Grouped scheduler methods of Sm90Gemm (facts on self)."""

    # ---- host ----
    def group_grid(self, out_mnl, groups):
        """A persistent grid of at most MAX_ACTIVE_CLUSTERS clusters, and no more than the units the groups can
        have whatever their rows (M rows over E groups: at most M / (BM * cluster M) + E tiles along M): the
        offsets stay on the device, so the grid depends on shapes only and the launch captures in a graph."""
        tm, tn, _ = self.TILE_MNK
        cm, cn = self.CLUSTER_MN
        rows = cute.size(out_mnl, mode=[0])
        count = cute.size(groups, mode=[0])
        clusters_n = (cute.size(out_mnl, mode=[1]) + tn * cn - 1) // (tn * cn)
        per_group = (rows + tm * cm - 1) // (tm * cm)
        if cutlass.const_expr(self.GROUP_MASKED):
            bound = count * per_group
        else:
            bound = per_group + count - 1       # E + 1 offsets
        units = bound * clusters_n
        return (cm, cn, cutlass.max(cutlass.min(units, self.MAX_ACTIVE_CLUSTERS), 1)), ()

    # ---- device ----
    @cute.jit
    def group_walk(self, groups, num_m, num_n, k_tile_total):
        """This CTA's walk over the grouped work units (after the grid dependency: it reads the offsets)."""
        cm, cn = self.CLUSTER_MN
        count = cute.size(groups, mode=[0])
        if cutlass.const_expr(not self.GROUP_MASKED):
            count = count - 1
        cursor = cute.make_rmem_tensor((2,), cutlass.Int32)
        cursor[0] = cutlass.Int32(0)
        cursor[1] = cutlass.Int32(0)
        gw = GroupWalk(groups, count, num_m, (num_n + self.TILE_MNK[1] * cn - 1) // (self.TILE_MNK[1] * cn), cursor)
        first_unit = cute.arch.make_warp_uniform(cute.arch.block_idx()[2])
        return Walk(first_unit, self.group_units(gw), cute.arch.grid_dim()[2], (), (), 1, k_tile_total, k_tile_total,
                    groups=gw)

    def group_rows(self, g, gw):
        """Group g's first row (of A and the output: contiguous; 0, masked) and its row count, clamped into M."""
        row0 = cutlass.Int32(0)
        rows = cutlass.Int32(0)
        if cutlass.const_expr(self.GROUP_MASKED):
            rows = cutlass.min(cutlass.max(cutlass.Int32(gw.index[g]), 0), gw.rows)
        else:
            row0 = cutlass.min(cutlass.max(cutlass.Int32(gw.index[g]), 0), gw.rows)
            end = cutlass.min(cutlass.max(cutlass.Int32(gw.index[g + 1]), row0), gw.rows)
            rows = end - row0
        return row0, rows

    @cute.jit
    def group_window(self, first, gw):
        """The window of groups first .. first + 31, group first + lane in each lane: (the inclusive prefix sum of
        the units over the lanes, the lane's units (0 past the last group), its group's first row and rows)."""
        lane = cute.arch.lane_idx()
        g = first + lane
        row0, rows = self.group_rows(cutlass.min(g, gw.count - 1), gw)
        tile_rows = self.TILE_MNK[0] * self.CLUSTER_MN[0]
        units = cutlass.Int32(cutlass.select_(g < gw.count, (rows + tile_rows - 1) // tile_rows * gw.clusters_n,
                                              cutlass.Int32(0)))
        incl = units
        for step in cutlass.range_constexpr(5):
            below = cute.arch.shuffle_sync_up(incl, 1 << step)
            incl = incl + cutlass.Int32(cutlass.select_(lane >= (1 << step), below, cutlass.Int32(0)))
        return incl, units, row0, rows

    @cute.jit
    def group_units(self, gw):
        """The units of every group: the windows' totals, summed."""
        total = cutlass.Int32(0)
        first = cutlass.Int32(0)
        while first < gw.count:
            incl, units, row0, rows = self.group_window(first, gw)
            total = total + cute.arch.shuffle_sync(incl, LANES - 1)
            first = first + LANES
        return total

    @cute.jit
    def group_work(self, unit, walk):
        """Work unit `unit` (below the walk's limit, and past this warp's last one) for this CTA: its group, the
        cluster tile inside the group, and this CTA's tile in the cluster."""
        gw = walk.groups
        cursor = gw.cursor
        first = cursor[0]
        before = cursor[1]
        incl, units, row0, rows = self.group_window(first, gw)
        total = cute.arch.shuffle_sync(incl, LANES - 1)
        while unit - before >= total:
            before = before + total
            first = first + LANES
            incl, units, row0, rows = self.group_window(first, gw)
            total = cute.arch.shuffle_sync(incl, LANES - 1)
        cursor[0] = first
        cursor[1] = before
        local = unit - before
        lane = cute.arch.popc(cute.arch.vote_ballot_sync(incl <= local))     # the lanes whose units end by it
        local = local - cute.arch.shuffle_sync(incl - units, lane)
        group = first + lane
        group_row0 = cute.arch.shuffle_sync(row0, lane)
        group_rows = cute.arch.shuffle_sync(rows, lane)
        cm, cn = self.CLUSTER_MN
        tile_rows = self.TILE_MNK[0] * cm
        cl_m = local // gw.clusters_n
        cl_n = local % gw.clusters_n
        if cutlass.const_expr(self.GROUP_ORDER_M):
            clusters_m = (group_rows + tile_rows - 1) // tile_rows
            cl_m = local % clusters_m
            cl_n = local // clusters_m
        cta_m, cta_n, _ = cute.arch.block_idx()
        tile_l = cutlass.Int32(0)
        if cutlass.const_expr(self.GROUP_MASKED):
            tile_l = group
        return Work(cute.arch.make_warp_uniform(cl_m * cm + cta_m), cute.arch.make_warp_uniform(cl_n * cn + cta_n),
                    tile_l, tile_l, 0, walk.k_tile_total, tile_l, group=group, row0=group_row0, rows=group_rows)
