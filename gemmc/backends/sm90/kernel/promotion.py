"""Block-scaled fp8 main loop of the SM90 kernel (SCALING "block", DeepSeek-V3's scales).

A is scaled per 1 x 128 block (sa: M x ceil(K/128)), B per 128 x 128 block (sb: ceil(N/128) x ceil(K/128)), and
the tile K is the block's 128, so each k-tile has one scale per row of A and one for the tile's columns (the
predicate keeps the tile N a divisor of 128). Per k-tile the consumers run the WGMMA chain into a second
accumulator, started afresh (ACCUMULATE off for the first k-block), wait for it, release the stage, and
promote: acc += tile_acc * sa[m, kt] * sb[n // 128, kt], in f32. So the fp8 MMA's reduced-precision sum never
spans more than one block, and the f32 sum carries the rest (the split-K fix-up and stream-K then sum promoted,
already-scaled partials).

The scales are read from global memory by each consumer thread, for the rows it holds (the coordinates of its
accumulator elements, rows clamped into the problem like the epilogue's), before it waits for the k-tile's
stage, so the loads overlap the wait and the MMA; elements of one row read one address, which the compiler
loads once (two rows per thread per 64-row WGMMA).

Grouped (GROUPED), the scales are read where the group's operands are (`scale_coords`): A's at the group's rows
(contiguous: its first row plus the tile's row, in A's (M, Kb) scales; masked: the tile's row in group g's
(M, Kb) plane), B's in expert g's (Nb, Kb) block grid. The host views both as (rows, Kb, L), L the groups where
the scales have them (else 1), so one index serves every layout.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from gemmc.spec import SCALE_BLOCK     # absolute: scripts load edited copies of these modules elsewhere


class Promotion(NamedTuple):
    """What the promoting main loop reads besides the MMA fragments: the k-tile's WGMMA accumulator, the scales
    (A's as (M, Kb, L), B's as (Nb, Kb, L): L a grouped GEMM's groups where its scales have them, else 1), and
    the coordinates of this thread's accumulator elements."""
    tile_acc: object
    sa: object
    sb: object
    coords: object          # (tile M, tile N, L) identity tensor, partitioned for this thread's tile later
    thr_mma: object         # this thread's slice of the tiled MMA
    num_m: object


class PromotingMainLoop:
    """Block-scaled main-loop methods of Sm90Gemm (facts on self)."""

    @cute.jit
    def promoting_mma_tile(self, ab_pipeline, read_state, release_state, work, tiled_mma, accumulators, tCrA, tCrB,
                           promo: Promotion):
        """One tile's main loop with a promotion per k-tile (module doc). Both stage counters advance together:
        each stage is released as soon as its WGMMAs completed."""
        accumulators.fill(0.0)
        tile_acc = promo.tile_acc
        num_k_blocks = cute.size(tCrA, mode=[2])
        tCcC = promo.thr_mma.partition_C(promo.coords[(None, None, work.tile_m, work.tile_n, work.tile_l)])
        where = self.scale_coords(work, cute.size(promo.sb, mode=[0]))
        for kt in range(work.k_count):
            # this k-tile's scales, one factor per accumulator element: read before the wait
            factors = self.block_scale_factors(promo, tCcC, where, work.k_begin + kt, cute.size(accumulators))
            ab_pipeline.consumer_wait(read_state)
            warpgroup.fence()
            tiled_mma.set(warpgroup.Field.ACCUMULATE, False)    # the k-tile's sum starts afresh
            for kb in cutlass.range_constexpr(num_k_blocks):
                cute.gemm(tiled_mma, tile_acc, tCrA[(None, None, kb, read_state.index)],
                          tCrB[(None, None, kb, read_state.index)], tile_acc)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            ab_pipeline.consumer_release(release_state)
            read_state.advance()
            release_state.advance()
            self.promote(accumulators, tile_acc, factors)
        return read_state, release_state

    # plain Python (not cute.jit): their loops unroll at trace time into straight-line code, as the epilogue DAG's
    def scale_coords(self, work, n_blocks):
        """Where `work`'s tile reads its scales: (A's row of the tile's row 0, A's L, B's scale block, B's L). B's
        block is the tile's columns' (clamped: a cluster's padding tiles lie past N, their A rows past M or their B
        rows past N load zeros). Grouped, A's rows count from the group's first row (contiguous; 0 when masked)
        in A's L (the group when masked, else 0), B's block grid is the group's."""
        n_block = cutlass.min(work.tile_n * self.TILE_MNK[1] // SCALE_BLOCK, n_blocks - 1)
        if cutlass.const_expr(self.GROUPED):
            return work.row0, work.tile_l, n_block, work.group
        return 0, 0, n_block, 0

    def block_scale_factors(self, promo: Promotion, tCcC, where, k_tile, count: int) -> list:
        """sa[row0 + m, k_tile, a_l] * sb[n_block, k_tile, b_l] for each of this thread's `count` accumulator
        elements, m its row in the tile's frame (clamped into the problem: rows past M hold zeros); `where` is
        scale_coords'."""
        row0, a_l, n_block, b_l = where
        sb = cutlass.Float32(promo.sb[(n_block, k_tile, b_l)])
        return [cutlass.Float32(promo.sa[(cutlass.min(row0 + tCcC[ei][0], promo.num_m - 1), k_tile, a_l)]) * sb
                for ei in range(count)]

    def promote(self, accumulators, tile_acc, factors) -> None:
        """accumulators += tile_acc * factors, element by element, in f32."""
        for ei in range(cute.size(accumulators)):
            accumulators[ei] = accumulators[ei] + tile_acc[ei] * factors[ei]
