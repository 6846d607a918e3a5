"""`gemmc.nn.GatedMLP`: a Llama-style MLP, down(act(gate(x)) * up(x)), whose gate and up projections run as
ONE gemmc kernel over a fused [gate; up] weight, the gating in its epilogue, with the original model's
state_dict keys."""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

import gemmc.torch_ops as gto

from ..errors import SpecError
from .linear import Linear, torch_activation

# The gate activations a gated MLP may use: the gemmc activation names whose torch functions we compare against.
GATE_ACTIVATIONS = gto.GATES
_GATE = {name: torch_activation(name) for name in GATE_ACTIVATIONS}


def plain_linear(module) -> bool:
    """True for a torch.nn.Linear (or a subclass that keeps nn.Linear's forward) that is not a gemmc Linear."""
    return (isinstance(module, nn.Linear) and not isinstance(module, Linear)
            and type(module).forward is nn.Linear.forward)


def recognize_activation(act_fn) -> str | None:
    """The gemmc name of the activation `act_fn` computes (checked on a probe input), else None."""
    if isinstance(act_fn, nn.Module) and next(act_fn.parameters(), None) is not None:
        return None     # a learned activation (PReLU, ...) is not one of the fixed functions
    probe = torch.linspace(-8.0, 8.0, 401, dtype=torch.float32)
    try:
        with torch.no_grad():
            out = act_fn(probe)
    except Exception:
        return None
    for name in GATE_ACTIVATIONS:
        ref = torch_activation(name)(probe)
        if isinstance(out, torch.Tensor) and out.shape == ref.shape and torch.allclose(out, ref, rtol=1e-5, atol=1e-6):
            return name
    return None


def fusion_problem(mlp: nn.Module) -> tuple[str | None, str | None]:
    """(activation, None) when `mlp` is a Llama-style MLP that GatedMLP can replace, else (None, why not)."""
    gate, up, down = (getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if not all(plain_linear(m) for m in (gate, up, down)):
        return None, "gate_proj, up_proj and down_proj are not all plain nn.Linear layers"
    if not hasattr(mlp, "act_fn"):
        return None, "it has no act_fn"
    if gate.weight.shape != up.weight.shape or down.in_features != gate.out_features:
        return None, (f"its shapes do not chain: gate_proj {tuple(gate.weight.shape)}, up_proj "
                      f"{tuple(up.weight.shape)}, down_proj {tuple(down.weight.shape)}")
    if (gate.bias is None) != (up.bias is None):
        return None, "gate_proj and up_proj differ in having a bias"
    params = [gate.weight, up.weight] + [b for b in (gate.bias, up.bias) if b is not None]
    if len({(p.dtype, p.device) for p in params}) != 1:
        return None, "gate_proj's and up_proj's parameters differ in dtype or device"
    if gate.weight.device.type == "meta":
        return None, "its parameters are on the meta device (load the weights first)"
    activation = recognize_activation(mlp.act_fn)
    if activation is None:
        return None, f"its act_fn ({type(mlp.act_fn).__name__}) is not one of {GATE_ACTIVATIONS}"
    if not _computes_gated_mlp(mlp, gate, up, down):
        return None, "its forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x)) on a probe input"
    return activation, None


def _computes_gated_mlp(mlp, gate, up, down) -> bool:
    """Whether mlp(x) == down(act_fn(gate(x)) * up(x)) exactly on a small random input (a model with extra
    terms, or dropout active in training mode, is not fused)."""
    w = gate.weight
    gen = torch.Generator(device=w.device).manual_seed(0)
    x = torch.randn(2, gate.in_features, generator=gen, device=w.device, dtype=torch.float32).to(w.dtype)
    with torch.no_grad():
        expected = down(mlp.act_fn(gate(x)) * up(x))
        got = mlp(x)
    return isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected)


class GatedMLP(nn.Module):
    """down_proj(act(gate) * up) with [gate | up] = gate_up_proj(x): ONE GEMM over a fused [2I, H] weight
    (rows [0, I) are gate_proj's, rows [I, 2I) up_proj's), so the activations are read once.

    state_dict() and load_state_dict() use the original MLP's keys (gate_proj.weight, up_proj.weight,
    down_proj.weight, and biases): a checkpoint of the unfused model loads, and this module's state_dict loads
    into the unfused model. state_dict() gives gate_proj and up_proj as views of the fused weight (no copy).
    """

    def __init__(self, gate_up_proj: Linear, down_proj: nn.Module, activation: str = "silu"):
        super().__init__()
        if activation not in GATE_ACTIVATIONS:
            raise SpecError(f"gemmc.nn.GatedMLP: activation {activation!r} is not one of {GATE_ACTIVATIONS}")
        if gate_up_proj.out_features % 2:
            raise SpecError(f"gemmc.nn.GatedMLP: gate_up_proj has {gate_up_proj.out_features} outputs; it needs "
                            "2 * intermediate_size ([gate; up] stacked)")
        self.hidden_size = gate_up_proj.in_features
        self.intermediate_size = gate_up_proj.out_features // 2
        self.activation = activation
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self._register_state_dict_hook(_split_gate_up)
        self._register_load_state_dict_pre_hook(_fuse_gate_up, with_module=True)

    @classmethod
    def from_mlp(cls, mlp: nn.Module, allow_cpu: bool = False) -> "GatedMLP":
        """A GatedMLP computing what `mlp` (a Llama-style MLP) computes. The fused weight is a new Parameter
        (a copy of gate_proj's and up_proj's); `mlp.down_proj` is reused as it is. Raises SpecError naming
        what stops the fusion."""
        activation, problem = fusion_problem(mlp)
        if problem is not None:
            raise SpecError(f"gemmc.nn.GatedMLP.from_mlp: cannot fuse {type(mlp).__name__}: {problem}")
        gate, up = mlp.gate_proj, mlp.up_proj
        weight = nn.Parameter(torch.cat([gate.weight.detach(), up.weight.detach()]),
                              requires_grad=gate.weight.requires_grad)
        bias = None if gate.bias is None else nn.Parameter(
            torch.cat([gate.bias.detach(), up.bias.detach()]), requires_grad=gate.bias.requires_grad)
        gate_up = Linear._wrap(weight, bias, "none", allow_cpu, training=mlp.training)
        fused = cls(gate_up, mlp.down_proj, activation)
        fused.train(mlp.training)
        return fused

    @property
    def gated_kernel_args(self) -> tuple | None:
        """(N, K, dtype, gate) of the gated kernel the forward runs (gemmc.torch_ops.gated_kernel), or None
        where it runs the [gate; up] Linear and gates in torch: a bias, or a layer on torch's path."""
        lin = self.gate_up_proj
        if lin.bias is not None or lin.fallback_reason is not None:
            return None
        return self.intermediate_size, self.hidden_size, lin.weight.dtype, self.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = self.gate_up_proj
        w = lin.gemmc_weight(x)
        if w is not None and lin._parameters["bias"] is None:
            # one kernel, the gate in its epilogue (with a gradient needed, the Linear and torch's gating)
            return self.down_proj(gto.gated_linear(x, w, self.activation))
        gate, up = lin(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(_GATE[self.activation](gate) * up)

    def extra_repr(self) -> str:
        where = ("in the gated kernel's epilogue" if self.gated_kernel_args is not None
                 else "in torch after the fused gate/up GEMM")
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"activation={self.activation!r} (applied {where})")


def _split_gate_up(module: GatedMLP, state_dict, prefix: str, local_metadata) -> None:
    """state_dict hook: gate_up_proj.{weight,bias} -> gate_proj.* and up_proj.*, ordered before down_proj.*."""
    i = module.intermediate_size
    fused = {suffix: state_dict.pop(f"{prefix}gate_up_proj.{suffix}", None) for suffix in ("weight", "bias")}
    for name, rows in (("gate_proj", slice(0, i)), ("up_proj", slice(i, 2 * i))):
        for suffix, tensor in fused.items():
            if tensor is not None:
                state_dict[f"{prefix}{name}.{suffix}"] = tensor[rows]
    if isinstance(state_dict, OrderedDict):
        for key in [k for k in state_dict if k.startswith(f"{prefix}down_proj.")]:
            state_dict.move_to_end(key)


def _fuse_gate_up(module: GatedMLP, state_dict, prefix: str, local_metadata, strict, missing_keys,
                  unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: gate_proj.* and up_proj.* -> gate_up_proj.* (stacked [gate; up])."""
    for suffix in ("weight", "bias"):
        gate_key, up_key = f"{prefix}gate_proj.{suffix}", f"{prefix}up_proj.{suffix}"
        if gate_key in state_dict and up_key in state_dict:
            state_dict[f"{prefix}gate_up_proj.{suffix}"] = torch.cat([state_dict.pop(gate_key),
                                                                      state_dict.pop(up_key)])
