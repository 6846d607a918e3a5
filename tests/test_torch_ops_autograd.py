"""The backward formulas of gemmc::linear and gemmc::gemm on the CPU (the torch reference runs each GEMM):
gradcheck and gradgradcheck in float64, bf16/f16 gradients against an fp32 reference within the stated bound
(gemmc.torch_ops.tolerance), which backward GEMMs run in which layouts, empty batches, and which path
(direct CUDA call, op, bias-only op + torch's activation) gto.linear takes with and without gradients."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import gemmc.torch_ops as gto
from gemmc.torch_ops import autograd as gto_autograd
from gemmc.torch_ops import functional, reference
from gemmc.torch_ops.tolerance import error_bound, rel_error

F64 = torch.float64
LINEAR = torch.ops.gemmc.linear.default
GEMM = torch.ops.gemmc.gemm.default
ACT = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
       "silu": F.silu}


def leaf(*shape, dtype=F64, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(dtype).requires_grad_()


def gemm_operands(m, n, k, a_layout, b_layout, dtype=F64):
    return (leaf(*((m, k) if a_layout == "mk" else (k, m)), dtype=dtype),
            leaf(*((n, k) if b_layout == "nk" else (k, n)), dtype=dtype))


def logical(a, b, a_layout, b_layout):
    return (a if a_layout == "mk" else a.T), (b.T if b_layout == "nk" else b)


# --- float64: the formulas ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", gto.ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_op_gradcheck(activation, bias):
    torch.manual_seed(0)
    x, w = leaf(2, 3, 16), leaf(8, 16)
    b = leaf(8) if bias else None
    args = (x, w, b) if bias else (x, w)
    assert torch.autograd.gradcheck(lambda *t: LINEAR(t[0], t[1], t[2] if bias else None, activation), args)
    assert torch.autograd.gradcheck(lambda *t: gto.linear(t[0], t[1], t[2] if bias else None, activation), args)


@pytest.mark.parametrize("activation", ["none", "gelu", "silu"])
def test_linear_op_gradgradcheck(activation):
    """Double backward works: the backward calls only differentiable ops (the gemmc ops and aten)."""
    torch.manual_seed(1)
    x, w, b = leaf(5, 8), leaf(8, 8), leaf(8)
    assert torch.autograd.gradgradcheck(lambda x, w, b: LINEAR(x, w, b, activation), (x, w, b))


@pytest.mark.parametrize("a_layout", ["mk", "km"])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_gemm_op_gradcheck_and_gradgradcheck(a_layout, b_layout):
    torch.manual_seed(2)
    a, b = gemm_operands(5, 6, 7, a_layout, b_layout)
    op = lambda a, b: GEMM(a, b, a_layout, b_layout)        # noqa: E731
    assert torch.autograd.gradcheck(op, (a, b))
    assert torch.autograd.gradgradcheck(op, (a, b))


# --- bf16 / f16 against the fp32 reference --------------------------------------------------------------------

def assert_within_bound(name, got, torch_low, ref32, dtype):
    err, torch_err = rel_error(got, ref32), rel_error(torch_low, ref32)
    assert got.dtype == dtype, name
    assert err <= error_bound(torch_err, dtype), f"{name}: err {err:.3g}, torch's {torch_err:.3g}"


@settings(max_examples=30)
@given(lead=st.sampled_from([(), (2,)]), m=st.integers(1, 9), n=st.sampled_from([8, 16, 40]),
       k=st.sampled_from([8, 24, 64]), bias=st.booleans(), activation=st.sampled_from(gto.ACTIVATIONS),
       fused=st.booleans(), dtype=st.sampled_from([torch.bfloat16, torch.float16]), seed=st.integers(0, 2 ** 16))
def test_linear_grads_within_bound_of_fp32_reference(lead, m, n, k, bias, activation, fused, dtype, seed):
    """Output, dX, dW and db of gto.linear (the training path) or of the fused op (whose backward recomputes
    z) against the fp32 reference of the same low-precision inputs, within 2 err(torch) + 2u."""
    torch.manual_seed(seed)
    x, w = leaf(*lead, m, k, dtype=dtype), leaf(n, k, dtype=dtype, scale=k ** -0.5)
    b = leaf(n, dtype=dtype) if bias else None
    grad = torch.randn(*lead, m, n).to(dtype)
    leaves = [t for t in (x, w, b) if t is not None]

    def run(fn, tensors):
        y = fn(*tensors)
        return [y.detach()] + list(torch.autograd.grad(y, tensors, grad.to(y.dtype)))

    def torch_fn(x, w, b=None):
        return ACT[activation](F.linear(x, w, b))

    def gemmc_fn(x, w, b=None):
        return (LINEAR if fused else gto.linear)(x, w, b, activation)

    got = run(gemmc_fn, leaves)
    low = run(torch_fn, leaves)
    ref = run(torch_fn, [t.detach().float().requires_grad_() for t in leaves])
    for name, g, t, r in zip(("y", "dx", "dw", "db"), got, low, ref):
        assert_within_bound(name, g, t, r, dtype)


@settings(max_examples=20)
@given(m=st.integers(1, 12), n=st.sampled_from([8, 16]), k=st.integers(1, 40), a_layout=st.sampled_from(["mk", "km"]),
       b_layout=st.sampled_from(["nk", "kn"]), seed=st.integers(0, 2 ** 16))
def test_gemm_grads_within_bound_of_fp32_reference(m, n, k, a_layout, b_layout, seed):
    torch.manual_seed(seed)
    dtype = torch.bfloat16
    a, b = gemm_operands(m, n, k, a_layout, b_layout, dtype=dtype)
    grad = torch.randn(m, n).to(dtype)

    def run(fn, a, b):
        c = fn(a, b)
        return [c.detach()] + list(torch.autograd.grad(c, (a, b), grad.to(c.dtype)))

    def torch_fn(a, b):
        a_mk, b_kn = logical(a, b, a_layout, b_layout)
        return a_mk @ b_kn

    got = run(lambda a, b: gto.gemm(a, b, a_layout, b_layout), a, b)
    low = run(torch_fn, a, b)
    ref = run(torch_fn, *(t.detach().float().requires_grad_() for t in (a, b)))
    for name, g, t, r in zip(("c", "da", "db"), got, low, ref):
        assert_within_bound(name, g, t, r, dtype)


def test_bound_catches_a_wrong_gradient():
    """The bound is tight enough to fail a gradient that is off by a transpose or a missing activation
    derivative."""
    torch.manual_seed(3)
    x, w = torch.randn(6, 16), torch.randn(16, 16) / 4
    z = x @ w.T
    dz = torch.randn(6, 16)
    right = dz @ w
    for wrong in (dz @ w.T, (dz * (z > 0)) @ w):
        assert rel_error(wrong.bfloat16(), right) > error_bound(rel_error(right.bfloat16(), right), torch.bfloat16)


# --- which backward GEMMs run -----------------------------------------------------------------------------------

def record_gemms(monkeypatch):
    calls = []
    real = gto_autograd.gemm

    def recorded(a, b, a_layout, b_layout):
        calls.append((tuple(a.shape), tuple(b.shape), a_layout, b_layout))
        return real(a, b, a_layout, b_layout)
    monkeypatch.setattr(gto_autograd, "gemm", recorded)
    return calls


def test_linear_backward_runs_dx_and_dw_as_gemmc_gemms_in_their_layouts(monkeypatch):
    calls = record_gemms(monkeypatch)
    x, w, b = leaf(2, 5, 16), leaf(8, 16), leaf(8)
    LINEAR(x, w, b, "relu").sum().backward()
    assert calls == [((10, 8), (8, 16), "mk", "kn"),        # dX = dZ @ W
                     ((10, 8), (10, 16), "km", "kn")]       # dW = dZ^T @ X, reduced over the 10 tokens
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape


def test_linear_backward_computes_only_the_gradients_needed(monkeypatch):
    calls = record_gemms(monkeypatch)
    x, w = leaf(4, 16), torch.randn(8, 16, dtype=F64)
    LINEAR(x, w, None, "gelu").sum().backward()
    assert [c[2:] for c in calls] == [("mk", "kn")]
    calls.clear()
    x, w = torch.randn(4, 16, dtype=F64), leaf(8, 16)
    LINEAR(x, w, None, "none").sum().backward()
    assert [c[2:] for c in calls] == [("km", "kn")]


def test_fused_gelu_backward_recomputes_z_with_the_bias_only_op(monkeypatch):
    acts = []
    real = gto_autograd.linear
    monkeypatch.setattr(gto_autograd, "linear", lambda x, w, b: acts.append(b is not None) or real(x, w, b))
    x, w, b = leaf(3, 8), leaf(8, 8), leaf(8)
    LINEAR(x, w, b, "gelu").sum().backward()
    LINEAR(x, w, b, "relu").sum().backward()               # relu's derivative needs only the output
    assert acts == [True]


def test_empty_batch_gives_empty_dx_and_zero_dw_db():
    x, w, b = leaf(0, 16), leaf(8, 16), leaf(8)
    y = gto.linear(x, w, b, "silu")
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 16) and not w.grad.any() and not b.grad.any()


# --- which path a call takes --------------------------------------------------------------------------------------

def test_eager_cuda_calls_skip_the_dispatcher_only_without_grad(monkeypatch):
    """Eager calls on plain CUDA tensors (stood in for by _direct) that need no gradient run the CUDA path
    directly; with gradients they go through the op, and gelu/silu then run the bias-only op."""
    direct, via_op = [], []
    monkeypatch.setattr(functional, "_direct", lambda t: True)
    monkeypatch.setattr(functional, "run_linear", lambda *a: direct.append(a[3]) or reference.linear(*a))
    real_op = functional._LINEAR
    monkeypatch.setattr(functional, "_LINEAR", lambda *a: via_op.append(a[3]) or real_op(*a))
    x, w = torch.randn(3, 16), torch.randn(8, 16, requires_grad=True)
    with torch.no_grad():
        gto.linear(x, w, None, "gelu")
    gto.linear(x, w.detach(), None, "silu")
    assert direct == ["gelu", "silu"] and via_op == []
    y = gto.linear(x, w, None, "gelu")
    gto.linear(x, w, None, "relu")
    assert via_op == ["none", "relu"] and y.grad_fn is not None
    torch.testing.assert_close(y, F.gelu(x @ w.T))


def test_direct_path_is_only_for_plain_cuda_tensors_outside_tracing():
    assert not functional._direct(torch.randn(2))
    with FakeTensorMode():
        assert not functional._direct(torch.empty(2, device="cuda"))      # a FakeTensor, under a dispatch mode
