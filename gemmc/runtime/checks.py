"""What a call's tensor arguments must be, planned once per kernel param (TensorCheck), and those rules run
in Python for a function with no TVM-FFI prologue of its own (python_prologue)."""
from __future__ import annotations

import operator
from typing import Callable, Sequence

from ..alignment import alignment_elems, param_align_bytes
from ..backends import GROUP_ROLES, Param
from ..errors import LaunchError
from ..types import DType


def unit_dims(shape) -> tuple[int, ...]:
    """The dims of `shape` declared as a static 1."""
    return tuple(d for d, v in enumerate(shape) if not isinstance(v, str) and v == 1)


def is_batched(params: Sequence[Param]) -> bool:
    """Does the kernel carry a batch dim (a rank-3 output), whatever the dim is called or however big?"""
    return any(p.kind == "tensor" and p.role == "out" and len(p.shape) == 3 for p in params)


class TensorCheck:
    """Everything needed to check one tensor argument, computed once."""
    __slots__ = ("name", "index", "torch_dtype", "dtype", "rank", "contig", "static", "named",
                 "align_elems", "align_bytes", "shape_text", "sym_dims", "vector", "is_out")

    def __init__(self, p: Param, index: int, batched: bool = False):
        import torch
        self.name = p.name
        self.index = index
        self.is_out = p.role == "out"
        self.dtype = p.dtype
        self.torch_dtype = {DType.bf16: torch.bfloat16, DType.f16: torch.float16, DType.f32: torch.float32,
                            DType.i32: torch.int32, DType.f8e4m3: torch.float8_e4m3fn,
                            DType.f8e5m2: torch.float8_e5m2}.get(p.dtype)
        if self.torch_dtype is None:
            raise LaunchError(f"{p.name}: dtype {p.dtype} has no runtime support yet")
        self.rank = len(p.shape)
        self.contig = p.contiguous % self.rank if self.rank else 0
        self.static = tuple((i, int(d)) for i, d in enumerate(p.shape) if not isinstance(d, str))
        self.named = tuple((i, d) for i, d in enumerate(p.shape) if isinstance(d, str))
        self.sym_dims = tuple(i for i, _ in self.named)
        # 16 bytes (TMA and vector loads), but 4 for params read one element at a time (fp8 scales, group offsets)
        self.align_bytes = param_align_bytes(p.role)
        self.align_elems = alignment_elems(p.dtype) if self.align_bytes > p.dtype.bytes else 1
        self.shape_text = "(" + ", ".join(str(d) for d in p.shape) + ")"
        # epilogue vectors ((N,), (M,); (L, N), (L, M) in a batched kernel, whatever its batch dim) are read
        # element-wise: their length need not be a multiple of 16 bytes
        # (as are fp8 scales); a grouped GEMM's offsets or counts too, read an int32 at a time: any length
        self.vector = ((p.role in ("input", "scale") and (self.rank == 1 or (batched and self.rank == 2)))
                       or p.role in GROUP_ROLES)


def python_prologue(params: Sequence[Param], device_type: str = "cuda") -> Callable:
    """What a compiled function's TVM-FFI prologue checks before it launches (type, device, dtype, rank, static
    dims, one extent per named dim, the stride-1 dim, 16-byte strides and data pointer), in Python: for a
    function with no prologue of its own (the cuBLAS route, gemmc.compiler.CublasRoute). Call it with the
    values in param order; an output given as None (to be allocated) is skipped. It raises TypeError /
    ValueError as the prologue does, so the Launcher's validator can then say what to change; the rules are
    the validator's (Launcher._check_tensor), without building messages on the way. One difference, kept off the
    fast path: an empty tensor's strides are checked here and not by the validator, so the cuBLAS route sends
    what this rejects and the validator passes (an empty problem) on to torch.matmul."""
    import torch
    batched = is_batched(params)
    checks = []
    for i, p in enumerate(params):
        if p.kind != "tensor":
            continue
        c = TensorCheck(p, i, batched)
        static_shape = tuple(p.shape) if not c.named else None     # all static: one comparison
        loose_extent = c.contig in c.sym_dims and not c.vector      # its extent must be 16-byte aligned
        checks.append((c, static_shape, loose_extent, tuple(d for d in range(c.rank) if d != c.contig)))
    checks = tuple(checks)
    tensor_type = torch.Tensor
    on_device = operator.attrgetter(f"is_{device_type}")       # t.device.type costs ~0.5 us

    def prologue(*values):
        device = None
        sizes: dict = {}
        for c, static_shape, loose_extent, strided in checks:
            t = values[c.index]
            if t is None and c.is_out:
                continue
            if not isinstance(t, tensor_type) or t.dtype is not c.torch_dtype or t.dim() != c.rank:
                raise TypeError(f"argument #{c.index} ({c.name}): expected a {c.dtype} tensor of shape "
                                f"{c.shape_text}")
            if device is None:
                device = t.device
                if not on_device(t):
                    raise ValueError(f"argument #{c.index} ({c.name}): expected a {device_type} tensor")
            elif t.device != device:
                raise ValueError(f"argument #{c.index} ({c.name}): on another device than the others")
            shape = t.shape
            if static_shape is not None:
                if shape != static_shape:
                    raise ValueError(f"argument #{c.index} ({c.name}): expected shape {c.shape_text}")
            else:
                for d, v in c.static:
                    if shape[d] != v:
                        raise ValueError(f"argument #{c.index} ({c.name}): shape[{d}] must be {v}")
                for d, dim in c.named:
                    if sizes.setdefault(dim, shape[d]) != shape[d]:
                        raise ValueError(f"argument #{c.index} ({c.name}): {dim} disagrees with the other "
                                         "arguments")
            stride = t.stride()
            k, a = c.contig, c.align_elems
            if (stride[k] != 1 and shape[k] != 1) or (loose_extent and shape[k] % a) or t.data_ptr() % c.align_bytes:
                raise ValueError(f"argument #{c.index} ({c.name}): strides {stride} or data pointer not aligned")
            for d in strided:
                if stride[d] % a:
                    raise ValueError(f"argument #{c.index} ({c.name}): stride({d}) = {stride[d]} is not "
                                     f"{c.align_bytes}-byte aligned")

    return prologue


def check_groups(groups, rows: int, layout: str, name: str = "offsets") -> None:
    """The debug check of a grouped GEMM's offsets (contiguous: E + 1 of them, sorted, from 0 .. M) or counts
    (masked: each 0 .. M), which the kernel reads on the device and clamps into [0, M] without a word. It copies
    them to the host, so it synchronises: Launchers run it when they validate every call (GEMMC_VALIDATE=1)."""
    values = [int(v) for v in groups.detach().cpu().tolist()]
    if layout == "masked":
        bad = next((g for g, v in enumerate(values) if not 0 <= v <= rows), None)
        if bad is not None:
            raise LaunchError(f"{name}[{bad}] = {values[bad]} rows: a masked group holds 0 to M = {rows} rows "
                              f"(the extent of A's dim 1); fix the counts")
        return
    if values and not 0 <= values[0] <= rows:
        raise LaunchError(f"{name}[0] = {values[0]}: the first group's first row must be in 0 .. M = {rows}")
    bad = next((g for g in range(1, len(values)) if not values[g - 1] <= values[g] <= rows), None)
    if bad is not None:
        why = "before the previous offset (unsorted)" if values[bad] < values[bad - 1] else f"past M = {rows}"
        raise LaunchError(f"{name}[{bad}] = {values[bad]} is {why}: the offsets are E + 1 sorted row indices "
                          "from 0 to M, group g owning rows offsets[g] .. offsets[g + 1] - 1 (sort the rows by "
                          "group, e.g. torch.cumsum of the per-group counts)")
