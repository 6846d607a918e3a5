"""The Python entry points: gemmc.torch_ops.linear, gemm and gated_linear.

Both call the registered ops (ops.py) wherever torch must see them: under torch.compile, make_fx or any other
tracing, on CPU tensors, and where autograd needs gradients. An eager call on plain CUDA tensors that needs no
gradient runs the same CUDA implementation directly, without the dispatcher's round trip (several times the
host time of the kernel call itself): same kernels, same result, same errors.

Under torch.compile with a static row count, a plain Linear (no bias, no activation) whose M bucket `auto`
routes to torch.matmul is traced as F.linear itself: the route is decided once, while tracing, and the
compiled graph calls cuBLAS with no gemmc op (an op call costs several us of Python host time).
"""
from __future__ import annotations

import math

import torch

from .activations import NEEDS_PREACTIVATION, TORCH_FORWARD
from .checks import check_gated_call, check_gemm_call, check_linear_call
from .launch import run_gated, run_gemm, run_linear
from . import ops  # noqa: F401  (defines torch.ops.gemmc.*)

_LINEAR = torch.ops.gemmc.linear.default
_GEMM = torch.ops.gemmc.gemm.default
_GATED = torch.ops.gemmc.gated_linear.default
_Tensor = torch.Tensor
_torch_linear = torch.nn.functional.linear


def _direct(t) -> bool:
    """True for a plain CUDA tensor outside any tracing (no dynamo frame, no dispatch mode, no tensor subclass)."""
    return (not torch.compiler.is_compiling() and type(t) is _Tensor and t.is_cuda
            and not torch._C._len_torch_dispatch_stack())


@torch.compiler.assume_constant_result
def auto_routes_to_torch(n: int, k: int, dtype: torch.dtype, rows: int) -> bool:
    """True where the plain Linear kernel of weight [n, k] runs torch.matmul at `rows` rows (its M bucket's
    `auto` verdict). Dynamo runs it once while tracing and keeps the answer as a constant."""
    from .kernels import linear_kernel
    try:
        return linear_kernel(n, k, dtype, False, "none").for_m(rows)[1] is None
    except Exception:       # anything gemmc cannot compile: the op's path, whose checks say why
        return False


def _static_rows(x: torch.Tensor, weight: torch.Tensor) -> int | None:
    """M of a well-formed Linear call whose shape is static while tracing, else None."""
    shape = x.shape
    if (x.dim() < 1 or weight.dim() != 2 or x.dtype is not weight.dtype or not (x.is_cuda and weight.is_cuda)
            or shape[-1] != weight.shape[1] or not all(type(s) is int for s in shape)):
        return None
    return math.prod(shape[:-1]) or None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str = "none") -> torch.Tensor:
    """act(F.linear(x, weight, bias)) with one gemmc kernel: x [..., K], weight [N, K] (an nn.Linear weight),
    bias [N] or None, activation one of ACTIVATIONS ("gelu" is erf GELU, as torch's default)."""
    try:
        grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                            or (bias is not None and bias.requires_grad))
    except AttributeError:      # not tensors
        check_linear_call(x, weight, bias, activation)
        raise
    if not grad:
        if _direct(x):
            return run_linear(x, weight, bias, activation)
        if bias is None and activation == "none" and torch.compiler.is_compiling():
            rows = _static_rows(x, weight)
            if rows is not None and auto_routes_to_torch(weight.shape[0], weight.shape[1], weight.dtype, rows):
                return _torch_linear(x, weight)
        return _LINEAR(x, weight, bias, activation)
    if activation in NEEDS_PREACTIVATION:
        # Training: the bias-only kernel and torch's activation, so autograd saves z; the fused op's backward
        # would recompute z with a whole GEMM (the epilogue's fusion saves less than that GEMM costs).
        return TORCH_FORWARD[activation](_LINEAR(x, weight, bias, "none"))
    return _LINEAR(x, weight, bias, activation)


def gemm(a: torch.Tensor, b: torch.Tensor, a_layout: str = "mk", b_layout: str = "nk") -> torch.Tensor:
    """A @ B with one gemmc kernel (or torch.matmul where `auto` measured cuBLAS faster), operands in gemmc's
    storage layouts (gemmc/spec.py): a "mk" [M, K] or "km" [K, M]; b "nk" [N, K] (a @ b.T, an nn.Linear
    weight) or "kn" [K, N]. Returns a contiguous [M, N] tensor."""
    try:
        grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    except AttributeError:      # not tensors
        check_gemm_call(a, b, a_layout, b_layout)
        raise
    if not grad and _direct(a):
        return run_gemm(a, b, a_layout, b_layout)
    return _GEMM(a, b, a_layout, b_layout)


def gated_linear(x: torch.Tensor, weight: torch.Tensor, gate: str = "silu") -> torch.Tensor:
    """gate(x @ weight[:N].T) * (x @ weight[N:].T) with one gemmc kernel (SwiGLU for gate "silu", GeGLU for
    "gelu"): x [..., K], weight [2N, K], the gate projection's rows stacked over the up projection's.
    Where a gradient is needed, and for decode-sized calls (up to gemmc.choose.heuristic.GATED_UNFUSED_MAX_M
    rows, where the plain GEMM's swapped kernels are faster), the [gate; up] Linear and torch's gating."""
    try:
        grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    except AttributeError:      # not tensors
        check_gated_call(x, weight, gate)
        raise
    if not grad and _direct(x):
        return run_gated(x, weight, gate)
    return _GATED(x, weight, gate)
