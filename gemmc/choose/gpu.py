"""The GPU `schedule="auto"` decides for: the DB's rows and the shipped tables count only on the GPU they were
measured on."""
from __future__ import annotations

import os
from typing import Optional


def _visible_gpu() -> Optional[str]:
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception:       # no torch CUDA runtime: nothing visible
        return None


def target_gpu(gpu_name: Optional[str] = None) -> Optional[str]:
    """The GPU `auto` decides for: `gpu_name`, else GEMMC_GPU, else the visible GPU's name; None for an
    ahead-of-time build on a machine with no GPU that names none. GEMMC_GPU names the GPU an ahead-of-time
    build is for, so `auto` picks there what it will pick on that GPU (the cache then hits)."""
    return gpu_name or os.environ.get("GEMMC_GPU") or _visible_gpu()
