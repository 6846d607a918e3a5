"""`GemmSpec`: what to compute, as plain data. The DSL traces into this; the IR is built from it.

Operands are passed in the storage shape their layout names, contiguous in the last dim:
  a_layout "mk": A is M x K        "km": A is K x M   (computes A.T @ ...)
  b_layout "nk": B is N x K (a @ b.T, the nn.Linear weight)   "kn": B is K x N (a @ b)
  C / the output is M x N, row-major. With `batch`, every operand gets a leading L dim.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Union

from .errors import SpecError
from .types import ACC_DTYPES, INPUT_DTYPES, OUTPUT_DTYPES, DType, as_dtype

Dim = Union[int, str]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Epilogue input kinds: how a tensor broadcasts over the M x N accumulator.
INPUT_KINDS = ("scalar", "row", "col", "full")  # row: length N (bias); col: length M; full: M x N
BINARY_OPS = ("add", "sub", "mul", "div")
UNARY_OPS = ("relu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh", "clamp", "cast")
EPILOGUE_OPS = BINARY_OPS + UNARY_OPS


@dataclass(frozen=True)
class EpilogueInput:
    """A tensor (or runtime scalar) the epilogue reads besides the accumulator."""
    name: str
    kind: str
    dtype: DType = DType.f32

    def __post_init__(self):
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        if not _IDENT.match(self.name) or self.name in ("a", "b", "out", "acc"):
            raise SpecError(f"epilogue input name {self.name!r} must be an identifier other than a, b, out, acc")
        if self.kind not in INPUT_KINDS:
            raise SpecError(f"epilogue input {self.name!r} has kind {self.kind!r}; use one of {INPUT_KINDS}")


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

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        for d in ("m", "n", "k"):
            set_(d, _check_dim(d, getattr(self, d)))
        if self.batch is not None:
            set_("batch", _check_dim("batch", self.batch))
        set_("dtype", as_dtype(self.dtype))
        set_("acc_dtype", as_dtype(self.acc_dtype))
        set_("out_dtype", as_dtype(self.out_dtype) if self.out_dtype is not None else self.dtype)
        set_("inputs", tuple(self.inputs))
        set_("epilogue", tuple(self.epilogue))
        if self.dtype not in INPUT_DTYPES:
            hint = " (fp8 is reserved for a later release)" if self.dtype.bits == 8 else ""
            raise SpecError(f"input dtype {self.dtype} is not supported{hint}; use bf16 or f16")
        if self.acc_dtype not in ACC_DTYPES:
            raise SpecError(f"accumulator dtype {self.acc_dtype} is not supported; use f32 (or f16 with f16 inputs)")
        if self.acc_dtype == DType.f16 and self.dtype != DType.f16:
            raise SpecError(f"f16 accumulation needs f16 inputs (the tensor cores have no {self.dtype}->f16 MMA); "
                            "use acc_dtype='f32'")
        if self.out_dtype not in OUTPUT_DTYPES:
            raise SpecError(f"output dtype {self.out_dtype} is not supported; use bf16, f16 or f32")
        if self.a_layout not in ("mk", "km"):
            raise SpecError(f"a_layout={self.a_layout!r}; use 'mk' (A is M x K) or 'km' (A is K x M)")
        if self.b_layout not in ("nk", "kn"):
            raise SpecError(f"b_layout={self.b_layout!r}; use 'nk' (B is N x K, a @ b.T) or 'kn' (B is K x N, a @ b)")
        if not _IDENT.match(self.name):
            raise SpecError(f"name {self.name!r} must be an identifier")
        self._check_epilogue()

    def _check_epilogue(self):
        names = [i.name for i in self.inputs]
        if len(set(names)) != len(names):
            raise SpecError(f"epilogue input names repeat: {names}")
        for idx, op in enumerate(self.epilogue):
            where = f"epilogue op %v{idx} ({op.op})" + (f" at {op.line}" if op.line else "")
            if op.op not in EPILOGUE_OPS:
                raise SpecError(f"{where}: unknown op; supported: {', '.join(EPILOGUE_OPS)}")
            arity = 2 if op.op in BINARY_OPS else 1
            if len(op.args) != arity:
                raise SpecError(f"{where}: takes {arity} operand(s), got {len(op.args)}")
            for r in op.args:
                if r.kind == "input" and r.value not in names:
                    raise SpecError(f"{where}: reads unknown input {r.value!r}; declare it in `inputs`")
                if r.kind == "node" and not (0 <= int(r.value) < idx):
                    raise SpecError(f"{where}: reads %v{r.value}, which is not an earlier op")
                if r.kind not in ("acc", "input", "const", "node"):
                    raise SpecError(f"{where}: bad operand {r!r}")
            if op.op == "cast":
                object.__setattr__(op, "attrs", tuple((k, as_dtype(v) if k == "dtype" else v) for k, v in op.attrs))
                if op.attr("dtype") not in OUTPUT_DTYPES:
                    raise SpecError(f"{where}: cast to {op.attr('dtype')}; use bf16, f16 or f32")
            if op.op == "clamp":
                lo, hi = op.attr("min"), op.attr("max")
                if lo is None and hi is None:
                    raise SpecError(f"{where}: clamp needs min=, max= or both")
                if lo is not None and hi is not None and float(lo) > float(hi):
                    raise SpecError(f"{where}: clamp min {lo} > max {hi}")

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
        return bool(self.epilogue) or self.out_dtype != self.dtype

    def flops(self, m: int | None = None, n: int | None = None, k: int | None = None, batch: int = 1) -> float:
        dims = [m if m is not None else self.m, n if n is not None else self.n, k if k is not None else self.k]
        if not all(isinstance(d, int) for d in dims):
            raise SpecError("flops() needs concrete m, n, k for symbolic dims")
        return 2.0 * math.prod(dims) * batch

    def with_dims(self, **dims) -> "GemmSpec":
        from dataclasses import replace
        return replace(self, **dims)
