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
    """`scale` ((E,) ceil(rows / row_block), ceil(cols / 128)) repeated to ((E,) rows x cols."""
    return scale.repeat_interleave(row_block, dim=-2)[..., :rows, :].repeat_interleave(SCALE_BLOCK, dim=-1)[..., :cols]


def dequantize(x, scale):
    """x (rows x K) times its scale, in f32; the scale's shape says the scaling (module doc). A per-row-block
    scale of a 1-row x reads as per row (they are the same). A grouped operand, x (E, rows, K) with block scales
    of the same leading E (a grouped GEMM's B, or a masked one's A), is each group's rows times its scales."""
    import torch
    xf = x.float()
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    grouped = x.dim() == 3 and s.dim() == 3 and s.shape[0] == x.shape[0]
    if x.dim() != 2 and not grouped:
        raise ValueError(f"dequantize: x is {x.dim()}-D; fp8 operands are 2-D (rows x K), or 3-D (E, rows, K) "
                         "with block scales of the same E")
    rows, cols = x.shape[-2:]
    if not grouped and s.numel() == 1 and s.dim() <= 1:
        return xf * s.reshape(())
    if not grouped and s.dim() == 1 and s.shape[0] == rows:
        return xf * s[:, None]
    if s.dim() == x.dim() and s.shape[-1] == _blocks(cols):
        if s.shape[-2] == rows:
            return xf * _expand(s, rows, cols, 1)
        if s.shape[-2] == _blocks(rows):
            return xf * _expand(s, rows, cols, SCALE_BLOCK)
    lead = f"{x.shape[0]}, " if grouped else ""
    raise ValueError(f"dequantize: a scale of shape {tuple(s.shape)} fits no scaling of a "
                     f"{' x '.join(map(str, x.shape))} operand; use " + ("" if grouped else f"(1,), ({rows},), ")
                     + f"({lead}{rows}, {_blocks(cols)}) or ({lead}{_blocks(rows)}, {_blocks(cols)})")


def dequantize_blocks(x, scale, dtype):
    """x times its block scales (A's per 1 x 128, B's per 128 x 128; optionally grouped, as dequantize takes
    them), rounded to the torch `dtype`: a baseline's operand (e.g. bf16 for torch._grouped_mm). One tensor of
    x's size in `dtype`, the scales broadcast over their blocks (dequantize expands them to f32 first: 8 bytes
    an element, too much for a model's experts); shapes of partial blocks go through dequantize."""
    *lead, rows, cols = x.shape
    row_block = 1 if scale.shape[-2] == rows else SCALE_BLOCK
    if rows % row_block or cols % SCALE_BLOCK or scale.dim() != x.dim():
        return dequantize(x, scale).to(dtype)
    blocks = x.reshape(*lead, rows // row_block, row_block, cols // SCALE_BLOCK, SCALE_BLOCK).to(dtype)
    return blocks.mul_(scale[..., :, None, :, None].to(dtype)).reshape(x.shape)


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
