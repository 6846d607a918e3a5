"""Consumer of the SM90 kernel: the WGMMA main loop of the consumer warpgroups over this CTA's work, each tile
followed by its split-K / stream-K fix-up (where the kernel sums partials) and its epilogue.

Cooperative: both warpgroups walk every tile, each owning half of it. Ping-pong: warpgroup c takes work
units c, c + 2, ...; ordered named barriers (ids 3/4 main loop, 5/6 epilogue) hand the tensor cores and the
store path back and forth, and the stage counters skip the other warpgroup's k-tiles. Under the fix-up or
stream-K, the epilogue and store of a split tile run only in its last piece to arrive.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import warpgroup


class Group(NamedTuple):
    """The consumer warpgroup(s) sharing one epilogue: a warpgroup under ping-pong, both when cooperative."""
    wg: object              # this consumer warpgroup (0 or 1)
    tidx: object            # this thread's index in the group
    threads: int
    barrier: object         # named barrier of the group's epilogue
    store_warp: object      # whether this warp issues the group's TMA stores
    slot: object            # the group's slot in shared per-group scratch (fix-up arrival counts, load barriers)


class Consumer:
    """Consumer methods of Sm90Gemm (facts on self)."""

    def consumer_tidx(self, tidx):
        """This thread's index in its consumer group (a warpgroup under ping-pong, both when cooperative)."""
        return tidx % 128 if cutlass.const_expr(self.PINGPONG) else tidx - 128

    def consumer_group(self, consumer_tidx, warp_idx, warp_group_idx, consumer_wg):
        threads = 128 if cutlass.const_expr(self.PINGPONG) else 128 * self.NUM_CONSUMER_WG
        slot = consumer_wg if cutlass.const_expr(self.PINGPONG) else 0
        barrier = pipeline.NamedBarrier(barrier_id=1 + slot, num_threads=threads)
        store_warp = warp_idx == (warp_group_idx * 4 if cutlass.const_expr(self.PINGPONG) else 4)
        return Group(consumer_wg, consumer_tidx, threads, barrier, store_warp, slot)

    @cute.jit
    def skip_stages(self, unit, walk, read_state, release_state):
        """Ping-pong: step both stage counters past the k-tiles of work unit `unit` (the other warpgroup's)."""
        if cutlass.const_expr(self.GROUPED):     # every grouped unit is a whole tile
            if unit < walk.limit:
                for _ in range(walk.k_tile_total):
                    read_state.advance()
                    release_state.advance()
        else:
            work_units, fast_clusters, slow_clusters = walk.sched
            if unit < work_units:
                for _ in range(self.k_tiles_of(self.work_tile(unit, fast_clusters, slow_clusters)[2],
                                               walk.k_tile_total, walk.num_l)):
                    read_state.advance()
                    release_state.advance()
        return read_state, release_state

    @cute.jit
    def mma_tile(self, ab_pipeline, read_state, release_state, k_count, tiled_mma, accumulators, up_accumulators,
                 tCrA, tCrB):
        """The WGMMA main loop of one tile: wait for a full stage, MMA over its k-blocks, release the previous
        stage. Gated: the stage's gate tile (smem stage 2s) into `accumulators`, its up tile (2s + 1) into
        `up_accumulators`."""
        accumulators.fill(0.0)
        if cutlass.const_expr(self.GATED):
            up_accumulators.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.fence()
        num_k_blocks = cute.size(tCrA, mode=[2])
        for kt in range(k_count):
            ab_pipeline.consumer_wait(read_state)
            warpgroup.fence()   # order this batch after the previous one's register use
            for kb in cutlass.range_constexpr(num_k_blocks):
                if cutlass.const_expr(self.GATED):
                    cute.gemm(tiled_mma, accumulators, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, 2 * read_state.index)], accumulators)
                    cute.gemm(tiled_mma, up_accumulators, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, 2 * read_state.index + 1)], up_accumulators)
                else:
                    cute.gemm(tiled_mma, accumulators, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, read_state.index)], accumulators)
            warpgroup.commit_group()
            # keep one WGMMA batch in flight; the stage it read before is now free
            warpgroup.wait_group(1)
            if kt > 0:
                ab_pipeline.consumer_release(release_state)
                release_state.advance()
            read_state.advance()
        warpgroup.wait_group(0)
        if k_count > 0:
            ab_pipeline.consumer_release(release_state)
            release_state.advance()
        return read_state, release_state

    def gate_accumulators(self, accumulators, up_accumulators):
        """Gated: accumulators <- gate_function(gate, up), element by element in f32 (straight-line code, as the
        epilogue DAG's)."""
        for ei in range(cute.size(accumulators)):
            accumulators[ei] = self.gate_function(cutlass.Float32(accumulators[ei]),
                                                  cutlass.Float32(up_accumulators[ei]))

    @cute.jit
    def consume(self, ab_pipeline, walk, thread, storage, tiled_mma, accs, thr_mma_c, tCrA, tCrB, gC, cC_mnl, sC,
                c_args, out_mnl, scratch, inputs, staged, num_m, num_n):
        """The consumer warpgroups' loop over this CTA's work. thread: (index in the consumer group, warp,
        warpgroup, consumer warpgroup); accs: the accumulators, a gated kernel's up accumulators, and a
        block-scaled kernel's Promotion (None where the kernel has none)."""
        consumer_tidx, warp_idx, warp_group_idx, consumer_wg = thread
        accumulators, up_accumulators, promo = accs
        position = walk.start
        stores = self.store_setup(tiled_mma, accumulators, sC, consumer_tidx)
        group = self.consumer_group(consumer_tidx, warp_idx, warp_group_idx, consumer_wg)
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=self.EPI_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, group.threads))

        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.AB_STAGES)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.AB_STAGES)
        turns = ()
        if cutlass.const_expr(self.PINGPONG):
            # warpgroup 1 opens both turns for warpgroup 0 first
            mma_turn = pipeline.NamedBarrier(barrier_id=3 + consumer_wg, num_threads=256)
            mma_next = pipeline.NamedBarrier(barrier_id=4 - consumer_wg, num_threads=256)
            epi_turn = pipeline.NamedBarrier(barrier_id=5 + consumer_wg, num_threads=256)
            epi_next = pipeline.NamedBarrier(barrier_id=6 - consumer_wg, num_threads=256)
            turns = (mma_turn, mma_next, epi_turn, epi_next)
            if consumer_wg == 1:
                mma_next.arrive()
                epi_next.arrive()
                # work unit 0 belongs to warpgroup 0: skip its stages
                read_state, release_state = self.skip_stages(position, walk, read_state, release_state)
                position = position + walk.step
        num_tiles_done = 0
        epi_loads = self.epilogue_load_setup(storage, staged, group)
        epi_phase = cutlass.Int32(0)
        fix = self.fixup_setup(num_m, num_n, accumulators, storage)
        # a method called on a name inside the loop makes the DSL carry that name through it: not `group`,
        # whose Python ints must stay static
        epi_barrier = group.barrier
        while position < walk.limit:
            work = self.work_at(position, walk)
            gC_t = gC[(None, None, work.tile_m, work.tile_n, work.store_l)]
            if cutlass.const_expr(self.PINGPONG):
                turns[0].arrive_and_wait()
            if cutlass.const_expr(self.BLOCK_SCALED):
                read_state, release_state = self.promoting_mma_tile(ab_pipeline, read_state, release_state, work,
                                                                    tiled_mma, accumulators, tCrA, tCrB, promo)
            else:
                read_state, release_state = self.mma_tile(ab_pipeline, read_state, release_state, work.k_count,
                                                          tiled_mma, accumulators, up_accumulators, tCrA, tCrB)
            if cutlass.const_expr(self.PINGPONG):
                turns[1].arrive()
                # skip the stages of the other warpgroup's next tile
                position = position + walk.step
                read_state, release_state = self.skip_stages(position, walk, read_state, release_state)
            if cutlass.const_expr(self.GATED):
                self.gate_accumulators(accumulators, up_accumulators)
            is_last = True
            if cutlass.const_expr(self.FIXUP):
                is_last = self.split_k_fixup(work, walk, fix, group, scratch, accumulators)
            if cutlass.const_expr(self.STREAM_K):
                is_last = self.stream_k_fixup(work, walk, fix, group, scratch, accumulators)
            staged_parts = self.epilogue_prologue(work, thr_mma_c, cC_mnl, stores, epi_loads, num_m, num_n,
                                                  accumulators, inputs, is_last)
            if cutlass.const_expr(self.PINGPONG):
                turns[2].arrive_and_wait()
            if cutlass.const_expr(self.SUMS_PARTIALS):
                if is_last:
                    epi_phase = self.store_tile(work, gC_t, sC, c_args, out_mnl, stores, store_pipeline, group,
                                                thr_mma_c, cC_mnl, accumulators, num_tiles_done, epi_loads,
                                                staged_parts, epi_phase, inputs, num_m, num_n)
                    num_tiles_done += 1
            else:
                epi_phase = self.store_tile(work, gC_t, sC, c_args, out_mnl, stores, store_pipeline, group,
                                            thr_mma_c, cC_mnl, accumulators, num_tiles_done, epi_loads,
                                            staged_parts, epi_phase, inputs, num_m, num_n)
            if cutlass.const_expr(self.PINGPONG):
                # the other warpgroup reuses the C buffers: drain this tile's TMA stores first
                if group.store_warp:
                    store_pipeline.producer_tail()
                epi_barrier.arrive_and_wait()
                turns[3].arrive()
            if cutlass.const_expr(not self.SUMS_PARTIALS):
                num_tiles_done += 1
            position = self.next_position(position, walk, work)
        store_pipeline.producer_tail()
