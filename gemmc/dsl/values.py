"""The symbolic tensors a kernel function is traced over (`Value`): the operators that record matmul and
epilogue ops on their tracer, the ones that raise (control flow, indexing, reductions, torch functions),
gemmc.relu/gelu/silu/sigmoid/tanh/clamp, which also run on torch tensors (for reference code), and
gemmc.grouped_mm, a grouped GEMM's matmul (also run on torch tensors, as the per-group reference)."""
from __future__ import annotations

from ..errors import SpecError
from ..spec import Dim
from ..types import DType, as_dtype
from .locations import trace_error, user_line
from .parameter_types import fmt_shape

_REDUCTIONS = ("sum", "mean", "max", "min", "amax", "amin", "prod", "norm", "argmax", "argmin", "std", "var",
               "logsumexp", "softmax", "log_softmax", "cumsum", "cumprod", "any", "all")


class Value:
    """A symbolic tensor during tracing: a parameter, the accumulator, or an epilogue op's result."""

    __slots__ = ("_tracer", "_ref", "_shape", "_param", "_transposed", "_on_acc", "_line", "_scale")
    __array_ufunc__ = None  # numpy scalars defer to our reflected ops (np.float32(2) * acc)

    def __init__(self, tracer, ref, shape, *, param=None, transposed=False, on_acc=False, line="", scale=None):
        self._tracer = tracer
        self._ref = ref                # Ref once it is usable in the epilogue (None for a raw tensor param)
        self._shape = tuple(shape)
        self._param = param            # parameter name when this is a parameter (maybe transposed / indexed)
        self._transposed = transposed
        self._on_acc = on_acc          # depends on the matmul result
        self._line = line
        self._scale = scale            # gemmc.scaled(x, s): the name of the scale parameter s of operand x

    def __repr__(self) -> str:
        what = self._param or str(self._ref)
        return f"<traced {what} {fmt_shape(self._shape)}>"

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    # -- the matmul --
    def __matmul__(self, other):
        return self._tracer.matmul(self, other, user_line())

    def __rmatmul__(self, other):
        return self._tracer.matmul(other, self, user_line())

    @property
    def T(self):
        where = user_line()
        if len(self._shape) == 3:
            raise trace_error(where, f"`.T` of the batched tensor {self._param or 'value'}: use `.mT` to swap the last "
                              "two dims")
        return self._transpose(where, ".T")

    @property
    def mT(self):
        return self._transpose(user_line(), ".mT")

    def t(self):
        return self._transpose(user_line(), ".t()")

    def _transpose(self, where, how):
        if len(self._shape) == 1:
            return self
        if self._param is None or self._tracer.param_kind(self._param) != "tensor" or self._ref is not None:
            raise trace_error(where, f"transpose `{how}` of an epilogue value: only a matmul operand may be transposed "
                              "(the output is always M x N, row-major)")
        shape = self._shape[:-2] + (self._shape[-1], self._shape[-2])
        return Value(self._tracer, None, shape, param=self._param, transposed=not self._transposed, line=where,
                     scale=self._scale)

    # -- elementwise arithmetic --
    def __add__(self, o): return self._tracer.binary("add", "+", self, o, user_line())
    def __radd__(self, o): return self._tracer.binary("add", "+", o, self, user_line())
    def __sub__(self, o): return self._tracer.binary("sub", "-", self, o, user_line())
    def __rsub__(self, o): return self._tracer.binary("sub", "-", o, self, user_line())
    def __mul__(self, o): return self._tracer.binary("mul", "*", self, o, user_line())
    def __rmul__(self, o): return self._tracer.binary("mul", "*", o, self, user_line())
    def __truediv__(self, o): return self._tracer.binary("div", "/", self, o, user_line())
    def __rtruediv__(self, o): return self._tracer.binary("div", "/", o, self, user_line())

    def __neg__(self):
        return self._tracer.binary("mul", "-", self, -1.0, user_line())

    def __pos__(self):
        return self

    def _unsupported_op(self, sym):
        raise trace_error(user_line(), f"operator `{sym}` is not a supported epilogue op; use + - * /, gemmc.relu, "
                          "gelu, silu, sigmoid, tanh, clamp or .to(dtype)")

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
        raise trace_error(user_line(), f"{what} on a traced value: the kernel is traced once over symbolic tensors, so "
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
        where = user_line()
        full = slice(None)
        is_full = lambda k: isinstance(k, slice) and k == full  # noqa: E731
        if (self._param is not None and self._ref is None and len(self._shape) == 1 and isinstance(key, tuple)
                and len(key) == 2 and self._tracer.param_kind(self._param) == "tensor"):
            if is_full(key[0]) and key[1] is None:
                return Value(self._tracer, None, (self._shape[0], 1), param=self._param, line=where)
            if key[0] is None and is_full(key[1]):
                return Value(self._tracer, None, (1, self._shape[0]), param=self._param, line=where)
        raise trace_error(where, f"indexing `{self._param or 'value'}[{_fmt_key(key)}]` is not supported: the epilogue "
                          "is elementwise over the whole tile; the one allowed form is `vec[:, None]` on a rank-1 "
                          "parameter (a per-row column vector)")

    # -- methods --
    def to(self, dtype, *args, **kwargs):
        where = user_line()
        if args or kwargs:
            raise trace_error(where, "`.to(...)` takes one dtype argument, e.g. `.to(gemmc.f32)`")
        try:
            dt = as_dtype(dtype)
        except SpecError as e:
            raise trace_error(where, f"`.to({dtype!r})`: {e}") from None
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
        where = user_line()
        if name in _REDUCTIONS:
            raise trace_error(where, f"reduction `.{name}()` is not supported in a GEMM epilogue: the epilogue is "
                              "elementwise over each output tile; reduce the result in a separate op")
        raise trace_error(where, f"`.{name}` is not supported on a traced tensor; the epilogue supports + - * /, "
                          "gemmc.relu, gelu, silu, sigmoid, tanh, clamp and .to(dtype)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise trace_error(user_line(), f"torch.{name} on a traced tensor: use the gemmc equivalent "
                          "(gemmc.relu, gelu, silu, sigmoid, tanh, clamp, .to) inside @gemmc.kernel")


def _fmt_key(key) -> str:
    def one(k):
        if isinstance(k, slice):
            parts = ["" if x is None else str(x) for x in (k.start, k.stop)]
            return ":".join(parts) + (f":{k.step}" if k.step is not None else "")
        return "None" if k is None else ("..." if k is Ellipsis else repr(k))
    return ", ".join(one(k) for k in key) if isinstance(key, tuple) else one(key)


# ---- fp8 operands ----------------------------------------------------------------------------

def scaled(x, scale):
    """`gemmc.scaled(x, sx)`: the fp8 matmul operand x with its f32 scale sx, e.g.
    `gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T`. The two scales' shapes say the scaling (gemmc.Scaling):
    per tensor () or (1,) each; per row (M,) and (N,); per block (M, ceil(K/128)) and (ceil(N/128), ceil(K/128)).
    On torch tensors (reference code) it returns x dequantized in f32: x stored as rows x K (A as M x K, an
    nn.Linear-style B as N x K) times its scale, broadcast per tensor, per row or per 128-block."""
    if not _is_value(x) and not _is_value(scale):
        from ..quantize import dequantize
        return dequantize(x, scale)
    where = user_line()
    for what, v in (("operand", x), ("scale", scale)):
        if not _is_value(v):
            raise trace_error(where, f"gemmc.scaled: the {what} {v!r} is not a traced tensor; write "
                              "gemmc.scaled(x, sx) with x an fp8 tensor parameter and sx its f32 scale parameter")
        if v._param is None or v._ref is not None or v._tracer.param_kind(v._param) != "tensor":
            raise trace_error(where, f"gemmc.scaled: the {what} is {v!r}; both arguments are tensor parameters "
                              "(the scale of a scalar is a one-element tensor: gemmc.Tensor[(), gemmc.f32])")
    if x._tracer is not scale._tracer:
        raise trace_error(where, "gemmc.scaled: a value from another traced kernel")
    if x._scale is not None:
        raise trace_error(where, f"gemmc.scaled: {x._param} already has the scale {x._scale}")
    if scale._transposed or len(scale._shape) != len(x._tracer.params[scale._param].shape):
        raise trace_error(where, f"gemmc.scaled: pass the scale {scale._param} as declared (not transposed or "
                          "indexed)")
    return Value(x._tracer, None, x._shape, param=x._param, transposed=x._transposed, line=where,
                 scale=scale._param)


# ---- elementwise functions (also usable on torch tensors, for reference code) ---------------

def _is_value(x) -> bool:
    return isinstance(x, Value)


def relu(x):
    if _is_value(x):
        return x._tracer.unary("relu", x, user_line())
    import torch
    return torch.relu(x)


def gelu(x, approximate: str = "none"):
    """`approximate="tanh"` (gelu_tanh) or "none" / "erf" (gelu_erf, torch's default)."""
    if approximate not in ("tanh", "none", "erf"):
        raise trace_error(user_line(), f"gelu(approximate={approximate!r}): use 'tanh' or 'none' (erf)")
    op = "gelu_tanh" if approximate == "tanh" else "gelu_erf"
    if _is_value(x):
        return x._tracer.unary(op, x, user_line())
    import torch
    return torch.nn.functional.gelu(x, approximate="tanh" if op == "gelu_tanh" else "none")


def silu(x):
    if _is_value(x):
        return x._tracer.unary("silu", x, user_line())
    import torch
    return torch.nn.functional.silu(x)


def sigmoid(x):
    if _is_value(x):
        return x._tracer.unary("sigmoid", x, user_line())
    import torch
    return torch.sigmoid(x)


def tanh(x):
    if _is_value(x):
        return x._tracer.unary("tanh", x, user_line())
    import torch
    return torch.tanh(x)


def clamp(x, min=None, max=None):  # noqa: A002  (torch's names)
    if _is_value(x):
        where = user_line()
        for label, v in (("min", min), ("max", max)):
            if v is not None and (isinstance(v, (bool, Value)) or not isinstance(v, (int, float))):
                raise trace_error(where, f"clamp {label}={v!r}: bounds must be python numbers")
        if min is None and max is None:
            raise trace_error(where, "clamp needs min=, max= or both")
        if min is not None and max is not None and float(min) > float(max):
            raise trace_error(where, f"clamp min={min} > max={max}")
        attrs = tuple((k, float(v)) for k, v in (("min", min), ("max", max)) if v is not None)
        return x._tracer.unary("clamp", x, where, attrs)
    import torch
    return torch.clamp(x, min=min, max=max)


def grouped_mm(a, b, groups):
    """E matmuls in one (mixture-of-experts experts): group g's rows of `a` times its own `b[g]`.

    Contiguous groups (`groups` a gemmc.GroupOffsets[E]): a is (M, K), rows sorted by group, and group g owns rows
    groups[g] .. groups[g + 1] - 1; b is (E, K, N) (`w.mT` of an (E, N, K) weight); the result is (M, N).
    Masked groups (a gemmc.GroupCounts[E]): a is (E, M, K), group g owns its first groups[g] rows; the result is
    (E, M, N). Rows of no group are not written by a kernel; on torch tensors (the reference) they are 0."""
    if _is_value(a) or _is_value(b) or _is_value(groups):
        tracer = next(x._tracer for x in (a, b, groups) if _is_value(x))
        return tracer.grouped_matmul(a, b, groups, user_line())
    out = a.new_zeros(a.shape[:-1] + (b.shape[-1],))
    for g in range(b.shape[0]):
        if a.dim() == 2:
            lo, hi = int(groups[g]), int(groups[g + 1])
            out[lo:hi] = a[lo:hi] @ b[g]
        else:
            rows = int(groups[g])
            out[g, :rows] = a[g, :rows] @ b[g]
    return out
