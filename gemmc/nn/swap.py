"""`gemmc.nn.swap_linears`: replace a model's nn.Linear layers (and, optionally, its Llama-style MLPs) by gemmc
layers in place, and report what runs where."""
from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Callable, NamedTuple, Sequence, Union

import torch
from torch import nn
from torch.nn.utils import parametrize

import gemmc.torch_ops as gto

from ..errors import PerformanceWarning
from .gated_mlp import GatedMLP, fusion_problem, plain_linear
from .linear import Linear, gemmc_reason

LayerFilter = Union[str, Sequence[str], Callable[[str, nn.Module], bool], None]


class KernelKey(NamedTuple):
    """What one shared gemmc kernel serves: gemmc.torch_ops.linear_kernel(n, k, dtype, bias, activation), or
    with `gate`, the gated kernel gemmc.torch_ops.gated_kernel(n, k, dtype, gate) (n: its output columns)."""
    n: int
    k: int
    dtype: torch.dtype
    bias: bool
    activation: str
    gate: str | None = None

    def __str__(self) -> str:
        if self.gate is not None:
            return f"N={self.n} K={self.k} {str(self.dtype).removeprefix('torch.')} gate={self.gate} (gated)"
        return (f"N={self.n} K={self.k} {str(self.dtype).removeprefix('torch.')} bias={self.bias} "
                f"activation={self.activation}")


@dataclass
class SwapReport:
    """What swap_linears did. Names are qualified module names ("model.layers.0.mlp.down_proj")."""
    swapped: list[str] = field(default_factory=list)       # layers that run gemmc now
    kept: dict[str, str] = field(default_factory=dict)     # layer -> why it keeps torch's path
    fused_mlps: list[str] = field(default_factory=list)    # MLPs now a GatedMLP (gate and up as one GEMM)
    unfused_mlps: dict[str, str] = field(default_factory=dict)  # MLP -> why fuse_mlp left it unfused
    filtered: list[str] = field(default_factory=list)      # Linear layers that include/exclude left alone
    kernels: dict[KernelKey, list[str]] = field(default_factory=dict)  # shared kernel -> the layers it runs

    def kernel(self, key: KernelKey):
        """The shared gemmc CompiledGemm that serves `key`'s layers (from gemmc.torch_ops' registry)."""
        if key.gate is not None:
            return gto.gated_kernel(key.n, key.k, key.dtype, key.gate)
        return gto.linear_kernel(key.n, key.k, key.dtype, key.bias, key.activation)

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} Linear layers onto {len(self.kernels)} shared gemmc kernels; "
                 f"fused {len(self.fused_mlps)} MLPs; {len(self.kept)} layers keep torch's path; "
                 f"{len(self.filtered)} filtered out"]
        for key, names in self.kernels.items():
            lines.append(f"  kernel {key}: {len(names)} layers ({_abbreviate(names)})")
        lines += [f"  kept {_display(name)}: {why}" for name, why in self.kept.items()]
        lines += [f"  unfused MLP {_display(name)}: {why}" for name, why in self.unfused_mlps.items()]
        return "\n".join(lines)


def swap_linears(model: nn.Module, *, include: LayerFilter = None, exclude: LayerFilter = None,
                 fuse_mlp: bool = False, allow_cpu: bool = False) -> SwapReport:
    """Replace `model`'s nn.Linear layers by gemmc.nn.Linear in place (sharing their Parameters) and return a
    SwapReport. Layers with the same (N, K, dtype, bias, activation) share one gemmc kernel.

    include / exclude pick layers by qualified name: a glob ("*.mlp.*"; `*` also crosses dots), a list of
    globs, or a predicate (name, module) -> bool. A layer gemmc cannot run as it is now (weights not on CUDA,
    not bf16/f16, unaligned N or K, a subclass with its own forward, forward hooks, parametrizations) stays
    torch's nn.Linear; one PerformanceWarning names them all with their reasons.

    fuse_mlp=True replaces each Llama-style MLP (gate_proj, up_proj, down_proj and an act_fn of SiLU, GELU or
    ReLU) by a GatedMLP whose gate and up projections run as one GEMM; its state_dict keys stay the original's.
    The fused weight is a new Parameter: build optimizers after swapping.

    allow_cpu=True (for tests and debugging) swaps CPU layers that gemmc could run on CUDA; they run gemmc's op,
    whose CPU implementation is torch's reference. Without it, move the model to CUDA before swapping."""
    selected = _selector(include, exclude)
    report = SwapReport()
    fused_layers: set[int] = set()
    if fuse_mlp:
        replacements = {}
        for name, module in model.named_modules():
            mlp = _fuse(name, module, selected, allow_cpu, report)
            if mlp is not None:
                replacements[id(module)] = (module, mlp)
                fused_layers.add(id(mlp.gate_up_proj))
                if mlp.gated_kernel_args is not None:
                    n, k, dtype, gate = mlp.gated_kernel_args
                    report.kernels.setdefault(KernelKey(n, k, dtype, False, "none", gate), []).append(name)
        _replace_children(model, replacements)
    replacements = {}
    unused = {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            if id(module) in fused_layers or selected(name, module):
                _record(report, name, module)
            continue
        if not isinstance(module, nn.Linear):
            continue
        if not selected(name, module):
            report.filtered.append(name)
            continue
        if id(module) in unused:
            problem = "nn.MultiheadAttention reads its out_proj's weight directly and never calls the layer"
        else:
            problem = _swap_problem(name, module) or gemmc_reason(module.weight, module.bias, "none", allow_cpu)
        if problem is not None:
            report.kept[name] = problem
            continue
        layer = Linear.from_linear(module, allow_cpu=allow_cpu)
        replacements[id(module)] = (module, layer)
        _record(report, name, layer)
    _replace_children(model, replacements)
    _warn_kept(model, report)
    return report


def _fuse(name: str, module: nn.Module, selected, allow_cpu: bool, report: SwapReport) -> GatedMLP | None:
    """A GatedMLP for `module` if it is a selected Llama-style MLP that gemmc can run, else None (a fusion
    problem goes into the report; a layer gemmc cannot run is reported as kept by the Linear pass)."""
    if isinstance(module, GatedMLP) or not all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return None
    gate, up = module.gate_proj, module.up_proj
    if not (selected(f"{name}.gate_proj", gate) and selected(f"{name}.up_proj", up)):
        return None
    if name == "":
        report.unfused_mlps[name] = "it is the model itself: swap_linears replaces submodules in place"
        return None
    problem = "it has forward hooks or a patched forward, which a swap would drop" if _hooked(module) else None
    if problem is None:
        _, problem = fusion_problem(module)
    if problem is None:
        problem = _swap_problem(f"{name}.gate_proj", gate) or _swap_problem(f"{name}.up_proj", up)
    if problem is not None:
        report.unfused_mlps[name] = problem
        return None
    # [gate; up] is [2I, H]: gemmc can run it wherever it can run gate_proj's [I, H].
    if gemmc_reason(gate.weight, gate.bias, "none", allow_cpu) is not None:
        return None
    report.fused_mlps.append(name)
    return GatedMLP.from_mlp(module, allow_cpu=allow_cpu)


def _swap_problem(name: str, lin: nn.Linear) -> str | None:
    """Why swapping `lin` for a gemmc Linear would change what the model computes, else None."""
    if name == "":
        return "it is the model itself: swap_linears replaces submodules; use gemmc.nn.Linear.from_linear"
    if not plain_linear(lin):
        return f"{type(lin).__name__} overrides nn.Linear's forward"
    if _hooked(lin):
        return "it has forward hooks or a patched forward (e.g. accelerate's offloading), which a swap would drop"
    if parametrize.is_parametrized(lin):
        return "its weight is parametrized (torch.nn.utils.parametrize)"
    if not isinstance(lin.weight, nn.Parameter) or not isinstance(lin.bias, (nn.Parameter, type(None))):
        return "its weight or bias is not an nn.Parameter"
    return None


def _hooked(module: nn.Module) -> bool:
    return bool("forward" in vars(module) or module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks)


def _record(report: SwapReport, name: str, layer: Linear) -> None:
    reason = layer.fallback_reason
    if reason is not None:
        report.kept[name] = reason
        return
    report.swapped.append(name)
    report.kernels.setdefault(KernelKey(*layer.kernel_key), []).append(name)


def _replace_children(model: nn.Module, replacements: dict[int, tuple[nn.Module, nn.Module]]) -> None:
    """Point every parent of each replaced module at its replacement (a module shared by two parents, or tied
    under two names, is replaced everywhere)."""
    if not replacements:
        return
    for parent in model.modules():
        for child_name, child in list(parent._modules.items()):
            if child is not None and id(child) in replacements:
                parent._modules[child_name] = replacements[id(child)][1]


def _selector(include: LayerFilter, exclude: LayerFilter) -> Callable[[str, nn.Module], bool]:
    inc, exc = _matcher(include, "include"), _matcher(exclude, "exclude")
    return lambda name, module: ((inc is None or inc(name, module)) and not (exc is not None and exc(name, module)))


def _matcher(spec: LayerFilter, what: str):
    if spec is None or callable(spec):
        return spec
    patterns = [spec] if isinstance(spec, str) else list(spec)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"swap_linears: {what} takes a glob string, a list of them, or a predicate "
                        f"(name, module) -> bool; got {spec!r}")
    return lambda name, module: any(fnmatchcase(name, p) for p in patterns)


def _warn_kept(model: nn.Module, report: SwapReport) -> None:
    """ONE warning naming every layer that keeps torch's path (grouped by reason) and every unfused MLP."""
    if not report.kept and not report.unfused_mlps:
        return
    by_reason = defaultdict(list)
    for name, why in report.kept.items():
        by_reason[why].append(_display(name))
    lines = ["gemmc.nn.swap_linears:"]
    if report.kept:
        lines.append(f"  {len(report.kept)} Linear layers keep torch's path:")
        lines += [f"  - {', '.join(names)}: {why}" for why, names in by_reason.items()]
    if report.unfused_mlps:
        lines.append(f"  {len(report.unfused_mlps)} MLPs were not fused (their Linear layers are swapped one by one):")
        lines += [f"  - {_display(name)}: {why}" for name, why in report.unfused_mlps.items()]
    modules = dict(model.named_modules())
    weights = [getattr(modules.get(name), "weight", None) for name in report.kept]
    weights = [w for w in weights if isinstance(w, torch.Tensor)]
    if any(w.device.type == "cpu" for w in weights):
        lines.append("  Move the model to CUDA before swap_linears (allow_cpu=True swaps CPU layers for tests "
                     "and debugging; they then run torch's reference).")
    if any(w.dtype not in (torch.bfloat16, torch.float16) for w in weights):
        lines.append("  gemmc runs bf16 and f16 layers: cast the model first, e.g. model.to(torch.bfloat16).")
    warnings.warn("\n".join(lines), PerformanceWarning, stacklevel=3)


def _display(name: str) -> str:
    return name or "<the model itself>"


def _abbreviate(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f", ... ({len(names) - shown} more)" if len(names) > shown else "")
