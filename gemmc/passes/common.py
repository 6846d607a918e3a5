"""What every gemmc pass needs: the module's GEMM op, its problem and its schedule."""
from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException

from ..ir.build import find_gemm, schedule_of, spec_of
from ..ir.kernel import KernelGemmOp
from ..schedule import Schedule
from ..spec import GemmSpec


def kernel_op(module: ModuleOp, pass_name: str) -> KernelGemmOp:
    """The kernel.gemm a lowering pass adds its facts to."""
    op = find_gemm(module)
    if not isinstance(op, KernelGemmOp):
        raise DiagnosticException(f"{pass_name} works on kernel.gemm, but the module still has gemm.matmul: "
                                  "run assign-warpgroup-roles first")
    return op


def problem_and_schedule(op, pass_name: str) -> tuple[GemmSpec, Schedule]:
    schedule = schedule_of(op)
    if schedule is None:
        raise DiagnosticException(f"{pass_name}: gemm.matmul @{op.kernel_name.data} has no #gemmc.schedule; "
                                  "compile with gemmc.compile(..., schedule=...) or add "
                                  "`schedule #gemmc.schedule<...>` to the matmul")
    return spec_of(op), schedule


def layout_schedule(op, pass_name: str) -> tuple[GemmSpec, Schedule]:
    """`problem_and_schedule` for the passes that lay the kernel out: they divide by the tile and cluster
    sizes, so a size below 1 stops them here, named, rather than as a ZeroDivisionError. (Every other rule
    is verify-resources': lowering does not need the schedule to be legal for this problem.)"""
    spec, schedule = problem_and_schedule(op, pass_name)
    if min(schedule.tile) < 1 or min(schedule.cluster) < 1:
        tile, cluster = ("x".join(map(str, v)) for v in (schedule.tile, schedule.cluster))
        raise DiagnosticException(f"{pass_name}: #gemmc.schedule<tile = {tile}, cluster = {cluster}> has a size "
                                  "below 1; use positive tile and cluster sizes (verify-resources lists every "
                                  "rule the schedule breaks)")
    return spec, schedule
