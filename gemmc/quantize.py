"""fp8 quantization in torch: `quantize` turns a tensor into fp8 values and f32 scales of one of the scalings
gemmc takes (gemmc.Scaling), and `dequantize` multiplies them back, in f32.

Both work on operands as gemmc stores them for an fp8 GEMM: rows x K, K contiguous (A as M x K, B as N x K,
an nn.Linear weight). The scale is the dequantization factor, x ~ q * scale, as torch._scaled_mm takes it:
  tensor  scale (1,)                 amax(|x|) / fp8_max
  row     scale (rows,)              per row
  block   A: (rows, ceil(K/128))     per 1 x 128 block (activations, DeepSeek-V3)
          B: (ceil(rows/128), ceil(K/128))   per 128 x 128 block (weights)
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .spec import SCALE_BLOCK, SCALINGS
from .types import DType, torch_dtype


class Quantized(NamedTuple):
    """An fp8 operand with its dequantization scale (as `quantize` returns them)."""
    q: Any
    scale: Any

    @property
    def shape(self):
        return self.q.shape

    def dequantized(self):
        return dequantize(self.q, self.scale)


def _blocks(n: int) -> int:
    return -(-n // SCALE_BLOCK)


def _expand(scale, rows: int, cols: int, row_block: int):
    """`scale` (ceil(rows / row_block), ceil(cols / 128)) repeated to rows x cols."""
    return scale.repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(SCALE_BLOCK, dim=1)[:, :cols]


def dequantize(x, scale):
    """x (rows x K) times its scale, in f32; the scale's shape says the scaling (module doc). A per-row-block
    scale of a 1-row x reads as per row (they are the same). A grouped operand, x (E, rows, K) with block scales
    of the same leading E (a grouped GEMM's B, or a masked one's A), is each group's rows times its scales."""
    import torch
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if x.dim() == 3 and s.dim() == 3 and s.shape[0] == x.shape[0]:
        return torch.stack([dequantize(x[g], s[g]) for g in range(x.shape[0])]) if x.shape[0] else x.float()
    xf = x.float()
    if x.dim() != 2:
        raise ValueError(f"dequantize: x is {x.dim()}-D; fp8 operands are 2-D (rows x K), or 3-D (E, rows, K) "
                         "with block scales of the same E")
    rows, cols = x.shape
    if s.numel() == 1 and s.dim() <= 1:
        return xf * s.reshape(())
    if s.dim() == 1 and s.shape[0] == rows:
        return xf * s[:, None]
    if s.dim() == 2 and s.shape[1] == _blocks(cols):
        if s.shape[0] == rows:
            return xf * _expand(s, rows, cols, 1)
        if s.shape[0] == _blocks(rows):
            return xf * _expand(s, rows, cols, SCALE_BLOCK)
    raise ValueError(f"dequantize: a scale of shape {tuple(s.shape)} fits no scaling of a {rows} x {cols} "
                     f"operand; use (1,), ({rows},), ({rows}, {_blocks(cols)}) or ({_blocks(rows)}, {_blocks(cols)})")


def quantize(x, mode: str, dtype=DType.f8e4m3, weight: bool = False):
    """(q, scale): x (rows x K, any float dtype) as fp8 `dtype` values and the f32 dequantization scale of
    scaling `mode`, each group's largest |x| mapped to the fp8 maximum. `weight`: B's scales under block
    scaling (128 x 128 blocks; A's are 1 x 128)."""
    import torch
    if mode not in SCALINGS:
        raise ValueError(f"quantize: mode {mode!r}; use one of {SCALINGS}")
    fp8 = torch_dtype(dtype)
    top = torch.finfo(fp8).max
    xf = x.float()
    rows, cols = xf.shape
    if mode == "tensor":
        amax = xf.abs().amax().reshape(1)
    elif mode == "row":
        amax = xf.abs().amax(dim=1)
    else:
        row_block = SCALE_BLOCK if weight else 1
        padded = torch.zeros(_blocks(rows) * row_block if weight else rows, _blocks(cols) * SCALE_BLOCK,
                             dtype=torch.float32, device=x.device)
        padded[:rows, :cols] = xf.abs()
        amax = padded.reshape(padded.shape[0] // row_block, row_block, -1, SCALE_BLOCK).amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax)).float()
    full = {"tensor": lambda: scale.reshape(()), "row": lambda: scale[:, None]}.get(
        mode, lambda: _expand(scale, rows, cols, SCALE_BLOCK if weight else 1))()
    q = (xf / full).clamp(-top, top).to(fp8)
    return q, scale.contiguous()
