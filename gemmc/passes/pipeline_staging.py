"""pipeline-staging: the A/B ring depth and its barriers, the epilogue staging, and the tile scheduler
(with the launch kind: programmatic dependent launch when the schedule asks for it, on sm_90a; and the
persistent grid's cap, the clusters of the schedule's shape resident at once).

Stages come from gemmc.schedule.resolve_stages ("auto": as many as fit after the epilogue's share
of shared memory); the byte count from gemmc.schedule.smem_bytes (SM80's ring as allocated from
sm80_ring_smem_bytes). Nothing is recomputed here.

The SM80 kernel's compile target is decided here, the one place every lowering passes through:
$GEMMC_SM80_COMPILE_ARCH (one of gemmc.schedule.SM80_COMPILE_ARCHS), else sm_80. GEMMC_SM80_COMPILE_ARCH=sm_90a
makes gemmc.compile(spec, arch="sm_80") build a kernel an H100/H200 can load. The IR records it
(kernel.pipeline compile_arch) and the backend reads it from the plan."""
from __future__ import annotations

import os
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from ..errors import BuildError
from ..ir.kernel import PipelineOp, TileSchedulerOp
from ..schedule import (ARCH_LIMITS, EPI_STAGES, PDL_PREFETCH_K_TILES, SM80_COMPILE_ARCHS, Schedule, epilogue_tile,
                        pdl_trigger_bands, resolve_stages, sm80_ring_smem_bytes, smem_bytes, split_k_mode)
from ..spec import GemmSpec
from .common import kernel_op, layout_schedule


def pipeline(s: Schedule, spec: GemmSpec) -> PipelineOp:
    if s.arch == "sm_90a":   # TMA arrives on `full`; consumers release a slot on `empty`
        barriers, epi_stages, epi = ("full", "empty"), EPI_STAGES, epilogue_tile(s)
        sm80 = {}
    else:                    # cp.async commit groups, waited on `stages - 2` deep; no smem C staging
        barriers, epi_stages, epi = ("cp.async.group",), 0, s.tile[:2]
        sm80 = {"ring_smem_bytes": sm80_ring_smem_bytes(s, spec), "compile_arch": sm80_compile_arch()}
    return PipelineOp.make(stages=resolve_stages(s, spec), barriers=barriers, epi_stages=epi_stages,
                           epi_tile=epi, smem_bytes=smem_bytes(s, spec), **sm80)


def sm80_compile_arch() -> str:
    """$GEMMC_SM80_COMPILE_ARCH, else sm_80: the target SM80 kernels are built for."""
    arch = os.environ.get("GEMMC_SM80_COMPILE_ARCH") or "sm_80"
    if arch not in SM80_COMPILE_ARCHS:
        raise BuildError(f"GEMMC_SM80_COMPILE_ARCH={arch!r}: compile_arch {arch!r} cannot run the SM80 kernel; "
                         f"use one of {SM80_COMPILE_ARCHS}")
    return arch


def tile_scheduler(s: Schedule, spec: GemmSpec | None = None) -> TileSchedulerOp:
    # PDL needs griddepcontrol (sm_90a); on sm_80 the schedule's pdl is ignored and kernels launch plain
    pdl = s.pdl and s.arch == "sm_90a"
    early, full = pdl_bands(s) if pdl else (0, 0)
    persistent = s.arch == "sm_90a"
    # a grouped GEMM's first tile depends on its offsets or counts, which the previous kernel (the router) may
    # still be writing: nothing is read before griddepcontrol.wait, so no L2 prefetch
    grouped = spec is not None and spec.grouped
    return TileSchedulerOp.make(persistent=persistent, raster=s.raster, swizzle=s.swizzle,
                                split_k=s.split_k, split_k_mode=split_k_mode(s),
                                pdl=pdl, pdl_early_ctas=early, pdl_full_ctas=full,
                                **pdl_prefetch(s, pdl and not grouped),
                                max_active_clusters=max_active_clusters(s) if persistent else 0)


def pdl_prefetch(s: Schedule, pdl: bool) -> dict:
    """The L2 prefetch before griddepcontrol.wait: "auto" prefetches PDL_PREFETCH_K_TILES of both operands in
    the banded grids; a number of k-tiles prefetches the weights (b: the previous kernel may still be writing
    a) in every grid: a schedule that asks for it is measured with it. None without PDL."""
    if not pdl or s.l2_prefetch == 0:
        return {"pdl_prefetch_k_tiles": 0}
    if s.l2_prefetch == "auto":
        return {"pdl_prefetch_k_tiles": PDL_PREFETCH_K_TILES}
    return {"pdl_prefetch_k_tiles": s.l2_prefetch, "pdl_prefetch_of": "b", "pdl_prefetch_banded": False}


def max_active_clusters(s: Schedule) -> int:
    """The persistent grid never exceeds the clusters resident at once: GPCs strand SMs, so 132 // size
    clusters would run the last ones as a second wave (ArchLimits.max_active_clusters, measured)."""
    return ARCH_LIMITS[s.arch].active_clusters(s.cluster[0] * s.cluster[1])


def pdl_bands(s: Schedule) -> tuple[int, int]:
    """When a grid lets the next kernel launch: once its last load is issued if it has at most 5/8 of the
    SMs' CTAs or at least 9/10 of them, else once its last stage is released. H200, back-to-back calls
    over grid sizes of 48-132 CTAs (three kernel families): triggering at the last load gained 4-17% up
    to 80 CTAs (1x4096x4096: 12.0 -> 10.7 us) and 1-4% from 120, but lost up to 7% at 88-112; triggering
    once the stages are released gained 0-4% at every size."""
    return pdl_trigger_bands(ARCH_LIMITS[s.arch].num_sms)


@dataclass(frozen=True)
class PipelineStaging(ModulePass):
    name = "pipeline-staging"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kernel = kernel_op(op, self.name)
        spec, s = layout_schedule(kernel, self.name)
        kernel.drop_facts(PipelineOp, TileSchedulerOp)
        kernel.add_fact(pipeline(s, spec))
        kernel.add_fact(tile_scheduler(s, spec))
