"""The one validity predicate over (schedule, problem): `check_schedule` lists every rule broken, each with the
limit, the value and a fix. The verifier pass, the heuristic and every search strategy call it."""
from __future__ import annotations

import math

from ..alignment import ALIGN_BYTES, alignment_elems
from ..errors import ScheduleError
from ..spec import SCALE_BLOCK, GemmSpec
from ..types import DType
from .knobs import L2_FIELDS, Schedule, Violation, is_int, is_sizes
from .limits import (ARCH_LIMITS, CONSUMER_REG_OVERHEAD, CONSUMER_REGS_MAX, GRID_YZ_MAX, INT32_MAX, L2_POLICIES,
                     L2_PREFETCH_MAX, MODES, RASTERS, SM80_MAX_REGS, SPLITK_REDUCE_COLUMNS, SWIZZLES)
from .resources import (SWAP_MAX_SPLITS, ab_stage_bytes, accumulator_regs, consumer_reg_overhead, consumer_warpgroups,
                        epilogue_smem_bytes, kernel_grid, max_stages, register_budgets, register_pool, resolve_stages,
                        smem_bytes, split_k_mode, splits_n, threads_per_cta)


def check_schedule(s: Schedule, spec: GemmSpec) -> list[Violation]:
    """Every rule `s` breaks for `spec` (empty: valid). The single source of truth."""
    v: list[Violation] = []
    add = lambda limit, value, fix: v.append(Violation(limit, value, fix))  # noqa: E731
    lim = ARCH_LIMITS[s.arch]
    sm90 = s.arch == "sm_90a"

    # form first: the resource model below needs integer sizes, stages and split_k
    if not is_sizes(s.tile, 3):
        add("tile", repr(s.tile), "use three integers (M, N, K), e.g. tile=(128, 128, 64)")
    if not is_sizes(s.cluster, 2):
        add("cluster", repr(s.cluster), "use two integers (M, N), the CTAs per cluster, e.g. cluster=(2, 1)")
    stages_ok = s.stages == "auto" or is_int(s.stages)
    if not stages_ok:
        add("stages", repr(s.stages), "use an integer of at least 2, or 'auto'")
    if s.mode not in MODES:
        add("mode", s.mode, f"use one of {MODES}")
    if s.raster not in RASTERS:
        add("raster order", s.raster, "use 'm' or 'n'")
    if not (is_int(s.swizzle) and s.swizzle in SWIZZLES):
        add("swizzle", repr(s.swizzle), f"use one of {SWIZZLES}")
    if not (is_int(s.split_k) and 1 <= s.split_k <= 16):
        add("split_k", repr(s.split_k), "use an integer from 1 to 16")
    if not isinstance(s.pdl, bool):
        add("pdl", s.pdl, "use True (programmatic dependent launch, the default) or False (plain launches)")
    if not isinstance(s.swap_ab, bool):
        add("swap_ab", s.swap_ab, "use False (the default) or True (the kernel computes out^T = b @ a^T)")
    elif s.swap_ab and not sm90:
        add("swap_ab", True, "swapping A and B is SM90-only: use swap_ab=False on sm_80")
    elif s.swap_ab and is_int(s.split_k) and s.split_k > SWAP_MAX_SPLITS:
        add("swap_ab with split_k", s.split_k, f"a swapped kernel sums its splits in the kernel, at most "
            f"{SWAP_MAX_SPLITS}: lower split_k")
    if not isinstance(s.stream_k, bool):
        add("stream_k", s.stream_k, "use False (the default) or True (stream-K: whole waves run data-parallel; the "
            "tiles of the last partial wave and one full wave are shared out as equal (tile, k-tile) runs per cluster)")
    elif s.stream_k:
        if not sm90:
            add("stream_k", True, "stream-K is SM90-only: use stream_k=False on sm_80")
        if is_int(s.split_k) and s.split_k != 1:
            add("stream_k with split_k", s.split_k, "stream-K splits K itself: use split_k=1")
        if s.mode != "cooperative":
            add("stream_k mode", s.mode, "stream-K is built for cooperative kernels: use mode='cooperative'")
    v += l2_violations(s)
    if stages_ok and s.stages != "auto" and s.stages < 2:
        add("stages", s.stages, "use at least 2 (or 'auto')")
    if not (is_sizes(s.tile, 3) and is_sizes(s.cluster, 2) and stages_ok and is_int(s.split_k)):
        return v
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    if min(s.tile) <= 0 or min(s.cluster) <= 0:
        add("tile/cluster", (s.tile, s.cluster), "use positive sizes")
        return v

    # tile and MMA instruction-shape divisibility
    if sm90:
        if s.mode == "cooperative" and bm not in (128, 192, 256):
            add("tile M (cooperative)", bm, "two consumer warpgroups split the tile in 64-row WGMMAs: use 128, 192 "
                "or 256, or mode='pingpong' for 64")
        if splits_n(s):
            # field -> (set here?, the value a 192-row tile takes)
            unsupported = {"swap_ab": (s.swap_ab, False), "split_k": (s.split_k > 1, 1),
                           "stream_k": (s.stream_k, False)}
            got = [f"{k}={getattr(s, k)!r}" for k, (on, _) in unsupported.items() if on]
            if got:
                use = " and ".join(f"{k}={plain!r}" for k, (on, plain) in unsupported.items() if on)
                add("tile M 192", ", ".join(got), "a 192-row tile splits its columns between the two consumer "
                    "warpgroups, which the swapped store, the split-K fix-up and stream-K do not: use "
                    f"{use}, or a 128- or 256-row tile")
            if bn % 32:
                add("tile N (192-row tile)", bn, "each consumer warpgroup takes BN/2 columns in 16-column WGMMA "
                    "steps: use a multiple of 32")
            if (spec.a_layout, spec.b_layout) != ("mk", "nk"):
                add("layouts (192-row tile)", (spec.a_layout, spec.b_layout), "192-row tiles are built and "
                    "checked for K-major A [M, K] and B [N, K] only: use a 128- or 256-row tile")
        if s.mode == "pingpong" and bm not in (64, 128):
            add("tile M (pingpong)", bm, "each consumer warpgroup owns a whole tile: use 64 or 128")
        if s.swap_ab:    # stored from registers, so an 8-wide activation tile works too
            if not (bn == 8 or (bn % 16 == 0 and 16 <= bn <= 256)):
                add("tile N", bn, "a swapped kernel's N tile must be 8 or a multiple of 16 up to 256")
        elif not (bn % 16 == 0 and 16 <= bn <= 256):
            add("tile N", bn, "WGMMA N must be a multiple of 16 from 16 to 256 (8-wide tiles need swap_ab=True)")
    else:
        if s.mode != "cooperative":
            add("mode", s.mode, "ping-pong warpgroups are SM90-only: use mode='cooperative' on sm_80")
        if bm not in (64, 128, 256) or bn not in (64, 128, 256):
            add("tile M/N (sm_80)", (bm, bn), "use 64, 128 or 256 for both")
        # two k-blocks of 16 for the register double buffer, and 16-byte cp.async vectors spread evenly
        # over the CTA's threads along K
        if bk not in (32, 64, 128):
            add("tile K (sm_80)", bk, "use 32, 64 or 128")
        if spec.acc_dtype != DType.f32:
            add("acc_dtype (sm_80)", spec.acc_dtype.value, "the SM80 kernel accumulates in f32: use acc_dtype='f32'")
    kmin = 32 // spec.dtype.bytes * 1  # one 32-byte swizzle atom
    if sm90 and (bk % 16 or bk < max(16, kmin) or bk > 128):
        add("tile K", bk, "use 32, 64 or 128 (a multiple of the 16-element MMA K)")

    # clusters: SM90 only, multicast slices must stay 8-row aligned
    if not sm90 and (cm, cn) != (1, 1):
        add("cluster", s.cluster, "thread-block clusters are SM90-only: use cluster=(1, 1) on sm_80")
    if sm90:
        if cm * cn > lim.max_cluster:
            add("cluster size", cm * cn, f"at most {lim.max_cluster} CTAs per cluster")
        if cm not in (1, 2, 4, 8, 16) or cn not in (1, 2, 4, 8, 16):
            add("cluster shape", s.cluster, "use powers of two")
        # only a multicast operand is sliced (cluster N > 1 for A, M > 1 for B)
        if cn > 1 and bm % (8 * cn):
            add("multicast slice of A", f"{bm}/{cn}", f"A is multicast over the cluster's N extent in {cn} row "
                "slices of 8-row multiples: shrink cluster N or grow tile M")
        if cm > 1 and bn % (8 * cm):
            add("multicast slice of B", f"{bn}/{cm}", f"B is multicast over the cluster's M extent in {cm} row "
                "slices of 8-row multiples: shrink cluster M or grow tile N")
        # the SM90 epilogue and the partial sums work on f32 values; an f16 accumulator fragment cannot hold them
        if spec.acc_dtype == DType.f16:
            if spec.epilogue:
                add("acc_dtype f16 with an epilogue", spec.acc_dtype.value, "SM90 kernels run a fused epilogue on "
                    "f32 accumulators: use acc_dtype='f32'")
            if split_k_mode(s) in ("fixup", "stream"):
                add("acc_dtype f16 with split-K partials", (s.split_k, s.stream_k), "the in-kernel split-K fix-up "
                    "and stream-K sum f32 partials: use acc_dtype='f32', or split_k >= 3 (a reduce kernel) "
                    "without swap_ab")

    if spec.gate is not None:
        v += gate_violations(s)
    if spec.grouped:
        v += group_violations(s)
    if spec.is_fp8:
        v += fp8_violations(s, spec)

    # registers
    acc, other = accumulator_regs(s, spec), consumer_reg_overhead(s, spec)
    budget = CONSUMER_REGS_MAX if sm90 else SM80_MAX_REGS
    if acc + other > budget:
        who = "per ping-pong warpgroup" if sm90 and s.mode == "pingpong" else "per MMA thread"
        # cooperative already splits the tile's rows between two warpgroups: only a smaller tile helps
        share = (", or mode='cooperative' so two warpgroups share it"
                 if sm90 and s.mode == "pingpong" else "")
        why = ("the epilogue's or split-K partial sums' included" if sm90 and other > CONSUMER_REG_OVERHEAD
               else "addresses, pipeline and scheduler state")
        where = "the consumers' setmaxnreg budget: ptxas spills past it" if sm90 else "the per-thread limit"
        add("registers", f"{acc} accumulator regs {who} + {other} others ({why}) = {acc + other} > {budget}, "
            f"{where}", f"use a smaller tile (M x N){share}")
    if sm90:
        producer, consumer = register_budgets(s, spec)
        pool = register_pool(s.arch, threads_per_cta(s))
        if 128 * producer + 128 * consumer * consumer_warpgroups(s) > pool:
            add("register file", f"setmaxnreg budgets 128 x {producer} + {128 * consumer_warpgroups(s)} x "
                f"{consumer} > {pool} (the CTA's launch registers)", "lower the budgets or use fewer consumer "
                "warpgroups")
    if threads_per_cta(s) > lim.max_threads:
        add("threads per CTA", threads_per_cta(s), f"at most {lim.max_threads}")

    # shared memory
    stage_b = ab_stage_bytes(s, spec)
    stages = resolve_stages(s, spec)
    used = smem_bytes(s, spec)
    # the tile itself leaves no room for a 2-stage ring (an explicit stages < 2 is the "stages" rule's, above)
    if max_stages(s, spec) < 2:
        add("shared memory", f"{max_stages(s, spec)} A/B stage(s) of {stage_b} B fit in {lim.smem_bytes} B",
            "use a smaller tile (the ring needs 2 stages)")
    elif used > lim.smem_bytes:
        add("shared memory", f"{used} B ({stages} stages x {stage_b} B + {epilogue_smem_bytes(s, spec)} B epilogue)",
            f"limit {lim.smem_bytes} B on {s.arch}: use stages<={max_stages(s, spec)} or stages='auto'")

    # split-K must leave every split at least one k-tile
    if isinstance(spec.k, int) and s.split_k > 1 and math.ceil(spec.k / bk) < s.split_k:
        add("split_k", s.split_k, f"K={spec.k} has only {math.ceil(spec.k / bk)} k-tiles of {bk}: lower split_k")

    v += launch_violations(s, spec)
    v += alignment_violations(spec)
    return v


def l2_violations(s: Schedule) -> list[Violation]:
    """The L2 fields: eviction priorities hint TMA copies and the prefetch runs under PDL, so both are SM90's;
    the store's hint needs the kernel's own TMA store."""
    v: list[Violation] = []
    add = lambda limit, value, fix: v.append(Violation(limit, value, fix))  # noqa: E731
    for f, what in (("l2_a", "a's TMA loads"), ("l2_b", "b's TMA loads"), ("l2_out", "the TMA store of out")):
        if getattr(s, f) not in L2_POLICIES:
            add(f, repr(getattr(s, f)), f"use one of {L2_POLICIES}: the L2 eviction priority of {what}")
    pf = s.l2_prefetch
    if not (pf == "auto" or (is_int(pf) and 0 <= pf <= L2_PREFETCH_MAX)):
        add("l2_prefetch", repr(pf), f"use 'auto' or a number of k-tiles from 0 to {L2_PREFETCH_MAX}")
    hinted = [f"{f}={getattr(s, f)!r}" for f in L2_FIELDS if getattr(s, f) != "auto"]
    if v or not hinted:
        return v
    if s.arch != "sm_90a":
        add("L2 fields (sm_80)", ", ".join(hinted), "cache hints ride on TMA copies and the prefetch on programmatic "
            "dependent launch, both SM90-only: leave them 'auto' on sm_80")
        return v
    if pf != "auto" and s.pdl is not True:
        add("l2_prefetch without pdl", pf, "the prefetch overlaps the previous kernel under programmatic dependent "
            "launch: use pdl=True, or l2_prefetch='auto'")
    if s.l2_out != "auto" and s.swap_ab is True:
        add("l2_out with swap_ab", s.l2_out, "a swapped kernel stores from registers, with no TMA store to hint: "
            "use l2_out='auto'")
    elif s.l2_out != "auto" and is_int(s.split_k) and split_k_mode(s) == "serial":
        add("l2_out with split_k", s.split_k, "under serial split-K a reduce kernel stores out: use l2_out='auto', "
            "or a split_k the kernel sums itself")
    return v


def gate_violations(s: Schedule) -> list[Violation]:
    """A gated GEMM's kernel: two accumulators of the output tile (gate and up) per consumer, combined in
    registers before the store, so nothing may split, transpose or re-sum the tile."""
    if s.arch != "sm_90a":
        return [Violation("gate (sm_80)", s.arch, "gated GEMMs are built for sm_90a only: compile for sm_90a, "
                          "or run the plain [gate; up] GEMM and gate in torch")]
    plain = {"swap_ab": False, "split_k": 1, "stream_k": False}      # what a gated schedule takes
    got = [k for k, want in plain.items() if getattr(s, k) != want]
    v = [Violation("gated GEMM", ", ".join(f"{k}={getattr(s, k)!r}" for k in got), "its kernel gates each "
                   "output tile in registers, which the swapped store and split-K partials do not: use "
                   + " and ".join(f"{k}={plain[k]!r}" for k in got))] if got else []
    if is_sizes(s.tile, 3) and s.mode == "cooperative" and s.tile[0] == 192:
        v.append(Violation("gated GEMM tile M", 192, "a 192-row tile splits its columns between the consumer "
                           "warpgroups: use a 128- or 256-row tile"))
    return v


def group_violations(s: Schedule) -> list[Violation]:
    """A grouped GEMM's kernel: persistent SM90 work units of whole cluster tiles of one group, numbered group
    after group, each stored from registers with its rows predicated (map-groups, tma-cluster-layout)."""
    if s.arch != "sm_90a":
        return [Violation("grouped GEMM (sm_80)", s.arch, "grouped GEMMs are built for sm_90a only: compile for "
                          "sm_90a, or loop over the groups with plain GEMMs")]
    plain = {"swap_ab": False, "split_k": 1, "stream_k": False, "swizzle": 1}     # what a grouped schedule takes
    got = [k for k, want in plain.items() if getattr(s, k) != want]
    v = [Violation("grouped GEMM", ", ".join(f"{k}={getattr(s, k)!r}" for k in got), "its work units are whole "
                   "tiles of one group, in the raster's order inside the group, which swapped A/B, split-K, "
                   "stream-K and a swizzle do not keep: use " + " and ".join(f"{k}={plain[k]!r}" for k in got))
         ] if got else []
    if is_sizes(s.tile, 3) and s.mode == "cooperative" and s.tile[0] == 192:
        v.append(Violation("grouped GEMM tile M", 192, "a 192-row tile splits its columns between the consumer "
                           "warpgroups, which the row-predicated store is not built for: use a 128- or 256-row "
                           "tile"))
    # the L2 fields it would not apply: its first tile waits on the offsets, and it has no TMA store
    if s.l2_prefetch not in ("auto", 0):
        v.append(Violation("grouped GEMM l2_prefetch", s.l2_prefetch, "a grouped kernel's first tile depends on its "
                           "offsets or counts, which the previous kernel may still be writing: nothing is prefetched "
                           "before the PDL wait; use l2_prefetch='auto'"))
    if s.l2_out != "auto":
        v.append(Violation("grouped GEMM l2_out", s.l2_out, "a grouped kernel stores each tile from registers, with "
                           "no TMA store to hint: use l2_out='auto'"))
    return v


# the tile K extents an fp8 kernel takes: whole fp8 MMAs (K 32), up to one 128-byte swizzle atom per stage row
FP8_TILE_K = (32, 64, 128)
# block scaling: each tile's columns share one B scale per k-tile, so the tile N divides the 128-row scale block
FP8_BLOCK_TILE_N = (16, 32, 64, 128)


def fp8_violations(s: Schedule, spec: GemmSpec) -> list[Violation]:
    """An fp8 GEMM's kernel: sm_90a's fp8 WGMMA, which reads K-major A and B only, in K steps of 32; block
    scaling promotes once per 128-element scale block, so the tile K is the block's, and one B scale covers a
    tile's columns (tile N divides 128); a swapped kernel's tile would cross B's scale blocks by rows."""
    if s.arch != "sm_90a":
        return [Violation("fp8 (sm_80)", s.arch, "SM80 has no fp8 MMA: compile for sm_90a (H100/H200), or "
                          "dequantize to bf16 and run a bf16 GEMM")]
    v: list[Violation] = []
    if (spec.a_layout, spec.b_layout) != ("mk", "nk"):
        v.append(Violation("fp8 layouts", (spec.a_layout, spec.b_layout), "the fp8 WGMMA reads K-major operands "
                           "only: store A as M x K (a_layout 'mk') and B as N x K (b_layout 'nk', x @ w.T)"))
    if not is_sizes(s.tile, 3):
        return v
    bm, bn, bk = s.tile
    if bk not in FP8_TILE_K:
        v.append(Violation("tile K (fp8)", bk, f"use one of {FP8_TILE_K}: whole fp8 MMAs of K 32, at most one "
                           "128-byte swizzle atom"))
    if spec.scaling is not None and spec.scaling.mode == "block":
        if bk != SCALE_BLOCK:
            v.append(Violation("tile K (block scaling)", bk, f"each k-tile is promoted with one block's scales: use "
                               f"tile K {SCALE_BLOCK}, the scale block's K"))
        if s.swap_ab is True:
            v.append(Violation("swap_ab (block scaling)", True, "a swapped kernel's tile rows are B's, whose scales "
                               "change every 128 rows: use swap_ab=False"))
        elif bn not in FP8_BLOCK_TILE_N:
            v.append(Violation("tile N (block scaling)", bn, f"one B scale per k-tile covers a tile's columns: use "
                               f"one of {FP8_BLOCK_TILE_N} (a divisor of the 128-row scale block)"))
    return v


def launch_violations(s: Schedule, spec: GemmSpec) -> list[Violation]:
    """The launch grids and 32-bit sizes of `s` on `spec`'s static dims that pass their limits (symbolic dims
    are the runtime's to check, per call)."""
    v: list[Violation] = []
    add = lambda limit, value, fix: v.append(Violation(limit, value, fix))  # noqa: E731
    for name, d in (("M", spec.m), ("N", spec.n), ("K", spec.k), ("batch", spec.batch), ("groups", spec.groups)):
        if isinstance(d, int) and d > INT32_MAX:
            add(f"problem size {name} (32-bit)", d, f"at most {INT32_MAX}: split the problem across calls")
    if v:
        return v
    m, n, k = spec.m, spec.n, spec.k
    batch = 1 if spec.batch is None else spec.batch
    mode = split_k_mode(s)
    fewer = "lower split_k, " if s.split_k > 1 else ""
    if isinstance(batch, int) and batch > GRID_YZ_MAX and (s.arch != "sm_90a" or mode == "serial"):
        where = "launch grid z (batch)" if s.arch != "sm_90a" else "split-K reduce grid y (batch)"
        add(where, batch, f"at most {GRID_YZ_MAX} blocks: split the batch across calls"
            + (", or use a schedule without serial split-K (split_k <= 2 keeps the persistent grid's in-kernel "
               "sum)" if s.arch == "sm_90a" else ""))
    if not (isinstance(m, int) and isinstance(n, int) and isinstance(batch, int)):
        return v
    tm, tn, tmc, tnc = kernel_grid(s, m, n)
    cm, cn = s.cluster
    if s.arch == "sm_90a":
        units = (tmc // cm) * (tnc // cn) * batch
        if s.stream_k and isinstance(k, int):
            units *= math.ceil(k / s.tile[2])
            if units > INT32_MAX:
                add("stream-K iterations (32-bit)", f"{units} (cluster tiles x batch x k-tiles)",
                    f"at most {INT32_MAX}: use a larger tile, or split the problem across calls")
        elif not s.stream_k and units * s.split_k > INT32_MAX:
            add("work units (32-bit)", f"{units * s.split_k} (cluster tiles x batch x split_k)",
                f"at most {INT32_MAX}: {fewer}use a larger tile, or split the problem across calls")
    elif tm * tn > INT32_MAX:
        add("launch grid x", f"{tm * tn} output tiles", f"at most {INT32_MAX} blocks: use a larger tile, or split "
            "the problem across calls")
    if mode == "serial":
        blocks = m * math.ceil(n / SPLITK_REDUCE_COLUMNS)
        if blocks > INT32_MAX:
            add("split-K reduce grid x", f"{blocks} blocks (M x N / {SPLITK_REDUCE_COLUMNS})",
                f"at most {INT32_MAX} blocks: use split_k=1" + (" or 2 (summed in the kernel)" if s.arch == "sm_90a"
                                                                else "") + ", or split M across calls")
    if mode in ("serial", "fixup"):
        bm, bn, _ = s.tile
        elems = s.split_k * batch * m * n if mode == "serial" else s.split_k * bm * bn * batch * tmc * tnc
        if elems > INT32_MAX:
            add("split-K scratch (32-bit index)", f"{elems} f32 partials",
                f"at most {INT32_MAX}: lower split_k, or split the problem (batch or M) across calls")
    return v


def alignment_violations(spec: GemmSpec) -> list[Violation]:
    """The static contiguous dims that break 16-byte alignment: no schedule runs such a problem."""
    return [Violation(f"{ALIGN_BYTES}-byte alignment of {what}", f"{dim} {dt} elements",
                      f"pad it to a multiple of {alignment_elems(dt)} (TMA and cp.async move {ALIGN_BYTES}-byte "
                      "vectors)")
            for what, dim, dt in _contiguous_dims(spec) if isinstance(dim, int) and dim % alignment_elems(dt)]


def _contiguous_dims(spec: GemmSpec):
    yield ("A's contiguous dim " + ("K" if spec.a_layout == "mk" else "M"),
           spec.k if spec.a_layout == "mk" else spec.m, spec.dtype)
    yield ("B's contiguous dim " + ("K" if spec.b_layout == "nk" else "N"),
           spec.k if spec.b_layout == "nk" else spec.n, spec.b_dtype)
    yield "the output's N", spec.n, spec.out_dtype
    for i in spec.inputs:
        if i.kind == "full":
            yield f"input {i.name}'s N", spec.n, i.dtype


def is_valid(s: Schedule, spec: GemmSpec) -> bool:
    return not check_schedule(s, spec)


def require_valid(s: Schedule, spec: GemmSpec) -> None:
    problems = check_schedule(s, spec)
    if problems:
        raise ScheduleError(problems)
