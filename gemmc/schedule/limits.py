"""What each architecture offers and the fixed sizes every SM90/SM80 kernel is built around: shared memory,
registers, clusters, setmaxnreg budgets, epilogue staging, launch limits."""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("cooperative", "pingpong")
RASTERS = ("m", "n")  # which tile coordinate varies fastest across consecutive CTAs
SWIZZLES = (1, 2, 4, 8)
# L2 eviction priorities of a TMA copy (Schedule.l2_a, l2_b, l2_out): "auto" is gemmc's rule (A and B loads
# evict-first in the calls whose grid loads each of their tiles once, the store without a hint); the others
# hint every copy of that operand
L2_POLICIES = ("auto", "first", "normal", "last")
# Schedule.l2_prefetch: at most this many k-tiles of the weights prefetched into L2 before the PDL wait
L2_PREFETCH_MAX = 32
# l2_prefetch "auto": before griddepcontrol.wait, grids in the PDL bands prefetch this many k-tiles of both
# operands of their first tile into L2 (safe: L2 is the point of coherence). H200, 50 llm shapes back to back:
# 2 k-tiles lifted M <= 128 by 0.7% and M = 256 by 1.2%, 4 gained less, 8 and 16 lost up to 28%; 96-CTA grids
# lost 4% even at 2.
PDL_PREFETCH_K_TILES = 2


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
