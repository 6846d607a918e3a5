"""Grouped GEMMs (mixture-of-experts) on the CPU: the spec's and the DSL's rules and errors."""
import pytest
import torch
from hypothesis import given, strategies as st

import gemmc
from gemmc.errors import SpecError, TraceError
from gemmc.spec import GROUP_LAYOUTS, EpilogueInput, EpilogueOp, GemmSpec, Ref

CONTIGUOUS = GemmSpec(m="M", n=4096, k=7168, groups=256, group_layout="contiguous", name="experts")
MASKED = GemmSpec(m="M", n=4096, k=7168, groups="E", group_layout="masked", name="decode_experts")


# ---- the spec ----------------------------------------------------------------------------------

def test_grouped_spec_facts():
    assert CONTIGUOUS.grouped and CONTIGUOUS.group_operand == "offsets" and CONTIGUOUS.groups == 256
    assert MASKED.grouped and MASKED.group_operand == "counts" and MASKED.groups == "E"
    plain = GemmSpec(m="M", n=4096, k=7168)
    assert not plain.grouped and plain.group_operand is None
    assert GemmSpec(n=64, k=64, groups=4, group_layout="masked", gate="silu").b_rows == 128


def test_plain_specs_keep_their_fields_and_equality():
    """A spec without groups is the one it always was: equal and hashed alike whatever the new fields are."""
    assert GemmSpec(m="M", n=256, k=128) == GemmSpec(m="M", n=256, k=128, groups=None, group_layout=None)
    assert hash(GemmSpec(m=8, n=256, k=128)) == hash(GemmSpec(m=8, n=256, k=128, groups=None))
    assert GemmSpec(n=256, k=128, groups=4, group_layout="masked") != GemmSpec(n=256, k=128, batch=4)


@pytest.mark.parametrize("kw, needle", [
    (dict(groups=8), "group_layout='contiguous'"),
    (dict(groups=8, group_layout="ragged"), "group_layout='ragged'"),
    (dict(group_layout="masked"), "needs groups=E"),
    (dict(groups=0, group_layout="masked"), "groups=0 must be positive"),
    (dict(groups="8x", group_layout="masked"), "identifier"),
    (dict(groups=8, group_layout="contiguous", a_layout="km"), "a_layout='km'"),
    (dict(groups=8, group_layout="contiguous", batch=2), "batch=2"),
    (dict(groups=8, group_layout="masked", inputs=(EpilogueInput("bias", "row"),),
          epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),)), "['bias'] are row"),
    (dict(groups=8, group_layout="contiguous", inputs=(EpilogueInput("offsets", "scalar"),),
          epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("offsets"))),)), "rename the input"),
])
def test_spec_refuses_what_a_grouped_gemm_cannot_be(kw, needle):
    with pytest.raises(SpecError) as e:
        GemmSpec(m="M", n=256, k=128, **kw)
    assert needle in str(e.value)


@given(layout=st.sampled_from(GROUP_LAYOUTS), groups=st.one_of(st.integers(1, 512), st.sampled_from(["E", "G"])),
       b_layout=st.sampled_from(["nk", "kn"]), gate=st.sampled_from([None, "silu"]), scalar=st.booleans())
def test_every_grouped_layout_takes_any_group_count_weights_and_scalars(layout, groups, b_layout, gate, scalar):
    if gate is not None:
        b_layout = "nk"
    inputs = (EpilogueInput("alpha", "scalar"),) if scalar else ()
    ops = (EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))),) if scalar else ()
    spec = GemmSpec(m="M", n=256, k=128, b_layout=b_layout, groups=groups, group_layout=layout, gate=gate,
                    inputs=inputs, epilogue=ops)
    assert spec.grouped and spec.groups == groups and spec.group_layout == layout


# ---- the DSL ------------------------------------------------------------------------------------

def test_dsl_traces_a_contiguous_grouped_gemm():
    @gemmc.kernel
    def experts(x: gemmc.Tensor[("M", 256), gemmc.bf16], w: gemmc.Tensor[("E", 512, 256), gemmc.bf16],
                offsets: gemmc.GroupOffsets["E"]):
        return gemmc.silu(gemmc.grouped_mm(x, w.mT, offsets))
    spec = experts.spec
    assert (spec.m, spec.n, spec.k, spec.groups, spec.group_layout, spec.b_layout) == \
        ("M", 512, 256, "E", "contiguous", "nk")
    assert [op.op for op in spec.epilogue] == ["silu"]
    assert experts.operands == {"a": "x", "b": "w", "offsets": "offsets"}
    assert experts.call_signature.operands == (("a", "x"), ("b", "w"), ("offsets", "offsets"))


def test_dsl_traces_a_masked_grouped_gemm_with_a_scalar_and_kn_weights():
    @gemmc.kernel
    def decode(x: gemmc.Tensor[(8, "M", 256), gemmc.bf16], w: gemmc.Tensor[(8, 256, 512), gemmc.bf16],
               counts: gemmc.GroupCounts[8], scale: gemmc.Scalar):
        return (gemmc.grouped_mm(x, w, counts) * scale).to(gemmc.f32)
    spec = decode.spec
    assert (spec.m, spec.n, spec.groups, spec.group_layout, spec.b_layout, spec.out_dtype.value) == \
        ("M", 512, 8, "masked", "kn", "f32")
    assert spec.inputs == (EpilogueInput("scale", "scalar"),)
    x, w, counts = torch.empty(8, 3, 256), torch.empty(8, 256, 512), torch.empty(8)
    assert decode.launch_args(x, w, counts, 2.0) == (x, w, counts, 2.0)
    assert decode.launch_args(counts=counts, scale=2.0, w=w, x=x)[2] is counts


def test_the_traced_spec_equals_the_hand_written_one():
    @gemmc.kernel(name="experts")
    def traced(x: gemmc.Tensor[("M", 7168), gemmc.bf16], w: gemmc.Tensor[(256, 4096, 7168), gemmc.bf16],
               offs: gemmc.GroupOffsets[256]):
        return gemmc.grouped_mm(x, w.mT, offs)
    assert traced.spec == CONTIGUOUS
    assert traced.call_signature.operands[-1] == ("offsets", "offs")


def _trace(body: str, params: str):
    scope = {"gemmc": gemmc}
    exec(f"def fn({params}):\n    return {body}\n", scope)
    return gemmc.kernel(scope["fn"])


X2 = 'x: gemmc.Tensor[("M", 256), gemmc.bf16]'
X3 = 'x: gemmc.Tensor[("E", "M", 256), gemmc.bf16]'
W3 = 'w: gemmc.Tensor[("E", 512, 256), gemmc.bf16]'
OFFS = 'offs: gemmc.GroupOffsets["E"]'
COUNTS = 'counts: gemmc.GroupCounts["E"]'


@pytest.mark.parametrize("body, params, needle", [
    ("gemmc.grouped_mm(x, w.mT, 2.0)", f"{X2}, {W3}", "third argument is constant"),
    ("gemmc.grouped_mm(x, w.mT, offs)", f'{X2}, w: gemmc.Tensor[(512, 256), gemmc.bf16], {OFFS}',
     "one weight per group"),
    ("gemmc.grouped_mm(x, w.mT, offs)", f"{X3}, {W3}, {OFFS}", "contiguous groups): declare A (M, K)"),
    ("gemmc.grouped_mm(x, w.mT, counts)", f"{X2}, {W3}, {COUNTS}", "masked groups): declare A (E, M, K)"),
    ("gemmc.grouped_mm(x, w.mT, offs)", f'{X2}, w: gemmc.Tensor[(8, 512, 256), gemmc.bf16], {OFFS}',
     "w has 8 groups"),
    ("gemmc.grouped_mm(x, w.mT, offs) + offs", f"{X2}, {W3}, {OFFS}", "pass it to gemmc.grouped_mm"),
    ("x @ w.T", f'{X2}, w: gemmc.Tensor[(512, 256), gemmc.bf16], {OFFS}', "never passed to gemmc.grouped_mm"),
    ("gemmc.grouped_mm(x, w.mT, offs) + bias", f'{X2}, {W3}, {OFFS}, bias: gemmc.Tensor[(512,), gemmc.f32]',
     "['bias'] are row"),
    ("gemmc.grouped_mm(x, w.mT, offs)", f'{X2}, w: gemmc.Tensor[("E", 512, 128), gemmc.bf16], {OFFS}',
     "dimension mismatch"),
])
def test_dsl_errors_point_at_the_grouped_matmul(body, params, needle):
    with pytest.raises(TraceError) as e:
        _trace(body, params)
    assert needle in str(e.value)


@pytest.mark.parametrize("ann, needle", [("gemmc.GroupOffsets[0]", "positive int"),
                                         ("gemmc.GroupCounts['8 experts']", "positive int")])
def test_group_annotations_check_the_group_count(ann, needle):
    with pytest.raises(TraceError, match=needle):
        eval(ann, {"gemmc": gemmc})


def test_grouped_mm_on_torch_tensors_is_the_per_group_product():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(10, 16, generator=g), torch.randn(3, 8, 16, generator=g)
    offsets = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    y = gemmc.grouped_mm(x, w.mT, offsets)
    assert torch.equal(y[:4], x[:4] @ w[0].T) and torch.equal(y[4:9], x[4:9] @ w[2].T) and not y[9].any()
    counts = torch.tensor([2, 0, 5], dtype=torch.int32)
    xm = torch.randn(3, 5, 16, generator=g)
    ym = gemmc.grouped_mm(xm, w.mT, counts)
    assert torch.equal(ym[0, :2], xm[0, :2] @ w[0].T) and not ym[0, 2:].any() and not ym[1].any()
    assert torch.equal(ym[2], xm[2] @ w[2].T)


# ---- the IR ---------------------------------------------------------------------------------------

from gemmc.errors import ScheduleError  # noqa: E402
from gemmc.ir import parse_module  # noqa: E402
from gemmc.ir.build import find_gemm, spec_of, spec_to_module  # noqa: E402
from gemmc.ir.extract import plan_from_module  # noqa: E402
from gemmc.schedule import Schedule, check_schedule  # noqa: E402


@given(layout=st.sampled_from(GROUP_LAYOUTS), groups=st.one_of(st.integers(1, 512), st.just("E")),
       b_layout=st.sampled_from(["nk", "kn"]), gate=st.sampled_from([None, "silu"]), m=st.sampled_from(["M", 64]))
def test_grouped_ir_prints_parses_and_reads_back_the_spec(layout, groups, b_layout, gate, m):
    spec = GemmSpec(m=m, n=256, k=128, b_layout="nk" if gate else b_layout, groups=groups, group_layout=layout,
                    gate=gate, name="experts")
    text = str(spec_to_module(spec, Schedule()))
    operand = spec.group_operand
    assert f"@experts(%a, %b) grouped {layout}(%{operand}) acc f32" in text
    assert f"%{operand} = gemm.arg \"{operand}\" : !gemmc.tensor<{groups} x i32, {operand}>" in text
    lead = f"{groups} x " if layout == "masked" else ""
    assert f"-> !gemmc.tensor<{lead}{m} x 256 x bf16, mn>" in text
    assert spec_of(find_gemm(parse_module(text))) == spec


def test_plain_ir_is_unchanged():
    """No group operand, no `grouped`, no segment sizes in the text: every plain kernel keeps its IR (and its
    cache key, which the final IR text is part of)."""
    k = gemmc.compile(GemmSpec(m="M", n=256, k=128), Schedule(), emit="ir")
    text = k.ir("verify-resources")
    assert "grouped" not in text and "kernel.group" not in text and "operandSegmentSizes" not in text
    assert k.ir("map-groups") == k.ir("pipeline-staging") and k.plan.groups is None


def _bad(text_a, text_b, text_g, layout="contiguous", out="M x 256 x bf16"):
    return f'''builtin.module {{
  %a = gemm.arg "a" : !gemmc.tensor<{text_a} x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<{text_b} x bf16, nk>
  %g = gemm.arg "g" : !gemmc.tensor<{text_g}>
  %out = gemm.matmul @e(%a, %b) grouped {layout}(%g) acc f32 -> !gemmc.tensor<{out}, mn> epilogue {{
  ^bb0(%acc: f32):
    gemm.yield %acc
  }}
}}'''


@pytest.mark.parametrize("text, needle", [
    (_bad("M x 128", "8 x 256 x 128", "8 x i32, offsets"), None),
    (_bad("M x 128", "8 x 256 x 128", "8 x i32, counts"), "must be a !gemmc.tensor<E x i32, offsets>"),
    (_bad("M x 128", "8 x 256 x 128", "8 x f32, offsets"), "must be a !gemmc.tensor<E x i32, offsets>"),
    (_bad("M x 128", "4 x 256 x 128", "8 x i32, offsets"), "B has leading dim 4, not E = 8"),
    (_bad("8 x M x 128", "8 x 256 x 128", "8 x i32, offsets"), "A has leading dim 8, not none"),
    (_bad("M x 128", "8 x 256 x 128", "8 x i32, counts", "masked", "8 x M x 256 x bf16"), "A has leading dim None"),
    (_bad("E x M x 128", "E x 256 x 128", "E x i32, counts", "masked", "E x M x 256 x bf16"), None),
])
def test_grouped_ir_verifies_the_group_operand_against_a_b_and_out(text, needle):
    if needle is None:
        assert spec_of(find_gemm(parse_module(text))).grouped
        return
    with pytest.raises(Exception) as e:
        parse_module(text).verify()
    assert needle in str(e.value)


def test_the_passes_decide_the_grouped_facts_and_the_plan_reads_them():
    k = gemmc.compile(GemmSpec(m="M", n=2048, k=7168, groups=256, group_layout="contiguous", gate="silu",
                               name="up"), Schedule(cluster=(2, 1), raster="n"), emit="ir")
    text = k.ir("verify-resources")
    assert "kernel.group contiguous groups 256 order n walk warp_scan descriptors shared" in text
    assert "kernel.copy out st_global" in text and "kernel.epilogue store direct" in text
    assert "pdl_prefetch_k_tiles" not in text        # nothing is read before the router's offsets are written
    g = k.plan.groups
    assert (g.layout, g.groups, g.order, g.group_walk, g.descriptors) == ("contiguous", 256, "n", "warp_scan",
                                                                          "shared")
    assert (k.plan.problem.groups, k.plan.problem.group_layout) == (256, "contiguous")
    assert plan_from_module(parse_module(text)) == k.plan
    # each fact is map-groups' alone: the IR before it has none, and a plan cannot be read without it
    before = k.ir("pipeline-staging")
    assert "kernel.group" not in before
    with pytest.raises(SpecError, match="run map-groups first"):
        plan_from_module(parse_module(before))


def test_an_edited_group_fact_or_store_is_named_by_verify_resources():
    from gemmc.ir import make_context
    from gemmc.passes import pass_pipeline
    k = gemmc.compile(GemmSpec(m="M", n=512, k=256, groups="E", group_layout="contiguous"), Schedule(),
                      emit="ir")
    text = k.ir("verify-resources").replace("order m", "order n").replace(
        "out st_global box 1x1 swizzle 0 vector 2", "out tma_store box 128x32 swizzle 64")
    with pytest.raises(ScheduleError) as e:
        pass_pipeline(["verify-resources"]).apply(make_context(), parse_module(text))
    assert "got order n; map-groups writes order m" in str(e.value)
    assert "grouped store (kernel.copy out): got tma_store" in str(e.value)
    stale = k.ir("verify-resources").replace("kernel.group contiguous", "kernel.group masked")
    with pytest.raises(Exception, match="rerun map-groups"):
        parse_module(stale).verify()


# ---- the predicate -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, needle", [
    (dict(split_k=2), "split_k=2"), (dict(swizzle=4), "swizzle=4"), (dict(stream_k=True), "stream_k=True"),
    (dict(swap_ab=True, tile=(64, 16, 128), mode="pingpong"), "swap_ab=True"),
    (dict(tile=(192, 128, 64)), "192"), (dict(tile=(128, 128, 32), arch="sm_80"), "sm_90a only"),
    # L2 fields the grouped kernel would not apply are refused, never dropped
    (dict(l2_prefetch=4), "nothing is prefetched before the PDL wait"), (dict(l2_out="last"), "no TMA store"),
])
def test_predicate_refuses_what_breaks_a_group_tile(kw, needle):
    s = Schedule(**{"tile": (128, 128, 64), **kw})
    grouped = GemmSpec(m="M", n=4096, k=7168, groups=8, group_layout="contiguous")
    problems = [str(v) for v in check_schedule(s, grouped) if "grouped" in v.limit]
    assert any(needle in p for p in problems), problems
    assert not [v for v in check_schedule(s, GemmSpec(m="M", n=4096, k=7168)) if "grouped" in v.limit]


def test_unaligned_n_or_k_is_refused_before_anything_is_lowered():
    for dims, needle in ((dict(n=250, k=128), "the output's N"), (dict(n=256, k=100), "A's contiguous dim K")):
        spec = GemmSpec(m="M", groups=8, group_layout="contiguous", **dims)
        with pytest.raises(ScheduleError, match="16-byte alignment") as e:
            gemmc.compile(spec, schedule="auto", emit="ir")
        assert needle in str(e.value)
