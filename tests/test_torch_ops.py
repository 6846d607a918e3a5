"""gemmc.torch_ops on the CPU: schemas, fake kernels, make_fx and torch.compile (one compile, no graph break),
opcheck, unsupported_reason, the registry, prepare_linear, the CUDA call path with stand-in kernels."""
import re
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounterWithBackend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import gemmc.torch_ops as gto
from gemmc.errors import LaunchError, SpecError
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
from gemmc.torch_ops import kernels, launch, reference
from gemmc.torch_ops.activations import EPILOGUE_OP, TORCH_FORWARD

BF16 = torch.bfloat16
LINEAR = torch.ops.gemmc.linear.default
GEMM = torch.ops.gemmc.gemm.default
LAUNCH_LINEAR = torch.ops.gemmc.launch_linear.default
LAUNCH_GEMM = torch.ops.gemmc.launch_gemm.default
TORCH_OF_EPILOGUE_OP = {op: TORCH_FORWARD[act] for act, op in EPILOGUE_OP.items() if op}


def fake_cuda(*shape, dtype=BF16):
    with FakeTensorMode():
        return torch.empty(*shape, dtype=dtype, device="cuda")


# --- schemas and fake kernels -----------------------------------------------------------------------------------

def test_op_schemas_and_activations():
    assert str(LINEAR._schema) == "gemmc::linear(Tensor x, Tensor weight, Tensor? bias, str activation) -> Tensor"
    assert str(GEMM._schema) == "gemmc::gemm(Tensor a, Tensor b, str a_layout, str b_layout) -> Tensor"
    assert gto.ACTIVATIONS == ("none", "relu", "gelu", "gelu_tanh", "silu")


@settings(max_examples=20)
@given(lead=st.sampled_from([(), (5,), (2, 3)]), n=st.sampled_from([8, 24]), bias=st.booleans(),
       act=st.sampled_from(gto.ACTIVATIONS), dtype=st.sampled_from([BF16, torch.float16]))
def test_linear_fake_gives_shape_dtype_contiguous_strides(lead, n, bias, act, dtype):
    with FakeTensorMode():
        x = torch.empty(*lead, 7, 16, dtype=dtype, device="cuda")
        w = torch.empty(n, 16, dtype=dtype, device="cuda")
        b = torch.empty(n, dtype=dtype, device="cuda") if bias else None
        y = LINEAR(x, w, b, act)
        assert y.shape == (*lead, 7, n) and y.dtype == dtype and y.device.type == "cuda"
        assert y.is_contiguous()


@settings(max_examples=20)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40), a_layout=st.sampled_from(["mk", "km"]),
       b_layout=st.sampled_from(["nk", "kn"]))
def test_gemm_fake_gives_m_by_n_contiguous(m, n, k, a_layout, b_layout):
    with FakeTensorMode():
        a = torch.empty((m, k) if a_layout == "mk" else (k, m), dtype=BF16, device="cuda")
        b = torch.empty((n, k) if b_layout == "nk" else (k, n), dtype=BF16, device="cuda")
        c = GEMM(a, b, a_layout, b_layout)
        assert c.shape == (m, n) and c.stride() == (n, 1) and c.dtype == BF16


def test_fake_kernels_refuse_malformed_calls_at_trace_time():
    with FakeTensorMode():
        x, w = torch.empty(4, 16, dtype=BF16, device="cuda"), torch.empty(8, 16, dtype=BF16, device="cuda")
        with pytest.raises(LaunchError, match="last dim must be K = 16"):
            LINEAR(torch.empty(4, 12, dtype=BF16, device="cuda"), w, None, "none")
        with pytest.raises(SpecError, match="'tanh' is not one of"):
            LINEAR(x, w, None, "tanh")
        with pytest.raises(LaunchError, match="bias is torch.float32 but weight is torch.bfloat16"):
            LINEAR(x, w, torch.empty(8, device="cuda"), "none")
        with pytest.raises(LaunchError, match="out_features N = 12 is not a multiple of 8"):
            LINEAR(x, torch.empty(12, 16, dtype=BF16, device="cuda"), None, "relu")
        with pytest.raises(SpecError, match="a_layout='nk'"):
            GEMM(x, w, "nk", "nk")
        with pytest.raises(LaunchError, match="disagree on K: 16 vs 8"):
            GEMM(x, torch.empty(16, 8, dtype=BF16, device="cuda"), "mk", "nk")


# --- tracing ----------------------------------------------------------------------------------------------------

def test_make_fx_symbolic_traces_both_ops_with_symbolic_rows():
    def f(x, w, b, dz, h):
        return gto.linear(x, w, b, "gelu"), gto.gemm(dz, h, "km", "kn")

    args = (torch.randn(5, 16), torch.randn(8, 16), torch.randn(8), torch.randn(6, 8), torch.randn(6, 16))
    gm = make_fx(f, tracing_mode="symbolic")(*args)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [LAUNCH_LINEAR, LAUNCH_GEMM]     # the public ops decompose to their kernel ops
    assert calls[0].args[3] == "gelu" and calls[1].args[2:] == ("km", "kn")
    rows = calls[0].meta["val"].shape[0]
    assert isinstance(rows, torch.SymInt) and calls[0].meta["val"].shape[1] == 8
    assert isinstance(calls[1].meta["val"].shape[0], torch.SymInt)     # N of dz: traced symbolically too
    got = gm(torch.randn(3, 16), *args[1:])
    assert got[0].shape == (3, 8) and got[1].shape == (8, 16)


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x):
        return gto.linear(gto.linear(x, self.up.weight, self.up.bias, "gelu"), self.down.weight, self.down.bias, "relu")


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_dynamic_compiles_once_for_every_batch_and_grads_match_eager(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoLayers()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for rows in (2, 3, 5, 9):
        x = torch.randn(rows, 16, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, want = compiled(x), model(x_eager)
        torch.testing.assert_close(got, want)
        grad = torch.randn_like(want)
        got.backward(grad)
        compiled_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        want.backward(grad)
        for mine, eager in zip(compiled_grads, (p.grad for p in model.parameters())):
            torch.testing.assert_close(mine, eager)
        torch.testing.assert_close(x.grad, x_eager.grad)
        model.zero_grad()
    assert counter.frame_count == 1, f"{counter.frame_count} compiles for 4 batch sizes"
    torch._dynamo.reset()


def test_compiled_graph_runs_fused_op_without_grad_and_bias_only_op_with_grad():
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append([(n.target, n.args[3]) for n in gm.graph.nodes
                       if n.op == "call_function" and n.target is LINEAR])
        return gm

    model = TwoLayers()
    compiled = torch.compile(model, backend=capture, fullgraph=True, dynamic=True)
    with torch.no_grad():
        compiled(torch.randn(4, 16))
    compiled(torch.randn(4, 16))
    assert [[act for _, act in g] for g in graphs] == [["gelu", "relu"], ["none", "relu"]]
    torch._dynamo.reset()


def _inductor_code(fn, *args):
    """(result, the generated wrapper code) of fn compiled by Inductor, compiled afresh (no FX graph cache)."""
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        out, codes = run_and_get_code(torch.compile(fn, backend="inductor", fullgraph=True), *args)
    torch._dynamo.reset()
    return out, "\n".join(codes)


def test_inductor_calls_the_out_entries_directly_forward_and_backward():
    """A compiled graph calls gemmc's out= entries as extern kernels (no dispatcher round trip into Python, no
    allocation of its own), in the forward and in the backward, and computes what eager computes."""
    torch.manual_seed(5)
    model = TwoLayers()
    x = torch.randn(3, 4, 16)
    with torch.no_grad():
        got, code = _inductor_code(model, x)
        torch.testing.assert_close(got, model(x))
    assert code.count("extern_kernels.gemmc_linear_bias_out(") == 2, code
    assert not calls_gemmc_op(code)

    def plain(x, w):
        return gto.linear(x, w).sum()
    w = torch.randn(32, 16, requires_grad=True)
    xg = torch.randn(5, 16, requires_grad=True)
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(plain, backend="inductor", fullgraph=True)
        loss, codes = run_and_get_code(lambda: compiled(xg, w).backward())
    torch._dynamo.reset()
    code = "\n".join(codes)
    assert "extern_kernels.gemmc_linear_out(" in code and code.count("extern_kernels.gemmc_gemm_out(") == 2, code
    assert not calls_gemmc_op(code)
    torch.testing.assert_close(w.grad, torch.ones(5, 32).T @ xg.detach())
    torch.testing.assert_close(xg.grad, torch.ones(5, 32) @ w.detach())


def test_inductor_lowering_that_cannot_build_its_node_falls_back_to_the_op(monkeypatch):
    import torch._inductor.ir as inductor_ir
    from gemmc.torch_ops import inductor

    def broken(*args, **kwargs):
        raise TypeError("ExternKernelOut() got an unexpected keyword argument")
    monkeypatch.setattr(inductor_ir, "ExternKernelOut", broken)
    monkeypatch.setattr(inductor, "_WARNED", False)
    model = TwoLayers()
    x = torch.randn(6, 16)
    with torch.no_grad(), pytest.warns(UserWarning, match="could not lower .*launch_linear"):
        got, code = _inductor_code(model, x)
        torch.testing.assert_close(got, model(x))
    assert code.count("torch.ops.gemmc.launch_linear.default(") == 2 and "gemmc_linear" not in code


def calls_gemmc_op(code: str) -> bool:
    """Whether generated code calls a gemmc op itself (its comments may name the ops of the nodes it fused)."""
    return any("torch.ops.gemmc." in line.split("#")[0] for line in code.splitlines())


def test_out_entries_run_the_registry_kernel_into_out(stand_in_registry):
    torch.manual_seed(6)
    w, b = torch.randn(16, 32, dtype=BF16), torch.randn(16, dtype=BF16)
    x = torch.randn(5, 32, dtype=BF16)
    out = torch.full((5, 16), float("nan"), dtype=BF16)
    launch.linear_into(x, w, b, "silu", out)        # first call: the key is new, run_linear compiles it
    torch.testing.assert_close(out, reference.linear(x, w, b, "silu"))
    kern, = stand_in_registry
    out.fill_(float("nan"))
    launch.linear_into(x, w, b, "silu", out)        # known key: the kernel writes out itself
    torch.testing.assert_close(out, reference.linear(x, w, b, "silu"))
    assert len(kern.calls) == 2 and kern.calls[-1][0] is x
    with pytest.raises(LaunchError, match="last dim must be K = 32"):      # a malformed call: the op's message
        launch.linear_into(torch.randn(5, 16, dtype=BF16), w, b, "silu", out)
    dz, xs = torch.randn(6, 16, dtype=BF16), torch.randn(6, 32, dtype=BF16)
    dw = torch.full((16, 32), float("nan"), dtype=BF16)
    launch.gemm_into(dz, xs, "km", "kn", dw)
    launch.gemm_into(dz, xs, "km", "kn", dw)
    torch.testing.assert_close(dw, (dz.float().T @ xs.float()).to(BF16))
    assert len(stand_in_registry) == 2 and len(stand_in_registry[1].calls) == 2


@pytest.mark.parametrize("activation", gto.ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_opcheck_linear(activation, bias):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 16, dtype=BF16, requires_grad=True)
    w = torch.randn(8, 16, dtype=BF16, requires_grad=True)
    b = torch.randn(8, dtype=BF16, requires_grad=True) if bias else None
    torch.library.opcheck(LINEAR, (x, w, b, activation))


@pytest.mark.parametrize("a_layout", ["mk", "km"])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_opcheck_gemm(a_layout, b_layout):
    torch.manual_seed(2)
    a = torch.randn((5, 16) if a_layout == "mk" else (16, 5), requires_grad=True)
    b = torch.randn((8, 16) if b_layout == "nk" else (16, 8), requires_grad=True)
    torch.library.opcheck(GEMM, (a, b, a_layout, b_layout))


# --- errors through the public functions (CPU: the reference path) -----------------------------------------------

def test_public_functions_raise_clear_errors():
    x, w = torch.randn(4, 16, dtype=BF16), torch.randn(8, 16, dtype=BF16)
    with pytest.raises(LaunchError, match="x is torch.float32 but weight is torch.bfloat16: cast x"):
        gto.linear(x.float(), w)
    with pytest.raises(LaunchError, match=r"x has shape \(4, 12\).*last dim must be K = 16"):
        gto.linear(torch.randn(4, 12, dtype=BF16), w)
    with pytest.raises(SpecError, match="'swish' is not one of"):
        gto.linear(x, w, None, "swish")
    with pytest.raises(LaunchError, match=r"bias has shape \(16,\); it must be \[N\] = \[8\]"):
        gto.linear(x, w, torch.randn(16, dtype=BF16))
    with pytest.raises(LaunchError, match="must be torch.Tensors, got list"):
        gto.linear([[1.0]], w)
    with pytest.raises(SpecError, match="b_layout='mk'"):
        gto.gemm(x, w, "mk", "mk")
    with pytest.raises(LaunchError, match="a and b must be 2-D"):
        gto.gemm(x[None], w)
    with pytest.raises(LaunchError, match="a is torch.bfloat16 but b is torch.float32"):
        gto.gemm(x, w.float())


# --- unsupported_reason ---------------------------------------------------------------------------------------

def test_unsupported_reason_is_none_for_a_layer_gemmc_runs():
    for dtype, act in zip((BF16, torch.float16) * 3, gto.ACTIVATIONS):
        w, b = fake_cuda(64, 32, dtype=dtype), fake_cuda(64, dtype=dtype)
        assert gto.unsupported_reason(w, b, act, x_dtype=dtype) is None and gto.unsupported_reason(w) is None


@pytest.mark.parametrize("case, weight, bias, activation, x_dtype, says", [
    ("fp32 weight", lambda: fake_cuda(64, 32, dtype=torch.float32), None, "none", None,
     r"weight is torch.float32.*torch.bfloat16 or torch.float16: convert the layer"),
    ("CPU weight", lambda: torch.empty(64, 32, dtype=BF16), None, "none", None,
     r"weight is on cpu.*CUDA GPUs: move the layer to the GPU"),
    ("N unaligned", lambda: fake_cuda(60, 32), None, "none", None,
     r"out_features N = 60 is not a multiple of 8 \(16 bytes of torch.bfloat16\).*pad it"),
    ("K unaligned", lambda: fake_cuda(64, 20, dtype=torch.float16), None, "gelu", None,
     r"in_features K = 20 is not a multiple of 8"),
    ("unknown activation", lambda: fake_cuda(64, 32), None, "mish", None,
     r"activation 'mish' is not one of \('none', 'relu', 'gelu', 'gelu_tanh', 'silu'\)"),
    ("bias dtype", lambda: fake_cuda(64, 32), lambda: fake_cuda(64, dtype=torch.float32), "relu", None,
     r"bias is torch.float32 but weight is torch.bfloat16.*convert it"),
    ("bias shape", lambda: fake_cuda(64, 32), lambda: fake_cuda(32), "none", None, r"bias has shape \(32,\)"),
    ("input dtype", lambda: fake_cuda(64, 32), None, "none", torch.float32,
     r"the input is torch.float32 but weight is torch.bfloat16: cast the input"),
    ("1-D weight", lambda: fake_cuda(64), None, "none", None, r"a Linear weight is 2-D"),
])
def test_unsupported_reason_names_problem_and_fix(case, weight, bias, activation, x_dtype, says):
    reason = gto.unsupported_reason(weight(), bias() if bias else None, activation, x_dtype=x_dtype)
    assert reason is not None, case
    assert re.search(says, reason), (case, reason)


# --- the kernel registry ----------------------------------------------------------------------------------------

class StandInKernel:
    """What the registry returns in these tests: computes the spec with the torch reference, records calls."""

    def __init__(self, spec, arch):
        self.spec, self.arch, self.calls, self.prepared = spec, arch, [], []

    def __call__(self, a, b, *inputs, out=None):
        self.calls.append((a, b, inputs))
        spec = self.spec
        y = reference.gemm(a.float(), b.float(), spec.a_layout, spec.b_layout)
        for op in spec.epilogue:
            y = y + inputs[0].float() if op.op == "add" else TORCH_OF_EPILOGUE_OP[op.op](y)
        return y.to(a.dtype) if out is None else out.copy_(y)

    def prepare(self, ms):
        self.prepared.append(list(ms))
        return [(m, "stand-in") for m in ms]

    def runner_for(self, m):        # CompiledGemm's: what a call with M rows runs (here the kernel itself)
        return self


@pytest.fixture
def stand_in_registry(monkeypatch):
    """An empty registry whose compiles make StandInKernels (recorded in the returned list); restored after."""
    saved = [(d, dict(d)) for d in (kernels.LINEAR_KERNELS, kernels.GEMM_KERNELS, kernels._COMPILED)]
    for d, _ in saved:
        d.clear()
    made = []

    def compile_stand_in(spec, arch):
        time.sleep(0.01)        # widen the window a racing second compile would use
        made.append(StandInKernel(spec, arch))
        return made[-1]

    monkeypatch.setattr(kernels, "_compile", compile_stand_in)
    yield made
    for d, old in saved:
        d.clear()
        d.update(old)


def test_linear_spec_is_the_fused_epilogue():
    assert kernels.linear_spec(64, 128, BF16, True, "gelu") == GemmSpec(
        m="M", n=64, k=128, dtype="bf16", inputs=(EpilogueInput("bias", "row", "bf16"),),
        epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))), EpilogueOp("gelu_erf", (Ref.node(0),))),
        name="linear_bias_gelu")
    assert kernels.linear_spec(64, 128, "f16", False, "silu").epilogue == (EpilogueOp("silu", (Ref.acc(),)),)
    assert kernels.linear_spec(64, 128, BF16, True, "none").epilogue[-1].op == "add"
    assert kernels.gemm_spec("km", "kn", 64, 128, BF16) == GemmSpec(
        m=64, n=128, k="K", dtype="bf16", a_layout="km", b_layout="kn", name="gemm_km_kn")


def test_registry_compiles_once_per_key_and_shares(stand_in_registry):
    made = stand_in_registry
    k1 = gto.linear_kernel(64, 32, BF16, True, "gelu")
    assert gto.linear_kernel(64, 32, BF16, True, "gelu") is k1
    assert gto.linear_kernel(64, 32, "bf16", True, "gelu") is k1          # same spec, another spelling
    assert gto.linear_kernel(64, 32, BF16, True, "gelu", arch="sm_90a") is k1
    assert gto.linear_kernel(64, 32, BF16, True, "relu") is not k1
    plain = gto.linear_kernel(64, 32, BF16, False, "none")
    assert plain is gto.gemm_kernel("mk", "nk", 32, 64, BF16) and plain.spec.epilogue == ()
    assert len(made) == 3 and k1.arch == "sm_90a"
    assert gto.linear_kernel(64, 32, BF16, True, "gelu", arch="sm_80") is not k1


def test_registry_compiles_once_under_concurrent_requests(stand_in_registry):
    got = []
    threads = [threading.Thread(target=lambda: got.append(gto.linear_kernel(128, 64, BF16, True, "silu")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stand_in_registry) == 1 and all(k is got[0] for k in got) and len(got) == 8


def test_registry_refuses_what_no_kernel_takes(stand_in_registry):
    with pytest.raises(SpecError, match="bf16 or f16 operands, got f32"):
        gto.linear_kernel(64, 32, torch.float32, True, "none")
    with pytest.raises(SpecError, match="activation 'elu' is not one of"):
        gto.linear_kernel(64, 32, BF16, True, "elu")
    with pytest.raises(SpecError, match="K \\(in_features\\) must be a positive int, got 0"):
        gto.linear_kernel(64, 0, BF16, True, "none")
    assert stand_in_registry == []


def test_real_compiles_symbolic_m_forward_and_symbolic_k_weight_gradient():
    """The forward kernel decides per M bucket; the dW kernel (reduction over the tokens) compiles with a
    symbolic K under `auto`, which resolves it with the heuristic. IR and passes only: nothing is built."""
    fwd = kernels.compiled(kernels.linear_spec(64, 128, BF16, True, "gelu"), "sm_90a")
    assert fwd.m_buckets is not None and fwd.spec.m == "M"
    dw = kernels.compiled(kernels.gemm_spec("km", "kn", 64, 128, BF16), "sm_90a")
    assert dw.spec.k == "K" and dw.spec.m == 64 and dw.m_buckets is None
    assert dw.decision.source == "heuristic" and "symbolic K" in dw.decision.detail


# --- prepare_linear ----------------------------------------------------------------------------------------------

def test_prepare_linear_inference_prepares_the_fused_kernel_only(stand_in_registry):
    done = gto.prepare_linear(64, 32, BF16, True, "gelu", [1, 16])
    (kern, rows), = done
    assert kern.spec == kernels.linear_spec(64, 32, BF16, True, "gelu") and kern.prepared == [[1, 16]]
    assert rows == [(1, "stand-in"), (16, "stand-in")]


@pytest.mark.parametrize("activation, forward", [("gelu", "none"), ("silu", "none"), ("relu", "relu"),
                                                 ("none", "none")])
def test_prepare_linear_training_prepares_forward_and_backward_kernels(stand_in_registry, activation, forward):
    done = gto.prepare_linear(64, 32, BF16, True, activation, [8, 300], training=True)
    specs = [(k.spec, k.prepared) for k, _ in done]
    assert specs == [(kernels.linear_spec(64, 32, BF16, True, forward), [[8, 300]]),
                     (kernels.gemm_spec("mk", "kn", 64, 32, BF16), [[8, 300]]),       # dX = dZ @ W
                     (kernels.gemm_spec("km", "kn", 64, 32, BF16), [[64]])]           # dW: static M = N


def test_prepare_linear_reports_torch_matmul_kernels_and_refuses_bad_row_counts(stand_in_registry, monkeypatch):
    # like the CublasOnlyGemm `auto` gives a plain GEMM no kernel takes: no prepare(), torch.matmul runs it
    monkeypatch.setattr(kernels, "_compile", lambda spec, arch: object())
    assert gto.prepare_linear(64, 32, BF16, False, "none", [4])[0][1] == [(4, "torch.matmul")]
    for bad in ([], [0], [2.5], [True]):
        with pytest.raises(SpecError, match="positive ints"):
            gto.prepare_linear(64, 32, BF16, False, "none", bad)


# --- the CUDA call path's logic, with stand-in kernels on CPU tensors -----------------------------------------

def test_run_linear_flattens_densifies_and_reshapes(stand_in_registry):
    torch.manual_seed(3)
    w, b = torch.randn(16, 32, dtype=BF16), torch.randn(16, dtype=BF16)
    x = torch.randn(3, 32, 5, dtype=BF16).transpose(1, 2)          # [3, 5, 32], not contiguous
    y = launch.run_linear(x, w, b, "silu")
    assert y.shape == (3, 5, 16) and y.is_contiguous()
    torch.testing.assert_close(y, reference.linear(x, w, b, "silu"))
    kern, = stand_in_registry
    a, weight, (bias,) = kern.calls[0]
    assert a.shape == (15, 32) and a.is_contiguous() and weight is w and bias is b
    misaligned = torch.randn(4 * 32 + 1, dtype=BF16)[1:].view(4, 32)       # contiguous, 2 bytes off 16
    launch.run_linear(misaligned, w, b, "silu")
    assert kern.calls[-1][0].data_ptr() % 16 == 0 and len(stand_in_registry) == 1


def test_run_linear_empty_rows_give_the_empty_output_without_a_kernel(stand_in_registry):
    w, b = torch.randn(16, 32, dtype=BF16), torch.randn(16, dtype=BF16)
    y = launch.run_linear(torch.empty(2, 0, 32, dtype=BF16), w, b, "relu")
    assert y.shape == (2, 0, 16) and stand_in_registry == []
    launch.run_linear(torch.randn(1, 32, dtype=BF16), w, b, "relu")
    assert launch.run_linear(torch.empty(0, 32, dtype=BF16), w, b, "relu").shape == (0, 16)
    assert len(stand_in_registry[0].calls) == 1


def test_run_linear_explains_a_refusal_in_the_ops_terms(stand_in_registry, monkeypatch):
    w = torch.randn(16, 32, dtype=BF16)
    launch.run_linear(torch.randn(2, 32, dtype=BF16), w, None, "gelu")
    kern, = stand_in_registry

    def refuse(self, *args):
        raise LaunchError("a must be bf16, got torch.float32")
    monkeypatch.setattr(StandInKernel, "__call__", refuse)
    with pytest.raises(LaunchError, match="gemmc::linear: x is torch.float32 but weight is torch.bfloat16") as e:
        launch.run_linear(torch.randn(2, 32), w, None, "gelu")
    assert "a must be bf16" in str(e.value.__cause__)
    with pytest.raises(LaunchError, match="last dim must be K = 32"):        # caught before the kernel
        launch.run_linear(torch.randn(2, 16, dtype=BF16), w, None, "gelu")


def test_run_gemm_layouts_and_empty_problems(stand_in_registry):
    torch.manual_seed(4)
    dz, x = torch.randn(6, 16, dtype=BF16), torch.randn(6, 32, dtype=BF16)
    dw = launch.run_gemm(dz, x, "km", "kn")
    torch.testing.assert_close(dw, (dz.float().T @ x.float()).to(BF16))
    assert stand_in_registry[0].spec == kernels.gemm_spec("km", "kn", 16, 32, BF16)
    zeros = launch.run_gemm(dz[:0], x[:0], "km", "kn")                      # K = 0 tokens: dW is zero
    assert zeros.shape == (16, 32) and not zeros.any()
    assert launch.run_gemm(torch.empty(0, 32, dtype=BF16), x.T, "mk", "kn").shape == (0, 6)
    assert len(stand_in_registry) == 1 and len(stand_in_registry[0].calls) == 1
