"""gemmc.torch_ops on a GPU: gemmc kernels' outputs and gradients against fp32 torch within the stated bound
(gemmc.torch_ops.tolerance), the ops' errors on CUDA tensors, prepare_linear, and torch.compile (default and
reduce-overhead, dynamic) of a small module of gemmc ops. Few distinct shapes: each compiles and builds kernels."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

import gemmc.torch_ops as gto
from gemmc.errors import LaunchError
from gemmc.torch_ops.tolerance import error_bound, rel_error

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
LINEAR = torch.ops.gemmc.linear.default
ACT = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
       "silu": F.silu}
SHAPES = [(64, 128), (192, 256)]        # (N, K): multiples of 8, one small enough for split-K dW kernels
ROWS = [1, 37, 300]                     # M (tokens): three M buckets


def randn(*shape, dtype=BF16, scale=1.0, grad=False):
    t = (torch.randn(*shape, device="cuda") * scale).to(dtype)
    return t.requires_grad_() if grad else t


def poison_allocator(numel, dtype=BF16):
    """NaN-fill a freed block the caching allocator will likely hand out next (an output gemmc allocates);
    calls with an out= buffer (test_registry_kernel_writes_every_element_of_out) are exact."""
    block = torch.full((numel,), float("nan"), dtype=dtype, device="cuda")
    del block


def assert_within_bound(name, got, torch_low, ref32, dtype=BF16):
    err, torch_err = rel_error(got, ref32), rel_error(torch_low, ref32)
    assert got.dtype == dtype, name
    assert err <= error_bound(torch_err, dtype), f"{name}: err {err:.3g}, torch's {torch_err:.3g}"


@settings(max_examples=8, deadline=None)
@given(shape=st.sampled_from(SHAPES), m=st.sampled_from(ROWS), bias=st.booleans(),
       activation=st.sampled_from(gto.ACTIVATIONS), lead=st.sampled_from([(), (2,)]))
def test_forward_matches_fp32_within_bound(shape, m, bias, activation, lead):
    n, k = shape
    torch.manual_seed(m + n)
    x, w = randn(*lead, m, k), randn(n, k, scale=k ** -0.5)
    b = randn(n) if bias else None
    poison_allocator(x[..., :1].numel() * n)
    with torch.no_grad():
        got = gto.linear(x, w, b, activation)
        via_op = LINEAR(x, w, b, activation)
    low = ACT[activation](F.linear(x, w, b))
    ref = ACT[activation](F.linear(x.float(), w.float(), None if b is None else b.float()))
    assert got.shape == (*lead, m, n) and got.is_contiguous()
    assert torch.equal(got, via_op)             # the eager direct path and the dispatcher run the same kernel
    assert_within_bound("y", got, low, ref)


@settings(max_examples=8, deadline=None)
@given(shape=st.sampled_from(SHAPES), m=st.sampled_from(ROWS), bias=st.booleans(),
       activation=st.sampled_from(gto.ACTIVATIONS), fused=st.booleans())
def test_gradients_match_fp32_within_bound(shape, m, bias, activation, fused):
    """dX, dW (a symbolic-K kernel over the m tokens) and db of gto.linear (training path) or of the fused op
    (its backward recomputes z) against fp32 autograd of the same bf16 inputs."""
    n, k = shape
    torch.manual_seed(3 * m + n)
    x, w = randn(m, k, grad=True), randn(n, k, scale=k ** -0.5, grad=True)
    b = randn(n, grad=True) if bias else None
    leaves = [t for t in (x, w, b) if t is not None]
    grad = randn(m, n)

    def run(fn, tensors):
        y = fn(*tensors)
        return [y.detach()] + list(torch.autograd.grad(y, tensors, grad.to(y.dtype)))

    def torch_fn(x, w, b=None):
        return ACT[activation](F.linear(x, w, b))

    got = run(lambda x, w, b=None: (LINEAR if fused else gto.linear)(x, w, b, activation), leaves)
    low = run(torch_fn, leaves)
    ref = run(torch_fn, [t.detach().float().requires_grad_() for t in leaves])
    for name, g, t, r in zip(("y", "dx", "dw", "db"), got, low, ref):
        assert_within_bound(name, g, t, r)


@pytest.mark.parametrize("a_layout", ["mk", "km"])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_gemm_op_every_layout_and_its_gradients(a_layout, b_layout):
    torch.manual_seed(5)
    m, n, k = 40, 64, 128
    a = randn(*((m, k) if a_layout == "mk" else (k, m)), grad=True)
    b = randn(*((n, k) if b_layout == "nk" else (k, n)), scale=k ** -0.5, grad=True)
    grad = randn(m, n)

    def torch_fn(a, b):
        return (a if a_layout == "mk" else a.T) @ (b.T if b_layout == "nk" else b)

    def run(fn, a, b):
        c = fn(a, b)
        return [c.detach()] + list(torch.autograd.grad(c, (a, b), grad.to(c.dtype)))

    got = run(lambda a, b: gto.gemm(a, b, a_layout, b_layout), a, b)
    low = run(torch_fn, a, b)
    ref = run(torch_fn, *(t.detach().float().requires_grad_() for t in (a, b)))
    for name, g, t, r in zip(("c", "da", "db"), got, low, ref):
        assert_within_bound(name, g, t, r)


def test_registry_kernel_writes_every_element_of_out():
    n, k = SHAPES[0]
    kern = gto.linear_kernel(n, k, BF16, True, "gelu")
    x, w, b = randn(37, k), randn(n, k, scale=k ** -0.5), randn(n)
    out = torch.full((37, n), float("nan"), dtype=BF16, device="cuda")
    assert kern(x, w, b, out=out) is out
    ref = F.gelu(F.linear(x.float(), w.float(), b.float()))
    assert_within_bound("out", out, F.gelu(F.linear(x, w, b)), ref)


def test_any_strides_empty_rows_and_clear_errors_on_cuda():
    n, k = SHAPES[0]
    w, b = randn(n, k, scale=k ** -0.5), randn(n)
    x = randn(k, 12).T                                         # [12, K], column-major
    with torch.no_grad():
        torch.testing.assert_close(gto.linear(x, w, b, "relu"), gto.linear(x.contiguous(), w, b, "relu"))
        odd = randn(12 * k + 1)[1:].view(12, k)                    # contiguous, 2 bytes off 16-byte alignment
        torch.testing.assert_close(gto.linear(odd, w, b), gto.linear(odd.clone(), w, b))
        assert gto.linear(randn(0, k), w, b, "silu").shape == (0, n)
        with pytest.raises(LaunchError, match="x is torch.float32 but weight is torch.bfloat16"):
            gto.linear(x.float(), w, b)
        with pytest.raises(LaunchError, match="x is on cpu but weight is on cuda"):
            gto.linear(x.cpu(), w, b)
        with pytest.raises(LaunchError, match="last dim must be K"):
            gto.linear(randn(4, k + 8), w, b)
        with pytest.raises(LaunchError, match="out_features N = 60 is not a multiple of 8"):
            gto.linear(x, randn(60, k), None, "gelu")


def test_prepare_linear_leaves_nothing_to_build(count_compiles):
    n, k = SHAPES[1]
    done = gto.prepare_linear(n, k, BF16, True, "silu", [3, 200], training=True)
    assert len(done) == 3 and all(len(rows) == (1 if kern.spec.m == n else 2) for kern, rows in done)
    count_compiles.clear()
    for m in (3, 200):
        x, w, b = randn(m, k, grad=True), randn(n, k, grad=True), randn(n, grad=True)
        gto.linear(x, w, b, "silu").sum().backward()
    assert count_compiles == []


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256, device="cuda", dtype=BF16)
        self.down = torch.nn.Linear(256, 64, device="cuda", dtype=BF16)

    def forward(self, x):
        return gto.linear(gto.linear(x, self.up.weight, self.up.bias, "gelu"), self.down.weight, self.down.bias)


def prepare(model, rows, training=False):
    for lin, act in ((model.up, "gelu"), (model.down, "none")):
        gto.prepare_linear(lin.out_features, lin.in_features, BF16, True, act, rows, training=training)


def test_compile_reduce_overhead_dynamic_after_prepare_matches_eager(count_compiles):
    torch._dynamo.reset()
    torch.manual_seed(6)
    model = TwoLayers().eval()
    rows = [4, 12]
    prepare(model, rows)
    count_compiles.clear()
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=True, fullgraph=True)
    with torch.no_grad():
        for m in rows + rows:
            x = randn(m, 128)
            want = model(x)
            for _ in range(3):          # warm-up, record, replay
                torch.compiler.cudagraph_mark_step_begin()
                got = compiled(x).clone()
            torch.testing.assert_close(got, want)
    assert count_compiles == []         # no gemmc kernel built during capture
    assert counters["inductor"]["cudagraph_skips"] == 0, "inductor ran the graph without CUDA graphs"
    assert counters["stats"]["unique_graphs"] == 1, "one compile for both batch sizes"
    torch._dynamo.reset()


def test_compile_default_training_gradients_match_eager():
    torch._dynamo.reset()
    torch.manual_seed(7)
    model = TwoLayers()
    prepare(model, [8, 24], training=True)
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    for m in (8, 24):
        x = randn(m, 128, grad=True)
        x_eager = x.detach().clone().requires_grad_()
        grad = randn(m, 64)
        compiled(x).backward(grad)
        got = [p.grad.clone() for p in model.parameters()] + [x.grad]
        model.zero_grad()
        model(x_eager).backward(grad)
        want = [p.grad for p in model.parameters()] + [x_eager.grad]
        for g, e in zip(got, want):
            assert rel_error(g, e) <= 2 * 2.0 ** -8, rel_error(g, e)
        model.zero_grad()
    torch._dynamo.reset()


def test_compile_static_rows_trace_torch_routes_as_f_linear():
    """Under torch.compile with static shapes, a plain Linear at an M that `auto` routes to torch.matmul is
    traced as aten's own linear (no gemmc op in the graph, the result bit-equal to F.linear); at an M a
    gemmc kernel runs, the graph calls the gemmc op."""
    from gemmc.torch_ops.functional import auto_routes_to_torch
    n, k = 1024, 4096
    w = randn(n, k, scale=0.02)
    routes = {m: auto_routes_to_torch(n, k, BF16, m) for m in (1, 16, 64, 256, 2048, 4096)}
    if not any(routes.values()) or all(routes.values()):
        pytest.skip(f"the shipped table routes {n}x{k} the same way at every M ({routes})")
    for m, to_torch in routes.items():
        graphs = []

        def capture(gm, example_inputs):
            graphs.append(str(gm.graph))
            return gm.forward

        torch._dynamo.reset()
        fn = torch.compile(lambda x: gto.linear(x, w), backend=capture, fullgraph=True, dynamic=False)
        x = randn(m, k)
        with torch.no_grad():
            y = fn(x)
        (graph,) = graphs
        assert ("gemmc" not in graph) == to_torch, (m, to_torch, graph)
        if to_torch:
            assert torch.equal(y, F.linear(x, w)), m
        else:
            ref = x.float() @ w.float().T
            assert_within_bound(f"M={m}", y, F.linear(x, w), ref)


@pytest.mark.parametrize("dynamic", [False, True])
def test_inductor_calls_gemmc_out_entries_on_cuda_within_bound(dynamic):
    """Compiled by Inductor, the graph calls gemmc's out= entries (no gemmc op through the dispatcher), with
    and without gradients, and its results stay within the bound of fp32 torch, at rows of three M buckets."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    torch.manual_seed(8)
    model = TwoLayers()
    for rows in (1, 37, 300):
        x = randn(rows, 128)
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            got, codes = run_and_get_code(torch.compile(model, fullgraph=True, dynamic=dynamic), x)
        code = "\n".join(codes)
        if codes:       # dynamic=True compiles once: later row counts reuse the first graph
            assert code.count("extern_kernels.gemmc_linear_bias_out(") == 2 and not calls_gemmc_op(code), code
        h = F.gelu(x.float() @ model.up.weight.float().T + model.up.bias.float())
        ref = h @ model.down.weight.float().T + model.down.bias.float()
        torch_low = F.linear(F.gelu(F.linear(x, model.up.weight, model.up.bias)), model.down.weight, model.down.bias)
        assert_within_bound(f"rows={rows}", got, torch_low, ref)
    x = randn(24, 128, grad=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
        _, codes = run_and_get_code(lambda: compiled(x).sum().backward())
    code = "\n".join(codes)
    assert code.count("extern_kernels.gemmc_gemm_out(") == 4 and not calls_gemmc_op(code), code
    torch._dynamo.reset()


def calls_gemmc_op(code: str) -> bool:
    """Whether generated code calls a gemmc op itself (its comments name the ops of the nodes it fused)."""
    return any("torch.ops.gemmc." in line.split("#")[0] for line in code.splitlines())
