"""torch.ops.gemmc.grouped_scaled_gemm on the CPU: the per-expert reference on the dequantized operands, the errors
of malformed calls (eager and at trace time), the fake kernel of fake CUDA tensors, make_fx and torch.compile
(fullgraph, dynamic), and the CUDA path's kernel key (the spec its registry compiles)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gemmc.torch_ops as gto
from gemmc.errors import LaunchError, SpecError
from gemmc.quantize import dequantize, quantize
from gemmc.torch_ops.grouped_scaled import grouped_scaled_spec

G = torch.Generator().manual_seed(0)
X8, SX = quantize(torch.randn(10, 256, generator=G), "block")
_W = [quantize(torch.randn(200, 256, generator=G), "block", weight=True) for _ in range(3)]
W8, SW = torch.stack([q for q, _ in _W]), torch.stack([s for _, s in _W])
OFFSETS = torch.tensor([0, 4, 4, 9], dtype=torch.int32)


def test_contiguous_op_is_each_experts_dequantized_linear_and_leaves_other_rows_zero():
    y = gto.grouped_scaled_gemm(X8, W8, SX, SW, OFFSETS)
    assert y.shape == (10, 200) and y.dtype == torch.bfloat16
    x, w = dequantize(X8, SX), dequantize(W8, SW)
    assert torch.equal(y[:4], (x[:4] @ w[0].T).to(torch.bfloat16))
    assert torch.equal(y[4:9], (x[4:9] @ w[2].T).to(torch.bfloat16)) and not y[9].any()


def test_masked_op_uses_each_experts_first_rows_and_its_scales():
    x8, sx = X8[:8].reshape(2, 4, 256), SX[:8].reshape(2, 4, 2)
    counts = torch.tensor([3, 0], dtype=torch.int32)
    y = gto.grouped_scaled_gemm(x8, W8[:2], sx, SW[:2], counts, layout="masked")
    assert y.shape == (2, 4, 200)
    ref = dequantize(x8[0, :3], sx[0, :3]) @ dequantize(W8[0], SW[0]).T
    assert torch.equal(y[0, :3], ref.to(torch.bfloat16)) and not y[0, 3:].any() and not y[1].any()


@pytest.mark.parametrize("args, cls, needle", [
    ((X8, W8, SX, SW, OFFSETS, "ragged"), SpecError, "layout 'ragged'"),
    ((X8.to(torch.bfloat16), W8, SX, SW, OFFSETS, "contiguous"), LaunchError, "fp8 operands are a "
     "torch.float8_e4m3fn a"),
    ((X8, W8.to(torch.bfloat16), SX, SW, OFFSETS, "contiguous"), LaunchError, "torch.float8_e5m2 weight"),
    ((X8, W8, SX[:, :1], SW, OFFSETS, "contiguous"), LaunchError, "scale_a is torch.float32 of shape (10, 1); it "
     "must be a's f32 scale per 1 x 128 block of each row: torch.float32 of shape (10, 2)"),
    ((X8, W8, SX, SW[0], OFFSETS, "contiguous"), LaunchError, "scale_weight is torch.float32 of shape (2, 2); it "
     "must be each expert's f32 scale per 128 x 128 block of its weight: torch.float32 of shape (3, 2, 2)"),
    ((X8, W8, SX.double(), SW, OFFSETS, "contiguous"), LaunchError, "scale_a is torch.float64"),
    ((X8, W8, SX, SW, OFFSETS[:3], "contiguous"), LaunchError, "E + 1 row offsets: [4]"),
    ((X8, W8, SX, SW, OFFSETS, "masked"), LaunchError, "masked groups take a [3, M, 256]"),
])
def test_malformed_calls_name_the_problem(args, cls, needle):
    with pytest.raises(cls, match="gemmc::grouped_scaled_gemm") as e:
        torch.ops.gemmc.grouped_scaled_gemm(*args)
    assert needle in str(e.value)
    with FakeTensorMode() as mode, pytest.raises(cls) as e:     # the fake kernel says the same at trace time
        torch.ops.gemmc.grouped_scaled_gemm(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                                              for a in args))
    assert needle in str(e.value)


def test_fake_kernel_gives_the_output_of_fake_cuda_tensors():
    with FakeTensorMode():
        x = torch.empty(4096, 7168, dtype=torch.float8_e4m3fn, device="cuda")
        w = torch.empty(256, 2048, 7168, dtype=torch.float8_e4m3fn, device="cuda")
        sx, sw = torch.empty(4096, 56, device="cuda"), torch.empty(256, 16, 56, device="cuda")
        y = torch.ops.gemmc.grouped_scaled_gemm(x, w, sx, sw, torch.empty(257, dtype=torch.int32, device="cuda"),
                                                "contiguous")
        ym = torch.ops.gemmc.grouped_scaled_gemm(torch.empty(256, 16, 7168, dtype=torch.float8_e4m3fn, device="cuda"),
                                                 w, torch.empty(256, 16, 56, device="cuda"), sw,
                                                 torch.empty(256, dtype=torch.int32, device="cuda"), "masked")
    assert y.shape == (4096, 2048) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
    assert ym.shape == (256, 16, 2048) and ym.dtype == torch.bfloat16


def test_the_op_traces_with_make_fx_and_compiles_without_graph_breaks():
    from torch.fx.experimental.proxy_tensor import make_fx
    call = lambda x, w, sx, sw, o: gto.grouped_scaled_gemm(x, w, sx, sw, o)      # noqa: E731
    graph = make_fx(call, tracing_mode="symbolic")(X8, W8, SX, SW, OFFSETS)
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"][0] == \
        torch.ops.gemmc.grouped_scaled_gemm.default
    compiled = torch.compile(call, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(X8, W8, SX, SW, OFFSETS), call(X8, W8, SX, SW, OFFSETS))
    x8, sx = quantize(torch.randn(20, 256, generator=G), "block")
    o2 = torch.tensor([0, 7, 15, 20], dtype=torch.int32)
    assert torch.equal(compiled(x8, W8, sx, SW, o2), call(x8, W8, sx, SW, o2))


def test_the_cuda_path_compiles_one_kernel_per_layout_width_and_weight_dtype():
    spec = grouped_scaled_spec("contiguous", 2048, 7168)
    assert (spec.m, spec.n, spec.k, spec.groups, spec.group_layout, spec.scaling.mode, str(spec.b_dtype)) == \
        ("M", 2048, 7168, "E", "contiguous", "block", "f8e4m3")
    assert spec.scale_shapes == (("M", 56), ("E", 16, 56))
    assert str(grouped_scaled_spec("masked", 7168, 2048, torch.float8_e5m2).b_dtype) == "f8e5m2"
    with pytest.raises(SpecError, match="torch.float8_e4m3fn or torch.float8_e5m2"):
        grouped_scaled_spec("masked", 7168, 2048, torch.bfloat16)
