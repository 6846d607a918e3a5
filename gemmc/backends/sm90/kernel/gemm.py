"""The SM90 GEMM kernel: a persistent, warp-specialized TMA + WGMMA kernel, parameterised by one KernelFacts.

`Sm90Gemm(facts, epilogue_dag, reduce_partials)` is what a generated module builds; calling it inside the
module's @cute.jit entry builds the host side (views, TMA atoms, scheduler arguments, shared storage) and
launches the kernel, then the split-K reduce kernel under split_k_mode serial. The kernel's roles live in
their own modules: scheduler.py (which tile, which k-tiles), producer.py (TMA into the smem ring),
consumer.py (WGMMA main loop), fixup.py (in-kernel sums of split tiles), epilogue.py (DAG and store).

Where the facts say PDL, launches are programmatic dependent launches: the kernel's prologue (barrier init,
descriptor prefetch, an L2 prefetch of its first PDL_PREFETCH_K_TILES k-tiles) overlaps the previous kernel
on the stream, and it waits on the grid dependency before it loads into shared memory or stores; near its
end, its producer lets the next kernel launch (PDL_EARLY_CTAS and PDL_FULL_CTAS say when).
Swapped A and B (SWAP_AB): the kernel computes out^T = b @ a^T; the entry hands it b as A, a as B, and it
views out transposed.
Gated (GATED): B is [gate; up] (2N x K), viewed as (N, K, 2); each stage holds a gate and an up tile of B
(smem stages 2s and 2s + 1), the consumers run one WGMMA chain into each of two accumulators, and
gate_function(gate, up) combines them in registers before the epilogue.
Grouped (GROUPED): B is E x N x K, viewed as (N, K, E) ((N, K, (2, E)) gated); A and the output are M x . (contiguous)
or E x M x . (masked, viewed with L = E); groups.py maps work units to groups from the offsets or counts, read
on the device after the grid dependency. A contiguous group's A tiles are taken at its first row (a domain
offset of the one descriptor's coordinates); the output is stored from registers, row-predicated.
fp8 (MMA_INST_K 32): the fp8 WGMMA. Per tensor and per row the scales are epilogue inputs; per block
(BLOCK_SCALED) the consumers promote each k-tile's WGMMA accumulator into the f32 one times its block scales
(promotion.py), the scales passed as block_scales; grouped, at the group's rows and its weight's blocks.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync, warpgroup

from .consumer import Consumer
from .epilogue import Epilogue
from .facts import KernelFacts
from .fixup import PartialSums
from .groups import GroupScheduler
from .producer import Producer
from .promotion import PromotingMainLoop, Promotion
from .scheduler import TileScheduler


def smem_layout(atom_kind, dtype, shape_2d, stages, major_is_k):
    """Swizzled smem layout of `stages` copies of a 2-D tile (major_is_k: mode 1 contiguous)."""
    atom = warpgroup.make_smem_layout_atom(atom_kind, dtype)
    return cute.tile_to_shape(atom, cute.append(shape_2d, stages), order=(0, 1, 2) if major_is_k else (1, 0, 2))


class Sm90Gemm(TileScheduler, GroupScheduler, Producer, Consumer, PromotingMainLoop, PartialSums, Epilogue):
    def __init__(self, facts: KernelFacts, epilogue_dag=None, reduce_partials=None, gate_function=None):
        """epilogue_dag: the generated f32 function of one accumulator element (None: a plain store and cast);
        reduce_partials: the generated host function launching the split-K reduce kernel (REDUCE_KERNEL);
        gate_function: a gated kernel's f32 combine of one gate and one up accumulator element (GATED)."""
        # the facts, and what they imply (KernelFacts' properties), as attributes the role modules read
        for name in dir(facts):
            if name.isupper():
                setattr(self, name, getattr(facts, name))
        self.facts = facts
        self.epilogue_dag = epilogue_dag
        self.reduce_partials = reduce_partials
        self.gate_function = gate_function

    # ==== host ===================================================================================
    def gated_view(self, b):
        """A gated kernel's B, [gate; up] of 2N x K, as (N, K, 2): the gate rows at l = 0, the up rows at l = 1.
        Grouped, E x 2N x K as (N, K, (2, E)): group g's gate rows at l = 2g, its up rows at 2g + 1."""
        if cutlass.const_expr(self.GROUPED):
            n = cute.size(b, mode=[1]) // 2
            row = b.layout.stride[1]
            shape = (n, cute.size(b, mode=[2]), (2, cute.size(b, mode=[0])))
            return cute.make_tensor(b.iterator, cute.make_layout(shape, stride=(row, 1, (n * row, b.layout.stride[0]))))
        n = cute.size(b, mode=[0]) // 2
        row = b.layout.stride[0]
        return cute.make_tensor(b.iterator, cute.make_layout((n, cute.size(b, mode=[1]), 2),
                                                             stride=(row, 1, n * row)))

    def view(self, t, transposed: bool, batched: bool):
        """A storage-shape tensor ((L,) R, C) as (R, C, L), or (C, R, L) when transposed."""
        if cutlass.const_expr(batched):
            return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 1, 0] if transposed else [1, 2, 0]))
        if cutlass.const_expr(not transposed):
            return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1, stride=0)))
        return cute.make_tensor(t.iterator, cute.append(cute.select(t.layout, mode=[1, 0]),
                                                        cute.make_layout(1, stride=0)))

    def input_view(self, t, kind):
        """An epilogue input: row -> (N, L), col -> (M, L), full -> (M, N, L); a scalar, and a one-element
        tensor (an fp8 per-tensor scale), as it is."""
        if cutlass.const_expr(kind in ("scalar", "one")):
            return t
        if cutlass.const_expr(self.BATCHED):
            return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0] if kind in ("row", "col")
                                                            else [1, 2, 0]))
        return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1, stride=0)))

    @cute.jit
    def __call__(self, a, b, out, inputs, workspace, semaphores, groups, stream, block_scales=()):
        """a, b, out: the kernel's A (the problem's b when swapped), B and the output, in storage shape; inputs:
        the epilogue inputs (all of the plan's; the main kernel reads them unless a reduce kernel applies the
        epilogue); workspace / semaphores: the split-K scratch (None where the plan has none); groups: a grouped
        GEMM's offsets or counts (None for any other); block_scales: a block-scaled fp8 kernel's A and B scales,
        (M, Kb) and (Nb, Kb); grouped, B's (E, Nb, Kb) and, masked, A's (E, M, Kb)."""
        rows_batched = self.BATCHED or (self.GROUPED and self.GROUP_MASKED)     # A's and the output's L
        a_mkl = self.view(a, not self.A_MAJOR_IS_K, rows_batched)
        b_nkl = self.gated_view(b) if self.GATED else self.view(b, not self.B_MAJOR_IS_K,
                                                                 self.BATCHED or self.GROUPED)
        out_mnl = self.view(out, self.SWAP_AB, rows_batched)
        views = tuple(self.input_view(x, inp_kind) for x, inp_kind in zip(inputs, self.input_kinds()))
        if cutlass.const_expr(self.BLOCK_SCALED):   # (M, Kb, L) and (Nb, Kb, L): L where they have groups
            block_scales = (self.view(block_scales[0], False, rows_batched),
                            self.view(block_scales[1], False, self.GROUPED))

        tiled_mma = cute.make_tiled_mma(
            cute.make_mma_atom(self.mma_op()),
            self.MMA_ATOM_LAYOUT)
        tm, tn, tk = self.TILE_MNK
        a_smem = smem_layout(self.A_SMEM_ATOM, self.A_DTYPE, (tm, tk), self.AB_STAGES, self.A_MAJOR_IS_K)
        # gated: a gate and an up tile per stage (smem stages 2s, 2s + 1)
        b_tiles = 2 if self.GATED else 1
        b_smem = smem_layout(self.B_SMEM_ATOM, self.B_DTYPE, (tn, tk), self.AB_STAGES * b_tiles, self.B_MAJOR_IS_K)
        c_smem = smem_layout(self.C_SMEM_ATOM, self.STORE_DTYPE, self.EPI_TILE, self.EPI_STAGES, True)

        # TMA: A multicast to the CTAs of one cluster row (N extent), B to one cluster column (M extent)
        a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.A_MULTICAST > 1 else cpasync.CopyBulkTensorTileG2SOp()
        b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.B_MULTICAST > 1 else cpasync.CopyBulkTensorTileG2SOp()
        tma_a, tma_a_mkl = cpasync.make_tiled_tma_atom(
            a_op, a_mkl, cute.slice_(a_smem, (None, None, 0)), (tm, tk), num_multicast=self.A_MULTICAST)
        tma_b, tma_b_nkl = cpasync.make_tiled_tma_atom(
            b_op, b_nkl, cute.slice_(b_smem, (None, None, 0)), (tn, tk), num_multicast=self.B_MULTICAST)
        ws_mnl = None
        if cutlass.const_expr(self.REDUCE_KERNEL):
            # the flat workspace as (M, N, SPLIT_K * L), split-major in L
            m = cute.size(out_mnl, mode=[0])
            n = cute.size(out_mnl, mode=[1])
            ws_mnl = cute.make_tensor(workspace.iterator, cute.make_layout(
                (m, n, self.SPLIT_K * cute.size(out_mnl, mode=[2])), stride=(n, 1, m * n)))
        c_args = (out_mnl,)    # swapped A/B, grouped: the epilogue stores from registers (no TMA store)
        if cutlass.const_expr(not self.STORE_FROM_REGISTERS):
            tma_c, tma_c_mnl = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), ws_mnl if cutlass.const_expr(self.REDUCE_KERNEL) else out_mnl,
                cute.slice_(c_smem, (None, None, 0)), self.EPI_TILE)
            c_args = (tma_c, tma_c_mnl)

        # epilogue inputs the plan TMA-loads into smem, one epilogue sub-tile at a time
        kernel_inputs = () if cutlass.const_expr(self.REDUCE_KERNEL) else views
        staged, staged_fields = (), {}
        for inp in self.STAGED_INPUTS:
            layout = smem_layout(inp.smem_atom, inp.dtype, self.EPI_TILE, 1, True)
            tma, tma_mnl = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), kernel_inputs[self.input_index(inp)],
                cute.slice_(layout, (None, None, 0)), self.EPI_TILE)
            staged += (tma, tma_mnl, layout)
            staged_fields[f"s_{inp.name}"] = cute.struct.Align[cute.struct.MemRange[inp.dtype, cute.cosize(layout)],
                                                               1024]

        group_args = ()
        if cutlass.const_expr(self.STREAM_K):
            grid, sched = self.stream_k_grid(out_mnl, a_mkl)
        elif cutlass.const_expr(self.GROUPED):
            grid, sched = self.group_grid(out_mnl, groups)
            group_args = (groups,)
        else:
            grid, sched = self.static_grid(out_mnl)

        fields = {"ab_barriers": cute.struct.MemRange[cutlass.Int64, self.AB_STAGES * 2],
                  "sA": cute.struct.Align[cute.struct.MemRange[self.A_DTYPE, cute.cosize(a_smem)], 1024],
                  "sB": cute.struct.Align[cute.struct.MemRange[self.B_DTYPE, cute.cosize(b_smem)], 1024],
                  "sC": cute.struct.Align[cute.struct.MemRange[self.STORE_DTYPE, cute.cosize(c_smem)], 1024],
                  **staged_fields}
        if cutlass.const_expr(len(self.STAGED_INPUTS) > 0):
            fields["epi_load_barriers"] = cute.struct.MemRange[cutlass.Int64, 2]
        if cutlass.const_expr(self.SUMS_PARTIALS):
            fields["fixup_flags"] = cute.struct.MemRange[cutlass.Int32, 2]   # arrivals seen, per group
        shared_storage = cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
        scratch = (workspace, semaphores) if cutlass.const_expr(self.SUMS_PARTIALS) else ()

        self.kernel(tma_a, tma_a_mkl, tma_b, tma_b_nkl, c_args, out_mnl, tiled_mma, a_smem, b_smem, c_smem, sched,
                    shared_storage, scratch, kernel_inputs, staged, group_args, block_scales).launch(
            grid=grid, block=[self.THREADS, 1, 1], cluster=(*self.CLUSTER_MN, 1), min_blocks_per_mp=1,
            stream=stream, use_pdl=self.PDL)
        if cutlass.const_expr(self.REDUCE_KERNEL):
            # deterministic in-order sum of the partials + the epilogue, in a second kernel
            self.reduce_partials(ws_mnl, out_mnl, views, stream)

    def mma_op(self):
        """The WGMMA: fp8 (K 32; A and B each e4m3 or e5m2) or bf16/f16 (K 16)."""
        if cutlass.const_expr(self.MMA_INST_K == 32):
            return warpgroup.MmaF8Op(self.A_DTYPE, self.B_DTYPE, self.ACC_DTYPE, (*self.MMA_INST_MN, 32),
                                     warpgroup.OperandSource.SMEM, self.A_MAJOR, self.B_MAJOR)
        return warpgroup.MmaF16BF16Op(self.A_DTYPE, self.ACC_DTYPE, (*self.MMA_INST_MN, 16),
                                      warpgroup.OperandSource.SMEM, self.A_MAJOR, self.B_MAJOR)

    def input_kinds(self):
        return tuple(i.kind for i in self.EPILOGUE_INPUTS)

    def input_index(self, inp):
        return [i.name for i in self.EPILOGUE_INPUTS].index(inp.name)

    # ==== device ==================================================================================
    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA_mkl: cute.Tensor, tma_b: cute.CopyAtom, mB_nkl: cute.Tensor,
               c_args: tuple, out_mnl: cute.Tensor, tiled_mma: cute.TiledMma, a_smem: cute.ComposedLayout,
               b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout, sched: tuple,
               SharedStorage: cutlass.Constexpr, scratch: tuple, inputs: tuple, staged: tuple, group_args: tuple,
               block_scales: tuple):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group_idx = cute.arch.make_warp_uniform(tidx // 128)
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            if cutlass.const_expr(not self.STORE_FROM_REGISTERS):
                cpasync.prefetch_descriptor(c_args[0])

        # cluster position -> multicast masks (A: CTAs sharing this cluster row, B: this column)
        cta_layout_mnk = cute.make_layout((*self.CLUSTER_MN, 1))
        cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)
        a_mcast_mask = 0
        if cutlass.const_expr(self.A_MULTICAST > 1):
            a_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1)
        b_mcast_mask = 0
        if cutlass.const_expr(self.B_MULTICAST > 1):
            b_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0)

        # shared memory: the A/B ring with its full/empty mbarriers (PipelineTmaAsync), C staging
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        tma_bytes = cute.size_in_bytes(self.A_DTYPE, cute.slice_(a_smem, (None, None, 0))) + \
            cute.size_in_bytes(self.B_DTYPE, cute.slice_(b_smem, (None, None, 0))) * (2 if self.GATED else 1)
        # each consumer warp releases a stage to every CTA that multicast into it
        consumers_per_stage = 1 if cutlass.const_expr(self.PINGPONG) else self.NUM_CONSUMER_WG
        ab_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ab_barriers.data_ptr(),
            num_stages=self.AB_STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, (self.A_MULTICAST + self.B_MULTICAST - 1) * consumers_per_stage * 4),
            tx_count=tma_bytes,
            cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
            defer_sync=True,
        )
        self.init_epilogue_load_barriers(storage, tidx)
        pipeline.pipeline_init_arrive(cluster_shape_mn=self.CLUSTER_MN, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        sC = storage.sC.get_tensor(c_smem.outer, swizzle=c_smem.inner)

        # CTA tiles of the global tensors: (bM, bK, m, k, l), (bN, bK, n, k, l), (bM, bN, m, n, l)
        tm, tn, tk = self.TILE_MNK
        gA = cute.local_tile(mA_mkl, (tm, tk), (None, None, None))
        gB = cute.local_tile(mB_nkl, (tn, tk), (None, None, None))
        gC = cute.local_tile(c_args[-1], (tm, tn), (None, None, None))
        cC_mnl = cute.local_tile(cute.make_identity_tensor(out_mnl.shape), (tm, tn), (None, None, None))
        num_m = cute.size(out_mnl, mode=[0])
        num_n = cute.size(out_mnl, mode=[1])
        num_l = cute.size(out_mnl, mode=[2])
        k_tile_total = cute.size(gA, mode=[3])
        walk = None     # grouped: built once the grid dependency is met (below)
        if cutlass.const_expr(not self.GROUPED):
            walk = self.walk(sched, num_m, num_n, num_l, k_tile_total, cluster_coord, cta_rank)

        # TMA partitions; a multicast load writes this CTA's slice into every CTA of the group
        tAsA, tAgA = cpasync.tma_partition(
            tma_a, cluster_coord[1], cute.make_layout(self.CLUSTER_MN[1]),
            cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, cluster_coord[0], cute.make_layout(self.CLUSTER_MN[0]),
            cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))

        # WGMMA fragments (smem descriptors) for this consumer warpgroup
        consumer_wg = warp_group_idx - 1
        mma_wg = 0 if cutlass.const_expr(self.PINGPONG) else consumer_wg
        thr_mma = tiled_mma.get_slice(mma_wg * 128)
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        tCgC = thr_mma.partition_C(gC)
        accumulators = cute.make_rmem_tensor(tCgC.shape[:3], self.ACC_DTYPE)
        up_accumulators = None      # gated: the up half's accumulators
        if cutlass.const_expr(self.GATED):
            up_accumulators = cute.make_rmem_tensor(tCgC.shape[:3], self.ACC_DTYPE)
        consumer_tidx = self.consumer_tidx(tidx)
        thr_mma_c = tiled_mma.get_slice(consumer_tidx)
        promo = None    # block-scaled fp8: each k-tile's WGMMA accumulator, promoted into `accumulators`
        if cutlass.const_expr(self.BLOCK_SCALED):
            promo = Promotion(cute.make_rmem_tensor(tCgC.shape[:3], self.ACC_DTYPE), *block_scales, cC_mnl,
                              thr_mma_c, num_m)

        # PDL bands: grids of at most PDL_EARLY_CTAS or at least PDL_FULL_CTAS CTAs prefetch before the wait
        # (below) and let the next kernel in once their last load is issued; mid-sized grids measured slower
        # with either
        grid_ctas = cute.arch.grid_dim()[0] * cute.arch.grid_dim()[1] * cute.arch.grid_dim()[2]
        pdl_banded = grid_ctas <= self.PDL_EARLY_CTAS or (self.PDL_FULL_CTAS > 0 and grid_ctas >= self.PDL_FULL_CTAS)
        # (a schedule's own prefetch depth prefetches in every grid: PDL_PREFETCH_BANDED false)
        if cutlass.const_expr(self.PDL and self.PDL_PREFETCH_K_TILES > 0):
            if warp_idx == self.PRODUCER_WG * 4:
                if cutlass.const_expr(self.PDL_PREFETCH_BANDED):
                    if pdl_banded:
                        if walk.start < walk.limit:
                            self.prefetch_first_tile(tma_a, tAgA, tma_b, tBgB, self.work_at(walk.start, walk))
                else:
                    if walk.start < walk.limit:
                        self.prefetch_first_tile(tma_a, tAgA, tma_b, tBgB, self.work_at(walk.start, walk))
        pipeline.pipeline_init_wait(cluster_shape_mn=self.CLUSTER_MN)
        # PDL: everything above may overlap the previous kernel on the stream; no global memory is read into
        # shared memory or written before its grid has completed
        if cutlass.const_expr(self.PDL):
            cute.arch.griddepcontrol_wait()
        a_rows = ()     # contiguous groups: what takes A's tiles at a group's first row
        if cutlass.const_expr(self.GROUPED):
            walk = self.group_walk(group_args[0], num_m, num_n, k_tile_total)
            if cutlass.const_expr(not self.GROUP_MASKED):
                a_rows = (mA_mkl, sA, cluster_coord)
        # split_k_mode serial: the reduce kernel is let in at once (it waits for this grid's partials); a next
        # GEMM is let in by the producer near the end: let in here, it measured up to 28% slower
        if cutlass.const_expr(self.PDL and self.REDUCE_KERNEL):
            cute.arch.griddepcontrol_launch_dependents()

        # ---- producer warpgroup: PRODUCER_REGS registers; one warp issues the loads
        if warp_group_idx == self.PRODUCER_WG:
            cute.arch.setmaxregister_decrease(self.PRODUCER_REGS)
        if warp_idx == self.PRODUCER_WG * 4:
            self.produce(ab_pipeline, walk, num_m, num_n, pdl_banded, tma_a, tAgA, tAsA, a_mcast_mask,
                         tma_b, tBgB, tBsB, b_mcast_mask, a_rows)

        # ---- consumer warpgroups: CONSUMER_REGS registers
        if warp_group_idx != self.PRODUCER_WG:
            cute.arch.setmaxregister_increase(self.CONSUMER_REGS)
            self.consume(ab_pipeline, walk, (consumer_tidx, warp_idx, warp_group_idx, consumer_wg), storage, tiled_mma,
                         (accumulators, up_accumulators, promo), thr_mma_c, tCrA, tCrB, gC, cC_mnl, sC, c_args,
                         out_mnl, scratch, inputs, staged, num_m, num_n)
