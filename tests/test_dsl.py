"""@gemmc.kernel tracing: every construct, every error (with its source line), spec equality, fuzzing."""
import inspect
import linecache
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

import gemmc
from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, TraceError
from gemmc.types import DType

T = gemmc.Tensor
bf16, f16, f32 = gemmc.bf16, gemmc.f16, gemmc.f32
acc, node, inp, const = Ref.acc(), Ref.node, Ref.input, Ref.const


def ops(k):
    return [(o.op, o.args, o.attrs) for o in k.spec.epilogue]


# ---- the matmul forms ------------------------------------------------------------------------

def test_a_at_b_is_kn():
    @gemmc.kernel
    def mm(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return a @ b
    s = mm.spec
    assert (s.m, s.n, s.k, s.a_layout, s.b_layout, s.batch) == ("M", "N", "K", "mk", "kn", None)
    assert (s.dtype, s.out_dtype, s.acc_dtype) == (DType.bf16, DType.bf16, DType.f32)
    assert s.epilogue == () and s.inputs == () and s.name == "mm"
    assert mm.operands == {"a": "a", "b": "b"}


def test_a_at_bT_is_nk_with_static_dims():
    @gemmc.kernel
    def linear(x: T[("M", 4096), f16], w: T[(11008, 4096), f16]):
        return x @ w.T
    s = linear.spec
    assert (s.m, s.n, s.k, s.a_layout, s.b_layout, s.dtype) == ("M", 11008, 4096, "mk", "nk", DType.f16)
    assert linear.operands == {"a": "x", "b": "w"}


def test_aT_at_b_is_km_and_aT_at_bT():
    @gemmc.kernel
    def tn(a: T[("K", "M"), bf16], b: T[("K", "N"), bf16]):
        return a.T @ b

    @gemmc.kernel
    def tt(a: T[(512, 256), bf16], b: T[(128, 512), bf16]):
        return a.t() @ b.T
    assert (tn.spec.a_layout, tn.spec.b_layout, tn.spec.m, tn.spec.k) == ("km", "kn", "M", "K")
    assert (tt.spec.a_layout, tt.spec.b_layout, tt.spec.m, tt.spec.n, tt.spec.k) == ("km", "nk", 256, 128, 512)


def test_batched_matmul_with_mT():
    @gemmc.kernel
    def bmm(a: T[("L", "M", "K"), bf16], b: T[("L", "N", "K"), bf16]):
        return a @ b.mT
    s = bmm.spec
    assert (s.batch, s.m, s.n, s.k, s.b_layout) == ("L", "M", "N", "K", "nk")


def test_acc_dtype_and_name_options():
    @gemmc.kernel(acc_dtype=gemmc.f16, name="half_gemm")
    def g(a: T[("M", "K"), f16], b: T[("K", "N"), f16]):
        return a @ b
    assert g.spec.acc_dtype == DType.f16 and g.spec.name == "half_gemm"


# ---- epilogue constructs ---------------------------------------------------------------------

def test_scalar_constants_and_reflected_ops():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        y = 2 * y
        y = y + 1
        y = 3 - y
        y = y / 4
        y = 1 / y
        y = -y
        return y
    assert ops(g) == [("mul", (const(2), acc), ()), ("add", (node(0), const(1)), ()),
                      ("sub", (const(3), node(1)), ()), ("div", (node(2), const(4)), ()),
                      ("div", (const(1), node(3)), ()), ("mul", (node(4), const(-1)), ())]


def test_runtime_scalars_gemmc_scalar_and_float():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], alpha: gemmc.Scalar, beta: float):
        return alpha * (a @ b) + beta
    assert g.spec.inputs == (EpilogueInput("alpha", "scalar", DType.f32), EpilogueInput("beta", "scalar", DType.f32))
    assert ops(g) == [("mul", (inp("alpha"), acc), ()), ("add", (node(0), inp("beta")), ())]


def test_row_vector_bias_and_reflected_add():
    @gemmc.kernel
    def g(x: T[("M", 4096), bf16], w: T[(1024, 4096), bf16], bias: T[(1024,), bf16]):
        return bias + x @ w.T
    assert g.spec.inputs == (EpilogueInput("bias", "row", DType.bf16),)
    assert ops(g) == [("add", (inp("bias"), acc), ())]


def test_row_vector_declared_1xN():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], r: T[(1, "N"), f32]):
        return (a @ b) * r
    assert g.spec.inputs == (EpilogueInput("r", "row", DType.f32),)


def test_column_vector_by_index_and_by_Mx1_declaration():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], rs: T[("M",), f32], cs: T[("M", 1), f32]):
        return (a @ b) * rs[:, None] + cs
    assert g.spec.inputs == (EpilogueInput("rs", "col", DType.f32), EpilogueInput("cs", "col", DType.f32))
    assert ops(g) == [("mul", (acc, inp("rs")), ()), ("add", (node(0), inp("cs")), ())]


def test_row_vector_by_None_index():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], v: T[("N",), f32]):
        return (a @ b) - v[None, :]
    assert g.spec.inputs == (EpilogueInput("v", "row", DType.f32),)


def test_full_residual_and_batched_full():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], res: T[("M", "N"), bf16]):
        return (a @ b) + res

    @gemmc.kernel
    def h(a: T[("L", "M", "K"), bf16], b: T[("L", "K", "N"), bf16], res: T[("L", "M", "N"), f32],
          bias: T[("N",), f32]):
        return (a @ b) + res + bias
    assert g.spec.inputs == (EpilogueInput("res", "full", DType.bf16),)
    assert h.spec.inputs == (EpilogueInput("res", "full", DType.f32), EpilogueInput("bias", "row", DType.f32))
    assert h.spec.batch == "L"


def test_vector_ops_before_meeting_the_accumulator():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], u: T[("N",), f32], s: gemmc.Scalar):
        return (a @ b) + u * s
    assert ops(g) == [("mul", (inp("u"), inp("s")), ()), ("add", (acc, node(0)), ())]


@pytest.mark.parametrize("fn, op", [(gemmc.relu, "relu"), (gemmc.silu, "silu"), (gemmc.sigmoid, "sigmoid"),
                                    (gemmc.tanh, "tanh"),
                                    (lambda x: gemmc.gelu(x, approximate="tanh"), "gelu_tanh"),
                                    (lambda x: gemmc.gelu(x, approximate="none"), "gelu_erf"),
                                    (gemmc.gelu, "gelu_erf"),
                                    (lambda x: x.relu(), "relu"), (lambda x: x.sigmoid(), "sigmoid"),
                                    (lambda x: x.tanh(), "tanh")])
def test_unary_activations(fn, op):
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return fn(a @ b)
    assert ops(g) == [(op, (acc,), ())]


def test_clamp_attrs():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = gemmc.clamp(a @ b, min=0, max=6)
        y = gemmc.clamp(y, max=1.5)
        return y.clamp(min=-2)
    assert ops(g) == [("clamp", (acc,), (("min", 0.0), ("max", 6.0))), ("clamp", (node(0),), (("max", 1.5),)),
                      ("clamp", (node(1),), (("min", -2.0),))]


def test_trailing_cast_is_the_output_dtype_inner_cast_is_an_op():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return (a @ b).to(gemmc.f32)

    @gemmc.kernel
    def h(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return ((a @ b).to("bf16") * 2).half().to(f32)

    @gemmc.kernel
    def default_out(a: T[("M", "K"), f16], b: T[("K", "N"), f16], bias: T[("N",), f32]):
        return (a @ b) + bias
    assert g.spec.out_dtype == DType.f32 and g.spec.epilogue == ()
    assert h.spec.out_dtype == DType.f32
    assert ops(h) == [("cast", (acc,), (("dtype", DType.bf16),)), ("mul", (node(0), const(2)), ()),
                      ("cast", (node(1),), (("dtype", DType.f16),))]
    assert default_out.spec.out_dtype == DType.f16


def test_dead_ops_are_dropped_and_renumbered():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        unused = gemmc.relu(y) * 7  # noqa: F841
        return gemmc.silu(y + 1)
    assert ops(g) == [("add", (acc, const(1)), ()), ("silu", (node(0),), ())]


def test_ops_record_their_source_line():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return gemmc.relu(a @ b)  # the relu line
    line = _marked_line(g.fn, "# the relu line")
    assert g.spec.epilogue[0].line == f"{__file__}:{line}"


def test_future_annotations_strings_are_evaluated():
    src = ("from __future__ import annotations\nimport gemmc\n"
           "def g(a: gemmc.Tensor[('M', 'K'), gemmc.bf16], b: gemmc.Tensor[('N', 'K'), gemmc.bf16], s: float):\n"
           "    return (a @ b.T) * s\n")
    ns = {}
    exec(compile(src, "<future>", "exec"), ns)
    s = gemmc.kernel(ns["g"]).spec
    assert s.b_layout == "nk" and s.inputs == (EpilogueInput("s", "scalar"),)


# ---- traced == hand-written ------------------------------------------------------------------

def test_traced_equals_hand_written_spec():
    @gemmc.kernel
    def fused(x: T[("M", 4096), bf16], w: T[(11008, 4096), bf16], bias: T[(11008,), f32],
              scale: gemmc.Scalar, res: T[("M", 11008), bf16]):
        return (gemmc.gelu(x @ w.T + bias, approximate="tanh") * scale + res).to(gemmc.f32)

    hand = GemmSpec(
        m="M", n=11008, k=4096, dtype="bf16", out_dtype="f32", a_layout="mk", b_layout="nk",
        inputs=(EpilogueInput("bias", "row", "f32"), EpilogueInput("scale", "scalar"),
                EpilogueInput("res", "full", "bf16")),
        epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                  EpilogueOp("gelu_tanh", (Ref.node(0),)),
                  EpilogueOp("mul", (Ref.node(1), Ref.input("scale"))),
                  EpilogueOp("add", (Ref.node(2), Ref.input("res")))),
        name="fused")
    assert fused.spec == hand
    assert hash(fused.spec) == hash(hand)
    assert all(op.line for op in fused.spec.epilogue)  # lines recorded, yet not part of equality


def test_traced_equals_hand_written_batched_clamp():
    @gemmc.kernel(name="bmm_clamp")
    def g(a: T[("L", "K", "M"), f16], b: T[("L", "K", "N"), f16], cs: T[("M",), f16]):
        return gemmc.clamp(a.mT @ b * cs[:, None], min=-1.0, max=1.0)
    hand = GemmSpec(m="M", n="N", k="K", dtype="f16", a_layout="km", b_layout="kn", batch="L",
                    inputs=(EpilogueInput("cs", "col", "f16"),),
                    epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("cs"))),
                              EpilogueOp("clamp", (Ref.node(0),), (("min", -1.0), ("max", 1.0)))),
                    name="bmm_clamp")
    assert g.spec == hand


def test_traced_kernel_and_spec_lower_to_the_same_ir():
    from gemmc import compiler

    @gemmc.kernel
    def k(x: T[("M", 4096), bf16], w: T[(1024, 4096), bf16], bias: T[(1024,), f32], res: T[("M", 1024), bf16]):
        return gemmc.silu(x @ w.T + bias) * res
    hand = GemmSpec(m="M", n=1024, k=4096, b_layout="nk",
                    inputs=(EpilogueInput("bias", "row"), EpilogueInput("res", "full", "bf16")),
                    epilogue=(EpilogueOp("add", (acc, inp("bias"))), EpilogueOp("silu", (node(0),)),
                              EpilogueOp("mul", (node(1), inp("res")))), name="k")
    traced = compiler.compile(k, schedule=gemmc.Schedule(), emit="ir")
    written = compiler.compile(hand, schedule=gemmc.Schedule(), emit="ir")
    assert traced.passes == written.passes
    for after in (None,) + tuple(traced.passes):
        assert traced.ir(after=after) == written.ir(after=after)
    assert "gemm.silu" in traced.ir(after=None)


def test_numpy_scalars_are_constants():
    np = pytest.importorskip("numpy")

    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return np.float32(0.5) * (a @ b) + np.float64(2)
    assert ops(g) == [("mul", (const(0.5), acc), ()), ("add", (node(0), const(2)), ())]


# ---- calling the kernel object ---------------------------------------------------------------

def test_call_compiles_itself_once_and_passes_its_own_arguments(monkeypatch):
    calls = []

    def fake_compile(kernel, schedule="auto", arch=None, **kw):
        calls.append((kernel, schedule, arch))
        return lambda *args, out=None, **named: ("ran", args, named, out)
    fake = types.ModuleType("gemmc.compiler")
    fake.compile = fake_compile
    monkeypatch.setitem(sys.modules, "gemmc.compiler", fake)
    monkeypatch.setattr(gemmc, "compiler", fake, raising=False)
    monkeypatch.setattr("gemmc.runtime.visible_arch", lambda: "sm_90a")

    @gemmc.kernel
    def g(bias: T[("N",), f32], x: T[("M", "K"), bf16], w: T[("N", "K"), bf16], s: gemmc.Scalar = 2.0):
        return (x @ w.T + bias) * s
    assert g.params == ["bias", "x", "w", "s"]
    assert g.launch_args("B", "X", "W", 2.0) == ("X", "W", "B", 2.0)
    assert g.launch_args("B", "X", "W") == ("X", "W", "B", 2.0)        # the default
    assert g("B", "X", "W", s=3.0) == ("ran", ("B", "X", "W"), {"s": 3.0}, None)
    assert g("B2", "X2", "W2", out="O") == ("ran", ("B2", "X2", "W2"), {}, "O")
    assert calls == [(g, "auto", "sm_90a")]  # compiled lazily, once, for the visible GPU


def test_launch_args_that_do_not_bind_raise_launch_errors():
    @gemmc.kernel
    def g(x: T[("M", "K"), bf16], w: T[("N", "K"), bf16]):
        return x @ w.T
    with pytest.raises(gemmc.LaunchError, match=r"g takes 2 arguments \(x, w\), got 3 positional"):
        g.launch_args(1, 2, 3)
    with pytest.raises(gemmc.LaunchError, match=r"g: missing argument 'w'; call it as g\(x, w\)"):
        g.launch_args(1)


def test_kernel_spec_is_what_compile_reads():
    @gemmc.kernel
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return a @ b
    assert isinstance(g, gemmc.Kernel) and isinstance(g.spec, GemmSpec)
    assert g.__name__ == "g" and g.fn.__name__ == "g"


def test_elementwise_functions_run_on_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0])
    assert torch.equal(gemmc.relu(x), torch.relu(x))
    assert torch.allclose(gemmc.gelu(x, approximate="tanh"), torch.nn.functional.gelu(x, approximate="tanh"))
    assert torch.equal(gemmc.clamp(x, min=-1, max=1), x.clamp(-1, 1))


# ---- errors: each names the construct and the user's source line -----------------------------

def _marked_line(fn, marker="# error here") -> int:
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, f"test bug: marker {marker!r} found {len(hits)} times"
    return hits[0]


def expect_error(fn, *words, marker="# error here", **kernel_kw):
    with pytest.raises(TraceError) as info:
        gemmc.kernel(fn, **kernel_kw)
    msg = str(info.value)
    line = _marked_line(fn, marker)
    assert f"test_dsl.py:{line}:" in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    src = linecache.getline(__file__, line).strip()
    assert src in msg  # the offending source text is quoted
    return msg


def test_error_two_matmuls():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], c: T[("M", "K"), bf16], d: T[("K", "N"), bf16]):
        y = a @ b
        return y + c @ d  # error here
    msg = expect_error(g, "second matmul")
    assert f"first is at {__file__}:{_marked_line(g) - 1}" in msg


def test_error_matmul_of_epilogue_value():
    def g(a: T[("M", "K"), bf16], b: T[("K", "K"), bf16], c: T[("K", "N"), bf16]):
        y = gemmc.relu(a @ b)
        return y @ c  # error here
    expect_error(g, "matmul of an epilogue value")


@pytest.mark.parametrize("method", ["sum", "max", "mean"])
def test_error_reductions(method):
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        return getattr(y, method)()  # error here
    expect_error(g, f"reduction `.{method}()`")


def test_error_indexing():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        return y[:, :128]  # error here
    expect_error(g, "indexing", "[:, :128]")


def test_error_bias_of_length_K_instead_of_N():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], bias: T[("K",), f32]):
        y = a @ b
        return y + bias  # error here
    expect_error(g, "shape mismatch in `+`", "bias (K,)", "(N,)")


def test_error_column_vector_used_bare():
    def g(a: T[(256, 64), bf16], b: T[(64, 512), bf16], cs: T[(256,), f32]):
        return (a @ b) * cs  # error here
    expect_error(g, "shape mismatch in `*`", "cs (256,)", "col[:, None]")


def test_error_dtype_mix_bf16_f16():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), f16]):
        return a @ b  # error here
    expect_error(g, "mixes dtypes bf16 @ f16")


def test_error_fp8_inputs_without_scales():
    def g(a: T[("M", "K"), "f8e4m3"], b: T[("K", "N"), "f8e4m3"]):
        return a @ b  # error here
    expect_error(g, "fp8 operand(s) a, b without scales", "gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T")


def test_error_f16_accumulate_with_bf16():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return a @ b  # error here
    expect_error(g, "f16 accumulation with bf16", acc_dtype="f16")


def test_error_matmul_K_mismatch():
    def g(a: T[("M", 4096), bf16], b: T[(2048, "N"), bf16]):
        return a @ b  # error here
    expect_error(g, "matmul dimension mismatch", "K of a (M, 4096) is 4096", "K of b (2048, N) is 2048")


def test_error_returning_raw_input():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b  # noqa: F841
        return a  # error here
    expect_error(g, "returns its input a unchanged")


def test_error_returning_something_not_from_the_matmul():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16], bias: T[("N",), f32]):
        y = a @ b  # noqa: F841
        return bias * 2  # error here
    expect_error(g, "does not depend on the matmul")


def test_error_no_matmul():
    def g(a: T[("M", "N"), bf16], b: T[("M", "N"), bf16]):
        return a + b  # error here
    expect_error(g, "no matmul")


def test_error_if_on_traced_value():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        if y > 0:  # error here
            return y
        return -y
    expect_error(g, "comparison `>`", "python control flow")


def test_error_bool_of_traced_value():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        ok = bool(y)  # error here
        return y if ok else -y
    expect_error(g, "bool()", "python control flow")


def test_error_prologue_op_before_matmul():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return gemmc.relu(a) @ b  # error here
    expect_error(g, "prologue")


def test_error_missing_annotation():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16],
          bias):  # error here
        return a @ b + bias
    expect_error(g, "parameter bias has no annotation", "gemmc.Tensor")


def test_error_unused_parameter():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16],
          bias: T[("N",), f32]):  # error here
        return a @ b
    expect_error(g, "parameter bias is never used")


def test_error_reserved_input_name():
    def g(x: T[("M", "K"), bf16], w: T[("K", "N"), bf16],
          b: T[("N",), f32]):  # error here
        return x @ w + b
    expect_error(g, "'b'", "reserved", "rename")


def test_error_vector_used_as_row_and_column():
    def g(a: T[(64, 32), bf16], b: T[(32, 64), bf16], v: T[(64,), f32]):
        y = (a @ b) + v
        return y * v[:, None]  # error here
    expect_error(g, "parameter v is used as both col and row")


def test_error_full_input_without_batch_dim():
    def g(a: T[("L", "M", "K"), bf16], b: T[("L", "K", "N"), bf16], res: T[("M", "N"), bf16]):
        return (a @ b) + res  # error here
    expect_error(g, "full input res", "batch dim")


def test_error_T_of_batched_and_transpose_of_epilogue_value():
    def g(a: T[("L", "M", "K"), bf16], b: T[("L", "N", "K"), bf16]):
        return a @ b.T  # error here
    expect_error(g, "`.T` of the batched tensor b", ".mT")

    def h(a: T[("M", "K"), bf16], b: T[("K", "M"), bf16]):
        y = a @ b
        return y.T  # error here
    expect_error(h, "transpose `.T` of an epilogue value")


def test_error_unsupported_operator_and_torch_function():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return (a @ b) ** 2  # error here
    expect_error(g, "operator `**`")
    torch = pytest.importorskip("torch")

    def h(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        return torch.relu(a @ b)  # error here
    expect_error(h, "torch.relu", "gemmc")


@pytest.mark.parametrize("name", ["relu", "silu", "leaky_relu", "gelu"])
def test_error_torch_functional_points_at_the_users_line(name):
    torch = pytest.importorskip("torch")

    def g(a: T[("M", "K"), bf16], b: T[("N", "K"), bf16]):
        return getattr(torch.nn.functional, name)(a @ b.T)  # error here
    expect_error(g, f"torch.{name} on a traced tensor")


def test_error_unknown_gemmc_dtype_points_at_the_users_line():
    def g(a: T[("M", "K"), bf16], b: T[("N", "K"), bf16]):
        return (a @ b.T).to(gemmc.int8)  # error here
    expect_error(g, "AttributeError", "int8")


def test_error_fp8_output_dtype():
    def g(a: T[("M", "K"), bf16], b: T[("N", "K"), bf16]):
        return (a @ b.T).to(gemmc.f8e4m3)  # error here
    expect_error(g, "output dtype f8e4m3: use bf16, f16 or f32")


def test_error_operand_named_out():
    def g(out: T[("M", "K"), bf16],  # error here
          b: T[("N", "K"), bf16]):
        return out @ b.T
    expect_error(g, "operand named 'out'", "rename")


def test_error_from_user_code_points_at_its_line():
    def g(a: T[("M", "K"), bf16], b: T[("K", "N"), bf16]):
        y = a @ b
        return y + undefined_name  # error here  # noqa: F821
    expect_error(g, "NameError", "undefined_name")


def test_error_same_param_both_operands_and_matmul_of_scalar():
    def g(a: T[("M", "K"), bf16]):
        return a @ a.T  # error here
    expect_error(g, "both matmul operands")

    def h(a: T[("M", "K"), bf16], s: gemmc.Scalar):
        return a @ s  # error here
    expect_error(h, "scalar")


# ---- fuzz: random epilogue chains (and DAGs) trace back to exactly the ops they spell --------------------

_OPERANDS = {  # name -> (source text, EpilogueInput)
    "s": ("s", EpilogueInput("s", "scalar", DType.f32)),
    "bias": ("bias", EpilogueInput("bias", "row", DType.f32)),
    "col": ("col[:, None]", EpilogueInput("col", "col", DType.f32)),
    "res": ("res", EpilogueInput("res", "full", DType.bf16)),
}
_PARAM_DECL = {"s": "gemmc.Scalar", "bias": "T[('N',), gemmc.f32]", "col": "T[('M',), gemmc.f32]",
               "res": "T[('M', 'N'), gemmc.bf16]"}
_UNARY_SRC = {"relu": "gemmc.relu({})", "silu": "gemmc.silu({})", "sigmoid": "gemmc.sigmoid({})",
              "tanh": "gemmc.tanh({})", "gelu_tanh": "gemmc.gelu({}, approximate='tanh')",
              "gelu_erf": "gemmc.gelu({}, approximate='none')"}
_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

_binary_step = st.tuples(st.just("bin"), st.sampled_from(sorted(_BIN)),
                         st.sampled_from(["const", "earlier"] + sorted(_OPERANDS)), st.booleans(),
                         st.floats(-8, 8, allow_nan=False, allow_infinity=False), st.integers(0, 64))
_unary_step = st.tuples(st.just("un"), st.sampled_from(sorted(_UNARY_SRC)))
_clamp_step = st.tuples(st.just("clamp"), st.one_of(st.none(), st.floats(-4, 0)), st.one_of(st.none(), st.floats(0, 4))
                        ).filter(lambda t: t[1] is not None or t[2] is not None)
_cast_step = st.tuples(st.just("cast"), st.sampled_from(["bf16", "f16", "f32"]))
_steps = st.lists(st.one_of(_binary_step, _unary_step, _clamp_step, _cast_step), max_size=8)


@given(steps=_steps, layout=st.sampled_from(["a @ b", "a @ b.T"]))
def test_fuzz_epilogue_chains_trace_exactly(steps, layout):
    body, expected, used = ["v0 = y"], [], []  # v{i}: the value after step i (v0: the accumulator)
    cur = Ref.acc()
    for step in steps:
        if step[0] == "bin":
            _, op, what, reflected, c, pick = step
            if what == "const":
                text, ref = repr(c), Ref.const(c)
            elif what == "earlier":  # reuse an earlier value: the epilogue is a DAG, not only a chain
                j = pick % (len(expected) + 1)
                text, ref = f"v{j}", (Ref.acc() if j == 0 else Ref.node(j - 1))
            else:
                text, ref = _OPERANDS[what][0], Ref.input(what)
                used.append(what)
            args = (ref, cur) if reflected else (cur, ref)
            expr = f"{text} {_BIN[op]} y" if reflected else f"y {_BIN[op]} {text}"
            body.append(f"y = {expr}")
            expected.append(EpilogueOp(op, args))
        elif step[0] == "un":
            body.append("y = " + _UNARY_SRC[step[1]].format("y"))
            expected.append(EpilogueOp(step[1], (cur,)))
        elif step[0] == "clamp":
            lo, hi = step[1], step[2]
            kw = ", ".join(f"{k}={v!r}" for k, v in (("min", lo), ("max", hi)) if v is not None)
            body.append(f"y = gemmc.clamp(y, {kw})")
            expected.append(EpilogueOp("clamp", (cur,), tuple((k, v) for k, v in (("min", lo), ("max", hi))
                                                              if v is not None)))
        else:
            body.append(f"y = y.to(gemmc.{step[1]})")
            expected.append(EpilogueOp("cast", (cur,), (("dtype", DType(step[1])),)))
        cur = Ref.node(len(expected) - 1)
        body.append(f"v{len(expected)} = y")
    out_dtype = DType.bf16
    if expected and expected[-1].op == "cast":  # a trailing cast is the output dtype
        out_dtype = expected.pop().attr("dtype")
    params = [p for p in _OPERANDS if p in used]
    b_decl = "T[('K', 'N'), gemmc.bf16]" if layout == "a @ b" else "T[('N', 'K'), gemmc.bf16]"
    sig = ", ".join(["a: T[('M', 'K'), gemmc.bf16]", f"b: {b_decl}"] + [f"{p}: {_PARAM_DECL[p]}" for p in params])
    src = f"def fuzzed({sig}):\n    y = {layout}\n" + "".join(f"    {line}\n" for line in body) + "    return y\n"
    ns = {"gemmc": gemmc, "T": T}
    exec(compile(src, "<fuzz>", "exec"), ns)
    spec = gemmc.kernel(ns["fuzzed"]).spec
    want = GemmSpec(m="M", n="N", k="K", dtype="bf16", out_dtype=out_dtype,
                    b_layout="kn" if layout == "a @ b" else "nk",
                    inputs=tuple(_OPERANDS[p][1] for p in params), epilogue=tuple(expected), name="fuzzed")
    assert spec == want, src
