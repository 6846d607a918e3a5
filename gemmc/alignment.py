"""The 16-byte rule: gemmc's kernels move rows in 16-byte vectors (TMA on sm_90a, cp.async on sm_80), so a
matrix's contiguous extent, its other strides and its data pointer must be multiples of 16 bytes.

The one place that turns the rule into element counts: the validity predicate (gemmc.schedule), the build's
divisibility hints (gemmc.build) and the launcher's call checks (gemmc.runtime) read it from here.
"""
from __future__ import annotations

from .types import DType

ALIGN_BYTES = 16


def alignment_elems(dtype: DType) -> int:
    """Elements of `dtype` per 16 bytes: what a contiguous extent and every other stride must divide by."""
    return max(1, ALIGN_BYTES // dtype.bytes)


# kernel params read one 4-byte element at a time, where only that element's own alignment matters: fp8 scales
# (role "scale", f32) and a grouped GEMM's offsets or counts (int32)
ELEMENTWISE_ROLES = ("scale", "group_offsets", "group_counts")
ELEMENT_ALIGN_BYTES = 4


def param_align_bytes(role: str) -> int:
    """The alignment a kernel param's data pointer and strides need, in bytes."""
    return ELEMENT_ALIGN_BYTES if role in ELEMENTWISE_ROLES else ALIGN_BYTES
