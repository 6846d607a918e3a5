"""One measured schedule (`Measurement`): a row of the tuning DB, and what a search strategy observes; and what
Nsight Compute measured of one call (`L2Profile`), a row of the DB's profiles table.

Both sides use them: gemmc.search records and searches with them, gemmc.choose.tuning_db reads rows back as them.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Optional

from ..schedule import Schedule
from ..spec import GemmSpec


def schedule_key(s: Schedule) -> str:
    """Canonical JSON of a schedule: the DB's and the dataset's identity for it."""
    return json.dumps(s.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Measurement:
    """One evaluated schedule: a time in microseconds, or the error that stopped it."""
    schedule: Schedule
    time_us: Optional[float] = None
    error: Optional[str] = None
    cublas_us: Optional[float] = None
    compile_s: Optional[float] = None
    timing: Optional[str] = None      # SUSTAINED: each side timed at its own power-capped clock; None: interleaved
    profile: Optional["L2Profile"] = None   # ncu's metrics of the same schedule (`tune --profile l2`), if taken

    @property
    def ok(self) -> bool:
        return self.error is None and self.time_us is not None and math.isfinite(self.time_us) and self.time_us > 0


SUSTAINED = "sustained"     # Measurement.timing of a call timed by `--sustained-s` (bench_shape's `sustained`)


@dataclass(frozen=True)
class L2Profile:
    """What `ncu --clock-control none --cache-control all` measured of one call (every kernel it launches:
    the split-K reduce, cuBLAS's helpers): the L2 hit rate over the call's L2 sectors, the DRAM bytes read and
    written, the SM clock the kernels ran at and the tensor pipe's busy share (duration-weighted), and the
    call's time under the profiler (kernels serialised, L2 flushed before each: not the bench's time)."""
    l2_hit_rate: float                  # 0..1
    dram_read_bytes: float
    dram_write_bytes: float
    sm_clock_mhz: float
    duration_us: float
    tensor_pipe_pct: Optional[float] = None     # None where this ncu has no tensor-pipe metric for the GPU
    kernels: int = 1

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    def dram_ratio(self, spec: GemmSpec) -> float:
        """DRAM bytes moved / the problem's compulsory bytes (`ideal_dram_bytes`): 1.0 reads every operand and
        writes the output exactly once."""
        return self.dram_bytes / ideal_dram_bytes(spec)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "L2Profile":
        return cls(**{f: d[f] for f in PROFILE_FIELDS if d.get(f) is not None})


PROFILE_FIELDS = ("l2_hit_rate", "dram_read_bytes", "dram_write_bytes", "sm_clock_mhz", "duration_us",
                  "tensor_pipe_pct", "kernels")


def ideal_dram_bytes(spec: GemmSpec) -> int:
    """The bytes a call must move between DRAM and the chip: a, b and every full or vector epilogue input read
    once, the output written once (a gated GEMM's B is [gate; up], twice N rows)."""
    m, n, k = spec.m, spec.n, spec.k
    batch = spec.batch if isinstance(spec.batch, int) else 1
    b_rows = 2 * n if spec.gate is not None else n
    total = (m * k + b_rows * k) * spec.dtype.bytes + m * n * spec.out_dtype.bytes
    for i in spec.inputs:
        elems = {"full": m * n, "row": n, "col": m}.get(i.kind, 0)
        total += elems * i.dtype.bytes
    return batch * total
