"""torch.ops.gemmc.grouped_gemm: one launch of every expert's GEMM (mixture-of-experts), gemmc's grouped kernel.

    y = gto.grouped_gemm(x, w, offsets)                        # y[o[g]:o[g+1]] = x[o[g]:o[g+1]] @ w[g].T
    h = gto.grouped_gemm(x, w_gate_up, offsets, gate="silu")   # silu(x @ w[g][:N].T) * (x @ w[g][N:].T) per expert
    y = gto.grouped_gemm(x3, w, counts, layout="masked")        # y[g, :c[g]] = x3[g, :c[g]] @ w[g].T

x: [M, K] rows sorted by expert (contiguous) or [E, M, K] (masked); w: [E, N, K], one nn.Linear-style weight per
expert ([E, 2N, K], [gate; up], gated); offsets: E + 1 int32 row offsets on the device (torch._grouped_mm's `offs`
is offsets[1:]), or counts: E int32 row counts. The result is a new [M, N] / [E, M, N] tensor of x's dtype whose
rows of no expert are left unwritten (their values are undefined, as torch._grouped_mm's; the CPU kernel zeroes
them). The offsets stay on the device: a call never synchronises and captures in a CUDA graph.

CUDA tensors run the shared grouped kernel of (layout, N, K, dtype, gate), E and M symbolic, `auto` choosing per
rows-per-group bucket; CPU tensors run the per-expert torch reference. The fake kernel gives the output's shape
and refuses malformed calls with the same errors at trace time, so the op traces under torch.compile (fullgraph,
dynamic) and make_fx. Forward only: no autograd formula is registered.
"""
from __future__ import annotations

import torch
from torch.library import Library, register_fake

from ..errors import LaunchError, SpecError
from ..spec import GemmSpec
from .activations import EPILOGUE_OP, GATES, TORCH_FORWARD
from .kernels import _input_dtype, _positive, registered

LAYOUTS = ("contiguous", "masked")
FP8_WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
GROUPED_GATES = ("none",) + GATES
GROUPED_KERNELS: dict[tuple, object] = {}      # (layout, n, k, dtype as given, gate) -> kernel

_LIB = Library("gemmc", "FRAGMENT")
_LIB.define("grouped_gemm(Tensor a, Tensor weight, Tensor groups, str layout, str gate) -> Tensor",
            tags=(torch.Tag.pt2_compliant_tag,))


def grouped_spec(layout: str, n: int, k: int, dtype, gate: str = "none") -> GemmSpec:
    """The grouped GEMM of (layout, N outputs, K, dtype, gate) with E and M symbolic."""
    if layout not in LAYOUTS:
        raise SpecError(f"layout {layout!r}; use 'contiguous' (x [M, K] with E + 1 offsets) or 'masked' (x "
                        "[E, M, K] with E counts)")
    if gate not in GROUPED_GATES:
        raise SpecError(f"gate {gate!r} is not one of {GROUPED_GATES}")
    d = _input_dtype(dtype, "grouped kernel")
    n, k = _positive(n, "grouped kernel: N"), _positive(k, "grouped kernel: K")
    return GemmSpec(m="M", n=n, k=k, dtype=d, groups="E", group_layout=layout,
                    gate=None if gate == "none" else EPILOGUE_OP[gate],
                    name=f"grouped_{layout}" + ("" if gate == "none" else f"_{gate}"))


def grouped_kernel(layout: str, n: int, k: int, dtype, gate: str = "none", arch=None):
    """The shared gemmc grouped kernel (grouped_spec), called k(x, weight, groups)."""
    return registered(GROUPED_KERNELS, (layout, n, k, dtype, gate), lambda: grouped_spec(layout, n, k, dtype, gate),
                      arch)


def grouped_call_problem(a, weight, groups, layout, gate, fp8: bool = False) -> tuple[type, str] | None:
    """(error class, what is wrong) with a gemmc::grouped_gemm call, else None. Reads shapes, dtypes and devices
    only (fake tensors work); the offsets' values are the kernel's to clamp (GEMMC_VALIDATE=1 checks them).
    `fp8`: gemmc::grouped_scaled_gemm's operands, an e4m3 a and an e4m3 or e5m2 weight."""
    if layout not in LAYOUTS:
        return SpecError, f"layout {layout!r}; use one of {LAYOUTS}"
    if gate not in GROUPED_GATES:
        return SpecError, f"gate {gate!r} is not one of {GROUPED_GATES}"
    if not all(isinstance(t, torch.Tensor) for t in (a, weight, groups)):
        return LaunchError, "a, weight and groups must be torch.Tensors"
    if weight.dim() != 3:
        return LaunchError, (f"weight has shape {tuple(weight.shape)}; it must be [E, N, K], one nn.Linear weight "
                             "per expert")
    e, rows, k = weight.shape
    want = 2 if layout == "contiguous" else 3
    if a.dim() != want or a.shape[-1] != k or (want == 3 and a.shape[0] != e):
        shape = f"[M, {k}]" if want == 2 else f"[{e}, M, {k}]"
        return LaunchError, f"a has shape {tuple(a.shape)}; {layout} groups take a {shape} (weight is [E, N, K])"
    entries = e + 1 if layout == "contiguous" else e
    what = "E + 1 row offsets" if layout == "contiguous" else "E row counts"
    if groups.dim() != 1 or groups.shape[0] != entries:
        return LaunchError, f"groups has shape {tuple(groups.shape)}; {layout} groups take {what}: [{entries}]"
    if groups.dtype != torch.int32:
        return LaunchError, (f"groups is {groups.dtype}; it must be torch.int32 ({what}, as torch._grouped_mm's "
                             "offs): convert it where the router writes it")
    if gate != "none" and rows % 2:
        return LaunchError, f"weight has {rows} rows per expert; a gated weight is [gate; up], an even number"
    if fp8 and (a.dtype != torch.float8_e4m3fn or weight.dtype not in FP8_WEIGHT_DTYPES):
        return LaunchError, (f"a is {a.dtype} and weight {weight.dtype}; fp8 operands are a torch.float8_e4m3fn "
                             "a and a torch.float8_e4m3fn or torch.float8_e5m2 weight (gemmc.quantize.quantize "
                             "makes them)")
    if not fp8 and a.dtype != weight.dtype:
        return LaunchError, f"a is {a.dtype} but weight is {weight.dtype}: cast them to one dtype"
    if not a.device == weight.device == groups.device:
        return LaunchError, (f"a, weight and groups are on {a.device}, {weight.device} and {groups.device}: move "
                             "them to one device (the groups stay on the GPU: nothing is read on the host)")
    if not fp8 and a.device.type == "cuda" and a.dtype not in (torch.bfloat16, torch.float16):
        return LaunchError, (f"the operands are {a.dtype}; gemmc kernels take torch.bfloat16 or torch.float16 "
                             "(fp8 ones with their block scales: gemmc::grouped_scaled_gemm)")
    return None


def raise_call_problem(found: tuple[type, str] | None, op: str, cause: Exception | None = None) -> None:
    """Raise a call problem (error class, what is wrong) of the op gemmc::`op`, if there is one."""
    if found is not None:
        cls, problem = found
        raise cls(f"gemmc::{op}: {problem}") from cause


def check_grouped_call(a, weight, groups, layout, gate, cause: Exception | None = None) -> None:
    raise_call_problem(grouped_call_problem(a, weight, groups, layout, gate), "grouped_gemm", cause)


def _out_shape(a, weight, layout, gate):
    n = weight.shape[1] // (1 if gate == "none" else 2)
    return (*a.shape[:-1], n)


def grouped_reference(a, weight, groups, layout: str, gate: str) -> torch.Tensor:
    """Each expert's rows through its weight, accumulated in f32 (wider for float64), rounded once; rows of no
    expert 0."""
    acc = torch.promote_types(a.dtype, torch.float32)
    out = torch.zeros(_out_shape(a, weight, layout, gate), dtype=a.dtype, device=a.device)
    index = [int(v) for v in groups.tolist()]
    for g in range(weight.shape[0]):
        rows = (slice(index[g], index[g + 1]),) if layout == "contiguous" else (g, slice(0, index[g]))
        y = a[rows].to(acc) @ weight[g].to(acc).T
        if gate != "none":
            gate_half, up = y.chunk(2, dim=-1)
            y = TORCH_FORWARD[gate](gate_half) * up
        out[rows] = y.to(a.dtype)
    return out


def grouped_cpu(a, weight, groups, layout: str, gate: str) -> torch.Tensor:
    check_grouped_call(a, weight, groups, layout, gate)
    return grouped_reference(a, weight, groups, layout, gate)


def run_grouped(a, weight, groups, layout: str, gate: str) -> torch.Tensor:
    """The grouped kernel on CUDA tensors (the shared kernel of the call's key, at its rows' bucket)."""
    check_grouped_call(a, weight, groups, layout, gate)
    e, rows, k = weight.shape
    if not (a.numel() and e and k):
        return a.new_zeros(_out_shape(a, weight, layout, gate))
    kern = grouped_kernel(layout, rows // (1 if gate == "none" else 2), k, weight.dtype, gate)
    return launch_grouped(kern, (a, weight, groups), "grouped_gemm")


def launch_grouped(kern, tensors, op: str) -> torch.Tensor:
    """Run a grouped kernel on CUDA tensors (the first is A, whose rows pick the M bucket), made contiguous; the
    kernel's refusal is gemmc::`op`'s."""
    dense = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    try:
        return kern.runner_for(tensors[0].shape[-2])(*dense)
    except LaunchError as refused:
        raise LaunchError(f"gemmc::{op}: the kernel refused the call: {refused}") from refused


def _grouped_fake(a, weight, groups, layout, gate):
    check_grouped_call(a, weight, groups, layout, gate)
    return a.new_empty(_out_shape(a, weight, layout, gate))


_LIB.impl("grouped_gemm", run_grouped, "CUDA")
_LIB.impl("grouped_gemm", grouped_cpu, "CPU")
register_fake("gemmc::grouped_gemm", _grouped_fake, lib=_LIB)


def grouped_gemm(a: torch.Tensor, weight: torch.Tensor, groups: torch.Tensor, layout: str = "contiguous",
                 gate: str = "none") -> torch.Tensor:
    """torch.ops.gemmc.grouped_gemm (see the module docstring)."""
    return torch.ops.gemmc.grouped_gemm(a, weight, groups, layout, gate)
