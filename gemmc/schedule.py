"""`Schedule` (how to run a GEMM) and the one validity predicate over (schedule, problem).

The verifier pass, the heuristic and every search strategy call `check_schedule`; nothing else
decides whether a schedule is legal. The resource model here (shared memory per stage, epilogue
staging, accumulator registers) is the same one `pipeline-staging` uses to choose stages.
"""
from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import asdict, dataclass, fields, replace
from typing import Iterator, Union

from .alignment import ALIGN_BYTES, alignment_elems
from .errors import ScheduleError
from .spec import GemmSpec
from .types import DType, as_arch

MODES = ("cooperative", "pingpong")
RASTERS = ("m", "n")  # which tile coordinate varies fastest across consecutive CTAs
SWIZZLES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ArchLimits:
    name: str
    smem_bytes: int            # usable dynamic shared memory per CTA
    regs_per_sm: int
    max_threads: int
    max_cluster: int           # CTAs per cluster (1: no clusters)
    has_tma: bool
    num_sms: int               # default SM count for the heuristic (H200/H100 SXM: 132, A100: 108)
    # (cluster size, clusters resident at once at 1 CTA per SM; GPCs strand SMs): a larger persistent grid
    # runs its last clusters as a second wave
    max_active_clusters: tuple[tuple[int, int], ...] = ()

    def active_clusters(self, cluster_size: int) -> int:
        """Clusters of `cluster_size` CTAs that run at once: the persistent grid's size."""
        return dict(self.max_active_clusters).get(cluster_size, max(1, self.num_sms // cluster_size))


ARCH_LIMITS = {
    # H200 (132 SMs): cudaOccupancyMaxActiveClusters (cutlass.utils.HardwareInfo) per cluster size
    "sm_90a": ArchLimits("sm_90a", 227 * 1024, 65536, 1024, 16, True, 132,
                         max_active_clusters=((1, 132), (2, 66), (4, 30), (8, 15), (16, 7))),
    "sm_80": ArchLimits("sm_80", 163 * 1024, 65536, 1024, 1, False, 108),
    # targets the SM80 kernel may also be compiled for (never a schedule's arch). sm_86/sm_89 CTAs may opt into
    # 99 KB of shared memory (CUDA programming guide), so a ring that fits an A100 can fail to launch there;
    # SM counts: A10 (sm_86) and L40S (sm_89)
    "sm_86": ArchLimits("sm_86", 99 * 1024, 65536, 1024, 1, False, 72),
    "sm_89": ArchLimits("sm_89", 99 * 1024, 65536, 1024, 1, False, 142),
}
ARCH_LIMITS["sm_90"] = ARCH_LIMITS["sm_90a"]    # the same chip without the arch-specific (wgmma, setmaxnreg) features

# What the SM80 kernel may be compiled for: it uses only sm_80 instructions, so sm_90a/sm_90 build it for an
# H100/H200 (an sm_80 cubin does not load on Hopper). pipeline-staging records the choice on kernel.pipeline.
SM80_COMPILE_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_90")

def pdl_trigger_bands(num_sms: int) -> tuple[int, int]:
    """(early, full): an SM90 grid of at most `early` CTAs, or of at least `full`, lets the next kernel launch
    once its last load is issued; one in between, once its last stage is released, and skips the L2 prefetch
    (passes/pipeline_staging.py says why)."""
    return num_sms * 5 // 8, num_sms * 9 // 10


# Register budgets per thread set by `setmaxnreg` (SM90). ptxas launches the CTA at the registers its threads
# may all hold (65536 / 384, down to a multiple of 8: 168), and the warpgroups' budgets share out that pool:
# 128 * producer + 256 * consumers <= 384 * 168 = 64512. The producer gives registers back so the consumers can
# hold the accumulators; a tile whose consumers need more than CONSUMER_REGS takes the larger split.
PRODUCER_REGS = 40
CONSUMER_REGS = 232
PRODUCER_REGS_MIN = 24
CONSUMER_REGS_MAX = 240          # 128 * 24 + 256 * 240 = 64512
# Registers a consumer thread keeps live besides the accumulator, as ptxas allocates them (tests/
# test_register_model.py checks them against its report): descriptors, pipeline and scheduler state; more with
# an epilogue in the kernel or the split-K fix-up, more again with both, most under ping-pong.
CONSUMER_REG_OVERHEAD = 32
CONSUMER_REG_OVERHEAD_EPILOGUE = 64
CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS = 96
CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS_PINGPONG = 136
SM80_MAX_REGS = 255
SM80_REG_OVERHEAD = 64
BARRIER_RESERVE_BYTES = 1024   # mbarriers and scheduler state
EPI_STAGES = 2                 # epilogue smem buffers (store of one sub-tile overlaps the next)
EPI_TILE_N = 32
# Launch limits (CUDA): grid x at most INT32_MAX blocks, y and z GRID_YZ_MAX; the kernels' sizes, tile counts and
# split-K scratch indices are 32-bit too (the DSL truncates a larger int with only a warning).
INT32_MAX = 2 ** 31 - 1
GRID_YZ_MAX = 65535
SPLITK_REDUCE_COLUMNS = 128    # the split-K reduce kernel: one block per output row and 128 columns


@dataclass(frozen=True)
class Schedule:
    """Every knob of a kernel. Frozen: it is a dictionary key and a cache-key input."""
    tile: tuple[int, int, int] = (128, 128, 64)
    cluster: tuple[int, int] = (1, 1)
    stages: Union[int, str] = "auto"
    mode: str = "cooperative"
    raster: str = "m"
    swizzle: int = 1
    split_k: int = 1
    arch: str = "sm_90a"
    # programmatic dependent launch (the prologue overlaps the previous kernel); ignored on sm_80
    pdl: bool = True
    # swap A and B (sm_90a): the kernel computes out^T = b @ a^T, so `tile` and `cluster` read (N, M, K) and
    # (N, M): decode shapes fill the 64-row WGMMA with B's rows; the output is stored from registers.
    swap_ab: bool = False
    # stream-K (sm_90a, cooperative, split_k 1): whole waves run data-parallel, the last partial wave's tiles
    # and one full wave's are shared out as equal (tile, k-tile) runs; the last CTA of a split tile sums them.
    stream_k: bool = False

    def __post_init__(self):
        # lossless normalization only (lists to tuples, numpy ints to int, "4" to 4): a malformed value stays
        # as given, for check_schedule to name instead of truncating 3.7 stages to 3
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("tile", _as_ints(self.tile))
        set_("cluster", _as_ints(self.cluster))
        set_("arch", as_arch(self.arch))
        if isinstance(self.stages, str) and self.stages.isdigit():    # the IR and the CLI write stages as text
            set_("stages", int(self.stages))
        elif self.stages != "auto":
            set_("stages", _as_int(self.stages))
        set_("swizzle", _as_int(self.swizzle))
        set_("split_k", _as_int(self.split_k))

    def to_dict(self) -> dict:
        """`pdl` appears only when off, so the dicts recorded before it existed (datasets, tuning DBs,
        the shipped tables) still equal the ones written now; `from_dict` reads a missing key as on."""
        d = asdict(self)
        if d["pdl"] is True:
            del d["pdl"]
        if d["swap_ab"] is False:      # likewise: only present when on
            del d["swap_ab"]
        if d["stream_k"] is False:
            del d["stream_k"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        """The inverse of `to_dict`; also what `gemmc.compile(spec, {...})` reads. A key that is not a field
        raises ScheduleError naming it."""
        _require_fields(d)
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})

    def short(self) -> str:
        """Compact id, e.g. '128x256x64_c2x1_coop_s4_rm_sw1_k1' ('_nopdl' appended when pdl is off, '_swap'
        when A and B are swapped, '_streamk' under stream-K)."""
        bm, bn, bk = self.tile
        mode = "coop" if self.mode == "cooperative" else "pp"
        return (f"{bm}x{bn}x{bk}_c{self.cluster[0]}x{self.cluster[1]}_{mode}_s{self.stages}"
                f"_r{self.raster}_sw{self.swizzle}_k{self.split_k}" + ("" if self.pdl else "_nopdl")
                + ("_swap" if self.swap_ab else "") + ("_streamk" if self.stream_k else ""))

    def with_(self, **kw) -> "Schedule":
        _require_fields(kw)
        return replace(self, **kw)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _as_int(x):
    return int(x) if _is_int(x) else x


def _as_ints(value):
    return tuple(_as_int(x) for x in value) if isinstance(value, (tuple, list)) else value


def _is_sizes(value, n: int) -> bool:
    return isinstance(value, tuple) and len(value) == n and all(_is_int(x) for x in value)


def _require_fields(d) -> None:
    names = [f.name for f in fields(Schedule)]
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ScheduleError([Violation("schedule field", repr(k), f"Schedule has no such field: use {', '.join(names)}")
                             for k in unknown])


@dataclass(frozen=True)
class Violation:
    """One broken rule: which limit, the offending value, and what to change."""
    limit: str
    value: object
    fix: str

    def __str__(self) -> str:
        return f"{self.limit}: got {self.value}; {self.fix}"


# ---- resource model ------------------------------------------------------------------------

def consumer_warpgroups(s: Schedule) -> int:
    return 2 if s.arch == "sm_90a" else 0


def threads_per_cta(s: Schedule) -> int:
    if s.arch == "sm_90a":
        return 128 * (1 + consumer_warpgroups(s))
    return 32 * sm80_warps(s)


def sm80_warps(s: Schedule) -> int:
    bm, bn, _ = s.tile
    return 8 if bm * bn > 128 * 128 else 4


def accumulator_regs(s: Schedule, spec: GemmSpec) -> int:
    """f32 (or packed f16) accumulator registers per MMA thread."""
    bm, bn, _ = s.tile
    per_reg = 2 if spec.acc_dtype == DType.f16 else 1
    if s.arch == "sm_90a":
        threads = 128 if s.mode == "pingpong" else 128 * consumer_warpgroups(s)
    else:
        threads = threads_per_cta(s)
    accumulators = 2 if spec.gate is not None else 1    # a gated tile holds its gate and up halves
    return math.ceil(accumulators * bm * bn / threads / per_reg)


def register_pool(arch: str, threads: int) -> int:
    """Registers an SM90 CTA of `threads` launches with, which setmaxnreg shares out: ptxas gives each thread
    the register file over the threads, in 8s."""
    return threads * (ARCH_LIMITS[arch].regs_per_sm // threads // 8 * 8)


def consumer_reg_overhead(s: Schedule, spec: GemmSpec) -> int:
    """Registers a consumer (SM90) or MMA (SM80) thread keeps live besides the accumulator."""
    if s.arch != "sm_90a":
        return SM80_REG_OVERHEAD
    mode = split_k_mode(s)
    # under "serial" the reduce kernel runs the epilogue; a gated kernel's gate function is one
    dag = (bool(spec.epilogue) and mode != "serial") or spec.gate is not None
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


# ---- the predicate --------------------------------------------------------------------------

def check_schedule(s: Schedule, spec: GemmSpec) -> list[Violation]:
    """Every rule `s` breaks for `spec` (empty: valid). The single source of truth."""
    v: list[Violation] = []
    add = lambda limit, value, fix: v.append(Violation(limit, value, fix))  # noqa: E731
    lim = ARCH_LIMITS[s.arch]
    sm90 = s.arch == "sm_90a"

    # form first: the resource model below needs integer sizes, stages and split_k
    if not _is_sizes(s.tile, 3):
        add("tile", repr(s.tile), "use three integers (M, N, K), e.g. tile=(128, 128, 64)")
    if not _is_sizes(s.cluster, 2):
        add("cluster", repr(s.cluster), "use two integers (M, N), the CTAs per cluster, e.g. cluster=(2, 1)")
    stages_ok = s.stages == "auto" or _is_int(s.stages)
    if not stages_ok:
        add("stages", repr(s.stages), "use an integer of at least 2, or 'auto'")
    if s.mode not in MODES:
        add("mode", s.mode, f"use one of {MODES}")
    if s.raster not in RASTERS:
        add("raster order", s.raster, "use 'm' or 'n'")
    if not (_is_int(s.swizzle) and s.swizzle in SWIZZLES):
        add("swizzle", repr(s.swizzle), f"use one of {SWIZZLES}")
    if not (_is_int(s.split_k) and 1 <= s.split_k <= 16):
        add("split_k", repr(s.split_k), "use an integer from 1 to 16")
    if not isinstance(s.pdl, bool):
        add("pdl", s.pdl, "use True (programmatic dependent launch, the default) or False (plain launches)")
    if not isinstance(s.swap_ab, bool):
        add("swap_ab", s.swap_ab, "use False (the default) or True (the kernel computes out^T = b @ a^T)")
    elif s.swap_ab and not sm90:
        add("swap_ab", True, "swapping A and B is SM90-only: use swap_ab=False on sm_80")
    elif s.swap_ab and _is_int(s.split_k) and s.split_k > SWAP_MAX_SPLITS:
        add("swap_ab with split_k", s.split_k, f"a swapped kernel sums its splits in the kernel, at most "
            f"{SWAP_MAX_SPLITS}: lower split_k")
    if not isinstance(s.stream_k, bool):
        add("stream_k", s.stream_k, "use False (the default) or True (stream-K: whole waves run data-parallel; the "
            "tiles of the last partial wave and one full wave are shared out as equal (tile, k-tile) runs per cluster)")
    elif s.stream_k:
        if not sm90:
            add("stream_k", True, "stream-K is SM90-only: use stream_k=False on sm_80")
        if _is_int(s.split_k) and s.split_k != 1:
            add("stream_k with split_k", s.split_k, "stream-K splits K itself: use split_k=1")
        if s.mode != "cooperative":
            add("stream_k mode", s.mode, "stream-K is built for cooperative kernels: use mode='cooperative'")
    if stages_ok and s.stages != "auto" and s.stages < 2:
        add("stages", s.stages, "use at least 2 (or 'auto')")
    if not (_is_sizes(s.tile, 3) and _is_sizes(s.cluster, 2) and stages_ok and _is_int(s.split_k)):
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
    if _is_sizes(s.tile, 3) and s.mode == "cooperative" and s.tile[0] == 192:
        v.append(Violation("gated GEMM tile M", 192, "a 192-row tile splits its columns between the consumer "
                           "warpgroups: use a 128- or 256-row tile"))
    return v


def launch_violations(s: Schedule, spec: GemmSpec) -> list[Violation]:
    """The launch grids and 32-bit sizes of `s` on `spec`'s static dims that pass their limits (symbolic dims
    are the runtime's to check, per call)."""
    v: list[Violation] = []
    add = lambda limit, value, fix: v.append(Violation(limit, value, fix))  # noqa: E731
    for name, d in (("M", spec.m), ("N", spec.n), ("K", spec.k), ("batch", spec.batch)):
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
           spec.k if spec.b_layout == "nk" else spec.n, spec.dtype)
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


# ---- the schedule space ---------------------------------------------------------------------

@dataclass(frozen=True)
class ScheduleSpace:
    """The axes the search and the heuristic enumerate. Cartesian product, filtered by the predicate."""
    tile_m: tuple[int, ...] = (64, 128, 256)
    # 96, 160 and 224 balance waves: N/BN lands near a multiple of the SM count (e.g. 28672/224 = 128
    # tiles on 132 SMs), where the powers of two strand SMs in a last partial wave (measured on the H200);
    # 192 and 208 fill the consumers' registers in 256-row tiles (the large-GEMM tiles)
    tile_n: tuple[int, ...] = (64, 96, 128, 160, 192, 208, 224, 256)
    tile_k: tuple[int, ...] = (64,)
    clusters: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 2), (2, 2))
    modes: tuple[str, ...] = MODES
    rasters: tuple[str, ...] = RASTERS
    swizzles: tuple[int, ...] = (1, 8)
    split_ks: tuple[int, ...] = (1, 2, 4)
    stages: tuple[Union[int, str], ...] = ("auto",)
    swap_ab: tuple[bool, ...] = (False,)

    @classmethod
    def for_arch(cls, arch: str) -> "ScheduleSpace":
        if as_arch(arch) == "sm_80":
            return cls(tile_m=(64, 128, 256), tile_n=(64, 128, 256), tile_k=(32, 64), clusters=((1, 1),),
                       modes=("cooperative",))
        return cls()

    @classmethod
    def swapped_decode(cls) -> "ScheduleSpace":
        """sm_90a kernels computing out^T = b @ a^T, for M <= SWAP_DECODE_MAX_M: the weights fill the 64/128-row
        MMA side, the activations an 8/16/32-wide tile, alone or two to a weight-multicasting 1x2 cluster; rings
        deeper than 'auto' (bench/results/heuristic-rules.md has the measurements)."""
        return cls(tile_m=(64, 128), tile_n=(8, 16, 32), tile_k=(64, 128), clusters=((1, 1), (1, 2)), modes=MODES,
                   rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto", 10, 16), swap_ab=(True,))

    @classmethod
    def swapped_batch(cls) -> "ScheduleSpace":
        """Swapped kernels for SWAP_DECODE_MAX_M < M <= SWAP_MAX_M: 32/64-wide activation tiles, and 1x2 clusters
        whose two CTAs share one multicast weight tile (the weights stream once, over twice the CTAs); rings
        past 'auto', up to what fits: these kernels are memory-bound."""
        return cls(tile_m=(64, 128), tile_n=(32, 64), tile_k=(64, 128), clusters=((1, 1), (1, 2)), modes=MODES,
                   rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto", 9, 10, 13, 16), swap_ab=(True,))

    @classmethod
    def odd_n_tiles(cls) -> "ScheduleSpace":
        """Unswapped 64-row ping-pong tiles whose N is an odd multiple of 16 (48, 80, 112), K tile 128, for
        SWAP_DECODE_MAX_M < M <= SWAP_MAX_M: N splits into about whole waves where the standard widths strand
        SMs (6144 / 48 = 128 tiles on 132 SMs)."""
        return cls(tile_m=(64,), tile_n=(48, 80, 112), tile_k=(128,), clusters=((1, 1), (1, 2), (2, 1)),
                   modes=("pingpong",), rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto",))

    def __iter__(self) -> Iterator[tuple]:
        return itertools.product(self.tile_m, self.tile_n, self.tile_k, self.clusters, self.modes,
                                 self.rasters, self.swizzles, self.split_ks, self.stages, self.swap_ab)


# the swapped spaces: 8/16/32-wide activation tiles up to SWAP_DECODE_MAX_M, 32/64-wide tiles up to
# SWAP_MAX_M; past that the unswapped kernels measured better (H200, M = 256)
SWAP_DECODE_MAX_M = 32
SWAP_MAX_M = 128


def standard_spaces(spec: GemmSpec, arch: str = "sm_90a") -> tuple[ScheduleSpace, ...]:
    """What the search enumerates for `spec`: the arch's standard space, plus on sm_90a a swapped
    space when M is known and at most SWAP_MAX_M, and past SWAP_DECODE_MAX_M the odd-N tiles."""
    arch = as_arch(arch)
    spaces = (ScheduleSpace.for_arch(arch),)
    if arch == "sm_90a" and isinstance(spec.m, int) and spec.m <= SWAP_MAX_M:
        spaces += ((ScheduleSpace.swapped_decode(),) if spec.m <= SWAP_DECODE_MAX_M
                   else (ScheduleSpace.swapped_batch(), ScheduleSpace.odd_n_tiles()))
    return spaces


def enumerate_schedules(spec: GemmSpec, arch: str = "sm_90a", space: ScheduleSpace | None = None) -> list[Schedule]:
    """Every valid schedule in `space` (default: `standard_spaces(spec, arch)`)."""
    arch = as_arch(arch)
    out = []
    for sp in ((space,) if space is not None else standard_spaces(spec, arch)):
        for bm, bn, bk, cl, mode, raster, sw, sk, st, swap in sp:
            s = Schedule((bm, bn, bk), cl, st, mode, raster, sw, sk, arch, swap_ab=swap)
            if is_valid(s, spec):
                out.append(s)
    return out


def default_schedule(arch: str = "sm_90a") -> Schedule:
    return Schedule(arch=arch) if as_arch(arch) == "sm_90a" else Schedule(tile=(128, 128, 32), arch="sm_80")
