"""verify-resources: does the kernel fit the hardware? Asks gemmc.schedule.check_schedule, the one
validity predicate, and raises ScheduleError naming each limit, the value and a fix.

On kernel-level IR it also checks the written facts (edited by hand, say), which the backend emits from:
against the same ARCH_LIMITS table (shared memory, recomputed from the ring's stages as well as the number
written; the register file, threads and cluster size), against the schedule's rules (a ring of 2 stages or
more, consumer registers that hold the accumulators) and against the schedule itself (kernel.gemm's arch,
tile, mode and threads; the cluster shape; the epilogue staging the shared memory is counted with)."""
from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from ..errors import ScheduleError
from ..ir.build import find_gemm
from ..ir.kernel import ClusterOp, CopyOp, GroupOp, KernelGemmOp, PipelineOp, WarpGroupOp
from ..schedule import (ARCH_LIMITS, BARRIER_RESERVE_BYTES, Schedule, Violation, ab_stage_bytes, accumulator_regs,
                        check_schedule, consumer_reg_overhead, epilogue_smem_bytes, max_stages, register_pool)
from ..spec import GemmSpec
from .assign_warpgroup_roles import kernel_header
from .common import problem_and_schedule
from .map_groups import group_fact
from .pipeline_staging import pipeline


def _text(value) -> str:
    """A value as the IR writes it: shapes as 128x64."""
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value)


def fact_violations(kernel: KernelGemmOp, s: Schedule, spec: GemmSpec,
                    schedule_valid: bool = True) -> list[Violation]:
    """The written facts' breaches, for the kernel's schedule `s` of problem `spec`. The ring's bytes are
    recomputed from the schedule's stage size only when `s` is valid (else its own violations come first)."""
    lim = ARCH_LIMITS[kernel.arch.data]
    found = []
    # the header is what the backend emits from (tile, arch, ...); assign-warpgroup-roles reads it off the schedule
    want = kernel_header(s)
    for field, value in kernel.header.items():
        if value != want[field]:
            found.append(Violation(f"{field} (kernel.gemm)", f"{_text(value)}, but the schedule's is "
                                   f"{_text(want[field])}", "rerun assign-warpgroup-roles (and the passes after "
                                   "it) on the schedule"))
    if (p := kernel.fact(PipelineOp)) is not None:
        written, stages = p.get("smem_bytes"), p.get("stages")
        expected = pipeline(s, spec).values() if schedule_valid else {}
        if written > lim.smem_bytes:
            found.append(Violation("shared memory (kernel.pipeline)", f"{written} B",
                                   f"limit {lim.smem_bytes} B on {lim.name}: fewer stages or a smaller tile"))
        elif schedule_valid and stages < 2:     # as check_schedule's rule for the schedule's stages
            found.append(Violation("stages (kernel.pipeline)", stages, "the ring needs at least 2 stages: write "
                                   "stages 2 or more, or rerun pipeline-staging"))
        elif schedule_valid and (p.get("epi_stages"), p.get("epi_tile")) != (expected["epi_stages"],
                                                                              expected["epi_tile"]):
            # the epilogue's shared memory below is the schedule's: staging of another size is not counted
            found.append(Violation("epilogue staging (kernel.pipeline)",
                                   f"epi_stages {p.get('epi_stages')} epi_tile {_text(p.get('epi_tile'))}, but the "
                                   f"schedule's is epi_stages {expected['epi_stages']} epi_tile "
                                   f"{_text(expected['epi_tile'])}", "write the schedule's, or rerun pipeline-staging"))
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
    warpgroups = kernel.ops_of(WarpGroupOp)
    if kernel.arch.data == "sm_90a":
        # setmaxnreg sets each SM90 warpgroup's budget: 0 (SM80's "compiler's choice") is no budget
        acc, other = (accumulator_regs(s, spec), consumer_reg_overhead(s, spec)) if schedule_valid else (0, 0)
        need = acc + other
        for w in warpgroups:
            regs, role = w.get("regs"), w.get("role")
            if regs == 0 or (role == "consumer" and regs < need):
                fix = (f"its {acc} accumulator registers and {other} others need regs {-(-need // 8) * 8} or more "
                       "(ptxas spills below that)" if role == "consumer" and need
                       else "sm_90a warpgroups set theirs with setmaxnreg: use a multiple of 8 from 24 to 256")
                found.append(Violation(f"registers of {role} warpgroup {w.get('index')} (kernel.warpgroup)",
                                       regs, f"{fix}, or rerun assign-warpgroup-roles"))
    regs = sum(w.get("regs") * 32 * w.get("warps") for w in warpgroups)
    # sm_90a: setmaxnreg shares out the registers the CTA launched with; budgets past them are never granted
    sm90 = kernel.arch.data == "sm_90a"
    pool = register_pool(lim.name, kernel.threads.data) if sm90 else lim.regs_per_sm
    if regs > pool:
        found.append(Violation("register file (kernel.warpgroup)", regs,
                               f"limit {pool} {'per CTA (its launch registers)' if sm90 else 'per SM'}: lower the "
                               "warpgroups' regs"))
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
    return found + group_fact_violations(kernel, s, spec)


def group_fact_violations(kernel: KernelGemmOp, s: Schedule, spec: GemmSpec) -> list[Violation]:
    """A grouped kernel's mapping (kernel.group) as map-groups writes it for the schedule, and its store from
    registers: a TMA store would write past a group's last row."""
    found = []
    fact, want = kernel.fact(GroupOp), group_fact(s, spec)
    if fact is not None and want is not None and fact.values() != want.values():
        diff = [k for k, v in fact.values().items() if v != want.get(k)]
        found.append(Violation("group mapping (kernel.group)", ", ".join(f"{k} {fact.get(k)}" for k in diff),
                               "map-groups writes " + ", ".join(f"{k} {want.get(k)}" for k in diff)
                               + " for the schedule and problem: write that, or rerun map-groups"))
    out = next((c for c in kernel.ops_of(CopyOp) if c.get("operand") == "out"), None)
    if spec.grouped and out is not None and out.get("kind") != "st_global":
        found.append(Violation("grouped store (kernel.copy out)", out.get("kind"), "a grouped tile's rows past its "
                               "group must not be written: use st_global (from registers, row-predicated), or "
                               "rerun tma-cluster-layout"))
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
