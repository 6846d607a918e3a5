"""torch.ops.gemmc.grouped_gemm on the CPU: the per-expert reference, the errors of malformed calls (eager and at
trace time), the fake kernel under FakeTensorMode, make_fx and torch.compile (fullgraph, dynamic), and the CUDA
path's kernel key (the spec its registry compiles)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import gemmc.torch_ops as gto
from gemmc.errors import LaunchError, SpecError
from gemmc.torch_ops.grouped import grouped_spec

G = torch.Generator().manual_seed(0)
X = torch.randn(10, 32, generator=G).to(torch.bfloat16)
W = torch.randn(3, 16, 32, generator=G).to(torch.bfloat16)
OFFSETS = torch.tensor([0, 4, 4, 9], dtype=torch.int32)


def per_expert(x, w, bounds, gate=None):
    out = torch.zeros(x.shape[0], w.shape[1] // (2 if gate else 1))
    for g, (lo, hi) in enumerate(bounds):
        y = x[lo:hi].float() @ w[g].float().T
        if gate:
            a, b = y.chunk(2, dim=-1)
            y = F.silu(a) * b
        out[lo:hi] = y
    return out


def test_contiguous_op_is_each_experts_linear_and_leaves_other_rows_zero_on_cpu():
    y = gto.grouped_gemm(X, W, OFFSETS)
    assert y.shape == (10, 16) and y.dtype == torch.bfloat16
    ref = per_expert(X, W, [(0, 4), (4, 4), (4, 9)])
    assert torch.allclose(y.float(), ref, rtol=2 ** -7, atol=1e-2) and not y[9].any()
    swiglu = gto.grouped_gemm(X, W, OFFSETS, gate="silu")
    assert swiglu.shape == (10, 8)
    assert torch.allclose(swiglu.float(), per_expert(X, W, [(0, 4), (4, 4), (4, 9)], "silu"), rtol=2 ** -7, atol=2e-2)


def test_masked_op_uses_each_experts_first_rows():
    x3 = torch.randn(3, 5, 32, generator=G).to(torch.bfloat16)
    counts = torch.tensor([2, 0, 5], dtype=torch.int32)
    y = gto.grouped_gemm(x3, W, counts, layout="masked")
    assert y.shape == (3, 5, 16)
    assert torch.allclose(y[0, :2].float(), x3[0, :2].float() @ W[0].float().T, rtol=2 ** -7, atol=1e-2)
    assert not y[0, 2:].any() and not y[1].any()


@pytest.mark.parametrize("args, cls, needle", [
    ((X, W, OFFSETS, "ragged", "none"), SpecError, "layout 'ragged'"),
    ((X, W, OFFSETS, "contiguous", "swish"), SpecError, "gate 'swish'"),
    ((X, W[0], OFFSETS, "contiguous", "none"), LaunchError, "[E, N, K]"),
    ((X[:, :16], W, OFFSETS, "contiguous", "none"), LaunchError, "take a [M, 32]"),
    ((X, W, OFFSETS[:3], "contiguous", "none"), LaunchError, "E + 1 row offsets: [4]"),
    ((X, W, OFFSETS.long(), "contiguous", "none"), LaunchError, "must be torch.int32"),
    ((X, W[:, :15], OFFSETS, "contiguous", "silu"), LaunchError, "an even number"),
    ((X.float(), W, OFFSETS, "contiguous", "none"), LaunchError, "cast them to one dtype"),
    ((X, W, OFFSETS, "masked", "none"), LaunchError, "masked groups take a [3, M, 32]"),
])
def test_malformed_calls_name_the_problem(args, cls, needle):
    with pytest.raises(cls, match="gemmc::grouped_gemm") as e:
        torch.ops.gemmc.grouped_gemm(*args)
    assert needle in str(e.value)
    with FakeTensorMode() as mode, pytest.raises(cls) as e:     # the fake kernel says the same at trace time
        torch.ops.gemmc.grouped_gemm(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert needle in str(e.value)


def test_fake_kernel_gives_the_output_of_fake_cuda_tensors():
    with FakeTensorMode():
        x = torch.empty(4096, 7168, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(256, 4096, 7168, dtype=torch.bfloat16, device="cuda")
        offsets = torch.empty(257, dtype=torch.int32, device="cuda")
        counts = torch.empty(256, dtype=torch.int32, device="cuda")
        y = torch.ops.gemmc.grouped_gemm(x, w, offsets, "contiguous", "silu")
        ym = torch.ops.gemmc.grouped_gemm(torch.empty(256, 16, 7168, dtype=torch.bfloat16, device="cuda"), w,
                                          counts, "masked", "none")
    assert y.shape == (4096, 2048) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
    assert ym.shape == (256, 16, 4096)


def test_the_op_traces_with_make_fx_and_compiles_without_graph_breaks():
    from torch.fx.experimental.proxy_tensor import make_fx
    graph = make_fx(lambda x, w, o: gto.grouped_gemm(x, w, o, gate="silu") * 2, tracing_mode="symbolic")(X, W, OFFSETS)
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"][0] == torch.ops.gemmc.grouped_gemm.default
    compiled = torch.compile(lambda x, w, o: gto.grouped_gemm(x, w, o, gate="silu"), fullgraph=True, dynamic=True)
    assert torch.equal(compiled(X, W, OFFSETS), gto.grouped_gemm(X, W, OFFSETS, gate="silu"))
    x2, o2 = torch.randn(20, 32).to(torch.bfloat16), torch.tensor([0, 7, 15, 20], dtype=torch.int32)
    assert torch.equal(compiled(x2, W, o2), gto.grouped_gemm(x2, W, o2, gate="silu"))


def test_the_cuda_path_compiles_one_kernel_per_layout_width_and_gate():
    spec = grouped_spec("contiguous", 2048, 7168, torch.bfloat16, "silu")
    assert (spec.m, spec.n, spec.k, spec.groups, spec.group_layout, spec.gate) == \
        ("M", 2048, 7168, "E", "contiguous", "silu")
    assert grouped_spec("masked", 7168, 2048, "bf16").gate is None
    with pytest.raises(SpecError, match="bf16 or f16"):
        grouped_spec("masked", 7168, 2048, torch.float32)
