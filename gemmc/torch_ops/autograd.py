"""The backward formulas of gemmc::linear and gemmc::gemm: the autograd.Functions their ops run where a gradient
is needed (ops.py).

For y = act(z), z = x @ W.T + b (x flattened to [M, K], W [N, K]) and dZ = dY * act'(z):
  dX = dZ @ W      a gemmc GEMM: A = dZ [M, N] "mk", B = W [N, K] read as "kn"
  dW = dZ^T @ X    a gemmc GEMM: A = dZ [M, N] read as "km", B = X [M, K] "kn"; its reduction dim is M
                   (the tokens), symbolic in its kernel, so one kernel serves every batch size
  db = dZ summed over the rows
relu's derivative comes from the output's sign; gelu, gelu_tanh and silu need z, which the backward
recomputes with the bias-only gemmc kernel. The backward calls only ops (gemmc's and aten's), so
AOTAutograd traces it under torch.compile.
"""
from __future__ import annotations

import torch

from .activations import NEEDS_PREACTIVATION, activation_backward
from .functional import gemm, linear
from .ops import LAUNCH_GEMM, LAUNCH_LINEAR, define_public_ops

_OTHER_B = {"nk": "kn", "kn": "nk"}


def linear_grads(needs_input_grad, dz, x, weight, has_bias: bool):
    """(dX, dW, db) of z = x @ weight.T + bias from dZ; None where no gradient is needed."""
    n, k = weight.shape
    dz2 = dz.reshape(-1, n)
    dx = gemm(dz2, weight, "mk", "kn").reshape(x.shape) if needs_input_grad[0] else None
    dw = gemm(dz2, x.reshape(-1, k), "km", "kn") if needs_input_grad[1] else None
    db = dz2.sum(0) if has_bias and needs_input_grad[2] else None
    return dx, dw, db


class LinearFunction(torch.autograd.Function):
    """y = act(x @ weight.T + bias) through the kernel op, with gemmc's backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation):
        y = LAUNCH_LINEAR(x, weight, bias, activation)
        ctx.activation = activation
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, bias, y if activation == "relu" else None)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, y = ctx.saved_tensors
        activation = ctx.activation
        z = linear(x, weight, bias) if activation in NEEDS_PREACTIVATION else None
        dz = activation_backward(activation, grad, z, y)
        return (*linear_grads(ctx.needs_input_grad, dz, x, weight, ctx.has_bias), None)


def gemm_grads(needs_input_grad, grad, a, b, a_layout: str, b_layout: str):
    """(dA, dB) of C = A @ B with A, B and both gradients in their storage layouts; None where not needed."""
    da = db = None
    if needs_input_grad[0]:
        if a_layout == "mk":        # dA [M, K] = dC @ B^T
            da = gemm(grad, b, "mk", _OTHER_B[b_layout])
        else:                       # dA stored [K, M] = B @ dC^T
            da = gemm(b, grad, "mk" if b_layout == "kn" else "km", "nk")
    if needs_input_grad[1]:
        if b_layout == "nk":        # dB stored [N, K] = dC^T @ A
            db = gemm(grad, a, "km", "kn" if a_layout == "mk" else "nk")
        else:                       # dB [K, N] = A^T @ dC
            db = gemm(a, grad, "km" if a_layout == "mk" else "mk", "kn")
    return da, db


class GemmFunction(torch.autograd.Function):
    """C = A @ B through the kernel op, with gemmc's backward."""

    @staticmethod
    def forward(ctx, a, b, a_layout, b_layout):
        ctx.layouts = (a_layout, b_layout)
        ctx.save_for_backward(a, b)
        return LAUNCH_GEMM(a, b, a_layout, b_layout)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return (*gemm_grads(ctx.needs_input_grad, grad, a, b, *ctx.layouts), None, None)


def register() -> None:
    define_public_ops(LinearFunction.apply, GemmFunction.apply)
