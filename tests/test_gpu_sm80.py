"""SM80 kernels on the H200 (compiled for sm_90a: the same mma.sync/cp.async/ldmatrix code), checked
against an fp32 torch reference of the upcast inputs, output NaN-filled first, rel. Frobenius < 1e-2.

Run on a GPU host: python -m pytest tests/test_gpu_sm80.py -m gpu -q
Each variant compiles once (symbolic M, N, K, L); hypothesis draws the shapes and the variant.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gemmc.spec import GemmSpec

from gemmc.backends.sm80.gpucheck import CHECK_VARIANTS as VARIANTS


def _spec(name: str) -> GemmSpec:
    return GemmSpec(**VARIANTS[name][0])


def _launcher(name: str):
    from gemmc.backends.sm80.gpucheck import hopper_launcher
    return hopper_launcher(_spec(name), VARIANTS[name][1])[2]


@st.composite
def problems(draw):
    name = draw(st.sampled_from(sorted(VARIANTS)))
    spec = _spec(name)
    m = draw(st.one_of(st.integers(1, 300), st.sampled_from([1, 7, 128, 129, 1000, 2048])))
    n = 8 * draw(st.one_of(st.integers(1, 64), st.sampled_from([16, 17, 128, 384])))
    k = 8 * draw(st.one_of(st.integers(1, 96), st.sampled_from([1, 4, 5, 64, 512])))
    if spec.a_layout == "km":
        m = 8 * max(1, (m + 7) // 8)          # M is A's contiguous dim: 16-byte aligned
    batch = draw(st.integers(1, 3)) if spec.batch is not None else 1
    return name, m, n, k, batch


@pytest.mark.gpu
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(problems())
def test_sm80_kernel_matches_fp32_reference(problem):
    import torch
    from gemmc.backends.sm80.gpucheck import run_checked
    name, m, n, k, batch = problem
    err = run_checked(_spec(name), _launcher(name), m, n, k, batch, torch.device("cuda"))
    assert err < 1e-2, f"{name} M={m} N={n} K={k} L={batch}: rel. Frobenius error {err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_sm80_variant_on_tile_edges(name):
    """Every variant at shapes that are and are not tile multiples, including K smaller than one k-tile."""
    import torch
    from gemmc.backends.sm80.gpucheck import run_checked
    spec = _spec(name)
    for m, n, k in [(256, 256, 256), (129, 136, 72), (8, 8, 8), (1000, 264, 1032)]:
        if spec.a_layout == "km":
            m = 8 * ((m + 7) // 8)             # M is A's contiguous dim: 16-byte aligned
        batch = 2 if spec.batch is not None else 1
        err = run_checked(spec, _launcher(name), m, n, k, batch, torch.device("cuda"), seed=m + n + k)
        assert err < 1e-2, f"{name} M={m} N={n} K={k}: rel. Frobenius error {err:.3g}"
