"""The `Tracer` of one kernel function: it records the matmul and the epilogue ops that traced values ask for,
checking each (operand kinds, broadcasting, dtypes) as it is recorded."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Union

from ..spec import SCALE_BLOCK, SCALINGS, Dim, EpilogueOp, Ref, Scaling, scale_shapes
from ..types import ACC_DTYPES, FP8_A_DTYPES, FP8_B_DTYPES, INPUT_DTYPES, DType
from .locations import trace_error
from .parameter_types import GroupIndexType, TensorType, fmt_shape
from .values import Value


@dataclass
class Matmul:
    """The kernel's one matmul, as traced: operand parameters, layouts, dims, dtype and its line."""
    a: str           # parameter names
    b: str
    a_layout: str
    b_layout: str
    m: Dim
    n: Dim
    k: Dim
    batch: Dim | None
    dtype: DType
    line: str
    groups: Dim | None = None           # a grouped matmul (gemmc.grouped_mm): the group count E,
    group_layout: str | None = None     # its layout,
    group_param: str | None = None      # and the parameter that says which rows are whose
    b_dtype: DType | None = None     # B's, where it differs from A's (an fp8 e5m2 B)
    scaling: Scaling | None = None   # fp8: the scales' mode and parameter names


class Tracer:
    def __init__(self, fn, acc_dtype: DType):
        self.fn = fn
        self.acc_dtype = acc_dtype
        self.params: dict[str, Union[TensorType, GroupIndexType, str]] = {}   # name -> its type, or "scalar"
        self.param_lines: dict[str, str] = {}
        self.ops: list[EpilogueOp] = []
        self.mm: Matmul | None = None
        self.acc_shape: tuple = ()
        self.epilogue_uses: dict[str, list[tuple[tuple, str]]] = {}  # param -> [(shape used, line)]

    def param_kind(self, name: str) -> str:
        """"scalar", "groups" (a grouped GEMM's offsets or counts) or "tensor"."""
        t = self.params[name]
        return "scalar" if t == "scalar" else ("groups" if isinstance(t, GroupIndexType) else "tensor")

    # -- operands --
    def _as_operand(self, x, where: str, sym: str):
        """(Ref, shape, on_acc) for an operand of an elementwise op."""
        if isinstance(x, Value):
            if x._tracer is not self:
                raise trace_error(where, "a value from another traced kernel")
            if x._ref is not None:
                return x._ref, x._shape, x._on_acc
            # a raw parameter entering the epilogue
            name = x._param
            if self.param_kind(name) == "groups":
                raise trace_error(where, f"parameter {name} ({self.params[name]!r}) says which rows belong to which "
                                  "group: pass it to gemmc.grouped_mm, not to an epilogue op")
            if self.mm is not None and name in (self.mm.a, self.mm.b):
                raise trace_error(where, f"parameter {name} is a matmul operand and cannot also be an epilogue input; "
                                  "pass it twice as two parameters")
            if x._transposed:
                raise trace_error(where, f"transpose of epilogue input {name}: declare it in the (M, N) orientation")
            self.epilogue_uses.setdefault(name, []).append((x._shape, where))
            return Ref.input(name), x._shape, False
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise trace_error(where, f"operand {x!r} of `{sym}`: use a traced tensor, a gemmc.Scalar parameter or a "
                              "python number")
        if not math.isfinite(float(x)):
            raise trace_error(where, f"constant {x!r} of `{sym}` is not finite")
        return Ref.const(x), (), False

    def _broadcast(self, sym, lhs, rhs, where, names):
        ls, rs = lhs, rhs
        n = max(len(ls), len(rs))
        lp = (1,) * (n - len(ls)) + tuple(ls)
        rp = (1,) * (n - len(rs)) + tuple(rs)
        out = []
        for dl, dr in zip(lp, rp):
            if dl == dr or dr == 1:
                out.append(dl)
            elif dl == 1:
                out.append(dr)
            else:
                hint = ""
                if self.acc_shape:
                    m, nn = self.acc_shape[-2], self.acc_shape[-1]
                    hint = (f"; the output is {fmt_shape(self.acc_shape)}: a row vector (bias) has shape ({nn},), "
                            f"a column vector ({m},) is used as `col[:, None]`, a full input is ({m}, {nn})")
                raise trace_error(where, f"shape mismatch in `{sym}`: {names[0]} {fmt_shape(ls)} and {names[1]} "
                                  f"{fmt_shape(rs)} do not broadcast ({dl} vs {dr}){hint}")
        return tuple(out)

    @staticmethod
    def _describe(x) -> str:
        if isinstance(x, Value):
            if x._param is not None and x._ref is None:
                return x._param
            if x._ref is not None and x._ref.kind == "input":
                return x._ref.value
            return "the accumulator" if x._ref == Ref.acc() else "value"
        return "constant"

    def _emit(self, op, args, shape, on_acc, where, attrs=()) -> Value:
        self.ops.append(EpilogueOp(op, tuple(args), tuple(attrs), line=where))
        return Value(self, Ref.node(len(self.ops) - 1), shape, on_acc=on_acc, line=where)

    def binary(self, op, sym, lhs, rhs, where) -> Value:
        lr, ls, la = self._as_operand(lhs, where, sym)
        rr, rs, ra = self._as_operand(rhs, where, sym)
        shape = self._broadcast(sym, ls, rs, where, (self._describe(lhs), self._describe(rhs)))
        return self._emit(op, (lr, rr), shape, la or ra, where)

    def unary(self, op, x, where, attrs=()) -> Value:
        r, s, on_acc = self._as_operand(x, where, op)
        if r.kind == "const":
            raise trace_error(where, f"{op} of a python number: compute constants in python")
        return self._emit(op, (r,), s, on_acc, where, attrs)

    # -- the matmul --
    def matmul(self, lhs, rhs, where, grouped: tuple = ()) -> Value:
        """The matmul `lhs @ rhs`; `grouped`: (E, layout) of gemmc.grouped_mm's, whose B is one group's matrix."""
        for x in (lhs, rhs):
            if not isinstance(x, Value):
                raise trace_error(where, f"matmul with {x!r}: both operands must be tensor parameters")
            if x._on_acc:
                raise trace_error(where, "matmul of an epilogue value (a value computed from the matmul result): "
                                  "gemmc compiles exactly one matmul followed by elementwise ops")
        if self.mm is not None:
            raise trace_error(where, f"a second matmul (the first is at {self.mm.line}): a gemmc kernel has exactly "
                              "one matmul; write two kernels")
        for x, side in ((lhs, "left"), (rhs, "right")):
            if x._param is not None and self.param_kind(x._param) != "tensor":
                what = "scalar" if self.param_kind(x._param) == "scalar" else repr(self.params[x._param])
                raise trace_error(where, f"the {side} matmul operand {x._param} is a {what}; matmul operands are "
                                  "tensor parameters")
            if x._param is None or x._ref is not None:
                raise trace_error(where, f"the {side} matmul operand is an elementwise result, not a tensor parameter: "
                                  "ops before the matmul (prologue fusion) are not supported")
            declared = self.params[x._param].shape
            expected = declared[:-2] + declared[-2:][::-1] if x._transposed else declared
            if grouped:     # a grouped matmul's contiguous A meets one group's B: its last two dims
                expected = expected[len(expected) - len(x._shape):]
            if len(declared) < 2 or x._shape != expected:
                raise trace_error(where, f"matmul operand {x._param} {fmt_shape(x._shape)}: operands are (M, K) / "
                                  "(K, N) matrices, optionally with a leading batch dim, and not indexed")
            if x._param in self.epilogue_uses:
                raise trace_error(where, f"parameter {x._param} is used in the epilogue and as a matmul operand; "
                                  "pass it twice as two parameters")
        if lhs._param == rhs._param:
            raise trace_error(where, f"{lhs._param} is both matmul operands: pass it twice as two parameters")
        ta, tb = self.params[lhs._param], self.params[rhs._param]
        if len(lhs._shape) != len(rhs._shape):
            raise trace_error(where, f"matmul of rank {len(lhs._shape)} {lhs._param} and rank {len(rhs._shape)} "
                              f"{rhs._param}: both are (M, K)/(K, N) or both batched (L, M, K)/(L, K, N)")
        batch = None
        if len(lhs._shape) == 3:
            if lhs._shape[0] != rhs._shape[0]:
                raise trace_error(where, f"matmul batch dimension mismatch: {lhs._param} has L={lhs._shape[0]}, "
                                  f"{rhs._param} has L={rhs._shape[0]}")
            batch = lhs._shape[0]
        m, ka = lhs._shape[-2:]
        kb, n = rhs._shape[-2:]
        if ka != kb:
            raise trace_error(where, f"matmul dimension mismatch: K of {lhs._param} {fmt_shape(lhs._shape)} is {ka} "
                              f"but K of {rhs._param} {fmt_shape(rhs._shape)} is {kb}; declare both with the same K "
                              "(check for a missing .T)")
        self._check_dtypes(ta.dtype, tb.dtype, where)
        scaling = self._scaling(lhs, rhs, (m, n, ka) + tuple(grouped), where)
        self.mm = Matmul(lhs._param, rhs._param, "km" if lhs._transposed else "mk",
                         "nk" if rhs._transposed else "kn", m, n, ka, batch, ta.dtype, where,
                         b_dtype=tb.dtype if tb.dtype != ta.dtype else None, scaling=scaling)
        self.acc_shape = ((batch,) if batch is not None else ()) + (m, n)
        return Value(self, Ref.acc(), self.acc_shape, on_acc=True, line=where)

    def grouped_matmul(self, lhs, rhs, groups, where) -> Value:
        """gemmc.grouped_mm(a, b, offsets_or_counts): E matmuls in one, group g's rows of A times its B[g]."""
        if not (isinstance(groups, Value) and groups._param is not None
                and self.param_kind(groups._param) == "groups"):
            raise trace_error(where, f"gemmc.grouped_mm's third argument is {self._describe(groups)}: pass the "
                              "parameter annotated gemmc.GroupOffsets[E] (contiguous groups) or gemmc.GroupCounts[E] "
                              "(masked groups)")
        g = self.params[groups._param]
        for x in (lhs, rhs):
            if isinstance(x, Value) and x._param is not None and x._ref is None and len(x._shape) == 3 \
                    and x._shape[0] != g.groups:
                raise trace_error(where, f"{x._param} has {x._shape[0]} groups (its leading dim) but "
                                  f"{groups._param} is {g!r}: declare both with the same E")
        if not (isinstance(rhs, Value) and len(rhs._shape) == 3):
            raise trace_error(where, f"gemmc.grouped_mm's B is {self._describe(rhs)} of shape "
                              f"{fmt_shape(getattr(rhs, '_shape', ()))}: declare one weight per group, (E, N, K) "
                              "used as `w.mT` or (E, K, N)")
        want = 2 if g.layout == "contiguous" else 3
        if isinstance(lhs, Value) and len(lhs._shape) != want:
            shape = "(M, K), the groups' rows sorted by group" if want == 2 else "(E, M, K), M rows per group"
            raise trace_error(where, f"gemmc.grouped_mm's A {self._describe(lhs)} has shape {fmt_shape(lhs._shape)} "
                              f"but {groups._param} is {g!r} ({g.layout} groups): declare A {shape}")
        if want == 2:   # A (M, K) against one (K, N) matrix per group: matmul checks the 2-D product
            rhs = Value(self, None, rhs._shape[1:], param=rhs._param, transposed=rhs._transposed, line=rhs._line,
                        scale=rhs._scale)
        result = self.matmul(lhs, rhs, where, grouped=(g.groups, g.layout))
        mm = self.mm
        mm.batch = None
        mm.groups, mm.group_layout, mm.group_param = g.groups, g.layout, groups._param
        return result

    def _check_dtypes(self, da: DType, db: DType, where):
        if da.bits == 8 or db.bits == 8:
            if da not in FP8_A_DTYPES or db not in FP8_B_DTYPES:
                raise trace_error(where, f"matmul of {da} @ {db}: fp8 matmuls take an f8e4m3 A and an f8e4m3 or "
                                  "f8e5m2 B (both fp8, each with its scale)")
            if self.acc_dtype != DType.f32:
                raise trace_error(where, f"accumulator dtype {self.acc_dtype} with fp8 inputs: fp8 MMAs accumulate "
                                  "in f32; use acc_dtype=gemmc.f32")
            return
        for dt in (da, db):
            if dt not in INPUT_DTYPES:
                raise trace_error(where, f"matmul of {dt} inputs: the tensor-core paths take bf16 or f16 (or fp8 "
                                  "with scales); cast the operands to bf16")
        if da != db:
            raise trace_error(where, f"matmul mixes dtypes {da} @ {db}: the hardware has no mixed {da}/{db} MMA; "
                              "declare both operands with the same dtype")
        if self.acc_dtype not in ACC_DTYPES:
            raise trace_error(where, f"accumulator dtype {self.acc_dtype}: use f32 (or f16 with f16 inputs)")
        if self.acc_dtype == DType.f16 and da != DType.f16:
            raise trace_error(where, f"f16 accumulation with {da} inputs: the tensor cores have no {da}->f16 MMA; "
                              "use acc_dtype=gemmc.f32 or f16 inputs")

    def _scaling(self, lhs: Value, rhs: Value, problem: tuple, where) -> Scaling | None:
        """The scaling of `gemmc.scaled(a, sa) @ gemmc.scaled(b, sb)`, from the scales' declared shapes; None
        for a plain matmul. fp8 operands need scales and only they take them. `problem`: (M, N, K), and a
        grouped matmul's (E, layout), whose scales are block scales with its groups' dims."""
        m, n, k = problem[:3]
        sa, sb = lhs._scale, rhs._scale
        fp8 = [x._param for x in (lhs, rhs) if self.params[x._param].dtype.bits == 8]
        use = "write gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T"
        if sa is None and sb is None:
            if fp8:
                raise trace_error(where, f"fp8 operand(s) {', '.join(fp8)} without scales: fp8 matmuls dequantize "
                                  f"each operand with an f32 scale; {use}")
            return None
        if sa is None or sb is None:
            bare = lhs._param if sa is None else rhs._param
            raise trace_error(where, f"only one matmul operand has a scale ({bare} has none): scale both; {use}")
        if len(fp8) < 2:
            plain = [x._param for x in (lhs, rhs) if x._param not in fp8]
            raise trace_error(where, f"gemmc.scaled on the {self.params[plain[0]].dtype} operand {plain[0]}: scales "
                              "dequantize fp8 operands (f8e4m3 A, f8e4m3 or f8e5m2 B); quantize it, or drop "
                              "gemmc.scaled")
        if sa == sb:
            raise trace_error(where, f"{sa} scales both operands: pass it twice as two parameters")
        for s in (sa, sb):
            if s in (lhs._param, rhs._param):
                raise trace_error(where, f"{s} is a matmul operand and a scale: pass it twice as two parameters")
            if s in self.epilogue_uses:
                raise trace_error(where, f"the scale {s} is also used in the epilogue: pass it twice as two "
                                  "parameters")
            dt = self.params[s].dtype
            if dt != DType.f32:
                raise trace_error(where, f"the scale {s} is {dt}: scales are f32 (convert it with .float())")
        shapes = {s: tuple(self.params[s].shape) for s in (sa, sb)}
        static = isinstance(k, int) and isinstance(n, int)
        # the shapes each mode takes (a grouped matmul's: block scales only)
        modes = ("block",) if len(problem) > 3 else SCALINGS
        want = {mode: scale_shapes(mode, *problem) for mode in modes if mode != "block" or static}
        # the modes each shape fits (a length-1 vector of a 1-row problem is per tensor and per row alike)
        fits = {side: [mode for mode, pair in want.items()
                       if shapes[s] == pair[side == "b"] or (mode == "tensor" and shapes[s] == ())]
                for side, s in (("a", sa), ("b", sb))}
        common = [mode for mode in fits["a"] if mode in fits["b"]]
        if common:
            return Scaling(common[0], sa, sb)
        kb = -(-k // SCALE_BLOCK) if isinstance(k, int) else f"ceil({k}/{SCALE_BLOCK})"
        nb = -(-n // SCALE_BLOCK) if isinstance(n, int) else f"ceil({n}/{SCALE_BLOCK})"
        block_note = "" if static else " (block scales need a static N and K)"
        got = f"scale shapes {sa} {fmt_shape(shapes[sa])} and {sb} {fmt_shape(shapes[sb])}"
        if len(problem) > 3:
            groups, layout = problem[3:]
            a_shape = ((groups,) if layout == "masked" else ()) + (m, kb)
            raise trace_error(where, f"{got} are not the block scales of this {layout} grouped matmul of {groups} "
                              f"groups (M x N x K = {m} x {n} x {k}); a grouped fp8 GEMM takes block scales: A's "
                              f"{fmt_shape(a_shape)} (1 x 128 blocks of each row) and B's ({groups}, {nb}, {kb}) "
                              "(128 x 128 blocks of each group's weight)" + block_note)
        raise trace_error(where, f"{got} name no scaling gemmc takes for this M x N x K = {m} x {n} x {k} matmul; "
                          f"use per tensor () and (), per row ({m},) and ({n},), or per block ({m}, {kb}) and "
                          f"({nb}, {kb})" + block_note)
