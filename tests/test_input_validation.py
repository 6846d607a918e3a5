"""Malformed user input is refused with a gemmc error that names the field, the value and a fix, before
anything is lowered: Schedule values (through the one predicate, check_schedule), dict schedules, and
GemmSpec's dtypes, epilogue constants, clamp bounds and data flow."""
import numpy as np
import pytest

import gemmc
from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Schedule, ScheduleError, check_schedule
from gemmc.errors import SpecError
from gemmc.types import DType, as_dtype

SPEC = GemmSpec(m=4096, n=4096, k=4096)


# ---- Schedule: wrong types and arity ---------------------------------------------------------

@pytest.mark.parametrize("fields,limit,shown,fix", [
    (dict(tile=(128, 128)), "tile", "(128, 128)", "three integers (M, N, K)"),
    (dict(tile=(128.5, 128, 64)), "tile", "(128.5, 128, 64)", "three integers"),
    (dict(tile="128x128x64"), "tile", "'128x128x64'", "tile=(128, 128, 64)"),
    (dict(cluster=(2,)), "cluster", "(2,)", "two integers (M, N)"),
    (dict(split_k="2"), "split_k", "'2'", "an integer from 1 to 16"),
    (dict(split_k=True), "split_k", "True", "an integer from 1 to 16"),
    (dict(stages="fast"), "stages", "'fast'", "an integer of at least 2, or 'auto'"),
    (dict(stages=3.7), "stages", "3.7", "an integer of at least 2, or 'auto'"),
    (dict(swizzle=1.0), "swizzle", "1.0", "use one of (1, 2, 4, 8)"),
])
def test_malformed_schedule_fields_are_violations_not_crashes(fields, limit, shown, fix):
    s = Schedule(**fields)
    (v,) = check_schedule(s, SPEC)
    assert (v.limit, v.value) == (limit, shown) and fix in v.fix
    with pytest.raises(ScheduleError, match=f"{limit}: got "):
        gemmc.compile(SPEC, s, emit="ir")


def test_values_are_never_truncated():
    assert Schedule(stages=3.7).stages == 3.7 and Schedule(tile=(128.5, 128, 64)).tile == (128.5, 128, 64)
    assert not gemmc.is_valid(Schedule(stages=3.7), SPEC)


def test_lossless_forms_still_normalize():
    # lists (JSON), numpy ints and digit strings (the IR and the CLI write stages as text) are the same schedule
    s = Schedule(tile=[np.int64(128), 128, 64], cluster=[2, np.int32(1)], stages="4", split_k=np.int64(1),
                 swizzle=np.int64(8))
    plain = Schedule((128, 128, 64), (2, 1), 4, swizzle=8)
    assert s == plain and hash(s) == hash(plain) and s.short() == "128x128x64_c2x1_coop_s4_rm_sw8_k1"
    assert type(s.tile[0]) is int and type(s.stages) is int and gemmc.is_valid(s, SPEC)


def test_dict_schedules_name_unknown_fields():
    with pytest.raises(ScheduleError) as err:
        gemmc.compile(SPEC, {"tile": (128, 128, 64), "foo": 1, "tiles": (1, 2, 3)}, emit="ir")
    assert [(v.limit, v.value) for v in err.value.violations] == [("schedule field", "'foo'"),
                                                                  ("schedule field", "'tiles'")]
    assert "use tile, cluster, stages, mode, raster, swizzle, split_k, arch, pdl, swap_ab, stream_k" in str(err.value)
    with pytest.raises(ScheduleError, match="schedule field: got 'tile_m'"):
        Schedule().with_(tile_m=64)
    # a recorded dict (lists from JSON) still loads
    s = Schedule((128, 256, 64), (2, 1), 4, pdl=False)
    assert Schedule.from_dict({**s.to_dict(), "tile": [128, 256, 64], "cluster": [2, 1]}) == s
    assert gemmc.compile(SPEC, {"tile": [128, 128, 64], "stages": 4}, emit="ir").schedule == Schedule(stages=4)


# ---- GemmSpec --------------------------------------------------------------------------------

BIAS = (EpilogueInput("bias", "row"),)


def test_the_epilogue_result_must_depend_on_the_accumulator():
    with pytest.raises(SpecError, match=r"the epilogue's result \(%v1, add\) does not depend on the accumulator"):
        GemmSpec(m=64, n=64, k=64, inputs=BIAS, epilogue=(EpilogueOp("relu", (Ref.acc(),)),
                                                          EpilogueOp("add", (Ref.input("bias"), Ref.const(1.0)))))
    # through earlier ops is fine
    spec = GemmSpec(m=64, n=64, k=64, inputs=BIAS, epilogue=(EpilogueOp("add", (Ref.input("bias"), Ref.const(1.0))),
                                                             EpilogueOp("relu", (Ref.acc(),)),
                                                             EpilogueOp("mul", (Ref.node(0), Ref.node(1)))))
    assert len(spec.epilogue) == 3


@pytest.mark.parametrize("op,msg", [
    (EpilogueOp("clamp", (Ref.acc(),), (("min", "zero"),)), "clamp min 'zero' is not a number"),
    (EpilogueOp("clamp", (Ref.acc(),), (("min", float("nan")),)), "clamp min nan is not finite"),
    (EpilogueOp("clamp", (Ref.acc(),), (("max", float("inf")),)), "clamp max inf is not finite"),
    (EpilogueOp("add", (Ref.acc(), Ref("const", "x"))), "constant 'x' is not a number"),
    (EpilogueOp("mul", (Ref.acc(), Ref.const(float("-inf")))), "constant -inf is not finite"),
    (EpilogueOp("add", (Ref.acc(), Ref("node", "x"))), "reads %vx, which is not an earlier op"),
    (EpilogueOp("add", (Ref.acc(), Ref("weird", 1))), "bad operand"),
])
def test_epilogue_constants_and_operands_are_checked_in_the_spec(op, msg):
    with pytest.raises(SpecError, match=msg):
        GemmSpec(m=64, n=64, k=64, epilogue=(op,))


def test_dsl_and_spec_refuse_non_finite_constants_alike():
    with pytest.raises(SpecError, match="clamp min nan is not finite"):
        @gemmc.kernel
        def clamped(x: gemmc.Tensor[(64, 64), gemmc.bf16], w: gemmc.Tensor[(64, 64), gemmc.bf16]):
            return gemmc.clamp(x @ w.T, min=float("nan"))
    with pytest.raises(SpecError, match="constant inf of `\\*` is not finite"):
        @gemmc.kernel
        def scaled(x: gemmc.Tensor[(64, 64), gemmc.bf16], w: gemmc.Tensor[(64, 64), gemmc.bf16]):
            return (x @ w.T) * float("inf")


@pytest.mark.parametrize("dtype,hint", [("f8e4m3", "(fp8 is an operand dtype only: A and B, with their scales)"),
                                        (DType.i32, "(i32 is for runtime counters only)")])
def test_epilogue_input_dtypes_are_checked_in_the_spec(dtype, hint):
    with pytest.raises(SpecError, match=f"epilogue input 'bias' has dtype {dtype} " + hint.replace("(", r"\(")
                       .replace(")", r"\)") + "; use bf16, f16, f32"):
        EpilogueInput("bias", "row", dtype)
    assert EpilogueInput("bias", "row", "f16").dtype == DType.f16


@pytest.mark.parametrize("name", ["lambda", "class", "for", "None"])
def test_epilogue_input_names_are_not_python_keywords(name):
    """The kernel module takes each input as a parameter of that name: a keyword there cannot parse."""
    with pytest.raises(SpecError, match=f"epilogue input name '{name}' must be an identifier .* keywords"):
        EpilogueInput(name, "scalar")


@pytest.mark.parametrize("field,accepted", [("dtype", "bf16, f16, f8e4m3, f8e5m2"), ("out_dtype", "bf16, f16, f32"),
                                            ("acc_dtype", "f32, f16")])
def test_unknown_dtype_lists_what_the_role_takes(field, accepted):
    with pytest.raises(SpecError) as err:
        GemmSpec(m=64, n=64, k=64, **{field: "i32"})
    assert str(err.value) == f"unknown dtype 'i32'; use one of: {accepted}"
    with pytest.raises(SpecError, match=r"unknown dtype 'int8'; use one of: bf16, f16, f32$"):
        EpilogueInput("bias", "row", "int8")
    with pytest.raises(SpecError, match=r"use one of: bf16, f16, f32, f8e4m3, f8e5m2$"):   # no role: every name
        as_dtype("i32")


def test_cast_to_an_unknown_dtype_lists_the_output_dtypes():
    with pytest.raises(SpecError, match=r"unknown dtype 'i32'; use one of: bf16, f16, f32$"):
        GemmSpec(m=64, n=64, k=64, epilogue=(EpilogueOp("cast", (Ref.acc(),), (("dtype", "i32"),)),))


def test_sm90_refuses_f16_accumulation_where_it_needs_f32_values():
    """The fused epilogue and the in-kernel split-K sums work on f32 values: with an f16 accumulator the
    kernel failed inside cute.compile; the predicate says so first. Plain f16 accumulation stays valid."""
    from gemmc.schedule import check_schedule
    from gemmc.spec import EpilogueOp, Ref
    plain = gemmc.GemmSpec(m=256, n=256, k=512, dtype="f16", out_dtype="f16", acc_dtype="f16")
    relu = gemmc.GemmSpec(m=256, n=256, k=512, dtype="f16", out_dtype="f16", acc_dtype="f16",
                          epilogue=(EpilogueOp("relu", (Ref.acc(),)),))
    assert check_schedule(gemmc.Schedule(tile=(128, 128, 64)), plain) == []
    assert check_schedule(gemmc.Schedule(tile=(128, 128, 64), split_k=3), plain) == []      # the reduce kernel
    problems = check_schedule(gemmc.Schedule(tile=(128, 128, 64)), relu)
    assert [p.limit for p in problems] == ["acc_dtype f16 with an epilogue"] and "acc_dtype='f32'" in problems[0].fix
    for s in (gemmc.Schedule(tile=(128, 128, 64), split_k=2), gemmc.Schedule(tile=(128, 128, 64), stream_k=True),
              gemmc.Schedule(tile=(64, 16, 64), mode="pingpong", swap_ab=True, split_k=3)):
        assert "acc_dtype f16 with split-K partials" in [p.limit for p in check_schedule(s, plain)], s


@pytest.mark.parametrize("value", [1e39, -3.5e38])
def test_epilogue_constants_beyond_f32_are_refused(value):
    from gemmc.spec import EpilogueOp, Ref
    with pytest.raises(gemmc.SpecError, match="beyond the f32 range"):
        gemmc.GemmSpec(epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.const(value))),))
    with pytest.raises(gemmc.SpecError, match="beyond the f32 range"):
        gemmc.GemmSpec(epilogue=(EpilogueOp("clamp", (Ref.acc(),), (("max", value),)),))
    gemmc.GemmSpec(epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.const(3.402823466385289e38))),))   # rounds to f32 max
