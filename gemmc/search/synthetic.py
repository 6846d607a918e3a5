"""A synthetic H200-like GEMM time model, to develop the strategies before real data exists.

The landscape has the features that make real schedule search hard: wave quantization on 132
SMs, tile padding, per-tile MMA efficiency, short k-loops that cannot fill the pipeline, the
split-K reduction's cost, operand multicast within clusters, L2 reuse that depends on the
raster order and swizzle, an epilogue that ping-pong hides, and noise. Records are written in the
dataset format `simulate` replays (gzipped JSONL: a header line, then one line per measurement).
"""
from __future__ import annotations

import hashlib
import math
import random
from typing import Iterable

from ..schedule import ARCH_LIMITS, Schedule, enumerate_schedules
from ..spec import GemmSpec

PEAK_FLOPS = 989e12        # dense bf16 tensor-core peak of an H200 SXM
DRAM_BW = 4.0e12           # achievable HBM3e bytes/s
L2_BYTES = 50e6
L2_BW_PER_SM = 80e9        # L2 -> SM bytes/s per SM
LAUNCH_US = 3.0

# MMA efficiency of a CTA tile in its mode: bigger tiles amortize more; ping-pong overlaps.
_TILE_EFF = {
    (64, 64, "pingpong"): 0.50, (64, 128, "pingpong"): 0.68, (64, 192, "pingpong"): 0.74,
    (64, 256, "pingpong"): 0.78, (128, 64, "pingpong"): 0.66, (128, 128, "pingpong"): 0.86,
    (128, 64, "cooperative"): 0.62, (128, 128, "cooperative"): 0.83, (128, 192, "cooperative"): 0.89,
    (128, 256, "cooperative"): 0.93, (256, 64, "cooperative"): 0.72, (256, 128, "cooperative"): 0.91,
}


def _unit_hash(*parts) -> float:
    """Deterministic U(0,1) from its arguments (stable across processes, unlike hash())."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0 ** 64


def _gauss(*parts) -> float:
    u1, u2 = max(_unit_hash(*parts, 1), 1e-12), _unit_hash(*parts, 2)
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def model_time_us(s: Schedule, spec: GemmSpec, noise: float = 0.02, seed: int = 0) -> float:
    """Modelled kernel time in microseconds (deterministic for a given seed)."""
    t = _model(s, spec)["t_us"]
    return t * math.exp(noise * _gauss("noise", seed, spec.m, spec.n, spec.k, s.short()))


def model_profile(s: Schedule, spec: GemmSpec, noise: float = 0.02, seed: int = 0):
    """What ncu would report of the modelled call (an L2Profile): the model's DRAM bytes, an L2 hit rate of
    the operand bytes the CTAs load that DRAM did not serve, and the tensor pipe's share of the time; each with
    its own noise. Synthetic: for developing the `time+l2` reward, not evidence about a GPU."""
    from ..choose.measurement import L2Profile
    x = _model(s, spec)
    jitter = lambda tag: math.exp(noise * _gauss(tag, seed, spec.m, spec.n, spec.k, s.short()))  # noqa: E731
    write = spec.m * spec.n * spec.out_dtype.bytes
    read = max(0.0, x["dram"] - write) * jitter("dram")
    hit = min(1.0, max(0.0, 1.0 - read / max(x["l2_loads"], 1.0)))
    return L2Profile(l2_hit_rate=hit, dram_read_bytes=read,
                     dram_write_bytes=write * (2.0 if s.split_k > 1 else 1.0), sm_clock_mhz=1755.0 * jitter("clock") ** 0.5, duration_us=x["t_us"] * jitter("duration"),
                     tensor_pipe_pct=min(100.0, 100.0 * x["t_mma_us"] / x["t_us"]), kernels=1)


def _model(s: Schedule, spec: GemmSpec) -> dict:
    """The noise-free model: t_us (the call), dram (bytes), l2_loads (operand bytes the CTAs load from L2),
    t_mma_us (the MMA time of all waves)."""
    m, n, k = spec.m, spec.n, spec.k
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    sk = s.split_k
    ib, ob = spec.dtype.bytes, spec.out_dtype.bytes
    sms = ARCH_LIMITS[s.arch].num_sms
    csize = cm * cn
    usable_sms = sms if csize <= 2 else (sms // 8) * 8 if csize == 4 else sms // 16 * 16

    tm, tn = math.ceil(m / bm), math.ceil(n / bn)
    tmc, tnc = math.ceil(tm / cm) * cm, math.ceil(tn / cn) * cn
    ctas = tmc * tnc * sk
    waves = math.ceil(ctas / usable_sms)
    k_per = math.ceil(k / sk)
    k_tiles = math.ceil(k_per / bk)

    eff = _TILE_EFF.get((bm, bn, s.mode), 0.6) * k_tiles / (k_tiles + 1.5)   # pipeline fill/drain
    eff *= 1.0 + 0.04 * _gauss("tile", bm, bn, s.mode, csize)                  # codegen luck per config
    t_mma = 2.0 * bm * bn * k_tiles * bk / (PEAK_FLOPS / sms * eff)
    # operands stream from L2; a cluster multicasts A over its N extent and B over its M extent
    t_load = (bm / cn + bn / cm) * k_tiles * bk * ib / L2_BW_PER_SM
    epi_bytes = bm * bn * (ob if sk == 1 else 4)
    t_epi = epi_bytes / (L2_BW_PER_SM * 2) * (0.25 if s.mode == "pingpong" else 1.0)
    t_tile = max(t_mma, t_load) + 0.15 * min(t_mma, t_load) + t_epi + 0.4e-6
    t_compute = waves * t_tile

    # DRAM: each wave loads the operand panels its CTAs touch; raster/swizzle decide the panel shape
    wave = min(ctas / sk, usable_sms / sk)
    fast, slow = (tmc, tnc) if s.raster == "m" else (tnc, tmc)
    group = s.swizzle
    span_fast = min(fast, math.ceil(wave / min(group, slow)))
    span_slow = min(slow, max(min(group, slow), math.ceil(wave / fast)))
    rows, cols = (span_fast, span_slow) if s.raster == "m" else (span_slow, span_fast)
    per_wave = (rows * bm + cols * bn) * k * ib
    unique = (m * k + n * k) * ib
    dram = max(unique, per_wave * math.ceil(tmc * tnc / max(wave, 1)))
    if per_wave > L2_BYTES:
        dram *= 1.0 + 0.5 * (per_wave / L2_BYTES - 1.0)
    dram += m * n * ob
    if sk > 1:
        dram += 2.0 * m * n * 4 * sk      # partial sums out and back
    t_dram = dram / DRAM_BW

    t = max(t_compute, t_dram) + 0.1 * min(t_compute, t_dram)
    t = t * 1e6 + LAUNCH_US + (2.0 if sk > 1 else 0.0)
    l2_loads = ctas * (bm / cn + bn / cm) * k_tiles * bk * ib
    return {"t_us": t, "dram": dram, "l2_loads": l2_loads, "t_mma_us": waves * t_mma * 1e6}


LLM_NK = ((4096, 4096), (12288, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (4096, 14336),
          (8192, 8192), (28672, 8192), (8192, 28672), (1024, 4096), (6144, 4096), (5120, 5120),
          (13824, 5120), (5120, 13824), (2048, 2048), (3072, 768))
LLM_M = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def synthetic_shapes(count: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """`count` distinct (m, n, k) mixing LLM projections and squares."""
    rng = random.Random(seed)
    pool = [(m, n, k) for n, k in LLM_NK for m in LLM_M] + [(s, s, s) for s in (512, 1024, 2048, 4096, 8192)]
    rng.shuffle(pool)
    return sorted(pool[:count])


def synthetic_records(shapes: Iterable[tuple[int, int, int]], dtype: str = "bf16", seed: int = 0,
                      noise: float = 0.02, error_rate: float = 0.01, profiles: bool = False) -> list[dict]:
    """One record per feasible schedule per shape, in the dataset format; with `profiles`, each successful one
    carries the model's ncu-like profile (`model_profile`)."""
    rng = random.Random(seed)
    out = []
    for m, n, k in shapes:
        spec = GemmSpec(m, n, k, dtype=dtype)
        scheds = enumerate_schedules(spec, "sm_90a")
        times = {s: model_time_us(s, spec, noise, seed) for s in scheds}
        best = min(times.values())
        # cuBLAS: near the best for big shapes, weaker on skinny ones (its heuristics are generic)
        cublas = best * (rng.uniform(0.96, 1.08) if m >= 1024 else rng.uniform(1.0, 1.3))
        for s in scheds:
            rec = {"m": m, "n": n, "k": k, "dtype": dtype, "out_dtype": dtype, "a_layout": "mk",
                   "b_layout": "nk", "arch": "sm_90a", "schedule": s.to_dict(), "cublas_us": round(cublas, 3)}
            if rng.random() < error_rate:
                rec.update(time_us=None, error="synthetic compile failure")
            else:
                rec.update(time_us=round(times[s], 3), error=None)
                if profiles:
                    rec["profile"] = model_profile(s, spec, noise, seed).to_dict()
            out.append(rec)
    return out


def make_synthetic_dataset(path, n_shapes: int = 40, seed: int = 0, noise: float = 0.02, profiles: bool = False):
    """Write the bench's dataset format (gemmc.bench.dataset) from the synthetic model."""
    from ..bench.dataset import write_dataset
    shapes = synthetic_shapes(n_shapes, seed)
    header = {"device": {"name": "synthetic H200 model"}, "dtype": "bf16", "arch": "sm_90a", "synthetic": True,
              "method": {"model": "gemmc.search.synthetic", "seed": seed, "noise": noise, "profiles": profiles},
              "shapes": len(shapes)}
    return write_dataset(path, header, synthetic_records(shapes, seed=seed, noise=noise, profiles=profiles))
