"""The SM90 kernel modules' integer logic (scheduler, stream-K walk, fix-up indexing) run as plain Python."""
import types

from gemmc.backends.sm90.kernel import fixup, scheduler
from gemmc.backends.sm90.kernel.facts import KernelFacts

# KernelFacts' properties the scheduler and fix-up read, in an order where each needs only those before it
_DERIVED = ("STREAM_K", "FIXUP", "UNITS_M_FASTEST", "REORDERS")


def plain_kernel(monkeypatch, **facts):
    """(kernel, cta, grid): the scheduler and fix-up methods of the SM90 kernel with cute.jit unwrapped, over
    `facts` (others default to a plain 128x128 tile), and the lists its block_idx and grid_dim read."""
    cta, grid = [0, 0, 0], [1, 1, 1]
    arch = types.SimpleNamespace(block_idx=lambda: tuple(cta), grid_dim=lambda: tuple(grid),
                                 make_warp_uniform=lambda v: v)
    monkeypatch.setattr(scheduler, "cute", types.SimpleNamespace(jit=lambda f: f, arch=arch))
    methods = {}
    for cls in (scheduler.TileScheduler, fixup.PartialSums):
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
