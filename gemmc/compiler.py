"""`gemmc.compile`: spec (or traced kernel) + schedule -> IR after each pass -> KernelPlan -> kernel.

    k = gemmc.compile(spec, schedule="auto", arch="sm_90a")
    k.ir()                          # the gemm-level input IR
    k.ir(after="pipeline-staging")  # the IR after one pass
    k.plan                          # the KernelPlan the backend emits from
    k.source                        # CuTe DSL source (built lazily; needs the backend)
    k(a, b, ...)                    # builds/loads the .so and runs it (needs a GPU)

The schedule is checked (gemmc.schedule.check_schedule) before anything else runs.
"""
from __future__ import annotations

import functools
from typing import Optional, Union

from .errors import SpecError
from .ir import make_context, print_module
from .ir.build import spec_to_module
from .ir.extract import plan_from_module
from .ir.plan import KernelPlan
from .m_buckets import MBuckets, runtime_m
from .passes import PIPELINE, pass_pipeline
from .schedule import Schedule, require_valid
from .spec import GemmSpec
from .types import as_arch

SCHEDULE_CHOICES = ("auto", "heuristic")
EMITS = ("kernel", "ir")


def as_spec(spec_or_kernel) -> GemmSpec:
    """A GemmSpec, or the `.spec` of a traced @gemmc.kernel."""
    spec = getattr(spec_or_kernel, "spec", spec_or_kernel)
    if not isinstance(spec, GemmSpec):
        raise SpecError(f"compile() takes a gemmc.GemmSpec or a @gemmc.kernel function, got "
                        f"{type(spec_or_kernel).__name__}")
    return spec


def choose_schedule(spec: GemmSpec, schedule: Union[str, Schedule, dict], arch: Optional[str]) -> Schedule:
    """Resolve `schedule=` to a concrete Schedule for `arch` (not yet checked for validity)."""
    if isinstance(schedule, dict):
        schedule = Schedule.from_dict(schedule)
    if isinstance(schedule, Schedule):
        # an explicit arch wins over the Schedule's default one
        return schedule if arch is None or as_arch(arch) == schedule.arch else schedule.with_(arch=as_arch(arch))
    if schedule not in SCHEDULE_CHOICES:
        raise SpecError(f"schedule={schedule!r}; use 'auto', 'heuristic' or a gemmc.Schedule(...)")
    arch = as_arch(arch or "sm_90a")
    if schedule == "auto":
        return auto_decision(spec, arch).schedule
    from .heuristic import choose_schedule as heuristic_choice
    return heuristic_choice(spec, arch)


def auto_decision(spec: GemmSpec, arch: str):
    """schedule="auto": the tuning DB's exact match, the shipped table's, a tuned neighbour or the policy,
    the shipped table's neighbour, else the heuristic (gemmc/dispatch.py). The Decision says whether
    cuBLAS should run the call instead."""
    from .dispatch import resolve_auto
    return resolve_auto(spec, as_arch(arch))


def lower(spec: GemmSpec, schedule: Schedule, arch: Optional[str] = None) -> tuple[dict[str, str], KernelPlan]:
    """Run the pass pipeline. Returns ({pass name: IR text after it}, KernelPlan).
    Raises ScheduleError if `schedule` is invalid for `spec` (checked before any pass runs)."""
    if arch is not None and as_arch(arch) != schedule.arch:
        schedule = schedule.with_(arch=as_arch(arch))
    require_valid(schedule, spec)
    module = spec_to_module(spec, schedule)
    texts: dict[str, str] = {}
    pass_pipeline(PIPELINE, lambda name, m: texts.__setitem__(name, print_module(m))).apply(make_context(), module)
    return texts, plan_from_module(module)


class CompiledGemm:
    """The result of `gemmc.compile`: IR after each pass, the KernelPlan, and (lazily) the kernel."""

    def __init__(self, spec: GemmSpec, schedule: Schedule, input_ir: str, ir_after: dict[str, str],
                 plan: KernelPlan, emit: str = "kernel"):
        self.spec = spec
        self.schedule = schedule
        self.arch = schedule.arch
        self.passes: tuple[str, ...] = tuple(ir_after)
        self.plan = plan
        self.emit = emit
        self._input_ir = input_ir
        self._ir_after = ir_after
        self.decision = None
        self.m_buckets = None       # set by compile() for a symbolic-M "auto" kernel (gemmc/m_buckets.py)

    def __repr__(self) -> str:
        return f"<gemmc.CompiledGemm {self.spec.name} {self.arch} {self.schedule.short()}>"

    def ir(self, after: Optional[str] = None) -> str:
        """IR text: the gemm-level input (after=None) or the module after pass `after`."""
        if after is None:
            return self._input_ir
        if after not in self._ir_after:
            raise ValueError(f"no pass named {after!r}; passes: {', '.join(self.passes)}")
        return self._ir_after[after]

    # -- the kernel: everything below needs the backend and is built on first use --
    def _need_kernel(self, what: str) -> None:
        if self.emit != "kernel":
            raise SpecError(f"{what} needs a kernel, but this was compiled with emit={self.emit!r}; "
                            "use gemmc.compile(..., emit='kernel')")

    @functools.cached_property
    def emitted(self):
        self._need_kernel("source")
        from .backends import emit
        return emit(self.plan)

    @functools.cached_property
    def kernel(self):
        """The backend kernel (gemmc.compiled.CompiledKernel), keyed in the cache by the final kernel IR."""
        from .compiled import CompiledKernel
        return CompiledKernel(self.emitted, material=self._ir_after[self.passes[-1]], plan=self.plan,
                              spec=self.spec, schedule=self.schedule)

    @property
    def source(self) -> str:
        return self.emitted.source

    def build(self):
        """Build into the kernel cache (no GPU needed) and return the artifact (.so, .ptx). A symbolic-M
        `auto` compile also builds the kernel of every M bucket, so a runtime-only host can serve any M."""
        if self.m_buckets is not None:
            for k in self.m_buckets.kernels():
                if k is not self:
                    k.kernel.build()
        return self.kernel.build()

    @property
    def artifact(self):
        return self.kernel.build()

    @property
    def ptx(self) -> str:
        return self.kernel.ptx

    @property
    def launcher(self):
        self._need_kernel("calling the kernel")
        return self.kernel.launcher

    def __call__(self, *args, **kwargs):
        self._need_kernel("calling the kernel")     # also where "auto" would run torch.matmul: one rule
        if self.m_buckets is not None:          # symbolic M under "auto": the choice follows the runtime M
            m = runtime_m(self.spec, args, kwargs)
            if m is not None and m >= 1:        # an empty A (M = 0) has no bucket: the default path takes it
                decision, kernel = self.m_buckets.route(m)
                if kernel is None:
                    return _cublas_call(self.spec, *args, **kwargs)
                return kernel.launcher(*args, **kwargs)     # the bucket's kernel (may be this one)
        if self.decision is not None and self.decision.use_cublas:
            return _cublas_call(self.spec, *args, **kwargs)
        return self.launcher(*args, **kwargs)

    def for_m(self, m: int):
        """What a call with M rows runs: (Decision, CompiledGemm or None for torch.matmul). Only a
        symbolic-M `auto` compile chooses per M; any other returns its one choice."""
        if self.m_buckets is None:
            return self.decision, (None if self.decision is not None and self.decision.use_cublas else self)
        return self.m_buckets.route(m)


def _cublas_call(spec: GemmSpec, a, b, out=None):
    """torch.matmul for a plain GEMM (no epilogue) where `auto` chose cuBLAS (gemmc/dispatch.py)."""
    import torch
    a_mk = a if spec.a_layout == "mk" else a.transpose(-2, -1)
    b_kn = b.transpose(-2, -1) if spec.b_layout == "nk" else b
    if out is None:
        return torch.matmul(a_mk, b_kn)
    return torch.matmul(a_mk, b_kn, out=out)


def compile(spec_or_kernel, schedule: Union[str, Schedule, dict] = "auto", arch: Optional[str] = None,
            emit: str = "kernel") -> CompiledGemm:
    """Compile a GEMM. `schedule`: "auto" | "heuristic" | a gemmc.Schedule; `arch`: "sm_90a" | "sm_80"
    (default: the Schedule's, else sm_90a); `emit="ir"` stops after the passes. Under "auto" with a
    symbolic M, calls choose per runtime M bucket (gemmc/m_buckets.py; `k.for_m(M)` shows the choice)."""
    if emit not in EMITS:
        raise SpecError(f"emit={emit!r}; use one of {EMITS}")
    spec = as_spec(spec_or_kernel)
    decision = auto_decision(spec, arch or "sm_90a") if schedule == "auto" else None
    chosen = decision.schedule if decision is not None else choose_schedule(spec, schedule, arch)
    require_valid(chosen, spec)
    input_ir = print_module(spec_to_module(spec, chosen))
    ir_after, plan = lower(spec, chosen)
    k = CompiledGemm(spec, chosen, input_ir, ir_after, plan, emit)
    k.decision = decision       # where "auto" got the schedule, and whether cuBLAS is faster here
    if decision is not None and not isinstance(spec.m, int):
        k.m_buckets = MBuckets(spec, chosen.arch, chosen, k,
                               lambda s: compile(spec, schedule=s, arch=chosen.arch, emit=emit))
    return k
