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
