"""`plan_for(spec, schedule)`: a KernelPlan for the SM90 backend's own tests and scripts.

Uses `gemmc.compiler.lower` when it exists (the real pass pipeline). Until then it fills the plan
from the shared resource model in gemmc.schedule (never a second calculation of stages/smem).
"""
from __future__ import annotations

import math

from ... import schedule as S
from ...ir.plan import (Epilogue, KernelPlan, Mma, OperandCopy, Pipeline, ProblemInfo, TileScheduler,
                        WarpGroup)
from ...schedule import Schedule
from ...spec import GemmSpec


def _swizzle(contiguous_elems: int, elem_bytes: int) -> int:
    b = contiguous_elems * elem_bytes
    for sw in (128, 64, 32):
        if b % sw == 0:
            return sw
    return 0


def hand_plan(spec: GemmSpec, s: Schedule) -> KernelPlan:
    S.require_valid(s, spec)
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    eb = spec.dtype.bytes
    a_contig = bk if spec.a_major == "k" else bm
    b_contig = bk if spec.b_major == "k" else bn
    em, en = S.epilogue_tile(s)
    copies = (
        OperandCopy("a", "tma", (bm // cn, bk) if spec.a_major == "k" else (bk, bm // cn),
                    _swizzle(a_contig, eb), cn, "n" if cn > 1 else ""),
        OperandCopy("b", "tma", (bn // cm, bk) if spec.b_major == "k" else (bk, bn // cm),
                    _swizzle(b_contig, eb), cm, "m" if cm > 1 else ""),
        OperandCopy("c", "tma_store", (em, en),
                    _swizzle(en, 4 if s.split_k > 1 else spec.out_dtype.bytes), 1),
    )
    coop = s.mode == "cooperative"
    return KernelPlan(
        arch="sm_90a",
        problem=ProblemInfo(spec.m, spec.n, spec.k, spec.batch, spec.dtype, spec.dtype, spec.out_dtype,
                            spec.acc_dtype, spec.a_major, spec.b_major, spec.name),
        tile=s.tile, cluster=s.cluster, mode=s.mode, threads=S.threads_per_cta(s),
        warpgroups=(WarpGroup("producer", 0, S.PRODUCER_REGS), WarpGroup("consumer", 1, S.CONSUMER_REGS),
                    WarpGroup("consumer", 2, S.CONSUMER_REGS)),
        copies=copies,
        pipeline=Pipeline(S.resolve_stages(s, spec), ("full", "empty"), S.EPI_STAGES, (em, en),
                          S.smem_bytes(s, spec)),
        scheduler=TileScheduler(True, s.raster, s.swizzle, s.split_k, "serial" if s.split_k > 1 else "none"),
        mma=Mma("wgmma", (64, bn, 16), (2, 1, 1) if coop else (1, 1, 1)),
        epilogue=Epilogue(spec.inputs, spec.epilogue, "tma"),
    )


def plan_for(spec: GemmSpec, s: Schedule) -> KernelPlan:
    try:
        from ...compiler import lower
    except ImportError:
        return hand_plan(spec, s)
    return lower(spec, s, "sm_90a")[1]
