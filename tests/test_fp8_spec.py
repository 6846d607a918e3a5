"""fp8 in the spec and the DSL: GemmSpec's dtypes and Scaling, `gemmc.scaled(x, sx)`, the scale shapes each
scaling takes, and every refusal naming what gemmc takes instead."""
import pytest
from hypothesis import given, strategies as st

import gemmc
from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Scaling, SpecError, TraceError
from gemmc.spec import scale_shapes
from gemmc.types import DType

T = gemmc.Tensor
f8, e5, f32, bf16 = gemmc.f8e4m3, gemmc.f8e5m2, gemmc.f32, gemmc.bf16


# ---- GemmSpec ----------------------------------------------------------------------------------

def test_fp8_spec_defaults_b_dtype_out_bf16_and_names_the_scales():
    s = GemmSpec(m="M", n=4096, k=4096, dtype="f8e4m3", scaling="row")
    assert (s.dtype, s.b_dtype, s.out_dtype, s.acc_dtype) == (DType.f8e4m3, DType.f8e4m3, DType.bf16, DType.f32)
    assert s.scaling == Scaling("row", "scale_a", "scale_b") and s.is_fp8 and s.has_epilogue
    assert s.scale_shapes == (("M",), (4096,))
    s = GemmSpec(m=64, n=300, k=1000, dtype="f8e4m3", b_dtype="float8_e5m2", out_dtype="f16",
                 scaling=Scaling("block", "sx", "sw"))
    assert (s.b_dtype, s.out_dtype) == (DType.f8e5m2, DType.f16)
    assert s.scale_shapes == ((64, 8), (3, 8))         # ceil(1000 / 128) = 8 k-blocks, ceil(300 / 128) = 3
    assert GemmSpec(dtype="f8e4m3", scaling="tensor").scale_shapes == ((1,), (1,))


def test_bf16_specs_are_unchanged():
    """A bf16 spec's new fields resolve to what it always meant: B has A's dtype, no scaling."""
    s = GemmSpec(m=64, n=64, k=64)
    assert (s.b_dtype, s.scaling, s.is_fp8, s.scale_shapes) == (DType.bf16, None, False, ((), ()))
    assert s == GemmSpec(m=64, n=64, k=64, b_dtype="bf16") and not s.has_epilogue


@pytest.mark.parametrize("kw,needle", [
    (dict(dtype="f8e4m3"), "f8e4m3 inputs need scales: pass scaling='tensor', 'row' or 'block'"),
    (dict(scaling="row"), "scaling='row' with bf16 inputs: scales dequantize fp8 operands"),
    (dict(dtype="f8e5m2", scaling="row"), "A is f8e4m3 and B f8e4m3 or f8e5m2"),
    (dict(dtype="f8e4m3", b_dtype="bf16", scaling="row"), "fp8 operands f8e4m3 @ bf16"),
    (dict(b_dtype="f16"), "b_dtype='f16' with dtype='bf16': the tensor cores have no mixed"),
    (dict(dtype="f8e4m3", scaling="row", out_dtype="f8e4m3"), "output dtype f8e4m3 is not supported (fp8 is an "
     "operand dtype only"),
    (dict(dtype="f8e4m3", scaling="row", acc_dtype="f16"), "acc_dtype='f16' (use 'f32': fp8 MMAs accumulate in f32)"),
    (dict(dtype="f8e4m3", scaling="row", gate="silu"), "gate='silu' (use gate=None: a gated fp8 kernel is not built"),
    (dict(dtype="f8e4m3", scaling="row", batch=4), "batch=4 (use batch=None"),
    (dict(dtype="f8e4m3", scaling="row", groups=8, group_layout="contiguous"), "groups=8 with row scaling (use "
     "scaling='block': grouped fp8 GEMMs are built with DeepSeek-V3's block scales"),
    (dict(dtype="f8e4m3", scaling="tensor", groups="E", group_layout="masked"), "per-tensor and per-row scales of "
     "a grouped GEMM are not built"),
    (dict(dtype="f8e4m3", scaling="block", groups=8, group_layout="contiguous", gate="silu"), "gate='silu' (use "
     "gate=None: a gated fp8 kernel is not built (block scaling would need two promoting accumulator chains)"),
    (dict(dtype="f8e4m3", scaling="block", n="N"), "n='N' (use a static N: the block scales' shape"),
    (dict(dtype="f8e4m3", scaling="block", k="K"), "k='K' (use a static K"),
    (dict(dtype="f8e4m3", scaling="colwise"), "scaling mode 'colwise': use one of ('tensor', 'row', 'block')"),
    (dict(dtype="f8e4m3", scaling=Scaling("row", "bias", "sw"), inputs=(EpilogueInput("bias", "row"),),
          epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),)), "scale input 'bias' has the name of an "
     "epilogue input"),
])
def test_spec_refuses_what_an_fp8_gemm_cannot_be(kw, needle):
    with pytest.raises(SpecError) as err:
        GemmSpec(**{"m": 256, "n": 256, "k": 256, **kw})
    assert needle in str(err.value)


@pytest.mark.parametrize("args,needle", [(("row", "s", "s"), "both named 's'"),
                                         (("row", "out", "sw"), "a='out' names a scale input"),
                                         (("row", "sx", "lambda"), "b='lambda' names a scale input")])
def test_scaling_names_two_distinct_identifiers(args, needle):
    with pytest.raises(SpecError, match=needle):
        Scaling(*args)


@given(m=st.one_of(st.just("M"), st.integers(1, 5000)), n=st.integers(1, 5000), k=st.integers(1, 5000),
       mode=st.sampled_from(["tensor", "row", "block"]))
def test_scale_shapes_count_rows_and_128_blocks(m, n, k, mode):
    sa, sb = scale_shapes(mode, m, n, k)
    if mode == "tensor":
        assert sa == sb == (1,)
    elif mode == "row":
        assert (sa, sb) == ((m,), (n,))
    else:
        kb = (k + 127) // 128
        assert sa == (m, kb) and sb == ((n + 127) // 128, kb)
        assert (kb - 1) * 128 < k <= kb * 128      # every K element in exactly one block


# ---- the DSL -----------------------------------------------------------------------------------

def test_scaled_matmul_traces_into_the_spec():
    @gemmc.kernel
    def linear(x: T[("M", 4096), f8], w: T[(1024, 4096), f8], sx: T[("M",), f32], sw: T[(1024,), f32],
               bias: T[(1024,), bf16]):
        return gemmc.relu(gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T + bias)
    s = linear.spec
    assert (s.m, s.n, s.k, s.a_layout, s.b_layout) == ("M", 1024, 4096, "mk", "nk")
    assert s.scaling == Scaling("row", "sx", "sw") and s.out_dtype == DType.bf16
    assert [i.name for i in s.inputs] == ["bias"] and [o.op for o in s.epilogue] == ["add", "relu"]
    assert linear.operands == {"a": "x", "b": "w", "scale_a": "sx", "scale_b": "sw"}
    assert linear.launch_args("X", "W", "SX", "SW", "BIAS") == ("X", "W", "SX", "SW", "BIAS")
    assert linear.launch_args(bias=1, sw=2, sx=3, w=4, x=5) == (5, 4, 3, 2, 1)
    # the same problem written as a GemmSpec
    assert s == GemmSpec(m="M", n=1024, k=4096, dtype="f8e4m3", scaling=Scaling("row", "sx", "sw"),
                         inputs=(EpilogueInput("bias", "row", "bf16"),),
                         epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                                   EpilogueOp("relu", (Ref.node(0),))), name="linear")


@pytest.mark.parametrize("sa,sb", [((), ()), ((1,), (1,)), ((), (1,)), (("M",), (512,)), (("M", 8), (4, 8))])
def test_the_scale_shapes_say_the_scaling(sa, sb):
    mode = {(): "tensor", (1,): "tensor", ("M",): "row", ("M", 8): "block"}[sa]

    @gemmc.kernel
    def mm(x: T[("M", 1024), f8], w: T[(512, 1024), e5], sx: T[sa, f32], sw: T[sb, f32]):
        return (gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T).to(gemmc.f32)
    assert mm.spec.scaling.mode == mode and mm.spec.b_dtype == DType.f8e5m2 and mm.spec.out_dtype == DType.f32
    # a per-tensor scale declared () reaches the kernel as its (1,) view
    assert dict(mm.call_signature.declared) == {n: () for n, shape in (("sx", sa), ("sw", sb)) if shape == ()}


def test_a_one_row_problem_takes_a_length_one_row_scale():
    @gemmc.kernel
    def decode(x: T[(1, 256), f8], w: T[(512, 256), f8], sx: T[(1,), f32], sw: T[(512,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    assert decode.spec.scaling.mode == "row"


def _trace_error(fn) -> str:
    with pytest.raises(TraceError) as err:
        gemmc.kernel(fn)
    return str(err.value)


def test_wrong_scale_shapes_name_the_shapes_gemmc_takes():
    def f(x: T[("M", 1024), f8], w: T[(512, 1024), f8], sx: T[("M",), f32], sw: T[(1,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    msg = _trace_error(f)
    assert "scale shapes sx (M,) and sw (1,) name no scaling gemmc takes" in msg
    assert "per tensor () and (), per row (M,) and (512,), or per block (M, 8) and (4, 8)" in msg

    def g(x: T[("M", "K"), f8], w: T[(512, "K"), f8], sx: T[("M", 8), f32], sw: T[(4, 8), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    assert "per block (M, ceil(K/128)) and (4, ceil(K/128)) (block scales need a static N and K)" in _trace_error(g)


@pytest.mark.parametrize("body,needle", [
    (lambda x, w, sx, sw: x @ w.T, "fp8 operand(s) x, w without scales"),
    (lambda x, w, sx, sw: gemmc.scaled(x, sx) @ w.T, "only one matmul operand has a scale (w has none)"),
    (lambda x, w, sx, sw: gemmc.scaled(x, sx) @ gemmc.scaled(w, sx).T, "sx scales both operands"),
    (lambda x, w, sx, sw: gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T + sx, "the scale sx is also used"),
    (lambda x, w, sx, sw: gemmc.scaled(gemmc.scaled(x, sx), sw) @ w.T, "x already has the scale sx"),
    (lambda x, w, sx, sw: gemmc.scaled(x, 2.0) @ gemmc.scaled(w, sw).T, "the scale 2.0 is not a traced tensor"),
])
def test_dsl_refuses_scales_used_wrongly(body, needle):
    def f(x: T[("M", 256), f8], w: T[(512, 256), f8], sx: T[("M",), f32], sw: T[(512,), f32]):
        return body(x, w, sx, sw)
    assert needle in _trace_error(f)


def test_dsl_refuses_scales_of_bf16_operands_and_non_f32_scales():
    def plain(x: T[("M", 256), bf16], w: T[(512, 256), bf16], sx: T[("M",), f32], sw: T[(512,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    assert "gemmc.scaled on the bf16 operand x: scales dequantize fp8 operands" in _trace_error(plain)

    def bf16_scale(x: T[("M", 256), f8], w: T[(512, 256), f8], sx: T[("M",), bf16], sw: T[(512,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    assert "the scale sx is bf16: scales are f32" in _trace_error(bf16_scale)

    def mixed(x: T[("M", 256), f8], w: T[(512, 256), bf16], sx: T[("M",), f32], sw: T[(512,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    assert "matmul of f8e4m3 @ bf16: fp8 matmuls take an f8e4m3 A" in _trace_error(mixed)

    def e5m2_a(x: T[("M", 256), e5], w: T[(512, 256), f8], sx: T[("M",), f32], sw: T[(512,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    assert "matmul of f8e5m2 @ f8e4m3" in _trace_error(e5m2_a)

    def f16_acc(x: T[("M", 256), f8], w: T[(512, 256), f8], sx: T[("M",), f32], sw: T[(512,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    with pytest.raises(TraceError, match="accumulator dtype f16 with fp8 inputs"):
        gemmc.kernel(f16_acc, acc_dtype=gemmc.f16)


@given(m=st.one_of(st.just("M"), st.integers(1, 2048)), n=st.integers(1, 2048), k=st.integers(1, 2048),
       mode=st.sampled_from(["tensor", "row", "block"]), b_dtype=st.sampled_from([f8, e5]),
       transposed_scale_a=st.booleans())
def test_any_problem_traces_with_its_scale_shapes_and_refuses_others(m, n, k, mode, b_dtype, transposed_scale_a):
    sa, sb = scale_shapes(mode, m, n, k)

    def f(x: T[(m, k), f8], w: T[(n, k), b_dtype], sx: T[sa, f32], sw: T[sb, f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    spec = gemmc.kernel(f).spec
    assert spec.scale_shapes == (sa, sb) and spec.b_dtype == b_dtype
    # the same scaling always (a 1-row or 1-column problem's length-1 row scales read as per tensor)
    assert spec.scaling.mode == mode or (mode == "row" and (1,) == sa == sb)
    # one scale of another shape: refused, naming the shapes gemmc takes
    wrong = sa + (3,) if len(sa) < 2 else (sa[0], sa[1] + 1)

    def g(x: T[(m, k), f8], w: T[(n, k), b_dtype], sx: T[wrong, f32], sw: T[sb, f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    if not (mode == "tensor" and wrong == (1, 3) and sb == (1,)):
        assert "name no scaling gemmc takes" in _trace_error(g)


def test_scaled_on_torch_tensors_dequantizes():
    import torch
    x = torch.randn(4, 256).to(torch.float8_e4m3fn)
    row = torch.rand(4) + 0.5
    assert torch.equal(gemmc.scaled(x, row), x.float() * row[:, None])
    assert torch.equal(gemmc.scaled(x, torch.tensor(2.0)), x.float() * 2.0)
    blocks = torch.rand(4, 2) + 0.5
    want = x.float() * torch.cat([blocks[:, :1].expand(4, 128), blocks[:, 1:].expand(4, 128)], dim=1)
    assert torch.equal(gemmc.scaled(x, blocks), want)
