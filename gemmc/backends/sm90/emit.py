"""Emit an SM90 kernel module from a `KernelPlan`: the plan's facts and the epilogue DAG, over the kernel modules.

The kernel itself is ordinary CuTe DSL code in gemmc/backends/sm90/kernel/ (tile scheduler, producer, consumer
main loop, fix-up, epilogue), which branches on the facts with `cutlass.const_expr`. What this emits varies per
kernel and nothing else:
  constants  : every plan fact as a module-level constant, its comment naming the pass that decided it
  epilogue   : `epilogue_dag`, the plan's epilogue ops on one f32 accumulator element (when it has any); under
               split_k_mode serial the reduce kernel that applies them instead, and `reduce_partials`, its launch
  entry      : the @cute.jit host function (the compiled function's parameters, in order), which hands the
               tensors to `KERNEL`, the kernel modules' Sm90Gemm built from the constants
No text is rewritten after it is generated. The module's docstring names the kernel modules and the digest of
their source, so the kernel cache key (over `k.source`) changes when they do. The PTX comes from compiling with
`--keep-ptx --dump-dir <dir>` (the compiled object's `__ptx__`; see gemmc/build.py).
"""
from __future__ import annotations

from ...errors import BuildError
from ...ir.plan import KernelPlan
from ...spec import EpilogueOp, Ref
from ...types import FP8_DTYPES, DType
from .. import GRID_YZ_MAX, GROUP_ROLES, EmittedKernel, Param, group_param
from ..common import (check_input_names, dsl_type, epilogue_math_lines, input_kernel_args, input_value_expr,
                      private_inputs, rebind_inputs, splitk_reduce)
from .kernel import MODULES, source_digest
from .scales import epilogue_with_scales, scale_inputs, scale_shapes_of

_SWIZZLE_KIND = {128: "SW128", 64: "SW64", 32: "SW32", 0: "INTER"}
KERNEL_PACKAGE = "gemmc.backends.sm90.kernel"


def _check(plan: KernelPlan) -> None:
    p = plan.problem
    if plan.arch != "sm_90a":
        raise BuildError(f"the SM90 backend got a plan for {plan.arch}; use gemmc.backends.emit(plan)")
    if plan.mode not in ("cooperative", "pingpong"):
        raise BuildError(f"SM90 mode {plan.mode!r} is not cooperative or pingpong")
    fp8 = plan.scaling is not None
    for dt in (p.a_dtype, p.b_dtype):
        if dt not in ((DType.bf16, DType.f16) if not fp8 else FP8_DTYPES):
            raise BuildError(f"SM90 inputs must be bf16 or f16 (fp8 with a scaling), got {dt}"
                             + (" with a scaling" if fp8 else ""))
    if plan.mma.kind != "wgmma":
        raise BuildError(f"SM90 plan has MMA kind {plan.mma.kind!r}; expected 'wgmma'")
    if plan.mma.inst_shape[2] != (32 if fp8 else 16):
        raise BuildError(f"SM90 plan's MMA K is {plan.mma.inst_shape[2]} for {p.a_dtype} operands; wgmma takes "
                         f"{32 if fp8 else 16}")
    prod, cons = plan.role("producer"), plan.role("consumer")
    if len(prod) != 1 or prod[0].index != 0 or len(cons) != 2 or sorted(w.index for w in cons) != [1, 2]:
        raise BuildError("SM90 plans need warpgroup 0 = producer and warpgroups 1, 2 = consumers; got "
                         f"{plan.warpgroups}")
    if plan.threads != 128 * len(plan.warpgroups):
        raise BuildError(f"plan.threads={plan.threads} does not match {len(plan.warpgroups)} warpgroups")
    for op in ("a", "b"):
        c = plan.copy(op)
        if c.kind != "tma":
            raise BuildError(f"SM90 operand {op} copy kind {c.kind!r}; expected 'tma'")
    if (plan.groups is not None) != (p.group_layout is not None):
        raise BuildError("a grouped problem's plan needs its kernel.group fact (run map-groups), and only a grouped "
                         f"problem has one (problem groups {p.groups!r}, plan groups {plan.groups})")
    want_c = "st_global" if plan.swap_ab or plan.groups is not None else "tma_store"
    if plan.copy("out").kind != want_c:
        raise BuildError(f"SM90 store copy kind {plan.copy('out').kind!r}; expected {want_c!r} "
                         f"(swap_ab={plan.swap_ab}, grouped={plan.groups is not None})")
    if plan.groups is not None and (plan.swap_ab or plan.scheduler.split_k_mode != "none"
                                    or plan.scheduler.swizzle != 1 or plan.mma.atom_layout[1] != 1
                                    or plan.groups.layout != p.group_layout):
        raise BuildError("a grouped SM90 plan takes whole tiles of one group, its warpgroups along M: it needs "
                         f"swap_ab off, no split-K or stream-K, swizzle 1 and its problem's layout (got swap_ab="
                         f"{plan.swap_ab}, split_k_mode {plan.scheduler.split_k_mode!r}, swizzle "
                         f"{plan.scheduler.swizzle}, MMA atoms {plan.mma.atom_layout}, layout {plan.groups.layout!r})")
    if plan.swap_ab and plan.scheduler.split_k_mode == "serial":
        raise BuildError("a swapped (swap_ab) SM90 plan sums its split-K partials in the kernel: use "
                         "split_k_mode fixup (Schedule picks it for every swapped split)")
    if plan.scheduler.split_k_mode == "stream" and (plan.mode != "cooperative" or plan.scheduler.split_k != 1):
        raise BuildError("SM90 stream-K is built for cooperative kernels with split_k 1; the plan has mode "
                         f"{plan.mode!r}, split_k {plan.scheduler.split_k}")
    if plan.scheduler.split_k > 1 and plan.scheduler.split_k_mode not in ("fixup", "serial"):
        raise BuildError(f"SM90 split-K sums its partials in the kernel (fixup) or in a second one (serial); "
                         f"the plan says split_k_mode {plan.scheduler.split_k_mode!r}")
    for inp in plan.epilogue.inputs:
        if inp.kind != "scalar" and inp.dtype not in (DType.bf16, DType.f16, DType.f32):
            raise BuildError(f"epilogue input {inp.name} has dtype {inp.dtype}")
    if p.gate is not None and (plan.swap_ab or plan.scheduler.split_k > 1 or plan.scheduler.split_k_mode != "none"
                               or plan.mma.atom_layout[1] != 1):
        raise BuildError("a gated SM90 plan gates whole tiles in registers: it needs swap_ab off, no split-K or "
                         f"stream-K, and the warpgroups along M (got swap_ab={plan.swap_ab}, split_k_mode "
                         f"{plan.scheduler.split_k_mode!r}, MMA atoms {plan.mma.atom_layout})")


def params_of(plan: KernelPlan) -> tuple[Param, ...]:
    """The compiled function's arguments, in order (the stream follows them)."""
    p = plan.problem
    lead = b_lead = (p.batch,) if p.batch is not None else ()
    if p.group_layout is not None:      # one weight per group; A and the output E x M x . only when masked
        b_lead, lead = (p.groups,), ((p.groups,) if p.group_layout == "masked" else ())
    a_shape = (p.m, p.k) if p.a_major == "k" else (p.k, p.m)
    b_rows = 2 * p.n if p.gate is not None else p.n     # gated: B is [gate; up]
    b_shape = (b_rows, p.k) if p.b_major == "k" else (p.k, p.n)
    out = [Param("a", "tensor", p.a_dtype, lead + a_shape, role="a"),
           Param("b", "tensor", p.b_dtype, b_lead + b_shape, role="b"),
           *(Param(name, "tensor", DType.f32, shape, role="scale") for name, shape in scale_shapes_of(plan))]
    if p.group_layout is not None:
        out.append(group_param(p.group_layout, p.groups))
    # the serial split-K reduce kernel's grid y extent is the batch (the persistent grid has no such limit)
    out.append(Param("out", "tensor", p.out_dtype, lead + (p.m, p.n), role="out",
                     limits=((0, GRID_YZ_MAX),) if lead and plan.scheduler.split_k > 1
                     and plan.scheduler.split_k_mode == "serial" else ()))
    for inp in plan.epilogue.inputs:
        if inp.kind == "scalar":
            out.append(Param(inp.name, "scalar", DType.f32, (), role="scalar"))
        else:
            shape = {"row": (p.n,), "col": (p.m,), "full": (p.m, p.n)}[inp.kind]
            out.append(Param(inp.name, "tensor", inp.dtype, lead + shape, role="input"))
    sk = plan.scheduler.split_k
    batch = _dim_expr(p.batch if p.batch is not None else 1)
    if sk > 1 and plan.scheduler.split_k_mode == "serial":
        elems = f"{sk} * ({batch}) * ({_dim_expr(p.m)}) * ({_dim_expr(p.n)})"
        # flat f32 partials, viewed in the kernel as (M, N, SPLIT_K * L): split s of batch l at s * L + l
        out.append(Param("workspace", "workspace", DType.f32, (elems,), role="workspace",
                         workspace_elems=elems))
    elif sk > 1 or plan.scheduler.split_k_mode == "stream":
        # flat f32 partials in register-fragment order: SPLIT_K per (padded) output tile under the fix-up;
        # under stream-K two per CTA slot (a CTA's first and last pieces are its only split ones). One i32
        # arrival counter per tile, which the runtime hands over zeroed and the kernel leaves zeroed
        bm, bn, _ = plan.tile
        cm, cn = plan.cluster
        km, kn = (p.n, p.m) if plan.swap_ab else (p.m, p.n)     # the kernel's (M, N): swapped, out^T's
        tiles = (f"({batch}) * (((({_dim_expr(km)}) + {bm * cm - 1}) // {bm * cm}) * {cm})"
                 f" * (((({_dim_expr(kn)}) + {bn * cn - 1}) // {bn * cn}) * {cn})")   # whole clusters
        slots = plan.scheduler.max_active_clusters
        elems = (str(2 * slots * cm * cn * bm * bn) if plan.scheduler.split_k_mode == "stream"
                 else f"{sk * bm * bn} * {tiles}")
        out.append(Param("workspace", "workspace", DType.f32, (elems,), role="workspace", workspace_elems=elems))
        out.append(Param("semaphores", "semaphore", DType.i32, (tiles,), role="semaphore", workspace_elems=tiles))
    return tuple(out)


def _dim_expr(d) -> str:
    return str(d)


def _mul_dim(k: int, d):
    return k * d if isinstance(d, int) else f"{k}*{d}"


def tma_inputs(plan: KernelPlan, user_inputs, inputs) -> list:
    """Full (M x N) epilogue inputs the plan loads with TMA into smem, per epilogue sub-tile, as (the kernel's
    input, `inputs`' one in its place: private_inputs' renamed twin). Inputs without a copy in the plan, or
    with kind "ldg", are read straight from global memory."""
    kinds = {c.operand: c.kind for c in plan.copies if c.operand not in ("a", "b", "out")}
    return [(u, x) for u, x in zip(user_inputs, inputs) if u.kind == "full" and kinds.get(u.name) == "tma"]


def _smem_atom(major_is_k: bool, swizzle_bytes: int) -> str:
    kind = _SWIZZLE_KIND[swizzle_bytes]
    return f"warpgroup.SmemLayoutAtomKind.{'K' if major_is_k else 'MN'}_{kind}"


def _constant(name: str, value, why: str) -> str:
    return f"{name} = {value}".ljust(40) + f"  # {why}"


def emit(plan: KernelPlan) -> EmittedKernel:
    _check(plan)
    p = plan.problem
    swap = plan.swap_ab
    ca, cb = (plan.copy("b"), plan.copy("a")) if swap else (plan.copy("a"), plan.copy("b"))
    if ca.multicast != plan.cluster[1] or cb.multicast != plan.cluster[0]:
        raise BuildError(f"plan multicast (a: {ca.multicast}, b: {cb.multicast}) does not match cluster {plan.cluster} "
                         "(A is multicast along the cluster's N extent, B along its M extent)")
    sched = plan.scheduler
    reduce_kernel = sched.split_k > 1 and sched.split_k_mode == "serial"
    # the kernel's epilogue: the plan's, behind an fp8 kernel's scales where they apply there (scales.py);
    # inside the module the inputs go by private names (the host entry rebinds the user's first thing)
    user_inputs, user_ops = epilogue_with_scales(plan)
    inputs, ops = private_inputs(user_inputs, user_ops)
    # under the reduce kernel the main kernel stores raw f32 partials and the reduce kernel applies the epilogue
    main_ops = () if reduce_kernel else ops
    staged = [] if reduce_kernel else tma_inputs(plan, user_inputs, inputs)
    params = params_of(plan)
    entry = f"{p.name}_sm90"
    parts = [_header(plan), _facts(plan, inputs, staged, reduce_kernel)]
    if p.gate is not None:
        parts.append(_gate_function(p.gate))
    if main_ops:
        parts.append(_epilogue_dag(main_ops, inputs, staged, plan.swap_ab))
    if reduce_kernel:
        parts += _reduce(ops, inputs, plan)
    parts.append("# the kernel modules, built from the facts above\n"
                 "KERNEL = Sm90Gemm(KernelFacts.from_namespace(globals()), "
                 f"{'epilogue_dag' if main_ops else 'None'}, {'reduce_partials' if reduce_kernel else 'None'}"
                 + (", gate_function" if p.gate is not None else "") + ")")
    parts.append(_entry(plan, params, user_inputs, inputs, entry))
    source = "\n\n\n".join(parts) + "\n"
    # the host entry takes the scales and the inputs by the user's names
    block_scales = () if plan.scaling is None or plan.scaling.in_epilogue else scale_inputs(plan)
    check_input_names(source, tuple(user_inputs) + block_scales, params, "SM90")
    return EmittedKernel(arch="sm_90a", source=source, entry=entry, params=params, compile_arch="sm_90a")


def _header(plan: KernelPlan) -> str:
    producer, stages = plan.role("producer")[0].index, plan.pipeline.stages
    store = "from registers" if plan.copy("out").kind == "st_global" else "through smem with TMA"
    return f'''"""gemmc SM90 kernel `{plan.problem.name}` (generated from its KernelPlan; regenerate rather than edit).

Persistent, warp-specialized: warpgroup {producer} loads A/B with TMA into a {stages}-stage smem ring,
warpgroups 1-2 run WGMMA ({plan.mode}), the epilogue stores {store}.
This module holds the plan's facts and epilogue; the kernel is {KERNEL_PACKAGE}
(modules {", ".join(MODULES)}; source sha256 {source_digest()}).
"""
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from {KERNEL_PACKAGE} import EpilogueInput, KernelFacts, Sm90Gemm'''


def _facts(plan: KernelPlan, inputs, staged, reduce_kernel: bool) -> str:
    p = plan.problem
    swap = plan.swap_ab
    ka_major, kb_major = (p.b_major, p.a_major) if swap else (p.a_major, p.b_major)
    ca, cb = (plan.copy("b"), plan.copy("a")) if swap else (plan.copy("a"), plan.copy("b"))
    cc = plan.copy("out")
    prod, cons = plan.role("producer")[0], plan.role("consumer")
    sched, pipe, mma, groups = plan.scheduler, plan.pipeline, plan.mma, plan.groups
    store_dtype = DType.f32 if reduce_kernel else p.out_dtype
    major = {"k": "K"}
    rows = [
        ("A_DTYPE", dsl_type(p.b_dtype if swap else p.a_dtype), "problem: the kernel's A dtype"),
        ("B_DTYPE", dsl_type(p.a_dtype if swap else p.b_dtype), "problem: the kernel's B dtype"),
        ("ACC_DTYPE", dsl_type(p.acc_dtype), "problem: accumulator dtype"),
        ("STORE_DTYPE", dsl_type(store_dtype), "epilogue store dtype (f32 partials under split_k_mode serial)"),
        ("A_MAJOR", f"cute.nvgpu.OperandMajorMode.{major.get(ka_major, 'MN')}", f"problem: a_major = {ka_major!r}"),
        ("B_MAJOR", f"cute.nvgpu.OperandMajorMode.{major.get(kb_major, 'MN')}", f"problem: b_major = {kb_major!r}"),
        ("A_MAJOR_IS_K", ka_major == "k", "problem: A's K is contiguous"),
        ("B_MAJOR_IS_K", kb_major == "k", "problem: B's K is contiguous"),
        ("TILE_MNK", tuple(plan.tile), "tile"),
        ("CLUSTER_MN", tuple(plan.cluster), "cluster shape"),
        ("A_MULTICAST", ca.multicast, "tma-cluster-layout: A multicast along the cluster's N extent"),
        ("B_MULTICAST", cb.multicast, "tma-cluster-layout: B multicast along the cluster's M extent"),
        ("A_SMEM_ATOM", _smem_atom(ka_major == "k", ca.swizzle_bytes),
         f"tma-cluster-layout: A box {ca.box}, {ca.swizzle_bytes}-byte swizzle"),
        ("B_SMEM_ATOM", _smem_atom(kb_major == "k", cb.swizzle_bytes),
         f"tma-cluster-layout: B box {cb.box}, {cb.swizzle_bytes}-byte swizzle"),
        # C/out is row-major: N (the "K-like" contiguous mode of the epilogue tile) is contiguous
        ("C_SMEM_ATOM", _smem_atom(True, cc.swizzle_bytes),
         f"tma-cluster-layout: C store box {cc.box}, {cc.swizzle_bytes}-byte swizzle"),
        ("AB_STAGES", pipe.stages, "pipeline-staging: A/B ring depth (full/empty mbarriers)"),
        ("EPI_STAGES", pipe.epi_stages, "pipeline-staging: epilogue smem buffers"),
        ("EPI_TILE", tuple(pipe.epi_tile), "pipeline-staging: epilogue sub-tile"),
        ("PRODUCER_WG", prod.index, "assign-warpgroup-roles: producer warpgroup"),
        ("PRODUCER_REGS", prod.regs, "assign-warpgroup-roles: producer setmaxnreg budget"),
        ("CONSUMER_REGS", cons[0].regs, "assign-warpgroup-roles: consumer setmaxnreg budget"),
        ("NUM_CONSUMER_WG", len(cons), "assign-warpgroup-roles: consumer warpgroups"),
        ("THREADS", plan.threads, "threads per CTA"),
        ("PINGPONG", plan.mode == "pingpong", f"mode = {plan.mode!r}"),
        ("MMA_INST_MN", tuple(mma.inst_shape[:2]), f"MMA instruction shape {tuple(mma.inst_shape)}"),
        ("MMA_ATOM_LAYOUT", tuple(mma.atom_layout), "MMA atoms (warpgroups) over M, N, K"),
        ("RASTER_ALONG_M", sched.raster == "m", f"tile scheduler: raster = {sched.raster!r}"),
        ("SWIZZLE", sched.swizzle, "tile scheduler: swizzle group size"),
        ("SPLIT_K", sched.split_k, "tile scheduler: split-K factor"),
        ("SPLIT_K_MODE", repr(sched.split_k_mode), "tile scheduler: who sums split tiles' partials"),
        ("REDUCE_KERNEL", reduce_kernel, "split_k_mode serial: a second kernel sums the partials"),
        ("MAX_ACTIVE_CLUSTERS", sched.max_active_clusters,
         "pipeline-staging: clusters resident at once (persistent grid)"),
        ("SMEM_BYTES", pipe.smem_bytes, "pipeline-staging: shared memory budget"),
        ("PDL", sched.pdl, "tile scheduler: pdl (programmatic dependent launch)"),
        ("PDL_EARLY_CTAS", sched.pdl_early_ctas, "tile scheduler: grids up to this size let the next kernel in early,"),
        ("PDL_FULL_CTAS", sched.pdl_full_ctas, "tile scheduler: and grids from this size (0: none)"),
        ("PDL_PREFETCH_K_TILES", sched.pdl_prefetch_k_tiles,
         "tile scheduler: k-tiles warmed in L2 before griddepcontrol.wait"),
        ("PDL_PREFETCH_A", sched.pdl_prefetch_of == "ab" or (swap and sched.pdl_prefetch_of == "b"),
         f"tile scheduler: pdl_prefetch_of = {sched.pdl_prefetch_of!r} (the kernel's A is {'b' if swap else 'a'})"),
        ("PDL_PREFETCH_B", sched.pdl_prefetch_of == "ab" or (not swap and sched.pdl_prefetch_of == "b"),
         "tile scheduler: likewise for the kernel's B"),
        ("PDL_PREFETCH_BANDED", sched.pdl_prefetch_banded, "tile scheduler: prefetch only in the PDL bands' grids"),
        ("A_L2_POLICY", repr(ca.l2_policy), "tma-cluster-layout: L2 hint of A's loads (first_once: evict-first when "
         "each tile loads once)"),
        ("B_L2_POLICY", repr(cb.l2_policy), "tma-cluster-layout: L2 hint of B's loads"),
        ("C_L2_POLICY", repr(cc.l2_policy), "tma-cluster-layout: L2 hint of the TMA store ('': none)"),
        ("SWAP_AB", swap, "schedule swap_ab: the kernel's A is b, its B is a; out is stored transposed"),
        ("BATCHED", p.batch is not None, "problem: a batch dim L"),
        ("GATED", p.gate is not None, "problem: gate = " + repr(p.gate) + " (B is [gate; up]: two accumulators)"),
        ("GROUPED", groups is not None, "map-groups: " + (f"{groups.groups} groups, {groups.layout}, walk "
                                                          f"{groups.group_walk}, descriptors {groups.descriptors}"
                                                          if groups is not None else "not grouped")),
        ("GROUP_MASKED", groups is not None and groups.layout == "masked",
         "map-groups: A and out are E x M x . (masked groups)"),
        ("GROUP_ORDER_M", groups is None or groups.order == "m", "map-groups: a group's cluster tiles M fastest"),
        ("STORE_FROM_REGISTERS", cc.kind == "st_global", f"tma-cluster-layout: the output copy is {cc.kind}"),
    ]
    if plan.scaling is not None:    # fp8 (other kernels take KernelFacts' defaults: MMA K 16, no scaling)
        sc = plan.scaling
        rows += [
            ("MMA_INST_K", mma.inst_shape[2], "assign-warpgroup-roles: the fp8 WGMMA's K"),
            ("SCALING", repr(sc.mode), "problem: fp8 scaling (scales " + ("in the epilogue" if sc.in_epilogue
                                                                          else "at each promotion") + ")"),
            ("PROMOTE_K", sc.promote, "assign-warpgroup-roles: K per promotion into the f32 sum (0: never)"),
        ]
    lines = ["# ---- kernel-IR facts (KernelPlan); the kernel modules read only these ----------------------"]
    lines += [_constant(name, value, why) for name, value, why in rows]
    staged_names = {i.name for _, i in staged}
    for u, i in staged:
        c = plan.copy(u.name)
        lines.append(_constant(f"{i.name.upper()}_SMEM_ATOM", _smem_atom(True, c.swizzle_bytes),
                               f"tma-cluster-layout: epilogue input {u.name} box {c.box}, {c.swizzle_bytes}-byte "
                               "swizzle, one buffer"))
    described = []
    for i in inputs:
        dtype = dsl_type(DType.f32 if i.kind == "scalar" else i.dtype)
        atom = f", {i.name.upper()}_SMEM_ATOM" if i.name in staged_names else ""
        described.append(f"    EpilogueInput({i.name!r}, {i.kind!r}, {dtype}{atom}),")
    lines.append("# epilogue inputs, in the plan's order: copy tma (an smem atom: loaded per sub-tile) or ldg")
    lines.append("EPILOGUE_INPUTS = (" + ("\n" + "\n".join(described) + "\n" if described else "") + ")")
    return "\n".join(lines)


def _epilogue_dag(ops, inputs, staged, swap: bool) -> str:
    """The epilogue DAG on one f32 element; an input's (m, n) in the problem: swapped A/B put the problem's n on
    the kernel's m coordinate."""
    coords = ("en", "em", "el") if swap else ("em", "en", "el")
    vals = {i.name: input_value_expr(i, *coords) for i in inputs}
    for _, i in staged:
        vals[i.name] = f"cutlass.Float32(s_{i.name}[(lm, ln, 0)].to(cutlass.Float32))"
    math_lines, result = epilogue_math_lines(ops, "acc", vals)
    body = []
    if inputs:
        body.append(f"{', '.join(input_kernel_args(inputs))}, = inputs")
    if staged:
        body.append(f"{', '.join('s_' + i.name for _, i in staged)}, = staged")
    body += math_lines + [f"return {result}"]
    return ('def epilogue_dag(acc, em, en, el, lm, ln, inputs, staged):\n'
            '    """The epilogue DAG (kernel-IR epilogue ops) on one f32 accumulator element at output (em, en, el);\n'
            '    inputs: the epilogue inputs\' views and scalars, in order; staged: the smem sub-tiles of the\n'
            '    TMA-loaded ones, read at the element\'s place (lm, ln) in the sub-tile."""\n'
            + "\n".join("    " + ln for ln in body))


def _gate_function(gate: str) -> str:
    """A gated GEMM's combine of its two accumulators, gate(g) * u, in f32 (what the epilogue DAG reads as acc)."""
    ops = (EpilogueOp(gate, (Ref.acc(),)), EpilogueOp("mul", (Ref.node(0), Ref.input("up"))))
    math_lines, result = epilogue_math_lines(ops, "g", {"up": "u"}, prefix="gate")
    return ('def gate_function(g, u):\n'
            f'    """{gate}(g) * u: one element of the gate and up accumulators, f32."""\n'
            + "\n".join("    " + ln for ln in math_lines + [f"return {result}"]))


def _reduce(ops, inputs, plan: KernelPlan) -> list[str]:
    """split_k_mode serial: the reduce kernel (a deterministic in-order sum of the partials + the epilogue) and
    `reduce_partials`, the host function that launches it."""
    reduce = splitk_reduce(ops, inputs, plan.scheduler.split_k, plan.problem.out_dtype, "ws_mnl", "out_mnl",
                           pdl=plan.scheduler.pdl)
    body = ([f"{', '.join(input_kernel_args(inputs))}, = inputs"] if inputs else []) + list(reduce.launch_lines)
    launch = ("@cute.jit\ndef reduce_partials(ws_mnl, out_mnl, inputs, stream):\n"
              '    """split-K reduce: launch splitk_reduce_kernel over the (M, N, SPLIT_K * L) partials."""\n'
              + "\n".join("    " + ln for ln in body))
    return [reduce.source.strip("\n"), launch]


def _entry(plan: KernelPlan, params, user_inputs, inputs, entry: str) -> str:
    host_params = ", ".join([f"{q.name}: cutlass.Float32" if q.kind == "scalar" else f"{q.name}: cute.Tensor"
                             for q in params] + ["stream"])
    names = {q.name for q in params}
    ka, kb = ("b", "a") if plan.swap_ab else ("a", "b")
    groups = next((q.name for q in params if q.role in GROUP_ROLES), "None")
    args = [ka, kb, "out", "(" + "".join(f"{i.name}, " for i in inputs) + ")",
            "workspace" if "workspace" in names else "None", "semaphores" if "semaphores" in names else "None",
            groups, "stream"]
    lines = [f"@cute.jit", f"def {entry}({host_params}):"]
    lines += ["    " + ln for ln in rebind_inputs(user_inputs, inputs)]
    if plan.swap_ab:
        lines.append("    # swapped A/B: the kernel computes out^T = b @ a^T (its A is b, its B is a)")
    if plan.scaling is not None and not plan.scaling.in_epilogue:
        lines.append("    # block-scaled fp8: the consumers promote each k-tile times these scales")
        args.append(f"block_scales=({plan.scaling.a}, {plan.scaling.b})")
    lines.append(f"    KERNEL({', '.join(args)})")
    return "\n".join(lines)

