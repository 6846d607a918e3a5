"""gemmc: a GEMM kernel compiler for NVIDIA GPUs."""
__version__ = "0.3.4"

from .errors import BuildError, GemmcError, LaunchError, ScheduleError, SpecError, TraceError  # noqa: F401
from .schedule import Schedule, check_schedule, enumerate_schedules, is_valid  # noqa: F401
from .spec import EpilogueInput, EpilogueOp, GemmSpec, Ref, Scaling  # noqa: F401
from .types import DType  # noqa: F401

bf16 = DType.bf16
f16 = fp16 = DType.f16
f32 = fp32 = DType.f32
f8e4m3 = DType.f8e4m3      # fp8 operands (A and B), with their scales: gemmc.scaled(x, sx)
f8e5m2 = DType.f8e5m2      # fp8 B (gradients)

# The DSL (gemmc/dsl/).
from .dsl import (GroupCounts, GroupOffsets, Kernel, Scalar, Tensor, clamp, gelu, grouped_mm, kernel,  # noqa: F401,E402
                  relu, scaled, sigmoid, silu, tanh)


# `gemmc.compile` and friends (gemmc/compiler.py) load xDSL, so they are imported on first use.
_COMPILER_NAMES = ("compile", "lower", "CompiledGemm")


# `gemmc.nn` (modules for PyTorch models) and `gemmc.torch_ops` (the torch.library ops) import torch, so they
# too are imported on first use.
_SUBMODULES = ("nn", "torch_ops")


def __getattr__(name):
    if name in _COMPILER_NAMES:
        from . import compiler
        return getattr(compiler, name)
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gemmc' has no attribute {name!r}")
