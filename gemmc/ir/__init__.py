"""gemmc's IR: the `gemmc` attributes, the `gemm` dialect (what to compute) and the `kernel`
dialect (how), on xDSL. `KernelPlan` (plan.py) is the kernel level read back as plain data."""
from __future__ import annotations

from io import StringIO

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from .attrs import Gemmc, ScheduleAttr, TensorType  # noqa: F401
from .gemm import Gemm, MatmulOp  # noqa: F401
from .kernel import Kernel, KernelGemmOp  # noqa: F401

DIALECTS = (Gemmc, Gemm, Kernel)


def make_context() -> Context:
    ctx = Context()
    for d in (Builtin, *DIALECTS):
        if d.name not in ctx.registered_dialect_names:
            ctx.load_dialect(d)
    return ctx


def print_module(module: ModuleOp) -> str:
    out = StringIO()
    Printer(stream=out).print_op(module)
    return out.getvalue() + "\n"


def parse_module(text: str, ctx: Context | None = None) -> ModuleOp:
    """Parse IR text (as printed by `print_module`) and verify it."""
    module = Parser(ctx or make_context(), text).parse_module()
    module.verify()
    return module
