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
- fp8 operands carry their f32 scales: `gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T`; the scales' shapes say
  the scaling (gemmc.Scaling: per tensor, per row, per block). The output defaults to bf16.
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
- A grouped GEMM (mixture-of-experts experts) is `gemmc.grouped_mm(x, w.mT, offsets)` with `offsets:
  gemmc.GroupOffsets["E"]` (x is (M, K), rows sorted by group; w is (E, N, K)), or with `counts:
  gemmc.GroupCounts["E"]` (x is (E, M, K)); its epilogue reads scalars only.
Anything else raises `TraceError` naming the construct and the user's `file:line`.

The package, a module per job: parameter_types (the annotations), values (the traced tensors and their
operators), tracer (records the ops), tracing (calls the function), spec_from_trace (the GemmSpec), locations
(errors at the user's line). This module is the decorator and the `Kernel` it returns.
"""
from __future__ import annotations

import functools
import inspect

from ..errors import TraceError
from ..types import DType, as_arch
from .parameter_types import GroupCounts, GroupIndexType, GroupOffsets, Scalar, Tensor, TensorType  # noqa: F401
from .tracing import evaluated_signature, trace
from .values import Value, clamp, gelu, grouped_mm, relu, scaled, sigmoid, silu, tanh  # noqa: F401


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
        from ..runtime import CallSignature
        declared_vectors = {i.name for i in self.spec.inputs if i.kind in ("row", "col")}
        annotations = evaluated_signature(self.fn).parameters
        # a per-tensor scale declared () reaches the kernel as its one-element (1,) view
        if self.spec.scaling is not None and self.spec.scaling.mode == "tensor":
            declared_vectors |= {s for s in self.spec.scaling.names if annotations[s].annotation.shape == ()}
        return CallSignature(
            self.fn.__name__, self.params,
            operands=tuple((role, self.operands[role]) for role in ("a", "b", self.spec.group_operand)
                           if role is not None),
            defaults=tuple((p.name, p.default) for p in self._signature.parameters.values()
                           if p.default is not inspect.Parameter.empty),
            declared=tuple((n, annotations[n].annotation.shape) for n in self.params
                           if n in declared_vectors and len(annotations[n].annotation.shape) != 1))

    def launch_args(self, *args, **kwargs) -> tuple:
        """The call's arguments reordered as the kernel compiled from `self.spec` takes them:
        (a, b, *scales, [a grouped GEMM's offsets or counts], *spec.inputs) (scales: an fp8 kernel's A and B
        scales). Defaults fill what is left out; arguments that do not bind raise LaunchError."""
        bound = dict(zip(self.params, self.call_signature.bind(args, kwargs)))
        scales = self.spec.scaling.names if self.spec.scaling is not None else ()
        groups = (bound[self.operands[self.spec.group_operand]],) if self.spec.grouped else ()
        return ((bound[self.operands["a"]], bound[self.operands["b"]]) + tuple(bound[s] for s in scales) + groups
                + tuple(bound[i.name] for i in self.spec.inputs))

    def __call__(self, *args, out=None, **kwargs):
        if self._compiled is None:
            self.call_signature.bind(args, kwargs)      # a call that cannot bind fails before the compile step
            from .. import compiler
            from ..runtime import visible_arch
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
