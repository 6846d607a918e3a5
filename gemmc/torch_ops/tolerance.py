"""The error measure and the bound gemmc.torch_ops promises (stated in the package docstring)."""
from __future__ import annotations

import torch

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want||_F / ||want||_F in float64 (0 when both are zero; inf where got is not finite)."""
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return float("inf")
    scale = want.norm().item()
    diff = (got - want).norm().item()
    return diff / scale if scale else (0.0 if diff == 0 else float("inf"))


def error_bound(torch_error: float, dtype: torch.dtype) -> float:
    """The most err(gemmc) may be: 2 err(torch) + 2u, both against the fp32 reference of the same inputs."""
    return 2.0 * torch_error + 2.0 * UNIT_ROUNDOFF[dtype]
