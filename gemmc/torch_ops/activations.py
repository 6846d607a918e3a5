"""What each activation name of gemmc.torch_ops means: the gemmc epilogue op that fuses it, torch's forward,
and torch's derivative (the aten backward ops torch's own autograd uses, so AOTAutograd traces them)."""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

# "gelu" is erf GELU, as torch's default (F.gelu); "gelu_tanh" is F.gelu(approximate="tanh").
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")

# the gemmc epilogue op (gemmc.spec.UNARY_OPS) of each activation; "none" has none
EPILOGUE_OP = {"none": None, "relu": "relu", "gelu": "gelu_erf", "gelu_tanh": "gelu_tanh", "silu": "silu"}

# the gate activations of a gated Linear (gemmc.torch_ops.gated_linear: SwiGLU is "silu", GeGLU "gelu")
GATES = ("silu", "gelu", "gelu_tanh", "relu")

# activations whose derivative needs the pre-activation z (relu's needs only the output's sign)
NEEDS_PREACTIVATION = frozenset(("gelu", "gelu_tanh", "silu"))

TORCH_FORWARD = {
    "none": lambda z: z,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
}


def activation_backward(activation: str, grad: torch.Tensor, z: torch.Tensor | None,
                        y: torch.Tensor | None) -> torch.Tensor:
    """dL/dz from dL/dy for y = act(z): `z` is the pre-activation (gelu, gelu_tanh, silu), `y` the output
    (relu). Same dtype as `grad`."""
    aten = torch.ops.aten
    if activation == "none":
        return grad
    if activation == "relu":
        return aten.threshold_backward(grad, y, 0)
    if activation == "gelu":
        return aten.gelu_backward(grad, z, approximate="none")
    if activation == "gelu_tanh":
        return aten.gelu_backward(grad, z, approximate="tanh")
    if activation == "silu":
        if torch.is_grad_enabled():     # double backward: aten.silu_backward has no derivative (as torch's own)
            s = torch.sigmoid(z)
            return grad * s * (1 + z * (1 - s))
        return aten.silu_backward(grad, z)
    raise ValueError(f"no backward for activation {activation!r}")
