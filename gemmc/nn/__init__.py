"""gemmc in PyTorch models: gemmc.nn.Linear (a drop-in nn.Linear with a fused activation), GatedMLP (a
Llama-style MLP whose gate and up projections run as one GEMM), swap_linears (put them into a model in
place) and prepare (build every kernel before a CUDA-graph capture). docs/pytorch.md shows how."""
from .gated_mlp import GatedMLP
from .linear import Linear
from .prepare import PrepareSummary, prepare
from .swap import KernelKey, SwapReport, swap_linears

__all__ = ["GatedMLP", "KernelKey", "Linear", "PrepareSummary", "SwapReport", "prepare", "swap_linears"]
