"""Backends turn a `KernelPlan` into CuTe DSL Python source (`EmittedKernel`).

`emit(plan)` dispatches on `plan.arch`. The source is a self-contained module: importing it must
not touch a GPU; its `entry` is a `@cute.jit` host function whose parameters are `params`, in order.
gemmc/build.py compiles it (fake tensors, symbolic dims, TVM-FFI) into a shared object.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ..ir.plan import KernelPlan
from ..schedule import GRID_YZ_MAX  # noqa: F401  (the blocks a grid's y or z extent may have: the launch rule's)
from ..types import DType


@dataclass(frozen=True)
class Param:
    """One argument of the compiled kernel, as the runtime must pass it.

    kind: "tensor" | "scalar" (an f32 passed by value) | "workspace" (runtime-allocated scratch).
    shape: dims as ints or names ("M", "N", "K", "L"); names are symbolic (one `cute.sym_int` each,
    shared across params), ints are static. `contiguous` is the dim with stride 1 (-1: last).
    For a workspace, `shape` may use names and the product of split-K factor etc. is in `workspace_elems`.
    """
    name: str
    kind: str
    dtype: DType
    shape: tuple[Union[int, str], ...] = ()
    contiguous: int = -1
    role: str = ""               # "a" | "b" | "out" | "input" | "workspace" | "scalar" | GROUP_ROLES
    workspace_elems: Optional[str] = None   # python expression over M, N, K, L for the element count
    # (dim, largest extent) of dims a launch grid's y or z extent carries (at most 65535 blocks): the
    # runtime refuses a larger call before launching
    limits: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class EmittedKernel:
    arch: str
    source: str                  # readable CuTe DSL Python
    entry: str                   # name of the @cute.jit host function in `source`
    params: tuple[Param, ...]
    compile_arch: str = ""       # CUTE_DSL_ARCH to compile with ("sm_90a"; SM80 kernels may use "sm_90a" too)


# a grouped GEMM's int32 operand: E + 1 row offsets (contiguous groups) or E row counts (masked)
GROUP_ROLES = ("group_offsets", "group_counts")


def offsets_dim(groups) -> Union[int, str]:
    """The length of a contiguous grouped GEMM's offsets, E + 1: a number, or for a symbolic E the name of a
    dim of its own (the runtime checks that it is B's E + 1)."""
    return groups + 1 if isinstance(groups, int) else f"{groups}_plus_1"


def group_param(layout: str, groups) -> Param:
    """The kernel param of a grouped GEMM's offsets (contiguous) or counts (masked): int32, 4-byte aligned."""
    if layout == "contiguous":
        return Param("offsets", "tensor", DType.i32, (offsets_dim(groups),), role="group_offsets")
    return Param("counts", "tensor", DType.i32, (groups,), role="group_counts")


def emit(plan: KernelPlan) -> EmittedKernel:
    if plan.arch == "sm_90a":
        from .sm90 import emit as emit_sm90
        return emit_sm90(plan)
    if plan.arch == "sm_80":
        from .sm80 import emit as emit_sm80
        return emit_sm80(plan)
    raise ValueError(f"no backend for arch {plan.arch!r}")
