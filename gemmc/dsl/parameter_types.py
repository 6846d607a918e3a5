"""The annotations of a kernel function's parameters: `gemmc.Tensor[shape, dtype]` (a `TensorType`),
`gemmc.Scalar`, and a grouped GEMM's int32 operand, `gemmc.GroupOffsets[E]` / `gemmc.GroupCounts[E]` (a
`GroupIndexType`); and how a shape prints in messages."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import SpecError, TraceError
from ..spec import Dim
from ..types import DType, as_dtype


@dataclass(frozen=True)
class TensorType:
    """What `gemmc.Tensor[shape, dtype]` evaluates to: a shape of static/named dims and a dtype."""
    shape: tuple[Dim, ...]
    dtype: DType

    def __repr__(self) -> str:
        return f"Tensor[{fmt_shape(self.shape)}, {self.dtype}]"


class Tensor:
    """Annotation for a tensor parameter: `gemmc.Tensor[("M", 4096), gemmc.bf16]`."""

    def __class_getitem__(cls, item) -> TensorType:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TraceError(f"gemmc.Tensor[{item!r}]: write gemmc.Tensor[(dims...), dtype], "
                             "e.g. gemmc.Tensor[('M', 4096), gemmc.bf16]")
        shape, dtype = item
        if not isinstance(shape, (tuple, list)):
            shape = (shape,)
        dims = []
        for d in shape:
            if isinstance(d, bool) or not (isinstance(d, str) and re.match(r"^[A-Za-z_]\w*$", d)
                                           or isinstance(d, int) and d > 0):
                raise TraceError(f"gemmc.Tensor dim {d!r}: use a positive int or a name such as 'M'")
            dims.append(d)
        if len(dims) > 3:
            raise TraceError(f"gemmc.Tensor of rank {len(dims)}: at most 3 dims (batch, rows, cols)")
        try:
            dt = as_dtype(dtype)
        except SpecError as e:
            raise TraceError(f"gemmc.Tensor dtype: {e}") from None
        return TensorType(tuple(dims), dt)


@dataclass(frozen=True)
class GroupIndexType:
    """What `gemmc.GroupOffsets[E]` / `gemmc.GroupCounts[E]` evaluate to: which rows belong to each of E groups,
    as E + 1 int32 row offsets ("offsets": the contiguous layout) or E int32 row counts ("counts": masked)."""
    kind: str
    groups: Dim

    @property
    def layout(self) -> str:
        return "contiguous" if self.kind == "offsets" else "masked"

    def __repr__(self) -> str:
        return f"Group{self.kind.capitalize()}[{self.groups!r}]"


def _group_index(kind: str, item) -> GroupIndexType:
    if isinstance(item, bool) or not (isinstance(item, str) and re.match(r"^[A-Za-z_]\w*$", item)
                                      or isinstance(item, int) and item > 0):
        raise TraceError(f"gemmc.Group{kind.capitalize()}[{item!r}]: give the group count E, a positive int or a "
                         "name such as 'E' (the one B's leading dim has)")
    return GroupIndexType(kind, item)


class GroupOffsets:
    """Annotation for a contiguous grouped GEMM's row offsets: `gemmc.GroupOffsets["E"]` is an int32 device tensor
    of E + 1 entries; group g owns rows offsets[g] .. offsets[g + 1] - 1 of A and of the output."""

    def __class_getitem__(cls, item) -> GroupIndexType:
        return _group_index("offsets", item)


class GroupCounts:
    """Annotation for a masked grouped GEMM's row counts: `gemmc.GroupCounts["E"]` is an int32 device tensor of E
    entries; group g owns the first counts[g] of its M rows."""

    def __class_getitem__(cls, item) -> GroupIndexType:
        return _group_index("counts", item)


class Scalar:
    """Annotation for a runtime f32 scalar parameter (a plain `float` annotation means the same)."""


def fmt_shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
