"""The fp8 reference and its bound on the CPU: quantize/dequantize per scaling, fp8 inputs with realistic scales,
the fp32 reference of the dequantized operands, and a bound that passes a simulated Hopper kernel (fp8 products
summed at reduced precision between promotions, scaled, rounded to bf16) and fails a wrong one."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gemmc import GemmSpec, Scaling
from gemmc.quantize import dequantize, quantize
from gemmc.reference import FP8_ACCUMULATION_U, error_figures, make_inputs, reference, reference_and_bound
from gemmc.spec import EpilogueInput, EpilogueOp, Ref, scale_shapes


def fp8(mode, m, n, k, b_dtype="f8e4m3", **kw) -> GemmSpec:
    return GemmSpec(m=m, n=n, k=k, dtype="f8e4m3", b_dtype=b_dtype, scaling=Scaling(mode, "sx", "sw"), **kw)


@given(rows=st.integers(1, 300), cols=st.integers(1, 400), mode=st.sampled_from(["tensor", "row", "block"]),
       weight=st.booleans(), dtype=st.sampled_from(["f8e4m3", "f8e5m2"]))
@settings(max_examples=40, deadline=None)
def test_quantize_round_trips_within_fp8_rounding(rows, cols, mode, weight, dtype):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols)) * 3
    q, s = quantize(x, mode, dtype, weight=weight)
    kb, rb = -(-cols // 128), -(-rows // 128)
    want = {"tensor": (1,), "row": (rows,), "block": ((rb, kb) if weight else (rows, kb))}[mode]
    assert tuple(s.shape) == want and s.dtype == torch.float32 and bool((s > 0).all())
    top = torch.finfo(q.dtype).max
    assert float(q.float().abs().max()) <= top
    # each group's largest |x| maps onto the fp8 maximum; every value within half an fp8 ulp of itself
    u = torch.finfo(q.dtype).eps / 2
    back = dequantize(q, s)
    assert torch.all((back - x).abs() <= u * x.abs() * 1.0001 + 1e-30 + _subnormal(q.dtype) * _scale_of(s, back))


def _subnormal(dtype) -> float:
    fi = torch.finfo(dtype)
    return fi.smallest_normal * fi.eps


def _scale_of(s, like):
    return s.max()      # an upper bound on every group's scale: subnormal spacing times it


def test_dequantize_refuses_a_scale_of_no_scaling():
    with pytest.raises(ValueError, match="fits no scaling of a 4 x 256 operand; use \\(1,\\), \\(4,\\)"):
        dequantize(torch.zeros(4, 256, dtype=torch.float8_e4m3fn), torch.ones(3))


@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
def test_make_inputs_quantizes_with_the_scalings_scales(mode):
    spec = fp8(mode, "M", 384, 512, b_dtype="f8e5m2", inputs=(EpilogueInput("bias", "row", "bf16"),),
               epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))
    a, b, extra = make_inputs(spec, 64, 384, 512, device="cpu", generator=torch.Generator().manual_seed(0))
    assert (a.dtype, b.dtype) == (torch.float8_e4m3fn, torch.float8_e5m2)
    sa, sb, bias = extra
    assert (tuple(sa.shape), tuple(sb.shape)) == scale_shapes(mode, 64, 384, 512)
    assert bias.shape == (384,)
    if mode != "tensor":            # magnitudes spread: the scales differ
        assert float(sa.max() / sa.min()) > 4


def simulated_kernel(spec: GemmSpec, a, b, sa, sb, chunk: int = 32, keep_bits: int = 14):
    """What a Hopper fp8 kernel computes: exact fp8 products summed per MMA K step of `chunk`, the running sum
    truncated to `keep_bits` mantissa bits (fast accumulation); per tensor / row the scales multiply the sum,
    per block each 128-block's sum is promoted into an f32 sum times its scales; rounded to the output type."""
    af, bf = a.double(), b.double()
    m, k = af.shape
    n = bf.shape[0]
    block = spec.scaling.mode == "block"
    span = 128 if block else k

    def truncate(x):
        mant, exp = torch.frexp(x)
        scale = 2.0 ** keep_bits
        return torch.ldexp(torch.trunc(mant * scale) / scale, exp)

    total = torch.zeros(m, n, dtype=torch.float64)
    for start in range(0, k, span):
        running = torch.zeros(m, n, dtype=torch.float64)
        for c in range(start, min(start + span, k), chunk):
            running = truncate(running + af[:, c:c + chunk] @ bf[:, c:c + chunk].T)
        if block:
            kb = start // 128
            factor = sa[:, kb:kb + 1].double() * sb[:, kb].double().repeat_interleave(128)[:n][None, :]
            total = (total + running * factor).float().double()
        else:
            total = running
    if spec.scaling.mode == "row":
        total = total * sa.double()[:, None] * sb.double()[None, :]
    elif spec.scaling.mode == "tensor":
        total = total * sa.double() * sb.double()
    return total.float().to(torch.bfloat16)


@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
@pytest.mark.parametrize("m,n,k", [(64, 256, 1024), (33, 130, 4096)])
def test_the_bound_passes_a_simulated_fp8_kernel_and_fails_a_wrong_one(mode, m, n, k):
    spec = fp8(mode, m, n, k)
    a, b, extra = make_inputs(spec, m, n, k, device="cpu", generator=torch.Generator().manual_seed(k))
    ref, bound = reference_and_bound(spec, a, b, extra)
    out = simulated_kernel(spec, a, b, *extra)
    rel, elem = error_figures(out, ref, bound)
    assert elem <= 1 and rel < 1e-2
    # the same kernel with the rounding of a 6-bit-mantissa accumulator fails, as does one missing a k-tile (the
    # 128-column block of A that weighs most: the inputs' blocks differ by up to 2^7 in magnitude)
    worse = simulated_kernel(spec, a, b, *extra, keep_bits=6)
    assert error_figures(worse, ref, bound)[1] > 1
    weight = dequantize(a, extra[0]).abs().reshape(m, -1, 128).sum(dim=(0, 2))
    heavy = int(weight.argmax())
    a_drop = a.clone()
    a_drop[:, 128 * heavy:128 * (heavy + 1)] = 0
    dropped = simulated_kernel(spec, a_drop, b, *extra)
    assert error_figures(dropped, ref, bound)[1] > 1


def test_reference_is_the_product_of_the_dequantized_operands():
    spec = fp8("block", 16, 256, 384)
    a, b, extra = make_inputs(spec, 16, 256, 384, device="cpu", generator=torch.Generator().manual_seed(1))
    want = dequantize(a, extra[0]).double() @ dequantize(b, extra[1]).double().T
    assert torch.allclose(reference(spec, a, b, extra).double(), want, rtol=1e-5, atol=1e-5)
    assert FP8_ACCUMULATION_U == 2.0 ** -13 and math.isclose(FP8_ACCUMULATION_U * 8192, 1.0)


@pytest.mark.parametrize("mode", ["row", "block"])
def test_the_bound_leaves_room_over_a_simulated_kernel(mode):
    """The simulated kernel's worst element stays well inside the bound (a GPU's truncation differs in detail)."""
    spec = fp8(mode, 128, 256, 8192)
    a, b, extra = make_inputs(spec, 128, 256, 8192, device="cpu", generator=torch.Generator().manual_seed(3))
    ref, bound = reference_and_bound(spec, a, b, extra)
    assert error_figures(simulated_kernel(spec, a, b, *extra), ref, bound)[1] < 0.5
