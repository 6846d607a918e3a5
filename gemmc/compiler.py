"""`gemmc.compile`: spec (or traced kernel) + schedule -> IR after each pass -> KernelPlan -> kernel.

    k = gemmc.compile(spec, schedule="auto", arch="sm_90a")
    k.ir()                          # the gemm-level input IR
    k.ir(after="pipeline-staging")  # the IR after one pass
    k.plan                          # the KernelPlan the backend emits from
    k.source                        # CuTe DSL source (built lazily; needs the backend)
    k(a, b, ...)                    # builds/loads the .so and runs it (needs a GPU)
    gemmc.compile(spec, cache_dir="/opt/gemmc-cache").build()   # ahead of time, into a chosen cache

The schedule is checked (gemmc.schedule.check_schedule) before anything else runs.
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import Optional, Union

from .choose.decision import Decision
from .choose.m_buckets import BUCKETS, M_BUCKETS, MBuckets, range_label, runtime_m
from .choose.resolve import resolve_schedule, tuning_db_for
from .errors import LaunchError, PerformanceWarning, SpecError
from .ir import make_context, print_module
from .ir.build import spec_to_module
from .ir.extract import plan_from_module
from .ir.plan import KernelPlan
from .passes import PIPELINE, pass_pipeline
from .schedule import Schedule, alignment_violations, require_valid
from .spec import GemmSpec, Ref
from .types import as_arch

EMITS = ("kernel", "ir")


def as_spec(spec_or_kernel) -> GemmSpec:
    """A GemmSpec, or the `.spec` of a traced @gemmc.kernel."""
    spec = getattr(spec_or_kernel, "spec", spec_or_kernel)
    if not isinstance(spec, GemmSpec):
        raise SpecError(f"compile() takes a gemmc.GemmSpec or a @gemmc.kernel function, got "
                        f"{type(spec_or_kernel).__name__}")
    return spec


def as_cache_dir(cache_dir, flag: str = "") -> Path:
    """`compile(cache_dir=...)` (or the CLI's `flag`, e.g. "--cache-dir") as an absolute path, `~` expanded;
    a file in its place is refused before anything compiles. A folder that cannot be made or written is
    the cache's BuildError, on the first build."""
    try:
        path = os.fspath(cache_dir)
    except TypeError:
        path = cache_dir
    said, left_out = (f"{flag} {path}", flag) if flag else (f"cache_dir={path!r}", "cache_dir")
    if not isinstance(path, str) or not path:
        raise SpecError(f"{said}: not a folder's path (a str or os.PathLike); pass one, or leave {left_out} out "
                        "to use GEMMC_CACHE_DIR (default ~/.cache/gemmc)")
    root = Path(os.path.abspath(os.path.expanduser(path)))
    if root.exists() and not root.is_dir():
        raise SpecError(f"{said}: {root} is a file, not a folder; pass a folder (made on the first build if "
                        f"missing), or leave {left_out} out to use GEMMC_CACHE_DIR (default ~/.cache/gemmc)")
    return root


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
    """The result of `gemmc.compile`: IR after each pass, the KernelPlan, and (lazily) the kernel.

    Calls take (a, b, *spec.inputs), or, compiled from a @gemmc.kernel function, that function's own
    parameters (`signature`, a runtime.CallSignature): its order, its names, its defaults.

    `build()` builds into the kernel cache (`cache_dir`, else GEMMC_CACHE_DIR's) and returns the artifact of
    this kernel; `artifacts` maps each runtime M bucket's range ("3..4"; see gemmc.choose.m_buckets.M_BUCKETS) to
    the Artifact its calls load, building as needed, or to None where they run torch.matmul. A compile
    without M buckets (static M, or a fixed schedule) maps "all" to its one: its artifact, or None where
    `auto` runs torch.matmul. `m_buckets.describe()` lists each bucket's decision."""

    def __init__(self, spec: GemmSpec, schedule: Schedule, input_ir: str, ir_after: dict[str, str],
                 plan: KernelPlan, emit: str = "kernel", signature=None, cache_dir: Optional[Path] = None):
        self.spec = spec
        self.cache_dir = cache_dir    # None: GEMMC_CACHE_DIR's cache (gemmc.cache.default_cache)
        self.signature = signature
        # where a call's A operand is, for the per-M choice: (position, name)
        self._a_arg = (0, "a")
        if signature is not None:
            a_name = dict(signature.operands)["a"]
            self._a_arg = (signature.position(a_name), a_name)
        self.schedule = schedule
        self.arch = schedule.arch
        self.passes: tuple[str, ...] = tuple(ir_after)
        self.plan = plan
        self.emit = emit
        self._input_ir = input_ir
        self._ir_after = ir_after
        self.decision = None
        self.m_buckets = None       # set by compile() for a symbolic-M "auto" kernel (gemmc/choose/m_buckets.py)
        self._fallback = None       # the torch.matmul route of calls no kernel takes (auto, plain GEMMs)
        self._fallback_warned = False
        self._routes = None         # {runtime M: the callable it runs}: the call path's table (see __call__)
        self._m_axis = -2 if spec.a_layout == "mk" else -1      # where A's shape holds M

    def __repr__(self) -> str:
        return f"<gemmc.CompiledGemm {self.spec.name} {self.arch} {self.schedule.short()}>"

    def ir(self, after: Optional[str] = None) -> str:
        """IR text: the gemm-level input (after=None, or "input" as `gemmc compile --print-ir-after` names it)
        or the module after pass `after` (one of `passes`)."""
        if after is None or after == "input":
            return self._input_ir
        if after not in self._ir_after:
            raise SpecError(f"ir(after={after!r}): no such pass; use one of: input, {', '.join(self.passes)} "
                            "(input, or None: the IR before any pass)")
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
        from .cache import cache_at
        cache = cache_at(self.cache_dir) if self.cache_dir is not None else None
        return CompiledKernel(self.emitted, material=self._ir_after[self.passes[-1]], plan=self.plan,
                              spec=self.spec, schedule=self.schedule, signature=self.signature, cache=cache)

    @functools.cached_property
    def cublas_route(self):
        """The route `auto` takes where cuBLAS won: torch.matmul behind the kernel's own argument checks
        (`CublasRoute`); for an fp8 GEMM, torch._scaled_mm (gemmc.scaled_mm.ScaledMmRoute)."""
        self._need_kernel("calling the kernel")
        if self.spec.scaling is not None:
            from .scaled_mm import ScaledMmRoute
            return ScaledMmRoute(self.spec, self.emitted.params, name=self.emitted.entry, signature=self.signature)
        return CublasRoute(self.spec, self.emitted.params, name=self.emitted.entry, signature=self.signature)

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
    def artifacts(self) -> dict:
        """{M range label: Artifact, or None where torch.matmul runs}: the cache entry each runtime M bucket
        loads (built as needed); {"all": ...} without M buckets. See the class docstring."""
        self._need_kernel("artifacts")
        if self.m_buckets is None:
            cublas = self.decision is not None and self.decision.use_cublas
            return {"all": None if cublas else self.artifact}
        out = {}
        for rng, b in zip(M_BUCKETS, BUCKETS):
            _, kernel = self.m_buckets.route(b)
            out[range_label(*rng)] = None if kernel is None else kernel.artifact
        return out

    @property
    def ptx(self) -> str:
        return self.kernel.ptx

    @property
    def launcher(self):
        self._need_kernel("calling the kernel")
        return self.kernel.launcher

    def __call__(self, *args, **kwargs):
        # The fast path: the route of each runtime M seen before (the bucket's launcher, or the cuBLAS route)
        # is one dict lookup away; everything else (the first call at an M, a named A, an empty A) takes
        # _call_resolving, which fills the table.
        routes = self._routes
        if routes is not None:
            try:
                run = routes[args[self._a_arg[0]].shape[self._m_axis]]
            except (KeyError, IndexError, AttributeError, TypeError):
                run = None
            if run is not None:
                try:
                    return run(*args, **kwargs)
                except LaunchError as e:
                    return self._after_refusal(e, args, kwargs)
        return self._call_resolving(args, kwargs)

    def _call_resolving(self, args, kwargs):
        self._need_kernel("calling the kernel")     # also where "auto" would run torch.matmul: one rule
        try:
            return self._call(args, kwargs)
        except LaunchError as e:
            return self._after_refusal(e, args, kwargs)

    def _after_refusal(self, refused: LaunchError, args, kwargs):
        if self.decision is None or output_casts(self.spec) is None or self.spec.grouped:
            raise refused       # an epilogue only a kernel runs; a grouped GEMM has no torch.matmul route
        # `auto` on a plain GEMM: a call no kernel takes (a dim or stride off 16-byte alignment, a batch past a
        # grid limit) runs torch.matmul behind the spec's checks, which still refuse a wrong dtype or shape
        if self._fallback is None:
            self._fallback = CublasOnlyGemm(self.spec, self.arch, f"a call the kernel refused: {refused}",
                                            signature=self.signature)
        try:
            result = self._fallback(*args, **kwargs)
        except LaunchError:
            raise refused from None     # refused by both: the kernel route's message is the one to read
        if not self._fallback_warned:       # once per compiled GEMM, for a call torch.matmul did run
            self._fallback_warned = True
            warnings.warn(f"gemmc: {self.spec.name}: `auto` runs torch.matmul for calls no gemmc kernel takes "
                          f"({refused})", PerformanceWarning, stacklevel=3)
        return result

    def _route_of(self, m: Optional[int]):
        """The callable a call with M rows runs (a launcher, or the cuBLAS route). None: M has no route of its
        own (an empty A, or no A found), and the call takes the default path."""
        if self.m_buckets is not None:          # symbolic M under "auto": the choice follows the runtime M
            if m is None or m < 1:              # an empty A (M = 0) has no bucket: the default path takes it
                return None
            _, kernel = self.m_buckets.route(m)
            return self.cublas_route if kernel is None else kernel.launcher     # the bucket's (may be this one)
        if self.decision is not None and self.decision.use_cublas:
            return self.cublas_route
        return self.launcher

    def _remember_route(self, m: int, run) -> None:
        routes = self._routes
        if routes is None:
            routes = self._routes = {}
        elif len(routes) >= 4096:      # a serving loop sees many distinct M: keep the table bounded
            routes.clear()
        routes[m] = run

    def _call(self, args, kwargs):
        position, name = self._a_arg
        a = args[position] if len(args) > position else kwargs.get(name)
        m = runtime_m(self.spec, (a,), {})
        return self.runner_for(m)(*args, **kwargs)

    def runner_for(self, m: Optional[int]):
        """What a call with M rows runs: the kernel's launcher (a runtime.Launcher, which takes the call's
        arguments), or the cuBLAS route (a CublasRoute). Callers that know M already (gemmc.torch_ops) call it
        directly; calls through the object itself reach it once per M. None or M < 1: the default path."""
        routes = self._routes
        run = routes.get(m) if routes is not None else None
        if run is not None:
            return run
        self._need_kernel("calling the kernel")
        run = self._route_of(m)
        if run is None:
            return self.cublas_route if self.decision is not None and self.decision.use_cublas else self.launcher
        if m is not None and m >= 1:
            self._remember_route(m, run)
        return run

    def prepare(self, ms) -> list:
        """Make calls with these row counts launch with nothing left to do first: build (or find in the cache)
        the kernel of each M's bucket, load it where a GPU is visible, and set up its route. Run it before
        capturing a CUDA graph: a capture cannot build or load a kernel. Returns [(M, what runs it)], where
        what runs it is a schedule's short name or "torch.matmul". On a host without a GPU it only builds."""
        self._need_kernel("prepare()")
        wanted = _row_counts(self.spec, ms)
        from .runtime import visible_arch
        load = visible_arch() is not None
        done = []
        for m in wanted:
            _, kernel = self.for_m(m)
            if kernel is None:
                run, what = self.cublas_route, "torch.matmul"
            else:
                kernel.kernel.build()
                run, what = kernel.launcher, kernel.schedule.short()
                if load:
                    run.function       # loads the .so now, not during a capture
            self._remember_route(m, run)
            done.append((m, what))
        return done

    def for_m(self, m: int):
        """What a call with M rows runs: (Decision, CompiledGemm or None for torch.matmul). Only a
        symbolic-M `auto` compile chooses per M; any other returns its one choice."""
        if self.m_buckets is None:
            return self.decision, (None if self.decision is not None and self.decision.use_cublas else self)
        return self.m_buckets.route(m)


def output_casts(spec: GemmSpec) -> Optional[tuple]:
    """The roundings a torch.matmul route applies to the f32 product, in order, the last to `out_dtype`: ()
    for a plain GEMM, and a spec whose epilogue only casts the accumulator (an output dtype of its own, a
    chain of casts) has them. None: the epilogue computes something (or reads an input), which only a
    kernel runs."""
    if spec.inputs or spec.scaling is not None:     # fp8: torch.matmul cannot run it (torch._scaled_mm may)
        return None
    casts = []
    for i, op in enumerate(spec.epilogue):
        if op.op != "cast" or tuple(op.args) != ((Ref.acc(),) if i == 0 else (Ref.node(i - 1),)):
            return None
        casts.append(op.attr("dtype"))
    return () if not casts and spec.out_dtype == spec.dtype else (*casts, spec.out_dtype)


def _f32_product(a, b):
    """a @ b accumulated and returned in f32, as a kernel's accumulator holds it: cuBLAS's f32-output GEMM on
    a GPU (torch.mm / bmm with out_dtype), else an f32 matmul."""
    import torch
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and a.dim() in (2, 3):
        try:
            return (torch.mm if a.dim() == 2 else torch.bmm)(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):      # a torch without the out_dtype overload
            pass
    return torch.matmul(a.float(), b.float())


def _row_counts(spec: GemmSpec, ms) -> list:
    """`prepare(ms)`'s row counts as a list, each checked: an int >= 1, and M itself for a static-M spec."""
    wanted = list(ms)
    for m in wanted:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise SpecError(f"prepare(): row counts must be ints >= 1, got {m!r}")
        if isinstance(spec.m, int) and m != spec.m:
            raise SpecError(f"prepare(): {spec.name} was compiled for a static M = {spec.m}, so calls cannot "
                            f"have M = {m}; compile with a symbolic M (e.g. m='M')")
    return wanted


def _layout_matmul(spec: GemmSpec):
    """`matmul(a, b, out)`: torch.matmul into `out` of operands in the spec's storage layouts (an A stored
    [K, M] or a B stored [N, K] is transposed first); the function of both torch.matmul routes. With output
    casts (`output_casts`) the f32 product is rounded through each, as the kernel's epilogue would."""
    import torch
    from .types import torch_dtype
    a_km, b_nk = spec.a_layout == "km", spec.b_layout == "nk"
    casts = [torch_dtype(d) for d in output_casts(spec) or ()]

    def matmul(a, b, out):
        torch.matmul(a.mT if a_km else a, b.mT if b_nk else b, out=out)

    def matmul_cast(a, b, out):
        y = _f32_product(a.mT if a_km else a, b.mT if b_nk else b)
        for dt in casts[:-1]:
            y = y.to(dt)
        out.copy_(y)        # the last rounding, to out's dtype
    return matmul_cast if casts else matmul


class CublasRoute:
    """torch.matmul for a plain GEMM (no epilogue) where `auto` chose cuBLAS (gemmc/choose/auto.py), behind the
    kernel's own argument checks: `params` are the kernel's (its EmittedKernel's) and runtime.python_prologue
    checks them as the kernel's compiled prologue does, so a call passes or fails alike on either route
    (whatever M bucket it falls in), with the validator's LaunchError, and `out=` receives the result in place.
    The checks cost a few microseconds (it is timed against torch.matmul): the messages are built only
    when they fail. `device_type="cpu"` is for the tests."""

    def __init__(self, spec: GemmSpec, params, *, name: str = "gemm", signature=None, device_type: str = "cuda"):
        import torch
        from .runtime import Launcher, python_prologue
        if spec.has_epilogue:
            raise SpecError(f"{spec.name} has an epilogue or an output cast, which torch.matmul cannot run; "
                            "compile it with a gemmc schedule")
        self.spec = spec
        tensors = tuple(p for p in params if p.kind == "tensor")     # no split-K scratch: cuBLAS needs none
        roles = [p.role for p in tensors]
        if roles != ["a", "b", "out"]:
            raise SpecError(f"{spec.name}: the cuBLAS route takes the params a, b, out in that order, got {roles}")
        self._check = check = python_prologue(tensors, device_type)
        self._a_km, self._b_nk = spec.a_layout == "km", spec.b_layout == "nk"
        self._torch_matmul = torch.matmul
        unchecked = _layout_matmul(spec)

        def matmul(a, b, out):      # the launcher's function (kernel order), for launcher(...) calls
            check(a, b, out)
            unchecked(a, b, out)

        # binds the caller's arguments and, when the checks fail, says what is wrong (the validator)
        self.launcher = Launcher(tensors, function=matmul, name=name, device_type=device_type,
                                 signature=signature)
        self._a_first = self.launcher.signature.names[0] == self.launcher.params[0].name

    def __call__(self, *args, out=None, **named):
        if named or len(args) != 2:
            args = self.launcher.signature.bind(args, named)
        a, b = args if self._a_first else (args[1], args[0])
        try:
            self._check(a, b, out)
        except (TypeError, ValueError) as e:
            self.launcher.validate(*args, out=out)      # raises the LaunchError that says what to change
            if a.numel() and b.numel() and (out is None or out.numel()):
                raise LaunchError(f"{self.launcher.name}: the cuBLAS route rejected its arguments: {e}") from e
            # an empty problem (strides of empty tensors are arbitrary): torch.matmul handles it
        a = a.mT if self._a_km else a
        b = b.mT if self._b_nk else b
        return self._torch_matmul(a, b) if out is None else self._torch_matmul(a, b, out=out)


class CublasOnlyGemm:
    """What `schedule="auto"` gives a plain GEMM (or one whose epilogue only casts its output: `output_casts`)
    that no gemmc kernel can run: a static dim breaks the kernels' 16-byte alignment (e.g. a vocabulary of
    N = 32001). Calls run torch.matmul behind the spec's dtype, rank and shape checks (any strides: torch takes
    them), with a @gemmc.kernel function's own arguments; an output cast rounds the f32 product as the kernel
    would. There is no IR, plan or kernel to show (`passes` is empty, `schedule` None); `k.decision` says why.
    It answers CompiledGemm's other attributes alike, so code written for one runs on the other."""

    passes: tuple[str, ...] = ()
    m_buckets = None

    def __init__(self, spec: GemmSpec, arch: str, why: str, *, signature=None, device_type: str = "cuda",
                 cache_dir: Optional[Path] = None):
        from .backends import Param
        from .runtime import Launcher
        self.spec, self.arch, self.signature, self.why = spec, arch, signature, why
        self.cache_dir = cache_dir
        self.schedule = None
        self.decision = Decision(Schedule(arch=arch), "alignment", use_cublas=True,
                                 detail=f"no gemmc kernel takes this problem ({why}): torch.matmul runs it")
        lead = (spec.batch,) if spec.batch is not None else ()
        a_km, b_nk = spec.a_layout == "km", spec.b_layout == "nk"
        params = (Param("a", "tensor", spec.dtype, lead + ((spec.k, spec.m) if a_km else (spec.m, spec.k)), role="a"),
                  Param("b", "tensor", spec.dtype, lead + ((spec.n, spec.k) if b_nk else (spec.k, spec.n)), role="b"),
                  Param("out", "tensor", spec.out_dtype, lead + (spec.m, spec.n), role="out"))

        self.launcher = Launcher(params, function=_layout_matmul(spec), name=spec.name, device_type=device_type,
                                 signature=signature, always_validate=True, strided=True,
                                 zero_k=lambda a, b, inputs, out: out.zero_())

    def __call__(self, *args, **kwargs):
        return self.launcher(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<gemmc.CublasOnlyGemm {self.spec.name}: torch.matmul ({self.why})>"

    def for_m(self, m: int):
        return self.decision, None

    def build(self):
        """Nothing to build: torch.matmul runs every call."""
        return None

    @property
    def artifact(self):
        """None: no cache entry (see `build`)."""
        return None

    @property
    def artifacts(self) -> dict:
        """{"all": None}: torch.matmul runs every call (see CompiledGemm.artifacts)."""
        return {"all": None}

    def prepare(self, ms) -> list:
        """[(M, "torch.matmul")] for each row count: nothing to build or load (see CompiledGemm.prepare)."""
        wanted = _row_counts(self.spec, ms)
        return [(m, "torch.matmul") for m in wanted]

    def _no_kernel(self, what: str):
        return SpecError(f"{what}: `auto` runs torch.matmul for {self.spec.name}: no gemmc kernel takes it "
                         f"({self.why})")

    def ir(self, after: Optional[str] = None) -> str:
        raise self._no_kernel("no IR")

    @property
    def source(self) -> str:
        raise self._no_kernel("no kernel source")

    @property
    def ptx(self) -> str:
        raise self._no_kernel("no PTX")

    @property
    def plan(self):
        raise self._no_kernel("no plan")


def compile(spec_or_kernel, schedule: Union[str, Schedule, dict] = "auto", arch: Optional[str] = None,
            emit: str = "kernel", cache_dir: Union[str, os.PathLike, None] = None
            ) -> Union[CompiledGemm, CublasOnlyGemm]:
    """Compile a GEMM. `schedule`: "auto" | "heuristic" | a gemmc.Schedule; `arch`: "sm_90a" | "sm_80"
    (default: the Schedule's, else sm_90a; one that differs from a Schedule's is a SpecError, while a dict
    that names no arch takes it); `emit="ir"` stops after the passes. Under "auto" with a symbolic M, calls
    choose per runtime M bucket (gemmc/choose/m_buckets.py; `k.for_m(M)` shows the choice). "auto" on a plain GEMM,
    or one whose epilogue only casts its output, that no kernel can run (a static dim off 16-byte alignment)
    returns a CublasOnlyGemm, whose calls run torch.matmul and whose `schedule` is None.
    `cache_dir`: the kernel cache folder every kernel of this compile (each M bucket's too) is built into and
    loaded from, instead of GEMMC_CACHE_DIR's; "auto" then reads the tuning DB in it (`tuning.sqlite`)
    unless GEMMC_TUNING_DB is set, as `gemmc build --cache-dir` does. A file there is a SpecError."""
    if emit not in EMITS:
        raise SpecError(f"emit={emit!r}; use one of {EMITS}")
    root = as_cache_dir(cache_dir) if cache_dir is not None else None
    spec = as_spec(spec_or_kernel)
    # a @gemmc.kernel function's calls take its own parameters (gemmc.dsl.Kernel.call_signature)
    signature = getattr(spec_or_kernel, "call_signature", None) if spec_or_kernel is not spec else None
    if schedule == "auto" and output_casts(spec) is not None and not spec.grouped:
        unaligned = alignment_violations(spec)       # no kernel can run it; torch.matmul can
        if unaligned:
            return CublasOnlyGemm(spec, as_arch(arch or "sm_90a"), "; ".join(map(str, unaligned)),
                                  signature=signature, cache_dir=root)
    db = tuning_db_for(root)
    chosen, decision = resolve_schedule(spec, schedule, arch, db=db)
    require_valid(chosen, spec)
    input_ir = print_module(spec_to_module(spec, chosen))
    ir_after, plan = lower(spec, chosen)
    k = CompiledGemm(spec, chosen, input_ir, ir_after, plan, emit, signature=signature, cache_dir=root)
    k.decision = decision       # where "auto" got the schedule, and whether cuBLAS is faster here
    if decision is not None and not isinstance(spec.m, int):
        k.m_buckets = MBuckets(spec, chosen.arch, chosen, k,
                               lambda s: compile(spec_or_kernel, schedule=s, arch=chosen.arch, emit=emit,
                                                 cache_dir=root), db=db)
    return k
