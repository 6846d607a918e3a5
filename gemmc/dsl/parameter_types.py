"""The annotations of a kernel function's parameters: `gemmc.Tensor[shape, dtype]` (a `TensorType`) and
`gemmc.Scalar`; and how a shape prints in messages."""
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


class Scalar:
    """Annotation for a runtime f32 scalar parameter (a plain `float` annotation means the same)."""


def fmt_shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
