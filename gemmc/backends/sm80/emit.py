"""Emit the SM80 (Ampere) GEMM as CuTe DSL source from a `KernelPlan`.

The kernel: uniform warps, no producer. A `stages`-deep ring of shared-memory tiles is filled with
16-byte cp.async copies (one commit group per k-tile, `wait_group(stages - 2)` before reading), read
with ldmatrix and multiplied with mma.sync m16n8k16 into f32 registers. A grouped raster maps the
1-D grid onto (tile_m, tile_n) for L2 reuse. The epilogue runs the plan's DAG per accumulator element
and stores straight to global memory (predicated). Split-K writes f32 partials to a workspace and the
shared reduction kernel (gemmc/backends/common.py) sums them in order and applies the epilogue.

Every number in the emitted module comes from the plan; the header names the plan field of each.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...errors import BuildError
from ...ir.plan import KernelPlan
from ...schedule import ARCH_LIMITS, SM80_COMPILE_ARCHS
from ...types import DType
from .. import GRID_YZ_MAX, EmittedKernel, Param
from ..common import (check_input_names, dsl_type, epilogue_math_lines, grouped_raster_source, input_kernel_args,
                      input_kernel_params, input_value_expr, input_view_lines, private_inputs, rebind_inputs,
                      splitk_reduce)

ENTRY = "gemm_sm80"


def emit(plan: KernelPlan, compile_arch: str | None = None) -> EmittedKernel:
    """CuTe DSL source for `plan` (arch "sm_80"), built for plan.pipeline.compile_arch (pipeline-staging
    decides it: $GEMMC_SM80_COMPILE_ARCH, else "sm_80") unless `compile_arch` names another target;
    "sm_90a" builds the same kernel for an H100/H200 (an sm_80 cubin does not load on Hopper)."""
    _check_plan(plan)
    compile_arch = compile_arch or plan.pipeline.compile_arch
    if compile_arch not in SM80_COMPILE_ARCHS:
        raise BuildError(f"compile_arch {compile_arch!r} cannot run the SM80 kernel; use one of {SM80_COMPILE_ARCHS}")
    smem, limit = plan.pipeline.ring_smem_bytes, ARCH_LIMITS[compile_arch].smem_bytes
    if smem > limit:
        raise BuildError(f"SM80 backend: the {plan.pipeline.stages}-stage A/B ring needs {smem} B of shared memory, "
                         f"over the {limit} B a CTA may use on {compile_arch}; use fewer stages or a smaller tile")
    params = kernel_params(plan)
    return EmittedKernel(arch=plan.arch, source=_source(plan, params), entry=ENTRY, params=params,
                         compile_arch=compile_arch)


def for_hopper(k: EmittedKernel) -> EmittedKernel:
    """The same SM80 kernel, compiled for sm_90a (to run it on an H100/H200)."""
    return replace(k, compile_arch="sm_90a")


# ---- plan checks --------------------------------------------------------------------------------

def _check_plan(plan: KernelPlan) -> None:
    def bad(what: str, fix: str):
        raise BuildError(f"SM80 backend: {what}; {fix}")

    p = plan.problem
    if plan.arch != "sm_80":
        bad(f"plan arch is {plan.arch!r}", "lower the schedule with arch='sm_80'")
    if plan.mma.kind != "mma.sync" or tuple(plan.mma.inst_shape) != (16, 8, 16):
        bad(f"MMA {plan.mma.kind} {plan.mma.inst_shape}", "SM80 plans use mma.sync (16, 8, 16)")
    if tuple(plan.cluster) != (1, 1):
        bad(f"cluster {plan.cluster}", "SM80 has no thread-block clusters: use (1, 1)")
    if plan.scheduler.pdl:
        bad("tile scheduler says pdl", "SM80 has no griddepcontrol: its kernels launch plain (pdl False)")
    if any(w.role != "uniform" for w in plan.warpgroups):
        bad(f"warpgroup roles {[w.role for w in plan.warpgroups]}", "SM80 plans use uniform warps only")
    if p.a_dtype != p.b_dtype or p.a_dtype not in (DType.bf16, DType.f16):
        bad(f"input dtypes {p.a_dtype}/{p.b_dtype}", "use bf16 or f16 for both A and B")
    if p.acc_dtype != DType.f32:
        bad(f"accumulator {p.acc_dtype}", "the SM80 backend accumulates in f32: use acc_dtype='f32'")
    am, an, ak = plan.mma.atom_layout
    warps = sum(w.warps for w in plan.warpgroups)
    if am * an * ak != warps or plan.threads != 32 * warps or ak != 1:
        bad(f"MMA atom layout {plan.mma.atom_layout} over {warps} warps ({plan.threads} threads)",
            "tile the warps over M and N only, one warp per atom")
    bm, bn, bk = plan.tile
    if bm % (16 * am) or bn % (16 * an) or bk % 16 or bk < 32:
        bad(f"tile {plan.tile} with atom layout {plan.mma.atom_layout}",
            "tile M must be a multiple of 16 x atoms_m, N of 16 x atoms_n, K of 16 and at least 32 "
            "(two k-blocks for the register double buffer)")
    if plan.pipeline.stages < 2:
        bad(f"{plan.pipeline.stages} stages", "the cp.async ring needs at least 2")
    if plan.pipeline.ring_smem_bytes < 1 or not plan.pipeline.compile_arch:
        bad(f"pipeline ring_smem_bytes {plan.pipeline.ring_smem_bytes}, compile_arch "
            f"{plan.pipeline.compile_arch!r}", "lower with pipeline-staging (it sizes the ring and picks the target)")
    for op in ("a", "b"):
        c = plan.copy(op)
        if c.kind != "cp_async" or c.vector_bytes not in (4, 8, 16):
            bad(f"operand {op} copy {c.kind} of {c.vector_bytes} B", "use cp_async with 4, 8 or 16 bytes")
        extent = _contiguous_extent(plan, op)
        if c.swizzle_bytes and c.swizzle_bytes > extent * p.a_dtype.bytes:
            bad(f"operand {op} swizzle {c.swizzle_bytes} B wider than the tile's contiguous {extent} elements",
                "choose a swizzle no wider than the contiguous tile extent in bytes")
        vec = c.vector_bytes // p.a_dtype.bytes
        rows = bm if op == "a" else bn
        major = p.a_major if op == "a" else p.b_major
        along = bk if major == "k" else rows
        if along % vec or plan.threads % (along // vec) or (rows if major == "k" else bk) % (plan.threads // (along // vec)):
            bad(f"operand {op}: {plan.threads} threads cannot tile a {rows}x{bk} tile in {vec}-element vectors",
                "use a tile whose extents are multiples of the copy's thread arrangement")
    if plan.scheduler.persistent:
        bad("persistent tile scheduler", "SM80 plans launch one CTA per tile: persistent=False")
    if plan.scheduler.raster not in ("m", "n") or plan.scheduler.swizzle < 1:
        bad(f"raster {plan.scheduler.raster!r} swizzle {plan.scheduler.swizzle}", "raster 'm'|'n', swizzle >= 1")
    if plan.scheduler.split_k < 1:
        bad(f"split_k {plan.scheduler.split_k}", "use split_k >= 1")
    if plan.scheduler.split_k_mode == "fixup":
        bad("split_k_mode fixup (the in-kernel split-K sum is SM90's)", "split_k_mode serial: the reduce kernel sums")
    if plan.epilogue.store != "direct":
        bad(f"epilogue store {plan.epilogue.store!r}", "SM80 stores from registers: store='direct'")


def _contiguous_extent(plan: KernelPlan, op: str) -> int:
    bm, bn, bk = plan.tile
    major = plan.problem.a_major if op == "a" else plan.problem.b_major
    if major == "k":
        return bk
    return bm if op == "a" else bn


# ---- params -------------------------------------------------------------------------------------

def kernel_params(plan: KernelPlan) -> tuple[Param, ...]:
    """a, b, out, epilogue inputs (in plan order), then the split-K workspace."""
    p = plan.problem
    lead = (p.batch,) if p.batch is not None else ()
    a_shape = (p.m, p.k) if p.a_major == "k" else (p.k, p.m)
    b_shape = (p.n, p.k) if p.b_major == "k" else (p.k, p.n)
    params = [
        Param("a", "tensor", p.a_dtype, lead + a_shape, -1, "a"),
        Param("b", "tensor", p.b_dtype, lead + b_shape, -1, "b"),
        # the grid's z extent is the batch (the reduce kernel's y extent too)
        Param("out", "tensor", p.out_dtype, lead + (p.m, p.n), -1, "out",
              limits=((0, GRID_YZ_MAX),) if lead else ()),
    ]
    for inp in plan.epilogue.inputs:
        if inp.kind == "scalar":
            params.append(Param(inp.name, "scalar", DType.f32, (), -1, "scalar"))
        else:
            shape = {"row": (p.n,), "col": (p.m,), "full": (p.m, p.n)}[inp.kind]
            params.append(Param(inp.name, "tensor", inp.dtype, lead + shape, -1, "input"))
    if plan.scheduler.split_k > 1:
        # flat f32 partials, (SPLIT_K, L, M, N) row-major: split s of batch l is slice s * L + l
        batch = p.batch if p.batch is not None else 1
        elems = f"{plan.scheduler.split_k} * ({batch}) * ({p.m}) * ({p.n})"
        params.append(Param("workspace", "workspace", DType.f32, (elems,), -1, "workspace", workspace_elems=elems))
    return tuple(params)


# ---- source -------------------------------------------------------------------------------------

def _swizzle_bits(swizzle_bytes: int) -> int:
    """128 B -> 3, 64 B -> 2, 32 B -> 1, none -> 0: XORed 16-byte-chunk bits per swizzle row."""
    return int(math.log2(swizzle_bytes // 16)) if swizzle_bytes >= 32 else 0


def _atom_cols(swizzle_bytes: int, elem_bytes: int) -> int:
    """Contiguous elements in one smem layout atom row: one swizzle width (16 B when unswizzled)."""
    return max(swizzle_bytes, 16) // elem_bytes


def _header(plan: KernelPlan) -> str:
    p = plan.problem
    a, b = plan.copy("a"), plan.copy("b")
    bm, bn, bk = plan.tile
    am, an, ak = plan.mma.atom_layout
    return f'''"""gemmc SM80 kernel `{p.name}`: cp.async ring -> ldmatrix -> mma.sync m16n8k16 -> fused epilogue.

Generated from a KernelPlan by gemmc/backends/sm80; edit the plan, not this file.
A {p.a_dtype} ({'M x K' if p.a_major == 'k' else 'K x M'}), B {p.b_dtype} ({'N x K' if p.b_major == 'k' else 'K x N'}), out {p.out_dtype} (M x N){', batched' if p.batch is not None else ''}.
"""
import cutlass
import cutlass.cute as cute

# ---- kernel-IR facts: each line is one KernelPlan field; nothing below decides anything itself ----
TILE_M, TILE_N, TILE_K = {bm}, {bn}, {bk}  # plan.tile
STAGES = {plan.pipeline.stages}  # plan.pipeline.stages: cp.async groups in the smem ring
THREADS = {plan.threads}  # plan.threads: uniform warps ({len(plan.warpgroups)} x {plan.warpgroups[0].warps})
MMA_INST = {tuple(plan.mma.inst_shape)}  # plan.mma.inst_shape (mma.sync)
MMA_ATOMS = ({am}, {an}, {ak})  # plan.mma.atom_layout: warps over M, N, K
AB = {dsl_type(p.a_dtype)}  # plan.problem.a_dtype / b_dtype
ACC = {dsl_type(p.acc_dtype)}  # plan.problem.acc_dtype
OUT = {dsl_type(p.out_dtype)}  # plan.problem.out_dtype
A_K_MAJOR = {p.a_major == 'k'}  # plan.problem.a_major
B_K_MAJOR = {p.b_major == 'k'}  # plan.problem.b_major
A_VEC = {a.vector_bytes // p.a_dtype.bytes}  # plan.copy("a").vector_bytes, in elements
B_VEC = {b.vector_bytes // p.b_dtype.bytes}  # plan.copy("b").vector_bytes, in elements
A_SWIZZLE_BITS = {_swizzle_bits(a.swizzle_bytes)}  # plan.copy("a").swizzle_bytes = {a.swizzle_bytes}
B_SWIZZLE_BITS = {_swizzle_bits(b.swizzle_bytes)}  # plan.copy("b").swizzle_bytes = {b.swizzle_bytes}
A_ATOM_COLS = {_atom_cols(a.swizzle_bytes, p.a_dtype.bytes)}  # one swizzle row of A, in elements
B_ATOM_COLS = {_atom_cols(b.swizzle_bytes, p.b_dtype.bytes)}  # one swizzle row of B, in elements
RASTER_M = {plan.scheduler.raster == 'm'}  # plan.scheduler.raster: consecutive CTAs step along M
GROUP = {plan.scheduler.swizzle}  # plan.scheduler.swizzle: tiles per group along the raster's slow dim
SPLIT_K = {plan.scheduler.split_k}  # plan.scheduler.split_k
'''


_HELPERS = '''

# ---- shared-memory layouts and copies (host side; passed to the kernel) -----------------------------

def smem_layout(k_major, rows, cols):
    """(rows, TILE_K, STAGES) ring of atoms: 8 rows x `cols` contiguous elements (one swizzle row)."""
    if k_major:
        atom = cute.make_layout((8, cols), stride=(cols, 1))
    else:
        atom = cute.make_layout((cols, 8), stride=(1, cols))
    return cute.tile_to_shape(atom, (rows, TILE_K, STAGES), (0, 1, 2))


def smem_swizzle(swizzle_bits):
    # on byte addresses: XOR the 16-byte chunk index with the 128-byte row index (vectors stay whole)
    return cute.make_swizzle(swizzle_bits, 4, 3)


def gmem_to_smem_copy(k_major, rows, vec):
    """cp.async tiled copy: each thread moves vec contiguous elements along the major dim."""
    bits = vec * AB.width
    mode = cute.nvgpu.LoadCacheMode.GLOBAL if bits == 128 else cute.nvgpu.LoadCacheMode.ALWAYS
    atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=mode), AB, num_bits_per_copy=bits)
    if k_major:
        along = TILE_K // vec
        threads = cute.make_layout((THREADS // along, along), stride=(along, 1))
        values = cute.make_layout((1, vec))
    else:
        along = rows // vec
        threads = cute.make_layout((along, THREADS // along), stride=(1, along))
        values = cute.make_layout((vec, 1))
    return cute.make_tiled_copy_tv(atom, threads, values)


def mkl_view(t, k_major_storage, batched):
    """Storage-shape tensor -> (rows, K, L) view (rows = M for A, N for B)."""
    if batched:
        modes = [1, 2, 0] if k_major_storage else [2, 1, 0]
        return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))
    if k_major_storage:
        return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1, stride=0)))
    kt = cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0]))
    return cute.make_tensor(kt.iterator, cute.append(kt.layout, cute.make_layout(1, stride=0)))

'''


_KERNEL_BODY = '''
    tidx, _, _ = cute.arch.thread_idx()
    bidx, split, l = cute.arch.block_idx()
    num_m = cute.size(mC, mode=[0])
    num_n = cute.size(mC, mode=[1])
    num_k = cute.size(mA, mode=[1])
    tiles_m = (num_m + TILE_M - 1) // TILE_M
    tiles_n = (num_n + TILE_N - 1) // TILE_N
    tile_m, tile_n = tile_coord(bidx, tiles_m, tiles_n)

    # ---- tile scheduler: this CTA's output tile and its k-tiles --------------------------------
    # The K residue goes into the first k-tile (shifted left), so only the first load checks K.
    k_tiles = (num_k + TILE_K - 1) // TILE_K
    k_residue = num_k - k_tiles * TILE_K
    per_split = (k_tiles + SPLIT_K - 1) // SPLIT_K
    k_first = split * per_split
    k_count = k_tiles - k_first
    if k_count > per_split:
        k_count = per_split
    if k_count < 0:
        k_count = 0

    gA = cute.local_tile(mA[None, None, l], (TILE_M, TILE_K), (tile_m, None))  # (BM, BK, k)
    gB = cute.local_tile(mB[None, None, l], (TILE_N, TILE_K), (tile_n, None))  # (BN, BK, k)
    gA = cute.domain_offset((0, k_residue, 0), gA)
    gB = cute.domain_offset((0, k_residue, 0), gB)
    gA = cute.make_tensor(gA.iterator.align(16), gA.layout)
    gB = cute.make_tensor(gB.iterator.align(16), gB.layout)
    cA = cute.local_tile(cute.make_identity_tensor((num_m, num_k)), (TILE_M, TILE_K), (tile_m, None))
    cB = cute.local_tile(cute.make_identity_tensor((num_n, num_k)), (TILE_N, TILE_K), (tile_n, None))
    cA = cute.domain_offset((0, k_residue, 0), cA)
    cB = cute.domain_offset((0, k_residue, 0), cB)

    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(AB, sA_layout, 1024, swizzle=sA_swizzle)  # (BM, BK, STAGES)
    sB = smem.allocate_tensor(AB, sB_layout, 1024, swizzle=sB_swizzle)  # (BN, BK, STAGES)

    # ---- cp.async partitions and M/N predicates (computed once) --------------------------------
    thr_copy_A = copy_A.get_slice(tidx)
    thr_copy_B = copy_B.get_slice(tidx)
    tAgA = thr_copy_A.partition_S(gA)  # (CPY, CPY_M, CPY_K, k)
    tAsA = thr_copy_A.partition_D(sA)  # (CPY, CPY_M, CPY_K, STAGES)
    tAcA = thr_copy_A.partition_S(cA)
    tBgB = thr_copy_B.partition_S(gB)
    tBsB = thr_copy_B.partition_D(sB)
    tBcB = thr_copy_B.partition_S(cB)
    tApA = cute.make_rmem_tensor(
        cute.make_layout((tAgA.shape[0][1], cute.size(tAgA, mode=[1]), cute.size(tAgA, mode=[2])),
                         stride=(cute.size(tAgA, mode=[1]), 1, 0)), cutlass.Boolean)
    tBpB = cute.make_rmem_tensor(
        cute.make_layout((tBgB.shape[0][1], cute.size(tBgB, mode=[1]), cute.size(tBgB, mode=[2])),
                         stride=(cute.size(tBgB, mode=[1]), 1, 0)), cutlass.Boolean)
    for v in cutlass.range_constexpr(tApA.shape[0]):
        for i in cutlass.range_constexpr(tApA.shape[1]):
            tApA[v, i, 0] = cute.elem_less(tAcA[(0, v), i, 0, 0][0], num_m)
    for v in cutlass.range_constexpr(tBpB.shape[0]):
        for i in cutlass.range_constexpr(tBpB.shape[1]):
            tBpB[v, i, 0] = cute.elem_less(tBcB[(0, v), i, 0, 0][0], num_n)

    # ---- prologue: STAGES - 1 k-tiles in flight, one commit group each -------------------------
    # Zero the ring so the K residue and predicated-off rows read as 0.
    tAsA.fill(0)
    tBsB.fill(0)
    cute.arch.sync_threads()
    if k_count > 0:
        for kk in cutlass.range_constexpr(cute.size(tAsA, mode=[2])):
            if cute.elem_less(-1, tAcA[0, 0, kk, k_first][1]):
                cute.copy(copy_A, tAgA[None, None, kk, k_first], tAsA[None, None, kk, 0], pred=tApA[None, None, kk])
        for kk in cutlass.range_constexpr(cute.size(tBsB, mode=[2])):
            if cute.elem_less(-1, tBcB[0, 0, kk, k_first][1]):
                cute.copy(copy_B, tBgB[None, None, kk, k_first], tBsB[None, None, kk, 0], pred=tBpB[None, None, kk])
    cute.arch.cp_async_commit_group()
    for s in cutlass.range_constexpr(1, STAGES - 1):
        if s < k_count:
            cute.copy(copy_A, tAgA[None, None, None, k_first + s], tAsA[None, None, None, s], pred=tApA)
            cute.copy(copy_B, tBgB[None, None, None, k_first + s], tBsB[None, None, None, s], pred=tBpB)
        cute.arch.cp_async_commit_group()

    # ---- main loop: wait for k-tile kt, refill the slot freed last iteration, ldmatrix + mma.sync
    thr_mma = tiled_mma.get_slice(tidx)
    gC = cute.local_tile(mC[None, None, l], (TILE_M, TILE_N), (tile_m, tile_n))
    tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA)[None, None, None, 0])
    tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB)[None, None, None, 0])
    acc = tiled_mma.make_fragment_C(thr_mma.partition_C(gC))
    acc.fill(0.0)
    thr_ldsm_A = ldsm_A.get_slice(tidx)
    thr_ldsm_B = ldsm_B.get_slice(tidx)
    tXsA = thr_ldsm_A.partition_S(sA)
    tXrA = thr_ldsm_A.retile(tCrA)
    tXsB = thr_ldsm_B.partition_S(sB)
    tXrB = thr_ldsm_B.retile(tCrB)
    k_blocks = cute.size(tCrA, mode=[2])

    # Register double buffer: k-block kb + 1 is read from smem while kb multiplies; the last k-block
    # of tile kt waits for tile kt + 1 and reads its first k-block, so the barrier overlaps the MMAs.
    cute.arch.cp_async_wait_group(STAGES - 2)
    cute.arch.sync_threads()
    cute.copy(ldsm_A, tXsA[None, None, 0, 0], tXrA[None, None, 0])
    cute.copy(ldsm_B, tXsB[None, None, 0, 0], tXrB[None, None, 0])
    for kt in range(k_count):
        rslot = kt % STAGES
        next_slot = (kt + 1) % STAGES
        for kb in cutlass.range_constexpr(k_blocks):
            if kb == k_blocks - 1:
                # every thread is done reading slot (kt - 1) % STAGES, and tile kt + 1 has landed
                cute.arch.cp_async_wait_group(STAGES - 2)
                cute.arch.sync_threads()
                cute.copy(ldsm_A, tXsA[None, None, 0, next_slot], tXrA[None, None, 0])
                cute.copy(ldsm_B, tXsB[None, None, 0, next_slot], tXrB[None, None, 0])
            else:
                cute.copy(ldsm_A, tXsA[None, None, kb + 1, rslot], tXrA[None, None, kb + 1])
                cute.copy(ldsm_B, tXsB[None, None, kb + 1, rslot], tXrB[None, None, kb + 1])
            if kb == 0:
                # refill the slot freed at the previous tile's last barrier with tile kt + STAGES - 1
                nxt = kt + STAGES - 1
                if nxt < k_count:
                    wslot = nxt % STAGES
                    cute.copy(copy_A, tAgA[None, None, None, k_first + nxt], tAsA[None, None, None, wslot], pred=tApA)
                    cute.copy(copy_B, tBgB[None, None, None, k_first + nxt], tBsB[None, None, None, wslot], pred=tBpB)
                cute.arch.cp_async_commit_group()
            cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)
    cute.arch.cp_async_wait_group(0)

    # ---- epilogue: per accumulator element, predicated on (M, N) -------------------------------
    cC = cute.local_tile(cute.make_identity_tensor((num_m, num_n)), (TILE_M, TILE_N), (tile_m, tile_n))
    tCcC = thr_mma.partition_C(cC)
'''

_STORE_OUT = '''    tCgC = thr_mma.partition_C(gC)
    if (tile_m + 1) * TILE_M <= num_m and (tile_n + 1) * TILE_N <= num_n:
        # interior tile: no predicates; the fragment goes out in vectors of adjacent columns
        tCrD = cute.make_rmem_tensor(acc.layout, OUT)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            coord = tCcC[i]
            m = coord[0]
            n = coord[1]
            acc_i = acc[i]
@MATH@
            tCrD[i] = (@RESULT@).to(OUT)
        cute.autovec_copy(tCrD, tCgC)
    else:
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            coord = tCcC[i]
            if cute.elem_less(coord, (num_m, num_n)):
                m = coord[0]
                n = coord[1]
                acc_i = acc[i]
@MATH2@
                tCgC[i] = (@RESULT@).to(OUT)
'''

_STORE_PARTIAL = '''    # split-K: this split's f32 partial goes to workspace slice split * L + l
    num_l = cute.size(mC, mode=[2])
    gW = cute.local_tile(mW[None, None, split * num_l + l], (TILE_M, TILE_N), (tile_m, tile_n))
    tCgW = thr_mma.partition_C(gW)
    for i in cutlass.range(cute.size(acc), unroll_full=True):
        if cute.elem_less(tCcC[i], (num_m, num_n)):
            tCgW[i] = acc[i]
'''


def _source(plan: KernelPlan, params: tuple[Param, ...]) -> str:
    p = plan.problem
    ep = plan.epilogue
    batched = p.batch is not None
    split = plan.scheduler.split_k > 1
    user_inputs = tuple(ep.inputs)
    inputs, ops = private_inputs(user_inputs, tuple(ep.ops))
    # kernel signature: the (M, N, L) views, then the inputs (or the workspace), then static objects
    kparams = ["mA: cute.Tensor", "mB: cute.Tensor", "mC: cute.Tensor"]
    kargs = ["mA", "mB", "mC"]
    if split:
        kparams.append("mW: cute.Tensor")
        kargs.append("mW")
    else:
        kparams += input_kernel_params(inputs)
        kargs += input_kernel_args(inputs)
    statics = ["sA_layout: cute.Layout", "sA_swizzle: cute.Swizzle", "sB_layout: cute.Layout",
               "sB_swizzle: cute.Swizzle", "copy_A: cute.TiledCopy", "copy_B: cute.TiledCopy",
               "tiled_mma: cute.TiledMma", "ldsm_A: cute.TiledCopy", "ldsm_B: cute.TiledCopy"]
    kparams += statics
    kargs += [s.split(":")[0] for s in statics]

    out = [_header(plan), _HELPERS + grouped_raster_source("RASTER_M", "GROUP")]
    if split:
        # sm_80 has no PDL: the reduce kernel launches plain, after the main kernel on the stream
        reduce = splitk_reduce(ops, inputs, plan.scheduler.split_k, p.out_dtype, "mW", "mC")
        out.append(reduce.source)

    # ---- kernel
    out.append("\n@cute.kernel")
    out.append(f"def gemm_kernel({', '.join(kparams)}):")
    out.append('    """One CTA per (tile_m, tile_n, split, l); uniform warps run copy, MMA and epilogue."""')
    out.append(_KERNEL_BODY.rstrip("\n"))
    if split:
        out.append(_STORE_PARTIAL.rstrip("\n"))
    else:
        vals = {i.name: input_value_expr(i, "m", "n", "l") for i in inputs}
        math_lines, result = epilogue_math_lines(ops, "acc_i", vals)
        body = "\n".join(" " * 12 + ln for ln in math_lines) or " " * 12 + "pass"
        body2 = "\n".join(" " * 16 + ln for ln in math_lines) or " " * 16 + "pass"
        out.append(_STORE_OUT.replace("@MATH@", body).replace("@MATH2@", body2).replace("@RESULT@", result).rstrip("\n"))

    # ---- host entry
    sig = [f"{q.name}: cutlass.Float32" if q.kind == "scalar" else f"{q.name}: cute.Tensor" for q in params]
    out.append("\n\n@cute.jit")
    out.append(f"def {ENTRY}({', '.join(sig + ['stream'])}):")
    out.append('    """Host side: (M, N, L) views of the storage-shape tensors, static layouts, launch."""')
    out += ["    " + ln for ln in rebind_inputs(user_inputs, inputs)]
    out.append(f"    mA = mkl_view(a, A_K_MAJOR, {batched})")
    out.append(f"    mB = mkl_view(b, B_K_MAJOR, {batched})")
    out.append(f"    mC = mkl_view(out, True, {batched})")
    out += ["    " + ln for ln in input_view_lines(inputs, batched)]
    out.append("    num_m = cute.size(mC, mode=[0])")
    out.append("    num_n = cute.size(mC, mode=[1])")
    out.append("    num_l = cute.size(mC, mode=[2])")
    if split:
        out.append("    # workspace: SPLIT_K x L f32 slices of M x N; view (M, N, (L, SPLIT_K)) so slice s*L+l is split s")
        out.append("    slice_elems = cutlass.Int64(num_m) * num_n  # 64-bit: SPLIT_K * L * M * N may pass 2^31")
        out.append("    mW = cute.make_tensor(workspace.iterator, cute.make_layout(")
        out.append("        (num_m, num_n, (num_l, SPLIT_K)), stride=(cutlass.Int64(num_n), 1, (slice_elems, slice_elems * num_l))))")
    out.append("    sA_layout = smem_layout(A_K_MAJOR, TILE_M, A_ATOM_COLS)")
    out.append("    sB_layout = smem_layout(B_K_MAJOR, TILE_N, B_ATOM_COLS)")
    out.append("    sA_swizzle = smem_swizzle(A_SWIZZLE_BITS)")
    out.append("    sB_swizzle = smem_swizzle(B_SWIZZLE_BITS)")
    out.append("    copy_A = gmem_to_smem_copy(A_K_MAJOR, TILE_M, A_VEC)")
    out.append("    copy_B = gmem_to_smem_copy(B_K_MAJOR, TILE_N, B_VEC)")
    out.append("    # warps tile the CTA over M and N; N permuted x2 so one ldmatrix.x4 feeds two n8 atoms")
    out.append("    tiled_mma = cute.make_tiled_mma(cute.nvgpu.warp.MmaF16BF16Op(AB, ACC, MMA_INST),")
    out.append("                                    cute.make_layout(MMA_ATOMS),")
    out.append("                                    permutation_mnk=(MMA_ATOMS[0] * MMA_INST[0], MMA_ATOMS[1] * MMA_INST[1] * 2,")
    out.append("                                                     MMA_ATOMS[2] * MMA_INST[2]))")
    out.append("    ldsm_A = cute.make_tiled_copy_A(cute.make_copy_atom(")
    out.append("        cute.nvgpu.warp.LdMatrix8x8x16bOp(not A_K_MAJOR, 4), AB), tiled_mma)")
    out.append("    ldsm_B = cute.make_tiled_copy_B(cute.make_copy_atom(")
    out.append("        cute.nvgpu.warp.LdMatrix8x8x16bOp(not B_K_MAJOR, 4), AB), tiled_mma)")
    out.append("    tiles = ((num_m + TILE_M - 1) // TILE_M) * ((num_n + TILE_N - 1) // TILE_N)")
    out.append(f"    gemm_kernel({', '.join(kargs)}).launch(")
    out.append("        grid=[tiles, SPLIT_K, num_l], block=[THREADS, 1, 1], stream=stream)")
    if split:
        out += ["    " + ln for ln in reduce.launch_lines]
    source = "\n".join(out) + "\n"
    check_input_names(source, user_inputs, params, "SM80")
    return source
