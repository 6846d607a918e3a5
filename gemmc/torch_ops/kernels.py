"""The process-wide registry of the gemmc kernels the torch ops launch, and `prepare_linear`.

Each key compiles once (`gemmc.compile(spec, schedule="auto")`, thread-safe) and every caller shares the
result: gemmc.nn's layers, the ops' forward and their backward GEMMs. The token dim is symbolic, so one
kernel serves every batch size:
  linear kernels: act(x @ weight.T + bias), M (rows of x) symbolic; `auto` picks a schedule per M bucket.
  gemm kernels:   an "mk" A ([M, K]) has M symbolic and K static; a "km" A ([K, M], e.g. the dZ of a weight
                  gradient, reduced over tokens) has K symbolic and M static. N is static.
  gated kernels:  gate(x @ weight[:N].T) * (x @ weight[N:].T) over a [gate; up] weight [2N, K], M symbolic.
Compiling (IR and passes) runs on the CPU; the .so of each M bucket is built on its first call, or ahead
of time by `prepare_linear` (CompiledGemm.prepare).
"""
from __future__ import annotations

import threading
from typing import Iterable

from ..errors import SpecError
from ..spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
from ..types import INPUT_DTYPES, as_arch, as_dtype
from .activations import ACTIVATIONS, EPILOGUE_OP, GATES, NEEDS_PREACTIVATION

# The call path's lookups (arch=None keys only), filled on a miss by linear_kernel / gemm_kernel:
# (n, k, dtype as given, has_bias, activation) -> kernel, and (a_layout, b_layout, dtype as given, a_cols, n).
LINEAR_KERNELS: dict[tuple, object] = {}
GEMM_KERNELS: dict[tuple, object] = {}
GATED_KERNELS: dict[tuple, object] = {}      # (n, k, dtype as given, gate) -> kernel

_LOCK = threading.Lock()
_COMPILED: dict[tuple, "_Slot"] = {}     # (GemmSpec, arch) -> its one compile


class _Slot:
    """One compile of one (spec, arch): the first caller compiles, concurrent callers wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.kernel = None


def _compile(spec: GemmSpec, arch: str):
    from ..compiler import compile as gemmc_compile     # loads xDSL: only on a registry miss
    return gemmc_compile(spec, schedule="auto", arch=arch)


def compiled(spec: GemmSpec, arch: str):
    """The shared `auto` compile of `spec` for `arch` (compiled on the first request)."""
    key = (spec, arch)
    with _LOCK:
        slot = _COMPILED.get(key)
        if slot is None:
            slot = _COMPILED[key] = _Slot()
    with slot.lock:
        if slot.kernel is None:
            slot.kernel = _compile(spec, arch)
    return slot.kernel


def default_arch() -> str:
    """The arch of the visible GPU (sm_90a for compute capability 9.x, sm_80 for 8.x), else sm_90a."""
    from ..runtime import visible_arch
    return visible_arch() or "sm_90a"


def _input_dtype(dtype, what: str):
    d = as_dtype(dtype, INPUT_DTYPES)
    if d not in INPUT_DTYPES:
        raise SpecError(f"{what}: gemmc kernels take bf16 or f16 operands, got {d}; convert the tensors "
                        "(e.g. .to(torch.bfloat16)) or run torch's op")
    return d


def _positive(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"{what} must be a positive int, got {v!r}")
    return v


def linear_spec(n: int, k: int, dtype, has_bias: bool, activation: str) -> GemmSpec:
    """act(x @ weight.T + bias) with M symbolic, weight [n, k] (an nn.Linear weight), bias [n]."""
    if activation not in ACTIVATIONS:
        raise SpecError(f"activation {activation!r} is not one of {ACTIVATIONS}; pass one of those, or apply "
                        "your activation to the output")
    d = _input_dtype(dtype, "linear kernel")
    n, k = _positive(n, "linear kernel: N (out_features)"), _positive(k, "linear kernel: K (in_features)")
    inputs, ops, last = (), [], Ref.acc()
    if has_bias:
        inputs = (EpilogueInput("bias", "row", d),)
        ops.append(EpilogueOp("add", (last, Ref.input("bias"))))
        last = Ref.node(0)
    if EPILOGUE_OP[activation] is not None:
        ops.append(EpilogueOp(EPILOGUE_OP[activation], (last,)))
    name = "linear" + ("_bias" if has_bias else "") + ("" if activation == "none" else f"_{activation}")
    return GemmSpec(m="M", n=n, k=k, dtype=d, a_layout="mk", b_layout="nk", inputs=inputs, epilogue=tuple(ops),
                    name=name)


def gemm_spec(a_layout: str, b_layout: str, a_cols: int, n: int, dtype) -> GemmSpec:
    """A plain GEMM in gemmc's storage layouts (gemmc/spec.py). `a_cols` is A's second storage dim: K for an
    "mk" A (M symbolic), M for a "km" A (K symbolic)."""
    d = _input_dtype(dtype, "gemm kernel")
    a_cols, n = _positive(a_cols, "gemm kernel: A's second dim"), _positive(n, "gemm kernel: N")
    if a_layout not in ("mk", "km"):
        raise SpecError(f"a_layout={a_layout!r}; use 'mk' (A is M x K) or 'km' (A is K x M)")
    m, k = ("M", a_cols) if a_layout == "mk" else (a_cols, "K")
    return GemmSpec(m=m, n=n, k=k, dtype=d, a_layout=a_layout, b_layout=b_layout, name=f"gemm_{a_layout}_{b_layout}")


def gated_spec(n: int, k: int, dtype, gate: str) -> GemmSpec:
    """gate(x @ weight[:n].T) * (x @ weight[n:].T) with M symbolic: weight [2n, k] is [gate; up]."""
    if gate not in GATES:
        raise SpecError(f"gate {gate!r} is not one of {GATES}; pass one of those, or run the [gate; up] Linear "
                        "and gate its output yourself")
    d = _input_dtype(dtype, "gated kernel")
    n, k = _positive(n, "gated kernel: N (outputs, half the weight's rows)"), _positive(k, "gated kernel: K")
    return GemmSpec(m="M", n=n, k=k, dtype=d, a_layout="mk", b_layout="nk", gate=EPILOGUE_OP[gate],
                    name=f"gated_{gate}")


def gated_kernel(n: int, k: int, dtype, gate: str, arch=None):
    """The shared gemmc kernel of a gated Linear (see gated_spec), called k(x2d, weight) -> [M, n]."""
    fast = arch is None
    key = (n, k, dtype, gate)
    kern = GATED_KERNELS.get(key) if fast else None
    if kern is None:
        kern = compiled(gated_spec(n, k, dtype, gate), _arch(arch))
        if fast:
            GATED_KERNELS[key] = kern
    return kern


def _arch(arch) -> str:
    return default_arch() if arch is None else as_arch(arch)


def registered(registry: dict, key: tuple, make_spec, arch=None):
    """The kernel of `make_spec()` for `arch`: for the visible GPU's arch (arch None), the one `registry` holds
    under `key` (compiled and stored on a miss); for a named arch, compiled (shared through `compiled`)."""
    kern = registry.get(key) if arch is None else None
    if kern is None:
        kern = compiled(make_spec(), _arch(arch))
        if arch is None:
            registry[key] = kern
    return kern


def linear_kernel(n: int, k: int, dtype, has_bias: bool, activation: str, arch=None):
    """The shared gemmc kernel of act(x @ weight.T + bias) for weight [n, k] of `dtype` (a torch dtype or a
    gemmc name), M symbolic: a CompiledGemm, called as k(x2d, weight, bias) or k(x2d, weight) (no bias).
    A plain one (no bias, activation "none") is the "mk"/"nk" gemm kernel, which may run torch.matmul at
    M buckets where cuBLAS measured faster. One compile per (n, k, dtype, has_bias, activation, arch)."""
    fast = arch is None
    key = (n, k, dtype, has_bias, activation)
    kern = LINEAR_KERNELS.get(key) if fast else None
    if kern is None:
        has_bias = bool(has_bias)
        if not has_bias and activation == "none":
            kern = gemm_kernel("mk", "nk", k, n, dtype, arch)
        else:
            kern = compiled(linear_spec(n, k, dtype, has_bias, activation), _arch(arch))
        if fast:
            LINEAR_KERNELS[key] = kern
    return kern


def gemm_kernel(a_layout: str, b_layout: str, a_cols: int, n: int, dtype, arch=None):
    """The shared plain gemmc kernel for these layouts (see gemm_spec for `a_cols`), called k(a, b)."""
    fast = arch is None
    key = (a_layout, b_layout, dtype, a_cols, n)
    kern = GEMM_KERNELS.get(key) if fast else None
    if kern is None:
        kern = compiled(gemm_spec(a_layout, b_layout, a_cols, n, dtype), _arch(arch))
        if fast:
            GEMM_KERNELS[key] = kern
    return kern


def forward_activation(activation: str, training: bool) -> str:
    """The activation the forward kernel fuses: with gradients needed, gelu / gelu_tanh / silu run the bias-only
    kernel and torch's activation (gemmc.torch_ops.linear saves z for the backward)."""
    return "none" if training and activation in NEEDS_PREACTIVATION else activation


def prepare_linear(n: int, k: int, dtype, has_bias: bool, activation: str, ms: Iterable[int], *,
                   training: bool = False) -> list:
    """Build (and, where a GPU is visible, load) every kernel `gemmc.torch_ops.linear` runs for weight
    [n, k] at each row count in `ms`, so a later CUDA-graph capture builds and loads nothing:
    training=False: the forward under no_grad (the fused kernel);
    training=True: the forward with gradients (see forward_activation) and the backward's dX = dZ @ W
    (at each M) and dW = dZ^T @ X (K = tokens is symbolic: one kernel for every M).
    Returns [(kernel, [(M, what runs it)])] as CompiledGemm.prepare reports it."""
    ms = list(ms)
    if not ms or not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in ms):
        raise SpecError(f"prepare_linear: ms must be a non-empty list of positive ints (rows per call), got {ms!r}")
    plan = [(linear_kernel(n, k, dtype, has_bias, forward_activation(activation, training)), ms)]
    if training:
        plan.append((gemm_kernel("mk", "kn", n, k, dtype), ms))      # dX [M, K] = dZ [M, N] @ W [N, K]
        plan.append((gemm_kernel("km", "kn", n, k, dtype), [n]))     # dW [N, K] = dZ^T @ X: static M = N
    done = []
    for kern, rows in plan:
        prepare = getattr(kern, "prepare", None)     # a CublasOnlyGemm has nothing to build
        done.append((kern, prepare(rows) if prepare is not None else [(m, "torch.matmul") for m in rows]))
    return done


def prepare_gated(n: int, k: int, dtype, gate: str, ms: Iterable[int]) -> list:
    """Build (and, where a GPU is visible, load) the gated kernel (gated_kernel) at each row count in `ms`, as
    prepare_linear does for a Linear. Returns [(kernel, [(M, what runs it)])]."""
    ms = list(ms)
    if not ms or not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in ms):
        raise SpecError(f"prepare_gated: ms must be a non-empty list of positive ints (rows per call), got {ms!r}")
    kern = gated_kernel(n, k, dtype, gate)
    return [(kern, kern.prepare(ms))]
