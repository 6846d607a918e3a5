"""`GemmSpec`: what to compute, as plain data. The DSL traces into this; the IR is built from it.

Operands are passed in the storage shape their layout names, contiguous in the last dim:
  a_layout "mk": A is M x K        "km": A is K x M   (computes A.T @ ...)
  b_layout "nk": B is N x K (a @ b.T, the nn.Linear weight)   "kn": B is K x N (a @ b)
  C / the output is M x N, row-major. With `batch`, every operand gets a leading L dim.
With `gate` (a gated linear unit, e.g. SwiGLU), B is [gate; up] stacked, 2N x K ("nk"): the kernel computes
  gate(A @ B[:N].T) * (A @ B[N:].T), and the epilogue reads that product as its accumulator.
With `groups` (E) and `group_layout`, one launch runs E GEMMs (mixture-of-experts experts), each with its own B:
  "contiguous": A is M x K, rows sorted by group; B is E x N x K ("nk") or E x K x N ("kn"); an int32 device tensor
    `offsets` of E + 1 entries gives group g the rows offsets[g] .. offsets[g + 1] - 1 of A and of the M x N output
  "masked": A is E x M x K and the output E x M x N (M: the most rows a group holds); an int32 device tensor
    `counts` of E entries gives group g its first counts[g] rows
  Output rows outside every group (contiguous) or past a group's count (masked) are not written.
fp8 (`dtype` f8e4m3, `b_dtype` f8e4m3 or f8e5m2) takes f32 scales (`scaling`, a `Scaling`): the accumulator the
  epilogue reads is the dequantized product, sum_k (sa * A)[m, k] (sb * B)[k, n], accumulated in f32.
  A grouped fp8 GEMM takes block scales with its groups' leading dims (`scale_shapes`): each group's rows of A
  are scaled by their rows of A's scales, its weight by its own B scales.
"""
from __future__ import annotations

import keyword
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Union

from .errors import SpecError
from .types import (ACC_DTYPES, EPILOGUE_INPUT_DTYPES, FP8_A_DTYPES, FP8_B_DTYPES, FP8_DTYPES, OPERAND_DTYPES,
                    OUTPUT_DTYPES, DType, as_dtype)

Dim = Union[int, str]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Epilogue input kinds: how a tensor broadcasts over the M x N accumulator.
INPUT_KINDS = ("scalar", "row", "col", "full")  # row: length N (bias); col: length M; full: M x N
BINARY_OPS = ("add", "sub", "mul", "div")
UNARY_OPS = ("relu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh", "clamp", "cast")
EPILOGUE_OPS = BINARY_OPS + UNARY_OPS
REF_KINDS = ("acc", "input", "const", "node")
# gate activations of a gated GEMM (GLU family: SwiGLU is silu, GeGLU gelu_erf / gelu_tanh, ReGLU relu, GLU sigmoid)
GATE_ACTIVATIONS = ("silu", "gelu_erf", "gelu_tanh", "relu", "sigmoid")
# grouped GEMMs: how A and the output hold the groups' rows, and the int32 operand that says which rows are whose
GROUP_LAYOUTS = ("contiguous", "masked")
GROUP_OPERANDS = {"contiguous": "offsets", "masked": "counts"}


# fp8 scalings: one scale per tensor, per row of A and column of B, or DeepSeek-V3's blocks (1 x 128 of A,
# 128 x 128 of B); SCALE_BLOCK is the block's K (and B's N) extent
SCALINGS = ("tensor", "row", "block")
SCALE_BLOCK = 128
RESERVED_NAMES = ("a", "b", "out", "acc")


def _dtype_hint(dtype: DType) -> str:
    if dtype.bits == 8:
        return " (fp8 is an operand dtype only: A and B, with their scales)"
    return " (i32 is for runtime counters only)" if dtype == DType.i32 else ""


def _is_name(x) -> bool:
    return isinstance(x, str) and bool(_IDENT.match(x)) and not keyword.iskeyword(x) and x not in RESERVED_NAMES


@dataclass(frozen=True)
class Scaling:
    """How an fp8 GEMM's f32 scales dequantize A and B, and the names its two scale inputs are passed by.
      tensor  one scale each: A's and B's are one-element tensors         out = sa * sb * (A @ B)
      row     A's per row (M,), B's per output column (N,)              out[m, n] = sa[m] * sb[n] * (A @ B)[m, n]
      block   A's per 1 x 128 block, (M, ceil(K/128)); B's per 128 x 128 block, (ceil(N/128), ceil(K/128))
              (DeepSeek-V3): out[m, n] = sum_kb sa[m, kb] * sb[n // 128, kb] * (A @ B over k-block kb)[m, n]
    Scales are f32, contiguous; `scale_shapes` gives each one's shape."""
    mode: str
    a: str = "scale_a"
    b: str = "scale_b"

    def __post_init__(self):
        if self.mode not in SCALINGS:
            raise SpecError(f"scaling mode {self.mode!r}: use one of {SCALINGS} (one scale per tensor; per row of A "
                            "and column of B; per 1x128 block of A and 128x128 block of B)")
        for side in ("a", "b"):
            if not _is_name(getattr(self, side)):
                raise SpecError(f"scaling: {side}={getattr(self, side)!r} names a scale input: use an identifier "
                                f"other than {', '.join(RESERVED_NAMES)} and Python's keywords")
        if self.a == self.b:
            raise SpecError(f"scaling: A's and B's scales are both named {self.a!r}; give them two names")

    @property
    def names(self) -> tuple[str, str]:
        return self.a, self.b


@dataclass(frozen=True)
class EpilogueInput:
    """A tensor (or runtime scalar) the epilogue reads besides the accumulator."""
    name: str
    kind: str
    dtype: DType = DType.f32

    def __post_init__(self):
        object.__setattr__(self, "dtype", as_dtype(self.dtype, EPILOGUE_INPUT_DTYPES))
        if not _is_name(self.name):
            raise SpecError(f"epilogue input name {self.name!r} must be an identifier other than a, b, out, acc "
                            "and Python's keywords")
        if self.kind not in INPUT_KINDS:
            raise SpecError(f"epilogue input {self.name!r} has kind {self.kind!r}; use one of {INPUT_KINDS}")
        if self.dtype not in EPILOGUE_INPUT_DTYPES:   # the backends load bf16/f16/f32 and widen to f32
            raise SpecError(f"epilogue input {self.name!r} has dtype {self.dtype}{_dtype_hint(self.dtype)}; use "
                            f"{', '.join(d.value for d in EPILOGUE_INPUT_DTYPES)} (convert the tensor before the call)")


@dataclass(frozen=True)
class Ref:
    """A value an epilogue op reads: the accumulator, an input, a constant or an earlier op."""
    kind: str  # "acc" | "input" | "const" | "node"
    value: Union[str, float, int, None] = None

    @staticmethod
    def acc() -> "Ref":
        return Ref("acc")

    @staticmethod
    def input(name: str) -> "Ref":
        return Ref("input", name)

    @staticmethod
    def const(x: float) -> "Ref":
        return Ref("const", float(x))

    @staticmethod
    def node(i: int) -> "Ref":
        return Ref("node", int(i))

    def __str__(self) -> str:
        if self.kind == "acc":
            return "%acc"
        if self.kind == "input":
            return f"%{self.value}"
        if self.kind == "node":
            return f"%v{self.value}"
        return repr(self.value)


@dataclass(frozen=True)
class EpilogueOp:
    """One elementwise op. Math is in f32; `cast` rounds to its dtype (attrs: dtype)."""
    op: str
    args: tuple[Ref, ...]
    attrs: tuple[tuple[str, object], ...] = ()
    # Source location of the traced expression, for error messages only: not part of equality or
    # the hash, so a traced kernel equals the hand-written spec (and shares its cache key).
    line: str = field(default="", compare=False)

    def attr(self, name, default=None):
        return dict(self.attrs).get(name, default)


def scale_shapes(mode: str, m: Dim, n: Dim, k: Dim, groups: Dim | None = None,
                 group_layout: str | None = None) -> tuple[tuple[Dim, ...], tuple[Dim, ...]]:
    """A's and B's scale shapes under `mode` for an M x N x K problem (block scaling needs static N and K).
    A grouped GEMM's (block scaling only) lead with its groups where its operands do: B's (E, ceil(N/128),
    ceil(K/128)), one block grid per group's weight; A's (M, ceil(K/128)) over every group's rows (contiguous),
    or (E, M, ceil(K/128)) (masked)."""
    if mode == "tensor":
        return (1,), (1,)
    if mode == "row":
        return (m,), (n,)
    blocks = lambda d: -(-d // SCALE_BLOCK)  # noqa: E731
    a, b = (m, blocks(k)), (blocks(n), blocks(k))
    if group_layout is None:
        return a, b
    return ((groups,) + a if group_layout == "masked" else a), (groups,) + b


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


_F32_MAX = 3.4028234663852886e38
_F32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103      # from here on, rounding to f32 gives inf


def _check_number(x, what: str, fix: str) -> None:
    """Epilogue constants and clamp bounds: finite real numbers (the DSL rejects inf and nan the same way)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise SpecError(f"{what} {x!r} is not a number; write {fix} with a python float")
    if not math.isfinite(x):
        raise SpecError(f"{what} {x!r} is not finite; use a finite float")
    if abs(x) >= _F32_OVERFLOW:   # the kernel computes in f32: it would become inf there (torch.clamp raises)
        raise SpecError(f"{what} {x!r} is beyond the f32 range (|x| <= {_F32_MAX:.7g}); use a smaller value")


def _check_dim(name: str, d) -> Dim:
    if isinstance(d, bool):
        raise SpecError(f"dim {name}={d!r} must be a positive int or a name like 'M'")
    if isinstance(d, int):
        if d <= 0:
            raise SpecError(f"dim {name}={d} must be positive")
        return d
    if isinstance(d, str) and _IDENT.match(d):
        return d
    raise SpecError(f"dim {name}={d!r} must be a positive int or an identifier such as 'M' (symbolic)")


@dataclass(frozen=True)
class GemmSpec:
    """out[l, m, n] = epilogue(sum_k A[l, m, k] * B[l, k, n]) with the layouts above."""
    m: Dim = "M"
    n: Dim = "N"
    k: Dim = "K"
    dtype: DType = DType.bf16          # A and B
    out_dtype: DType | None = None     # defaults to `dtype`
    acc_dtype: DType = DType.f32
    a_layout: str = "mk"
    b_layout: str = "nk"
    batch: Dim | None = None
    inputs: tuple[EpilogueInput, ...] = ()
    epilogue: tuple[EpilogueOp, ...] = ()
    name: str = "gemm"
    gate: str | None = None            # a GATE_ACTIVATIONS name: B is [gate; up] (2N x K), see the module doc
    groups: Dim | None = None          # a grouped GEMM's group count E (experts), see the module doc
    group_layout: str | None = None    # a GROUP_LAYOUTS name, with `groups`
    b_dtype: DType | None = None       # defaults to `dtype`; fp8 A (e4m3) takes an e4m3 or e5m2 B
    scaling: Scaling | str | None = None   # fp8 only: a Scaling, or its mode (scales named scale_a, scale_b)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        for d in ("m", "n", "k"):
            set_(d, _check_dim(d, getattr(self, d)))
        if self.batch is not None:
            set_("batch", _check_dim("batch", self.batch))
        set_("dtype", as_dtype(self.dtype, OPERAND_DTYPES))
        set_("b_dtype", as_dtype(self.b_dtype, OPERAND_DTYPES) if self.b_dtype is not None else self.dtype)
        set_("acc_dtype", as_dtype(self.acc_dtype, ACC_DTYPES))
        # fp8 outputs are not written: an fp8 GEMM's output defaults to bf16
        default_out = DType.bf16 if self.dtype in FP8_DTYPES else self.dtype
        set_("out_dtype", as_dtype(self.out_dtype, OUTPUT_DTYPES) if self.out_dtype is not None else default_out)
        if isinstance(self.scaling, str):
            set_("scaling", Scaling(self.scaling))
        set_("inputs", tuple(self.inputs))
        set_("epilogue", tuple(self.epilogue))
        if self.dtype not in OPERAND_DTYPES:
            raise SpecError(f"input dtype {self.dtype} is not supported{_dtype_hint(self.dtype)}; use bf16 or f16 "
                            "(or f8e4m3 with scales)")
        if self.acc_dtype not in ACC_DTYPES:
            raise SpecError(f"accumulator dtype {self.acc_dtype} is not supported; use f32 (or f16 with f16 inputs)")
        self._check_fp8()
        if self.acc_dtype == DType.f16 and self.dtype != DType.f16:
            raise SpecError(f"f16 accumulation needs f16 inputs (the tensor cores have no {self.dtype}->f16 MMA); "
                            "use acc_dtype='f32'")
        if self.out_dtype not in OUTPUT_DTYPES:
            raise SpecError(f"output dtype {self.out_dtype} is not supported{_dtype_hint(self.out_dtype)}; "
                            "use bf16, f16 or f32")
        if self.a_layout not in ("mk", "km"):
            raise SpecError(f"a_layout={self.a_layout!r}; use 'mk' (A is M x K) or 'km' (A is K x M)")
        if self.b_layout not in ("nk", "kn"):
            raise SpecError(f"b_layout={self.b_layout!r}; use 'nk' (B is N x K, a @ b.T) or 'kn' (B is K x N, a @ b)")
        if not _IDENT.match(self.name):
            raise SpecError(f"name {self.name!r} must be an identifier")
        self._check_gate()
        self._check_groups()
        self._check_epilogue()

    def _check_fp8(self):
        """fp8 operands come with a Scaling (and only they do), A e4m3 and B e4m3 or e5m2, an f32 accumulator
        and a bf16/f16/f32 output; bf16/f16 GEMMs take one dtype for A and B."""
        fp8 = self.dtype in FP8_DTYPES
        if not fp8:
            if self.b_dtype != self.dtype:
                raise SpecError(f"b_dtype={self.b_dtype.value!r} with dtype={self.dtype.value!r}: the tensor cores "
                                f"have no mixed {self.dtype}/{self.b_dtype} MMA; give A and B one dtype (mixed fp8 "
                                "is f8e4m3 A with an f8e5m2 B)")
            if self.scaling is not None:
                raise SpecError(f"scaling={self.scaling.mode!r} with {self.dtype} inputs: scales dequantize fp8 "
                                "operands; use dtype='f8e4m3' (b_dtype 'f8e4m3' or 'f8e5m2'), or drop scaling")
            return
        if self.dtype not in FP8_A_DTYPES or self.b_dtype not in FP8_B_DTYPES:
            raise SpecError(f"fp8 operands {self.dtype} @ {self.b_dtype}: A is f8e4m3 and B f8e4m3 or f8e5m2 (e5m2's "
                            "range is for gradients, on the B side)")
        if self.scaling is None:
            raise SpecError(f"{self.dtype} inputs need scales: pass scaling='tensor', 'row' or 'block' (a "
                            "gemmc.Scaling names the scale inputs; in the DSL, "
                            "gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T)")
        if not isinstance(self.scaling, Scaling):
            raise SpecError(f"scaling={self.scaling!r}: use a gemmc.Scaling or one of {SCALINGS}")
        wrong = [f"{what} (use {need})" for what, ok, need in (
            (f"acc_dtype={self.acc_dtype.value!r}", self.acc_dtype == DType.f32, "'f32': fp8 MMAs accumulate in f32"),
            (f"gate={self.gate!r}", self.gate is None, "gate=None: a gated fp8 kernel is not built (block scaling "
             "would need two promoting accumulator chains); compute the [gate; up] product as an fp8 GEMM of 2N "
             "columns and gate it in torch"),
            (f"batch={self.batch!r}", self.batch is None, "batch=None, one call per batch"),
            (f"groups={self.groups!r} with {self.scaling.mode} scaling", self.groups is None
             or self.scaling.mode == "block", "scaling='block': grouped fp8 GEMMs are built with DeepSeek-V3's "
             "block scales; per-tensor and per-row scales of a grouped GEMM are not built"),
        ) if not ok]
        if self.scaling.mode == "block":
            wrong += [f"{d}={getattr(self, d)!r} (use a static {d.upper()}: the block scales' shape counts its "
                      f"{SCALE_BLOCK}-blocks)" for d in ("n", "k") if not isinstance(getattr(self, d), int)]
        if wrong:
            raise SpecError(f"an fp8 GEMM ({self.scaling.mode} scaling) takes " + ", ".join(wrong))
        clash = [x for x in self.scaling.names if x in {i.name for i in self.inputs}]
        if clash:
            raise SpecError(f"scale input {clash[0]!r} has the name of an epilogue input; rename one of them")

    @property
    def is_fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def plain_scaled(self) -> bool:
        """An fp8 GEMM torch._scaled_mm computes as it stands: per-tensor or per-row scales, no epilogue op (the
        output cast aside). `auto` may run such a problem on torch._scaled_mm where that was measured faster."""
        return (self.scaling is not None and self.scaling.mode in ("tensor", "row") and not self.epilogue
                and not self.inputs)

    @property
    def scale_shapes(self) -> tuple[tuple[Dim, ...], tuple[Dim, ...]]:
        """The shapes of A's and B's scales (() each without scaling): (1,) and (1,) per tensor; (M,) and (N,)
        per row; (M, ceil(K/128)) and (ceil(N/128), ceil(K/128)) per block, grouped as `scale_shapes` says."""
        if self.scaling is None:
            return (), ()
        return scale_shapes(self.scaling.mode, self.m, self.n, self.k, self.groups, self.group_layout)

    def _check_gate(self):
        if self.gate is None:
            return
        if self.gate not in GATE_ACTIVATIONS:
            raise SpecError(f"gate={self.gate!r}: use one of {GATE_ACTIVATIONS} (the activation applied to the "
                            "gate half), or gate=None for a plain GEMM")
        # field -> (what it is, what a gated GEMM needs)
        wrong = [f"{what} (use {need})" for what, ok, need in (
            (f"a_layout={self.a_layout!r}", self.a_layout == "mk", "'mk'"),
            (f"b_layout={self.b_layout!r}", self.b_layout == "nk", "'nk': B is [gate; up], 2N x K"),
            (f"batch={self.batch!r}", self.batch is None, "batch=None"),
            (f"n={self.n!r}", isinstance(self.n, int), "a static N: the up rows start at row N of B"),
            (f"acc_dtype={self.acc_dtype.value!r}", self.acc_dtype == DType.f32, "'f32'"),
        ) if not ok]
        if wrong:
            raise SpecError(f"gate={self.gate!r}: a gated GEMM is built for an nn.Linear-style problem; got "
                            + ", ".join(wrong))

    def _check_groups(self):
        if self.groups is None and self.group_layout is None:
            return
        if self.group_layout not in GROUP_LAYOUTS:
            raise SpecError(f"group_layout={self.group_layout!r}: a grouped GEMM (groups={self.groups!r}) takes "
                            "group_layout='contiguous' (A is M x K, rows sorted by group, with E + 1 int32 row "
                            "offsets) or 'masked' (A is E x M x K, with E int32 row counts)")
        if self.groups is None:
            raise SpecError(f"group_layout={self.group_layout!r} needs groups=E, the group count (an int, or a "
                            "name such as 'E' for one kernel for every count)")
        object.__setattr__(self, "groups", _check_dim("groups", self.groups))
        # field -> (what it is, what a grouped GEMM needs)
        wrong = [f"{what} (use {need})" for what, ok, need in (
            (f"a_layout={self.a_layout!r}", self.a_layout == "mk", "'mk': the groups' rows are A's rows"),
            (f"batch={self.batch!r}", self.batch is None, "batch=None: the groups are the batch"),
        ) if not ok]
        if wrong:
            raise SpecError(f"groups={self.groups!r}: a grouped GEMM takes an M x K A per group; got "
                            + ", ".join(wrong))
        vectors = [i.name for i in self.inputs if i.kind != "scalar"]
        if vectors:
            raise SpecError(f"groups={self.groups!r}: epilogue inputs {vectors} are row, column or full tensors, "
                            "which a grouped GEMM does not read yet; use scalars (gemmc.Scalar), or apply them "
                            "to the output in torch")
        operand = GROUP_OPERANDS[self.group_layout]
        if operand in {i.name for i in self.inputs}:
            raise SpecError(f"epilogue input {operand!r}: a {self.group_layout} grouped GEMM's {operand} operand "
                            "has that name; rename the input")

    @property
    def grouped(self) -> bool:
        """One launch of E GEMMs (`groups`, `group_layout`)."""
        return self.group_layout is not None

    @property
    def group_operand(self) -> str | None:
        """The name of a grouped GEMM's int32 operand: "offsets" (contiguous) or "counts" (masked)."""
        return GROUP_OPERANDS[self.group_layout] if self.grouped else None

    @property
    def b_rows(self) -> Dim:
        """B's N extent in storage: 2N for a gated GEMM ([gate; up]), else N."""
        return 2 * self.n if self.gate is not None else self.n

    def _check_epilogue(self):
        names = [i.name for i in self.inputs]
        if len(set(names)) != len(names):
            raise SpecError(f"epilogue input names repeat: {names}")
        on_acc: list[bool] = []     # per op: does its value depend on the accumulator?
        for idx, op in enumerate(self.epilogue):
            where = f"epilogue op %v{idx} ({op.op})" + (f" at {op.line}" if op.line else "")
            if op.op not in EPILOGUE_OPS:
                raise SpecError(f"{where}: unknown op; supported: {', '.join(EPILOGUE_OPS)}")
            arity = 2 if op.op in BINARY_OPS else 1
            if len(op.args) != arity:
                raise SpecError(f"{where}: takes {arity} operand(s), got {len(op.args)}")
            for r in op.args:
                if not isinstance(r, Ref) or r.kind not in REF_KINDS:
                    raise SpecError(f"{where}: bad operand {r!r}; use Ref.acc(), Ref.input(name), Ref.const(x) "
                                    "or Ref.node(i)")
                if r.kind == "input" and r.value not in names:
                    raise SpecError(f"{where}: reads unknown input {r.value!r}; declare it in `inputs`")
                if r.kind == "node" and not (_is_int(r.value) and 0 <= r.value < idx):
                    raise SpecError(f"{where}: reads %v{r.value}, which is not an earlier op; use Ref.node(i) "
                                    f"with 0 <= i < {idx}")
                if r.kind == "const":
                    _check_number(r.value, f"{where}: constant", "Ref.const(x)")
            on_acc.append(any(r.kind == "acc" or (r.kind == "node" and on_acc[r.value]) for r in op.args))
            if op.op == "cast":
                object.__setattr__(op, "attrs", tuple((k, as_dtype(v, OUTPUT_DTYPES) if k == "dtype" else v)
                                                      for k, v in op.attrs))
                if op.attr("dtype") not in OUTPUT_DTYPES:
                    raise SpecError(f"{where}: cast to {op.attr('dtype')}; use bf16, f16 or f32")
            if op.op == "clamp":
                lo, hi = op.attr("min"), op.attr("max")
                if lo is None and hi is None:
                    raise SpecError(f"{where}: clamp needs min=, max= or both")
                for bound, value in (("min", lo), ("max", hi)):
                    if value is not None:
                        _check_number(value, f"{where}: clamp {bound}", f"{bound}=<float>")
                if lo is not None and hi is not None and float(lo) > float(hi):
                    raise SpecError(f"{where}: clamp min {lo} > max {hi}")
        # the kernel stores the last op's value: one that never reads the matmul result is not a GEMM epilogue
        if self.epilogue and not on_acc[-1]:
            last = self.epilogue[-1]
            raise SpecError(f"the epilogue's result (%v{len(self.epilogue) - 1}, {last.op}"
                            + (f" at {last.line}" if last.line else "") + ") does not depend on the accumulator; "
                            "make the output a function of the matmul result (an op reading Ref.acc(), directly "
                            "or through earlier ops)")

    # ---- derived facts -------------------------------------------------------------------
    @property
    def static_dims(self) -> dict[str, int]:
        return {d: getattr(self, d) for d in ("m", "n", "k") if isinstance(getattr(self, d), int)}

    @property
    def a_major(self) -> str:
        """Contiguous dim of A: 'k' (K-major) or 'm'."""
        return "k" if self.a_layout == "mk" else "m"

    @property
    def b_major(self) -> str:
        return "k" if self.b_layout == "nk" else "n"

    @property
    def has_epilogue(self) -> bool:
        return (bool(self.epilogue) or self.out_dtype != self.dtype or self.gate is not None
                or self.scaling is not None)

    def flops(self, m: int | None = None, n: int | None = None, k: int | None = None, batch: int = 1) -> float:
        dims = [m if m is not None else self.m, n if n is not None else self.n, k if k is not None else self.k]
        if not all(isinstance(d, int) for d in dims):
            raise SpecError("flops() needs concrete m, n, k for symbolic dims")
        return 2.0 * math.prod(dims) * batch * (2 if self.gate is not None else 1)

    def with_dims(self, **dims) -> "GemmSpec":
        from dataclasses import replace
        return replace(self, **dims)
