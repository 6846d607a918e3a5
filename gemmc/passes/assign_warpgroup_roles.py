"""assign-warpgroup-roles: gemm.matmul -> kernel.gemm, with who does what and the MMA instruction.

SM90: one producer warpgroup (TMA loads, few registers) and two consumer warpgroups (WGMMA +
epilogue) that either split each tile by rows (cooperative; a 192-row tile, three 64-row WGMMAs, by
columns) or take alternate tiles (pingpong, so one's epilogue overlaps the other's MMA). SM80: uniform
warps that all load and compute.

fp8 (SM90): the MMA is the fp8 WGMMA (K 32), and kernel.scaling says how the consumers apply the scales.
Per tensor and per row, the WGMMA accumulator sums all of K and the epilogue multiplies by the scales
(promote 0: the fast accumulation of torch._scaled_mm(use_fast_accum=True)); per block, every k-tile's
WGMMA result is promoted into a second, f32 accumulator times its block scales (promote 128)."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Region
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from ..ir.attrs import ScheduleAttr
from ..ir.build import find_gemm
from ..ir.gemm import MatmulOp
from ..ir.kernel import (ClusterOp, CopyOp, EpilogueOp, KernelGemmOp, MmaOp, PipelineOp, ScalingOp,
                         TileSchedulerOp, WarpGroupOp)
from ..schedule import (Schedule, accumulator_count, consumer_warpgroups, promotion_interval, register_budgets,
                        sm80_warps, splits_n, threads_per_cta)
from ..spec import GemmSpec
from .common import layout_schedule

WGMMA_M = 64


def kernel_header(s: Schedule) -> dict:
    """kernel.gemm's arch, tile, mode and threads, all read from the schedule."""
    return {"arch": s.arch, "tile": s.tile, "mode": s.mode if s.arch == "sm_90a" else "multistage",
            "threads": threads_per_cta(s)}


def scaling_fact(spec: GemmSpec) -> list:
    """An fp8 kernel's kernel.scaling (none for other kernels)."""
    if spec.scaling is None:
        return []
    return [ScalingOp.make(mode=spec.scaling.mode, promote=promotion_interval(spec),
                           accumulators=accumulator_count(spec))]


def roles(s: Schedule, spec: GemmSpec) -> tuple[list, MmaOp]:
    """(warpgroup facts, mma fact) for schedule `s` (its mode is kernel_header's)."""
    bm, bn, _ = s.tile
    if s.arch == "sm_90a":
        producer_regs, consumer_regs = register_budgets(s, spec)
        wgs = [WarpGroupOp.make(role="producer", index=0, regs=producer_regs, warps=4)]
        wgs += [WarpGroupOp.make(role="consumer", index=1 + i, regs=consumer_regs, warps=4)
                for i in range(consumer_warpgroups(s))]
        inst_k = 32 if spec.dtype.bits == 8 else 16
        # cooperative: the consumers stack along M, each owning bm/2 rows (192 rows: along N, each owning
        # bn/2 columns of all rows); pingpong: each owns a whole tile
        if splits_n(s):
            atoms, inst_n = (1, consumer_warpgroups(s), 1), bn // consumer_warpgroups(s)
        else:
            atoms, inst_n = ((consumer_warpgroups(s), 1, 1) if s.mode == "cooperative" else (1, 1, 1)), bn
        mma = MmaOp.make(kind="wgmma", inst=(WGMMA_M, inst_n, inst_k), atoms=atoms, a_source="smem")
        return wgs, mma
    warps = sm80_warps(s)
    wgs = [WarpGroupOp.make(role="uniform", index=i, regs=0, warps=min(4, warps - 4 * i))
           for i in range((warps + 3) // 4)]
    atoms = (2, 2, 1) if warps == 4 else ((4, 2, 1) if bm >= bn else (2, 4, 1))
    return wgs, MmaOp.make(kind="mma.sync", inst=(16, 8, 16), atoms=atoms, a_source="smem")


@dataclass(frozen=True)
class AssignWarpgroupRoles(ModulePass):
    name = "assign-warpgroup-roles"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        gemm = find_gemm(op)
        spec, s = layout_schedule(gemm, self.name)
        wgs, mma = roles(s, spec)
        header = kernel_header(s)
        if isinstance(gemm, MatmulOp):
            body = Block()
            body.add_op(EpilogueOp(gemm.detach_region(gemm.epilogue)))
            kernel = KernelGemmOp(gemm.kernel_name.data, gemm.a, gemm.b, list(gemm.inputs), gemm.out.type,
                                  gemm.acc_dtype.data, **header, schedule=ScheduleAttr.from_schedule(s),
                                  body=Region(body), gate=spec.gate, groups=gemm.groups, scaled=gemm.scaled)
            Rewriter.replace_op(gemm, kernel)
        else:   # rerun on a kernel whose schedule may have been edited: the header follows it too
            kernel = gemm
            if kernel.header != header:
                # the later passes' facts were laid out for the old arch/tile/mode: they rerun from the schedule
                kernel.set_header(**header)
                kernel.drop_facts(ClusterOp, CopyOp, PipelineOp, TileSchedulerOp)
                kernel.epilogue_op.properties.pop("store", None)
            kernel.drop_facts(WarpGroupOp, MmaOp, ScalingOp)
        for fact in [*wgs, mma, *scaling_fact(spec)]:
            kernel.add_fact(fact)
