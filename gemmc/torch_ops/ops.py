"""The ops torch.ops.gemmc.linear, gemm and gated_linear, and the kernel ops they run.

Each public op is a CompositeImplicitAutograd kernel over one kernel op (torch.ops.gemmc.launch_linear,
torch.ops.gemmc.launch_gemm): where a gradient is needed it runs the kernel op inside an autograd.Function
(autograd.py holds the backward formulas), else the kernel op itself. Tracing (torch.compile, make_fx)
decomposes the public op, so a compiled graph calls the kernel op: one Python kernel per call, with no
autograd kernel in Python on the way (that round trip, and torch.library.custom_op's checks on every call,
cost several times the kernel call's own host time).

The kernel ops: CUDA tensors run gemmc kernels (launch.py); CPU tensors run the torch reference
(reference.py), so tests on a CPU host trace, compile and differentiate the same ops. Their fake kernels give
the output's shape, dtype and (contiguous) strides, and refuse malformed calls with the same errors, at
trace time. Inductor lowers them to direct calls of launch.py's out= entries (inductor.py). Called
directly with tensors that need a gradient, a kernel op's result has no backward formula: call the public op.
"""
from __future__ import annotations

import torch
from torch.library import Library, register_fake

from . import inductor
from .activations import TORCH_FORWARD
from .checks import check_gated_call, check_gemm_call, check_linear_call, gemm_dims
from .launch import gated_cpu, gemm_cpu, linear_cpu, run_gated, run_gemm, run_linear

_LIB = Library("gemmc", "DEF")
_TAGS = (torch.Tag.pt2_compliant_tag,)

_LIB.define("linear(Tensor x, Tensor weight, Tensor? bias, str activation) -> Tensor", tags=_TAGS)
_LIB.define("launch_linear(Tensor x, Tensor weight, Tensor? bias, str activation) -> Tensor", tags=_TAGS)
_LIB.define("gemm(Tensor a, Tensor b, str a_layout, str b_layout) -> Tensor", tags=_TAGS)
_LIB.define("launch_gemm(Tensor a, Tensor b, str a_layout, str b_layout) -> Tensor", tags=_TAGS)
_LIB.define("gated_linear(Tensor x, Tensor weight, str gate) -> Tensor", tags=_TAGS)
_LIB.define("launch_gated_linear(Tensor x, Tensor weight, str gate) -> Tensor", tags=_TAGS)

LAUNCH_LINEAR = torch.ops.gemmc.launch_linear.default
LAUNCH_GEMM = torch.ops.gemmc.launch_gemm.default
LAUNCH_GATED = torch.ops.gemmc.launch_gated_linear.default


def _linear_fake(x, weight, bias, activation):
    inductor.register()         # tracing: Inductor may lower this call next
    check_linear_call(x, weight, bias, activation)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _gemm_fake(a, b, a_layout, b_layout):
    inductor.register()
    check_gemm_call(a, b, a_layout, b_layout)
    m, n, _, _ = gemm_dims(a, b, a_layout, b_layout)
    return a.new_empty((m, n))


def _gated_fake(x, weight, gate):
    inductor.register()
    check_gated_call(x, weight, gate)
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


_LIB.impl("launch_linear", run_linear, "CUDA")
_LIB.impl("launch_linear", linear_cpu, "CPU")
register_fake("gemmc::launch_linear", _linear_fake, lib=_LIB)
_LIB.impl("launch_gemm", run_gemm, "CUDA")
_LIB.impl("launch_gemm", gemm_cpu, "CPU")
register_fake("gemmc::launch_gemm", _gemm_fake, lib=_LIB)
_LIB.impl("launch_gated_linear", run_gated, "CUDA")
_LIB.impl("launch_gated_linear", gated_cpu, "CPU")
register_fake("gemmc::launch_gated_linear", _gated_fake, lib=_LIB)


def define_public_ops(linear_with_grad, gemm_with_grad) -> None:
    """Register the public ops' kernels; `*_with_grad` run a call that needs a gradient (autograd.py)."""
    grad_enabled = torch.is_grad_enabled

    def linear(x, weight, bias, activation):
        """act(x @ weight.T + bias): x [..., K] (flattened to M rows), weight [N, K], bias [N] or None;
        activation one of gemmc.torch_ops.ACTIVATIONS. A contiguous [..., N] tensor of x's dtype."""
        if grad_enabled() and (x.requires_grad or weight.requires_grad
                               or (bias is not None and bias.requires_grad)):
            return linear_with_grad(x, weight, bias, activation)
        return LAUNCH_LINEAR(x, weight, bias, activation)

    def gemm(a, b, a_layout, b_layout):
        """A @ B with operands in gemmc's storage layouts (gemmc/spec.py): a "mk" [M, K] or "km" [K, M];
        b "nk" [N, K] (a @ b.T) or "kn" [K, N]. A contiguous [M, N] tensor of a's dtype."""
        if grad_enabled() and (a.requires_grad or b.requires_grad):
            return gemm_with_grad(a, b, a_layout, b_layout)
        return LAUNCH_GEMM(a, b, a_layout, b_layout)

    def gated_linear(x, weight, gate):
        """gate(x @ weight[:N].T) * (x @ weight[N:].T): x [..., K], weight [2N, K] ([gate; up]); a contiguous
        [..., N] tensor. With a gradient needed: the [gate; up] Linear (gemmc::linear, its backward gemmc's)
        and torch's gating, so autograd saves the pre-activations instead of recomputing a GEMM."""
        if grad_enabled() and (x.requires_grad or weight.requires_grad):
            g, u = torch.ops.gemmc.linear(x, weight, None, "none").chunk(2, dim=-1)
            return TORCH_FORWARD[gate](g) * u
        return LAUNCH_GATED(x, weight, gate)

    _LIB.impl("linear", linear, "CompositeImplicitAutograd")
    _LIB.impl("gemm", gemm, "CompositeImplicitAutograd")
    _LIB.impl("gated_linear", gated_linear, "CompositeImplicitAutograd")
