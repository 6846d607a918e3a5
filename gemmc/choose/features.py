"""Numeric encodings of a problem and a schedule: the trained policy's (gemmc.choose.schedule_policy, trained by
gemmc.search.rl) and the search's GP (gemmc.search.bayes).

Schedule features are the factored choices (tile, cluster, mode, raster, swizzle, split-K, swap_ab, the L2
fields) plus what they imply for this shape: tile counts, wave quantization, padding waste, k-loop length,
and the L2 hints and prefetch depth the kernel takes on this shape (an "auto" field resolved by its rule). A swapped
schedule's implications are those of the kernel's own problem, out^T = b @ a^T (M and N exchanged).
These are descriptions for a model, not limits: feasibility is decided by `gemmc.schedule` alone.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..schedule import (ARCH_LIMITS, L2_POLICIES, MODES, PDL_PREFETCH_K_TILES, RASTERS, Schedule, kernel_grid,
                        pdl_trigger_bands, resolve_stages)
from ..spec import GemmSpec
from ..types import DType

FEATURE_VERSION = 5      # 2: swap_ab among the choices, the A/B ring depth, derived features of the kernel's problem;
                         # 3: tile N 8 (swapped 8-wide activation tiles); 4: tile N 48, 80, 112 (odd_n_tiles);
                         # 5: the L2 fields (eviction priorities of a, b and the store; the PDL prefetch depth);
                         #    fp8 problems (A's dtype f8e4m3, an f8e5m2 B, the scaling)

TILE_M_VOCAB = (64, 128, 256)
TILE_N_VOCAB = (8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)
TILE_K_VOCAB = (32, 64, 128)
CLUSTER_VOCAB = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4))
SWIZZLE_VOCAB = (1, 2, 4, 8)
SPLIT_K_VOCAB = (1, 2, 4, 8, 16)
DTYPE_VOCAB = (DType.bf16, DType.f16, DType.f8e4m3)
OUT_DTYPE_VOCAB = (DType.bf16, DType.f16, DType.f32)
SCALING_VOCAB = ("tensor", "row", "block")      # an fp8 problem's scaling (none: bf16/f16)

SHAPE_FEATURES = ("log2_m", "log2_n", "log2_k", "log2_mn_over_k", *(f"dtype_{d}" for d in DTYPE_VOCAB),
                  *(f"out_{d}" for d in OUT_DTYPE_VOCAB), "a_km", "b_kn", "has_epilogue", "acc_f16",
                  "b_f8e5m2", *(f"scaling_{x}" for x in SCALING_VOCAB))

DERIVED_FEATURES = ("log2_ctas", "waves", "wave_eff", "pad_eff_m", "pad_eff_n", "cluster_pad_eff",
                    "log2_k_iters", "log2_tile_area", "log2_bytes_per_flop", "log2_stages")


def _onehot(value, vocab) -> list[float]:
    return [1.0 if value == v else 0.0 for v in vocab]


def shape_features(spec: GemmSpec) -> list[float]:
    m, n, k = spec.m, spec.n, spec.k
    return [math.log2(m), math.log2(n), math.log2(k), math.log2(m * n / k),
            *_onehot(spec.dtype, DTYPE_VOCAB), *_onehot(spec.out_dtype, OUT_DTYPE_VOCAB),
            float(spec.a_layout == "km"), float(spec.b_layout == "kn"), float(spec.has_epilogue),
            float(spec.acc_dtype == DType.f16), float(spec.b_dtype == DType.f8e5m2),
            *_onehot(spec.scaling.mode if spec.scaling is not None else None, SCALING_VOCAB)]


def derived_features(s: Schedule, spec: GemmSpec) -> list[float]:
    """What the schedule implies for this shape (SM count from the arch table)."""
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    sms = ARCH_LIMITS[s.arch].num_sms
    m, n = (spec.n, spec.m) if s.swap_ab else (spec.m, spec.n)     # the kernel's own problem
    tm, tn, tmc, tnc = kernel_grid(s, spec.m, spec.n)
    ctas = tmc * tnc * s.split_k
    waves = ctas / sms
    wave_eff = ctas / (math.ceil(waves) * sms)
    k_iters = math.ceil(math.ceil(spec.k / bk) / s.split_k)
    # operand bytes loaded per MMA flop of one CTA (smaller is better), multicast shares loads
    bytes_per_flop = (bm / cn + bn / cm) * spec.dtype.bytes / (2.0 * bm * bn)
    return [math.log2(ctas), min(waves, 8.0), wave_eff, m / (tm * bm), n / (tn * bn),
            (tm * tn) / (tmc * tnc), math.log2(k_iters), math.log2(bm * bn), math.log2(bytes_per_flop),
            math.log2(max(1, resolve_stages(s, spec)))]


def choice_features(s: Schedule) -> list[float]:
    """The factored choices themselves, one-hot per factor (the policy's action encoding)."""
    bm, bn, bk = s.tile
    return [*_onehot(bm, TILE_M_VOCAB), *_onehot(bn, TILE_N_VOCAB), *_onehot(bk, TILE_K_VOCAB),
            *_onehot(tuple(s.cluster), CLUSTER_VOCAB), *_onehot(s.mode, MODES), *_onehot(s.raster, RASTERS),
            *_onehot(s.swizzle, SWIZZLE_VOCAB), *_onehot(s.split_k, SPLIT_K_VOCAB), float(s.swap_ab),
            *_onehot(s.l2_a, L2_POLICIES), *_onehot(s.l2_b, L2_POLICIES), *_onehot(s.l2_out, L2_POLICIES),
            float(s.l2_prefetch == "auto"), 0.0 if s.l2_prefetch == "auto" else math.log2(1 + s.l2_prefetch)]


# an eviction priority as a number: evict-first streams, evict-last keeps (no hint: 0)
_PRIORITY = {"first": -1.0, "normal": 0.0, "last": 1.0, "": 0.0}


def effective_l2(s: Schedule, spec: GemmSpec) -> list[float]:
    """What the L2 fields do on this shape: the priority of a's loads, b's loads and the store (an "auto" load
    is evict-first when the grid loads each of its tiles once: one tile or cluster across the other extent),
    and log2(1 + k-tiles prefetched before the PDL wait) ("auto": 2 in the PDL bands' grids, else 0)."""
    bm, bn, _ = s.tile
    cm, cn = s.cluster
    # the kernel's rows and columns: swapped, its A is b (rows over N) and its B is a (columns over M)
    rows, cols = (spec.n, spec.m) if s.swap_ab else (spec.m, spec.n)
    once_kernel_a = math.ceil(cols / bn) <= cn      # each of the kernel's A tiles loads once
    once_kernel_b = math.ceil(rows / bm) <= cm
    once = {"a": once_kernel_b if s.swap_ab else once_kernel_a, "b": once_kernel_a if s.swap_ab else once_kernel_b}
    prio = [_PRIORITY["first" if once[op] else ""] if getattr(s, f"l2_{op}") == "auto"
            else _PRIORITY[getattr(s, f"l2_{op}")] for op in ("a", "b")]
    prio.append(_PRIORITY[s.l2_out if s.l2_out != "auto" else ""])
    if s.l2_prefetch != "auto":
        depth = s.l2_prefetch if s.pdl else 0
    else:
        tm, tn, tmc, tnc = kernel_grid(s, spec.m, spec.n)
        sms = ARCH_LIMITS[s.arch].num_sms
        ctas = min(tmc * tnc * s.split_k, sms)
        early, full = pdl_trigger_bands(sms)
        depth = PDL_PREFETCH_K_TILES if s.pdl and (ctas <= early or ctas >= full) else 0
    return [*prio, math.log2(1 + depth)]


def describes(s: Schedule) -> bool:
    """Whether these features tell `s` apart from other schedules: every choice is in its vocabulary and
    `s` uses no knob they leave out (stream-K). Others (192-row tiles, stream-K) would be encoded as a
    different schedule, so the policy does not learn from them."""
    bm, bn, bk = s.tile
    return (bm in TILE_M_VOCAB and bn in TILE_N_VOCAB and bk in TILE_K_VOCAB and tuple(s.cluster) in CLUSTER_VOCAB
            and s.swizzle in SWIZZLE_VOCAB and s.split_k in SPLIT_K_VOCAB and not s.stream_k)


def gp_features(s: Schedule, spec: GemmSpec) -> list[float]:
    """Compact ordinal encoding for the GP (few dims: it sees at most a few dozen points)."""
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    return [math.log2(bm), math.log2(bn), math.log2(bk), math.log2(cm), math.log2(cn),
            float(s.mode == "pingpong"), float(s.raster == "n"), math.log2(s.swizzle), math.log2(s.split_k),
            float(s.swap_ab), *derived_features(s, spec), *effective_l2(s, spec)]


@dataclass(frozen=True)
class FeatureSpec:
    """Saved beside policy weights so a loaded policy refuses features it was not trained on."""
    version: int = FEATURE_VERSION
    shape: tuple[str, ...] = SHAPE_FEATURES
    choice_dim: int = (len(TILE_M_VOCAB) + len(TILE_N_VOCAB) + len(TILE_K_VOCAB) + len(CLUSTER_VOCAB)
                       + len(MODES) + len(RASTERS) + len(SWIZZLE_VOCAB) + len(SPLIT_K_VOCAB) + 1
                       + 3 * len(L2_POLICIES) + 2)
    derived: tuple[str, ...] = DERIVED_FEATURES

    @property
    def dim(self) -> int:
        return len(self.shape) + self.choice_dim + len(self.derived)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSpec":
        return cls(d["version"], tuple(d["shape"]), d["choice_dim"], tuple(d["derived"]))


def policy_features(s: Schedule, spec: GemmSpec, shape: list[float] | None = None) -> list[float]:
    return [*(shape if shape is not None else shape_features(spec)), *choice_features(s), *derived_features(s, spec)]
