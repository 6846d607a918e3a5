"""Load built kernels and launch them on torch tensors: what a GPU host runs from the kernel cache.

    launcher.py    the Launcher: binds a call's arguments, checks them, sizes the output, launches
    checks.py      what a call's tensors must be, planned once per param, and the Python prologue
    signature.py   the caller's own arguments and how they bind (CallSignature)
    scratch.py     the split-K workspace and semaphore pools that every launcher shares
    load.py        a built .so loaded through TVM-FFI; a damaged file told from a host that cannot load it
    gpu.py         the visible GPU: its arch, and whether SM90 grids were sized for it

No module here imports `cutlass`: they run on GPU hosts that have only the runtime libraries
(tests/test_runtime.py checks it). The names below are the package's API; gemmc calls them through here.
"""
from .checks import check_groups, is_batched, python_prologue  # noqa: F401
from .gpu import check_persistent_grid, visible_arch  # noqa: F401
from .launcher import Launcher, launcher_from_artifact, param_from_dict  # noqa: F401
from .load import (DamagedKernelError, KernelLoadError, cute_runtime_library_candidates,  # noqa: F401
                   find_cute_runtime_library, load_function)
from .scratch import SEMAPHORES, WORKSPACES, SemaphorePool, WorkspacePool  # noqa: F401
from .signature import CallSignature  # noqa: F401
