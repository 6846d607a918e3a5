"""Kernel-level IR -> KernelPlan: read each fact op back as plain data (nothing is recomputed)."""
from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from ..errors import SpecError
from .build import find_gemm, spec_of
from .kernel import (ClusterOp, CopyOp, GroupOp, KernelGemmOp, MmaOp, PipelineOp, ScalingOp, TileSchedulerOp,
                     WarpGroupOp)
from .plan import (Epilogue, GroupMapping, KernelPlan, Mma, OperandCopy, Pipeline, ProblemInfo, Scaling,
                   TileScheduler, WarpGroup)

_MADE_BY = {MmaOp: "assign-warpgroup-roles", ScalingOp: "assign-warpgroup-roles", ClusterOp: "tma-cluster-layout",
            PipelineOp: "pipeline-staging", TileSchedulerOp: "pipeline-staging", GroupOp: "map-groups"}


def plan_from_module(module: ModuleOp) -> KernelPlan:
    kernel = find_gemm(module)
    if not isinstance(kernel, KernelGemmOp):
        raise SpecError("the module is still at the gemm level: run the passes "
                        "(assign-warpgroup-roles, tma-cluster-layout, pipeline-staging) before extracting a plan")

    def need(cls):
        op = kernel.fact(cls)
        if op is None:
            raise SpecError(f"kernel.gemm has no {cls.name}: run {_MADE_BY[cls]} first")
        return op

    spec = spec_of(kernel)
    problem = ProblemInfo(m=spec.m, n=spec.n, k=spec.k, batch=spec.batch, a_dtype=spec.dtype, b_dtype=spec.b_dtype,
                          out_dtype=spec.out_dtype, acc_dtype=spec.acc_dtype, a_major=spec.a_major,
                          b_major=spec.b_major, name=spec.name, gate=spec.gate, groups=spec.groups,
                          group_layout=spec.group_layout)
    # asked for in pass order, so the error names the first pass that has not run
    mma = need(MmaOp)
    scaling = None
    if spec.scaling is not None:
        fact = need(ScalingOp)
        scaling = Scaling(spec.scaling.mode, spec.scaling.a, spec.scaling.b, promote=fact.get("promote"),
                          accumulators=fact.get("accumulators"))
    cluster = need(ClusterOp)
    store = kernel.epilogue_op.store
    if store is None:
        raise SpecError("kernel.epilogue has no store path: run tma-cluster-layout first")
    pipe, sched = need(PipelineOp), need(TileSchedulerOp)
    groups = GroupMapping(**need(GroupOp).values()) if spec.grouped else None
    return KernelPlan(
        arch=kernel.arch.data,
        problem=problem,
        tile=tuple(a.data for a in kernel.tile.data),
        cluster=cluster.get("shape"),
        mode=kernel.mode.data,
        threads=kernel.threads.data,
        warpgroups=tuple(WarpGroup(**w.values()) for w in kernel.ops_of(WarpGroupOp)),
        copies=tuple(OperandCopy(**c.values()) for c in kernel.ops_of(CopyOp)),
        pipeline=Pipeline(**pipe.values()),
        scheduler=TileScheduler(**sched.values()),
        mma=Mma(kind=mma.get("kind"), inst_shape=mma.get("inst"), atom_layout=mma.get("atoms"),
                a_source=mma.get("a_source")),
        epilogue=Epilogue(inputs=spec.inputs, ops=spec.epilogue, store=store.data),
        swap_ab=bool(kernel.schedule.swap_ab.value.data),
        groups=groups,
        scaling=scaling,
    )
