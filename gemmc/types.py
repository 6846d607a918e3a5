"""Element types and architectures gemmc knows about."""
from __future__ import annotations

import enum

from .errors import SpecError


class DType(str, enum.Enum):
    bf16 = "bf16"
    f16 = "f16"
    f32 = "f32"
    # fp8 operands (SM90): A is e4m3, B e4m3 or e5m2 (gradients), each with f32 scales (GemmSpec.scaling)
    f8e4m3 = "f8e4m3"
    f8e5m2 = "f8e5m2"
    # Runtime-owned counters only (the split-K fix-up's per-tile semaphores); no operand or output is i32.
    i32 = "i32"

    @property
    def bits(self) -> int:
        return {"bf16": 16, "f16": 16, "f32": 32, "f8e4m3": 8, "f8e5m2": 8, "i32": 32}[self.value]

    @property
    def bytes(self) -> int:
        return self.bits // 8

    def __str__(self) -> str:  # "bf16", not "DType.bf16"
        return self.value


_ALIASES = {
    "bf16": DType.bf16, "bfloat16": DType.bf16,
    "f16": DType.f16, "fp16": DType.f16, "float16": DType.f16, "half": DType.f16,
    "f32": DType.f32, "fp32": DType.f32, "float32": DType.f32, "float": DType.f32,
    "f8e4m3": DType.f8e4m3, "float8_e4m3fn": DType.f8e4m3,
    "f8e5m2": DType.f8e5m2, "float8_e5m2": DType.f8e5m2,
}

INPUT_DTYPES = (DType.bf16, DType.f16)
# fp8 operands: A's dtype, B's (e5m2 holds gradients' range); they need scales, accumulate in f32
FP8_DTYPES = (DType.f8e4m3, DType.f8e5m2)
FP8_A_DTYPES = (DType.f8e4m3,)
FP8_B_DTYPES = (DType.f8e4m3, DType.f8e5m2)
# every dtype A or B may have (an unknown name's error lists these)
OPERAND_DTYPES = INPUT_DTYPES + FP8_DTYPES
ACC_DTYPES = (DType.f32, DType.f16)
OUTPUT_DTYPES = (DType.bf16, DType.f16, DType.f32)
# tensors the epilogue reads besides the accumulator (bias, residual, scale): loaded and widened to f32
EPILOGUE_INPUT_DTYPES = (DType.bf16, DType.f16, DType.f32)

ARCHS = ("sm_90a", "sm_80")


def as_dtype(value, accepted: tuple[DType, ...] | None = None) -> DType:
    """Accept a DType, a name ("bf16", "fp16", ...) or a torch dtype. `accepted`: the dtypes the caller's role
    takes (e.g. INPUT_DTYPES), which an unknown name's error lists; by default every dtype a name resolves to.
    Whether the dtype suits the role is the caller's check."""
    if isinstance(value, DType):
        return value
    name = str(value)
    if name.startswith("torch."):
        name = name[len("torch."):]
    try:
        return _ALIASES[name]
    except KeyError:
        # only names that parse: i32 is a DType (runtime counters) but no name maps to it
        names = accepted if accepted is not None else sorted(set(_ALIASES.values()), key=list(DType).index)
        raise SpecError(f"unknown dtype {value!r}; use one of: {', '.join(d.value for d in names)}") from None


def as_arch(value: str) -> str:
    aliases = {"sm_90a": "sm_90a", "sm90a": "sm_90a", "sm_90": "sm_90a", "sm90": "sm_90a",
               "hopper": "sm_90a", "sm_80": "sm_80", "sm80": "sm_80", "ampere": "sm_80"}
    try:
        return aliases[str(value).lower()]
    except KeyError:
        raise SpecError(f"unknown arch {value!r}; use 'sm_90a' (Hopper) or 'sm_80' (Ampere)") from None


def torch_dtype(dtype: DType):
    import torch
    return {DType.bf16: torch.bfloat16, DType.f16: torch.float16, DType.f32: torch.float32,
            DType.i32: torch.int32, DType.f8e4m3: torch.float8_e4m3fn, DType.f8e5m2: torch.float8_e5m2}[dtype]
