"""SM80 kernels (built for sm_90a) at the edges tests/test_gpu_sm80.py does not reach: epilogue inputs named
like the kernel's own locals, and K that is no multiple of 8 (possible when neither A nor B is K-major).

Run on a GPU host: python -m pytest tests/test_sm80_gpu_edges.py -m gpu -q
"""
from __future__ import annotations

import pytest

from gemmc.schedule import Schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

A, I, N = Ref.acc, Ref.input, Ref.node


def _check(spec: GemmSpec, schedule: Schedule, shapes):
    import torch
    from gemmc.backends.sm80.gpucheck import hopper_launcher, run_checked
    launcher = hopper_launcher(spec, schedule)[2]
    for m, n, k, batch in shapes:
        err = run_checked(spec, launcher, m, n, k, batch, torch.device("cuda"), seed=m + n + k)
        assert err < 1e-2, f"{schedule.short()} M={m} N={n} K={k} L={batch}: rel. Frobenius error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2])
def test_inputs_named_like_kernel_locals(split_k):
    """A scale `s` (the prologue's loop variable: the kernel scaled by STAGES - 2), a column vector `m`
    and a row vector `l` (the element's row and batch index) reach the epilogue."""
    spec = GemmSpec(batch="L", inputs=(EpilogueInput("s", "scalar"), EpilogueInput("m", "col", "f32"),
                                       EpilogueInput("l", "row", "bf16")),
                    epilogue=(EpilogueOp("mul", (A(), I("s"))), EpilogueOp("add", (N(0), I("m"))),
                              EpilogueOp("add", (N(1), I("l")))))
    _check(spec, Schedule(tile=(128, 128, 32), stages=5, split_k=split_k, arch="sm_80"),
           [(200, 136, 96, 2), (64, 64, 64, 1)])


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 3])
def test_k_not_a_multiple_of_8_with_m_and_n_major_operands(split_k):
    """A K x M and B K x N: K is contiguous in neither, so any K is legal; the first k-tile's residue is
    predicated per K row (K = 1, 33, 100, 257 against a 32- or 64-wide K tile)."""
    spec = GemmSpec(a_layout="km", b_layout="kn")
    for tile in ((128, 128, 32), (64, 128, 64)):
        _check(spec, Schedule(tile=tile, split_k=split_k, arch="sm_80"),
               [(136, 72, 1, 1), (64, 200, 33, 1), (8, 8, 100, 1), (264, 136, 257, 1)])
