"""`@gemmc.kernel`: trace a Python function over symbolic tensors into a `GemmSpec`.

    @gemmc.kernel
    def linear_gelu(x: gemmc.Tensor[("M", 4096), gemmc.bf16],
                    w: gemmc.Tensor[(11008, 4096), gemmc.bf16],
                    bias: gemmc.Tensor[(11008,), gemmc.f32],
                    scale: gemmc.Scalar):
        return gemmc.gelu(x @ w.T + bias, approximate="tanh") * scale

    linear_gelu.spec   # GemmSpec(m="M", n=11008, k=4096, b_layout="nk", inputs=(bias row, scale scalar), ...)

Conventions (numpy/torch broadcasting, so the body reads as ordinary tensor code):
- `gemmc.Tensor[shape, dtype]`: `shape` is a tuple of dims, each an int (static) or a name (symbolic);
  a single dim may be given bare (`Tensor["N", f32]`). A leading batch dim L makes the GEMM batched.
  `gemmc.Scalar` (or a `float` annotation) is a runtime f32 scalar.
- Exactly one matmul of two parameters: `a @ b` (b is K x N: b_layout "kn"), `a @ b.T` (b is N x K: "nk"),
  `a.T @ b` (a is K x M: a_layout "km"); batched operands are (L, ., .) and transpose with `.mT`.
- Every other parameter is an epilogue input; its kind comes from the shape it broadcasts with against
  the (M, N) accumulator, right-aligned as in numpy:
    ()  or Scalar -> "scalar";   (N,) or (1, N) -> "row";   (M, 1) -> "col";   (M, N) / (L, M, N) -> "full".
  A length-M vector is declared `Tensor[("M",), f32]` and used as `col[:, None]` (the one indexing form
  allowed); used bare it would broadcast along N, exactly as in torch. In a batched kernel row/col vectors
  are shared by every batch and full inputs carry the batch dim.
- Epilogue ops: `+ - * /` (also reflected: `2 * acc`, `bias + acc`), unary minus (traced as `* -1`),
  `gemmc.relu/gelu/silu/sigmoid/tanh/clamp` and `.to(dtype)`. Python numbers become `Ref.const`.
  `clamp` attrs are `(("min", lo), ("max", hi))`, each present only when given.
- The output dtype is the returned value's: a trailing `.to(dtype)` becomes `out_dtype` (it is not kept
  as a cast op); otherwise the output has the input dtype. Ops the return value does not depend on are
  dropped.
Anything else raises `TraceError` naming the construct and the user's `file:line`.
"""
from __future__ import annotations

import functools
import inspect
import linecache
import math
import numbers
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import Union

from .errors import SpecError, TraceError
from .spec import Dim, EpilogueInput, EpilogueOp, GemmSpec, Ref
from .types import ACC_DTYPES, INPUT_DTYPES, OUTPUT_DTYPES, DType, as_arch, as_dtype

_THIS_FILE = os.path.normcase(os.path.abspath(__file__))
_RESERVED_NAMES = ("a", "b", "out", "acc")


# ---- annotations ----------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorType:
    """What `gemmc.Tensor[shape, dtype]` evaluates to: a shape of static/named dims and a dtype."""
    shape: tuple[Dim, ...]
    dtype: DType

    def __repr__(self) -> str:
        return f"Tensor[{_fmt_shape(self.shape)}, {self.dtype}]"


class Tensor:
    """Annotation for a tensor parameter: `gemmc.Tensor[("M", 4096), gemmc.bf16]`."""

    def __class_getitem__(cls, item) -> TensorType:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TraceError(f"gemmc.Tensor[{item!r}]: write gemmc.Tensor[(dims...), dtype], "
                             "e.g. gemmc.Tensor[('M', 4096), gemmc.bf16]")
        shape, dtype = item
        if not isinstance(shape, (tuple, list)):
            shape = (shape,)
        dims = []
        for d in shape:
            if isinstance(d, bool) or not (isinstance(d, str) and re.match(r"^[A-Za-z_]\w*$", d)
                                           or isinstance(d, int) and d > 0):
                raise TraceError(f"gemmc.Tensor dim {d!r}: use a positive int or a name such as 'M'")
            dims.append(d)
        if len(dims) > 3:
            raise TraceError(f"gemmc.Tensor of rank {len(dims)}: at most 3 dims (batch, rows, cols)")
        try:
            dt = as_dtype(dtype)
        except SpecError as e:
            raise TraceError(f"gemmc.Tensor dtype: {e}") from None
        return TensorType(tuple(dims), dt)


class Scalar:
    """Annotation for a runtime f32 scalar parameter (a plain `float` annotation means the same)."""


# ---- source locations -----------------------------------------------------------------------

_GEMMC_DIR = os.path.dirname(_THIS_FILE) + os.sep


@functools.lru_cache(maxsize=1024)
def _is_library_file(filename: str) -> bool:
    """Is `filename` gemmc's or torch's (which calls __torch_function__ from torch/overrides.py), not the
    user's code? Errors point at the innermost frame that is not."""
    path = os.path.normcase(os.path.abspath(filename))
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    return path.startswith(_GEMMC_DIR) or (
        torch_file is not None and path.startswith(os.path.normcase(os.path.dirname(torch_file)) + os.sep))


def _user_frame():
    """The innermost frame outside gemmc and torch: the user's expression being traced."""
    f = sys._getframe(1)
    while f is not None and _is_library_file(f.f_code.co_filename):
        f = f.f_back
    return f


def _loc(filename: str, lineno: int) -> str:
    return f"{filename}:{lineno}"


def _here() -> str:
    f = _user_frame()
    return _loc(f.f_code.co_filename, f.f_lineno) if f is not None else "<unknown>"


def _error(where: str, msg: str) -> TraceError:
    """`file:line: msg` followed by the source line, when it can be read."""
    text = ""
    m = re.match(r"^(.*):(\d+)$", where)
    if m:
        src = linecache.getline(m.group(1), int(m.group(2))).strip()
        if src:
            text = f"\n    {src}"
    return TraceError(f"{where}: {msg}{text}")


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# ---- traced values --------------------------------------------------------------------------

_REDUCTIONS = ("sum", "mean", "max", "min", "amax", "amin", "prod", "norm", "argmax", "argmin", "std", "var",
               "logsumexp", "softmax", "log_softmax", "cumsum", "cumprod", "any", "all")


class Value:
    """A symbolic tensor during tracing: a parameter, the accumulator, or an epilogue op's result."""

    __slots__ = ("_tracer", "_ref", "_shape", "_param", "_transposed", "_on_acc", "_line")
    __array_ufunc__ = None  # numpy scalars defer to our reflected ops (np.float32(2) * acc)

    def __init__(self, tracer, ref, shape, *, param=None, transposed=False, on_acc=False, line=""):
        self._tracer = tracer
        self._ref = ref                # Ref once it is usable in the epilogue (None for a raw tensor param)
        self._shape = tuple(shape)
        self._param = param            # parameter name when this is a parameter (maybe transposed / indexed)
        self._transposed = transposed
        self._on_acc = on_acc          # depends on the matmul result
        self._line = line

    def __repr__(self) -> str:
        what = self._param or str(self._ref)
        return f"<traced {what} {_fmt_shape(self._shape)}>"

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    # -- the matmul --
    def __matmul__(self, other):
        return self._tracer.matmul(self, other, _here())

    def __rmatmul__(self, other):
        return self._tracer.matmul(other, self, _here())

    @property
    def T(self):
        where = _here()
        if len(self._shape) == 3:
            raise _error(where, f"`.T` of the batched tensor {self._param or 'value'}: use `.mT` to swap the last "
                         "two dims")
        return self._transpose(where, ".T")

    @property
    def mT(self):
        return self._transpose(_here(), ".mT")

    def t(self):
        return self._transpose(_here(), ".t()")

    def _transpose(self, where, how):
        if len(self._shape) == 1:
            return self
        if self._param is None or self._tracer.param_kind(self._param) != "tensor" or self._ref is not None:
            raise _error(where, f"transpose `{how}` of an epilogue value: only a matmul operand may be transposed "
                         "(the output is always M x N, row-major)")
        shape = self._shape[:-2] + (self._shape[-1], self._shape[-2])
        return Value(self._tracer, None, shape, param=self._param, transposed=not self._transposed, line=where)

    # -- elementwise arithmetic --
    def __add__(self, o): return self._tracer.binary("add", "+", self, o, _here())
    def __radd__(self, o): return self._tracer.binary("add", "+", o, self, _here())
    def __sub__(self, o): return self._tracer.binary("sub", "-", self, o, _here())
    def __rsub__(self, o): return self._tracer.binary("sub", "-", o, self, _here())
    def __mul__(self, o): return self._tracer.binary("mul", "*", self, o, _here())
    def __rmul__(self, o): return self._tracer.binary("mul", "*", o, self, _here())
    def __truediv__(self, o): return self._tracer.binary("div", "/", self, o, _here())
    def __rtruediv__(self, o): return self._tracer.binary("div", "/", o, self, _here())

    def __neg__(self):
        return self._tracer.binary("mul", "-", self, -1.0, _here())

    def __pos__(self):
        return self

    def _unsupported_op(self, sym):
        raise _error(_here(), f"operator `{sym}` is not a supported epilogue op; use + - * /, gemmc.relu, gelu, "
                     "silu, sigmoid, tanh, clamp or .to(dtype)")

    def __pow__(self, o): self._unsupported_op("**")
    def __rpow__(self, o): self._unsupported_op("**")
    def __mod__(self, o): self._unsupported_op("%")
    def __rmod__(self, o): self._unsupported_op("%")
    def __floordiv__(self, o): self._unsupported_op("//")
    def __rfloordiv__(self, o): self._unsupported_op("//")
    def __abs__(self): self._unsupported_op("abs()")
    def __and__(self, o): self._unsupported_op("&")
    def __or__(self, o): self._unsupported_op("|")
    def __xor__(self, o): self._unsupported_op("^")
    def __invert__(self): self._unsupported_op("~")

    # -- python control flow cannot be traced --
    def _control_flow(self, what):
        raise _error(_here(), f"{what} on a traced value: the kernel is traced once over symbolic tensors, so "
                     "python control flow cannot depend on tensor values; use gemmc.relu / gemmc.clamp "
                     "for data-dependent choices")

    def __bool__(self): self._control_flow("bool() (python control flow such as `if x:`)")
    def __len__(self): self._control_flow("len()")
    def __iter__(self): self._control_flow("iteration")
    def __contains__(self, item): self._control_flow("`in`")
    def __int__(self): self._control_flow("int()")
    def __float__(self): self._control_flow("float()")
    def __index__(self): self._control_flow("use as an index")

    def _compare(self, sym, other):
        self._control_flow(f"comparison `{sym}` (e.g. `if acc {sym} 0:`)")

    def __lt__(self, o): self._compare("<", o)
    def __le__(self, o): self._compare("<=", o)
    def __gt__(self, o): self._compare(">", o)
    def __ge__(self, o): self._compare(">=", o)
    def __eq__(self, o): self._compare("==", o)
    def __ne__(self, o): self._compare("!=", o)
    __hash__ = object.__hash__

    # -- indexing: only `vec[:, None]` / `vec[None, :]` on a rank-1 parameter --
    def __getitem__(self, key):
        where = _here()
        full = slice(None)
        is_full = lambda k: isinstance(k, slice) and k == full  # noqa: E731
        if (self._param is not None and self._ref is None and len(self._shape) == 1 and isinstance(key, tuple)
                and len(key) == 2 and self._tracer.param_kind(self._param) == "tensor"):
            if is_full(key[0]) and key[1] is None:
                return Value(self._tracer, None, (self._shape[0], 1), param=self._param, line=where)
            if key[0] is None and is_full(key[1]):
                return Value(self._tracer, None, (1, self._shape[0]), param=self._param, line=where)
        raise _error(where, f"indexing `{self._param or 'value'}[{_fmt_key(key)}]` is not supported: the epilogue "
                     "is elementwise over the whole tile; the one allowed form is `vec[:, None]` on a rank-1 "
                     "parameter (a per-row column vector)")

    # -- methods --
    def to(self, dtype, *args, **kwargs):
        where = _here()
        if args or kwargs:
            raise _error(where, "`.to(...)` takes one dtype argument, e.g. `.to(gemmc.f32)`")
        try:
            dt = as_dtype(dtype)
        except SpecError as e:
            raise _error(where, f"`.to({dtype!r})`: {e}") from None
        return self._tracer.unary("cast", self, where, (("dtype", dt),))

    def float(self): return self.to(DType.f32)
    def half(self): return self.to(DType.f16)
    def bfloat16(self): return self.to(DType.bf16)
    def relu(self): return relu(self)
    def sigmoid(self): return sigmoid(self)
    def tanh(self): return tanh(self)
    def clamp(self, min=None, max=None): return clamp(self, min=min, max=max)  # noqa: A002

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        where = _here()
        if name in _REDUCTIONS:
            raise _error(where, f"reduction `.{name}()` is not supported in a GEMM epilogue: the epilogue is "
                         "elementwise over each output tile; reduce the result in a separate op")
        raise _error(where, f"`.{name}` is not supported on a traced tensor; the epilogue supports + - * /, "
                     "gemmc.relu, gelu, silu, sigmoid, tanh, clamp and .to(dtype)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise _error(_here(), f"torch.{name} on a traced tensor: use the gemmc equivalent "
                     "(gemmc.relu, gelu, silu, sigmoid, tanh, clamp, .to) inside @gemmc.kernel")


def _fmt_key(key) -> str:
    def one(k):
        if isinstance(k, slice):
            parts = ["" if x is None else str(x) for x in (k.start, k.stop)]
            return ":".join(parts) + (f":{k.step}" if k.step is not None else "")
        return "None" if k is None else ("..." if k is Ellipsis else repr(k))
    return ", ".join(one(k) for k in key) if isinstance(key, tuple) else one(key)


# ---- elementwise functions (also usable on torch tensors, for reference code) ---------------

def _is_value(x) -> bool:
    return isinstance(x, Value)


def relu(x):
    if _is_value(x):
        return x._tracer.unary("relu", x, _here())
    import torch
    return torch.relu(x)


def gelu(x, approximate: str = "none"):
    """`approximate="tanh"` (gelu_tanh) or "none" / "erf" (gelu_erf, torch's default)."""
    if approximate not in ("tanh", "none", "erf"):
        raise _error(_here(), f"gelu(approximate={approximate!r}): use 'tanh' or 'none' (erf)")
    op = "gelu_tanh" if approximate == "tanh" else "gelu_erf"
    if _is_value(x):
        return x._tracer.unary(op, x, _here())
    import torch
    return torch.nn.functional.gelu(x, approximate="tanh" if op == "gelu_tanh" else "none")


def silu(x):
    if _is_value(x):
        return x._tracer.unary("silu", x, _here())
    import torch
    return torch.nn.functional.silu(x)


def sigmoid(x):
    if _is_value(x):
        return x._tracer.unary("sigmoid", x, _here())
    import torch
    return torch.sigmoid(x)


def tanh(x):
    if _is_value(x):
        return x._tracer.unary("tanh", x, _here())
    import torch
    return torch.tanh(x)


def clamp(x, min=None, max=None):  # noqa: A002  (torch's names)
    if _is_value(x):
        where = _here()
        for label, v in (("min", min), ("max", max)):
            if v is not None and (isinstance(v, (bool, Value)) or not isinstance(v, (int, float))):
                raise _error(where, f"clamp {label}={v!r}: bounds must be python numbers")
        if min is None and max is None:
            raise _error(where, "clamp needs min=, max= or both")
        if min is not None and max is not None and float(min) > float(max):
            raise _error(where, f"clamp min={min} > max={max}")
        attrs = tuple((k, float(v)) for k, v in (("min", min), ("max", max)) if v is not None)
        return x._tracer.unary("clamp", x, where, attrs)
    import torch
    return torch.clamp(x, min=min, max=max)


# ---- the tracer -----------------------------------------------------------------------------

@dataclass
class _Matmul:
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


class _Tracer:
    def __init__(self, fn, acc_dtype: DType):
        self.fn = fn
        self.acc_dtype = acc_dtype
        self.params: dict[str, Union[TensorType, str]] = {}   # name -> TensorType | "scalar"
        self.param_lines: dict[str, str] = {}
        self.ops: list[EpilogueOp] = []
        self.mm: _Matmul | None = None
        self.acc_shape: tuple = ()
        self.epilogue_uses: dict[str, list[tuple[tuple, str]]] = {}  # param -> [(shape used, line)]

    def param_kind(self, name: str) -> str:
        return "scalar" if self.params[name] == "scalar" else "tensor"

    # -- operands --
    def _as_operand(self, x, where: str, sym: str):
        """(Ref, shape, on_acc) for an operand of an elementwise op."""
        if isinstance(x, Value):
            if x._tracer is not self:
                raise _error(where, "a value from another traced kernel")
            if x._ref is not None:
                return x._ref, x._shape, x._on_acc
            # a raw parameter entering the epilogue
            name = x._param
            if self.mm is not None and name in (self.mm.a, self.mm.b):
                raise _error(where, f"parameter {name} is a matmul operand and cannot also be an epilogue input; "
                             "pass it twice as two parameters")
            if x._transposed:
                raise _error(where, f"transpose of epilogue input {name}: declare it in the (M, N) orientation")
            self.epilogue_uses.setdefault(name, []).append((x._shape, where))
            return Ref.input(name), x._shape, False
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise _error(where, f"operand {x!r} of `{sym}`: use a traced tensor, a gemmc.Scalar parameter or a "
                         "python number")
        if not math.isfinite(float(x)):
            raise _error(where, f"constant {x!r} of `{sym}` is not finite")
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
                    hint = (f"; the output is {_fmt_shape(self.acc_shape)}: a row vector (bias) has shape ({nn},), "
                            f"a column vector ({m},) is used as `col[:, None]`, a full input is ({m}, {nn})")
                raise _error(where, f"shape mismatch in `{sym}`: {names[0]} {_fmt_shape(ls)} and {names[1]} "
                             f"{_fmt_shape(rs)} do not broadcast ({dl} vs {dr}){hint}")
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
            raise _error(where, f"{op} of a python number: compute constants in python")
        return self._emit(op, (r,), s, on_acc, where, attrs)

    # -- the matmul --
    def matmul(self, lhs, rhs, where) -> Value:
        for x in (lhs, rhs):
            if not isinstance(x, Value):
                raise _error(where, f"matmul with {x!r}: both operands must be tensor parameters")
            if x._on_acc:
                raise _error(where, "matmul of an epilogue value (a value computed from the matmul result): "
                             "gemmc compiles exactly one matmul followed by elementwise ops")
        if self.mm is not None:
            raise _error(where, f"a second matmul (the first is at {self.mm.line}): a gemmc kernel has exactly "
                         "one matmul; write two kernels")
        for x, side in ((lhs, "left"), (rhs, "right")):
            if x._param is not None and self.param_kind(x._param) == "scalar":
                raise _error(where, f"the {side} matmul operand {x._param} is a scalar; matmul operands are tensor "
                             "parameters")
            if x._param is None or x._ref is not None:
                raise _error(where, f"the {side} matmul operand is an elementwise result, not a tensor parameter: "
                             "ops before the matmul (prologue fusion) are not supported")
            declared = self.params[x._param].shape
            expected = declared[:-2] + declared[-2:][::-1] if x._transposed else declared
            if len(declared) < 2 or x._shape != expected:
                raise _error(where, f"matmul operand {x._param} {_fmt_shape(x._shape)}: operands are (M, K) / (K, N) "
                             "matrices, optionally with a leading batch dim, and not indexed")
            if x._param in self.epilogue_uses:
                raise _error(where, f"parameter {x._param} is used in the epilogue and as a matmul operand; "
                             "pass it twice as two parameters")
        if lhs._param == rhs._param:
            raise _error(where, f"{lhs._param} is both matmul operands: pass it twice as two parameters")
        ta, tb = self.params[lhs._param], self.params[rhs._param]
        if len(lhs._shape) != len(rhs._shape):
            raise _error(where, f"matmul of rank {len(lhs._shape)} {lhs._param} and rank {len(rhs._shape)} "
                         f"{rhs._param}: both are (M, K)/(K, N) or both batched (L, M, K)/(L, K, N)")
        batch = None
        if len(lhs._shape) == 3:
            if lhs._shape[0] != rhs._shape[0]:
                raise _error(where, f"matmul batch dimension mismatch: {lhs._param} has L={lhs._shape[0]}, "
                             f"{rhs._param} has L={rhs._shape[0]}")
            batch = lhs._shape[0]
        m, ka = lhs._shape[-2:]
        kb, n = rhs._shape[-2:]
        if ka != kb:
            raise _error(where, f"matmul dimension mismatch: K of {lhs._param} {_fmt_shape(lhs._shape)} is {ka} but "
                         f"K of {rhs._param} {_fmt_shape(rhs._shape)} is {kb}; declare both with the same K "
                         "(check for a missing .T)")
        self._check_dtypes(ta.dtype, tb.dtype, where)
        self.mm = _Matmul(lhs._param, rhs._param, "km" if lhs._transposed else "mk",
                              "nk" if rhs._transposed else "kn", m, n, ka, batch, ta.dtype, where)
        self.acc_shape = ((batch,) if batch is not None else ()) + (m, n)
        return Value(self, Ref.acc(), self.acc_shape, on_acc=True, line=where)

    def _check_dtypes(self, da: DType, db: DType, where):
        for dt in (da, db):
            if dt.bits == 8:
                raise _error(where, f"matmul of {dt} (fp8) inputs: fp8 is not supported yet; use bf16 or f16")
            if dt not in INPUT_DTYPES:
                raise _error(where, f"matmul of {dt} inputs: the tensor-core paths take bf16 or f16; "
                             "cast the operands to bf16")
        if da != db:
            raise _error(where, f"matmul mixes dtypes {da} @ {db}: the hardware has no mixed {da}/{db} MMA; "
                         "declare both operands with the same dtype")
        if self.acc_dtype not in ACC_DTYPES:
            raise _error(where, f"accumulator dtype {self.acc_dtype}: use f32 (or f16 with f16 inputs)")
        if self.acc_dtype == DType.f16 and da != DType.f16:
            raise _error(where, f"f16 accumulation with {da} inputs: the tensor cores have no {da}->f16 MMA; "
                         "use acc_dtype=gemmc.f32 or f16 inputs")


# ---- trace ----------------------------------------------------------------------------------

def _param_line(fn, name: str) -> str:
    filename = fn.__code__.co_filename
    try:
        lines, start = inspect.getsourcelines(fn)
        for i, text in enumerate(lines):
            if re.search(rf"\b{re.escape(name)}\s*[:,)=]", text) and i + start >= fn.__code__.co_firstlineno:
                return _loc(filename, start + i)
    except (OSError, TypeError):
        pass
    return _loc(filename, fn.__code__.co_firstlineno)


def _annotations(fn) -> inspect.Signature:
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception as e:  # a NameError in a string annotation, ...
        raise TraceError(f"{_loc(fn.__code__.co_filename, fn.__code__.co_firstlineno)}: cannot evaluate the "
                         f"annotations of {fn.__name__}: {e}") from e


def _call_recording_return_line(fn, args):
    """Call fn(*args); also return the line of the `return` that ended it (None if unknown)."""
    ret = {}
    code = fn.__code__

    def profile(frame, event, arg):
        if event == "return" and frame.f_code is code:
            ret["line"] = frame.f_lineno

    if sys.getprofile() is not None:  # someone is profiling: do not replace their hook
        return fn(*args), None
    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(None)
    return result, ret.get("line")


def trace(fn, acc_dtype=DType.f32, name: str | None = None):
    """Trace `fn` into (GemmSpec, {"a": param, "b": param}, [param names in call order])."""
    try:
        acc_dtype = as_dtype(acc_dtype)
    except SpecError as e:
        raise TraceError(f"acc_dtype: {e}") from None
    tracer = _Tracer(fn, acc_dtype)
    sig = _annotations(fn)
    values = []
    for p in sig.parameters.values():
        where = _param_line(fn, p.name)
        tracer.param_lines[p.name] = where
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise _error(where, f"parameter {p.name}: *args, **kwargs and keyword-only parameters are not supported")
        ann = p.annotation
        if isinstance(ann, TensorType):
            tracer.params[p.name] = ann
            values.append(Value(tracer, None, ann.shape, param=p.name, line=where))
        elif ann is Scalar or ann is float:
            tracer.params[p.name] = "scalar"
            values.append(Value(tracer, None, (), param=p.name, line=where))
        else:
            what = "has no annotation" if ann is inspect.Parameter.empty else f"has annotation {ann!r}"
            raise _error(where, f"parameter {p.name} {what}: annotate it gemmc.Tensor[(dims...), dtype] or "
                         "gemmc.Scalar")
    # Scalars are epilogue inputs from the start (they can never be matmul operands).
    for v in values:
        if v._shape == () and tracer.params[v._param] == "scalar":
            v._ref = Ref.input(v._param)
            tracer.epilogue_uses[v._param] = [((), v._line)]

    try:
        result, ret_line = _call_recording_return_line(fn, values)
    except TraceError:
        raise
    except Exception as e:  # e.g. a TypeError inside the user's code: point at the user's line
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not _is_library_file(f.filename)]
        where = _loc(frames[-1].filename, frames[-1].lineno) if frames else "<unknown>"
        raise _error(where, f"{type(e).__name__} while tracing {fn.__name__}: {e}") from e
    ret_where = _loc(fn.__code__.co_filename, ret_line if ret_line is not None else fn.__code__.co_firstlineno)
    return _finish(tracer, fn, result, ret_where, name or fn.__name__)


def _finish(tracer: _Tracer, fn, result, ret_where: str, name: str):
    mm = tracer.mm
    if mm is None:
        raise _error(ret_where, f"{fn.__name__} has no matmul: a gemmc kernel computes exactly one `a @ b` "
                     "(or a @ b.T / a.T @ b) followed by elementwise ops")
    for operand in (mm.a, mm.b):
        if operand == "out":
            raise _error(tracer.param_lines[operand], "matmul operand named 'out': calls pass the output buffer "
                         "as out=; rename the parameter")
    if not isinstance(result, Value):
        raise _error(ret_where, f"{fn.__name__} returns {type(result).__name__} {result!r}: return the matmul "
                     "result (after any elementwise ops)")
    if result._ref is None or (result._ref.kind == "input" and not result._on_acc):
        raise _error(ret_where, f"{fn.__name__} returns its input {result._param or result._ref.value} unchanged: "
                     "return the matmul result (after any elementwise ops)")
    if not result._on_acc:
        raise _error(ret_where, f"{fn.__name__}'s return value does not depend on the matmul result")
    if result._shape != tracer.acc_shape:
        raise _error(ret_where, f"the return value has shape {_fmt_shape(result._shape)}, not the output shape "
                     f"{_fmt_shape(tracer.acc_shape)}")

    # A trailing cast is the output dtype, not an op.
    ops = list(tracer.ops)
    out_ref = result._ref
    out_dtype = mm.dtype
    if out_ref.kind == "node" and ops[out_ref.value].op == "cast":
        cast = ops[out_ref.value]
        out_dtype = cast.attr("dtype")
        if out_dtype not in OUTPUT_DTYPES:
            raise _error(cast.line, f"output dtype {out_dtype}: use bf16, f16 or f32")
        out_ref = cast.args[0]

    epilogue, used_inputs = _live_ops(ops, out_ref)

    # Epilogue inputs: every parameter but the operands, kinds from how they broadcast.
    inputs = []
    for pname, ptype in tracer.params.items():
        if pname in (mm.a, mm.b):
            continue
        where = tracer.param_lines[pname]
        if pname not in used_inputs:
            raise _error(where, f"parameter {pname} is never used in the returned value: remove it")
        if pname in _RESERVED_NAMES:
            raise _error(where, f"epilogue input named {pname!r}: the names {', '.join(_RESERVED_NAMES)} are "
                         "reserved for the operands and output; rename the parameter")
        kinds = {_input_kind(tracer, pname, shape, use_where) for shape, use_where in tracer.epilogue_uses[pname]}
        if len(kinds) > 1:
            raise _error(tracer.epilogue_uses[pname][-1][1], f"parameter {pname} is used as both "
                         f"{' and '.join(sorted(kinds))}: use one orientation")
        dtype = DType.f32 if ptype == "scalar" else ptype.dtype
        if dtype.bits == 8:
            raise _error(where, f"epilogue input {pname} is {dtype} (fp8): not supported yet; use bf16, f16 or f32")
        inputs.append(EpilogueInput(pname, kinds.pop(), dtype))

    try:
        spec = GemmSpec(m=mm.m, n=mm.n, k=mm.k, dtype=mm.dtype, out_dtype=out_dtype, acc_dtype=tracer.acc_dtype,
                        a_layout=mm.a_layout, b_layout=mm.b_layout, batch=mm.batch, inputs=tuple(inputs),
                        epilogue=tuple(epilogue), name=name)
    except SpecError as e:
        raise _error(mm.line, str(e)) from None
    params = list(tracer.params)
    return spec, {"a": mm.a, "b": mm.b}, params


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


def _input_kind(tracer: _Tracer, pname: str, shape: tuple, where: str) -> str:
    acc = tracer.acc_shape
    batched = len(acc) == 3
    if shape == ():
        return "scalar"
    if len(shape) > len(acc):
        raise _error(where, f"input {pname} {_fmt_shape(shape)} has more dims than the output {_fmt_shape(acc)}")
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
        raise _error(where, f"input {pname} used with shape {_fmt_shape(shape)}: it must broadcast over the output "
                     f"{_fmt_shape(acc)} as a row ({n},), a column ({m}, 1) or a full ({m}, {n}) tensor; "
                     "use a gemmc.Scalar for a scalar")
    if batched:
        if kind == "full" and lead != (acc[0],):
            raise _error(where, f"full input {pname} {_fmt_shape(shape)} in a batched kernel needs the batch dim: "
                         f"declare it {_fmt_shape(acc)}")
        if kind != "full" and lead != (1,):
            raise _error(where, f"{kind} input {pname} {_fmt_shape(shape)} has a batch dim: per-batch vectors are "
                         "not supported; row and column vectors are shared by every batch")
    return kind


# ---- the kernel object ----------------------------------------------------------------------

class Kernel:
    """A traced GEMM: `k.spec` is its GemmSpec; calling `k(...)` compiles it (schedule="auto", for `arch`, else
    the visible GPU's) once and runs it. Calls, and `gemmc.compile(k)`'s, take the function's own parameters:
    its order, its names, its defaults, plus `out=`."""

    def __init__(self, fn, *, acc_dtype=DType.f32, name: str | None = None, arch: str | None = None):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self.spec, self.operands, self.params = trace(fn, acc_dtype=acc_dtype, name=name)
        self.arch = as_arch(arch) if arch is not None else None
        self._signature = inspect.signature(fn)
        self._compiled = None

    def __repr__(self) -> str:
        return f"<gemmc.Kernel {self.spec.name}: {self.spec}>"

    @functools.cached_property
    def call_signature(self):
        """How calls pass this kernel's arguments (a gemmc.runtime.CallSignature): the function's parameters in
        its order, the operands by their names, its defaults, and vectors declared (M, 1) / (1, N)."""
        from .runtime import CallSignature
        declared_vectors = {i.name for i in self.spec.inputs if i.kind in ("row", "col")}
        annotations = _annotations(self.fn).parameters
        return CallSignature(
            self.fn.__name__, self.params,
            operands=(("a", self.operands["a"]), ("b", self.operands["b"])),
            defaults=tuple((p.name, p.default) for p in self._signature.parameters.values()
                           if p.default is not inspect.Parameter.empty),
            declared=tuple((n, annotations[n].annotation.shape) for n in self.params
                           if n in declared_vectors and len(annotations[n].annotation.shape) > 1))

    def launch_args(self, *args, **kwargs) -> tuple:
        """The call's arguments reordered as the kernel compiled from `self.spec` takes them:
        (a, b, *spec.inputs). Defaults fill what is left out; arguments that do not bind raise LaunchError."""
        bound = dict(zip(self.params, self.call_signature.bind(args, kwargs)))
        return (bound[self.operands["a"]], bound[self.operands["b"]]) + tuple(bound[i.name] for i in self.spec.inputs)

    def __call__(self, *args, out=None, **kwargs):
        if self._compiled is None:
            self.call_signature.bind(args, kwargs)      # a call that cannot bind fails before the compile step
            from . import compiler
            from .runtime import visible_arch
            self._compiled = compiler.compile(self, schedule="auto", arch=self.arch or visible_arch())
        return self._compiled(*args, out=out, **kwargs)


def kernel(fn=None, *, acc_dtype=DType.f32, name: str | None = None, arch: str | None = None):
    """`@gemmc.kernel` or `@gemmc.kernel(acc_dtype=gemmc.f16, name="...", arch="sm_80")`: trace fn into a
    `Kernel`. `arch` is what calling it compiles for (default: the visible GPU's, else sm_90a)."""
    if fn is None:
        return lambda f: Kernel(f, acc_dtype=acc_dtype, name=name, arch=arch)
    if not callable(fn):
        raise TraceError(f"gemmc.kernel expects a function, got {fn!r}; use keywords for options: "
                         "@gemmc.kernel(acc_dtype=gemmc.f16)")
    return Kernel(fn, acc_dtype=acc_dtype, name=name, arch=arch)
