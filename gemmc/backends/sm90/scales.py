"""An fp8 kernel's scales in the emitted SM90 module: their params, and the epilogue that applies them.

Per tensor and per row (the plan's scaling applies in the epilogue) the scales are epilogue inputs that the DAG
multiplies the accumulator by before the user's ops: out = epilogue((acc * sa) * sb). They are read the way
column and row epilogue inputs are (per element, from global memory, at the element's (m, n) in the problem,
so a swapped kernel reads them transposed), once per output element, after any split-K sum (the fix-up's last
split or the reduce kernel runs the epilogue). A per-tensor scale is a one-element tensor (kind "one": element
0 everywhere). Under block scaling the consumers apply the scales as they promote each k-tile (consumer.py);
the epilogue is the user's alone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir.plan import KernelPlan
from ...spec import EpilogueOp, Ref, scale_shapes
from ...types import DType


@dataclass(frozen=True)
class ScaleInput:
    """A scale as the kernel reads it: kind "col" (A's, one per row of the output), "row" (B's, one per
    column) or "one" (a one-element tensor) in the epilogue; "block" in the promotion."""
    name: str
    kind: str
    dtype: DType = DType.f32


def scale_shapes_of(plan: KernelPlan) -> list[tuple]:
    """(name, shape) of A's and B's scales, f32 tensors of the scaling's shapes (none without scaling; a grouped
    GEMM's with its groups' dims): the kernel's params of role "scale", read one f32 at a time (4-byte alignment:
    gemmc.build, gemmc.runtime)."""
    sc, p = plan.scaling, plan.problem
    if sc is None:
        return []
    return list(zip((sc.a, sc.b), scale_shapes(sc.mode, p.m, p.n, p.k, p.groups, p.group_layout)))


def scale_inputs(plan: KernelPlan) -> tuple[ScaleInput, ...]:
    """The scales as the epilogue (per tensor, per row) reads them; under block scaling, the promotion."""
    sc = plan.scaling
    if sc is None:
        return ()
    kinds = {"tensor": ("one", "one"), "row": ("col", "row"), "block": ("block", "block")}[sc.mode]
    return tuple(ScaleInput(name, kind) for name, kind in zip((sc.a, sc.b), kinds))


def epilogue_with_scales(plan: KernelPlan) -> tuple[tuple, tuple]:
    """(inputs, ops) of the kernel's epilogue: the plan's, behind the scales' two multiplies where the scaling
    applies in the epilogue (the scales first among the inputs, as the kernel's params have them)."""
    inputs, ops = tuple(plan.epilogue.inputs), tuple(plan.epilogue.ops)
    sc = plan.scaling
    if sc is None or not sc.in_epilogue:
        return inputs, ops
    scales = scale_inputs(plan)
    head = (EpilogueOp("mul", (Ref.acc(), Ref.input(sc.a))), EpilogueOp("mul", (Ref.node(0), Ref.input(sc.b))))

    def after_scales(r: Ref) -> Ref:      # the user's ops read the scaled accumulator (node 1)
        if r.kind == "acc":
            return Ref.node(1)
        return Ref.node(r.value + len(head)) if r.kind == "node" else r
    return scales + inputs, head + tuple(replace(op, args=tuple(after_scales(r) for r in op.args)) for op in ops)
