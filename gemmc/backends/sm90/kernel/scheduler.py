"""Tile scheduler of the SM90 kernel: which CTA computes which tile, and which k-tiles of it.

Static persistent scheduler: a work unit is a cluster tile (M and N tiles rounded up to whole clusters) of one
split and batch, numbered along the raster's extent first (M first under a swizzle, whose order swizzled_tile
applies afterwards), then the other, then split * L. A persistent grid of at most MAX_ACTIVE_CLUSTERS clusters
walks them: cluster z takes units z, z + G, z + 2G, ... The grid's x and y are the cluster's shape, so a CTA's
block x and y place its tile inside the cluster tile. Split-K: unit L coordinate = split * L + batch, and each
split owns a contiguous range of k-tiles (the last may be short).

Stream-K (split_k_mode stream), the data-parallel + stream-K hybrid: one cluster per resident slot (at most
one per iteration). Whole waves of cluster tiles run data-parallel first (cluster c takes tiles c, c + G, ...),
keeping the static scheduler's L2 locality; the tiles of the last partial wave and one full wave before it
are shared out as (tile, k-tile) iterations: cluster c takes stream-K iterations [c * q + min(c, r),
(c + 1) * q + min(c + 1, r)), q and r the quotient and remainder of their count by G, so no SM idles through
a partial last wave. gemmc/backends/sm90/stream_k.py models the same integers in plain Python.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute


class Work(NamedTuple):
    """One piece of work: this CTA's tile (m, n, l) and its k-tiles [k_begin, k_begin + k_count). tile_l_raw is
    the static scheduler's split * L + batch; store_l the L index the store writes (split-major under the
    reduce kernel). Under stream-K, sk_tile is the cluster tile and sk_it the piece's first stream-K iteration.
    Grouped (groups.py): group is B's group; tile_m counts tiles from the group's first row, row0 (the group's
    first row of A and the output: contiguous) and rows (its row count) place and bound them; tile_l is A's and
    the output's L (the group, masked; 0, contiguous)."""
    tile_m: object
    tile_n: object
    tile_l: object
    tile_l_raw: object
    k_begin: object
    k_count: object
    store_l: object
    sk_tile: object = None
    sk_it: object = None
    group: object = None
    row0: object = None
    rows: object = None


class StreamK(NamedTuple):
    """This cluster's stream-K walk: data-parallel waves, then its share [begin, end) of the iterations."""
    clusters_m: object
    clusters_n: object
    grid: object            # clusters in the grid
    cluster: object         # this cluster's index in it
    dp_tiles: object
    dp_iters: object
    share: object
    extra: object
    begin: object
    end: object
    length: object          # iterations this cluster walks: its data-parallel tiles' and its share


class Walk(NamedTuple):
    """This CTA's walk over its work: positions start, start + step, ... below limit (static: work units, step
    the grid's clusters; stream-K: iterations, each piece stepping by its k-tiles), and what decodes them."""
    start: object
    limit: object
    step: object
    sched: tuple            # static: (work units, fast and slow cluster divisors)
    clusters_mn: tuple      # static under a swizzle: swizzled_tile's grid of whole clusters
    num_l: object
    k_tile_total: object
    k_per_split: object
    sk: object = None       # stream-K: StreamK
    cluster_coord: object = None
    cta_rank: object = None
    groups: object = None   # grouped: GroupWalk (groups.py)


class TileScheduler:
    """Scheduler methods of Sm90Gemm (facts on self)."""

    # ---- host: grid and scheduler arguments ----
    def tiles_mnl(self, out_mnl):
        return cute.zipped_divide(out_mnl, tiler=(self.TILE_MNK[0], self.TILE_MNK[1]))[(0, (None, None, None))].shape

    def static_grid(self, out_mnl):
        """(grid, the kernel's scheduler arguments): the unit count and its two cluster extents as divisors with
        precomputed multipliers, so the kernel decodes a unit with no integer division."""
        tiles_mnl = self.tiles_mnl(out_mnl)
        clusters_m = (tiles_mnl[0] + self.CLUSTER_MN[0] - 1) // self.CLUSTER_MN[0]
        clusters_n = (tiles_mnl[1] + self.CLUSTER_MN[1] - 1) // self.CLUSTER_MN[1]
        work_units = clusters_m * clusters_n * tiles_mnl[2] * self.SPLIT_K
        fast, slow = (clusters_m, clusters_n) if self.UNITS_M_FASTEST else (clusters_n, clusters_m)
        fast_clusters = cute.fast_divmod_create_divisor_v2(fast)
        slow_clusters = cute.fast_divmod_create_divisor_v2(slow)
        grid = (*self.CLUSTER_MN, cutlass.min(work_units, self.MAX_ACTIVE_CLUSTERS))
        return grid, (cutlass.Int32(work_units), fast_clusters, slow_clusters)

    def stream_k_grid(self, out_mnl, a_mkl):
        """Stream-K: one cluster per resident slot, at most one per (cluster tile, k-tile) iteration."""
        tiles_mnl = self.tiles_mnl(out_mnl)
        cm, cn = self.CLUSTER_MN
        iterations = (((tiles_mnl[0] + cm - 1) // cm) * ((tiles_mnl[1] + cn - 1) // cn)
                      * tiles_mnl[2] * ((cute.size(a_mkl, mode=[1]) + self.TILE_MNK[2] - 1) // self.TILE_MNK[2]))
        return (cm, cn, cutlass.max(cutlass.min(iterations, self.MAX_ACTIVE_CLUSTERS), 1)), ()

    # ---- device ----
    @cute.jit
    def walk(self, sched, num_m, num_n, num_l, k_tile_total, cluster_coord, cta_rank):
        k_per_split = (k_tile_total + self.SPLIT_K - 1) // self.SPLIT_K
        clusters_mn = ()
        if cutlass.const_expr(self.SWIZZLE > 1 and not self.STREAM_K):
            cm, cn = self.CLUSTER_MN
            clusters_mn = ((num_m + self.TILE_MNK[0] * cm - 1) // (self.TILE_MNK[0] * cm),
                           (num_n + self.TILE_MNK[1] * cn - 1) // (self.TILE_MNK[1] * cn))
        result = None
        if cutlass.const_expr(self.STREAM_K):
            sk = self.stream_k_walk(num_m, num_n, num_l, k_tile_total)
            result = Walk(0, sk.length, None, sched, clusters_mn, num_l, k_tile_total, k_per_split, sk, cluster_coord,
                          cta_rank)
        else:
            # this cluster's work units are first_unit, first_unit + grid_clusters, ...
            first_unit = cute.arch.make_warp_uniform(cute.arch.block_idx()[2])
            grid_clusters = cute.arch.grid_dim()[2]
            result = Walk(first_unit, sched[0], grid_clusters, sched, clusters_mn, num_l, k_tile_total, k_per_split)
        return result

    @cute.jit
    def work_at(self, position, walk):
        result = None
        if cutlass.const_expr(self.GROUPED):
            result = self.group_work(position, walk)
        elif cutlass.const_expr(self.STREAM_K):
            result = self.stream_k_work(position, walk.sk, walk.cluster_coord, walk.k_tile_total)
        else:
            result = self.static_work(position, walk.sched, walk.clusters_mn, walk.num_l, walk.k_tile_total,
                                      walk.k_per_split)
        return result

    def next_position(self, position, walk, work):
        if cutlass.const_expr(self.STREAM_K):
            return position + work.k_count
        return position + walk.step

    # ---- device: static scheduler ----
    def k_tiles_of(self, l_raw, k_tile_total, num_l):
        """k-tiles of the work unit with L coordinate l_raw = split * L + batch (the last split may be short)."""
        if cutlass.const_expr(self.SPLIT_K == 1):
            return k_tile_total
        k_per_split = (k_tile_total + self.SPLIT_K - 1) // self.SPLIT_K
        return cutlass.max(cutlass.min(k_per_split, k_tile_total - (l_raw // num_l) * k_per_split), 0)

    @cute.jit
    def work_tile(self, unit, fast_clusters, slow_clusters):
        """Work unit `unit` -> this CTA's tile (m, n, split * L + batch)."""
        rest, cl_fast = divmod(unit, fast_clusters)
        l_raw, cl_slow = divmod(rest, slow_clusters)
        cl_m, cl_n = cl_fast, cl_slow
        if cutlass.const_expr(not self.UNITS_M_FASTEST):
            cl_m, cl_n = cl_slow, cl_fast
        cta_m, cta_n, _ = cute.arch.block_idx()
        return (cute.arch.make_warp_uniform(cl_m * self.CLUSTER_MN[0] + cta_m),
                cute.arch.make_warp_uniform(cl_n * self.CLUSTER_MN[1] + cta_n),
                cute.arch.make_warp_uniform(l_raw))

    @cute.jit
    def tile_coord(self, bidx, tiles_m, tiles_n):
        """Grouped raster: work unit `bidx` of a tiles_m x tiles_n grid -> (m, n). SWIZZLE lines of the slow dim
        side by side, the fast dim walked down them, the slow dim varying fastest inside a group; a last group
        narrower than SWIZZLE takes the remainder, so every index maps to a real tile (cutlass.utils' swizzled
        scheduler pads the grid to whole groups instead, and runs the padding)."""
        fast_tiles, slow_tiles = tiles_m, tiles_n
        if cutlass.const_expr(not self.RASTER_ALONG_M):
            fast_tiles, slow_tiles = tiles_n, tiles_m
        group_tiles = self.SWIZZLE * fast_tiles
        group = bidx // group_tiles
        first = group * self.SWIZZLE
        width = slow_tiles - first
        if width > self.SWIZZLE:
            width = self.SWIZZLE
        local = bidx - group * group_tiles
        slow = first + local % width
        fast = local // width
        m, n = fast, slow
        if cutlass.const_expr(not self.RASTER_ALONG_M):
            m, n = slow, fast
        return m, n

    @cute.jit
    def swizzled_tile(self, tile_m, tile_n, clusters_m, clusters_n):
        """A tile of the M-major, unswizzled enumeration of whole clusters under the plan's raster and swizzle
        (tile_coord), keeping the CTA's place in its cluster."""
        cm, cn = self.CLUSTER_MN
        cl_m, cl_n = self.tile_coord(tile_m // cm + clusters_m * (tile_n // cn), clusters_m, clusters_n)
        return cl_m * cm + tile_m % cm, cl_n * cn + tile_n % cn

    @cute.jit
    def static_work(self, unit, sched, clusters_mn, num_l, k_tile_total, k_per_split):
        """The static scheduler's work unit `unit` for this CTA."""
        work_units, fast_clusters, slow_clusters = sched
        tile_m, tile_n, tile_l_raw = self.work_tile(unit, fast_clusters, slow_clusters)
        if cutlass.const_expr(self.SWIZZLE > 1):
            tile_m, tile_n = self.swizzled_tile(tile_m, tile_n, *clusters_mn)
        tile_l, k_begin, k_count, store_l = tile_l_raw, 0, k_tile_total, tile_l_raw
        if cutlass.const_expr(self.SPLIT_K > 1):
            tile_l = tile_l_raw % num_l
            k_begin = (tile_l_raw // num_l) * k_per_split
            k_count = self.k_tiles_of(tile_l_raw, k_tile_total, num_l)
            # the fix-up sums into the output's own L; the reduce kernel reads split-major partials
            if cutlass.const_expr(self.FIXUP):
                store_l = tile_l
        return Work(tile_m, tile_n, tile_l, tile_l_raw, k_begin, k_count, store_l)

    # ---- device: stream-K ----
    @cute.jit
    def stream_k_walk(self, num_m, num_n, num_l, k_tile_total):
        cm, cn = self.CLUSTER_MN
        clusters_m = (num_m + self.TILE_MNK[0] * cm - 1) // (self.TILE_MNK[0] * cm)
        clusters_n = (num_n + self.TILE_MNK[1] * cn - 1) // (self.TILE_MNK[1] * cn)
        tiles = clusters_m * clusters_n * num_l
        grid = cute.arch.grid_dim()[2]
        cluster = cute.arch.block_idx()[2]
        dp_waves = cutlass.max(tiles // grid - cutlass.min(tiles % grid, 1), 0)
        dp_tiles = dp_waves * grid
        dp_iters = dp_waves * k_tile_total
        share = (tiles - dp_tiles) * k_tile_total // grid
        extra = (tiles - dp_tiles) * k_tile_total % grid
        begin = cluster * share + cutlass.min(cluster, extra)
        end = (cluster + 1) * share + cutlass.min(cluster + 1, extra)
        return StreamK(clusters_m, clusters_n, grid, cluster, dp_tiles, dp_iters, share, extra, begin, end,
                       dp_iters + end - begin)

    @cute.jit
    def stream_k_work(self, sk_v, sk, cluster_coord, k_tile_total):
        """This cluster's iteration sk_v starts a piece of cluster tile sk_tile (M fastest, then N, then L): a
        whole tile in the data-parallel waves, else a run of stream-K iteration sk_it to the tile's last
        k-tile or to the end of this cluster's share."""
        in_dp = cutlass.min(cutlass.max(sk.dp_iters - sk_v, 0), 1)
        sk_it = sk.begin + cutlass.max(sk_v - sk.dp_iters, 0)
        sk_tile = (in_dp * (sk.cluster + sk_v // k_tile_total * sk.grid)
                   + (1 - in_dp) * (sk.dp_tiles + sk_it // k_tile_total))
        k_begin = (1 - in_dp) * (sk_it % k_tile_total)
        k_count = in_dp * k_tile_total + (1 - in_dp) * cutlass.min(k_tile_total - k_begin, sk.end - sk_it)
        tile_m = sk_tile % sk.clusters_m * self.CLUSTER_MN[0] + cluster_coord[0]
        tile_n = sk_tile // sk.clusters_m % sk.clusters_n * self.CLUSTER_MN[1] + cluster_coord[1]
        tile_l = sk_tile // (sk.clusters_m * sk.clusters_n)
        if cutlass.const_expr(self.REORDERS):
            tile_m, tile_n = self.swizzled_tile(tile_m, tile_n, sk.clusters_m, sk.clusters_n)
        return Work(tile_m, tile_n, tile_l, tile_l, k_begin, k_count, tile_l, sk_tile, sk_it)
