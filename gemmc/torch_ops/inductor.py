"""Inductor lowerings of the kernel ops: a compiled graph calls gemmc's Python entry with `out=` directly.

By default Inductor lowers a custom op to a fallback kernel: the generated wrapper calls
torch.ops.gemmc.launch_linear, which goes through the dispatcher back into Python and allocates the output
there. These lowerings make each call an extern kernel instead, as Inductor does for torch.mm: the wrapper
allocates (or reuses) the output buffer and calls `extern_kernels.gemmc_linear_out(x2d, weight,
activation, out=buf)` (or gemmc_linear_bias_out, gemmc_gemm_out), a plain Python function, so the per-call
host cost is the launch itself.

They are registered the first time a kernel op is traced (ops.py's fake kernels call `register()`), so
importing gemmc never imports Inductor. A lowering that cannot build its node (a torch whose Inductor
internals differ) leaves that call to Inductor's default fallback kernel: slower, never wrong.
"""
from __future__ import annotations

import math
import threading
import warnings

import torch

from .launch import gated_out, gemm_out, linear_bias_out, linear_out

_LOCK = threading.Lock()
_REGISTERED = False
_WARNED = False


def register() -> None:
    """Register the lowerings once per process (a no-op on later calls and where Inductor is missing)."""
    global _REGISTERED
    if _REGISTERED:
        return
    with _LOCK:
        if _REGISTERED:
            return
        _REGISTERED = True
        try:
            from torch._inductor import ir
            from torch._inductor import lowering as L
            from torch._inductor.select_algorithm import extern_kernels
        except Exception:       # no Inductor in this torch: nothing to lower
            return
        for name, fn in (("gemmc_linear_out", linear_out), ("gemmc_linear_bias_out", linear_bias_out),
                         ("gemmc_gemm_out", gemm_out), ("gemmc_gated_linear_out", gated_out)):
            if not hasattr(extern_kernels, name):
                setattr(extern_kernels, name, fn)
        _register_linear(L, ir)
        _register_gemm(L, ir)
        _register_gated(L, ir)


def _fallback(L, op, args):
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"gemmc: this torch's Inductor could not lower {op} as an extern kernel; compiled graphs "
                      "call it through the dispatcher (correct, with more host time per call)", stacklevel=2)
    return L.fallback_handler(op, add_to_fallback_set=False)(*args)


def _register_linear(L, ir) -> None:
    op = torch.ops.gemmc.launch_linear.default

    @L.register_lowering(op, type_promotion_kind=None)
    def lower_linear(x, weight, bias, activation):
        try:
            sizes = list(x.get_size())
            k = sizes[-1]
            n = weight.get_size()[0]
            rows = math.prod(sizes[:-1]) if len(sizes) > 1 else 1
            x2 = L.view(x, [rows, k]) if len(sizes) != 2 else x
            inputs = [ir.ExternKernel.require_contiguous(t) for t in (x2, weight)]
            if bias is not None:
                inputs.append(ir.ExternKernel.require_contiguous(bias))
            layout = ir.FixedLayout(x.get_device(), x.get_dtype(), [rows, n])
            name = "gemmc_linear_out" if bias is None else "gemmc_linear_bias_out"
            node = ir.ExternKernelOut(layout=layout, inputs=inputs, constant_args=(activation,),
                                      python_kernel_name=f"extern_kernels.{name}")
            out = ir.TensorBox.create(node)
            return L.view(out, [*sizes[:-1], n]) if len(sizes) != 2 else out
        except Exception:
            return _fallback(L, op, (x, weight, bias, activation))


def _register_gemm(L, ir) -> None:
    op = torch.ops.gemmc.launch_gemm.default

    @L.register_lowering(op, type_promotion_kind=None)
    def lower_gemm(a, b, a_layout, b_layout):
        try:
            m = a.get_size()[0] if a_layout == "mk" else a.get_size()[1]
            n = b.get_size()[0] if b_layout == "nk" else b.get_size()[1]
            inputs = [ir.ExternKernel.require_contiguous(t) for t in (a, b)]
            layout = ir.FixedLayout(a.get_device(), a.get_dtype(), [m, n])
            node = ir.ExternKernelOut(layout=layout, inputs=inputs, constant_args=(a_layout, b_layout),
                                      python_kernel_name="extern_kernels.gemmc_gemm_out")
            return ir.TensorBox.create(node)
        except Exception:
            return _fallback(L, op, (a, b, a_layout, b_layout))


def _register_gated(L, ir) -> None:
    op = torch.ops.gemmc.launch_gated_linear.default

    @L.register_lowering(op, type_promotion_kind=None)
    def lower_gated(x, weight, gate):
        try:
            sizes = list(x.get_size())
            k = sizes[-1]
            n = weight.get_size()[0] // 2
            rows = math.prod(sizes[:-1]) if len(sizes) > 1 else 1
            x2 = L.view(x, [rows, k]) if len(sizes) != 2 else x
            inputs = [ir.ExternKernel.require_contiguous(t) for t in (x2, weight)]
            layout = ir.FixedLayout(x.get_device(), x.get_dtype(), [rows, n])
            node = ir.ExternKernelOut(layout=layout, inputs=inputs, constant_args=(gate,),
                                      python_kernel_name="extern_kernels.gemmc_gated_linear_out")
            out = ir.TensorBox.create(node)
            return L.view(out, [*sizes[:-1], n]) if len(sizes) != 2 else out
        except Exception:
            return _fallback(L, op, (x, weight, gate))
