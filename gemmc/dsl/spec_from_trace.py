"""What a traced call recorded -> a `GemmSpec`: the checks on the returned value, the output dtype (a trailing
cast), the live epilogue ops, and each epilogue input's kind from how it broadcasts."""
from __future__ import annotations

from ..errors import SpecError
from ..spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
from ..types import OUTPUT_DTYPES, DType
from .locations import trace_error
from .parameter_types import fmt_shape
from .tracer import Tracer
from .values import Value

_RESERVED_NAMES = ("a", "b", "out", "acc")


def spec_from_trace(tracer: Tracer, fn, result, ret_where: str, name: str):
    mm = tracer.mm
    if mm is None:
        raise trace_error(ret_where, f"{fn.__name__} has no matmul: a gemmc kernel computes exactly one `a @ b` "
                          "(or a @ b.T / a.T @ b) followed by elementwise ops")
    for operand in (mm.a, mm.b):
        if operand == "out":
            raise trace_error(tracer.param_lines[operand], "matmul operand named 'out': calls pass the output buffer "
                              "as out=; rename the parameter")
    if not isinstance(result, Value):
        raise trace_error(ret_where, f"{fn.__name__} returns {type(result).__name__} {result!r}: return the matmul "
                          "result (after any elementwise ops)")
    if result._ref is None or (result._ref.kind == "input" and not result._on_acc):
        raise trace_error(ret_where, f"{fn.__name__} returns its input {result._param or result._ref.value} unchanged: "
                          "return the matmul result (after any elementwise ops)")
    if not result._on_acc:
        raise trace_error(ret_where, f"{fn.__name__}'s return value does not depend on the matmul result")
    if result._shape != tracer.acc_shape:
        raise trace_error(ret_where, f"the return value has shape {fmt_shape(result._shape)}, not the output shape "
                          f"{fmt_shape(tracer.acc_shape)}")

    # A trailing cast is the output dtype, not an op. (fp8 is not an output dtype: fp8 matmuls default to bf16.)
    ops = list(tracer.ops)
    out_ref = result._ref
    out_dtype = DType.bf16 if mm.scaling is not None else mm.dtype
    if out_ref.kind == "node" and ops[out_ref.value].op == "cast":
        cast = ops[out_ref.value]
        out_dtype = cast.attr("dtype")
        if out_dtype not in OUTPUT_DTYPES:
            raise trace_error(cast.line, f"output dtype {out_dtype}: use bf16, f16 or f32")
        out_ref = cast.args[0]

    epilogue, used_inputs = _live_ops(ops, out_ref)

    # Epilogue inputs: every parameter but the operands, kinds from how they broadcast.
    inputs = []
    scales = mm.scaling.names if mm.scaling is not None else ()
    for pname, ptype in tracer.params.items():
        if pname in (mm.a, mm.b, mm.group_param) or pname in scales:
            continue
        if tracer.param_kind(pname) == "groups":
            raise trace_error(tracer.param_lines[pname], f"parameter {pname} ({ptype!r}) is never passed to "
                              "gemmc.grouped_mm: remove it, or compute the product with gemmc.grouped_mm(a, b, "
                              f"{pname})")
        where = tracer.param_lines[pname]
        if pname not in used_inputs:
            raise trace_error(where, f"parameter {pname} is never used in the returned value: remove it")
        if pname in _RESERVED_NAMES:
            raise trace_error(where, f"epilogue input named {pname!r}: the names {', '.join(_RESERVED_NAMES)} are "
                              "reserved for the operands and output; rename the parameter")
        kinds = {_input_kind(tracer, pname, shape, use_where) for shape, use_where in tracer.epilogue_uses[pname]}
        if len(kinds) > 1:
            raise trace_error(tracer.epilogue_uses[pname][-1][1], f"parameter {pname} is used as both "
                              f"{' and '.join(sorted(kinds))}: use one orientation")
        dtype = DType.f32 if ptype == "scalar" else ptype.dtype
        if dtype.bits == 8:
            raise trace_error(where, f"epilogue input {pname} is {dtype} (fp8): not supported yet; "
                              "use bf16, f16 or f32")
        inputs.append(EpilogueInput(pname, kinds.pop(), dtype))

    try:
        spec = GemmSpec(m=mm.m, n=mm.n, k=mm.k, dtype=mm.dtype, out_dtype=out_dtype, acc_dtype=tracer.acc_dtype,
                        a_layout=mm.a_layout, b_layout=mm.b_layout, batch=mm.batch, inputs=tuple(inputs),
                        epilogue=tuple(epilogue), name=name, groups=mm.groups, group_layout=mm.group_layout,
                        b_dtype=mm.b_dtype, scaling=mm.scaling)
    except SpecError as e:
        raise trace_error(mm.line, str(e)) from None
    params = list(tracer.params)
    operands = {"a": mm.a, "b": mm.b}
    if mm.group_param is not None:
        operands[spec.group_operand] = mm.group_param
    if mm.scaling is not None:      # the scales go by their own names: the kernel's params are named after them
        operands.update(scale_a=mm.scaling.a, scale_b=mm.scaling.b)
    return spec, operands, params


def _live_ops(ops: list[EpilogueOp], out_ref: Ref):
    """Ops the output depends on, renumbered in order; and the input names they read."""
    live = set()
    stack = [out_ref]
    while stack:
        r = stack.pop()
        if r.kind == "node" and r.value not in live:
            live.add(r.value)
            stack.extend(ops[r.value].args)
    new_index = {old: new for new, old in enumerate(sorted(live))}
    remap = lambda r: Ref.node(new_index[r.value]) if r.kind == "node" else r  # noqa: E731
    out, used = [], set()
    for old in sorted(live):
        op = ops[old]
        out.append(EpilogueOp(op.op, tuple(remap(r) for r in op.args), op.attrs, line=op.line))
        used.update(r.value for r in op.args if r.kind == "input")
    if out_ref.kind == "input":
        used.add(out_ref.value)
    return out, used


def _input_kind(tracer: Tracer, pname: str, shape: tuple, where: str) -> str:
    acc = tracer.acc_shape
    batched = len(acc) == 3
    if shape == ():
        return "scalar"
    if len(shape) > len(acc):
        raise trace_error(where, f"input {pname} {fmt_shape(shape)} has more dims than the output {fmt_shape(acc)}")
    padded = (1,) * (len(acc) - len(shape)) + tuple(shape)
    lead, (p, q) = padded[:-2], padded[-2:]
    m, n = acc[-2:]
    if (p, q) == (1, n) and n != 1:
        kind = "row"
    elif (p, q) == (m, 1) and m != 1:
        kind = "col"
    elif (p, q) == (m, n):
        kind = "full"
    else:
        raise trace_error(where, f"input {pname} used with shape {fmt_shape(shape)}: it must broadcast over the output "
                          f"{fmt_shape(acc)} as a row ({n},), a column ({m}, 1) or a full ({m}, {n}) tensor; "
                          "use a gemmc.Scalar for a scalar")
    if batched:
        if kind == "full" and lead != (acc[0],):
            raise trace_error(where, f"full input {pname} {fmt_shape(shape)} in a batched kernel needs the batch dim: "
                              f"declare it {fmt_shape(acc)}")
        if kind != "full" and lead != (1,):
            raise trace_error(where, f"{kind} input {pname} {fmt_shape(shape)} has a batch dim: per-batch vectors are "
                              "not supported; row and column vectors are shared by every batch")
    return kind
