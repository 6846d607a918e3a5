"""The Python entry points: gemmc.torch_ops.linear and gemmc.torch_ops.gemm.

Both call the custom ops (ops.py) wherever torch must see them: under torch.compile, make_fx or any other
tracing, on CPU tensors, and where autograd needs gradients. An eager call on plain CUDA tensors that needs no
gradient runs the same CUDA implementation directly, without the dispatcher's round trip (several times the
host time of the kernel call itself): same kernels, same result, same errors.
"""
from __future__ import annotations

import torch

from .activations import NEEDS_PREACTIVATION, TORCH_FORWARD
from .checks import check_gemm_call, check_linear_call
from .launch import run_gemm, run_linear
from . import ops  # noqa: F401  (defines torch.ops.gemmc.*)

_LINEAR = torch.ops.gemmc.linear.default
_GEMM = torch.ops.gemmc.gemm.default
_Tensor = torch.Tensor


def _direct(t) -> bool:
    """True for a plain CUDA tensor outside any tracing (no dynamo frame, no dispatch mode, no tensor subclass)."""
    return (not torch.compiler.is_compiling() and type(t) is _Tensor and t.is_cuda
            and not torch._C._len_torch_dispatch_stack())


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
        return run_linear(x, weight, bias, activation) if _direct(x) else _LINEAR(x, weight, bias, activation)
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
