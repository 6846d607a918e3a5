"""The visible GPU: the arch gemmc builds for it (visible_arch), and whether SM90 kernels' persistent grids
were sized for its SM count (check_persistent_grid)."""
from __future__ import annotations

import warnings
from typing import Optional

from ..errors import PerformanceWarning


_GRID_CHECKED: set = set()


def check_persistent_grid(arch: str, device_index: Optional[int] = None) -> Optional[str]:
    """SM90 kernels size their persistent grid by the cluster occupancy measured on a 132-SM part (H100
    SXM, H200; `ArchLimits.max_active_clusters`). On another SM count part of the grid may wait for a
    second wave (~2x the time) or SMs may idle: warn once per device. Returns the warning, if any."""
    if arch != "sm_90a":
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if device_index is None else device_index
    if idx in _GRID_CHECKED:
        return None
    _GRID_CHECKED.add(idx)
    from ..schedule import ARCH_LIMITS
    want = ARCH_LIMITS["sm_90a"].num_sms
    props = torch.cuda.get_device_properties(idx)
    if props.multi_processor_count == want:
        return None
    msg = (f"gemmc: SM90 kernels size their persistent grid for a {want}-SM H100 SXM / H200; {props.name} "
           f"(cuda:{idx}) has {props.multi_processor_count} SMs, so part of a grid may run as a second wave or "
           "SMs may idle: results stay correct, speed does not. Compare with torch.matmul (`gemmc bench`) "
           "before relying on these kernels here.")
    warnings.warn(msg, PerformanceWarning, stacklevel=3)
    return msg



_ARCH_OF_MAJOR = {9: "sm_90a", 8: "sm_80"}      # compute capability major -> the arch gemmc builds for it


def visible_arch() -> Optional[str]:
    """The arch of torch's current CUDA device ("sm_90a" for compute capability 9.x, "sm_80" for 8.x), or
    None where no GPU is visible or gemmc builds for none of its kind."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        major, _ = torch.cuda.get_device_capability()
    except Exception:       # no torch CUDA runtime: nothing visible
        return None
    return _ARCH_OF_MAJOR.get(major)
