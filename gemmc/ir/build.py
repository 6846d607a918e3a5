"""GemmSpec <-> gemm-level IR.

`spec_to_module(spec, schedule)` builds the module the passes start from; `spec_of(op)` reads the
problem back from a gemm.matmul or kernel.gemm (the passes use it to call gemmc.schedule)."""
from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp, f32
from xdsl.ir import Block, Region, SSAValue

from ..errors import SpecError
from ..schedule import Schedule
from ..spec import EpilogueInput, EpilogueOp, GemmSpec, Ref, Scaling
from ..types import DType
from .attrs import ScheduleAttr, TensorType
from .gemm import (ELEMENTWISE_OPS, ArgOp, CastOp, ClampOp, ConstOp, MatmulOp, YieldOp, arg_name, scale_dims,
                   scale_layouts)
from .kernel import KernelGemmOp


def operand_types(spec: GemmSpec) -> dict[str, TensorType]:
    """The type of each operand by name: a, b, out, a grouped GEMM's offsets or counts, the epilogue inputs."""
    lead = (spec.batch,) if spec.batch is not None else ()
    b_lead = lead
    if spec.grouped:    # B holds one weight per group; A and the output are the groups' rows (contiguous)
        b_lead = (spec.groups,)
        lead = (spec.groups,) if spec.group_layout == "masked" else ()
    m, n, k = spec.m, spec.n, spec.k
    types = {
        "a": TensorType.make(lead + ((m, k) if spec.a_layout == "mk" else (k, m)), spec.dtype, spec.a_layout),
        "b": TensorType.make(b_lead + ((spec.b_rows, k) if spec.b_layout == "nk" else (k, n)), spec.b_dtype,
                             spec.b_layout),
    }
    if spec.grouped:
        types[spec.group_operand] = TensorType.make((spec.groups,), DType.i32, spec.group_operand)
    if spec.scaling is not None:    # an fp8 GEMM's scales, after B (as the kernel takes them)
        mode = spec.scaling.mode
        dims_of = scale_dims(mode, m, n, k, spec.groups, spec.group_layout)
        for name, layout, dims in zip(spec.scaling.names, scale_layouts(mode), dims_of):
            types[name] = TensorType.make(dims, DType.f32, layout)
    types["out"] = TensorType.make(lead + (m, n), spec.out_dtype, "mn")
    for i in spec.inputs:
        dims = {"scalar": (), "row": (n,), "col": (m,), "full": lead + (m, n)}[i.kind]
        types[i.name] = TensorType.make(dims, i.dtype, i.kind)
    return types


def epilogue_region(spec: GemmSpec) -> Region:
    """acc and one value per input in, the spec's ops in order, the last op's value yielded."""
    block = Block(arg_types=[f32] * (1 + len(spec.inputs)))
    block.args[0].name_hint = "acc"
    by_input = {}
    for arg, i in zip(block.args[1:], spec.inputs):
        arg.name_hint = i.name
        by_input[i.name] = arg
    nodes: list[SSAValue] = []

    def value_of(ref: Ref) -> SSAValue:
        if ref.kind == "acc":
            return block.args[0]
        if ref.kind == "input":
            return by_input[ref.value]
        if ref.kind == "node":
            return nodes[int(ref.value)]
        const = ConstOp(float(ref.value))
        block.add_op(const)
        return const.result

    for op in spec.epilogue:
        args = [value_of(r) for r in op.args]
        if op.op == "cast":
            new = CastOp(args[0], op.attr("dtype"))
        elif op.op == "clamp":
            new = ClampOp(args[0], op.attr("min"), op.attr("max"))
        else:
            new = ELEMENTWISE_OPS[op.op](*args)
        block.add_op(new)
        nodes.append(new.result)
    block.add_op(YieldOp(nodes[-1] if nodes else block.args[0]))
    return Region(block)


def spec_to_module(spec: GemmSpec, schedule: Schedule | None = None) -> ModuleOp:
    """The gemm-level IR of `spec`: one gemm.arg per operand, then gemm.matmul (with the schedule, if any)."""
    types = operand_types(spec)
    args = {name: ArgOp(name, t) for name, t in types.items() if name != "out"}
    scaled = None if spec.scaling is None else (spec.scaling.mode, *(args[x].result for x in spec.scaling.names))
    matmul = MatmulOp(spec.name, args["a"].result, args["b"].result, [args[i.name].result for i in spec.inputs],
                      types["out"], spec.acc_dtype.value, epilogue_region(spec),
                      ScheduleAttr.from_schedule(schedule) if schedule is not None else None, spec.gate,
                      args[spec.group_operand].result if spec.grouped else None, scaled)
    module = ModuleOp([*args.values(), matmul])
    module.verify()
    return module


# ---- reading back ------------------------------------------------------------------------------

def find_gemm(module: ModuleOp) -> MatmulOp | KernelGemmOp:
    """The module's one gemm.matmul or kernel.gemm."""
    found = [op for op in module.walk() if isinstance(op, (MatmulOp, KernelGemmOp))]
    if len(found) != 1:
        raise SpecError(f"expected one gemm.matmul or kernel.gemm in the module, found {len(found)}")
    return found[0]


def _epilogue_ops(region: Region) -> tuple[EpilogueOp, ...]:
    block = region.block
    refs: dict[SSAValue, Ref] = {block.args[0]: Ref.acc()}
    for arg, name in zip(block.args[1:], _input_names_for(block)):
        refs[arg] = Ref.input(name)
    ops: list[EpilogueOp] = []
    for op in block.ops:
        if isinstance(op, ConstOp):
            refs[op.result] = Ref.const(op.value.data)
        elif isinstance(op, YieldOp):
            last = Ref.node(len(ops) - 1) if ops else Ref.acc()
            if refs[op.value] != last:
                raise SpecError("the epilogue must yield its last op's value (or %acc when it has no ops)")
        else:
            kind = op.name.split(".", 1)[1]
            attrs: tuple = ()
            if isinstance(op, CastOp):
                attrs = (("dtype", DType(op.dtype.data)),)
            elif isinstance(op, ClampOp):
                attrs = tuple((k, getattr(op, k).data) for k in ("min", "max") if getattr(op, k) is not None)
            ops.append(EpilogueOp(kind, tuple(refs[x] for x in op.operands), attrs))
            refs[op.result] = Ref.node(len(ops) - 1)
    return tuple(ops)


def _input_names_for(block: Block) -> list[str]:
    gemm = block.parent_op()
    if isinstance(gemm, MatmulOp):
        return [arg_name(x) for x in gemm.inputs]
    return [arg_name(x) for x in gemm.parent_op().inputs]   # kernel.epilogue inside kernel.gemm


def spec_of(op: MatmulOp | KernelGemmOp) -> GemmSpec:
    a, b, out = op.a.type, op.b.type, op.out.type
    m, k = a.dims[-2:] if a.layout.data == "mk" else a.dims[-2:][::-1]
    n = out.dims[-1]
    inputs = tuple(EpilogueInput(arg_name(x), x.type.layout.data, x.type.element) for x in op.inputs)
    grouped = {}
    if op.groups is not None:   # the groups are a grouped GEMM's leading dim, not a batch
        grouped = {"groups": op.groups.type.dims[0], "group_layout": op.group_layout}
    scaling = None if op.scaling is None else Scaling(op.scaling.data, *(arg_name(x) for x in op.scales))
    return GemmSpec(m=m, n=n, k=k, dtype=a.element, out_dtype=out.element, acc_dtype=op.acc_dtype.data,
                    a_layout=a.layout.data, b_layout=b.layout.data, batch=None if grouped else a.batch,
                    inputs=inputs, epilogue=_epilogue_ops(op.epilogue_region), name=op.kernel_name.data,
                    gate=op.gate.data if op.gate is not None else None, b_dtype=b.element, scaling=scaling, **grouped)


def schedule_of(op: MatmulOp | KernelGemmOp) -> Schedule | None:
    return op.schedule.to_schedule() if op.schedule is not None else None


def spec_from_module(module: ModuleOp) -> GemmSpec:
    return spec_of(find_gemm(module))
