"""`schedule="heuristic"`: an analytic choice among the valid schedules, in the spirit of DeepGEMM's.

Every schedule from `gemmc.schedule.enumerate_schedules` (the one validity predicate; nothing here
re-checks limits) gets a predicted run time from a small roofline model; the fastest wins, ties go
to the simpler schedule. Symbols: tile (BM, BN, BK), cluster (cm, cn) with cs = cm*cn CTAs, e bytes
per input element, split-K factor S, batch L, P the SM count (`num_sms`, default 132 on sm_90a).

1. Grid and waves (wave quantization; tile N 96/160/224 enter the space for M <= 256, `heuristic_space`):
     tm = ceil(M/BM), tn = ceil(N/BN)                       output tiles
     units = L * ceil(tm/cm)*cm * ceil(tn/cn)*cn * S           work units (grid padded to whole clusters)
     P_c = usable SMs for clusters of cs CTAs (GPC fragmentation: 100% for cs<=2, 120/132 at 4,
           120/132 at 8, 112/132 at 16), rounded down to a multiple of cs
     waves = ceil(units / P_c);   wave_efficiency = L*tm*tn*S / (waves * P)
2. Main loop of one unit, per k-block (k_iters = ceil(ceil(K/BK)/S)):
     t_mma = 2*BM*BN*BK / (F/P_base) / eta_n       F: peak tensor FLOP/s; eta_n = min(1, 0.8 + 0.2*BN/128)
                                                    (narrow WGMMA N wastes issue slots; sm_80 uses min(BM,BN))
     t_l2  = (bm/cn + bn/cm)*BK*e / (B_L2/P_base)  bm = min(BM, M), bn = min(BN, N): no rows past the edge;
                                                    multicast: A is shared by the cn CTAs along N, B by the cm
                                                    CTAs along M, so each CTA fetches 1/cn of A and 1/cm of B
     t_k = max(t_mma, t_l2) + 0.1*min(t_mma, t_l2) + T_ITER + T_SYNC*(cs-1)
     t_k *= 1 + 0.05*max(0, 4 - stages)            fewer than ~4 stages expose load latency
     mainloop = k_iters * t_k
   so larger tiles win on arithmetic intensity (bytes per FLOP, fixed per-iteration cost), and clusters
   win when the L2->SM traffic binds; T_SYNC charges the cross-CTA coupling of multicast.
3. Epilogue of one unit: t_epi = BM*BN*(out bytes + full-input bytes)/(B_L2/P_base)
                                + BM*BN*sum(op cost)/ALU + T_EPI     (op cost: 1 for + - * clamp relu cast,
                                4 for /, 8 for sigmoid/silu/tanh/gelu_tanh, 12 for gelu_erf)
   Under split-K (S > 1) a unit stores raw f32 partials instead: t_epi = BM*BN*4/(B_L2/P_base) + T_EPI.
4. Unit time: cooperative (and sm_80) runs the epilogue after the main loop: mainloop + t_epi;
   ping-pong overlaps one warpgroup's epilogue with the other's main loop: max(mainloop, t_epi).
   t_compute = waves * t_unit.
5. DRAM: bytes = L*(A + B)*reload + L*M*N*(out + full inputs, or 4*S under split-K) where, when A and B overflow half the
   L2, `reload` counts the A/B panels each wave touches under the raster order and swizzle (a wave of
   W CTAs covers about W/sw tiles along the raster dim and sw across it).
   Achieved bandwidth = B_DRAM * min(1, active_CTAs * per-CTA rate / B_DRAM) (active: CTAs with a real
   tile, at most P_c), per-CTA rate =
   min(2*B_DRAM/P_base, bytes in flight / latency): a handful of CTAs cannot saturate HBM, which is
   what makes split-K pay off for decode shapes (M <= 64) whose few tiles leave SMs idle.
   t_dram = bytes / achieved bandwidth.
6. time = max(t_compute, t_dram) + 0.1*min(t_compute, t_dram) + T_FILL, plus under split-K the reduce
   kernel that reads the partials and runs the epilogue: T_FIX + L*M*N*(4*S + out + full inputs)/B_DRAM.
   (Fitted when every split-K ran that second kernel. A 2-split kernel now sums its partials itself, a little
   faster, which the model does not credit: its 2-split picks stand.)
   score = 2*L*M*N*K / time.

7. Decode on sm_90a (M <= 16, N and K >= 3072): a swapped schedule (swap_ab) is modeled as its kernel's
   own problem, M and N exchanged, which ranks the decode winners near the top (the search's prior) but not
   reliably first, so a measured rule comes first: `DECODE_SWAP` (64x16x128 ping-pong, 10 stages, swap_ab),
   and for M <= 8 `DECODE_SWAP_NARROW` (the same with an 8-wide activation tile).
8. Small batches on sm_90a (8 < M <= 128, 4096 <= N <= 8192, K >= 4096), before step 7: a swapped
   kernel whose 1x2 cluster multicasts each weight tile to two activation tiles (`ScheduleSpace.swapped_batch`,
   and the pairs of `swapped_decode`). Of the measured `BATCH_SWAPS` for M's activation tile width, the
   one with the most CTAs that still fit in one wave: ceil(N/BM) * ceil(M/BN) <= P (first listed on a
   tie); none fits: step 7 or the model. The 64-wide pairs (M > 64) only from M = 112 (`BATCH_WIDE_MIN_M`,
   tiles at least 7/8 full); below, the model picks, and the verdict runs cuBLAS where both lose to it.
9. Wide small batches on sm_90a (16 < M <= 32, N > 8192, K >= 3072), past step 8's N: `WIDE_BATCH_SWAP`, the
   swapped kernel with one 32-wide activation tile per 64-row weight tile, unpaired. The model picks
   unswapped 64xBN tiles there, whose MMA runs 64 rows for 17-32 real ones.
10. Grids that run slow, steps 7-9: the swapped rules' 64-row weight tiles make ceil(N/64) CTAs (step 8's
   pairs twice that per 128 rows). Two grid sizes are slow, and a 128-row tile avoids them:
   - a short second wave: more CTAs than SMs by at most a quarter of them (on 132 SMs, 8448 < N <= 10560),
     whose last few CTAs stream alone; `TALL_SWAPS` fit one wave;
   - at M <= 16, a grid in the PDL middle band (`pdl_trigger_bands`: 83-117 CTAs on 132 SMs), which lets the
     next kernel launch late and skips the L2 prefetch; `MID_BAND_SWAPS` (unpaired, 128-row: half the CTAs,
     in the early band).

12. fp8 on sm_90a: the same model over the fp8 space (K tiles 64/128; block scaling: 128, `ScheduleSpace.for_fp8`),
   with the fp8 tensor cores' twice the 16-bit peak (FP8_PEAK_FACTOR), 1-byte operands, and under block scaling
   each k-tile's promotion after its MMA: BM*BN f32 FMAs (plus the scales' per-element multiplies in the
   epilogue per tensor / per row, as epilogue ops). No fp8 sweep has fitted it yet: steps 7-10's bf16 rules
   apply where the fp8 predicate takes their schedules.
11. Gated GEMMs on sm_90a (`spec.gate`, N >= 8192 outputs, K >= 2048), before everything: `GATED_PICKS`, the
   H200 sweep's best tile per M band at Llama-3-8B's gate/up (N 14336, K 4096). The model (which prices a gated
   tile as the plain tile of twice its N) picks elsewhere. Up to GATED_UNFUSED_MAX_M rows the torch op runs
   the plain [gate; up] GEMM and gates after it: the swapped decode kernels beat any gated tile there.

The measurements behind steps 7-11, the split-K note of step 6 and WAVE_TILE_MAX_M (shapes, ratios, the
result files they come from) are in bench/results/heuristic-rules.md.

Symbolic dims take `m_hint` (else 4096), `n_hint`/`k_hint` (else 4096), batch 1. The constants are
H100/H200-class (989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, 50 MB L2) and A100 for sm_80; they set
relative costs, not absolute predictions. Deterministic: no randomness, ties broken by a fixed key.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..errors import ScheduleError
from ..schedule import (ARCH_LIMITS, L2_FIELDS, Schedule, ScheduleSpace, ab_stage_bytes, accumulator_regs,
                        check_schedule, default_schedule, enumerate_schedules, kernel_grid, pdl_trigger_bands,
                        promotion_interval, resolve_stages)
from ..spec import GemmSpec
from ..types import as_arch

DEFAULT_DIM = 4096
# step 7 of the docstring
DECODE_SWAP = Schedule(tile=(64, 16, 128), mode="pingpong", stages=10, swap_ab=True)
DECODE_SWAP_NARROW = Schedule(tile=(64, 8, 128), mode="pingpong", stages=10, swap_ab=True)   # M <= 8
DECODE_MAX_M, DECODE_NARROW_MAX_M, DECODE_MIN_NK = 16, 8, 3072
# step 8: per activation tile width bound (M <= 16: 8-wide tiles in pairs, M <= 32: 16-wide, M <= 64:
# 32-wide in pairs or one 64-wide, else 64-wide in pairs), in tie order
BATCH_SWAPS = {
    16: (Schedule(tile=(64, 8, 128), cluster=(1, 2), mode="pingpong", stages=10, swap_ab=True),
         Schedule(tile=(128, 8, 128), cluster=(1, 2), mode="pingpong", stages=6, swap_ab=True)),
    32: (Schedule(tile=(64, 16, 128), cluster=(1, 2), mode="pingpong", stages=10, swap_ab=True),
         Schedule(tile=(128, 16, 64), cluster=(1, 2), mode="pingpong", stages=10, swap_ab=True)),
    64: (Schedule(tile=(64, 32, 128), cluster=(1, 2), mode="pingpong", stages=9, swap_ab=True),
         Schedule(tile=(64, 64, 128), mode="pingpong", swap_ab=True),
         Schedule(tile=(128, 32, 64), cluster=(1, 2), mode="pingpong", stages=10, swap_ab=True)),
    128: (Schedule(tile=(64, 64, 128), cluster=(1, 2), mode="pingpong", swap_ab=True),
          Schedule(tile=(128, 64, 64), cluster=(1, 2), mode="pingpong", stages=9, swap_ab=True)),
}
BATCH_MIN_M, BATCH_MAX_M, BATCH_MIN_NK, BATCH_MAX_N = 8, 128, 4096, 8192
BATCH_WIDE_MIN_M = 112       # the 64-wide tiles (M > 64) only when at least 7/8 full; below, the model picks
# step 9
WIDE_BATCH_SWAP = Schedule(tile=(64, 32, 128), mode="pingpong", stages=9, swap_ab=True)
WIDE_BATCH_MIN_M, WIDE_BATCH_MAX_M, WIDE_BATCH_MIN_K = 16, 32, 3072
# step 10: 128-row weight tiles where the rules' grids run slow. A short second wave (steps 7 and 9):
TALL_SWAPS = {DECODE_SWAP_NARROW: Schedule(tile=(128, 16, 64), mode="cooperative", swap_ab=True),
              DECODE_SWAP: Schedule(tile=(128, 16, 64), mode="cooperative", swap_ab=True),
              WIDE_BATCH_SWAP: Schedule(tile=(128, 32, 128), mode="cooperative", swap_ab=True)}
SHORT_TAIL_FRACTION = 4      # a second wave of at most 1/4 of the SMs' CTAs is short
# a grid in the PDL middle band (`pdl_trigger_bands`), M <= 8 and M <= 16 (steps 7 and 8):
MID_BAND_SWAPS = (Schedule(tile=(128, 8, 128), mode="cooperative", swap_ab=True),
                  Schedule(tile=(128, 16, 128), mode="cooperative", swap_ab=True))


# step 11: (largest M, schedule), in M order; the last band has no bound
GATED_PICKS = (
    (64, Schedule(tile=(64, 112, 128), cluster=(1, 2), mode="pingpong")),
    (128, Schedule(tile=(64, 128, 64), cluster=(2, 1), mode="pingpong")),
    (256, Schedule(tile=(128, 112, 64), cluster=(2, 1))),
    (4096, Schedule(tile=(64, 160, 64), cluster=(2, 1), mode="pingpong")),
    (None, Schedule(tile=(256, 64, 64), cluster=(1, 2), swizzle=8)),
)
GATED_MIN_N, GATED_MIN_K = 8192, 2048
# Up to this many rows a gated Linear runs unfused: the [gate; up] GEMM (whose swapped decode kernels, steps
# 7-9, a gated kernel cannot use) and the gating after it (gemmc.torch_ops.gated_linear)
GATED_UNFUSED_MAX_M = 16


@dataclass(frozen=True)
class MachineModel:
    """Throughputs of one GPU, as the cost model sees it."""
    peak_flops: float          # dense 16-bit tensor-core FLOP/s, whole chip
    num_sms: int               # SMs the peak is quoted for
    dram_bw: float             # B/s
    l2_bw: float               # L2 -> SM B/s, whole chip
    l2_bytes: int
    alu_per_sm: float          # f32 elementwise ops per second per SM (128 lanes x clock)
    dram_latency: float        # s
    t_iter: float              # fixed cost per k-block (barrier wait, MMA issue), s
    t_sync: float              # per extra CTA in a cluster, per k-block (multicast coupling), s
    t_epi: float               # fixed cost per tile epilogue (smem staging, store fences), s
    t_fix: float               # split-K: launch and tail of the reduce kernel, once per call, s
    t_fill: float              # pipeline fill + launch, once, s


MACHINES = {
    # Latency and fixed costs fitted to the H200 sweeps in bench/data (scripts/fit_heuristic.py); the share of
    # the exhaustive best its picks reach there is checked by tests/test_heuristic.py.
    "sm_90a": MachineModel(peak_flops=989e12, num_sms=132, dram_bw=4.8e12, l2_bw=11.75e12, l2_bytes=50 << 20,
                           alu_per_sm=128 * 1.755e9, dram_latency=3.2e-6, t_iter=10.29e-9, t_sync=15e-9,
                           t_epi=600e-9, t_fix=5.6e-6, t_fill=3e-6),
    "sm_80": MachineModel(peak_flops=312e12, num_sms=108, dram_bw=2.0e12, l2_bw=5e12, l2_bytes=40 << 20,
                          alu_per_sm=64 * 1.41e9, dram_latency=700e-9, t_iter=20e-9, t_sync=0.0,
                          t_epi=300e-9, t_fix=1e-6, t_fill=3e-6),
}


# fp8 tensor cores run twice the dense 16-bit FLOP/s (H100/H200: 1979 vs 989 TFLOP/s)
FP8_PEAK_FACTOR = 2.0

EPILOGUE_OP_COST = {"add": 1, "sub": 1, "mul": 1, "div": 4, "relu": 1, "clamp": 1, "cast": 1,
                    "sigmoid": 8, "silu": 8, "tanh": 8, "gelu_tanh": 8, "gelu_erf": 12}


@dataclass(frozen=True)
class Estimate:
    """The model's terms for one schedule (seconds unless named otherwise)."""
    time: float
    tflops: float
    units: int
    waves: int
    wave_efficiency: float
    t_mainloop: float          # one unit
    t_epilogue: float          # one unit, including split-K fix-up
    t_compute: float
    t_dram: float
    dram_bytes: float
    l2_bytes_per_kblock: float  # per CTA


def problem_dims(spec: GemmSpec, m_hint: int | None = None, n_hint: int | None = None,
                 k_hint: int | None = None) -> tuple[int, int, int, int]:
    """(L, M, N, K) with symbolic dims replaced by the hints or DEFAULT_DIM."""
    def pick(dim, hint):
        return dim if isinstance(dim, int) else int(hint if hint is not None else DEFAULT_DIM)
    batch = spec.batch if isinstance(spec.batch, int) else 1
    return batch, pick(spec.m, m_hint), pick(spec.n, n_hint), pick(spec.k, k_hint)


def usable_sms(num_sms: int, cluster_size: int) -> int:
    """SMs that clusters of `cluster_size` CTAs fill at once (a cluster's CTAs share one GPC): the
    measured share on the 132-SM part (ArchLimits.max_active_clusters), scaled to `num_sms`."""
    lim = ARCH_LIMITS["sm_90a"]
    frac = lim.active_clusters(cluster_size) * cluster_size / lim.num_sms
    return max(cluster_size, int(num_sms * frac) // cluster_size * cluster_size)


def _epilogue_cost(spec: GemmSpec) -> int:
    return sum(EPILOGUE_OP_COST.get(op.op, 4) for op in spec.epilogue)


def _panel_traffic(tm, tn, bm, bn, k_bytes, wave, raster, swizzle) -> float:
    """A+B bytes read from DRAM when only the panels of the current wave stay in L2."""
    if raster == "n":  # n varies fastest: swap the roles of the two dims
        tm, tn, bm, bn = tn, tm, bn, bm
    band = min(swizzle, tn)
    if wave <= band * tm:
        d_n, d_m = band, min(tm, math.ceil(wave / band))
    else:
        d_m, d_n = tm, min(tn, math.ceil(wave / tm))
    waves = math.ceil(tm * tn / wave)
    per_wave = (d_m * bm + d_n * bn) * k_bytes
    return min(waves * per_wave, tm * tn * (bm + bn) * k_bytes)


def estimate(s: Schedule, spec: GemmSpec, num_sms: int | None = None, m_hint: int | None = None,
             n_hint: int | None = None, k_hint: int | None = None) -> Estimate:
    """The model of the module docstring for one (valid) schedule. A gated GEMM's tile (BM, BN) loads and
    multiplies what the plain tile (BM, 2 BN) does on the [gate; up] problem of 2N columns: it is modeled so."""
    if spec.gate is not None:
        bm, bn, bk = s.tile
        return estimate(replace(s, tile=(bm, 2 * bn, bk)), replace(spec, gate=None, n=2 * spec.n),
                        num_sms, m_hint, None if n_hint is None else 2 * n_hint, k_hint)
    mach = MACHINES[s.arch]
    P = num_sms or ARCH_LIMITS[s.arch].num_sms
    L, M, N, K = problem_dims(spec, m_hint, n_hint, k_hint)
    tm, tn, tmc, tnc = kernel_grid(s, M, N)
    if s.swap_ab:       # the kernel's own problem: out^T = b @ a^T
        M, N = N, M
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    cs = cm * cn
    e = spec.dtype.bytes
    stages = resolve_stages(s, spec)
    sm90 = s.arch == "sm_90a"
    per_sm_flops = mach.peak_flops / mach.num_sms * (FP8_PEAK_FACTOR if spec.is_fp8 else 1.0)
    per_sm_l2 = mach.l2_bw / mach.num_sms

    # 1. grid and waves
    units = L * tmc * tnc * s.split_k
    p_c = usable_sms(P, cs)
    waves = math.ceil(units / p_c)
    wave_eff = L * tm * tn * s.split_k / (waves * P)

    # 2. main loop of one unit
    k_iters = math.ceil(math.ceil(K / bk) / s.split_k)
    eta = min(1.0, 0.8 + 0.2 * (bn if sm90 else min(bm, bn)) / 128)
    t_mma = 2 * bm * bn * bk / per_sm_flops / eta
    l2_bytes = (min(bm, M) / cn + min(bn, N) / cm) * bk * e  # TMA fetches no rows past the edge
    t_l2 = l2_bytes / per_sm_l2
    t_k = max(t_mma, t_l2) + 0.1 * min(t_mma, t_l2) + mach.t_iter + mach.t_sync * (cs - 1)
    t_k *= 1 + 0.05 * max(0, 4 - stages)
    if promotion_interval(spec):    # block-scaled fp8: each k-tile's promotion follows its MMA
        t_k += bm * bn / mach.alu_per_sm
    mainloop = k_iters * t_k

    # 3. epilogue (+ split-K fix-up) of one unit
    full_bytes = sum(i.dtype.bytes for i in spec.inputs if i.kind == "full")
    out_bytes = spec.out_dtype.bytes + full_bytes        # per output element, through the real epilogue
    if s.split_k > 1:   # raw f32 partials; the reduce kernel runs the epilogue
        t_epi = bm * bn * 4 / per_sm_l2 + mach.t_epi
    else:
        t_epi = bm * bn * out_bytes / per_sm_l2 + bm * bn * _epilogue_cost(spec) / mach.alu_per_sm + mach.t_epi

    # 4. unit time and compute time
    t_unit = max(mainloop, t_epi) if (sm90 and s.mode == "pingpong") else mainloop + t_epi
    t_compute = waves * t_unit

    # 5. DRAM
    ab_unique = (M + N) * K * e
    if ab_unique > mach.l2_bytes / 2:
        ab = _panel_traffic(tm, tn, bm, bn, K * e, min(p_c, tm * tn), s.raster, s.swizzle)
        ab = max(ab, ab_unique)
    else:
        ab = ab_unique
    dram_bytes = L * (ab + M * N * (4 * s.split_k if s.split_k > 1 else out_bytes))
    in_flight = stages * ab_stage_bytes(s, spec) * (l2_bytes / ((bm + bn) * bk * e))
    per_cta_rate = min(2 * mach.dram_bw / mach.num_sms, in_flight / mach.dram_latency)
    active = min(L * tm * tn * s.split_k, p_c)  # CTAs padding the grid to whole clusters load nothing
    bw = mach.dram_bw * min(1.0, active * per_cta_rate / mach.dram_bw)
    t_dram = dram_bytes / bw

    # 6. total
    time = max(t_compute, t_dram) + 0.1 * min(t_compute, t_dram) + mach.t_fill
    if s.split_k > 1:   # then the reduce kernel: read S partials, write the output, once per launch
        time += mach.t_fix + L * M * N * (4 * s.split_k + out_bytes) / mach.dram_bw
    flops = 2.0 * L * M * N * K
    return Estimate(time=time, tflops=flops / time / 1e12, units=units, waves=waves, wave_efficiency=wave_eff,
                    t_mainloop=mainloop, t_epilogue=t_epi, t_compute=t_compute, t_dram=t_dram,
                    dram_bytes=dram_bytes, l2_bytes_per_kblock=l2_bytes)


def _tie_break(s: Schedule) -> tuple:
    """Among equal predictions prefer the simpler schedule: small clusters, no split-K, no swizzle, the L2 rules."""
    return (s.cluster[0] * s.cluster[1], s.split_k, s.swizzle, s.raster != "m", s.mode != "cooperative",
            sum(getattr(s, f) != "auto" for f in L2_FIELDS), s.short())


# the wave-balancing N tiles (96, 160, 224) win at M <= 256 and lose at large M, where the model would still
# pick them (bench/results/heuristic-rules.md)
WAVE_TILE_MAX_M = 256
# the H200 sweeps the model was fitted on measured tiles of up to 168 accumulator registers a consumer thread,
# and no N of 208: the larger tiles the register model admits (256x192, 256x208, 128x192 ping-pong) are the
# search's until a GPU run measures them
MEASURED_MAX_ACC_REGS = 168
UNMEASURED_TILE_N = (208,)


def heuristic_space(arch: str, m: int | None = None, spec: GemmSpec | None = None) -> ScheduleSpace:
    """The space the heuristic picks from: the arch's standard space (an fp8 `spec`'s K tiles), on sm_90a cut
    to what the H200 sweeps measured (no 2x2 clusters; split-K 1, 2, 3, 4, 6, 8), where the fitted model is
    known to hold, and tile N 96/160/224 only for M <= WAVE_TILE_MAX_M (`m`; None: M unknown, so left out);
    no unmeasured N (UNMEASURED_TILE_N)."""
    std = ScheduleSpace.for_arch(arch)
    if as_arch(arch) != "sm_90a":
        return std
    if spec is not None and spec.is_fp8:
        std = replace(std, tile_k=ScheduleSpace.for_fp8(spec).tile_k)
    tile_n = (tuple(n for n in std.tile_n if n not in UNMEASURED_TILE_N) if m is not None and m <= WAVE_TILE_MAX_M
              else (64, 128, 192, 256))
    return replace(std, tile_n=tile_n, clusters=tuple(c for c in std.clusters if c != (2, 2)),
                   split_ks=(1, 2, 3, 4, 6, 8))


def rank_schedules(spec: GemmSpec, arch: str = "sm_90a", num_sms: int | None = None, m_hint: int | None = None,
                   n_hint: int | None = None, k_hint: int | None = None,
                   space: ScheduleSpace | None = None,
                   candidates: Iterable[Schedule] | None = None) -> list[tuple[float, Schedule]]:
    """Every valid schedule of `space` (default `heuristic_space(arch, M, spec)`), or of `candidates` (e.g. a
    search's feasible set) when given, with its score (predicted TFLOP/s), best first."""
    arch = as_arch(arch)
    if candidates is not None:
        pool = [s for s in dict.fromkeys(candidates) if s.arch == arch and not check_schedule(s, spec)]
    else:
        m = problem_dims(spec, m_hint, n_hint, k_hint)[1]
        pool = enumerate_schedules(spec, arch, space or heuristic_space(arch, m, spec))
        if space is None:
            pool = [s for s in pool if accumulator_regs(s, spec) <= MEASURED_MAX_ACC_REGS]
    scored = []
    for s in pool:
        est = estimate(s, spec, num_sms=num_sms, m_hint=m_hint, n_hint=n_hint, k_hint=k_hint)
        scored.append((est.tflops, s))
    scored.sort(key=lambda t: (-t[0],) + _tie_break(t[1]))
    return scored


def _avoid_slow_grids(pick: Schedule, spec: GemmSpec, m: int, n: int, num_sms: int | None) -> Schedule:
    """Step 10: `pick`, or a 128-row swapped tile where `pick`'s grid (`kernel_grid`) runs slow: in the PDL
    middle band at M <= 16 (`MID_BAND_SWAPS`, half the CTAs, inside the early band), or spilling a short
    second wave (`TALL_SWAPS`: one wave). The replacement must pass the predicate, else `pick` stays."""
    sms = num_sms or ARCH_LIMITS["sm_90a"].num_sms
    _, _, tmc, tnc = kernel_grid(pick, m, n)
    ctas = tmc * tnc
    early, full = pdl_trigger_bands(sms)
    out = pick
    if m <= DECODE_MAX_M and early < ctas < full:
        out = MID_BAND_SWAPS[m > DECODE_NARROW_MAX_M]
    elif pick in TALL_SWAPS and sms < ctas <= sms + sms // SHORT_TAIL_FRACTION:
        out = TALL_SWAPS[pick]
    return out if out == pick or not check_schedule(out, spec) else pick


def decode_schedule(spec: GemmSpec, arch: str = "sm_90a", m_hint: int | None = None, n_hint: int | None = None,
                    k_hint: int | None = None, num_sms: int | None = None) -> Schedule | None:
    """Step 7's pick (`DECODE_SWAP_NARROW` up to M = 8, else `DECODE_SWAP`; step 10 may take its 128-row
    variant) where it applies and the predicate accepts it, else None."""
    if as_arch(arch) != "sm_90a":
        return None
    _, m, n, k = problem_dims(spec, m_hint, n_hint, k_hint)
    if m > DECODE_MAX_M or min(n, k) < DECODE_MIN_NK:
        return None
    pick = DECODE_SWAP_NARROW if m <= DECODE_NARROW_MAX_M else DECODE_SWAP
    if check_schedule(pick, spec):
        return None
    return _avoid_slow_grids(pick, spec, m, n, num_sms)


def batch_schedule(spec: GemmSpec, arch: str = "sm_90a", num_sms: int | None = None, m_hint: int | None = None,
                   n_hint: int | None = None, k_hint: int | None = None) -> Schedule | None:
    """Step 8's pick from `BATCH_SWAPS` where it applies, else None."""
    if as_arch(arch) != "sm_90a":
        return None
    _, m, n, k = problem_dims(spec, m_hint, n_hint, k_hint)
    if not (BATCH_MIN_M < m <= BATCH_MAX_M and BATCH_MIN_NK <= n <= BATCH_MAX_N and k >= BATCH_MIN_NK):
        return None
    if 64 < m < BATCH_WIDE_MIN_M:
        return None
    sms = num_sms or ARCH_LIMITS["sm_90a"].num_sms
    best, best_ctas = None, 0
    for s in BATCH_SWAPS[next(w for w in sorted(BATCH_SWAPS) if m <= w)]:
        _, _, tmc, tnc = kernel_grid(s, m, n)
        ctas = tmc * tnc
        if best_ctas < ctas <= sms and not check_schedule(s, spec):
            best, best_ctas = s, ctas
    return best if best is None else _avoid_slow_grids(best, spec, m, n, num_sms)


def wide_batch_schedule(spec: GemmSpec, arch: str = "sm_90a", m_hint: int | None = None,
                        n_hint: int | None = None, k_hint: int | None = None,
                        num_sms: int | None = None) -> Schedule | None:
    """Step 9's pick (`WIDE_BATCH_SWAP`, or its step-10 variant) where it applies and the predicate accepts
    it, else None."""
    if as_arch(arch) != "sm_90a":
        return None
    _, m, n, k = problem_dims(spec, m_hint, n_hint, k_hint)
    if not (WIDE_BATCH_MIN_M < m <= WIDE_BATCH_MAX_M and n > BATCH_MAX_N and k >= WIDE_BATCH_MIN_K):
        return None
    if check_schedule(WIDE_BATCH_SWAP, spec):
        return None
    return _avoid_slow_grids(WIDE_BATCH_SWAP, spec, m, n, num_sms)


def gated_schedule(spec: GemmSpec, arch: str = "sm_90a", m_hint: int | None = None, n_hint: int | None = None,
                   k_hint: int | None = None) -> Schedule | None:
    """Step 11's pick for a gated GEMM where it applies and the predicate accepts it, else None."""
    if spec.gate is None or as_arch(arch) != "sm_90a":
        return None
    _, m, n, k = problem_dims(spec, m_hint, n_hint, k_hint)
    if n < GATED_MIN_N or k < GATED_MIN_K:
        return None
    pick = next(s for bound, s in GATED_PICKS if bound is None or m <= bound)
    return None if check_schedule(pick, spec) else pick


def choose_schedule(spec: GemmSpec, arch: str = "sm_90a", num_sms: int | None = None, m_hint: int | None = None,
                    n_hint: int | None = None, k_hint: int | None = None,
                    space: ScheduleSpace | None = None) -> Schedule:
    """The best-scoring valid schedule; ScheduleError (with the default schedule's violations) if none is.
    Decode and small-batch shapes on sm_90a take the measured swap_ab rules first (docstring, steps 8, 7, 9, 10),
    gated GEMMs step 11's."""
    if space is None:           # the rules are for the standard space; a caller's own space is searched as given
        rule = (gated_schedule(spec, arch, m_hint=m_hint, n_hint=n_hint, k_hint=k_hint)
                or batch_schedule(spec, arch, num_sms=num_sms, m_hint=m_hint, n_hint=n_hint, k_hint=k_hint)
                or decode_schedule(spec, arch, m_hint=m_hint, n_hint=n_hint, k_hint=k_hint, num_sms=num_sms)
                or wide_batch_schedule(spec, arch, m_hint=m_hint, n_hint=n_hint, k_hint=k_hint, num_sms=num_sms))
        if rule is not None:
            return rule
    ranked = rank_schedules(spec, arch, num_sms=num_sms, m_hint=m_hint, n_hint=n_hint, k_hint=k_hint,
                            space=space)
    if not ranked:
        violations = check_schedule(default_schedule(as_arch(arch)), spec)
        if not violations:  # pragma: no cover - the default is in every standard space
            raise ScheduleError(["no schedule in the search space is valid for this problem"])
        raise ScheduleError(violations)
    return ranked[0][1]
