"""gemmc's passes, in pipeline order. Each is an xDSL ModulePass in its own file."""
from __future__ import annotations

from typing import Callable, Iterable

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline

from .assign_warpgroup_roles import AssignWarpgroupRoles
from .map_groups import MapGroups
from .pipeline_staging import PipelineStaging
from .tma_cluster_layout import TmaClusterLayout
from .verify_resources import VerifyResources

PASSES: dict[str, type[ModulePass]] = {p.name: p for p in (AssignWarpgroupRoles, TmaClusterLayout, PipelineStaging,
                                                             MapGroups, VerifyResources)}
PIPELINE: tuple[str, ...] = tuple(PASSES)


def pass_pipeline(names: Iterable[str] = PIPELINE,
                  after_each: Callable[[str, ModuleOp], None] | None = None) -> PassPipeline:
    """A PassPipeline over `names`; `after_each(name, module)` runs after every pass."""
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise ValueError(f"unknown pass(es) {unknown}; available: {', '.join(PIPELINE)}")

    def callback(previous, module, _next):
        if previous is not None:
            module.verify()
            if after_each is not None:
                after_each(previous.name, module)

    return PassPipeline(tuple(PASSES[n]() for n in names), callback)
