"""verify-resources: does the kernel fit the hardware? Asks gemmc.schedule.check_schedule, the one
validity predicate, and raises ScheduleError naming each limit, the value and a fix.

On kernel-level IR it also checks the written facts (edited by hand, say) against the same
ARCH_LIMITS table: shared memory, the register file, threads and cluster size."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from ..errors import ScheduleError
from ..ir.build import find_gemm
from ..ir.kernel import ClusterOp, KernelGemmOp, PipelineOp, WarpGroupOp
from ..schedule import ARCH_LIMITS, Violation, check_schedule
from .common import problem_and_schedule


def fact_violations(kernel: KernelGemmOp) -> list[Violation]:
    lim = ARCH_LIMITS[kernel.arch.data]
    found = []
    if (p := kernel.fact(PipelineOp)) is not None and p.get("smem_bytes") > lim.smem_bytes:
        found.append(Violation("shared memory (kernel.pipeline)", f"{p.get('smem_bytes')} B",
                               f"limit {lim.smem_bytes} B on {lim.name}: fewer stages or a smaller tile"))
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
    return found


@dataclass(frozen=True)
class VerifyResources(ModulePass):
    name = "verify-resources"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        gemm = find_gemm(op)
        spec, s = problem_and_schedule(gemm, self.name)
        problems = check_schedule(s, spec)
        if isinstance(gemm, KernelGemmOp):
            problems += fact_violations(gemm)
        if problems:
            raise ScheduleError(problems)
