"""fp8 in the bench: the problem class ("fp8-<scaling>"), input sets of quantized operands, gemmc's fp8 kernels
and the torch baselines, all called as the harness calls a GEMM, `fn(a, b, out=...)`, with `a` and `b`
gemmc.quantize.Quantized (the fp8 values and their scales).

Baselines: per tensor and per row, torch._scaled_mm (cuBLASLt / CUTLASS fp8 kernels) with use_fast_accum=True,
which accumulates as gemmc's kernels do (no promotion); per block, which this torch's _scaled_mm does not take,
a torch implementation: dequantize both operands to bf16 (each element times its block's scale), then
torch.matmul. That baseline pays the dequantization passes: it is what a stack without a blockwise kernel runs,
not a blockwise GEMM's speed.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..quantize import Quantized, dequantize, quantize
from ..spec import SCALINGS

FP8_PREFIX = "fp8-"
OUT_DTYPE = torch.bfloat16


def fp8_dtype(scaling: str) -> str:
    """The bench's name of the fp8 problem class with this scaling: "fp8-row"."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling {scaling!r}: use one of {SCALINGS}")
    return FP8_PREFIX + scaling


def fp8_scaling(dtype: str) -> Optional[str]:
    """The scaling of an "fp8-<scaling>" dtype name; None for a plain dtype (bf16, f16)."""
    if not str(dtype).startswith(FP8_PREFIX):
        return None
    mode = str(dtype)[len(FP8_PREFIX):]
    if mode not in SCALINGS:
        raise ValueError(f"dtype {dtype!r}: use fp8-tensor, fp8-row or fp8-block")
    return mode


def spec_kwargs(dtype: str) -> dict:
    """GemmSpec keywords of a bench dtype name: {"dtype": "bf16"}, or an fp8 GEMM with its scaling (e4m3 A and
    B, bf16 output)."""
    mode = fp8_scaling(dtype)
    return {"dtype": dtype} if mode is None else {"dtype": "f8e4m3", "scaling": mode}


def quantized_operand(rows: int, cols: int, mode: str, weight: bool, device, generator) -> Quantized:
    """randn rows x cols with a spread of magnitudes (rows and 128-column blocks times 2^[-4, 4)), quantized
    to e4m3 per `mode` (`weight`: B's 128 x 128 blocks)."""
    x = torch.randn(rows, cols, device=device, generator=generator)
    x *= torch.exp2(torch.randint(-4, 4, (rows, 1), device=device, generator=generator).float())
    blocks = torch.exp2(torch.randint(-4, 4, (1, -(-cols // 128)), device=device, generator=generator).float())
    x *= blocks.repeat_interleave(128, dim=1)[:, :cols]
    return Quantized(*quantize(x, mode, weight=weight))


def fp8_call(kernel):
    """`kernel` (a compiled fp8 GEMM: a, b, scale_a, scale_b) as the harness calls a GEMM."""
    def call(a: Quantized, b: Quantized, out=None):
        return kernel(a.q, b.q, a.scale, b.scale, out=out)
    call.schedule = getattr(kernel, "schedule", None)
    call.decision = getattr(kernel, "decision", None)
    return call


def scaled_mm(a: Quantized, b: Quantized, out=None):
    """torch._scaled_mm of A [M, K] and B [N, K] transposed, per-tensor or per-row scales, fast accumulation."""
    sa, sb = a.scale, b.scale
    if sa.numel() != 1 or sb.numel() != 1:          # per row: (M, 1) and (1, N)
        sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)
    else:
        sa, sb = sa.reshape(()), sb.reshape(())
    if out is None:
        return torch._scaled_mm(a.q, b.q.t(), sa, sb, out_dtype=OUT_DTYPE, use_fast_accum=True)
    return torch._scaled_mm(a.q, b.q.t(), sa, sb, out_dtype=out.dtype, use_fast_accum=True, out=out)


def blockwise_torch(a: Quantized, b: Quantized, out=None):
    """The blockwise baseline: both operands dequantized to bf16, then torch.matmul (module doc)."""
    return torch.matmul(dequantize(a.q, a.scale).to(OUT_DTYPE), dequantize(b.q, b.scale).to(OUT_DTYPE).T, out=out)


def baseline(mode: str):
    """The torch baseline of a scaling (module doc)."""
    return blockwise_torch if mode == "block" else scaled_mm
