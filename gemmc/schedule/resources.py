"""The resource model of a schedule on a problem: threads, registers, shared memory per stage, epilogue
staging, split-K mode. `pipeline-staging` chooses stages with it, and the predicate checks against it."""
from __future__ import annotations

import math

from ..spec import SCALE_BLOCK, GemmSpec
from ..types import DType
from .knobs import Schedule
from .limits import (ARCH_LIMITS, BARRIER_RESERVE_BYTES, CONSUMER_REG_OVERHEAD, CONSUMER_REG_OVERHEAD_EPILOGUE,
                     CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS, CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS_PINGPONG, CONSUMER_REGS,
                     CONSUMER_REGS_MAX, EPI_STAGES, EPI_TILE_N, PRODUCER_REGS, PRODUCER_REGS_MIN, SM80_REG_OVERHEAD)


def consumer_warpgroups(s: Schedule) -> int:
    return 2 if s.arch == "sm_90a" else 0


def threads_per_cta(s: Schedule) -> int:
    if s.arch == "sm_90a":
        return 128 * (1 + consumer_warpgroups(s))
    return 32 * sm80_warps(s)


def sm80_warps(s: Schedule) -> int:
    bm, bn, _ = s.tile
    return 8 if bm * bn > 128 * 128 else 4


def promotion_interval(spec: GemmSpec) -> int:
    """The K extent after which an fp8 kernel adds its WGMMA accumulator into a second, f32 one: every scale
    block under block scaling (times the block's scales); 0 (never) per tensor and per row, whose scales
    multiply the whole sum in the epilogue."""
    return SCALE_BLOCK if spec.scaling is not None and spec.scaling.mode == "block" else 0


def accumulator_count(spec: GemmSpec) -> int:
    """Accumulators of the output tile a consumer holds: two for a gated GEMM (gate and up) and for a promoting
    fp8 one (the WGMMA's and the f32 sum), else one."""
    return 2 if spec.gate is not None or promotion_interval(spec) else 1


def accumulator_regs(s: Schedule, spec: GemmSpec) -> int:
    """f32 (or packed f16) accumulator registers per MMA thread."""
    bm, bn, _ = s.tile
    per_reg = 2 if spec.acc_dtype == DType.f16 else 1
    if s.arch == "sm_90a":
        threads = 128 if s.mode == "pingpong" else 128 * consumer_warpgroups(s)
    else:
        threads = threads_per_cta(s)
    return math.ceil(accumulator_count(spec) * bm * bn / threads / per_reg)


def register_pool(arch: str, threads: int) -> int:
    """Registers an SM90 CTA of `threads` launches with, which setmaxnreg shares out: ptxas gives each thread
    the register file over the threads, in 8s."""
    return threads * (ARCH_LIMITS[arch].regs_per_sm // threads // 8 * 8)


def consumer_reg_overhead(s: Schedule, spec: GemmSpec) -> int:
    """Registers a consumer (SM90) or MMA (SM80) thread keeps live besides the accumulator."""
    if s.arch != "sm_90a":
        return SM80_REG_OVERHEAD
    mode = split_k_mode(s)
    # under "serial" the reduce kernel runs the epilogue (an fp8 kernel's scales per tensor or row included);
    # a gated kernel's gate function is one, and so is an fp8 kernel's promotion by block scales, and a grouped
    # kernel's walk over the groups with its row-predicated store
    dag = (((bool(spec.epilogue) or spec.scaling is not None) and mode != "serial") or spec.gate is not None
           or promotion_interval(spec) > 0 or spec.grouped)
    if dag and mode == "fixup":         # stream-K's sums measured lighter: 256x160 with bias + GELU fits 232
        return (CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS_PINGPONG if s.mode == "pingpong"
                else CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS)
    return CONSUMER_REG_OVERHEAD_EPILOGUE if dag or mode == "fixup" else CONSUMER_REG_OVERHEAD


def consumer_regs_needed(s: Schedule, spec: GemmSpec) -> int:
    """Registers a consumer thread needs: its accumulators and what the kernel keeps live beside them."""
    return accumulator_regs(s, spec) + consumer_reg_overhead(s, spec)


def register_budgets(s: Schedule, spec: GemmSpec) -> tuple[int, int]:
    """(producer, consumer) setmaxnreg budgets of an SM90 kernel: 40/232, or 24/240 where the consumers need
    more than 232 (the producer's loop of TMA issues fits in 24)."""
    if consumer_regs_needed(s, spec) <= CONSUMER_REGS:
        return PRODUCER_REGS, CONSUMER_REGS
    return PRODUCER_REGS_MIN, CONSUMER_REGS_MAX


def splits_n(s: Schedule) -> bool:
    """A cooperative SM90 tile of 192 rows (three 64-row WGMMAs) cannot be halved by rows: its two consumer
    warpgroups take half the columns each instead."""
    return s.arch == "sm_90a" and s.mode == "cooperative" and s.tile[0] == 192


def epilogue_tile(s: Schedule) -> tuple[int, int]:
    bm, bn, _ = s.tile
    if splits_n(s):     # each sub-tile spans both warpgroups' columns: every thread holds part of each
        return 64, bn
    rows = min(bm, 128) if s.mode == "cooperative" else min(bm, 64)
    # 16-column sub-tiles where 32 does not divide the tile (48, 80, 112, 208 wide)
    return rows, min(bn, EPI_TILE_N if bn % EPI_TILE_N == 0 else 16)


def kernel_grid(s: Schedule, m: int, n: int) -> tuple[int, int, int, int]:
    """Output tiles of the kernel's own problem, M and N exchanged under swap_ab (out^T = b @ a^T):
    (tm, tn), and the grid padded to whole clusters (tmc, tnc). One batch, no split-K."""
    km, kn = (n, m) if s.swap_ab else (m, n)
    bm, bn, _ = s.tile
    cm, cn = s.cluster
    tm, tn = math.ceil(km / bm), math.ceil(kn / bn)
    return tm, tn, math.ceil(tm / cm) * cm, math.ceil(tn / cn) * cn


def ab_stage_bytes(s: Schedule, spec: GemmSpec) -> int:
    """One ring stage: an A tile and a B tile (a gated GEMM loads a gate and an up tile of B)."""
    bm, bn, bk = s.tile
    b_tiles = 2 if spec.gate is not None else 1
    return (bm + b_tiles * bn) * bk * spec.dtype.bytes


FIXUP_MAX_SPLITS = 2
# swapped kernels may split K, always summed by the fix-up; the search spaces leave them out (none measured faster)
SWAP_MAX_SPLITS = 4


def split_k_mode(s: Schedule) -> str:
    """How split-K sums its partials: in the GEMM kernel, by the last split of each tile to finish ("fixup",
    sm_90a up to FIXUP_MAX_SPLITS splits), or in a second kernel ("serial"; bench/results/heuristic-rules.md)."""
    if s.stream_k:
        return "stream"     # stream-K: the last CTA of a split tile sums its partials, as the fix-up does
    if s.split_k == 1:
        return "none"
    # swapped kernels store from registers, which the reduce kernel's staged partials do not
    return "fixup" if s.arch == "sm_90a" and (s.split_k <= FIXUP_MAX_SPLITS or s.swap_ab) else "serial"


def epilogue_smem_bytes(s: Schedule, spec: GemmSpec) -> int:
    """SM90 stages C (and, unswapped, every full M x N epilogue input) through smem; SM80 reuses the A/B ring.
    Under split_k_mode "serial" the main kernel stages f32 partials and no inputs (the reduce kernel runs the
    epilogue); under "fixup" the tile's last split runs the epilogue itself, as an unsplit kernel does."""
    if s.arch != "sm_90a":
        return 0
    em, en = epilogue_tile(s)
    if split_k_mode(s) == "serial":
        return em * en * 4 * EPI_STAGES
    per_stage = em * en * spec.out_dtype.bytes
    if not s.swap_ab:   # a swapped kernel reads full inputs from global memory (ldg), not through smem
        per_stage += sum(em * en * i.dtype.bytes for i in spec.inputs if i.kind == "full")
    return per_stage * EPI_STAGES


def max_stages(s: Schedule, spec: GemmSpec) -> int:
    lim = ARCH_LIMITS[s.arch]
    free = lim.smem_bytes - BARRIER_RESERVE_BYTES - epilogue_smem_bytes(s, spec)
    return max(0, free // ab_stage_bytes(s, spec))


def resolve_stages(s: Schedule, spec: GemmSpec) -> int:
    """`stages="auto"`: as many A/B stages as fit after the epilogue's share (at most 8 on SM90,
    where deeper rings stop paying; at most 5 on SM80)."""
    if s.stages != "auto":
        return int(s.stages)
    cap = 8 if s.arch == "sm_90a" else 5
    return min(cap, max_stages(s, spec))


def smem_bytes(s: Schedule, spec: GemmSpec) -> int:
    return (resolve_stages(s, spec) * ab_stage_bytes(s, spec) + epilogue_smem_bytes(s, spec)
            + BARRIER_RESERVE_BYTES)


def sm80_ring_smem_bytes(s: Schedule, spec: GemmSpec) -> int:
    """Shared memory the SM80 kernel allocates: the A and B rings, each at a 1024-byte boundary (no barrier
    reserve: cp.async waits on commit groups). Checked against the compile target's limit, which may be
    below the sm_80 one `smem_bytes` is held to."""
    bm, bn, bk = s.tile
    per_row = bk * resolve_stages(s, spec) * spec.dtype.bytes
    return sum(math.ceil(rows * per_row / 1024) * 1024 for rows in (bm, bn))
