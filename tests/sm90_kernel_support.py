"""The SM90 kernel modules' integer logic (scheduler, stream-K walk, fix-up indexing) run as plain Python."""
import importlib.util
import types

from gemmc.backends.sm90.kernel import fixup, scheduler
from gemmc.backends.sm90.kernel.facts import KernelFacts

# KernelFacts' properties the scheduler and fix-up read, in an order where each needs only those before it
_DERIVED = ("STREAM_K", "FIXUP", "UNITS_M_FASTEST", "REORDERS")


def _fresh(module) -> types.ModuleType:
    """A private copy of a kernel module, loaded from its file: compiling a kernel rewrites the code of the
    cute.jit functions it traces in place, so the imported module's methods may no longer be plain Python."""
    spec = importlib.util.spec_from_file_location(f"plain_{module.__name__.rsplit('.', 1)[-1]}", module.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def plain_kernel(monkeypatch, **facts):
    """(kernel, cta, grid): the scheduler and fix-up methods of the SM90 kernel with cute.jit unwrapped, over
    `facts` (others default to a plain 128x128 tile), and the lists its block_idx and grid_dim read."""
    cta, grid = [0, 0, 0], [1, 1, 1]
    arch = types.SimpleNamespace(block_idx=lambda: tuple(cta), grid_dim=lambda: tuple(grid),
                                 make_warp_uniform=lambda v: v)
    plain_scheduler, plain_fixup = _fresh(scheduler), _fresh(fixup)
    monkeypatch.setattr(plain_scheduler, "cute", types.SimpleNamespace(jit=lambda f: f, arch=arch))
    methods = {}
    for cls in (plain_scheduler.TileScheduler, plain_fixup.PartialSums):
        methods.update({n: getattr(f, "__wrapped__", f) for n, f in vars(cls).items() if callable(f)})
    kernel = type("PlainKernel", (), methods)()
    values = dict(RASTER_ALONG_M=True, SWIZZLE=1, SPLIT_K=1, SPLIT_K_MODE="none", CLUSTER_MN=(1, 1),
                  TILE_MNK=(128, 128, 64))
    values.update(facts)
    for name, value in values.items():
        setattr(kernel, name, value)
    for name in _DERIVED:
        setattr(kernel, name, getattr(KernelFacts, name).fget(kernel))
    return kernel, cta, grid
