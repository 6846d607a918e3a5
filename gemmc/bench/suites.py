"""Benchmark shape suites and the `--shapes FILE` parser.

A shape is (M, N, K) for out[M, N] = A[M, K] @ B[N, K].T (the nn.Linear layout gemmc and
cuBLAS both run here). The "moe" suite (`gemmc-search tune --suite moe`) is of grouped problems instead
(`GroupedShape`): one projection of a mixture-of-experts model's experts at a rows-per-expert bucket.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..errors import SpecError


@dataclass(frozen=True, order=True)
class Shape:
    m: int
    n: int
    k: int

    def __post_init__(self):
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise SpecError(f"shape dim {name.upper()}={v!r} must be a positive integer")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def as_dict(self) -> dict:
        return {"m": self.m, "n": self.n, "k": self.k}


SQUARE_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)

# Llama-3 8B/70B projection (N, K) pairs: qkv, o, gate+up, down for 8B, then the same for 70B.
LLM_NK = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
          (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))
LLM_M = (1, 16, 64, 128, 256, 1024, 4096, 16384)

CUDA_L2_DIMS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)

SUITES = ("square", "llm", "cuda-l2", "moe")


@dataclass(frozen=True, order=True)
class GroupedShape:
    """A contiguous grouped GEMM of gemmc.bench.moe: `projection` of `model`'s experts (E of them, N x K each)
    with `rows` rows in every expert; M = E x rows. `spec(dtype)` is its problem (the tuning DB's key:
    E, N, K and the rows bucket); a bench dtype name ("bf16", "fp8-block": gemmc.bench.fp8.spec_kwargs)."""
    model: str
    projection: str
    rows: int

    def spec(self, dtype="bf16"):
        from .fp8 import spec_kwargs
        from .moe import model, spec_of
        s = spec_of(model(self.model), self.projection, **spec_kwargs(dtype))
        return s.with_dims(m=s.groups * self.rows)

    @property
    def m(self) -> int:
        return self.spec().m

    @property
    def n(self) -> int:
        return self.spec().n

    @property
    def k(self) -> int:
        return self.spec().k

    @property
    def flops(self) -> float:
        return self.spec().flops()

    def __str__(self) -> str:
        return f"{self.model}/{self.projection}/{self.rows}"


def moe() -> list[GroupedShape]:
    """Every model's up and down projections at the rows-per-expert buckets its token counts make
    (gemmc.bench.moe.TOKENS routed top_k)."""
    from .moe import MODELS, PROJECTIONS, TOKENS, tokens_per_expert_bucket
    return [GroupedShape(m.name, p, rows) for m in MODELS for p in PROJECTIONS
            for rows in sorted({tokens_per_expert_bucket(t * m.top_k, m.experts) for t in TOKENS})]


def square() -> list[Shape]:
    return [Shape(s, s, s) for s in SQUARE_SIZES]


def llm() -> list[Shape]:
    """Every (N, K) pair at every M: 8 x 8 = 64 shapes, grouped by M (decode first)."""
    return [Shape(m, n, k) for m in LLM_M for n, k in LLM_NK]


def cuda_l2(sample: int | None = None, seed: int = 0) -> list[Shape]:
    """The 10 x 10 x 10 grid (1000 shapes), or a seeded sample of `sample` of them in grid order."""
    grid = [Shape(m, n, k) for m in CUDA_L2_DIMS for n in CUDA_L2_DIMS for k in CUDA_L2_DIMS]
    if sample is None or sample >= len(grid):
        return grid
    if sample <= 0:
        raise SpecError(f"--sample {sample}: use a positive number of shapes (at most {len(grid)})")
    picked = set(random.Random(seed).sample(range(len(grid)), sample))
    return [s for i, s in enumerate(grid) if i in picked]


def get_suite(name: str, sample: int | None = None, seed: int = 0) -> list[Shape]:
    if name == "square":
        shapes = square()
    elif name == "llm":
        shapes = llm()
    elif name == "cuda-l2":
        return cuda_l2(sample, seed)
    elif name == "moe":
        shapes = moe()
    else:
        raise SpecError(f"unknown suite {name!r}; use one of {', '.join(SUITES)} or --shapes FILE")
    if sample is not None and sample < len(shapes):
        if sample <= 0:
            raise SpecError(f"--sample {sample}: use a positive number of shapes")
        picked = set(random.Random(seed).sample(range(len(shapes)), sample))
        shapes = [s for i, s in enumerate(shapes) if i in picked]
    return shapes


class ShapeFileError(SpecError):
    """A line of a --shapes file is not `M N K`."""


_SPLIT = re.compile(r"[\s,;]+")


def parse_shapes(text: str, source: str = "<shapes>") -> list[Shape]:
    """`M N K` per line, separated by spaces, tabs, commas or semicolons; `#` starts a comment; blank lines
    are skipped; a CSV header line `M,N,K` (any case) is allowed as the first data line."""
    shapes: list[Shape] = []
    seen_data = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f for f in _SPLIT.split(line) if f]
        if not seen_data and [f.lower() for f in fields] == ["m", "n", "k"]:
            seen_data = True
            continue
        seen_data = True
        where = f"{source}:{lineno}: {raw.strip()!r}"
        if len(fields) != 3:
            raise ShapeFileError(f"{where}: expected 3 numbers 'M N K', got {len(fields)} field(s)")
        try:
            m, n, k = (int(f) for f in fields)
        except ValueError:
            raise ShapeFileError(f"{where}: M, N and K must be integers") from None
        if min(m, n, k) <= 0:
            raise ShapeFileError(f"{where}: M, N and K must be positive")
        shapes.append(Shape(m, n, k))
    if not shapes:
        raise ShapeFileError(f"{source}: no shapes found; write one 'M N K' per line")
    return shapes


def load_shapes(path) -> list[Shape]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")   # -sig: a spreadsheet's CSV export starts with a BOM
    except OSError as e:
        raise ShapeFileError(f"cannot read shapes file {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ShapeFileError(f"shapes file {p} is not text (byte {e.start} is not UTF-8); write one 'M N K' "
                             "per line in a plain text file") from None
    return parse_shapes(text, str(p))


def dedupe(shapes: Iterable[Shape]) -> list[Shape]:
    out, seen = [], set()
    for s in shapes:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
