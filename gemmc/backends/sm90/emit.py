"""Emit a persistent, warp-specialized TMA + WGMMA CuTe DSL kernel from a `KernelPlan`.

The emitted module is plain CuTe DSL Python. Its first block names every plan fact as a constant
(with the kernel-IR op it comes from); the kernel code below only reads those constants, so no
decision is made here or in the kernel. Blocks by role:
  host      : views (M,K,L)/(N,K,L)/(M,N,L), TMA atoms, tile-scheduler params, launch (+ split-K reduce)
  scheduler : persistent static scheduler (raster order, swizzle), split-K decode of the L coordinate;
              or the stream-K walk of the cluster's data-parallel tiles and iteration share
  producer  : one warp of the producer warpgroup, setmaxnreg down, TMA (multicast) into the smem ring
  consumer  : setmaxnreg up, WGMMA main loop (cooperative: 2 WGs split a tile; ping-pong: alternate tiles)
  epilogue  : the plan's epilogue DAG on the accumulators, cast, registers -> smem -> TMA store;
              full inputs whose plan copy is "tma" are TMA-loaded into smem per epilogue sub-tile,
              the others (copy "ldg", row/col vectors) are read from global memory per element
Where the plan's tile scheduler says pdl, launches are programmatic dependent launches (PDL): the
kernel's prologue (barrier init, descriptor prefetch, an L2 prefetch of its first
plan.scheduler.pdl_prefetch_k_tiles k-tiles) overlaps the previous kernel on the stream, and it waits on
the grid dependency before it loads into shared memory or stores; near its end, its producer lets the
next kernel launch (plan.scheduler.pdl_early_ctas and pdl_full_ctas say when). Only the plan's mode is emitted
(`resolve_mode`). Split-K (plan.scheduler.split_k > 1) sums the f32 partials in split order either in the
kernel (split_k_mode "fixup": each split of a tile stores its partial to the workspace and counts its arrival
on the tile's semaphore; the last to arrive sums them and runs the epilogue) or in a second kernel
(split_k_mode "serial": the main kernel stores the partials and the shared reduce kernel of
backends/common.py applies the epilogue; both launch from the same host function). Stream-K (split_k_mode
"stream") replaces the static scheduler: whole waves of tiles run data-parallel, the rest are shared out
as (tile, k-tile) iterations, and a tile cut between clusters is summed by its last piece to arrive, as
under the fix-up (stream_k.py models the decomposition). Swapped A and B (plan.swap_ab): the kernel computes out^T = b @ a^T; the host
hands it b as A, a as B and a transposed view of out, and each output element is stored from registers
(st.global) at its coordinate in that view. The PTX comes from compiling with
`--keep-ptx --dump-dir <dir>` (the compiled object's `__ptx__`; see gemmc/build.py).
"""
from __future__ import annotations

import textwrap
from string import Template

from ...errors import BuildError
from ...ir.plan import KernelPlan
from ...types import DType
from .. import GRID_YZ_MAX, EmittedKernel, Param
from ..common import (check_input_names, dsl_type, epilogue_math_lines, grouped_raster_source, input_kernel_args,
                      input_kernel_params, input_value_expr, input_view_lines, private_inputs, rebind_inputs,
                      splitk_reduce)

_SWIZZLE_KIND = {128: "SW128", 64: "SW64", 32: "SW32", 0: "INTER"}


def _check(plan: KernelPlan) -> None:
    p = plan.problem
    if plan.arch != "sm_90a":
        raise BuildError(f"the SM90 backend got a plan for {plan.arch}; use gemmc.backends.emit(plan)")
    if plan.mode not in ("cooperative", "pingpong"):
        raise BuildError(f"SM90 mode {plan.mode!r} is not cooperative or pingpong")
    for dt in (p.a_dtype, p.b_dtype):
        if dt not in (DType.bf16, DType.f16):
            raise BuildError(f"SM90 inputs must be bf16 or f16, got {dt}")
    if plan.mma.kind != "wgmma":
        raise BuildError(f"SM90 plan has MMA kind {plan.mma.kind!r}; expected 'wgmma'")
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
    want_c = "st_global" if plan.swap_ab else "tma_store"
    if plan.copy("out").kind != want_c:
        raise BuildError(f"SM90 store copy kind {plan.copy('out').kind!r}; expected {want_c!r} "
                         f"(swap_ab={plan.swap_ab})")
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


def params_of(plan: KernelPlan) -> tuple[Param, ...]:
    """The compiled function's arguments, in order (the stream follows them)."""
    p = plan.problem
    lead = (p.batch,) if p.batch is not None else ()
    a_shape = (p.m, p.k) if p.a_major == "k" else (p.k, p.m)
    b_shape = (p.n, p.k) if p.b_major == "k" else (p.k, p.n)
    out = [Param("a", "tensor", p.a_dtype, lead + a_shape, role="a"),
           Param("b", "tensor", p.b_dtype, lead + b_shape, role="b"),
           # the serial split-K reduce kernel's grid y extent is the batch (the persistent grid has no such limit)
           Param("out", "tensor", p.out_dtype, lead + (p.m, p.n), role="out",
                 limits=((0, GRID_YZ_MAX),) if lead and plan.scheduler.split_k > 1
                 and plan.scheduler.split_k_mode == "serial" else ())]
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
        elems = (str(2 * _max_clusters(plan) * cm * cn * bm * bn) if plan.scheduler.split_k_mode == "stream"
                 else f"{sk * bm * bn} * {tiles}")
        out.append(Param("workspace", "workspace", DType.f32, (elems,), role="workspace", workspace_elems=elems))
        out.append(Param("semaphores", "semaphore", DType.i32, (tiles,), role="semaphore", workspace_elems=tiles))
    return tuple(out)


def _dim_expr(d) -> str:
    return str(d)


def _mul_dim(k: int, d):
    return k * d if isinstance(d, int) else f"{k}*{d}"


def tma_inputs(plan: KernelPlan, inputs) -> list:
    """Full (M x N) epilogue inputs the plan loads with TMA into smem, per epilogue sub-tile, as (the plan's
    input, `inputs`' one in its place: private_inputs' renamed twin). Inputs without a copy in the plan, or
    with kind "ldg", are read straight from global memory."""
    kinds = {c.operand: c.kind for c in plan.copies if c.operand not in ("a", "b", "out")}
    return [(u, x) for u, x in zip(plan.epilogue.inputs, inputs) if u.kind == "full" and kinds.get(u.name) == "tma"]


def _smem_atom(major_is_k: bool, swizzle_bytes: int) -> str:
    kind = _SWIZZLE_KIND[swizzle_bytes]
    return f"warpgroup.SmemLayoutAtomKind.{'K' if major_is_k else 'MN'}_{kind}"


def _block(text: str, **subs) -> str:
    return Template(textwrap.dedent(text).strip("\n")).substitute(**subs)


def _indent(lines, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + ln for ln in lines)


def emit(plan: KernelPlan) -> EmittedKernel:
    _check(plan)
    p = plan.problem
    swap = plan.swap_ab
    # the kernel's A and B operands: the problem's a and b, or b and a when swapped
    ka, kb = ("b", "a") if swap else ("a", "b")
    ka_major, kb_major = (p.b_major, p.a_major) if swap else (p.a_major, p.b_major)
    ca, cb, cc = plan.copy(ka), plan.copy(kb), plan.copy("out")
    bm, bn, bk = plan.tile
    cm, cn = plan.cluster
    prod = plan.role("producer")[0]
    cons = plan.role("consumer")
    pingpong = plan.mode == "pingpong"
    sk = plan.scheduler.split_k
    fixup = sk > 1 and plan.scheduler.split_k_mode == "fixup"
    stream = plan.scheduler.split_k_mode == "stream"
    sums_partials = fixup or stream     # the kernel sums split tiles' f32 partials itself (workspace, semaphores)
    reduce_kernel = sk > 1 and not fixup
    batched = p.batch is not None
    entry = f"{p.name}_sm90"
    if ca.multicast != cn or cb.multicast != cm:
        raise BuildError(f"plan multicast (a: {ca.multicast}, b: {cb.multicast}) does not match cluster {plan.cluster} "
                         "(A is multicast along the cluster's N extent, B along its M extent)")
    # inside the module the inputs go by private names (the host entry rebinds the user's first thing)
    inputs, ops = private_inputs(plan.epilogue.inputs, plan.epilogue.ops)
    # split-K through the reduce kernel: the main kernel writes raw f32 partials, the reduce kernel applies
    # the epilogue; under the in-kernel fix-up the last split of each tile runs the plan's epilogue itself
    store_dtype = DType.f32 if reduce_kernel else p.out_dtype
    main_ops, main_inputs = ((), ()) if reduce_kernel else (ops, inputs)
    store_major_is_k = True  # C/out is row-major: N (the "K-like" contiguous mode of the epilogue tile) is contiguous
    params = params_of(plan)

    facts = _block('''
        # ---- kernel-IR facts (KernelPlan); the code below reads only these ----------------------
        A_DTYPE = $a_dtype                      # problem: a dtype
        B_DTYPE = $b_dtype                      # problem: b dtype
        ACC_DTYPE = $acc_dtype                  # problem: accumulator dtype
        STORE_DTYPE = $store_dtype              # epilogue store path dtype (f32 partials under split_k_mode serial)
        A_MAJOR = cute.nvgpu.OperandMajorMode.$a_major   # problem: a_major = "$a_major_s"
        B_MAJOR = cute.nvgpu.OperandMajorMode.$b_major   # problem: b_major = "$b_major_s"
        TILE_MNK = ($bm, $bn, $bk)              # tile
        CLUSTER_MN = ($cm, $cn)                 # cluster shape
        A_MULTICAST = $a_mc                     # tma-cluster-layout: A multicast along the cluster's N extent
        B_MULTICAST = $b_mc                     # tma-cluster-layout: B multicast along the cluster's M extent
        A_SMEM_ATOM = $a_atom   # tma-cluster-layout: A box $a_box, $a_sw-byte swizzle
        B_SMEM_ATOM = $b_atom   # tma-cluster-layout: B box $b_box, $b_sw-byte swizzle
        C_SMEM_ATOM = $c_atom   # tma-cluster-layout: C store box $c_box, $c_sw-byte swizzle
        AB_STAGES = $stages                     # pipeline-staging: A/B ring depth (full/empty mbarriers)
        EPI_STAGES = $epi_stages                # pipeline-staging: epilogue smem buffers
        EPI_TILE = ($em, $en)                   # pipeline-staging: epilogue sub-tile
        PRODUCER_WG = $prod_wg                  # assign-warpgroup-roles: producer warpgroup
        PRODUCER_REGS = $prod_regs              # assign-warpgroup-roles: producer setmaxnreg budget
        CONSUMER_REGS = $cons_regs              # assign-warpgroup-roles: consumer setmaxnreg budget
        NUM_CONSUMER_WG = $n_cons               # assign-warpgroup-roles: consumer warpgroups
        THREADS = $threads                      # threads per CTA
        PINGPONG = $pingpong                    # mode = "$mode"
        MMA_INST_MN = ($inst_m, $inst_n)        # MMA instruction shape $inst
        MMA_ATOM_LAYOUT = $atom_layout          # MMA atoms (warpgroups) over M, N, K
        RASTER_ALONG_M = $raster_m              # tile scheduler: raster = "$raster"
        SWIZZLE = $swizzle                      # tile scheduler: swizzle group size
        SPLIT_K = $split_k                      # tile scheduler: split-K factor ($sk_mode)
        REDUCE_KERNEL = $reduce_kernel              # split_k_mode serial: a second kernel sums the partials
        MAX_ACTIVE_CLUSTERS = $max_clusters     # persistent grid: clusters resident at once (ArchLimits)
        SMEM_BYTES = $smem_bytes                # pipeline-staging: shared memory budget
        PDL = $pdl                              # tile scheduler: pdl (programmatic dependent launch)
        PDL_EARLY_CTAS = $pdl_early             # tile scheduler: grids up to this size let the next kernel in early,
        PDL_FULL_CTAS = $pdl_full               # tile scheduler: and grids from this size (0: none)
        PDL_PREFETCH_K_TILES = $pdl_prefetch    # tile scheduler: k-tiles warmed in L2 before griddepcontrol.wait
        A_EVICT_FIRST = $a_evict_first          # tma-cluster-layout: A loads evict-first when each tile loads once
        B_EVICT_FIRST = $b_evict_first          # tma-cluster-layout: B loads likewise
        L2_EVICT_FIRST = 0x12F0000000000000     # the L2 cache policy word of evict-first (fraction 1.0)
    ''', a_dtype=dsl_type(p.a_dtype), b_dtype=dsl_type(p.b_dtype), acc_dtype=dsl_type(p.acc_dtype),
        store_dtype=dsl_type(store_dtype),
        a_major="K" if ka_major == "k" else "MN", a_major_s=ka_major,
        b_major="K" if kb_major == "k" else "MN", b_major_s=kb_major,
        bm=bm, bn=bn, bk=bk, cm=cm, cn=cn, a_mc=ca.multicast, b_mc=cb.multicast,
        a_atom=_smem_atom(ka_major == "k", ca.swizzle_bytes), a_box=ca.box, a_sw=ca.swizzle_bytes,
        b_atom=_smem_atom(kb_major == "k", cb.swizzle_bytes), b_box=cb.box, b_sw=cb.swizzle_bytes,
        c_atom=_smem_atom(store_major_is_k, cc.swizzle_bytes), c_box=cc.box, c_sw=cc.swizzle_bytes,
        stages=plan.pipeline.stages, epi_stages=plan.pipeline.epi_stages,
        em=plan.pipeline.epi_tile[0], en=plan.pipeline.epi_tile[1],
        prod_wg=prod.index, prod_regs=prod.regs, cons_regs=cons[0].regs, n_cons=len(cons),
        threads=plan.threads, pingpong=pingpong, mode=plan.mode,
        inst_m=plan.mma.inst_shape[0], inst_n=plan.mma.inst_shape[1], inst=plan.mma.inst_shape,
        atom_layout=tuple(plan.mma.atom_layout), raster_m=plan.scheduler.raster == "m", raster=plan.scheduler.raster,
        swizzle=plan.scheduler.swizzle, split_k=sk, sk_mode=plan.scheduler.split_k_mode, reduce_kernel=reduce_kernel,
        max_clusters=_max_clusters(plan), smem_bytes=plan.pipeline.smem_bytes, pdl=plan.scheduler.pdl,
        pdl_early=plan.scheduler.pdl_early_ctas, pdl_full=plan.scheduler.pdl_full_ctas,
        pdl_prefetch=plan.scheduler.pdl_prefetch_k_tiles,
        a_evict_first=ca.l2_evict_first, b_evict_first=cb.l2_evict_first)

    if swap:
        facts += ("\nSWAP_AB = True                          # schedule swap_ab: the kernel's A is b, its B is a; "
                  "out is stored transposed")
    staged = tma_inputs(plan, main_inputs)
    for u, i in staged:
        c = plan.copy(u.name)
        facts += (f"\n{i.name.upper()}_SMEM_ATOM = {_smem_atom(True, c.swizzle_bytes)}   "
                  f"# tma-cluster-layout: epilogue input {u.name} box {c.box}, {c.swizzle_bytes}-byte swizzle, "
                  f"one buffer")
    if sk > 1:
        facts += "\n\n\n" + _block('''
            def k_tiles_of(l_raw, k_tile_total, num_l):
                """k-tiles of the work unit with L coordinate l_raw = split * L + batch (the last split may be short)."""
                k_per_split = (k_tile_total + SPLIT_K - 1) // SPLIT_K
                return cutlass.max(cutlass.min(k_per_split, k_tile_total - (l_raw // num_l) * k_per_split), 0)
        ''')
    else:
        facts += "\n\n\n" + _block('''
            def k_tiles_of(l_raw, k_tile_total, num_l):
                """k-tiles of a work unit: all of K (no split-K)."""
                return k_tile_total
        ''')

    fast, slow = _unit_extents(plan)
    if not stream:
        facts += "\n\n\n" + _block('''
            @cute.jit
            def work_tile(unit, fast_clusters, slow_clusters):
                """Work unit `unit` -> this CTA's tile (m, n, split * L + batch). Units number the cluster tiles
                $order, then split * L; the grid's x and y are the cluster's shape, so
                the CTA's block x and y place its tile inside the cluster tile."""
                rest, cl_$fast = divmod(unit, fast_clusters)
                l_raw, cl_$slow = divmod(rest, slow_clusters)
                cta_m, cta_n, _ = cute.arch.block_idx()
                return (cute.arch.make_warp_uniform(cl_m * CLUSTER_MN[0] + cta_m),
                        cute.arch.make_warp_uniform(cl_n * CLUSTER_MN[1] + cta_n),
                        cute.arch.make_warp_uniform(l_raw))
        ''', order=_unit_order(plan), fast=fast, slow=slow)

    if _reorders(plan):
        facts += "\n\n" + grouped_raster_source("RASTER_ALONG_M", "SWIZZLE") + "\n\n" + _block('''
            @cute.jit
            def swizzled_tile(tile_m, tile_n, clusters_m, clusters_n):
                """A work unit's tile under the plan's raster and swizzle, over whole clusters. The scheduler
                enumerates clusters M-major with no swizzle; tile_coord reorders them without padding."""
                cl_m, cl_n = tile_coord(tile_m // CLUSTER_MN[0] + clusters_m * (tile_n // CLUSTER_MN[1]),
                                        clusters_m, clusters_n)
                return cl_m * CLUSTER_MN[0] + tile_m % CLUSTER_MN[0], cl_n * CLUSTER_MN[1] + tile_n % CLUSTER_MN[1]
        ''')

    header = _block('''
        """gemmc SM90 kernel `$name` (generated from its KernelPlan; regenerate rather than edit).

        Persistent, warp-specialized: warpgroup $prod_wg loads A/B with TMA into a $stages-stage smem ring,
        warpgroups 1-2 run WGMMA ($mode), the epilogue stores through smem with TMA.
        """
        import cutlass
        import cutlass.cute as cute
        import cutlass.memory
        import cutlass.tensor_utils
        import cutlass.pipeline as pipeline
        import cutlass.utils.hopper_helpers as sm90_utils
        from cutlass.cute.nvgpu import cpasync, warpgroup
    ''', name=p.name, prod_wg=prod.index, stages=plan.pipeline.stages, mode=plan.mode)

    # ---- host function --------------------------------------------------------------------------
    host_params = ", ".join(
        [f"{q.name}: cutlass.Float32" if q.kind == "scalar" else f"{q.name}: cute.Tensor" for q in params]
        + ["stream"])

    def view(name: str, order2: str, order3: str) -> str:
        if batched:
            return f"cute.make_tensor({name}.iterator, cute.select({name}.layout, mode={order3}))"
        if order2 == "[0, 1]":
            return f"cute.make_tensor({name}.iterator, cute.append({name}.layout, cute.make_layout(1, stride=0)))"
        return (f"cute.make_tensor({name}.iterator, cute.append(cute.select({name}.layout, mode={order2}), "
                f"cute.make_layout(1, stride=0)))")

    a_view = view(ka, "[0, 1]", "[1, 2, 0]") if ka_major == "k" else view(ka, "[1, 0]", "[2, 1, 0]")
    b_view = view(kb, "[0, 1]", "[1, 2, 0]") if kb_major == "k" else view(kb, "[1, 0]", "[2, 1, 0]")
    # swapped: the kernel's (M, N) is the problem's (N, M), so it sees out transposed
    out_view = view("out", "[1, 0]", "[2, 1, 0]") if swap else view("out", "[0, 1]", "[1, 2, 0]")
    # the workspace arrives flat (workspace_elems f32); view it as (M, N, SPLIT_K * L), split-major in L
    ws_view = ("cute.make_tensor(workspace.iterator, cute.make_layout("
               "(cute.size(out_mnl, mode=[0]), cute.size(out_mnl, mode=[1]), SPLIT_K * cute.size(out_mnl, mode=[2])), "
               "stride=(cute.size(out_mnl, mode=[1]), 1, cute.size(out_mnl, mode=[0]) * cute.size(out_mnl, mode=[1]))))")
    store_target = "ws_mnl" if reduce_kernel else "out_mnl"
    in_views = input_view_lines(main_inputs, batched)
    kernel_in_args = (["workspace", "semaphores"] if sums_partials else []) + input_kernel_args(main_inputs)
    staged_host = []
    staged_storage = []
    for _, i in staged:
        nm = i.name
        staged_host += [
            f"# epilogue input {nm}: TMA-loaded into smem one epilogue sub-tile at a time",
            f"{nm}_smem = _smem_layout({nm.upper()}_SMEM_ATOM, {dsl_type(i.dtype)}, EPI_TILE, 1, True)",
            f"tma_{nm}, tma_{nm}_mnl = cpasync.make_tiled_tma_atom(",
            f"    cpasync.CopyBulkTensorTileG2SOp(), {nm}_v, cute.slice_({nm}_smem, (None, None, 0)), EPI_TILE)",
        ]
        staged_storage.append(f"s_{nm}: cute.struct.Align[cute.struct.MemRange[{dsl_type(i.dtype)}, "
                              f"cute.cosize({nm}_smem)], 1024]")
        kernel_in_args += [f"tma_{nm}", f"tma_{nm}_mnl", f"{nm}_smem"]
    reduce_lines = []
    if reduce_kernel:
        reduce = splitk_reduce(ops, inputs, sk, p.out_dtype, "ws_mnl", "out_mnl", pdl=plan.scheduler.pdl)
        reduce_lines = (["# split-K reduce kernel: deterministic in-order sum of the partials + the epilogue"]
                        + input_view_lines(inputs, batched) + list(reduce.launch_lines))

    host = _block('''
        # ==== host: views, TMA atoms, scheduler params, launch ========================================
        def _smem_layout(atom_kind, dtype, shape_2d, stages, major_is_k):
            """Swizzled smem layout of `stages` copies of a 2-D tile (major_is_k: mode 1 contiguous)."""
            atom = warpgroup.make_smem_layout_atom(atom_kind, dtype)
            return cute.tile_to_shape(atom, cute.append(shape_2d, stages), order=(0, 1, 2) if major_is_k else (1, 0, 2))


        @cute.jit
        def $entry($host_params):$rebind
            # storage-shape tensors -> (M,K,L) / (N,K,L) / (M,N,L) views
            a_mkl = $a_view
            b_nkl = $b_view
            out_mnl = $out_view
        $ws_line
        $in_views

            tiled_mma = cute.make_tiled_mma(
                cute.make_mma_atom(warpgroup.MmaF16BF16Op(A_DTYPE, ACC_DTYPE, (*MMA_INST_MN, 16),
                                                          warpgroup.OperandSource.SMEM, A_MAJOR, B_MAJOR)),
                MMA_ATOM_LAYOUT)
            a_major_is_k = $a_k
            b_major_is_k = $b_k
            a_smem = _smem_layout(A_SMEM_ATOM, A_DTYPE, (TILE_MNK[0], TILE_MNK[2]), AB_STAGES, a_major_is_k)
            b_smem = _smem_layout(B_SMEM_ATOM, B_DTYPE, (TILE_MNK[1], TILE_MNK[2]), AB_STAGES, b_major_is_k)
            c_smem = _smem_layout(C_SMEM_ATOM, STORE_DTYPE, EPI_TILE, EPI_STAGES, True)

            # TMA: A multicast to the CTAs of one cluster row (N extent), B to one cluster column (M extent)
            a_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if A_MULTICAST > 1 else cpasync.CopyBulkTensorTileG2SOp()
            b_op = cpasync.CopyBulkTensorTileG2SMulticastOp() if B_MULTICAST > 1 else cpasync.CopyBulkTensorTileG2SOp()
            tma_a, tma_a_mkl = cpasync.make_tiled_tma_atom(
                a_op, a_mkl, cute.slice_(a_smem, (None, None, 0)), (TILE_MNK[0], TILE_MNK[2]), num_multicast=A_MULTICAST)
            tma_b, tma_b_nkl = cpasync.make_tiled_tma_atom(
                b_op, b_nkl, cute.slice_(b_smem, (None, None, 0)), (TILE_MNK[1], TILE_MNK[2]), num_multicast=B_MULTICAST)
        $c_store_host

        $staged_host

        $sched_host

            @cute.struct
            class SharedStorage:
                ab_barriers: cute.struct.MemRange[cutlass.Int64, AB_STAGES * 2]
                sA: cute.struct.Align[cute.struct.MemRange[A_DTYPE, cute.cosize(a_smem)], 1024]
                sB: cute.struct.Align[cute.struct.MemRange[B_DTYPE, cute.cosize(b_smem)], 1024]
                sC: cute.struct.Align[cute.struct.MemRange[STORE_DTYPE, cute.cosize(c_smem)], 1024]
        $staged_storage

            gemm_kernel(tma_a, tma_a_mkl, tma_b, tma_b_nkl, $c_args, tiled_mma,
                        a_smem, b_smem, c_smem, $sched_arg SharedStorage$kernel_in_args).launch(
                grid=grid, block=[THREADS, 1, 1], cluster=(*CLUSTER_MN, 1), min_blocks_per_mp=1, stream=stream,
                use_pdl=PDL)
        $reduce_lines
    ''', entry=entry, host_params=host_params, rebind="".join("\n    " + ln for ln in rebind_inputs(plan.epilogue.inputs, inputs)),
        a_view=a_view, b_view=b_view, out_view=out_view,
        ws_line=("    ws_mnl = " + ws_view) if reduce_kernel else "",
        in_views=_indent(in_views, 4), a_k=ka_major == "k", b_k=kb_major == "k",
        c_args="out_mnl, out_mnl" if swap else "tma_c, tma_c_mnl, out_mnl",
        c_store_host=_indent(["# swapped A/B: the epilogue stores from registers (no TMA store)"] if swap else [
            "tma_c, tma_c_mnl = cpasync.make_tiled_tma_atom(",
            f"    cpasync.CopyBulkTensorTileS2GOp(), {store_target}, cute.slice_(c_smem, (None, None, 0)), "
            "EPI_TILE)"], 4),
        kernel_in_args="".join(", " + x for x in kernel_in_args),
        staged_storage=_indent(staged_storage + (["epi_load_barriers: cute.struct.MemRange[cutlass.Int64, 2]"] if staged else [])
                               + (["fixup_flags: cute.struct.MemRange[cutlass.Int32, 2]   # split-K fix-up: arrivals seen"]
                                  if sums_partials else []), 8),
        staged_host=_indent(staged_host, 4), reduce_lines=_indent(reduce_lines, 4),
        # stream-K walks its iterations itself: no static scheduler to set up
        sched_host=_indent((_TILES_MNL + "\n" + _STREAM_K_GRID if stream else _block('''
            # tile scheduler: a work unit is a cluster tile (M and N tiles rounded up to whole clusters) of
            # one split and batch, numbered $sched_order, then split * L; a persistent
            # grid of at most MAX_ACTIVE_CLUSTERS clusters walks them (see work_tile)
            $tiles_mnl
            clusters_m = (tiles_mnl[0] + CLUSTER_MN[0] - 1) // CLUSTER_MN[0]
            clusters_n = (tiles_mnl[1] + CLUSTER_MN[1] - 1) // CLUSTER_MN[1]
            work_units = clusters_m * clusters_n * tiles_mnl[2] * SPLIT_K
            # divisors with precomputed multipliers: the kernel decodes a unit with no integer division
            fast_clusters = cute.fast_divmod_create_divisor_v2(clusters_$fast)
            slow_clusters = cute.fast_divmod_create_divisor_v2(clusters_$slow)
            grid = (*CLUSTER_MN, cutlass.min(work_units, MAX_ACTIVE_CLUSTERS))''',
            sched_order=_unit_order(plan), fast=fast, slow=slow,
            tiles_mnl=_TILES_MNL)).splitlines(), 4),
        sched_arg="" if stream else "cutlass.Int32(work_units), fast_clusters, slow_clusters,")

    kernel = _kernel_source(plan, main_ops, main_inputs, pingpong, sk, fixup, stream)
    parts = [header, facts, host, kernel]
    if reduce_kernel:
        parts.append(reduce.source.strip("\n"))
    source = resolve_mode("\n\n\n".join(parts), pingpong)
    source = "\n".join(ln.rstrip() for ln in source.split("\n")) + "\n"
    check_input_names(source, plan.epilogue.inputs, params, "SM90")
    return EmittedKernel(arch="sm_90a", source=source, entry=entry, params=params, compile_arch="sm_90a")


_TILES_MNL = ("tiles_mnl = cute.zipped_divide(out_mnl, tiler=(TILE_MNK[0], TILE_MNK[1]))"
              "[(0, (None, None, None))].shape")


def _reorders(plan: KernelPlan) -> bool:
    """Whether the kernel maps its M-major enumeration of cluster tiles through swizzled_tile: under a
    swizzle, and under stream-K (which enumerates tiles itself) for raster n as well."""
    return plan.scheduler.swizzle > 1 or (plan.scheduler.split_k_mode == "stream" and plan.scheduler.raster != "m")


def _unit_extents(plan: KernelPlan) -> tuple[str, str]:
    """The cluster extents ("m", "n") of the work units, fastest first: the raster's varies fastest, or M
    under a swizzle, whose order swizzled_tile applies afterwards."""
    return ("m", "n") if plan.scheduler.swizzle > 1 or plan.scheduler.raster == "m" else ("n", "m")


def _unit_order(plan: KernelPlan) -> str:
    if plan.scheduler.swizzle > 1:
        return "M fastest (swizzled_tile then applies the plan's raster and swizzle)"
    return "M fastest (raster m)" if plan.scheduler.raster == "m" else "N fastest (raster n)"


def _max_clusters(plan: KernelPlan) -> int:
    from ...schedule import ARCH_LIMITS
    return ARCH_LIMITS["sm_90a"].active_clusters(plan.cluster[0] * plan.cluster[1])


def _kernel_source(plan: KernelPlan, ops, inputs, pingpong: bool, sk: int, fixup: bool, stream: bool) -> str:
    sums_partials = fixup or stream
    # an input's (m, n) in the problem: swapped A/B put the problem's n on the kernel's m coordinate
    coords = ("en", "em", "el") if plan.swap_ab else ("em", "en", "el")
    kparams = "".join(",\n    " + x for x in (["mWS: cute.Tensor", "mSem: cute.Tensor"] if sums_partials else [])
                      + input_kernel_params(inputs))

    staged = [i for _, i in tma_inputs(plan, inputs)]
    kparams += "".join(f",\n    tma_{i.name}: cute.CopyAtom, tma_{i.name}_mnl: cute.Tensor, {i.name}_smem: cute.ComposedLayout"
                       for i in staged)
    staged_loop = ""
    if ops and not staged:
        # epilogue DAG on the accumulator registers (f32), per element, with its (m, n, l) coordinate
        vals = {i.name: input_value_expr(i, *coords) for i in inputs}
        math_lines, result = epilogue_math_lines(ops, "cutlass.Float32(accumulators[ei])", vals)
        epi_math = _block('''
            # epilogue DAG (kernel-IR epilogue ops) on the accumulators in registers, f32
            tCcC = thr_mma_c.partition_C(cC_mnl[(None, None, tile_m, tile_n, tile_l)])
            for ei in cutlass.range_constexpr(cute.size(accumulators)):
                em = cutlass.min(tCcC[ei][0], num_m - 1)   # clamp: out-of-range rows/cols are never stored
                en = cutlass.min(tCcC[ei][1], num_n - 1)
                el = tile_l
            $math
                accumulators[ei] = $result
        ''', math=_indent(math_lines, 4), result=result)
    elif ops:
        # full inputs staged through smem by TMA: the DAG runs per epilogue sub-tile, on the registers
        # about to be stored, reading staged inputs at the element's position inside the sub-tile
        vals = {i.name: input_value_expr(i, *coords) for i in inputs}
        for i in staged:
            vals[i.name] = f"cutlass.Float32(s_{i.name}[(lm, ln, 0)].to(cutlass.Float32))"
        math_lines, result = epilogue_math_lines(ops, "cutlass.Float32(tRS_rC[v])", vals)
        parts = "\n".join(
            f"b{i.name}_s, b{i.name}_g = cpasync.tma_partition(tma_{i.name}, 0, cute.make_layout(1), "
            f"cute.group_modes(s_{i.name}, 0, 2), cute.zipped_divide(g_{i.name}[(None, None, tile_m, tile_n, tile_l)], "
            f"EPI_TILE))" for i in staged)
        epi_math = _block('''
            # epilogue DAG (kernel-IR epilogue ops): coordinates of the registers each sub-tile stores
            tRS_cC = tiled_r2s.retile(thr_mma_c.partition_C(cC_mnl[(None, None, tile_m, tile_n, tile_l)]))
            $parts
        ''', parts=parts)
        copies = "\n".join(f"    cute.copy(tma_{i.name}, b{i.name}_g[(None, epi_mn)], b{i.name}_s[(None, 0)], "
                           f"tma_bar_ptr=epi_bar)" for i in staged)
        load_bytes = " + ".join(f"cute.size_in_bytes({dsl_type(i.dtype)}, cute.slice_({i.name}_smem, (None, None, 0)))"
                                for i in staged)
        staged_loop = _block('''
            # epilogue inputs for this sub-tile: one TMA load into smem, completion on epi_bar
            epi_mn = epi_grid.get_hier_coord(ep)
            if store_warp:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(epi_bar, $load_bytes)
            $copies
            cute.arch.mbarrier_wait(epi_bar, epi_phase)
            epi_phase = epi_phase ^ 1
            for v in cutlass.range_constexpr(cute.size(tRS_rC)):
                crd = tRS_cC[ep * cute.size(tRS_rC) + v]
                em = cutlass.min(crd[0], num_m - 1)   # clamp: out-of-range rows/cols are never stored
                en = cutlass.min(crd[1], num_n - 1)
                el = tile_l
                lm = crd[0] - tile_m * TILE_MNK[0] - epi_mn[0] * EPI_TILE[0]
                ln = crd[1] - tile_n * TILE_MNK[1] - epi_mn[1] * EPI_TILE[1]
            $math
                tRS_rC[v] = $result
        ''', load_bytes=load_bytes, copies=copies, math=_indent(math_lines, 4), result=result)
    else:
        epi_math = "# epilogue DAG: none (plain store + cast)"


    staged_init = ""
    if staged:
        staged_init = _block('''
            # epilogue-input load barriers: one per consumer warpgroup (ping-pong), else only the first
            epi_load_bar = storage.epi_load_barriers.data_ptr()
            if tidx == 0:
                cute.arch.mbarrier_init(epi_load_bar, 1)
                cute.arch.mbarrier_init(epi_load_bar + 1, 1)
        ''') + "\n" + "\n".join(
            f"s_{i.name} = storage.s_{i.name}.get_tensor({i.name}_smem.outer, swizzle={i.name}_smem.inner)\n"
            f"g_{i.name} = cute.local_tile(tma_{i.name}_mnl, (TILE_MNK[0], TILE_MNK[1]), (None, None, None))"
            for i in staged)

    # the plan's raster and swizzle, applied to the scheduler's unswizzled order (no padded work units)
    swizzle_decode = "tile_m, tile_n = swizzled_tile(tile_m, tile_n, clusters_m, clusters_n)\n" \
        if plan.scheduler.swizzle > 1 else ""
    if stream:
        split_decode = _STREAM_K_DECODE + (
            "\n# the plan's raster and swizzle, applied to the M-major enumeration\n"
            "tile_m, tile_n = swizzled_tile(tile_m, tile_n, sk_clusters_m, sk_clusters_n)" if _reorders(plan) else "")
    elif sk > 1:
        split_decode = swizzle_decode + _block('''
            # split-K: work unit L coordinate = split * L + batch; each split owns a contiguous k-tile range
            tile_l = tile_l_raw % num_l
            k_begin = (tile_l_raw // num_l) * k_per_split
            k_count = k_tiles_of(tile_l_raw, k_tile_total, num_l)
            store_l = $store_l
        ''', store_l="tile_l" if fixup else "tile_l_raw")
    else:
        split_decode = swizzle_decode + _block('''
            tile_l = tile_l_raw
            k_begin = 0
            k_count = k_tile_total
            store_l = tile_l_raw
        ''')

    src = _block('''
        # ==== device kernel ==============================================================================
        @cute.kernel
        def gemm_kernel(
            tma_a: cute.CopyAtom, mA_mkl: cute.Tensor, tma_b: cute.CopyAtom, mB_nkl: cute.Tensor,
            $c_params, tiled_mma: cute.TiledMma,
            a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, c_smem: cute.ComposedLayout,
            ${sched_param}SharedStorage: cutlass.Constexpr$kparams,
        ):
            tidx, _, _ = cute.arch.thread_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            warp_group_idx = cute.arch.make_warp_uniform(tidx // 128)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_a)
                cpasync.prefetch_descriptor(tma_b)
        $prefetch_c

            # cluster position -> multicast masks (A: CTAs sharing this cluster row, B: this column)
            cta_layout_mnk = cute.make_layout((*CLUSTER_MN, 1))
            cta_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            cluster_coord = cta_layout_mnk.get_flat_coord(cta_rank)
            a_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1) if A_MULTICAST > 1 else 0
            b_mcast_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0) if B_MULTICAST > 1 else 0

            # shared memory: the A/B ring with its full/empty mbarriers (PipelineTmaAsync), C staging
            smem = cutlass.memory.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            tma_bytes = cute.size_in_bytes(A_DTYPE, cute.slice_(a_smem, (None, None, 0))) + \\
                cute.size_in_bytes(B_DTYPE, cute.slice_(b_smem, (None, None, 0)))
            # each consumer warp releases a stage to every CTA that multicast into it
            consumers_per_stage = 1 if PINGPONG else NUM_CONSUMER_WG
            ab_pipeline = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.ab_barriers.data_ptr(),
                num_stages=AB_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread, (A_MULTICAST + B_MULTICAST - 1) * consumers_per_stage * 4),
                tx_count=tma_bytes,
                cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
                defer_sync=True,
            )
        $staged_init
            pipeline.pipeline_init_arrive(cluster_shape_mn=CLUSTER_MN, is_relaxed=True)

            sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
            sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
            sC = storage.sC.get_tensor(c_smem.outer, swizzle=c_smem.inner)

            # CTA tiles of the global tensors: (bM, bK, m, k, l), (bN, bK, n, k, l), (bM, bN, m, n, l)
            gA = cute.local_tile(mA_mkl, (TILE_MNK[0], TILE_MNK[2]), (None, None, None))
            gB = cute.local_tile(mB_nkl, (TILE_MNK[1], TILE_MNK[2]), (None, None, None))
            gC = cute.local_tile(mC_mnl, (TILE_MNK[0], TILE_MNK[1]), (None, None, None))
            cC_mnl = cute.local_tile(cute.make_identity_tensor(out_mnl.shape), (TILE_MNK[0], TILE_MNK[1]),
                                     (None, None, None))
            num_m = cute.size(out_mnl, mode=[0])
            num_n = cute.size(out_mnl, mode=[1])
            num_l = cute.size(out_mnl, mode=[2])
            k_tile_total = cute.size(gA, mode=[3])
            k_per_split = (k_tile_total + SPLIT_K - 1) // SPLIT_K$cluster_counts$sched_setup

            # TMA partitions; a multicast load writes this CTA's slice into every CTA of the group
            tAsA, tAgA = cpasync.tma_partition(
                tma_a, cluster_coord[1], cute.make_layout(CLUSTER_MN[1]),
                cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
            tBsB, tBgB = cpasync.tma_partition(
                tma_b, cluster_coord[0], cute.make_layout(CLUSTER_MN[0]),
                cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))

            # WGMMA fragments (smem descriptors) for this consumer warpgroup
            consumer_wg = warp_group_idx - 1
            mma_wg = 0 if PINGPONG else consumer_wg
            thr_mma = tiled_mma.get_slice(mma_wg * 128)
            tCsA = thr_mma.partition_A(sA)
            tCsB = thr_mma.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA)
            tCrB = tiled_mma.make_fragment_B(tCsB)
            tCgC = thr_mma.partition_C(gC)
            accumulators = cute.make_rmem_tensor(tCgC.shape[:3], ACC_DTYPE)
            consumer_tidx = tidx % 128 if PINGPONG else tidx - 128
            thr_mma_c = tiled_mma.get_slice(consumer_tidx)

            # PDL bands: grids of at most PDL_EARLY_CTAS or at least PDL_FULL_CTAS CTAs prefetch before the
            # wait (below) and let the next kernel in once their last load is issued; mid-sized grids measured
            # slower with either
            grid_ctas = cute.arch.grid_dim()[0] * cute.arch.grid_dim()[1] * cute.arch.grid_dim()[2]
            pdl_banded = grid_ctas <= PDL_EARLY_CTAS or (PDL_FULL_CTAS > 0 and grid_ctas >= PDL_FULL_CTAS)
            # PDL: before waiting for the previous grid, warm L2 with this CTA's first k-tiles. A prefetch
            # only fills L2, the point of coherence, so it is safe even if the previous kernel writes them
            if PDL and PDL_PREFETCH_K_TILES > 0:
                if warp_idx == PRODUCER_WG * 4 and pdl_banded:
        $first_work
        $split_decode_f
                        with cute.arch.elect_one():
                            for kt in range(cutlass.min(k_count, PDL_PREFETCH_K_TILES)):
                                cute.prefetch(tma_a, tAgA[(None, tile_m, k_begin + kt, tile_l)])
                                cute.prefetch(tma_b, tBgB[(None, tile_n, k_begin + kt, tile_l)])
            pipeline.pipeline_init_wait(cluster_shape_mn=CLUSTER_MN)
            # PDL: everything above may overlap the previous kernel on the stream; no global memory is
            # read into shared memory or written before its grid has completed
            if PDL:
                cute.arch.griddepcontrol_wait()
            # split_k_mode serial: the reduce kernel is let in at once (it waits for this grid's partials); a
            # next GEMM is let in by the producer near the end (below): let in here, it measured up to 28% slower
            if PDL and REDUCE_KERNEL:
                cute.arch.griddepcontrol_launch_dependents()

            # ---- producer warpgroup (assign-warpgroup-roles: producer, PRODUCER_REGS registers) ----
            if warp_group_idx == PRODUCER_WG:
                cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp_idx == PRODUCER_WG * 4:
        $producer_sched
                load_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, AB_STAGES)
                # L2 policy: an operand whose every tile this grid loads once (one tile, or one cluster, across
                # the other extent: decode weights) streams through L2 evict-first; 0 is the default policy
                a_policy = cutlass.Int64(0)
                b_policy = cutlass.Int64(0)
                if cutlass.const_expr(A_EVICT_FIRST):
                    if (num_n + TILE_MNK[1] - 1) // TILE_MNK[1] <= CLUSTER_MN[1]:
                        a_policy = cutlass.Int64(L2_EVICT_FIRST)
                if cutlass.const_expr(B_EVICT_FIRST):
                    if (num_m + TILE_MNK[0] - 1) // TILE_MNK[0] <= CLUSTER_MN[0]:
                        b_policy = cutlass.Int64(L2_EVICT_FIRST)
        $producer_loop
        $split_decode_p
                    tAgA_t = tAgA[(None, tile_m, None, tile_l)]
                    tBgB_t = tBgB[(None, tile_n, None, tile_l)]
                    # TMA producer loop: wait for an empty stage, load A and B (multicast), arm its full barrier
                    for kt in range(k_count):
                        ab_pipeline.producer_acquire(load_state)
                        full_barrier = ab_pipeline.producer_get_barrier(load_state)
                        cute.copy(tma_a, tAgA_t[(None, k_begin + kt)], tAsA[(None, load_state.index)],
                                  tma_bar_ptr=full_barrier, mcast_mask=a_mcast_mask, cache_policy=a_policy)
                        cute.copy(tma_b, tBgB_t[(None, k_begin + kt)], tBsB[(None, load_state.index)],
                                  tma_bar_ptr=full_barrier, mcast_mask=b_mcast_mask, cache_policy=b_policy)
                        ab_pipeline.producer_commit(load_state)
                        load_state.advance()
        $producer_next
                # PDL: let the next kernel launch before this grid ends; its CTAs wait in
                # griddepcontrol.wait until this grid has completed. Grids in the bands do it once their
                # last load is issued, the others once their last stage is released
                if PDL and not REDUCE_KERNEL and pdl_banded:
                    cute.arch.griddepcontrol_launch_dependents()
                ab_pipeline.producer_tail(load_state)
                if PDL and not REDUCE_KERNEL and not pdl_banded:
                    cute.arch.griddepcontrol_launch_dependents()

            # ---- consumer warpgroups (assign-warpgroup-roles: consumers, CONSUMER_REGS registers) ----
            if warp_group_idx != PRODUCER_WG:
                cute.arch.setmaxregister_increase(CONSUMER_REGS)
        $consumer_sched
        $consumer
    ''', kparams=kparams,
        c_params=("mC_mnl: cute.Tensor, out_mnl: cute.Tensor" if plan.swap_ab
                  else "tma_c: cute.CopyAtom, mC_mnl: cute.Tensor, out_mnl: cute.Tensor"),
        sched_param="" if stream else ("work_units: cutlass.Int32, fast_clusters: cute.FastDivmodDivisorV2, "
                                       "slow_clusters: cute.FastDivmodDivisorV2, "),
        prefetch_c="" if plan.swap_ab else "        cpasync.prefetch_descriptor(tma_c)",
        staged_init=_indent(staged_init.splitlines(), 4), split_decode_p=_indent(split_decode.splitlines(), 12),
        split_decode_f=_indent(split_decode.splitlines(), 16),
        cluster_counts="\n" + _indent(_block('''
            # swizzled_tile's grid of whole clusters
            clusters_m = (num_m + TILE_MNK[0] * CLUSTER_MN[0] - 1) // (TILE_MNK[0] * CLUSTER_MN[0])
            clusters_n = (num_n + TILE_MNK[1] * CLUSTER_MN[1] - 1) // (TILE_MNK[1] * CLUSTER_MN[1])
        ''').splitlines(), 4) if plan.scheduler.swizzle > 1 else "",
        sched_setup="\n" + _indent((_STREAM_K_SETUP if stream else _STATIC_SETUP).splitlines(), 4),
        first_work=_indent((["sk_v = 0", "if sk_v < sk_len:"] if stream else [
            "if first_unit < work_units:",
            "    tile_m, tile_n, tile_l_raw = work_tile(first_unit, fast_clusters, slow_clusters)"]), 12),
        producer_sched=_indent(["# stream-K: this cluster's iterations, in the consumers' order", "sk_v = 0"]
                               if stream else [
            "# tile scheduler: same work order as the consumers", "unit = first_unit"], 8),
        producer_loop=_indent(["while sk_v < sk_len:"] if stream else
                              _STATIC_LOOP_HEAD.splitlines(), 8),
        producer_next=_indent(["sk_v += k_count"] if stream else
                              ["unit += grid_clusters"], 12),
        consumer_sched="" if stream else _indent(["unit = first_unit"], 8),
        consumer=_consumer_source(plan, epi_math, split_decode, pingpong, staged_loop, bool(staged), fixup, stream))
    return src


def _consumer_source(plan: KernelPlan, epi_math: str, split_decode: str, pingpong: bool, staged_loop: str,
                     staged: bool, fixup: bool, stream: bool) -> str:
    """Consumer main loop + epilogue. Cooperative: both WGs walk every tile, each owning half the rows.
    Ping-pong: WG c takes work units c, c+2, ...; ordered named barriers alternate main loops and
    epilogues between the two WGs, and the stage counter skips the other WG's k-tiles. Under the split-K
    fix-up or stream-K, the epilogue and store of a split tile run only in its last piece to arrive."""
    sums_partials = fixup or stream
    body = _block('''
        $r2s_setup
        epi_threads = 128 if PINGPONG else 128 * NUM_CONSUMER_WG
        epi_barrier = pipeline.NamedBarrier(barrier_id=1 + (consumer_wg if PINGPONG else 0), num_threads=epi_threads)
        store_warp = warp_idx == (warp_group_idx * 4 if PINGPONG else 4)
        store_pipeline = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, epi_threads))

        read_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, AB_STAGES)
        release_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, AB_STAGES)
        if cutlass.const_expr(PINGPONG):
            # ping-pong: ordered barriers (ids 3/4 main loop, 5/6 epilogue) hand the tensor cores and the
            # store path back and forth; WG 1 opens both for WG 0 first
            mma_turn = pipeline.NamedBarrier(barrier_id=3 + consumer_wg, num_threads=256)
            mma_next = pipeline.NamedBarrier(barrier_id=4 - consumer_wg, num_threads=256)
            epi_turn = pipeline.NamedBarrier(barrier_id=5 + consumer_wg, num_threads=256)
            epi_next = pipeline.NamedBarrier(barrier_id=6 - consumer_wg, num_threads=256)
            if consumer_wg == 1:
                mma_next.arrive()
                epi_next.arrive()
                # work unit 0 belongs to warpgroup 0: skip its stages
                $skip_stages
                unit += grid_clusters
        $loop_init
        num_tiles_done = 0
        $staged_setup$fixup_setup
        $loop_head
        $split_decode
            gC_t = gC[(None, None, tile_m, tile_n, store_l)]

            # ---- WGMMA main loop: wait for a full stage, MMA over its k-blocks, release the previous stage
            if cutlass.const_expr(PINGPONG):
                mma_turn.arrive_and_wait()
            accumulators.fill(0.0)
            tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.fence()
            num_k_blocks = cute.size(tCrA, mode=[2])
            for kt in range(k_count):
                ab_pipeline.consumer_wait(read_state)
                warpgroup.fence()   # order this batch after the previous one's register use
                for kb in cutlass.range_constexpr(num_k_blocks):
                    cute.gemm(tiled_mma, accumulators, tCrA[(None, None, kb, read_state.index)],
                              tCrB[(None, None, kb, read_state.index)], accumulators)
                warpgroup.commit_group()
                # keep one WGMMA batch in flight; the stage it read before is now free
                warpgroup.wait_group(1)
                if kt > 0:
                    ab_pipeline.consumer_release(release_state)
                    release_state.advance()
                read_state.advance()
            warpgroup.wait_group(0)
            if k_count > 0:
                ab_pipeline.consumer_release(release_state)
                release_state.advance()
            if cutlass.const_expr(PINGPONG):
                mma_next.arrive()
                # skip the stages of the other warpgroup's next tile
                unit += grid_clusters
                $skip_stages

            $fixup$epi_math

            # ---- epilogue store: sub-tiles through smem, one warp issues the TMA store
            if cutlass.const_expr(PINGPONG):
                epi_turn.arrive_and_wait()
            $store
            if cutlass.const_expr(PINGPONG):
                # the other warpgroup reuses the C buffers: drain this tile's TMA stores first
                if store_warp:
                    store_pipeline.producer_tail()
                epi_barrier.arrive_and_wait()
                epi_next.arrive()
            $count_tile
            $loop_next
        store_pipeline.producer_tail()
    ''', r2s_setup=_R2S_SWAPPED if plan.swap_ab else _R2S_TMA,
        split_decode=_indent(split_decode.splitlines(), 4),
        fixup=_indent_tail(_STREAM_K_FIXUP if stream else _FIXUP, 4) + "\n    " if sums_partials else "",
        # staged inputs only set up their partitions here, which the guarded store reads: left unguarded
        epi_math=_indent_tail(_last_split_only(epi_math, sums_partials and not staged), 4),
        fixup_setup=("\n" + _FIXUP_SETUP) if sums_partials else "",
        count_tile="" if sums_partials else "num_tiles_done += 1",
        loop_init="sk_v = 0" if stream else "",
        loop_head="while sk_v < sk_len:" if stream else _STATIC_LOOP_HEAD,
        loop_next="sk_v += k_count" if stream else "unit += grid_clusters",
        staged_setup=("epi_bar = epi_load_bar + (consumer_wg if PINGPONG else 0)\nepi_phase = cutlass.Int32(0)"
                      if staged else ""),
        store=_indent_tail(_last_split_only(Template(_STORE_DIRECT if plan.swap_ab else _STORE_TMA).substitute(
            staged_loop=_indent(staged_loop.splitlines(), 4)).strip("\n"), sums_partials, ("num_tiles_done += 1",)), 4),
        skip_stages=_indent_tail(_SKIP_STAGES, 8))
    return _indent(body.splitlines(), 8)


# the epilogue's register -> smem copy (stmatrix), for the TMA store below
_R2S_TMA = '''# registers -> smem (stmatrix) -> TMA store, EPI_TILE sub-tiles, EPI_STAGES buffers
r2s_atom = sm90_utils.get_smem_store_op(cutlass.tensor_utils.LayoutEnum.ROW_MAJOR, STORE_DTYPE, ACC_DTYPE)
c_atom_layout = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), STORE_DTYPE)
tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom_layout, tiled_mma))
thr_r2s = tiled_r2s.get_slice(consumer_tidx)
tRS_sC = thr_r2s.partition_D(sC)
tRS_acc = tiled_r2s.retile(accumulators)
rC_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
tRS_rC = cute.make_rmem_tensor(rC_shape, ACC_DTYPE)
tRS_rC_out = cute.make_rmem_tensor(rC_shape, STORE_DTYPE)'''
# swapped: no stmatrix copy (it needs an MMA N of at least 16), each element is stored from registers
_R2S_SWAPPED = "# swapped A/B: the epilogue stores each element from registers (no smem staging of C)"

# the epilogue's store: registers -> smem (stmatrix) -> TMA store, EPI_TILE sub-tiles, EPI_STAGES buffers
_STORE_TMA = '''
gC_epi = cute.zipped_divide(gC_t, EPI_TILE)
bSG_sC, bSG_gC = cpasync.tma_partition(
    tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), gC_epi)
num_epi = cute.size(gC_epi, mode=[1])
epi_grid = cute.make_layout(gC_epi.shape[1], stride=(gC_epi.shape[1][1], 1))
for ep in cutlass.range_constexpr(num_epi):
    for v in cutlass.range_constexpr(cute.size(tRS_rC)):
        tRS_rC[v] = tRS_acc[ep * cute.size(tRS_rC) + v]
$staged_loop
    tRS_rC_out.store(tRS_rC.load().to(STORE_DTYPE))
    buf = (num_tiles_done * num_epi + ep) % EPI_STAGES
    cute.copy(tiled_r2s, tRS_rC_out, tRS_sC[(None, None, None, buf)])
    cute.arch.fence_proxy("async.shared", space="cta")
    epi_barrier.arrive_and_wait()
    if store_warp:
        cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, epi_grid.get_hier_coord(ep))])
        store_pipeline.producer_commit()
        store_pipeline.producer_acquire()
    epi_barrier.arrive_and_wait()
'''

# swapped A/B: each element from registers straight to global memory, at its coordinate in the transposed
# view of out (the kernel's tile is out's transpose; its rows are out's columns)
_STORE_DIRECT = '''
tCcS = thr_mma_c.partition_C(cC_mnl[(None, None, tile_m, tile_n, tile_l)])
for si in cutlass.range_constexpr(cute.size(accumulators)):
    if tCcS[si][0] < num_m and tCcS[si][1] < num_n:
        out_mnl[(tCcS[si][0], tCcS[si][1], tile_l)] = cutlass.Float32(accumulators[si]).to(STORE_DTYPE)
'''


# split-K fix-up inside the kernel (split_k_mode fixup): every split of a tile publishes its f32 partial in
# register-fragment order (coalesced: element e of all threads is contiguous), then counts its arrival on
# the tile's semaphore. The last to arrive sums the partials in split order (the same sum whichever split
# finishes last), resets the semaphore for the next launch and runs the epilogue; the others skip it.
_FIXUP_SETUP = '''# split-K fix-up: tiles counted over whole clusters (the scheduler's padded grid), partials in float4s
fx_tiles_m = ((num_m + TILE_MNK[0] - 1) // TILE_MNK[0] + CLUSTER_MN[0] - 1) // CLUSTER_MN[0] * CLUSTER_MN[0]
fx_tiles_n = ((num_n + TILE_MNK[1] - 1) // TILE_MNK[1] + CLUSTER_MN[1] - 1) // CLUSTER_MN[1] * CLUSTER_MN[1]
fx_chunks = cute.size(accumulators) // 4
fx_acc = cute.make_tensor(accumulators.iterator, cute.make_layout((4, fx_chunks)))
fx_copy = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
fx_in = cute.make_rmem_tensor((4,), cutlass.Float32)
sFix = storage.fixup_flags.get_tensor(cute.make_layout(2))'''
# Both in-kernel sums (the split-K fix-up and stream-K) publish a partial the same way: this group's
# accumulators, as float4s, to workspace unit $unit (float4 c of thread t at (unit * fx_chunks + c) *
# epi_threads + t), then one thread counts the arrival on tile fx_tile's semaphore into sFix
_PUBLISH_PARTIAL = Template('''fx_mine = cute.make_tensor(
    mWS.iterator + cute.assume(($unit * fx_chunks * epi_threads + consumer_tidx) * 4, divby=4),
    cute.make_layout((4, fx_chunks), stride=(1, 4 * epi_threads)))
cute.copy(fx_copy, fx_acc, fx_mine)
epi_barrier.arrive_and_wait()
if consumer_tidx == 0:
    cute.arch.fence_acq_rel_gpu()   # release: the group's partial stores (ordered by the barrier) before the count
    sFix[(consumer_wg if PINGPONG else 0)] = cute.arch.atomic_add(
        mSem.iterator + fx_tile, cutlass.Int32(1), sem="acq_rel", scope="gpu")
epi_barrier.arrive_and_wait()''')
_FIXUP = '''# ---- split-K fix-up: publish this split's partial, count arrivals; the last split sums and stores.
# Float4 c of thread t of split s's partial is at ((tile * SPLIT_K + s) * fx_chunks + c) * epi_threads + t
fx_split = tile_l_raw // num_l
fx_tile = (tile_l * fx_tiles_n + tile_n) * fx_tiles_m + tile_m
''' + _PUBLISH_PARTIAL.substitute(unit="(fx_tile * SPLIT_K + fx_split)") + '''
is_last = sFix[(consumer_wg if PINGPONG else 0)] == SPLIT_K - 1
if is_last:
    for c in cutlass.range_constexpr(fx_chunks):
        for j in cutlass.range_constexpr(4):
            fx_acc[j, c] = cutlass.Float32(0.0)
        for s in cutlass.range_constexpr(SPLIT_K):
            cute.copy(fx_copy, cute.make_tensor(
                mWS.iterator + cute.assume((((fx_tile * SPLIT_K + s) * fx_chunks + c) * epi_threads + consumer_tidx) * 4,
                                           divby=4), cute.make_layout(4)), fx_in)
            for j in cutlass.range_constexpr(4):
                fx_acc[j, c] = fx_acc[j, c] + fx_in[j]
    if consumer_tidx == 0:
        mSem[fx_tile] = cutlass.Int32(0)'''


# stream-K (split_k_mode stream), the data-parallel + stream-K hybrid: the grid has one cluster per resident
# cluster slot (at most one per iteration). Whole waves of cluster tiles run data-parallel first (cluster c
# takes tiles c, c + G, ...), keeping the static scheduler's L2 locality; the tiles of the last partial wave
# and one full wave before it are shared out as (tile, k-tile) iterations: cluster c takes stream-K
# iterations [c * q + min(c, r), (c + 1) * q + min(c + 1, r)), q and r the quotient and remainder of their
# count by G, so no SM idles through a partial last wave.
_STREAM_K_GRID = '''# stream-K: one cluster per resident slot, at most one per (cluster tile, k-tile) iteration
sk_iterations = (((tiles_mnl[0] + CLUSTER_MN[0] - 1) // CLUSTER_MN[0]) * ((tiles_mnl[1] + CLUSTER_MN[1] - 1) // CLUSTER_MN[1])
                 * tiles_mnl[2] * ((cute.size(a_mkl, mode=[1]) + TILE_MNK[2] - 1) // TILE_MNK[2]))
grid = (CLUSTER_MN[0], CLUSTER_MN[1], cutlass.max(cutlass.min(sk_iterations, MAX_ACTIVE_CLUSTERS), 1))'''
_STREAM_K_SETUP = '''# stream-K: data-parallel waves of whole cluster tiles, then this cluster's share [sk_begin, sk_end) of
# the remaining tiles' (tile, k-tile) iterations
sk_clusters_m = (num_m + TILE_MNK[0] * CLUSTER_MN[0] - 1) // (TILE_MNK[0] * CLUSTER_MN[0])
sk_clusters_n = (num_n + TILE_MNK[1] * CLUSTER_MN[1] - 1) // (TILE_MNK[1] * CLUSTER_MN[1])
sk_tiles = sk_clusters_m * sk_clusters_n * num_l
sk_grid = cute.arch.grid_dim()[2]
sk_cluster = cute.arch.block_idx()[2]
sk_dp_waves = cutlass.max(sk_tiles // sk_grid - cutlass.min(sk_tiles % sk_grid, 1), 0)
sk_dp_tiles = sk_dp_waves * sk_grid
sk_dp_iters = sk_dp_waves * k_tile_total
sk_share = (sk_tiles - sk_dp_tiles) * k_tile_total // sk_grid
sk_extra = (sk_tiles - sk_dp_tiles) * k_tile_total % sk_grid
sk_begin = sk_cluster * sk_share + cutlass.min(sk_cluster, sk_extra)
sk_end = (sk_cluster + 1) * sk_share + cutlass.min(sk_cluster + 1, sk_extra)
sk_len = sk_dp_iters + sk_end - sk_begin'''
_STREAM_K_DECODE = '''# stream-K: this cluster's iteration sk_v starts a piece of cluster tile sk_tile (M fastest, then N, then
# L): a whole tile in the data-parallel waves (sk_in_dp = 1), else a run of stream-K iteration sk_it to the
# tile's last k-tile or to the end of this cluster's share
sk_in_dp = cutlass.min(cutlass.max(sk_dp_iters - sk_v, 0), 1)
sk_it = sk_begin + cutlass.max(sk_v - sk_dp_iters, 0)
sk_tile = (sk_in_dp * (sk_cluster + sk_v // k_tile_total * sk_grid)
           + (1 - sk_in_dp) * (sk_dp_tiles + sk_it // k_tile_total))
k_begin = (1 - sk_in_dp) * (sk_it % k_tile_total)
k_count = sk_in_dp * k_tile_total + (1 - sk_in_dp) * cutlass.min(k_tile_total - k_begin, sk_end - sk_it)
tile_m = sk_tile % sk_clusters_m * CLUSTER_MN[0] + cluster_coord[0]
tile_n = sk_tile // sk_clusters_m % sk_clusters_n * CLUSTER_MN[1] + cluster_coord[1]
tile_l = sk_tile // (sk_clusters_m * sk_clusters_n)
store_l = tile_l'''
# Each cluster has at most two split pieces (its share's first and last); piece j of cluster c of the grid
# has the workspace unit (2c + j) * cluster size + CTA rank. A tile's pieces belong to the clusters owning
# its first and last stream-K iterations and those between; owner(i) = min(i // (q + 1), r) + max(i - r(q + 1), 0) // q.
_STREAM_K_FIXUP = '''# ---- stream-K fix-up: a piece of a split tile publishes its f32 partial and counts its arrival; the
# last piece to arrive sums the tile's partials in cluster order (the same sum whichever arrives last)
is_last = k_count == k_tile_total
if k_count < k_tile_total:
    sk_first = (sk_tile - sk_dp_tiles) * k_tile_total
    sk_owner_first = (cutlass.min(sk_first // (sk_share + 1), sk_extra)
                      + cutlass.max(sk_first - sk_extra * (sk_share + 1), 0) // sk_share)
    sk_owner_last = (cutlass.min((sk_first + k_tile_total - 1) // (sk_share + 1), sk_extra)
                     + cutlass.max(sk_first + k_tile_total - 1 - sk_extra * (sk_share + 1), 0) // sk_share)
    # this piece is its cluster's first (j = 0) unless the share began in an earlier tile (j = 1)
    sk_unit = (sk_cluster * 2 + cutlass.min(sk_it - sk_begin, 1)) * (CLUSTER_MN[0] * CLUSTER_MN[1]) + cta_rank
    fx_tile = (tile_l * fx_tiles_n + tile_n) * fx_tiles_m + tile_m
''' + textwrap.indent(_PUBLISH_PARTIAL.substitute(unit="sk_unit"), "    ") + '''
    is_last = sFix[0] == sk_owner_last - sk_owner_first
    if is_last:
        for c in cutlass.range_constexpr(fx_chunks):
            for j in cutlass.range_constexpr(4):
                fx_acc[j, c] = cutlass.Float32(0.0)
        for sk_c in range(sk_owner_first, sk_owner_last + 1):
            sk_c_begin = sk_c * sk_share + cutlass.min(sk_c, sk_extra)
            sk_c_unit = ((sk_c * 2 + cutlass.min(cutlass.max(sk_first - sk_c_begin, 0), 1))
                         * (CLUSTER_MN[0] * CLUSTER_MN[1]) + cta_rank)
            for c in cutlass.range_constexpr(fx_chunks):
                cute.copy(fx_copy, cute.make_tensor(
                    mWS.iterator + cute.assume(((sk_c_unit * fx_chunks + c) * epi_threads + consumer_tidx) * 4,
                                               divby=4), cute.make_layout(4)), fx_in)
                for j in cutlass.range_constexpr(4):
                    fx_acc[j, c] = fx_acc[j, c] + fx_in[j]
        if consumer_tidx == 0:
            mSem[fx_tile] = cutlass.Int32(0)'''


def _last_split_only(code: str, fixup: bool, then: tuple[str, ...] = ()) -> str:
    """`code` (and the lines `then`) under the fix-up's `if is_last:`, so only the last split of a tile runs
    them; unchanged without the fix-up, or when `code` is only comments."""
    if not fixup or not any(ln.strip() and not ln.strip().startswith("#") for ln in code.splitlines()):
        return code
    return "if is_last:\n" + _indent(code.splitlines() + list(then), 4)


# Ping-pong: step both stage counters past the k-tiles of work unit `unit` (the other WG's). One template
# for the first work unit and for the one after each main loop, so they cannot drift.
_SKIP_STAGES = '''if unit < work_units:
    for _ in range(k_tiles_of(work_tile(unit, fast_clusters, slow_clusters)[2], k_tile_total, num_l)):
        read_state.advance()
        release_state.advance()'''

# the static scheduler: cluster z of the grid takes work units z, z + G, z + 2G, ... (G clusters in the grid)
_STATIC_SETUP = '''# tile scheduler: this cluster's work units are first_unit, first_unit + grid_clusters, ...
first_unit = cute.arch.make_warp_uniform(cute.arch.block_idx()[2])
grid_clusters = cute.arch.grid_dim()[2]'''
_STATIC_LOOP_HEAD = '''while unit < work_units:
    tile_m, tile_n, tile_l_raw = work_tile(unit, fast_clusters, slow_clusters)'''


def resolve_mode(source: str, pingpong: bool) -> str:
    """Keep only the code of the plan's mode: `if cutlass.const_expr(PINGPONG):` blocks are inlined
    (ping-pong) or dropped (cooperative), so a reader sees one kernel, not both."""
    out: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "if cutlass.const_expr(PINGPONG):":
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():   # trailing blank lines stay outside the block
                j -= 1
            if pingpong:
                out.extend(ln[4:] if ln.strip() else ln for ln in lines[i + 1:j])
            i = j
            continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    for both, (pp, coop) in _MODE_EXPRS.items():
        text = text.replace(both, pp if pingpong else coop)
    return text


# mode-dependent expressions of the kernel template, resolved at emission
_MODE_EXPRS = {
    "1 if PINGPONG else NUM_CONSUMER_WG": ("1", "NUM_CONSUMER_WG"),
    "0 if PINGPONG else consumer_wg": ("0", "consumer_wg"),
    "tidx % 128 if PINGPONG else tidx - 128": ("tidx % 128", "tidx - 128"),
    "128 if PINGPONG else 128 * NUM_CONSUMER_WG": ("128", "128 * NUM_CONSUMER_WG"),
    "(consumer_wg if PINGPONG else 0)": ("consumer_wg", "0"),
    "(warp_group_idx * 4 if PINGPONG else 4)": ("warp_group_idx * 4", "4"),
}


def _indent_tail(text: str, n: int) -> str:
    lines = text.splitlines()
    return "\n".join([lines[0]] + [" " * n + ln for ln in lines[1:]])
