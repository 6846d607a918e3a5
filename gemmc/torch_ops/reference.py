"""The torch reference of the ops: what the CPU kernels run, and what the CUDA path runs for empty problems.

It computes as a gemmc kernel does: products accumulated in f32 (or wider: float64 inputs stay float64, for
torch.autograd.gradcheck), the bias and the activation applied in that precision, one rounding to the
inputs' dtype at the end.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .activations import TORCH_FORWARD


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """act(x @ weight.T + bias) in x's dtype, x [..., K], weight [N, K]."""
    acc = _acc_dtype(x.dtype)
    z = F.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc))
    return TORCH_FORWARD[activation](z).to(x.dtype)


def logical(a: torch.Tensor, b: torch.Tensor, a_layout: str, b_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(A as M x K, B as K x N): views of operands stored in gemmc's layouts."""
    return (a if a_layout == "mk" else a.mT), (b.mT if b_layout == "nk" else b)


def gemm(a: torch.Tensor, b: torch.Tensor, a_layout: str, b_layout: str) -> torch.Tensor:
    """A @ B in a's dtype for operands in gemmc's storage layouts; a contiguous [M, N] result."""
    acc = _acc_dtype(a.dtype)
    a_mk, b_kn = logical(a, b, a_layout, b_layout)
    return torch.matmul(a_mk.to(acc), b_kn.to(acc)).to(a.dtype).contiguous()


def gated(x: torch.Tensor, weight: torch.Tensor, gate: str) -> torch.Tensor:
    """gate(x @ weight[:N].T) * (x @ weight[N:].T) in x's dtype; weight [2N, K] is [gate; up]."""
    acc = _acc_dtype(x.dtype)
    g, u = F.linear(x.to(acc), weight.to(acc)).chunk(2, dim=-1)
    return (TORCH_FORWARD[gate](g) * u).to(x.dtype)
