"""Whether gemmc can run a Linear (`unsupported_reason`), and the clear errors of a malformed op call.

The call path does not run these on every call: the registry lookup and the kernel's own prologue catch a
bad call, and only then `check_linear_call` / `check_gemm_call` say, in the op's terms, what to change.
"""
from __future__ import annotations

import torch

from ..alignment import ALIGN_BYTES as _ALIGN_BYTES
from ..errors import LaunchError, SpecError
from .activations import ACTIVATIONS, GATES

_GEMMC_DTYPES = (torch.bfloat16, torch.float16)
_LAYOUTS = {"a_layout": ("mk", "km"), "b_layout": ("nk", "kn")}


def _gpu_reason(device: torch.device) -> str | None:
    if not torch.cuda.is_available():   # judged on a host without a GPU (e.g. fake CUDA tensors): nothing to ask
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (8, 9):
        return (f"{device} has compute capability {major}.{minor}, and gemmc builds kernels for sm_90a (Hopper) "
                "and sm_80 (Ampere) only: keep torch's path on this GPU")
    return None


def _activation_reason(activation) -> str | None:
    if activation not in ACTIVATIONS:
        return (f"activation {activation!r} is not one of {ACTIVATIONS}: pass one of those, or apply your "
                "activation to the layer's output")
    return None


def _bias_reason(weight: torch.Tensor, bias) -> str | None:
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor):
        return f"bias is a {type(bias).__name__}, not a torch.Tensor or None"
    n = weight.shape[0]
    if tuple(bias.shape) != (n,):
        return f"bias has shape {tuple(bias.shape)}; it must be [N] = [{n}] (out_features)"
    if bias.dtype != weight.dtype:
        return (f"bias is {bias.dtype} but weight is {weight.dtype}; gemmc's epilogue reads a bias of the weight's "
                "dtype: convert it (e.g. layer.bias.data = layer.bias.data.to(layer.weight.dtype))")
    if bias.device != weight.device:
        return f"bias is on {bias.device} but weight is on {weight.device}: move both to one device"
    return None


def unsupported_reason(weight, bias=None, activation: str = "none", x_dtype=None) -> str | None:
    """Why gemmc cannot run act(x @ weight.T + bias) for this Linear's parameters, as a sentence that names the
    problem and the fix; None when it can. Reads only shapes, dtypes, devices (fake tensors work)."""
    reason = _activation_reason(activation)
    if reason is not None:
        return reason
    if not isinstance(weight, torch.Tensor):
        return f"weight is a {type(weight).__name__}, not a torch.Tensor"
    if weight.dim() != 2:
        return f"weight has shape {tuple(weight.shape)}; a Linear weight is 2-D [out_features, in_features]"
    if weight.device.type != "cuda":
        return (f"weight is on {weight.device}, and gemmc kernels run on CUDA GPUs: move the layer to the GPU "
                "(e.g. model.cuda())")
    if weight.dtype not in _GEMMC_DTYPES:
        return (f"weight is {weight.dtype}, and gemmc kernels take torch.bfloat16 or torch.float16: convert the "
                "layer (e.g. model.to(torch.bfloat16))")
    n, k = weight.shape
    if n == 0 or k == 0:
        return f"weight has shape {tuple(weight.shape)}, an empty dim: there is no GEMM to run"
    align = _ALIGN_BYTES // weight.element_size()
    for dim, value, needs in (("out_features N", n, "the output's rows"),
                              ("in_features K", k, "the rows of x and weight")):
        if value % align:
            return (f"{dim} = {value} is not a multiple of {align} ({_ALIGN_BYTES} bytes of {weight.dtype}), which "
                    f"{needs} need for gemmc's vector loads: pad it to a multiple of {align}, or keep torch's path")
    reason = _bias_reason(weight, bias)
    if reason is not None:
        return reason
    if x_dtype is not None and x_dtype != weight.dtype:
        return (f"the input is {x_dtype} but weight is {weight.dtype}: cast the input (x.to(weight.dtype)) or the "
                "layer to one dtype")
    return _gpu_reason(weight.device)


def linear_call_problem(x, weight, bias, activation) -> str | None:
    """What is wrong with a gemmc::linear call on any device (shapes, dtypes, devices), else None."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return f"x and weight must be torch.Tensors, got {type(x).__name__} and {type(weight).__name__}"
    if weight.dim() != 2:
        return f"weight has shape {tuple(weight.shape)}; it must be 2-D [N, K] (an nn.Linear weight)"
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        return (f"x has shape {tuple(x.shape)} but weight has shape {tuple(weight.shape)}: x's last dim must be "
                f"K = {weight.shape[1]} (weight is [N, K])")
    if x.dtype != weight.dtype:
        return f"x is {x.dtype} but weight is {weight.dtype}: cast x (x.to(weight.dtype)) or the weight"
    if x.device != weight.device:
        return f"x is on {x.device} but weight is on {weight.device}: move both to one device"
    return _bias_reason(weight, bias)


def check_linear_call(x, weight, bias, activation, cause: Exception | None = None) -> None:
    """Raise the op's clear error for a malformed gemmc::linear call (SpecError for an unknown activation,
    else LaunchError); return if nothing is wrong. `cause`: the kernel's own refusal, chained."""
    reason = _activation_reason(activation)
    if reason is not None:
        raise SpecError(f"gemmc::linear: {reason}") from cause
    problem = linear_call_problem(x, weight, bias, activation)
    if problem is None and weight.device.type == "cuda":
        problem = unsupported_reason(weight, bias, activation)
    if problem is not None:
        raise LaunchError(f"gemmc::linear: {problem}") from cause


def gemm_dims(a, b, a_layout: str, b_layout: str) -> tuple:
    """(M, N, K of A, K of B) of a gemmc::gemm call with valid layouts and 2-D operands."""
    m, ka = (a.shape[0], a.shape[1]) if a_layout == "mk" else (a.shape[1], a.shape[0])
    n, kb = (b.shape[0], b.shape[1]) if b_layout == "nk" else (b.shape[1], b.shape[0])
    return m, n, ka, kb


def gemm_call_problem(a, b, a_layout, b_layout) -> tuple[type, str] | None:
    """(error class, what is wrong) with a gemmc::gemm call, else None."""
    for name, value in (("a_layout", a_layout), ("b_layout", b_layout)):
        if value not in _LAYOUTS[name]:
            return SpecError, f"{name}={value!r}; use one of {_LAYOUTS[name]} (see gemmc/spec.py)"
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return LaunchError, f"a and b must be torch.Tensors, got {type(a).__name__} and {type(b).__name__}"
    if a.dim() != 2 or b.dim() != 2:
        return LaunchError, f"a and b must be 2-D, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
    _, _, ka, kb = gemm_dims(a, b, a_layout, b_layout)
    if ka != kb:
        return LaunchError, (f"a {tuple(a.shape)} ({a_layout!r}) and b {tuple(b.shape)} ({b_layout!r}) disagree on "
                             f"K: {ka} vs {kb}")
    if a.dtype != b.dtype:
        return LaunchError, f"a is {a.dtype} but b is {b.dtype}: cast them to one dtype"
    if a.device != b.device:
        return LaunchError, f"a is on {a.device} but b is on {b.device}: move both to one device"
    if a.device.type == "cuda" and a.dtype not in _GEMMC_DTYPES:
        return LaunchError, (f"the operands are {a.dtype}, and gemmc kernels take torch.bfloat16 or torch.float16: "
                             "convert them (e.g. .to(torch.bfloat16)) or use torch.matmul")
    return None


def check_gemm_call(a, b, a_layout, b_layout, cause: Exception | None = None) -> None:
    """Raise the op's clear error for a malformed gemmc::gemm call; return if nothing is wrong."""
    found = gemm_call_problem(a, b, a_layout, b_layout)
    if found is not None:
        cls, problem = found
        raise cls(f"gemmc::gemm: {problem}") from cause


def gated_unsupported_reason(weight, gate: str, x_dtype=None) -> str | None:
    """Why gemmc cannot run gated_linear with this [gate; up] weight [2N, K], else None (as unsupported_reason)."""
    if gate not in GATES:
        return f"gate {gate!r} is not one of {GATES}"
    if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] % 2:
        return (f"weight has {weight.shape[0]} rows; a gated Linear's weight is [gate; up], 2N x K, an even "
                "number of rows")
    reason = unsupported_reason(weight, None, "none", x_dtype)
    if reason is not None:
        return reason
    n, align = weight.shape[0] // 2, _ALIGN_BYTES // weight.element_size()
    if n % align:
        return (f"the output's N = {n} (half the [gate; up] weight's rows) is not a multiple of {align} "
                f"({_ALIGN_BYTES} bytes of {weight.dtype}), which its rows need for gemmc's vector stores: pad the "
                f"gate and up projections to a multiple of {align} outputs each, or keep torch's path")
    return None


def check_gated_call(x, weight, gate, cause: Exception | None = None) -> None:
    """Raise the op's clear error for a malformed gemmc::gated_linear call; return if nothing is wrong."""
    if gate not in GATES:
        raise SpecError(f"gemmc::gated_linear: gate {gate!r} is not one of {GATES}") from cause
    problem = linear_call_problem(x, weight, None, "none")
    if problem is None and weight.shape[0] % 2:
        problem = gated_unsupported_reason(weight, gate)
    if problem is None and weight.device.type == "cuda":
        problem = gated_unsupported_reason(weight, gate)
    if problem is not None:
        raise LaunchError(f"gemmc::gated_linear: {problem}") from cause
