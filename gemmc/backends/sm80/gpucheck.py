"""Running SM80 kernels on a GPU host for tests and scripts: build one for Hopper, make inputs, and the
fp32 torch reference of the spec (matmul of the upcast inputs, then the epilogue DAG in f32).

Nothing here runs at import time; torch and the DSL are imported inside the functions.
"""
from __future__ import annotations

from functools import lru_cache

from ...schedule import Schedule
from ...reference import checked_error, make_inputs  # noqa: F401  (make_inputs re-exported for tests/scripts)
from ...reference import reference as torch_reference  # noqa: F401  (re-exported for tests)
from ...spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

A, I, C, N = Ref.acc, Ref.input, Ref.const, Ref.node
S = lambda tile, **kw: Schedule(tile=tile, arch="sm_80", **kw)  # noqa: E731

EPI_BIAS_GELU_RES = dict(
    inputs=(EpilogueInput("bias", "row", "bf16"), EpilogueInput("res", "full", "bf16"), EpilogueInput("alpha", "scalar")),
    epilogue=(EpilogueOp("mul", (A(), I("alpha"))), EpilogueOp("add", (N(0), I("bias"))),
              EpilogueOp("gelu_tanh", (N(1),)), EpilogueOp("add", (N(2), I("res")))))
EPI_COL_SILU_CLAMP = dict(
    inputs=(EpilogueInput("scale", "col", "f32"),),
    epilogue=(EpilogueOp("mul", (A(), I("scale"))), EpilogueOp("silu", (N(0),)),
              EpilogueOp("clamp", (N(1),), (("min", -2.0), ("max", 3.0)))))
EPI_ACTS = dict(
    inputs=(EpilogueInput("bias", "row", "f32"),),
    epilogue=(EpilogueOp("sub", (A(), I("bias"))), EpilogueOp("relu", (N(0),)), EpilogueOp("sigmoid", (A(),)),
              EpilogueOp("add", (N(1), N(2))), EpilogueOp("tanh", (A(),)), EpilogueOp("gelu_erf", (N(4),)),
              EpilogueOp("div", (N(3), C(2.0))), EpilogueOp("add", (N(6), N(5))),
              EpilogueOp("cast", (N(7),), (("dtype", "f16"),))))

# name -> (spec kwargs, schedule); every layout, both dtypes, batch, each epilogue op, split-K, raster
CHECK_VARIANTS = {
    "tn_bf16": ({}, S((128, 128, 32))),
    "nn_bf16_256x128": (dict(a_layout="km", b_layout="kn"), S((256, 128, 32), raster="n", swizzle=4)),
    "tt_f16_64x128": (dict(dtype="f16", b_layout="kn"), S((64, 128, 64))),
    "nt_bf16_batched": (dict(a_layout="km", batch="L"), S((128, 64, 64), swizzle=8)),
    "tn_out_f32": (dict(out_dtype="f32"), S((128, 256, 32))),
    "tn_bias_gelu_res": (EPI_BIAS_GELU_RES, S((128, 128, 32))),
    "nn_col_silu_batched": (dict(a_layout="km", b_layout="kn", batch="L", **EPI_COL_SILU_CLAMP), S((128, 128, 32))),
    "tn_acts": (EPI_ACTS, S((64, 64, 32))),
    "tn_splitk3": ({}, S((128, 128, 32), split_k=3)),
    "tt_splitk2_epi_batched": (dict(b_layout="kn", batch="L", **EPI_BIAS_GELU_RES), S((128, 128, 64), split_k=2)),
}


@lru_cache(maxsize=None)
def hopper_launcher(spec: GemmSpec, schedule: Schedule):
    """(plan, emitted kernel, runtime Launcher) of the SM80 kernel for `spec`, compiled for sm_90a in
    this process. Symbolic dims: one build serves every shape."""
    from ...build import jit_callable
    from ...compiler import lower
    from .emit import emit
    _, plan = lower(spec, schedule.with_(arch="sm_80"))
    emitted = emit(plan, compile_arch="sm_90a")
    return plan, emitted, jit_callable(emitted)


def run_checked(spec: GemmSpec, launcher, m: int, n: int, k: int, batch: int, device, seed: int = 0) -> float:
    """Launch into a NaN-filled output and return gemmc.reference.checked_error: the relative Frobenius error
    against the reference, inf where an element is unwritten or beyond its elementwise bound."""
    import torch
    from ...types import torch_dtype
    gen = torch.Generator(device=device).manual_seed(seed)
    a, b, extra = make_inputs(spec, m, n, k, batch, device, gen)
    lead = (batch,) if spec.batch is not None else ()
    out = torch.full(lead + (m, n), float("nan"), device=device, dtype=torch_dtype(spec.out_dtype))
    launcher(a, b, *extra, out=out)
    if out.is_cuda:
        torch.cuda.synchronize()
    return checked_error(spec, out, a, b, extra)
