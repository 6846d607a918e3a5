"""The custom ops torch.ops.gemmc.linear and torch.ops.gemmc.gemm: schemas, CUDA and CPU kernels, fake kernels.

CUDA tensors run gemmc kernels (launch.py); CPU tensors run the torch reference (reference.py), so tests on a
CPU host trace, compile and differentiate the same ops. The fake kernels give the output's shape, dtype and
(contiguous) strides, and refuse malformed calls with the same errors, at trace time.
"""
from __future__ import annotations

import torch
from torch.library import custom_op

from . import reference
from .checks import check_gemm_call, check_linear_call, gemm_dims
from .launch import run_gemm, run_linear


@custom_op("gemmc::linear", mutates_args=(), device_types="cuda")
def linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """act(x @ weight.T + bias): x [..., K] (flattened to M rows), weight [N, K], bias [N] or None; activation
    one of gemmc.torch_ops.ACTIVATIONS. Returns a contiguous [..., N] tensor of x's dtype."""
    return run_linear(x, weight, bias, activation)


@linear_op.register_kernel("cpu")
def _linear_cpu(x, weight, bias, activation):
    check_linear_call(x, weight, bias, activation)
    return reference.linear(x, weight, bias, activation)


@linear_op.register_fake
def _linear_fake(x, weight, bias, activation):
    check_linear_call(x, weight, bias, activation)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@custom_op("gemmc::gemm", mutates_args=(), device_types="cuda")
def gemm_op(a: torch.Tensor, b: torch.Tensor, a_layout: str, b_layout: str) -> torch.Tensor:
    """A @ B with operands in gemmc's storage layouts (gemmc/spec.py): a "mk" [M, K] or "km" [K, M]; b "nk"
    [N, K] (a @ b.T) or "kn" [K, N]. Returns a contiguous [M, N] tensor of a's dtype."""
    return run_gemm(a, b, a_layout, b_layout)


@gemm_op.register_kernel("cpu")
def _gemm_cpu(a, b, a_layout, b_layout):
    check_gemm_call(a, b, a_layout, b_layout)
    return reference.gemm(a, b, a_layout, b_layout)


@gemm_op.register_fake
def _gemm_fake(a, b, a_layout, b_layout):
    check_gemm_call(a, b, a_layout, b_layout)
    m, n, _, _ = gemm_dims(a, b, a_layout, b_layout)
    return a.new_empty((m, n))
