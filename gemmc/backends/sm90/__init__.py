"""SM90 (Hopper) backend: persistent warp-specialized TMA + WGMMA kernels from a `KernelPlan`."""
from .emit import emit, params_of

__all__ = ["emit", "params_of"]
