"""The SM90 kernel as CuTe DSL code, split by role, parameterised by one kernel's facts.

A generated module (gemmc/backends/sm90/emit.py) holds only what varies per kernel: the constants block of
plan facts and the epilogue DAG's function. It builds `Sm90Gemm(KernelFacts.from_namespace(globals()),
epilogue_dag, reduce_partials)` and calls it from its @cute.jit entry.

    facts.py      KernelFacts, EpilogueInput: what the kernel modules read (through cutlass.const_expr)
    gemm.py       Sm90Gemm: host side (views, TMA atoms, shared storage, launch) and the kernel's prologue
    scheduler.py  static persistent scheduler (raster, swizzle, split-K decode) and stream-K
    groups.py     grouped GEMMs: work units -> (group, tile) from the offsets or counts, on the device
    producer.py   TMA (multicast) loads into the smem ring; PDL prefetch and launch trigger
    consumer.py   WGMMA main loop, cooperative or ping-pong
    promotion.py  the block-scaled fp8 main loop: each k-tile promoted into an f32 sum times its block scales
    fixup.py      in-kernel sums of split tiles' partials (split-K fix-up, stream-K)
    epilogue.py   the DAG on the accumulators, TMA store or direct store

The generated module names these modules and the digest of their source (`source_digest`), so a kernel's
cache key changes whenever they do.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

MODULES = ("facts", "gemm", "scheduler", "groups", "producer", "consumer", "promotion", "fixup", "epilogue")
_DIR = Path(__file__).resolve().parent


def source_digest() -> str:
    """sha256 over the kernel modules' source (this package's .py files, by name); reads files, imports nothing."""
    h = hashlib.sha256()
    for path in sorted(_DIR.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def __getattr__(name):
    # the DSL classes import cutlass: only when a generated module asks for them
    if name in ("Sm90Gemm",):
        from .gemm import Sm90Gemm
        return Sm90Gemm
    if name in ("KernelFacts", "EpilogueInput"):
        from . import facts
        return getattr(facts, name)
    raise AttributeError(name)
