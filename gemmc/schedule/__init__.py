"""`Schedule` (how to run a GEMM) and the one validity predicate over (schedule, problem).

The verifier pass, the heuristic and every search strategy call `check_schedule`; nothing else
decides whether a schedule is legal. The resource model (shared memory per stage, epilogue staging,
accumulator registers) is the same one `pipeline-staging` uses to choose stages. One module per job:
  limits     what each architecture offers, and the fixed sizes the kernels are built around
  knobs      the Schedule record and Violation
  resources  the resource model: threads, registers, shared memory, split-K mode
  predicate  check_schedule and its parts (gated, fp8, launch, alignment rules)
  space      the schedule space the search and the heuristic enumerate
"""
# the package's public names, as `from gemmc.schedule import ...` has always found them
from .knobs import L2_FIELDS, Schedule, Violation  # noqa: F401
from .limits import (ARCH_LIMITS, ArchLimits, BARRIER_RESERVE_BYTES, CONSUMER_REG_OVERHEAD,  # noqa: F401
                     CONSUMER_REG_OVERHEAD_EPILOGUE, CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS,
                     CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS_PINGPONG, CONSUMER_REGS, CONSUMER_REGS_MAX, EPI_STAGES,
                     EPI_TILE_N, GRID_YZ_MAX, INT32_MAX, L2_POLICIES, L2_PREFETCH_MAX, MODES, PDL_PREFETCH_K_TILES,
                     pdl_trigger_bands, PRODUCER_REGS, PRODUCER_REGS_MIN, RASTERS, SM80_COMPILE_ARCHS, SM80_MAX_REGS,
                     SM80_REG_OVERHEAD, SPLITK_REDUCE_COLUMNS, SWIZZLES)
from .predicate import (alignment_violations, check_schedule, fp8_violations, gate_violations,  # noqa: F401
                        group_violations, is_valid, l2_violations, launch_violations, require_valid)
from .resources import (ab_stage_bytes, accumulator_count, accumulator_regs, consumer_reg_overhead,  # noqa: F401
                        consumer_regs_needed, consumer_warpgroups, epilogue_smem_bytes, epilogue_tile,
                        FIXUP_MAX_SPLITS, kernel_grid, max_stages, promotion_interval, register_budgets,
                        register_pool, resolve_stages, sm80_ring_smem_bytes, sm80_warps, smem_bytes, split_k_mode,
                        splits_n, SWAP_MAX_SPLITS, threads_per_cta)
from .space import (default_schedule, enumerate_schedules, ScheduleSpace, standard_spaces,  # noqa: F401
                    SWAP_DECODE_MAX_M, SWAP_MAX_M)
