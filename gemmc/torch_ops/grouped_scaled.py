"""torch.ops.gemmc.grouped_scaled_gemm: every expert's fp8 GEMM with DeepSeek-V3 block scales, in one launch.

    y = gto.grouped_scaled_gemm(x, w, sx, sw, offsets)                  # contiguous: x [M, K], rows by expert
    y = gto.grouped_scaled_gemm(x3, w, sx3, sw, counts, layout="masked")  # masked: x3 [E, M, K]

x: torch.float8_e4m3fn activations with sx, their f32 scale per 1 x 128 block of each row ([M, ceil(K/128)],
masked [E, M, ceil(K/128)]); w: [E, N, K] torch.float8_e4m3fn (or e5m2) weights, one nn.Linear weight per expert,
with sw, each expert's f32 scale per 128 x 128 block ([E, ceil(N/128), ceil(K/128)]); offsets (E + 1 int32 row
offsets) or counts (E int32 row counts) as gemmc::grouped_gemm takes them. `gemmc.quantize.quantize(t, "block")`
makes x and sx (and, with weight=True, each expert's w and sw). The result is a new bf16 [M, N] / [E, M, N]
tensor, sum_k (sx * x)[m, k] (sw * w[g])[n, k] per expert; rows of no expert are left unwritten (the CPU kernel
zeroes them).

CUDA tensors run the shared grouped fp8 kernel of (layout, N, K, weight dtype), E and M symbolic, `auto` choosing
per rows-per-group bucket; CPU tensors run the per-expert reference on the dequantized operands. The fake kernel
gives the output's shape and refuses malformed calls with the same errors, so the op traces under torch.compile
(fullgraph, dynamic) and make_fx. Forward only.
"""
from __future__ import annotations

import torch
from torch.library import Library, register_fake

from ..errors import LaunchError, SpecError
from ..spec import SCALE_BLOCK, GemmSpec, Scaling, scale_shapes
from ..types import DType
from .grouped import LAYOUTS, grouped_call_problem, grouped_reference, launch_grouped, raise_call_problem
from .kernels import _positive, registered

OUT_DTYPE = torch.bfloat16
WEIGHT_DTYPES = {torch.float8_e4m3fn: DType.f8e4m3, torch.float8_e5m2: DType.f8e5m2}
GROUPED_SCALED_KERNELS: dict[tuple, object] = {}      # (layout, n, k, weight dtype) -> kernel

_LIB = Library("gemmc", "FRAGMENT")
_LIB.define("grouped_scaled_gemm(Tensor a, Tensor weight, Tensor scale_a, Tensor scale_weight, Tensor groups, "
            "str layout) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))


def grouped_scaled_spec(layout: str, n: int, k: int, weight_dtype=torch.float8_e4m3fn) -> GemmSpec:
    """The block-scaled grouped fp8 GEMM of (layout, N outputs, K, the weight's dtype) with E and M symbolic."""
    if layout not in LAYOUTS:
        raise SpecError(f"layout {layout!r}; use 'contiguous' (x [M, K] with E + 1 offsets) or 'masked' (x "
                        "[E, M, K] with E counts)")
    if weight_dtype not in WEIGHT_DTYPES:
        raise SpecError(f"weight dtype {weight_dtype}: use torch.float8_e4m3fn or torch.float8_e5m2")
    n, k = _positive(n, "grouped fp8 kernel: N"), _positive(k, "grouped fp8 kernel: K")
    return GemmSpec(m="M", n=n, k=k, dtype=DType.f8e4m3, b_dtype=WEIGHT_DTYPES[weight_dtype],
                    scaling=Scaling("block", "scale_a", "scale_weight"), groups="E", group_layout=layout,
                    name=f"grouped_scaled_{layout}")


def grouped_scaled_kernel(layout: str, n: int, k: int, weight_dtype=torch.float8_e4m3fn, arch=None):
    """The shared gemmc grouped fp8 kernel (grouped_scaled_spec), called k(x, weight, sx, sw, groups)."""
    return registered(GROUPED_SCALED_KERNELS, (layout, n, k, weight_dtype),
                      lambda: grouped_scaled_spec(layout, n, k, weight_dtype), arch)


def scaled_call_problem(a, weight, scale_a, scale_weight, groups, layout) -> tuple[type, str] | None:
    """(error class, what is wrong) with a gemmc::grouped_scaled_gemm call, else None (shapes, dtypes, devices)."""
    found = grouped_call_problem(a, weight, groups, layout, "none", fp8=True)
    if found is not None:
        return found
    for name, t in (("scale_a", scale_a), ("scale_weight", scale_weight)):
        if not isinstance(t, torch.Tensor):
            return LaunchError, f"{name} must be a torch.Tensor"
    e, n, k = weight.shape
    want_a, want_w = scale_shapes("block", a.shape[-2], n, k, e, layout)
    for name, t, want, what in (("scale_a", scale_a, want_a, f"a's f32 scale per 1 x {SCALE_BLOCK} block of each "
                                 "row"),
                                ("scale_weight", scale_weight, want_w, f"each expert's f32 scale per {SCALE_BLOCK} "
                                 f"x {SCALE_BLOCK} block of its weight")):
        if tuple(t.shape) != tuple(want) or t.dtype != torch.float32:
            return LaunchError, (f"{name} is {t.dtype} of shape {tuple(t.shape)}; it must be {what}: torch.float32 "
                                 f"of shape {tuple(want)} (gemmc.quantize.quantize(t, 'block') makes it)")
        if t.device != a.device:
            return LaunchError, f"{name} is on {t.device}, the operands on {a.device}: move it to their device"
    return None


def check_scaled_call(a, weight, scale_a, scale_weight, groups, layout) -> None:
    raise_call_problem(scaled_call_problem(a, weight, scale_a, scale_weight, groups, layout), "grouped_scaled_gemm")


def _out_shape(a, weight):
    return (*a.shape[:-1], weight.shape[1])


def scaled_cpu(a, weight, scale_a, scale_weight, groups, layout: str) -> torch.Tensor:
    """Each expert's dequantized rows through its dequantized weight in f32, rounded once to bf16 (rows of no
    expert 0)."""
    from ..quantize import dequantize
    check_scaled_call(a, weight, scale_a, scale_weight, groups, layout)
    return grouped_reference(dequantize(a, scale_a), dequantize(weight, scale_weight), groups, layout,
                             "none").to(OUT_DTYPE)


def run_scaled(a, weight, scale_a, scale_weight, groups, layout: str) -> torch.Tensor:
    """The grouped fp8 kernel on CUDA tensors (the shared kernel of the call's key, at its rows' bucket)."""
    check_scaled_call(a, weight, scale_a, scale_weight, groups, layout)
    e, n, k = weight.shape
    if not (a.numel() and e and k):
        return a.new_zeros(_out_shape(a, weight), dtype=OUT_DTYPE)
    kern = grouped_scaled_kernel(layout, n, k, weight.dtype)
    return launch_grouped(kern, (a, weight, scale_a, scale_weight, groups), "grouped_scaled_gemm")


def _scaled_fake(a, weight, scale_a, scale_weight, groups, layout):
    check_scaled_call(a, weight, scale_a, scale_weight, groups, layout)
    return a.new_empty(_out_shape(a, weight), dtype=OUT_DTYPE)


_LIB.impl("grouped_scaled_gemm", run_scaled, "CUDA")
_LIB.impl("grouped_scaled_gemm", scaled_cpu, "CPU")
register_fake("gemmc::grouped_scaled_gemm", _scaled_fake, lib=_LIB)


def grouped_scaled_gemm(a: torch.Tensor, weight: torch.Tensor, scale_a: torch.Tensor, scale_weight: torch.Tensor,
                        groups: torch.Tensor, layout: str = "contiguous") -> torch.Tensor:
    """torch.ops.gemmc.grouped_scaled_gemm (see the module docstring)."""
    return torch.ops.gemmc.grouped_scaled_gemm(a, weight, scale_a, scale_weight, groups, layout)
