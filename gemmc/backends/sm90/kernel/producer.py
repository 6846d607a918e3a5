"""Producer of the SM90 kernel: one warp of the producer warpgroup loads A and B with TMA (multicast across the
cluster) into the shared-memory ring, in the consumers' work order, and under PDL warms L2 and lets the next
kernel launch. Grouped: B's tiles of the work's group; a contiguous group's A tiles from its first row.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

# the L2 cache policy words of TMA's cache hints, per eviction priority (createpolicy's fractional encoding,
# fraction 1.0: every line the copy touches; the words CUTLASS's CacheHintSm90 names)
L2_POLICY_WORDS = {"first": 0x12F0000000000000, "normal": 0x1000000000000000, "last": 0x14F0000000000000}
L2_EVICT_FIRST = L2_POLICY_WORDS["first"]


class Producer:
    """Producer methods of Sm90Gemm (facts on self)."""

    @cute.jit
    def prefetch_first_tile(self, tma_a, tAgA, tma_b, tBgB, work):
        """PDL: before waiting for the previous grid, warm L2 with this CTA's first k-tiles (of A and B, or of the
        weights alone: PDL_PREFETCH_A/B). A prefetch only fills L2, the point of coherence, so it is safe even if
        the previous kernel writes them."""
        with cute.arch.elect_one():
            for kt in range(cutlass.min(work.k_count, self.PDL_PREFETCH_K_TILES)):
                if cutlass.const_expr(self.PDL_PREFETCH_A):
                    cute.prefetch(tma_a, tAgA[(None, work.tile_m, work.k_begin + kt, work.tile_l)])
                if cutlass.const_expr(self.PDL_PREFETCH_B):
                    cute.prefetch(tma_b, tBgB[(None, work.tile_n, work.k_begin + kt, work.tile_l)])
                    if cutlass.const_expr(self.GATED):    # the up rows (gated B's l = 1)
                        cute.prefetch(tma_b, tBgB[(None, work.tile_n, work.k_begin + kt, 1)])

    @cute.jit
    def l2_policies(self, num_m, num_n):
        """The cache policy words of A's and B's loads. first_once: an operand whose every tile this grid loads
        once (one tile, or one cluster, across the other extent: decode weights) streams through L2 evict-first;
        first, normal, last: that priority on every load; 0 (no policy chosen) otherwise."""
        a_policy = cutlass.Int64(0)
        b_policy = cutlass.Int64(0)
        if cutlass.const_expr(self.A_L2_POLICY == "first_once"):
            if (num_n + self.TILE_MNK[1] - 1) // self.TILE_MNK[1] <= self.CLUSTER_MN[1]:
                a_policy = cutlass.Int64(L2_EVICT_FIRST)
        if cutlass.const_expr(self.A_L2_POLICY in L2_POLICY_WORDS):
            a_policy = cutlass.Int64(L2_POLICY_WORDS[self.A_L2_POLICY])
        if cutlass.const_expr(self.B_L2_POLICY == "first_once"):
            if (num_m + self.TILE_MNK[0] - 1) // self.TILE_MNK[0] <= self.CLUSTER_MN[0]:
                b_policy = cutlass.Int64(L2_EVICT_FIRST)
        if cutlass.const_expr(self.B_L2_POLICY in L2_POLICY_WORDS):
            b_policy = cutlass.Int64(L2_POLICY_WORDS[self.B_L2_POLICY])
        return a_policy, b_policy

    @cute.jit
    def load_tile(self, ab_pipeline, load_state, work, tma_a, tAgA, tAsA, a_mcast_mask, a_policy,
                  tma_b, tBgB, tBsB, b_mcast_mask, b_policy):
        """One tile's k-tiles: wait for an empty stage, load A and B (multicast), arm its full barrier. Gated:
        B's gate tile (l = 0) into smem stage 2s, its up tile (l = 1) into 2s + 1."""
        b_l, up_l = work.tile_l, 1
        if cutlass.const_expr(self.GROUPED):      # the group's weight (gated: its gate at 2g, its up at 2g + 1)
            b_l = work.group * (2 if self.GATED else 1)
            up_l = b_l + 1
        tAgA_t = tAgA[(None, work.tile_m, None, work.tile_l)]
        tBgB_t = tBgB[(None, work.tile_n, None, b_l)]
        tBgB_up = tBgB[(None, work.tile_n, None, up_l)] if self.GATED else None
        for kt in range(work.k_count):
            ab_pipeline.producer_acquire(load_state)
            full_barrier = ab_pipeline.producer_get_barrier(load_state)
            cute.copy(tma_a, tAgA_t[(None, work.k_begin + kt)], tAsA[(None, load_state.index)],
                      tma_bar_ptr=full_barrier, mcast_mask=a_mcast_mask, cache_policy=a_policy)
            if cutlass.const_expr(self.GATED):
                cute.copy(tma_b, tBgB_t[(None, work.k_begin + kt)], tBsB[(None, 2 * load_state.index)],
                          tma_bar_ptr=full_barrier, mcast_mask=b_mcast_mask, cache_policy=b_policy)
                cute.copy(tma_b, tBgB_up[(None, work.k_begin + kt)], tBsB[(None, 2 * load_state.index + 1)],
                          tma_bar_ptr=full_barrier, mcast_mask=b_mcast_mask, cache_policy=b_policy)
            else:
                cute.copy(tma_b, tBgB_t[(None, work.k_begin + kt)], tBsB[(None, load_state.index)],
                          tma_bar_ptr=full_barrier, mcast_mask=b_mcast_mask, cache_policy=b_policy)
            ab_pipeline.producer_commit(load_state)
            load_state.advance()
        return load_state

    def group_a_tiles(self, tma_a, work, a_rows):
        """Contiguous groups: A's TMA tiles counted from the work's group's first row (the one descriptor's
        coordinates offset by it; rows past the group are read, and reach only rows the store skips)."""
        mA_mkl, sA, cluster_coord = a_rows
        gA = cute.local_tile(cute.domain_offset((work.row0, 0, 0), mA_mkl), (self.TILE_MNK[0], self.TILE_MNK[2]),
                             (None, None, None))
        _, tAgA = cpasync.tma_partition(tma_a, cluster_coord[1], cute.make_layout(self.CLUSTER_MN[1]),
                                        cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        return tAgA

    @cute.jit
    def produce(self, ab_pipeline, walk, num_m, num_n, pdl_banded, tma_a, tAgA, tAsA, a_mcast_mask,
                tma_b, tBgB, tBsB, b_mcast_mask, a_rows):
        """The producer warp's loop over this CTA's work, in the consumers' order. a_rows: contiguous groups'
        (A's coordinate tensor, its smem, the cluster coordinate), else ()."""
        load_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.AB_STAGES)
        a_policy, b_policy = self.l2_policies(num_m, num_n)
        position = walk.start
        while position < walk.limit:
            work = self.work_at(position, walk)
            tAgA_work = tAgA
            if cutlass.const_expr(len(a_rows) > 0):
                tAgA_work = self.group_a_tiles(tma_a, work, a_rows)
            load_state = self.load_tile(ab_pipeline, load_state, work, tma_a, tAgA_work, tAsA, a_mcast_mask,
                                        a_policy, tma_b, tBgB, tBsB, b_mcast_mask, b_policy)
            position = self.next_position(position, walk, work)
        self.finish_loads(ab_pipeline, load_state, pdl_banded)

    @cute.jit
    def finish_loads(self, ab_pipeline, load_state, pdl_banded):
        """PDL: let the next kernel launch before this grid ends; its CTAs wait in griddepcontrol.wait until
        this grid has completed. Grids in the bands do it once their last load is issued, the others once
        their last stage is released. (Under split_k_mode serial the reduce kernel was let in at the start.)"""
        if cutlass.const_expr(self.PDL and not self.REDUCE_KERNEL):
            if pdl_banded:
                cute.arch.griddepcontrol_launch_dependents()
        ab_pipeline.producer_tail(load_state)
        if cutlass.const_expr(self.PDL and not self.REDUCE_KERNEL):
            if not pdl_banded:
                cute.arch.griddepcontrol_launch_dependents()
