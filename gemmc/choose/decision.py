"""What `schedule="auto"` decides (`Decision`), and the problem it decides for (`concrete`)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..schedule import Schedule
from ..spec import GemmSpec

# the step that decided (Decision.source); "alignment" is compile()'s: no kernel takes the problem
SOURCES = ("db", "pretuned", "policy", "nearest", "heuristic", "alignment")

EPILOGUE_KEEPS_THE_KERNEL = ("cuBLAS was faster, but the fused epilogue keeps the kernel (cuBLAS would need extra "
                             "passes)")
# an fp8 problem's "cuBLAS" is torch's fp8 GEMM (gemmc.bench.fp8): per block, a torch implementation, not a route
BLOCKWISE_KEEPS_THE_KERNEL = ("torch's blockwise implementation was faster, but torch._scaled_mm takes no blockwise "
                              "scales here: the kernel runs")
FP8_HEURISTIC_NOTE = ("no fp8 measurements yet: the heuristic's model (fitted on bf16 sweeps; fp8's peak doubled) "
                      "picks, and torch._scaled_mm runs only where a tuning DB measured it faster")


@dataclass(frozen=True)
class Decision:
    schedule: Schedule
    source: str               # one of SOURCES
    use_cublas: bool = False
    detail: str = ""


def concrete(spec: GemmSpec, m: Optional[int]) -> Optional[GemmSpec]:
    """`spec` at the runtime `m` when its M is symbolic; None while any dim (or the batch) stays symbolic."""
    if m is not None and not isinstance(spec.m, int):
        spec = replace(spec, m=int(m))
    # a symbolic batch is a different problem from no batch: the DB cannot tell them apart, so neither
    # is looked up (the heuristic answers)
    dims_known = all(isinstance(d, int) for d in (spec.m, spec.n, spec.k))
    return spec if dims_known and (spec.batch is None or isinstance(spec.batch, int)) else None
