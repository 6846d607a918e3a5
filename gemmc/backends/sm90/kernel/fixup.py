"""In-kernel sums of split tiles' f32 partials: the split-K fix-up (split_k_mode fixup) and stream-K's.

Every piece of a split tile publishes its f32 partial to the workspace in register-fragment order (coalesced:
float4 c of thread t of a partial unit at (unit * chunks + c) * threads + t), then counts its arrival on the
tile's semaphore (acquire-release). The last piece to arrive sums the tile's partials in a fixed order (split
order; cluster order under stream-K), so the sum is the same whichever piece finishes last, resets the
semaphore for the next launch, and runs the epilogue; the others skip it.

Tiles are counted over whole clusters (the scheduler's padded grid): params_of in emit.py sizes the workspace
and the semaphores from the same count. Under stream-K each cluster has at most two split pieces (its share's
first and last): piece j of cluster c has the workspace unit (2c + j) * cluster size + CTA rank, and a tile's
pieces belong to the clusters owning its first and last stream-K iterations and those between:
owner(i) = min(i // (q + 1), r) + max(i - r(q + 1), 0) // q.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute


class Fixup(NamedTuple):
    tiles_m: object         # tiles per cluster-padded column and row of the tile grid
    tiles_n: object
    chunks: int             # float4s of a thread's accumulators
    acc: object             # the accumulators as (4, chunks)
    copy: object            # 128-bit copy atom
    incoming: object        # one float4 of another piece's partial
    arrivals: object        # smem: the arrival count each group saw


class PartialSums:
    """Fix-up methods of Sm90Gemm (facts on self)."""

    def fixup_setup(self, num_m, num_n, accumulators, storage):
        if cutlass.const_expr(not self.SUMS_PARTIALS):
            return None
        tiles_m, tiles_n = self.padded_tiles(num_m, num_n)
        chunks = cute.size(accumulators) // 4
        return Fixup(tiles_m, tiles_n, chunks, cute.make_tensor(accumulators.iterator, cute.make_layout((4, chunks))),
                     cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128),
                     cute.make_rmem_tensor((4,), cutlass.Float32),
                     storage.fixup_flags.get_tensor(cute.make_layout(2)))

    def padded_tiles(self, num_m, num_n):
        """Tiles per column and row of the tile grid, rounded up to whole clusters."""
        tm, tn, _ = self.TILE_MNK
        cm, cn = self.CLUSTER_MN
        return ((num_m + tm - 1) // tm + cm - 1) // cm * cm, ((num_n + tn - 1) // tn + cn - 1) // cn * cn

    def tile_index(self, work, fix):
        return (work.tile_l * fix.tiles_n + work.tile_n) * fix.tiles_m + work.tile_m

    @cute.jit
    def publish_partial(self, unit, fx_tile, fix, group, scratch):
        """This group's accumulators, as float4s, to workspace unit `unit`; then one thread counts the arrival on
        tile fx_tile's semaphore into the group's arrivals slot."""
        mWS, mSem = scratch
        mine = cute.make_tensor(
            mWS.iterator + cute.assume((unit * fix.chunks * group.threads + group.tidx) * 4, divby=4),
            cute.make_layout((4, fix.chunks), stride=(1, 4 * group.threads)))
        cute.copy(fix.copy, fix.acc, mine)
        group.barrier.arrive_and_wait()
        arrivals = fix.arrivals
        if group.tidx == 0:
            # release: the group's partial stores (ordered by the barrier) before the count
            cute.arch.fence_acq_rel_gpu()
            arrivals[group.slot] = cute.arch.atomic_add(
                mSem.iterator + fx_tile, cutlass.Int32(1), sem="acq_rel", scope="gpu")
        group.barrier.arrive_and_wait()

    @cute.jit
    def add_partial(self, unit, c, fix, group, mWS):
        """Add float4 c of workspace unit `unit` to the accumulators."""
        cute.copy(fix.copy, cute.make_tensor(
            mWS.iterator + cute.assume(((unit * fix.chunks + c) * group.threads + group.tidx) * 4, divby=4),
            cute.make_layout(4)), fix.incoming)
        acc = fix.acc
        for j in cutlass.range_constexpr(4):
            acc[j, c] = acc[j, c] + fix.incoming[j]

    @cute.jit
    def clear_chunk(self, c, fix):
        acc = fix.acc
        for j in cutlass.range_constexpr(4):
            acc[j, c] = cutlass.Float32(0.0)

    @cute.jit
    def split_k_fixup(self, work, walk, fix, group, scratch, accumulators):
        """Split-K: publish this split's partial (unit tile * SPLIT_K + split) and count it; the last split sums
        all SPLIT_K. Returns whether this is the last."""
        mWS, mSem = scratch
        split = work.tile_l_raw // walk.num_l
        fx_tile = self.tile_index(work, fix)
        self.publish_partial(fx_tile * self.SPLIT_K + split, fx_tile, fix, group, scratch)
        is_last = fix.arrivals[group.slot] == self.SPLIT_K - 1
        if is_last:
            for c in cutlass.range_constexpr(fix.chunks):
                self.clear_chunk(c, fix)
                for s in cutlass.range_constexpr(self.SPLIT_K):
                    self.add_partial(fx_tile * self.SPLIT_K + s, c, fix, group, mWS)
            if group.tidx == 0:
                mSem[fx_tile] = cutlass.Int32(0)
        return is_last

    def owners(self, first, sk, k_tile_total):
        """The first and last clusters owning a split tile's iterations, its first being stream-K iteration
        `first`: owner(i) = min(i // (q + 1), r) + max(i - r(q + 1), 0) // q."""
        return (cutlass.min(first // (sk.share + 1), sk.extra)
                + cutlass.max(first - sk.extra * (sk.share + 1), 0) // sk.share,
                cutlass.min((first + k_tile_total - 1) // (sk.share + 1), sk.extra)
                + cutlass.max(first + k_tile_total - 1 - sk.extra * (sk.share + 1), 0) // sk.share)

    @cute.jit
    def stream_k_fixup(self, work, walk, fix, group, scratch, accumulators):
        """Stream-K: a piece of a split tile publishes its partial and counts its arrival; the last piece to
        arrive sums the tile's partials in cluster order. Returns whether this piece runs the epilogue."""
        mWS, mSem = scratch
        sk = walk.sk
        k_tile_total = walk.k_tile_total
        cta_size = self.CLUSTER_MN[0] * self.CLUSTER_MN[1]
        is_last = work.k_count == k_tile_total
        if work.k_count < k_tile_total:
            first = (work.sk_tile - sk.dp_tiles) * k_tile_total
            owner_first, owner_last = self.owners(first, sk, k_tile_total)
            # this piece is its cluster's first (j = 0) unless the share began in an earlier tile (j = 1)
            unit = (sk.cluster * 2 + cutlass.min(work.sk_it - sk.begin, 1)) * cta_size + walk.cta_rank
            fx_tile = self.tile_index(work, fix)
            self.publish_partial(unit, fx_tile, fix, group, scratch)
            is_last = fix.arrivals[0] == owner_last - owner_first
            if is_last:
                for c in cutlass.range_constexpr(fix.chunks):
                    self.clear_chunk(c, fix)
                for owner in range(owner_first, owner_last + 1):
                    owner_begin = owner * sk.share + cutlass.min(owner, sk.extra)
                    owner_unit = (owner * 2 + cutlass.min(cutlass.max(first - owner_begin, 0), 1)) * cta_size \
                        + walk.cta_rank
                    for c in cutlass.range_constexpr(fix.chunks):
                        self.add_partial(owner_unit, c, fix, group, mWS)
                if group.tidx == 0:
                    mSem[fx_tile] = cutlass.Int32(0)
        return is_last
