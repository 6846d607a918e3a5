"""The xDSL dialects: print/parse round trips, spec <-> IR, verifiers, plan extraction."""
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from xdsl.utils.exceptions import ParseError, VerifyException

from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Schedule
from gemmc.ir import make_context, parse_module, print_module
from gemmc.ir.attrs import ScheduleAttr, TensorType
from gemmc.ir.build import spec_from_module, spec_to_module
from gemmc.ir.extract import plan_from_module
from gemmc.ir.plan import KernelPlan, OperandCopy, Pipeline, TileScheduler, WarpGroup
from gemmc.passes import pass_pipeline
from gemmc.schedule import enumerate_schedules
from gemmc.types import DType
from ir_strategies import schedules, specs
from xdsl.parser import Parser

BIAS_GELU = GemmSpec(m="M", n=4096, k=4096, inputs=(EpilogueInput("bias", "row"),),
                     epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                               EpilogueOp("gelu_tanh", (Ref.node(0),)),
                               EpilogueOp("mul", (Ref.node(1), Ref.const(0.5)))))


def parse_attr(text):
    return Parser(make_context(), text).parse_attribute()


# ---- attributes -----------------------------------------------------------------------------

def test_tensor_type_text():
    t = TensorType.make(("L", "M", 4096), "bf16", "mk")
    assert str(t) == "!gemmc.tensor<L x M x 4096 x bf16, mk>"
    assert parse_attr(str(t)) == t
    assert (t.dims, t.element, t.batch) == (("L", "M", 4096), DType.bf16, "L")
    assert TensorType.make(("M", "K"), "f16", "km").batch is None
    assert str(TensorType.make((), "f32", "scalar")) == "!gemmc.tensor<f32, scalar>"


def test_tensor_type_quotes_dims_that_read_as_delimiters_or_dtypes():
    t = TensorType.make(("x", "f32"), "f32", "mn")
    assert str(t) == '!gemmc.tensor<"x" x "f32" x f32, mn>'
    assert parse_attr(str(t)) == t


@pytest.mark.parametrize("dims,dtype,layout,msg", [
    (("M", "K"), "bf16", "rowmajor", "unknown layout"),
    (("M", "K"), "int8", "mk", "unknown dtype"),
    (("M",), "bf16", "mk", "needs 2 dims"),
    (("M", "N"), "f32", "row", "needs 1 dims"),
    ((0, 8), "bf16", "mk", "must be positive"),
])
def test_tensor_type_verifier(dims, dtype, layout, msg):
    with pytest.raises(VerifyException, match=msg):
        TensorType.make(dims, dtype, layout)


@given(schedules())
def test_schedule_attr_round_trip(s):
    attr = ScheduleAttr.from_schedule(s)
    assert parse_attr(str(attr)) == attr
    assert attr.to_schedule() == s


def test_schedule_attr_text():
    attr = ScheduleAttr.from_schedule(Schedule(tile=(128, 256, 64), cluster=(2, 1), stages=4, mode="pingpong"))
    assert str(attr) == ("#gemmc.schedule<tile = 128x256x64, cluster = 2x1, stages = 4, mode = pingpong, "
                         "raster = m, swizzle = 1, split_k = 1, arch = sm_90a>")


def test_schedule_attr_says_pdl_only_when_off():
    off = ScheduleAttr.from_schedule(Schedule(split_k=2, pdl=False))
    assert str(off).endswith("split_k = 2, arch = sm_90a, pdl = false>")
    assert parse_attr(str(off)).to_schedule().pdl is False
    on = parse_attr(str(off).replace("pdl = false", "pdl = true"))
    assert on == ScheduleAttr.from_schedule(Schedule(split_k=2)) and on.to_schedule().pdl is True


def test_schedule_attr_checks_form_only():
    with pytest.raises(VerifyException, match="tile needs 3 sizes"):
        parse_attr("#gemmc.schedule<tile = 128x128, cluster = 1x1, stages = auto, mode = cooperative, "
                   "raster = m, swizzle = 1, split_k = 1, arch = sm_90a>")
    with pytest.raises(VerifyException, match="arch"):
        parse_attr("#gemmc.schedule<tile = 128x128x64, cluster = 1x1, stages = auto, mode = cooperative, "
                   "raster = m, swizzle = 1, split_k = 1, arch = sm_70>")


# ---- the gemm level -------------------------------------------------------------------------

EXPECTED_GEMM_IR = """\
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<M x 4096 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<4096 x 4096 x bf16, nk>
  %bias = gemm.arg "bias" : !gemmc.tensor<4096 x f32, row>
  %out = gemm.matmul @gemm(%a, %b) inputs(%bias) acc f32 -> !gemmc.tensor<M x 4096 x bf16, mn> epilogue {
  ^bb0(%acc: f32, %bias_1: f32):
    %0 = gemm.add %acc, %bias_1
    %1 = gemm.gelu_tanh %0
    %2 = gemm.const 0.5
    %3 = gemm.mul %1, %2
    gemm.yield %3
  }
}
"""


def test_spec_to_module_text():
    assert print_module(spec_to_module(BIAS_GELU)) == EXPECTED_GEMM_IR
    assert spec_from_module(parse_module(EXPECTED_GEMM_IR)) == BIAS_GELU


def test_layouts_batch_and_inputs_in_types():
    spec = GemmSpec(m=64, n="N", k=128, a_layout="km", b_layout="kn", batch="L",
                    inputs=(EpilogueInput("res", "full", "bf16"), EpilogueInput("g", "col"),
                            EpilogueInput("s", "scalar")),
                    epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("res"))),
                              EpilogueOp("mul", (Ref.node(0), Ref.input("g"))),
                              EpilogueOp("mul", (Ref.node(1), Ref.input("s")))))
    text = print_module(spec_to_module(spec))
    for line in ('%a = gemm.arg "a" : !gemmc.tensor<L x 128 x 64 x bf16, km>',
                 '%b = gemm.arg "b" : !gemmc.tensor<L x 128 x N x bf16, kn>',
                 '%res = gemm.arg "res" : !gemmc.tensor<L x 64 x N x bf16, full>',
                 '%g = gemm.arg "g" : !gemmc.tensor<64 x f32, col>',
                 '%s = gemm.arg "s" : !gemmc.tensor<f32, scalar>'):
        assert line in text
    assert spec_from_module(parse_module(text)) == spec


def test_clamp_and_cast_text():
    spec = GemmSpec(m=8, n=8, k=8, epilogue=(EpilogueOp("clamp", (Ref.acc(),), (("min", -1.0), ("max", 6.0))),
                                             EpilogueOp("clamp", (Ref.node(0),), (("max", 1e-5),)),
                                             EpilogueOp("cast", (Ref.node(1),), (("dtype", "f16"),))))
    text = print_module(spec_to_module(spec))
    assert "gemm.clamp %acc min -1.0 max 6.0" in text
    assert "gemm.clamp %0 max 1.0e-05" in text
    assert "gemm.cast %1 to f16" in text
    assert spec_from_module(parse_module(text)) == spec


@given(specs(), st.none() | schedules())
def test_gemm_level_round_trip(spec, schedule):
    text = print_module(spec_to_module(spec, schedule))
    module = parse_module(text)
    assert print_module(module) == text
    assert spec_from_module(module) == spec


@given(specs())
def test_kernel_level_round_trip(spec):
    # a schedule that is valid for some (aligned) version of the problem is enough to lower it
    schedule = Schedule(tile=(128, 128, 64), cluster=(2, 1))
    module = spec_to_module(spec, schedule)
    pass_pipeline(("assign-warpgroup-roles", "tma-cluster-layout", "pipeline-staging")).apply(make_context(), module)
    text = print_module(module)
    again = parse_module(text)
    assert print_module(again) == text
    assert plan_from_module(again) == plan_from_module(module)
    assert plan_from_module(again).epilogue.ops == spec.epilogue


GEMM_HEAD = """builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<M x K x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<N x K x bf16, nk>
"""


@pytest.mark.parametrize("body,msg", [
    ('%out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N2 x bf16, mn> epilogue {\n'
     '^bb0(%acc: f32):\n gemm.yield %acc\n}', "A x B is M x N but the output is M x N2"),
    ('%out = gemm.matmul @g(%b, %a) acc f32 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
     '^bb0(%acc: f32):\n gemm.yield %acc\n}', "A must be a !gemmc.tensor with layout mk or km"),
    ('%out = gemm.matmul @g(%a, %b) acc bf16 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
     '^bb0(%acc: f32):\n gemm.yield %acc\n}', "accumulator dtype bf16"),
    ('%out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
     '^bb0(%acc: f32, %x: f32):\n gemm.yield %acc\n}', "takes the accumulator and 0 input"),
    ('%out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
     '^bb0(%acc: f32):\n %0 = gemm.clamp %acc min 2.0 max 1.0\n gemm.yield %0\n}', "min 2.0 > max 1.0"),
    ('%out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
     '^bb0(%acc: f32):\n %0 = gemm.cast %acc to f8e4m3\n gemm.yield %0\n}', "use bf16, f16 or f32"),
])
def test_gemm_verifier_errors(body, msg):
    with pytest.raises(VerifyException, match=msg):
        parse_module(GEMM_HEAD + "  " + body + "\n}\n")


@pytest.mark.parametrize("b_dtype", ["f16", "f32"])
def test_a_and_b_must_share_their_element_type(b_dtype):
    # hand-edited B: the passes read the problem's dtype from A alone, so the verifier must catch it
    text = GEMM_HEAD.replace("N x K x bf16, nk", f"N x K x {b_dtype}, nk") + (
        '  %out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
        '  ^bb0(%acc: f32):\n    gemm.yield %acc\n  }\n}\n')
    with pytest.raises(VerifyException, match=f"gemm.matmul: A is bf16 but B is {b_dtype}: .* give A and B the "
                                              "same element type"):
        parse_module(text)
    with pytest.raises(VerifyException, match=f"kernel.gemm: A is bf16 but B is {b_dtype}"):
        parse_module(lowered_text(GemmSpec(m=256, n=256, k=256), Schedule()).replace(
            "256 x 256 x bf16, nk", f"256 x 256 x {b_dtype}, nk"))


@pytest.mark.parametrize("op,msg", [
    ('%c = gemm.const "inf"\n %0 = gemm.add %acc, %c', "gemm.const inf is not finite"),
    ('%0 = gemm.clamp %acc min "nan"', "gemm.clamp: min nan is not finite"),
    ('%0 = gemm.clamp %acc min 0.0 max "inf"', "gemm.clamp: max inf is not finite"),
])
def test_epilogue_constants_are_finite(op, msg):
    # as GemmSpec and the DSL: `y * float('inf')` and clamp(y, min=nan) are refused everywhere
    with pytest.raises(VerifyException, match=msg):
        parse_module(GEMM_HEAD + '  %out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn> '
                     f'epilogue {{\n^bb0(%acc: f32):\n {op}\n gemm.yield %0\n}}\n}}\n')


def test_input_with_wrong_broadcast_shape():
    text = (GEMM_HEAD + '  %v = gemm.arg "v" : !gemmc.tensor<M x f32, row>\n'
            '  %out = gemm.matmul @g(%a, %b) inputs(%v) acc f32 -> !gemmc.tensor<M x N x bf16, mn> epilogue {\n'
            '  ^bb0(%acc: f32, %x: f32):\n    gemm.yield %acc\n  }\n}\n')
    with pytest.raises(VerifyException, match=r"row input v must have dims \('N',\)"):
        parse_module(text)


def test_operand_must_be_defined_first():
    text = ('builtin.module {\n  %out = gemm.matmul @g(%a, %b) acc f32 -> !gemmc.tensor<M x N x bf16, mn> '
            'epilogue {\n  ^bb0(%acc: f32):\n    gemm.yield %acc\n  }\n}\n')
    with pytest.raises(ParseError, match="used before it is defined"):
        parse_module(text)


# ---- the kernel level -----------------------------------------------------------------------

def lowered_text(spec=BIAS_GELU, schedule=Schedule(tile=(128, 256, 64), cluster=(2, 1))):
    module = spec_to_module(spec, schedule)
    pass_pipeline().apply(make_context(), module)
    return print_module(module)


@pytest.mark.parametrize("old,new,msg", [
    ("kernel.warpgroup producer index 0 regs 40", "kernel.warpgroup producer index 0 regs 41", "multiple of 8"),
    ("kernel.warpgroup producer index 0", "kernel.warpgroup builder index 0", "role 'builder'"),
    ("kernel.warpgroup consumer index 2", "kernel.warpgroup consumer index 3", "indices"),
    ("threads 384", "threads 256", "threads 256 but the warpgroups have 384"),
    ("inst 64x256x16", "inst 128x256x16", "wgmma inst 128x256x16"),
    ("kernel.mma wgmma", "kernel.mma hmma", "kind 'hmma'"),
    ("multicast 2 along m", "multicast 2", "says along m or n"),
    ("swizzle 128 multicast", "swizzle 96 multicast", "swizzle 96"),
    ("kernel.copy out tma_store", "kernel.copy d tma_store", "unknown operand 'd'"),
    ("kernel.copy out tma_store", "kernel.copy a tma_store", "two copies of operand 'a'"),
    ("tma_store box 128x32 swizzle 64\n", "tma_store box 128x32 swizzle 64 l2 first_once\n",
     "l2 first_once is a TMA load's rule"),
    ("tma_store box 128x32 swizzle 64\n", "tma_store box 128x32 swizzle 64 l2 early\n", "l2 'early'; use one of"),
    ("ldg box 1x256 swizzle 0", "ldg box 1x256 swizzle 0 l2 last", "l2 is a TMA copy's cache hint; a ldg copy"),
    ("pdl_prefetch_k_tiles 2", "pdl_prefetch_k_tiles 2 pdl_prefetch_of a", "pdl_prefetch_of 'a'; use ab"),
    ("stages 4 barriers", "stages 0 barriers", "stages 0"),
    ("split_k 1 split_k_mode none", "split_k 2 split_k_mode none", "split_k_mode is none or stream exactly"),
    ("split_k 1 split_k_mode none", "split_k 1 split_k_mode fixup", "split_k_mode is none or stream exactly"),
    ("split_k 1 split_k_mode none", "split_k 2 split_k_mode stream", "split_k_mode is none or stream exactly"),
    ("split_k 1 split_k_mode none", "split_k 1 split_k_mode streamk", "split_k_mode 'streamk'"),
    ("split_k 1 split_k_mode none", "split_k 2 split_k_mode atomic", "split_k_mode 'atomic'"),
    ("raster m swizzle", "raster z swizzle", "raster 'z'"),
    ("kernel.epilogue store tma", "kernel.epilogue store dma", "store 'dma'"),
    ("kernel.cluster 2x1", "kernel.cluster 2x1\n    kernel.cluster 1x1", "more than one kernel.cluster"),
])
def test_kernel_verifier_errors(old, new, msg):
    text = lowered_text()
    assert old in text
    with pytest.raises(VerifyException, match=msg):
        parse_module(text.replace(old, new, 1))


def test_tile_scheduler_pdl_round_trips_and_defaults_to_plain():
    on = lowered_text()
    bands = " pdl_early_ctas 82 pdl_full_ctas 118 pdl_prefetch_k_tiles 2"     # 5/8 and 9/10 of the H200's 132 SMs
    assert f"split_k_mode none pdl true{bands} max_active_clusters 66\n" in on      # 66 resident 2-CTA clusters
    assert print_module(parse_module(on)) == on
    sched = plan_from_module(parse_module(on)).scheduler
    assert (sched.pdl_early_ctas, sched.pdl_full_ctas, sched.pdl_prefetch_k_tiles) == (82, 118, 2)
    with pytest.raises(VerifyException, match="pdl_early_ctas is >= 0, and 0 without pdl"):
        parse_module(on.replace(f" pdl true{bands}", " pdl_early_ctas 82"))
    with pytest.raises(VerifyException, match="pdl_full_ctas is 0 .none., or above pdl_early_ctas"):
        parse_module(on.replace(bands, " pdl_early_ctas 82 pdl_full_ctas 80"))
    with pytest.raises(VerifyException, match="pdl_prefetch_k_tiles is >= 0, and 0 without pdl"):
        parse_module(on.replace(f" pdl true{bands}", " pdl_prefetch_k_tiles 2"))
    with pytest.raises(VerifyException, match="pdl_prefetch_k_tiles is >= 0"):
        parse_module(on.replace("pdl_prefetch_k_tiles 2", "pdl_prefetch_k_tiles -1"))
    plain = on.replace(f" pdl true{bands}", "")     # the text written before pdl existed
    module = parse_module(plain)
    assert plan_from_module(module).scheduler.pdl is False and print_module(module) == plain
    with pytest.raises(ParseError, match="boolean"):
        parse_module(on.replace("pdl true", "pdl maybe"))
    # the persistent grid's cap is a fact of its own, set exactly when the scheduler is persistent
    with pytest.raises(VerifyException, match="max_active_clusters .* is >= 1 exactly when persistent is true"):
        parse_module(on.replace(" max_active_clusters 66", ""))


def test_verifier_rejects_pdl_on_sm80():
    text = lowered_text(GemmSpec(m=4096, n=4096, k=4096), Schedule(tile=(128, 128, 32), arch="sm_80"))
    line = "split_k 1 split_k_mode none\n"
    assert line in text and "pdl" not in text
    with pytest.raises(VerifyException, match="pdl true needs sm_90a .* the kernel is sm_80: drop `pdl true`"):
        parse_module(text.replace(line, "split_k 1 split_k_mode none pdl true\n", 1))


def test_sm80_pipeline_carries_its_ring_and_compile_arch(monkeypatch):
    """pipeline-staging writes the SM80 ring as allocated and the compile target into kernel.pipeline; both
    print, parse back into the plan, and are verified. sm_90a pipelines carry neither."""
    monkeypatch.delenv("GEMMC_SM80_COMPILE_ARCH", raising=False)
    text = lowered_text(GemmSpec(m=4096, n=4096, k=4096), Schedule(tile=(128, 256, 64), arch="sm_80"))
    ring = 3 * (128 + 256) * 64 * 2
    line = f"smem {ring + 1024} ring_smem {ring} compile_arch sm_80\n"
    assert line in text and print_module(parse_module(text)) == text
    pipe = plan_from_module(parse_module(text)).pipeline
    assert (pipe.smem_bytes, pipe.ring_smem_bytes, pipe.compile_arch) == (ring + 1024, ring, "sm_80")
    for arch in ("sm_86", "sm_90a"):
        got = plan_from_module(parse_module(text.replace(" compile_arch sm_80", f" compile_arch {arch}")))
        assert got.pipeline.compile_arch == arch
    with pytest.raises(VerifyException, match="ring_smem 1000: a whole number of 1024-byte blocks"):
        parse_module(text.replace(f" ring_smem {ring}", " ring_smem 1000"))
    with pytest.raises(VerifyException, match="ring_smem -1024: a whole number"):
        parse_module(text.replace(f" ring_smem {ring}", " ring_smem -1024"))
    with pytest.raises(VerifyException, match="compile_arch 'sm_75'; use one of"):
        parse_module(text.replace(" compile_arch sm_80", " compile_arch sm_75"))
    hopper = lowered_text()
    assert "ring_smem" not in hopper and "compile_arch" not in hopper
    assert plan_from_module(parse_module(hopper)).pipeline.compile_arch == ""
    with pytest.raises(VerifyException, match="compile_arch and ring_smem are SM80 facts, but the kernel is sm_90a"):
        parse_module(re.sub(r"(kernel.pipeline .* smem \d+)", r"\1 compile_arch sm_80", hopper, count=1))
    with pytest.raises(VerifyException, match="compile_arch and ring_smem are SM80 facts"):
        parse_module(re.sub(r"(kernel.pipeline .* smem \d+)", r"\1 ring_smem 1024", hopper, count=1))


def test_fact_ops_need_a_kernel_parent():
    with pytest.raises(VerifyException, match="kernel.gemm"):
        parse_module("builtin.module {\n  kernel.cluster 2x1\n}\n")


def test_plan_from_module():
    plan = plan_from_module(parse_module(lowered_text()))
    assert isinstance(plan, KernelPlan)
    assert (plan.arch, plan.tile, plan.cluster, plan.mode, plan.threads) == \
        ("sm_90a", (128, 256, 64), (2, 1), "cooperative", 384)
    assert plan.warpgroups == (WarpGroup("producer", 0, 40), WarpGroup("consumer", 1, 232),
                               WarpGroup("consumer", 2, 232))
    assert plan.copy("b") == OperandCopy("b", "tma", (128, 64), 128, 2, "m", l2_policy="first_once")
    assert plan.copy("a") == OperandCopy("a", "tma", (128, 64), 128, 1, "", l2_policy="first_once")
    assert plan.copy("bias") == OperandCopy("bias", "ldg", (1, 256), 0, 1, "", 16)
    assert plan.pipeline == Pipeline(4, ("full", "empty"), 2, (128, 32), 4 * (128 + 256) * 64 * 2 + 2 * 128 * 32 * 2
                                     + 1024)
    assert plan.scheduler == TileScheduler(True, "m", 1, 1, "none", pdl=True, pdl_early_ctas=82, pdl_full_ctas=118,
                                           pdl_prefetch_k_tiles=2, max_active_clusters=66)
    assert (plan.mma.kind, plan.mma.inst_shape, plan.mma.atom_layout) == ("wgmma", (64, 256, 16), (2, 1, 1))
    assert plan.epilogue.ops == BIAS_GELU.epilogue and plan.epilogue.store == "tma"
    assert (plan.problem.m, plan.problem.n, plan.problem.a_major, plan.problem.b_major) == ("M", 4096, "k", "k")


def test_plan_needs_the_passes():
    from gemmc.errors import SpecError
    with pytest.raises(SpecError, match="run the passes"):
        plan_from_module(spec_to_module(BIAS_GELU, Schedule()))
    module = spec_to_module(BIAS_GELU, Schedule())
    pass_pipeline(("assign-warpgroup-roles",)).apply(make_context(), module)
    with pytest.raises(SpecError, match="run tma-cluster-layout first"):
        plan_from_module(module)


def test_every_enumerated_schedule_lowers_and_round_trips():
    spec = GemmSpec(m=4096, n=4096, k=4096)
    for arch in ("sm_90a", "sm_80"):
        for s in enumerate_schedules(spec, arch)[::7]:
            text = lowered_text(spec, s)
            assert print_module(parse_module(text)) == text


def test_epilogue_ops_live_in_an_epilogue_region():
    with pytest.raises(VerifyException, match="gemm.const must be inside an epilogue region"):
        parse_module("builtin.module {\n  %c = gemm.const 1.0\n}\n")
