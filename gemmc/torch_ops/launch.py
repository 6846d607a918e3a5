"""The CUDA call path of the ops: one registry lookup keyed by a tuple, dense operands, the kernel call.

A call whose key is new, or that a kernel refuses, takes the slow path: checks.py says what is wrong (before
anything launches), then the registry compiles. Empty problems (M, N or K of 0) run the torch reference.

The `*_out` entries are what a compiled graph calls (inductor.py lowers the kernel ops to them): the same
lookup and kernel, writing into the buffer Inductor allocated.
"""
from __future__ import annotations

import torch

from ..choose.heuristic import GATED_UNFUSED_MAX_M
from ..compiler import CublasRoute
from ..errors import LaunchError
from . import reference
from .activations import TORCH_FORWARD
from .checks import check_gated_call, check_gemm_call, check_linear_call, gemm_dims
from .kernels import GATED_KERNELS, GEMM_KERNELS, LINEAR_KERNELS, gated_kernel, gemm_kernel, linear_kernel

_torch_linear = torch.nn.functional.linear
_MALFORMED = (ValueError, IndexError, AttributeError, TypeError)   # what a key built from a bad call raises


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` when a kernel can read it as it is (contiguous, 16-byte aligned start), else a contiguous copy: the
    ops take any strides, as nn.Linear does."""
    if t.is_contiguous() and not t.data_ptr() & 15:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def run_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """act(x @ weight.T + bias) on CUDA tensors with the shared gemmc kernel; x [..., K], weight [N, K]."""
    try:
        n, k = weight.shape
        kern = LINEAR_KERNELS.get((n, k, weight.dtype, bias is not None, activation))
        known = kern is not None and x.shape[-1] == k       # reshape below would hide a wrong K
    except _MALFORMED:
        known = False
    if not known:
        check_linear_call(x, weight, bias, activation)
        n, k = weight.shape
        if not (n and k and x.numel()):
            return reference.linear(x, weight, bias, activation)
        kern = linear_kernel(n, k, weight.dtype, bias is not None, activation)
    flat = x.dim() != 2
    rows = x.numel() // k if flat else x.shape[0]           # k > 0 here: a kernel exists
    if not rows:                                            # M = 0: the empty output
        return reference.linear(x, weight, bias, activation)
    run = kern.runner_for(rows)
    if run.__class__ is CublasRoute:
        # `auto` measured cuBLAS faster at this M (plain GEMMs only): torch's own call, before any of gemmc's glue
        return _torch_linear(x, weight)
    x2, w = _dense(x.reshape(-1, k) if flat else x), _dense(weight)
    try:
        y = run(x2, w) if bias is None else run(x2, w, _dense(bias))
    except LaunchError:
        try:        # the compiled GEMM's own call: a plain GEMM the kernel refuses runs torch.matmul there
            y = kern(x2, w) if bias is None else kern(x2, w, _dense(bias))
        except LaunchError as refused:
            check_linear_call(x, weight, bias, activation, cause=refused)
            raise
    return y.view(*x.shape[:-1], n) if flat else y


def run_gated(x: torch.Tensor, weight: torch.Tensor, gate: str) -> torch.Tensor:
    """gate(x @ weight[:N].T) * (x @ weight[N:].T) on CUDA tensors with the shared gated kernel; x [..., K],
    weight [2N, K] ([gate; up])."""
    try:
        rows2, k = weight.shape
        kern = GATED_KERNELS.get((rows2 // 2, k, weight.dtype, gate))
        known = kern is not None and x.shape[-1] == k
    except _MALFORMED:
        known = False
    if not known:
        check_gated_call(x, weight, gate)
        rows2, k = weight.shape
        if not (rows2 and k and x.numel()):
            return reference.gated(x, weight, gate)
        kern = gated_kernel(rows2 // 2, k, weight.dtype, gate)
    n = rows2 // 2
    flat = x.dim() != 2
    if not x.numel():
        return reference.gated(x, weight, gate)
    if x.numel() <= GATED_UNFUSED_MAX_M * k:      # decode: the [gate; up] GEMM's swapped kernels, then the gate
        g, u = run_linear(x, weight, None, "none").chunk(2, dim=-1)
        return TORCH_FORWARD[gate](g) * u
    x2 = _dense(x.reshape(-1, k) if flat else x)
    try:
        y = kern.runner_for(x2.shape[0])(x2, _dense(weight))
    except LaunchError as refused:
        check_gated_call(x, weight, gate, cause=refused)
        raise
    return y.view(*x.shape[:-1], n) if flat else y


def run_gemm(a: torch.Tensor, b: torch.Tensor, a_layout: str, b_layout: str) -> torch.Tensor:
    """A @ B on CUDA tensors in gemmc's storage layouts with the shared gemmc kernel: an [M, N] result."""
    try:
        n = b.shape[0] if b_layout == "nk" else b.shape[1]
        kern = GEMM_KERNELS.get((a_layout, b_layout, a.dtype, a.shape[1], n))
    except _MALFORMED:
        kern = None
    if kern is None:
        check_gemm_call(a, b, a_layout, b_layout)
        m, n, k, _ = gemm_dims(a, b, a_layout, b_layout)
        if not (m and n and k):
            return reference.gemm(a, b, a_layout, b_layout)
        kern = gemm_kernel(a_layout, b_layout, a.shape[1], n, a.dtype)
    if not (a.numel() and b.numel()):                       # M, N or K of 0: empty, or zeros (K = 0)
        check_gemm_call(a, b, a_layout, b_layout)
        return reference.gemm(a, b, a_layout, b_layout)
    try:
        return kern(_dense(a), _dense(b))
    except LaunchError as refused:
        check_gemm_call(a, b, a_layout, b_layout, cause=refused)
        raise


# ---- the out= entries of compiled graphs (inductor.py): Inductor allocated `out`, a contiguous [M, N] ----------

def linear_out(x: torch.Tensor, weight: torch.Tensor, activation: str, *, out: torch.Tensor) -> None:
    """act(x @ weight.T) into `out`; x [M, K] (Inductor flattened it), weight [N, K]."""
    if x.is_cuda:
        linear_into(x, weight, None, activation, out)
    else:                       # CPU tensors (tests): what the kernel op's CPU kernel runs
        out.copy_(linear_cpu(x, weight, None, activation))


def linear_bias_out(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, activation: str, *,
                    out: torch.Tensor) -> None:
    """act(x @ weight.T + bias) into `out`; x [M, K], weight [N, K], bias [N]."""
    if x.is_cuda:
        linear_into(x, weight, bias, activation, out)
    else:
        out.copy_(linear_cpu(x, weight, bias, activation))


def gemm_out(a: torch.Tensor, b: torch.Tensor, a_layout: str, b_layout: str, *, out: torch.Tensor) -> None:
    """A @ B into `out` ([M, N]), operands in gemmc's storage layouts."""
    if a.is_cuda:
        gemm_into(a, b, a_layout, b_layout, out)
    else:
        out.copy_(gemm_cpu(a, b, a_layout, b_layout))


def gated_out(x: torch.Tensor, weight: torch.Tensor, gate: str, *, out: torch.Tensor) -> None:
    """gate(x @ weight[:N].T) * (x @ weight[N:].T) into `out` ([M, N]); x [M, K], weight [2N, K]."""
    if not x.is_cuda:
        out.copy_(gated_cpu(x, weight, gate))
        return
    rows2, k = weight.shape
    kern = GATED_KERNELS.get((rows2 // 2, k, weight.dtype, gate))
    if kern is None or x.dim() != 2 or x.shape[1] != k or not GATED_UNFUSED_MAX_M < x.shape[0]:
        out.copy_(run_gated(x, weight, gate))
        return
    try:
        kern.runner_for(x.shape[0])(_dense(x), _dense(weight), out=out)
    except LaunchError:
        out.copy_(run_gated(x, weight, gate))


def gated_cpu(x, weight, gate: str) -> torch.Tensor:
    """The gated kernel op's CPU kernel: the call's checks, then the torch reference."""
    check_gated_call(x, weight, gate)
    return reference.gated(x, weight, gate)


def linear_cpu(x, weight, bias, activation: str) -> torch.Tensor:
    """The kernel op's CPU kernel: the call's checks, then the torch reference."""
    check_linear_call(x, weight, bias, activation)
    return reference.linear(x, weight, bias, activation)


def gemm_cpu(a, b, a_layout: str, b_layout: str) -> torch.Tensor:
    """The gemm kernel op's CPU kernel: the call's checks, then the torch reference."""
    check_gemm_call(a, b, a_layout, b_layout)
    return reference.gemm(a, b, a_layout, b_layout)


def linear_into(x, weight, bias, activation: str, out: torch.Tensor) -> None:
    """run_linear's work with the output given: a known kernel at a 2-D x writes `out` itself; anything else
    (a new key, M = 0, a call the route refuses) runs run_linear, whose checks say what is wrong, and copies."""
    n, k = weight.shape
    kern = LINEAR_KERNELS.get((n, k, weight.dtype, bias is not None, activation))
    if kern is None or x.dim() != 2 or x.shape[1] != k or not x.shape[0]:
        out.copy_(run_linear(x, weight, bias, activation))
        return
    run = kern.runner_for(x.shape[0])
    try:
        if bias is None:
            run(_dense(x), _dense(weight), out=out)
        else:
            run(_dense(x), _dense(weight), _dense(bias), out=out)
    except LaunchError:
        out.copy_(run_linear(x, weight, bias, activation))


def gemm_into(a, b, a_layout: str, b_layout: str, out: torch.Tensor) -> None:
    """run_gemm's work with the output given (the same fallbacks as linear_into)."""
    try:
        n = b.shape[0] if b_layout == "nk" else b.shape[1]
        kern = GEMM_KERNELS.get((a_layout, b_layout, a.dtype, a.shape[1], n))
    except _MALFORMED:
        kern = None
    if kern is None or not (a.numel() and b.numel()):
        out.copy_(run_gemm(a, b, a_layout, b_layout))
        return
    try:
        kern(_dense(a), _dense(b), out=out)
    except LaunchError:
        out.copy_(run_gemm(a, b, a_layout, b_layout))
