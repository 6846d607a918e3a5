"""Epilogue of the SM90 kernel: the plan's epilogue DAG on the accumulators, the cast, and the store.

The DAG itself is the generated module's `epilogue_dag(acc, em, en, el, lm, ln, inputs, staged)`: one f32
accumulator element at output coordinate (em, en, el) in, its f32 result out. Epilogue inputs the plan reads
from global memory (copy "ldg": row and column vectors, and full inputs) are read per element at the
element's coordinate; full inputs whose plan copy is "tma" are TMA-loaded into shared memory per epilogue
sub-tile and read at the element's place (lm, ln) inside it.

The store: registers -> smem (stmatrix) -> TMA store (with C_L2_POLICY's cache hint, if any), in EPI_TILE
sub-tiles through EPI_STAGES buffers; or
(STORE_FROM_REGISTERS) each element from registers straight to global memory at its coordinate: with swapped A
and B in the transposed view of out (stmatrix needs an MMA N of at least 16; the kernel's rows are out's
columns); grouped, at its group's row, and only the group's rows (a TMA store would write the next group's).
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync

from .producer import L2_POLICY_WORDS


class Stores(NamedTuple):
    """The register -> smem copy of the TMA store path (None under swapped A/B)."""
    tiled_r2s: object
    tRS_sC: object
    tRS_acc: object
    tRS_rC: object          # f32 registers of one sub-tile
    tRS_rC_out: object      # the same, cast to the store type


class EpilogueLoads(NamedTuple):
    """TMA-staged epilogue inputs: the group's load barrier, the bytes one sub-tile of them all loads, and per
    input its TMA atom, smem tensor and CTA tiles."""
    barrier: object
    bytes: object
    atoms: tuple
    smem: tuple
    tiles: tuple


class Epilogue:
    """Epilogue methods of Sm90Gemm (facts on self; the DAG on self.epilogue_dag)."""

    def store_setup(self, tiled_mma, accumulators, sC, consumer_tidx):
        if cutlass.const_expr(self.STORE_FROM_REGISTERS):
            return None
        r2s_atom = sm90_utils.get_smem_store_op(cutlass.tensor_utils.LayoutEnum.ROW_MAJOR, self.STORE_DTYPE,
                                                self.ACC_DTYPE)
        c_atom_layout = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.STORE_DTYPE)
        tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom_layout, tiled_mma))
        thr_r2s = tiled_r2s.get_slice(consumer_tidx)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = tiled_r2s.retile(accumulators)
        rC_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
        return Stores(tiled_r2s, tRS_sC, tRS_acc, cute.make_rmem_tensor(rC_shape, self.ACC_DTYPE),
                      cute.make_rmem_tensor(rC_shape, self.STORE_DTYPE))

    @cute.jit
    def init_epilogue_load_barriers(self, storage, tidx):
        """One epilogue-input load barrier per consumer warpgroup (ping-pong), else only the first is used."""
        if cutlass.const_expr(len(self.STAGED_INPUTS) > 0):
            epi_load_bar = storage.epi_load_barriers.data_ptr()
            if tidx == 0:
                cute.arch.mbarrier_init(epi_load_bar, 1)
                cute.arch.mbarrier_init(epi_load_bar + 1, 1)

    def epilogue_load_setup(self, storage, staged, group):
        if cutlass.const_expr(len(self.STAGED_INPUTS) == 0):
            return None
        atoms, smem, tiles, load_bytes = [], [], [], 0
        for i, inp in enumerate(self.STAGED_INPUTS):
            tma, tma_mnl, layout = staged[3 * i:3 * i + 3]
            atoms.append(tma)
            smem.append(getattr(storage, f"s_{inp.name}").get_tensor(layout.outer, swizzle=layout.inner))
            tiles.append(cute.local_tile(tma_mnl, (self.TILE_MNK[0], self.TILE_MNK[1]), (None, None, None)))
            load_bytes = load_bytes + cute.size_in_bytes(inp.dtype, cute.slice_(layout, (None, None, 0)))
        return EpilogueLoads(storage.epi_load_barriers.data_ptr() + group.slot, load_bytes, tuple(atoms),
                             tuple(smem), tuple(tiles))

    @cute.jit
    def epilogue_prologue(self, work, thr_mma_c, cC_mnl, stores, epi_loads, num_m, num_n, accumulators, inputs,
                          is_last):
        """Before the store: without staged inputs, the DAG on the accumulator registers (only in a split tile's
        last piece, where the kernel sums partials); with them, the partitions of their loads (the DAG then
        runs per sub-tile in store_tile). Returns those partitions."""
        parts = ()
        if cutlass.const_expr(self.epilogue_dag is not None and len(self.STAGED_INPUTS) == 0):
            if cutlass.const_expr(self.SUMS_PARTIALS):
                if is_last:
                    self.dag_on_accumulators(work, thr_mma_c, cC_mnl, num_m, num_n, accumulators, inputs)
            else:
                self.dag_on_accumulators(work, thr_mma_c, cC_mnl, num_m, num_n, accumulators, inputs)
        if cutlass.const_expr(self.epilogue_dag is not None and len(self.STAGED_INPUTS) > 0):
            # coordinates of the registers each sub-tile stores
            tRS_cC = stores.tiled_r2s.retile(
                thr_mma_c.partition_C(cC_mnl[(None, None, work.tile_m, work.tile_n, work.tile_l)]))
            loads = []
            for i in cutlass.range_constexpr(len(self.STAGED_INPUTS)):
                tma = epi_loads.atoms[i]
                loads.append(cpasync.tma_partition(
                    tma, 0, cute.make_layout(1), cute.group_modes(epi_loads.smem[i], 0, 2),
                    cute.zipped_divide(epi_loads.tiles[i][(None, None, work.tile_m, work.tile_n, work.tile_l)],
                                       self.EPI_TILE)))
            parts = (tRS_cC, tuple(loads))
        return parts

    def dag_on_accumulators(self, work, thr_mma_c, cC_mnl, num_m, num_n, accumulators, inputs):
        """The epilogue DAG (kernel-IR epilogue ops) on the accumulators in registers, f32, per element. Straight-line
        code, so a plain Python loop unrolls it at trace time (range_constexpr would warn past 64 elements)."""
        tCcC = thr_mma_c.partition_C(cC_mnl[(None, None, work.tile_m, work.tile_n, work.tile_l)])
        for ei in range(cute.size(accumulators)):
            em = cutlass.min(tCcC[ei][0], num_m - 1)   # clamp: out-of-range rows/cols are never stored
            en = cutlass.min(tCcC[ei][1], num_n - 1)
            accumulators[ei] = self.epilogue_dag(cutlass.Float32(accumulators[ei]), em, en, work.tile_l, None, None,
                                                 inputs, ())

    @cute.jit
    def store_tile(self, work, gC_t, sC, c_args, out_mnl, stores, store_pipeline, group, thr_mma_c, cC_mnl,
                   accumulators, num_tiles_done, epi_loads, staged_parts, epi_phase, inputs, num_m, num_n):
        """Store one tile (returns the staged inputs' load-barrier phase)."""
        if cutlass.const_expr(self.STORE_FROM_REGISTERS and self.GROUPED):
            # coordinates from the group's first row: the group's rows only, at row0 + row in A's frame
            tCcS = thr_mma_c.partition_C(cC_mnl[(None, None, work.tile_m, work.tile_n, 0)])
            # unrolled (each element is a register), in runs of 32: the DSL warns of constexpr loops of 64 or more
            size = cute.size(accumulators)
            for run in cutlass.range_constexpr((size + 31) // 32):
                for si in cutlass.range_constexpr(run * 32, min(size, run * 32 + 32)):
                    if tCcS[si][0] < work.rows and tCcS[si][1] < num_n:
                        out_mnl[(work.row0 + tCcS[si][0], tCcS[si][1], work.tile_l)] = \
                            cutlass.Float32(accumulators[si]).to(self.STORE_DTYPE)
        elif cutlass.const_expr(self.STORE_FROM_REGISTERS):
            tCcS = thr_mma_c.partition_C(cC_mnl[(None, None, work.tile_m, work.tile_n, work.tile_l)])
            for si in cutlass.range_constexpr(cute.size(accumulators)):
                if tCcS[si][0] < num_m and tCcS[si][1] < num_n:
                    out_mnl[(tCcS[si][0], tCcS[si][1], work.tile_l)] = \
                        cutlass.Float32(accumulators[si]).to(self.STORE_DTYPE)
        else:
            tma_c = c_args[0]
            gC_epi = cute.zipped_divide(gC_t, self.EPI_TILE)
            bSG_sC, bSG_gC = cpasync.tma_partition(tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi)
            num_epi = cute.size(gC_epi, mode=[1])
            epi_grid = cute.make_layout(gC_epi.shape[1], stride=(gC_epi.shape[1][1], 1))
            tRS_rC = stores.tRS_rC
            for ep in cutlass.range_constexpr(num_epi):
                for v in cutlass.range_constexpr(cute.size(tRS_rC)):
                    tRS_rC[v] = stores.tRS_acc[ep * cute.size(tRS_rC) + v]
                if cutlass.const_expr(self.epilogue_dag is not None and len(self.STAGED_INPUTS) > 0):
                    epi_phase = self.dag_on_sub_tile(ep, epi_grid, work, group, epi_loads, staged_parts, epi_phase,
                                                     tRS_rC, inputs, num_m, num_n)
                stores.tRS_rC_out.store(tRS_rC.load().to(self.STORE_DTYPE))
                buf = (num_tiles_done * num_epi + ep) % self.EPI_STAGES
                cute.copy(stores.tiled_r2s, stores.tRS_rC_out, stores.tRS_sC[(None, None, None, buf)])
                cute.arch.fence_proxy("async.shared", space="cta")
                group.barrier.arrive_and_wait()
                if group.store_warp:
                    if cutlass.const_expr(self.C_L2_POLICY in L2_POLICY_WORDS):
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_grid.get_hier_coord(ep))],
                                  cache_policy=cutlass.Int64(L2_POLICY_WORDS[self.C_L2_POLICY]))
                    else:
                        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_grid.get_hier_coord(ep))])
                    store_pipeline.producer_commit()
                    store_pipeline.producer_acquire()
                group.barrier.arrive_and_wait()
        return epi_phase

    @cute.jit
    def dag_on_sub_tile(self, ep, epi_grid, work, group, epi_loads, staged_parts, epi_phase, tRS_rC, inputs,
                        num_m, num_n):
        """Staged inputs: load this sub-tile's with one TMA each (completion on the group's barrier), then the
        DAG on the registers about to be stored, reading them at the element's place in the sub-tile."""
        tRS_cC, loads = staged_parts
        epi_mn = epi_grid.get_hier_coord(ep)
        if group.store_warp:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(epi_loads.barrier, epi_loads.bytes)
            for i in cutlass.range_constexpr(len(self.STAGED_INPUTS)):
                cute.copy(epi_loads.atoms[i], loads[i][1][(None, epi_mn)], loads[i][0][(None, 0)],
                          tma_bar_ptr=epi_loads.barrier)
        cute.arch.mbarrier_wait(epi_loads.barrier, epi_phase)
        epi_phase = epi_phase ^ 1
        for v in cutlass.range_constexpr(cute.size(tRS_rC)):
            crd = tRS_cC[ep * cute.size(tRS_rC) + v]
            em = cutlass.min(crd[0], num_m - 1)   # clamp: out-of-range rows/cols are never stored
            en = cutlass.min(crd[1], num_n - 1)
            lm = crd[0] - work.tile_m * self.TILE_MNK[0] - epi_mn[0] * self.EPI_TILE[0]
            ln = crd[1] - work.tile_n * self.TILE_MNK[1] - epi_mn[1] * self.EPI_TILE[1]
            tRS_rC[v] = self.epilogue_dag(cutlass.Float32(tRS_rC[v]), em, en, work.tile_l, lm, ln, inputs,
                                          epi_loads.smem)
        return epi_phase
