"""fp8 SM90 kernels on the GPU (`-m gpu`, H100/H200): every variant of scripts/gpu_fp8.py (per tensor, per row,
per block; e4m3 x e4m3 and e4m3 x e5m2; cooperative, ping-pong, clusters, split-K fix-up and reduce kernel,
stream-K, swapped decode kernels; epilogues) against the fp32 product of the dequantized inputs, output
NaN-filled first, relative Frobenius error < 1e-2 and every element within gemmc.reference's bound; the DSL's
`gemmc.scaled` kernels through `auto`; errors against torch._scaled_mm's on the same inputs."""
from __future__ import annotations

import pytest
from script_support import load_script

import gemmc   # module-level: the DSL evaluates a kernel's (string) annotations in this module's globals

script = load_script("gpu_fp8")

pytestmark = pytest.mark.gpu

_KERNELS: dict = {}


def kernels(name: str):
    """[(spec, launcher)] of a named variant, one per (N, K) of the check shapes under block scaling."""
    if name not in _KERNELS:
        from gemmc import build
        from gemmc.schedule import is_valid
        nks = [("N", "K")]
        if script.static_nk(name):
            nks = [nk for nk in sorted({(n, k) for _, n, k in script.CHECK_SHAPES})
                   if is_valid(script.VARIANTS[name][3], script.make_spec(name, *nk))]
        _KERNELS[name] = [(spec, build.jit_callable(emitted))
                          for spec, emitted in (script.emitted_for(name, n, k) for n, k in nks)]
    return _KERNELS[name]


@pytest.mark.parametrize("name", list(script.VARIANTS))
def test_variant_matches_the_dequantized_fp32_reference(name):
    import torch
    results = []
    for spec, fn in kernels(name):
        results += script.check(name, fn, spec, script.CHECK_SHAPES, torch.device("cuda"), lambda s: None)
    assert results and not [r for r in results if not r["ok"]], results
    # per tensor and per row without an epilogue: within 2x torch._scaled_mm's error (+ the bf16 output's)
    for r in results:
        if r["scaled_mm_rel_err"] is not None:
            assert r["rel_err"] <= 2 * r["scaled_mm_rel_err"] + 4e-3, r


T, f8, e5, f32, bf16 = gemmc.Tensor, gemmc.f8e4m3, gemmc.f8e5m2, gemmc.f32, gemmc.bf16


@gemmc.kernel
def linear_row(x: T[("M", 1024), f8], w: T[(768, 1024), f8], sx: T[("M",), f32], sw: T[(768,), f32],
               bias: T[(768,), bf16]):
    return gemmc.gelu(gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T + bias, approximate="tanh")


@gemmc.kernel
def linear_tensor(x: T[("M", 1024), f8], w: T[(768, 1024), e5], sx: T[(), f32], sw: T[(), f32]):
    return (gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T).to(gemmc.f32)


@gemmc.kernel
def linear_block(x: T[("M", 1536), f8], w: T[(7168, 1536), f8], sx: T[("M", 12), f32], sw: T[(56, 12), f32]):
    return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T


@pytest.mark.parametrize("kern", [linear_row, linear_tensor, linear_block], ids=lambda k: k.spec.name)
@pytest.mark.parametrize("m", [1, 16, 100, 2048])
def test_dsl_kernels_run_through_auto(kern, m):
    import torch
    from gemmc.reference import checked_error, make_inputs
    spec = kern.spec
    a, b, extra = make_inputs(spec, m, spec.n, spec.k, device="cuda", generator=torch.Generator("cuda").manual_seed(m))
    if spec.scaling.mode == "tensor":
        extra[:2] = [s.reshape(()) for s in extra[:2]]        # 0-D scales, as declared
    out = kern(a, b, *extra)
    torch.cuda.synchronize()
    assert checked_error(spec, out, a, b, [s.reshape(-1) if s.dim() == 0 else s for s in extra]) < 1e-2
