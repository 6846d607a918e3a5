"""verify-resources: does the kernel fit the hardware? Asks gemmc.schedule.check_schedule, the one
validity predicate, and raises ScheduleError naming each limit, the value and a fix.

On kernel-level IR it also checks the written facts (edited by hand, say), which the backend emits from:
against the same ARCH_LIMITS table (shared memory, recomputed from the ring's stages as well as the number
written; the register file, threads and cluster size) and against the schedule (the cluster shape)."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from ..errors import ScheduleError
from ..ir.build import find_gemm
from ..ir.kernel import ClusterOp, KernelGemmOp, PipelineOp, WarpGroupOp
from ..schedule import (ARCH_LIMITS, BARRIER_RESERVE_BYTES, Schedule, Violation, ab_stage_bytes, check_schedule,
                        epilogue_smem_bytes, max_stages)
from ..spec import GemmSpec
from .common import problem_and_schedule


def fact_violations(kernel: KernelGemmOp, s: Schedule, spec: GemmSpec,
                    schedule_valid: bool = True) -> list[Violation]:
    """The written facts' breaches, for the kernel's schedule `s` of problem `spec`. The ring's bytes are
    recomputed from the schedule's stage size only when `s` is valid (else its own violations come first)."""
    lim = ARCH_LIMITS[kernel.arch.data]
    found = []
    if (p := kernel.fact(PipelineOp)) is not None:
        written, stages = p.get("smem_bytes"), p.get("stages")
        if written > lim.smem_bytes:
            found.append(Violation("shared memory (kernel.pipeline)", f"{written} B",
                                   f"limit {lim.smem_bytes} B on {lim.name}: fewer stages or a smaller tile"))
        elif schedule_valid:
            # the ring the kernel allocates is stages x stage bytes: check that, not only the number written
            stage_b, epi = ab_stage_bytes(s, spec), epilogue_smem_bytes(s, spec)
            needed = stages * stage_b + epi + BARRIER_RESERVE_BYTES
            if needed > lim.smem_bytes:
                found.append(Violation("shared memory (kernel.pipeline stages)",
                                       f"{needed} B ({stages} stages x {stage_b} B + {epi} B epilogue)",
                                       f"limit {lim.smem_bytes} B on {lim.name}: at most {max_stages(s, spec)} "
                                       "stages fit; lower stages or rerun pipeline-staging"))
            elif written != needed:
                found.append(Violation("shared memory (kernel.pipeline)", f"smem {written} B for {stages} stages, "
                                       f"which take {needed} B", f"write smem {needed} or rerun pipeline-staging"))
    regs = sum(w.get("regs") * 32 * w.get("warps") for w in kernel.ops_of(WarpGroupOp))
    if regs > lim.regs_per_sm:
        found.append(Violation("register file (kernel.warpgroup)", regs,
                               f"limit {lim.regs_per_sm} per SM: lower the warpgroups' regs"))
    if kernel.threads.data > lim.max_threads:
        found.append(Violation("threads per CTA (kernel.gemm)", kernel.threads.data, f"at most {lim.max_threads}"))
    if (c := kernel.fact(ClusterOp)) is not None:
        cm, cn = c.get("shape")
        if cm * cn > lim.max_cluster:
            found.append(Violation("cluster size (kernel.cluster)", cm * cn,
                                   f"at most {lim.max_cluster} CTAs per cluster on {lim.name}"))
        # the copies' multicast and the grid were laid out for the schedule's cluster
        if (cm, cn) != s.cluster:
            found.append(Violation("cluster (kernel.cluster)", f"{cm}x{cn}, but the schedule's is "
                                   f"{s.cluster[0]}x{s.cluster[1]}", "write the schedule's cluster, or change "
                                   "the schedule's and rerun tma-cluster-layout"))
    return found


@dataclass(frozen=True)
class VerifyResources(ModulePass):
    name = "verify-resources"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        gemm = find_gemm(op)
        spec, s = problem_and_schedule(gemm, self.name)
        problems = check_schedule(s, spec)
        if isinstance(gemm, KernelGemmOp):
            problems += fact_violations(gemm, s, spec, schedule_valid=not problems)
        if problems:
            raise ScheduleError(problems)
