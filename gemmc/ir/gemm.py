"""The `gemm` dialect: what to compute.

  %a = gemm.arg "a" : !gemmc.tensor<M x K x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<N x K x bf16, nk>
  %bias = gemm.arg "bias" : !gemmc.tensor<N x f32, row>
  %out = gemm.matmul @gemm(%a, %b) inputs(%bias) acc f32 -> !gemmc.tensor<M x N x bf16, mn>
         schedule #gemmc.schedule<...> epilogue {
  ^bb0(%acc: f32, %bias_1: f32):
    %0 = gemm.add %acc, %bias_1
    %1 = gemm.relu %0
    gemm.yield %1
  }

The epilogue region has one f32 block argument for the accumulator, then one per epilogue input
(the input's value broadcast to the current element). Epilogue math is f32; `gemm.cast` rounds.
A gated GEMM (`acc f32 gate silu -> ...`) has B = [gate; up] (2N x K) and hands the epilogue
silu(A @ gate.T) * (A @ up.T) as its accumulator.
A grouped GEMM names its group operand and layout after A and B: `@gemm(%a, %b) grouped contiguous(%offsets)`
with %offsets a `!gemmc.tensor<E x i32, offsets>` (E + 1 row offsets of E groups) and B E x N x K; or
`grouped masked(%counts)` with a `!gemmc.tensor<E x i32, counts>` and A E x M x K.
An fp8 GEMM names its scaling and its two f32 scales, which are not epilogue inputs:
  %out = gemm.matmul @gemm(%x, %w) scaled row(%sx, %sw) acc f32 -> !gemmc.tensor<M x N x bf16, mn> ...
with the scales typed per scaling: tensor !gemmc.tensor<f32, scalar> each; row <M x f32, col> and
<N x f32, row>; block <M x Kb x f32, mk> and <Nb x Kb x f32, nk> (Kb, Nb: 128-blocks of K and N). A grouped
fp8 GEMM's (block scaling) lead with E where its operands do: B's <E x Nb x Kb x f32, nk>, A's <E x M x Kb x f32,
mk> when masked.
"""
from __future__ import annotations

import math
from xdsl.dialects.builtin import FloatData, StringAttr, f32
from xdsl.ir import Block, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (AttrSizedOperandSegments, IRDLOperation, irdl_op_definition, operand_def, opt_operand_def,
                       opt_prop_def, prop_def, region_def, result_def, traits_def, var_operand_def)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from ..spec import BINARY_OPS, GATE_ACTIVATIONS, GROUP_OPERANDS, INPUT_KINDS, OUTPUT_DTYPES, SCALINGS, scale_shapes
from ..types import ACC_DTYPES, FP8_A_DTYPES, FP8_B_DTYPES, DType
from .attrs import ScheduleAttr, TensorType


# ---- helpers -------------------------------------------------------------------------------

def print_number(printer: Printer, x: float) -> None:
    """A float that parses back exactly: always has a '.', so MLIR lexes it as a float literal."""
    if math.isinf(x) or math.isnan(x):
        printer.print_string_literal(repr(x))   # "inf", "-inf", "nan"
        return
    text = repr(float(x))
    if "." not in text:
        mant, _, exp = text.partition("e")
        text = f"{mant}.0" + (f"e{exp}" if exp else "")
    printer.print_string(text)


def parse_number(parser: Parser) -> float:
    special = parser.parse_optional_str_literal()
    if special is not None:
        return float(special)
    value = parser.parse_optional_number()
    if value is None:
        parser.raise_error("expected a number")
    return float(value)


def parse_defined_operand(parser: Parser) -> SSAValue:
    """An operand defined earlier in the text: its type is already known, so it is not printed."""
    unresolved: UnresolvedOperand = parser.parse_unresolved_operand()
    values = parser.ssa_values.get(unresolved.operand_name)
    if values is None or unresolved.index >= len(values):
        parser.raise_error(f"%{unresolved.operand_name} is used before it is defined (declare it with gemm.arg)",
                           unresolved.span.start, unresolved.span.end)
    return parser.resolve_operand(unresolved, values[unresolved.index].type)


def arg_name(value: SSAValue) -> str:
    """The user-facing name of a GEMM operand: its gemm.arg name, else its SSA name."""
    if isinstance(value.owner, ArgOp):
        return value.owner.arg_name.data
    return value.name_hint or "?"


EPILOGUE_HOLDERS = ("gemm.matmul", "kernel.epilogue")


def verify_in_epilogue(op: Operation) -> None:
    """Epilogue ops only make sense inside an epilogue region (of gemm.matmul or kernel.epilogue)."""
    parent = op.parent_op()
    if parent is not None and parent.name not in EPILOGUE_HOLDERS:
        raise VerifyException(f"{op.name} must be inside an epilogue region (gemm.matmul or kernel.epilogue), "
                              f"not in {parent.name}")


# ---- operands ------------------------------------------------------------------------------

@irdl_op_definition
class ArgOp(IRDLOperation):
    """Declares a kernel argument (A, B or an epilogue input) with its name and tensor type."""
    name = "gemm.arg"
    arg_name = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, name: str, type_: TensorType):
        super().__init__(properties={"arg_name": StringAttr(name)}, result_types=[type_])
        self.result.name_hint = name

    def verify_(self) -> None:
        if not self.arg_name.data.isidentifier():
            raise VerifyException(f"gemm.arg: name {self.arg_name.data!r} must be an identifier")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_string_literal(self.arg_name.data)
        printer.print_string(" : ")
        printer.print_attribute(self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> "ArgOp":
        name = parser.parse_str_literal()
        parser.parse_punctuation(":")
        type_ = parser.parse_type()
        if not isinstance(type_, TensorType):
            parser.raise_error("gemm.arg: expected a !gemmc.tensor type")
        return cls(name, type_)


# ---- the epilogue's elementwise ops --------------------------------------------------------

class _EpilogueOp(IRDLOperation):
    """Base of the ops an epilogue region holds: each checks that it stands in one."""

    def verify_(self) -> None:
        verify_in_epilogue(self)


class _EpilogueValueOp(_EpilogueOp):
    """An epilogue op that computes one f32 value and has no side effects."""
    result = result_def(f32)
    traits = traits_def(Pure())


class _ElementwiseOp(_EpilogueValueOp):
    """Base of the elementwise ops: f32 in, f32 out; printed `%r = gemm.<op> %x[, %y] <attrs>`."""

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_list(self.operands, printer.print_operand)
        self.print_extra(printer)

    def print_extra(self, printer: Printer) -> None:
        pass

    @classmethod
    def parse(cls, parser: Parser):
        operands = [parser.parse_operand(f32)]
        if cls.name.split('.')[1] in BINARY_OPS:
            parser.parse_punctuation(",")
            operands.append(parser.parse_operand(f32))
        return cls(*operands, **cls.parse_extra(parser))

    @classmethod
    def parse_extra(cls, parser: Parser) -> dict:
        return {}


class _BinaryOp(_ElementwiseOp):
    lhs = operand_def(f32)
    rhs = operand_def(f32)

    def __init__(self, lhs: SSAValue | Operation, rhs: SSAValue | Operation):
        super().__init__(operands=[lhs, rhs], result_types=[f32])


class _UnaryOp(_ElementwiseOp):
    input = operand_def(f32)

    def __init__(self, input: SSAValue | Operation, properties: dict | None = None):
        super().__init__(operands=[input], result_types=[f32], properties=properties or {})


@irdl_op_definition
class AddOp(_BinaryOp):
    name = "gemm.add"


@irdl_op_definition
class SubOp(_BinaryOp):
    name = "gemm.sub"


@irdl_op_definition
class MulOp(_BinaryOp):
    name = "gemm.mul"


@irdl_op_definition
class DivOp(_BinaryOp):
    name = "gemm.div"


@irdl_op_definition
class ReluOp(_UnaryOp):
    name = "gemm.relu"


@irdl_op_definition
class GeluTanhOp(_UnaryOp):
    name = "gemm.gelu_tanh"


@irdl_op_definition
class GeluErfOp(_UnaryOp):
    name = "gemm.gelu_erf"


@irdl_op_definition
class SiluOp(_UnaryOp):
    name = "gemm.silu"


@irdl_op_definition
class SigmoidOp(_UnaryOp):
    name = "gemm.sigmoid"


@irdl_op_definition
class TanhOp(_UnaryOp):
    name = "gemm.tanh"


@irdl_op_definition
class ClampOp(_UnaryOp):
    """`%r = gemm.clamp %x min 0.0 max 6.0` (either bound may be left out)."""
    name = "gemm.clamp"
    min = opt_prop_def(FloatData)
    max = opt_prop_def(FloatData)

    def __init__(self, input: SSAValue | Operation, min: float | None = None, max: float | None = None):
        props = {k: FloatData(float(v)) for k, v in (("min", min), ("max", max)) if v is not None}
        super().__init__(input, props)

    def verify_(self) -> None:
        super().verify_()
        if self.min is None and self.max is None:
            raise VerifyException("gemm.clamp needs min, max or both")
        for key in ("min", "max"):
            bound = getattr(self, key)
            if bound is not None and not math.isfinite(bound.data):
                raise VerifyException(f"gemm.clamp: {key} {bound.data} is not finite; use a finite number")
        if self.min is not None and self.max is not None and self.min.data > self.max.data:
            raise VerifyException(f"gemm.clamp: min {self.min.data} > max {self.max.data}")

    def print_extra(self, printer: Printer) -> None:
        for key in ("min", "max"):
            bound = getattr(self, key)
            if bound is not None:
                printer.print_string(f" {key} ")
                print_number(printer, bound.data)

    @classmethod
    def parse_extra(cls, parser: Parser) -> dict:
        out = {}
        for key in ("min", "max"):
            if parser.parse_optional_keyword(key):
                out[key] = parse_number(parser)
        return out


@irdl_op_definition
class CastOp(_UnaryOp):
    """`%r = gemm.cast %x to bf16`: rounds to `dtype` (the value stays f32 in the IR)."""
    name = "gemm.cast"
    dtype = prop_def(StringAttr)

    def __init__(self, input: SSAValue | Operation, dtype: str | DType):
        super().__init__(input, {"dtype": StringAttr(str(dtype))})

    def verify_(self) -> None:
        super().verify_()
        if self.dtype.data not in {d.value for d in OUTPUT_DTYPES}:
            raise VerifyException(f"gemm.cast to {self.dtype.data}: use bf16, f16 or f32")

    def print_extra(self, printer: Printer) -> None:
        printer.print_string(f" to {self.dtype.data}")

    @classmethod
    def parse_extra(cls, parser: Parser) -> dict:
        parser.parse_keyword("to")
        return {"dtype": parser.parse_identifier("cast dtype")}


@irdl_op_definition
class ConstOp(_EpilogueValueOp):
    """`%c = gemm.const 0.5`: a compile-time constant of the epilogue."""
    name = "gemm.const"
    value = prop_def(FloatData)

    def __init__(self, value: float):
        super().__init__(properties={"value": FloatData(float(value))}, result_types=[f32])

    def verify_(self) -> None:
        super().verify_()
        if not math.isfinite(self.value.data):   # as GemmSpec and the DSL: an epilogue constant is finite
            raise VerifyException(f"gemm.const {self.value.data} is not finite; use a finite number")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        print_number(printer, self.value.data)

    @classmethod
    def parse(cls, parser: Parser) -> "ConstOp":
        return cls(parse_number(parser))


@irdl_op_definition
class YieldOp(_EpilogueOp):
    """Ends the epilogue: the value stored to the output (converted to its dtype)."""
    name = "gemm.yield"
    value = operand_def(f32)
    traits = traits_def(IsTerminator())

    def __init__(self, value: SSAValue | Operation):
        super().__init__(operands=[value])

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.value)

    @classmethod
    def parse(cls, parser: Parser) -> "YieldOp":
        return cls(parser.parse_operand(f32))


ELEMENTWISE_OPS: dict[str, type[_ElementwiseOp]] = {
    c.name.split('.')[1]: c for c in (AddOp, SubOp, MulOp, DivOp, ReluOp, GeluTanhOp, GeluErfOp, SiluOp, SigmoidOp, TanhOp,
                      ClampOp, CastOp)}


def verify_epilogue_region(region: Region, inputs, where: str) -> None:
    """One block: (acc, one f32 per input) -> elementwise ops -> gemm.yield."""
    if len(region.blocks) != 1:
        raise VerifyException(f"{where}: the epilogue region must have one block")
    block = region.blocks.first
    if len(block.args) != 1 + len(inputs):
        raise VerifyException(f"{where}: the epilogue block takes the accumulator and {len(inputs)} input(s), "
                              f"got {len(block.args)} argument(s)")
    if any(a.type != f32 for a in block.args):
        raise VerifyException(f"{where}: epilogue block arguments are f32")
    if not isinstance(block.last_op, YieldOp):
        raise VerifyException(f"{where}: the epilogue must end with gemm.yield")
    for op in block.ops:
        if not isinstance(op, _EpilogueOp):
            raise VerifyException(f"{where}: {op.name} is not an elementwise epilogue op")


# ---- the matmul ----------------------------------------------------------------------------

def scale_layouts(mode: str) -> tuple[str, str]:
    """The !gemmc.tensor layouts of A's and B's scales under scaling `mode`."""
    return {"tensor": ("scalar", "scalar"), "row": ("col", "row"), "block": ("mk", "nk")}[mode]


def scale_dims(mode: str, m, n, k, groups=None, group_layout: str | None = None) -> tuple[tuple, tuple]:
    """The IR dims of A's and B's scales (a per-tensor scale is a scalar; a grouped GEMM's lead with E where its
    operands do: gemmc.spec.scale_shapes)."""
    return ((), ()) if mode == "tensor" else scale_shapes(mode, m, n, k, groups, group_layout)


class GemmSignature(IRDLOperation):
    """Operands, result and epilogue shared by gemm.matmul and kernel.gemm, and their syntax:
    `@name(%a, %b) [scaled <mode>(%sa, %sb)] inputs(%x, ...) acc f32 -> !gemmc.tensor<...>`, then the op's own
    header (`print_header`, on indented continuation lines), then its one region."""
    a = operand_def(TensorType)
    b = operand_def(TensorType)
    groups = opt_operand_def(TensorType)   # a grouped GEMM's offsets or counts
    scales = var_operand_def(TensorType)   # an fp8 GEMM's A and B scales (none otherwise)
    inputs = var_operand_def(TensorType)
    out = result_def(TensorType)
    kernel_name = prop_def(StringAttr)
    acc_dtype = prop_def(StringAttr)
    gate = opt_prop_def(StringAttr)        # a gated GEMM's gate activation (B is [gate; up])
    scaling = opt_prop_def(StringAttr)     # an fp8 GEMM's scaling mode (gemmc.spec.SCALINGS)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, name: str, a: SSAValue, b: SSAValue, inputs, out_type: TensorType, acc_dtype: str,
                 region: Region, properties: dict, gate: str | None = None, groups: SSAValue | None = None,
                 scaled: tuple | None = None):
        """`properties` are the op's own, after the signature's; `region` is its one region. `groups`: a grouped
        GEMM's group operand; `scaled`: an fp8 GEMM's (mode, A's scale, B's scale)."""
        props = {"kernel_name": StringAttr(name), "acc_dtype": StringAttr(str(acc_dtype)), **properties}
        if gate is not None:
            props["gate"] = StringAttr(gate)
        scales = []
        if scaled is not None:
            props["scaling"] = StringAttr(scaled[0])
            scales = list(scaled[1:])
        super().__init__(operands=[a, b, [groups] if groups is not None else [], scales, list(inputs)],
                         result_types=[out_type], properties=props, regions=[region])
        self.out.name_hint = "out"

    @property
    def group_layout(self) -> str | None:
        """"contiguous" | "masked" for a grouped GEMM (its group operand's layout says which), else None."""
        if self.groups is None:
            return None
        return {operand: layout for layout, operand in GROUP_OPERANDS.items()}.get(self.groups.type.layout.data)

    @property
    def scaled(self) -> tuple | None:
        """(mode, A's scale, B's scale) of an fp8 GEMM, else None: what the constructor takes back."""
        return None if self.scaling is None else (self.scaling.data, *self.scales)

    def signature_verify(self, where: str) -> None:
        a, b, out = self.a.type, self.b.type, self.out.type
        for what, t, layouts in (("A", a, ("mk", "km")), ("B", b, ("nk", "kn")), ("the output", out, ("mn",))):
            if not isinstance(t, TensorType) or t.layout.data not in layouts:
                raise VerifyException(f"{where}: {what} must be a !gemmc.tensor with layout {' or '.join(layouts)}")
        if self.groups is not None:
            self._groups_verify(where)
        (am, ak) = a.dims[-2:] if a.layout.data == "mk" else a.dims[-2:][::-1]
        (bn, bk) = b.dims[-2:] if b.layout.data == "nk" else b.dims[-2:][::-1]
        om, on = out.dims[-2:]
        if ak != bk:
            raise VerifyException(f"{where}: A has K={ak} but B has K={bk}")
        self._verify_scales(where, am, bn if self.gate is None else on, ak)
        if self.gate is not None:
            if self.gate.data not in GATE_ACTIVATIONS:
                raise VerifyException(f"{where}: gate {self.gate.data!r}; use one of {GATE_ACTIVATIONS}")
            if (a.layout.data, b.layout.data) != ("mk", "nk") or (a.batch is not None and self.groups is None):
                raise VerifyException(f"{where}: a gated GEMM takes an unbatched mk A and an nk B ([gate; up])")
            if not (isinstance(on, int) and bn == 2 * on):
                raise VerifyException(f"{where}: a gated GEMM's B is [gate; up], 2N x K, for an output of N "
                                      f"columns: B has {bn} rows, the output {on} columns (N must be static)")
            bn = on
        if (am, bn) != (om, on):
            raise VerifyException(f"{where}: A x B is {am} x {bn} but the output is {om} x {on}")
        if not (a.batch == b.batch == out.batch) and self.group_layout != "contiguous":
            raise VerifyException(f"{where}: batch dims differ: A {a.batch}, B {b.batch}, output {out.batch}")
        if self.acc_dtype.data not in {d.value for d in ACC_DTYPES}:
            raise VerifyException(f"{where}: accumulator dtype {self.acc_dtype.data}; use f32 or f16")
        for x in self.inputs:
            t = x.type
            if not isinstance(t, TensorType) or t.layout.data not in INPUT_KINDS:
                raise VerifyException(f"{where}: epilogue input {arg_name(x)} needs a !gemmc.tensor with layout "
                                      f"one of {INPUT_KINDS}")
            # a full input is batched as the output is (the spec reads its dims from the problem's)
            want = {"scalar": (), "row": (on,), "col": (om,), "full": out.dims}[t.layout.data]
            if t.dims != want:
                raise VerifyException(f"{where}: {t.layout.data} input {arg_name(x)} must have dims {want}, "
                                      f"got {t.dims}")
        verify_epilogue_region(self.epilogue_region, self.inputs, where)

    def _groups_verify(self, where: str) -> None:
        """A grouped GEMM: an i32 group operand of E groups; B one weight per group; A and the output (M, .) rows
        of every group (contiguous) or (E, M, .) (masked); scalar epilogue inputs only."""
        a, b, out, g = self.a.type, self.b.type, self.out.type, self.groups.type
        layout = self.group_layout
        if layout is None or g.dtype.data != "i32" or len(g.dims) != 1:
            raise VerifyException(f"{where}: the group operand {arg_name(self.groups)} must be a "
                                  "!gemmc.tensor<E x i32, offsets> (contiguous) or <E x i32, counts> (masked)")
        (e,) = g.dims
        lead = {"contiguous": None, "masked": e}[layout]
        for what, t, want in (("A", a, lead), ("B", b, e), ("the output", out, lead)):
            if t.batch != want:
                raise VerifyException(f"{where}: {layout} groups: {what} has leading dim {t.batch}, not "
                                      + (f"E = {e}" if want is not None else "none (the groups' rows are its rows)"))
        if a.layout.data != "mk":
            raise VerifyException(f"{where}: a grouped GEMM's A is mk (the groups' rows are its rows)")
        vectors = [arg_name(x) for x in self.inputs if x.type.layout.data != "scalar"]
        if vectors:
            raise VerifyException(f"{where}: a grouped GEMM reads scalar epilogue inputs only, not {vectors}")
    def _verify_scales(self, where: str, m, n, k) -> None:
        """Without scaling: one element type feeds the MMA. With it: fp8 A and B, and A's and B's f32 scales
        typed as their scaling says."""
        a, b = self.a.type.dtype.data, self.b.type.dtype.data
        if self.scaling is None:
            if self.scales:
                raise VerifyException(f"{where}: scales without a scaling mode: write `scaled <mode>(%sa, %sb)`")
            if a != b:
                raise VerifyException(f"{where}: A is {a} but B is {b}: the tensor cores have no mixed MMA; give A "
                                      "and B the same element type (or fp8 ones with `scaled <mode>(...)`)")
            return
        mode = self.scaling.data
        if mode not in SCALINGS:
            raise VerifyException(f"{where}: scaling {mode!r}; use one of {SCALINGS}")
        if a not in {d.value for d in FP8_A_DTYPES} or b not in {d.value for d in FP8_B_DTYPES}:
            raise VerifyException(f"{where}: scaling {mode} takes an fp8 A (f8e4m3) and B (f8e4m3 or f8e5m2), got "
                                  f"{a} and {b}")
        if len(self.scales) != 2:
            raise VerifyException(f"{where}: scaling {mode} takes two scales (A's, B's), got {len(self.scales)}")
        if mode == "block" and not (isinstance(n, int) and isinstance(k, int)):
            raise VerifyException(f"{where}: block scaling needs static N and K (its scales count 128-blocks)")
        grouped = ()
        if self.groups is not None:
            if mode != "block":
                raise VerifyException(f"{where}: a grouped GEMM takes block scales, not {mode} ones")
            grouped = (self.groups.type.dims[0], self.group_layout)
        for side, x, layout, dims in zip("AB", self.scales, scale_layouts(mode), scale_dims(mode, m, n, k, *grouped)):
            t = x.type
            if not isinstance(t, TensorType) or (t.layout.data, t.dims, t.dtype.data) != (layout, dims, "f32"):
                want = TensorType.make(dims, "f32", layout)
                raise VerifyException(f"{where}: {side}'s {mode} scale {arg_name(x)} must be {want}, got {t}")

    @property
    def epilogue_region(self) -> Region:
        return self.epilogue

    def print(self, printer: Printer) -> None:
        self.print_signature(printer)
        with printer.indented(2):   # continuation lines keep the header readable
            self.print_header(printer)
        printer.print_string(" ")
        printer.print_region(self.regions[0])

    def print_header(self, printer: Printer) -> None:
        """The op's own part, between the signature and its region; its `parse` reads it back."""
        raise NotImplementedError

    def print_signature(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_symbol_name(self.kernel_name.data)
        with printer.in_parens():
            printer.print_list([self.a, self.b], printer.print_operand)
        if self.groups is not None:
            printer.print_string(f" grouped {self.group_layout}")
            with printer.in_parens():
                printer.print_operand(self.groups)
        if self.scaling is not None:
            printer.print_string(f" scaled {self.scaling.data}")
            with printer.in_parens():
                printer.print_list(self.scales, printer.print_operand)
        if self.inputs:
            printer.print_string(" inputs")
            with printer.in_parens():
                printer.print_list(self.inputs, printer.print_operand)
        printer.print_string(f" acc {self.acc_dtype.data}")
        if self.gate is not None:
            printer.print_string(f" gate {self.gate.data}")
        printer.print_string(" -> ")
        printer.print_attribute(self.out.type)

    @staticmethod
    def parse_signature(parser: Parser) -> tuple:
        """((name, a, b, inputs, out_type, acc_dtype), options): the leading arguments of the op's constructor,
        and its keyword ones: gate (the gate activation, None: not gated), groups (the group operand) and scaled
        (an fp8 GEMM's scaling: None, or (mode, sa, sb))."""
        name = parser.parse_symbol_name().data
        a, b = parser.parse_comma_separated_list(parser.Delimiter.PAREN, lambda: parse_defined_operand(parser))
        groups = None
        if parser.parse_optional_keyword("grouped"):
            layout = parser.parse_identifier("group layout (contiguous or masked)")
            if layout not in GROUP_OPERANDS:
                parser.raise_error(f"group layout {layout!r}; use one of {tuple(GROUP_OPERANDS)}")
            parser.parse_punctuation("(")
            groups = parse_defined_operand(parser)
            parser.parse_punctuation(")")
            if not isinstance(groups.type, TensorType) or groups.type.layout.data != GROUP_OPERANDS[layout]:
                parser.raise_error(f"grouped {layout}: the group operand must be a !gemmc.tensor<E x i32, "
                                   f"{GROUP_OPERANDS[layout]}>")
        scaled = None
        if parser.parse_optional_keyword("scaled"):
            mode = parser.parse_identifier("scaling mode")
            scaled = (mode, *parser.parse_comma_separated_list(parser.Delimiter.PAREN,
                                                               lambda: parse_defined_operand(parser)))
        inputs = []
        if parser.parse_optional_keyword("inputs"):
            inputs = parser.parse_comma_separated_list(parser.Delimiter.PAREN, lambda: parse_defined_operand(parser))
        parser.parse_keyword("acc")
        acc = parser.parse_identifier("accumulator dtype")
        gate = parser.parse_identifier("gate activation") if parser.parse_optional_keyword("gate") else None
        parser.parse_punctuation("->")
        out = parser.parse_type()
        return (name, a, b, inputs, out, acc), {"gate": gate, "groups": groups, "scaled": scaled}


@irdl_op_definition
class MatmulOp(GemmSignature):
    """out = epilogue(A x B): the one matmul of a gemmc kernel, with an optional schedule."""
    name = "gemm.matmul"
    schedule = opt_prop_def(ScheduleAttr)
    epilogue = region_def("single_block")

    def __init__(self, name: str, a: SSAValue, b: SSAValue, inputs, out_type: TensorType, acc_dtype: str,
                 epilogue: Region, schedule: ScheduleAttr | None = None, gate: str | None = None,
                 groups: SSAValue | None = None, scaled: tuple | None = None):
        super().__init__(name, a, b, inputs, out_type, acc_dtype, epilogue,
                         {} if schedule is None else {"schedule": schedule}, gate, groups, scaled)

    def verify_(self) -> None:
        self.signature_verify("gemm.matmul")

    def print_header(self, printer: Printer) -> None:
        if self.schedule is not None:
            printer.print_string("\nschedule ")
            printer.print_attribute(self.schedule)
        printer.print_string(" epilogue")

    @classmethod
    def parse(cls, parser: Parser) -> "MatmulOp":
        signature, options = cls.parse_signature(parser)
        schedule = parser.parse_attribute() if parser.parse_optional_keyword("schedule") else None
        parser.parse_keyword("epilogue")
        return cls(*signature, parser.parse_region(), schedule, **options)


def identity_epilogue(num_inputs: int) -> Region:
    block = Block(arg_types=[f32] * (1 + num_inputs))
    block.add_op(YieldOp(block.args[0]))
    return Region(block)


Gemm = Dialect("gemm", [ArgOp, MatmulOp, ConstOp, YieldOp, *ELEMENTWISE_OPS.values()], [])
