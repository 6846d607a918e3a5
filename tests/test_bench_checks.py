"""The correctness check's numbers on the CPU: gemmc.reference's elementwise bound and the bench's
check_failure. Correct kernels are simulated (exact products summed in fp32 k-tile by k-tile, plus
accumulation noise, rounded to the output type), and so are the defects an audit found passing the
old check (relative Frobenius error < 1e-2): each must now fail, and each correct output must pass
with margin."""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from gemmc import reference as R
from gemmc.bench import timing
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

A, I, C, N = Ref.acc, Ref.input, Ref.const, Ref.node
U32 = 2.0 ** -24
OLD_TOLERANCE = 1e-2


@pytest.fixture(autouse=True)
def _two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)


def randn(rows, cols, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(dtype)


def kernel_acc(a, b, noise=0.5, k_tile=64, seed=1):
    """A correct kernel's f32 accumulator of a @ b.T: the k-tiles summed in order (not the reference's order),
    plus `noise` x sqrt(K) u_f32 |a| @ |b|.T of random sign, 2.5x what the truncating accumulators below reach."""
    a32, b32 = a.float(), b.float()
    acc = torch.zeros(a.shape[0], b.shape[0])
    for k0 in range(0, a.shape[1], k_tile):
        acc += a32[:, k0:k0 + k_tile] @ b32[:, k0:k0 + k_tile].T
    if noise:
        g = torch.Generator().manual_seed(seed)
        sign = torch.randint(0, 2, acc.shape, generator=g).float() * 2 - 1
        acc += sign * (noise * math.sqrt(a.shape[1]) * U32) * (a32.abs() @ b32.abs().T)
    return acc


def figures(out, a, b):
    r = timing.reference_with_bound(a, b, out.dtype)
    return R.error_figures(out, r.ref, r.bound)


# ---- the accumulation model ---------------------------------------------------------------------------

def _truncate(x, exp):
    ulp = torch.exp2(exp - 23)
    return torch.trunc(x / ulp) * ulp


@pytest.mark.parametrize("k", [256, 4096])
def test_truncating_accumulators_stay_well_under_the_accumulation_term(k):
    """Tensor cores need not round to nearest. Two pessimistic models, in float64: every MMA step (16 products)
    truncates the new sum to 24 bits; or the products and the accumulator are aligned to the largest exponent and
    each truncated before the sum. Both stay under a quarter of sqrt(K) u_f32 |a||b|, the kernel's share of E."""
    a, b = randn(32, k, torch.bfloat16, 0).double(), randn(32, k, torch.bfloat16, 1).double()
    exact, s = a @ b.T, a.abs() @ b.abs().T
    per_sum = torch.zeros_like(exact)
    aligned = torch.zeros_like(exact)
    for k0 in range(0, k, 16):
        prods = a[:, None, k0:k0 + 16] * b[None, :, k0:k0 + 16]
        new = per_sum + prods.sum(-1)
        per_sum = _truncate(new, torch.floor(torch.log2(new.abs().clamp_min(1e-300))))
        terms = torch.cat([aligned[..., None], prods], -1)
        e = torch.floor(torch.log2(terms.abs().amax(-1, keepdim=True).clamp_min(1e-300)))
        aligned = _truncate(_truncate(terms, e).sum(-1), e[..., 0])
    share = math.sqrt(k) * U32 * s
    assert ((per_sum - exact).abs() / share).max() < 0.25
    assert ((aligned - exact).abs() / share).max() < 0.25


def test_lipschitz_constants_cover_the_derivatives():
    x = torch.linspace(-30, 30, 600001, dtype=torch.float64, requires_grad=True)
    fns = {"gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": F.gelu, "silu": F.silu,
           "sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": torch.relu}
    for name, f in fns.items():
        (grad,) = torch.autograd.grad(f(x).sum(), x)
        assert grad.abs().max().item() <= R.LIPSCHITZ[name], name


# ---- plain GEMMs: correct outputs pass with margin -----------------------------------------------------

@pytest.mark.parametrize("k", [64, 1000, 4096, 12289])
@pytest.mark.parametrize("in_dtype, out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                                 (torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
def test_a_correct_gemm_passes_with_margin(k, in_dtype, out_dtype):
    a, b = randn(128, k, in_dtype, 0), randn(96, k, in_dtype, 1)
    out = kernel_acc(a, b).to(out_dtype)
    rel, elem = figures(out, a, b)
    assert elem < 0.6, (rel, elem)
    # cuBLAS's error on the same inputs: another correct accumulation order, no noise; it bounds gemmc's for
    # 16-bit outputs (timing.Checker), where both errors are mostly the output rounding
    cub_rel, cub_elem = figures(kernel_acc(a, b, noise=0, k_tile=256).to(out_dtype), a, b)
    assert cub_elem < 0.6
    assert timing.check_failure(rel, elem, OLD_TOLERANCE, cub_rel if out_dtype != torch.float32 else None) is None


def test_the_bound_scales_with_the_output_type():
    """Where |ref| >= sqrt(K): a bf16 output's bound is 2 u_bf16 |ref| and an accumulation term of a few % of it
    at K = 4096; an f16 output's 2 u_f16 |ref| (8x tighter) and one of up to 70% of it."""
    a, b = randn(64, 4096, torch.bfloat16, 0), randn(64, 4096, torch.bfloat16, 1)
    r16 = timing.reference_with_bound(a, b, torch.bfloat16)
    big = r16.ref.abs() > 64
    ratio = (r16.bound / r16.ref.abs())[big]
    assert 2 * 2 ** -8 < ratio.min() and ratio.max() < 2.2 * 2 ** -8
    rh = timing.reference_with_bound(a.half(), b.half(), torch.float16)
    ratio = (rh.bound / rh.ref.abs())[big]
    assert 2 * 2 ** -11 < ratio.min() and ratio.max() < 3.5 * 2 ** -11


# ---- the audit's defects: passed the old check, fail the new one ----------------------------------------

def _drop_k_tile(a, b):
    """2048x2048x8192 in bf16 with one K tile (64) missing from one of 128 output tiles, at 1/8 the size: 256x256
    in 32x16 tiles (128 of them), K = 8192."""
    out = kernel_acc(a, b)
    out[96:128, 80:96] -= a[96:128, 640:704].float() @ b[80:96, 640:704].float().T
    return out.to(torch.bfloat16)


def _drop_k_tail(a, b):
    """K = 12289 = 192 x 64 + 1: the 1-column K tail never accumulated."""
    return kernel_acc(a[:, :-1], b[:, :-1]).to(a.dtype)


def _via_bf16(a, b):
    """An f16 output rounded through bf16 on the way out."""
    return kernel_acc(a, b).to(torch.bfloat16).to(torch.float16)


@pytest.mark.parametrize("defect, m, n, k, dtype, seed", [
    (_drop_k_tile, 256, 256, 8192, torch.bfloat16, 0),
    (_drop_k_tail, 256, 256, 12289, torch.bfloat16, 1),    # (1 column of 256: seed 0's reads 0.0101)
    (_via_bf16, 128, 128, 4096, torch.float16, 0),
], ids=["dropped_k_tile", "dropped_k_tail", "f16_through_bf16"])
def test_the_audits_defects_fail_both_new_criteria(defect, m, n, k, dtype, seed):
    a, b = randn(m, k, dtype, 2 * seed), randn(n, k, dtype, 2 * seed + 1)
    rel, elem = figures(defect(a, b), a, b)
    cub_rel, _ = figures(kernel_acc(a, b, noise=0, k_tile=256).to(dtype), a, b)
    assert rel < OLD_TOLERANCE                                      # the old check passed it
    assert elem > 2                                                 # elementwise, on its own
    assert rel > timing.CUBLAS_FACTOR * cub_rel + timing.CUBLAS_SLACK   # against cuBLAS, on its own
    msg = timing.check_failure(rel, elem, OLD_TOLERANCE, cub_rel)
    assert msg.startswith(f"relative Frobenius error {rel:.3g} (limit ")
    assert f"{timing.CUBLAS_FACTOR:g} x cuBLAS's {cub_rel:.3g}" in msg and f"max elementwise error {elem:.3g}" in msg


def test_checked_error_is_the_gpu_tests_one_figure():
    """scripts/gpu_sm90.py, tests/test_gpu_sm90.py and the SM80 harness check with reference.checked_error:
    the relative Frobenius error where every element is within its bound, else inf (a dropped k-tile, an
    unwritten element), so that `< 1e-2` fails those too."""
    spec = GemmSpec(m="M", n="N", k="K")
    a, b = randn(256, 8192, torch.bfloat16, 0), randn(256, 8192, torch.bfloat16, 1)
    good = kernel_acc(a, b).to(torch.bfloat16)
    rel, elem = figures(good, a, b)
    assert elem <= 1 and R.checked_error(spec, good, a, b) == pytest.approx(rel)
    assert R.checked_error(spec, _drop_k_tile(a, b), a, b) == math.inf        # rel alone read < 1e-2
    unwritten = good.clone()
    unwritten[3, 5] = math.nan
    assert R.checked_error(spec, unwritten, a, b) == math.inf


def test_check_failure_reads_each_criterion():
    ok = timing.check_failure(0.0017, 0.5, 1e-2, 0.0017)
    assert ok is None
    assert "limit 0.0035: 2 x cuBLAS's 0.0017 + 0.0001, cap 0.01" in timing.check_failure(0.0094, 0.5, 1e-2, 0.0017)
    assert timing.check_failure(0.0017, 1.2, 1e-2, 0.0017) is not None          # elementwise alone
    assert timing.check_failure(0.02, 0.5, 1e-2, 0.05) is not None              # the cap stays
    assert timing.check_failure(0.005, 0.5, 1e-2) is None                       # no cuBLAS figure: the cap
    assert timing.check_failure(0.005, 0.5, 1e-2, math.nan) is None             # a broken cuBLAS figure: the cap
    assert "NaN: output elements left unwritten" in timing.check_failure(math.nan, math.nan, 1e-2, 0.001)


def test_unwritten_and_out_of_range_elements():
    a, b = randn(16, 64, torch.float16, 0), randn(8, 64, torch.float16, 1)
    r = timing.reference_with_bound(a, b)
    out = r.ref.half()
    assert R.error_figures(out, r.ref, r.bound)[1] < 0.6
    out[3, 4] = float("nan")
    assert all(math.isnan(x) for x in R.error_figures(out, r.ref, r.bound))
    # a reference beyond f16's range: the kernel's inf is right, a finite value is not
    ref = r.ref.clone()
    ref[0, 0] = 1e6
    out = ref.half()
    assert out[0, 0].item() == math.inf and R.error_figures(out, ref, r.bound)[1] < 0.6
    out[0, 0] = 60000.0
    assert R.error_figures(out, ref, r.bound)[1] > 1


# ---- epilogues --------------------------------------------------------------------------------------------

def kernel_epilogue(spec, acc, extra):
    """The epilogue as the backends emit it (gemmc/backends/common.py): f32 math, their formulas, not torch's."""
    vals = {}
    for inp, x in zip(spec.inputs, extra):
        vals[inp.name] = (x if inp.kind == "scalar" else
                          x.float().unsqueeze(-2) if inp.kind == "row" else
                          x.float().unsqueeze(-1) if inp.kind == "col" else x.float())
    nodes = []

    def get(r):
        return {"acc": lambda: acc, "input": lambda: vals.get(r.value), "const": lambda: float(r.value),
                "node": lambda: nodes[int(r.value)] if r.kind == "node" else None}[r.kind]()
    for op in spec.epilogue:
        x = get(op.args[0])
        y = get(op.args[1]) if len(op.args) > 1 else None
        f = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "div": lambda: x / y,
             "relu": lambda: torch.clamp_min(x, 0.0),
             "gelu_tanh": lambda: 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))),
             "gelu_erf": lambda: 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476)),
             "silu": lambda: x / (1.0 + torch.exp(-x)), "sigmoid": lambda: 1.0 / (1.0 + torch.exp(-x)),
             "tanh": lambda: torch.tanh(x),
             "clamp": lambda: torch.clamp(x, min=op.attr("min"), max=op.attr("max")),
             "cast": lambda: x.to({"bf16": torch.bfloat16, "f16": torch.float16,
                                   "f32": torch.float32}[str(op.attr("dtype"))]).float()}[op.op]
        nodes.append(f())
    return (nodes[-1] if nodes else acc).to({"bf16": torch.bfloat16, "f16": torch.float16,
                                             "f32": torch.float32}[str(spec.out_dtype)])


EPILOGUES = {
    "alpha_bias_gelu_tanh_res": dict(
        inputs=(EpilogueInput("alpha", "scalar"), EpilogueInput("bias", "row", "bf16"),
                EpilogueInput("res", "full", "bf16")),
        epilogue=(EpilogueOp("mul", (A(), I("alpha"))), EpilogueOp("add", (N(0), I("bias"))),
                  EpilogueOp("gelu_tanh", (N(1),)), EpilogueOp("add", (N(2), I("res"))))),
    "col_silu_clamp": dict(
        inputs=(EpilogueInput("scale", "col", "f32"),),
        epilogue=(EpilogueOp("mul", (A(), I("scale"))), EpilogueOp("silu", (N(0),)),
                  EpilogueOp("clamp", (N(1),), (("min", -2.0), ("max", 3.0))))),
    "acts_div_cast_f16": dict(
        inputs=(EpilogueInput("bias", "row", "f32"),),
        epilogue=(EpilogueOp("sub", (A(), I("bias"))), EpilogueOp("relu", (N(0),)), EpilogueOp("sigmoid", (A(),)),
                  EpilogueOp("add", (N(1), N(2))), EpilogueOp("tanh", (A(),)), EpilogueOp("gelu_erf", (N(4),)),
                  EpilogueOp("div", (N(3), C(2.0))), EpilogueOp("add", (N(6), N(5))),
                  EpilogueOp("cast", (N(7),), (("dtype", "f16"),)))),
    "scale_cast_bf16_bias": dict(
        inputs=(EpilogueInput("alpha", "scalar"), EpilogueInput("bias", "row", "f16")),
        epilogue=(EpilogueOp("mul", (A(), I("alpha"))), EpilogueOp("cast", (N(0),), (("dtype", "bf16"),)),
                  EpilogueOp("add", (N(1), I("bias"))))),
    "div_by_acc": dict(inputs=(EpilogueInput("res", "full", "f32"),),
                       epilogue=(EpilogueOp("div", (I("res"), A())),)),
}


@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("k", [96, 3000])
def test_a_correct_fused_epilogue_passes_with_margin(name, out_dtype, k):
    dtype = "f16" if name == "scale_cast_bf16_bias" else "bf16"
    spec = GemmSpec(m="M", n="N", k="K", dtype=dtype, out_dtype=out_dtype, **EPILOGUES[name])
    a, b, extra = R.make_inputs(spec, 80, 72, k, device="cpu", generator=torch.Generator().manual_seed(3))
    ref, bound = R.reference_and_bound(spec, a, b, extra)
    out = kernel_epilogue(spec, kernel_acc(a, b), extra)
    rel, elem = R.error_figures(out, ref, bound)
    assert elem < 0.6, (rel, elem)
    assert torch.isfinite(bound).float().mean() > 0.99   # unbounded only where a divisor may cross 0


def test_epilogue_defects_fail():
    spec = GemmSpec(m="M", n="N", k="K", dtype="f16", out_dtype="f16", **EPILOGUES["scale_cast_bf16_bias"])
    a, b, extra = R.make_inputs(spec, 96, 80, 2048, device="cpu", generator=torch.Generator().manual_seed(4))
    ref, bound = R.reference_and_bound(spec, a, b, extra)
    acc = kernel_acc(a, b)
    skip_cast = GemmSpec(m="M", n="N", k="K", dtype="f16", out_dtype="f16", inputs=spec.inputs,
                         epilogue=(spec.epilogue[0], EpilogueOp("add", (N(0), I("bias")))))
    rel, elem = R.error_figures(kernel_epilogue(skip_cast, acc, extra), ref, bound)
    assert rel < OLD_TOLERANCE and elem > 2          # the cast's bf16 rounding left out
    spec = GemmSpec(m="M", n="N", k="K", **EPILOGUES["alpha_bias_gelu_tanh_res"])
    a, b, extra = R.make_inputs(spec, 96, 80, 2048, device="cpu", generator=torch.Generator().manual_seed(5))
    ref, bound = R.reference_and_bound(spec, a, b, extra)
    shifted = [extra[0], torch.roll(extra[1], 1), extra[2]]    # one column's bias read from its neighbour
    out = kernel_epilogue(spec, kernel_acc(a, b), shifted)
    out[:, 1:] = kernel_epilogue(spec, kernel_acc(a, b), extra)[:, 1:]
    rel, elem = R.error_figures(out, ref, bound)
    assert rel < OLD_TOLERANCE and elem > 2


# ---- the reference under either precision API -----------------------------------------------------------

def test_reference_works_after_the_fp32_precision_api_was_used(fp32_precision_tf32):
    """Newer torch raises on reading allow_tf32 once the process set fp32_precision (the old reference did)."""
    cuda = fp32_precision_tf32
    a, b = randn(8, 16, torch.bfloat16, 0), randn(4, 16, torch.bfloat16, 1)
    seen = []
    with R.fp32_matmul():
        seen.append(cuda.fp32_precision)
    assert seen == ["ieee"] and cuda.fp32_precision == "tf32"    # set inside, restored after
    torch.testing.assert_close(timing.reference(a, b), a.double().matmul(b.double().T).float())
    spec = GemmSpec(m=8, n=4, k=16)
    torch.testing.assert_close(R.reference(spec, a, b, []), timing.reference(a, b))
    assert cuda.fp32_precision == "tf32"


def test_fp32_matmul_uses_allow_tf32_where_it_is_the_only_api(monkeypatch):
    legacy = SimpleNamespace(allow_tf32=True)
    monkeypatch.setattr(R, "_precision_switches", lambda: [(legacy, "allow_tf32")])
    with R.fp32_matmul():
        assert legacy.allow_tf32 is False
    assert legacy.allow_tf32 is True
    with pytest.raises(ValueError), R.fp32_matmul():
        raise ValueError
    assert legacy.allow_tf32 is True                 # restored when the body raises too


def test_reference_holds_scalars_as_f32_like_the_kernel():
    """Scalar-only subexpressions (relu(alpha), 1/alpha, alpha*alpha) evaluate as f32 tensors, as the kernel
    and torch do: no python-float crash, inf where f32 overflows, f32 rounding of alpha*alpha."""
    import torch
    from gemmc.reference import reference
    from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
    a, b = torch.randn(4, 8).bfloat16(), torch.randn(3, 8).bfloat16()
    acc = a.float() @ b.float().T
    for ops, alpha, want in [
        ((EpilogueOp("relu", (Ref.input("alpha"),)), EpilogueOp("mul", (Ref.acc(), Ref.node(0)))), -2.0, 0 * acc),
        ((EpilogueOp("div", (Ref.const(1.0), Ref.input("alpha"))), EpilogueOp("mul", (Ref.acc(), Ref.node(0)))),
         0.0, acc * torch.tensor(float("inf"))),
        ((EpilogueOp("mul", (Ref.input("alpha"), Ref.input("alpha"))), EpilogueOp("mul", (Ref.acc(), Ref.node(0)))),
         0.1, acc * (torch.tensor(0.1) * torch.tensor(0.1))),
    ]:
        spec = GemmSpec(m=4, n=3, k=8, out_dtype="f32",
                        inputs=(EpilogueInput("alpha", "scalar"),), epilogue=ops)
        got = reference(spec, a, b, [alpha])
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_rel_frobenius_compares_non_finite_values_where_the_reference_has_them():
    import torch
    from gemmc.reference import rel_frobenius
    ref = torch.tensor([1.0, float("inf"), float("nan"), 2.0])
    assert rel_frobenius(ref.clone(), ref) == 0.0                         # inf and NaN where the reference has them
    assert rel_frobenius(torch.tensor([1.0, -float("inf"), float("nan"), 2.0]), ref) == float("inf")   # wrong sign
    assert rel_frobenius(torch.tensor([1.0, float("inf"), 3.0, 2.0]), ref) == float("inf")  # a value where NaN is
    assert rel_frobenius(torch.tensor([float("nan"), float("inf"), float("nan"), 2.0]), ref) == float("inf")
    assert rel_frobenius(torch.tensor([1.5, float("inf"), float("nan"), 2.0]), ref) == pytest.approx(0.5 / 5 ** 0.5)
