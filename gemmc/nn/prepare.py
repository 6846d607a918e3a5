"""`gemmc.nn.prepare`: build and load, ahead of time, every kernel a model's gemmc layers will run at the given
row counts, so a later CUDA-graph capture builds and loads nothing."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Iterable

from torch import nn
from tqdm import tqdm

import gemmc.torch_ops as gto

from ..errors import SpecError
from .gated_mlp import GatedMLP
from .linear import Linear
from .swap import KernelKey

# Show a progress bar from this many (kernel, row count) pairs on (each may build a kernel: ~1-2 s of CPU).
_PROGRESS_FROM = 8


@dataclass
class PrepareSummary:
    """What prepare did: the distinct kernels prepared for `row_counts`, and the gemmc layers it skipped."""
    kernels: dict[KernelKey, list[str]] = field(default_factory=dict)   # kernel -> the layers it serves
    row_counts: list[int] = field(default_factory=list)
    training: bool = False
    skipped: dict[str, str] = field(default_factory=dict)   # gemmc layer on torch's path -> why
    built: dict[KernelKey, list] = field(default_factory=dict)  # kernel -> gemmc.torch_ops.prepare_linear's report
    seconds: float = 0.0

    @property
    def layers(self) -> int:
        return sum(len(names) for names in self.kernels.values())

    def __str__(self) -> str:
        what = "forward and backward" if self.training else "forward"
        lines = [f"prepared {len(self.kernels)} gemmc kernels ({what}) for {self.layers} layers at M = "
                 f"{self.row_counts} in {self.seconds:.1f} s"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def prepare(model: nn.Module, batch_sizes: Iterable[int], training: bool = False,
            progress: bool | None = None) -> PrepareSummary:
    """For every gemmc layer of `model` (gemmc.nn.Linear, and a GatedMLP's gated kernel) that runs gemmc,
    build and load the kernels a call with each of `batch_sizes` rows runs (gemmc.torch_ops.prepare_linear,
    prepare_gated; with training=True a GatedMLP runs its [gate; up] Linear, prepared as one),
    so a later CUDA-graph capture (torch.compile mode="reduce-overhead", or torch.cuda.graph) finds them ready.

    A row count is M, the tokens in one call: for decode at batch b, M = b; for a prefill of b sequences of
    length s, M = b * s (a model that computes logits for the last token only calls its lm_head with M = b:
    list both). training=True also prepares the backward kernels. Layers sharing a kernel are prepared once.
    progress: True / False forces the progress bar on / off; None shows it when there is much to build."""
    row_counts = _row_counts(batch_sizes)
    summary = PrepareSummary(row_counts=row_counts, training=training)
    for name, module in model.named_modules():
        # inference: a GatedMLP runs its gated kernel, and its [gate; up] Linear for decode-sized calls
        if not training and isinstance(module, GatedMLP) and module.gated_kernel_args is not None:
            n, k, dtype, gate = module.gated_kernel_args
            summary.kernels.setdefault(KernelKey(n, k, dtype, False, "none", gate), []).append(name)
        if not isinstance(module, Linear):
            continue
        reason = module.fallback_reason
        if reason is not None:
            summary.skipped[name] = reason
        else:
            summary.kernels.setdefault(KernelKey(*module.kernel_key), []).append(name)
    if not summary.kernels:
        warnings.warn("gemmc.nn.prepare: the model has no layer that runs gemmc (call gemmc.nn.swap_linears "
                      "on the model, on CUDA, first); nothing was prepared", UserWarning, stacklevel=2)
        return summary
    if progress is None:
        show = None if len(summary.kernels) * len(row_counts) >= _PROGRESS_FROM else False
    else:
        show = progress
    start = time.perf_counter()
    for key in tqdm(list(summary.kernels), desc="gemmc.nn.prepare", unit="kernel", disable=_disabled(show)):
        if key.gate is not None:
            summary.built[key] = gto.prepare_gated(key.n, key.k, key.dtype, key.gate, row_counts)
        else:
            summary.built[key] = gto.prepare_linear(key.n, key.k, key.dtype, key.bias, key.activation, row_counts,
                                                    training=training)
    summary.seconds = time.perf_counter() - start
    return summary


def _disabled(show: bool | None) -> bool | None:
    """tqdm's `disable`: None lets tqdm hide the bar where stderr is not a terminal."""
    return None if show is None else not show


def _row_counts(batch_sizes: Iterable[int]) -> list[int]:
    if isinstance(batch_sizes, int):
        batch_sizes = [batch_sizes]
    counts = list(batch_sizes)
    if not counts or not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in counts):
        raise SpecError(f"gemmc.nn.prepare: batch_sizes must be a non-empty list of positive ints (rows per call, "
                        f"M = batch * seq_len for a prefill), got {batch_sizes!r}")
    return sorted(set(counts))
