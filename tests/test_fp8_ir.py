"""fp8 in the IR, the passes and the predicate: the scaled matmul printed and parsed back, the facts the passes
decide (the fp8 MMA, kernel.scaling, where the scales are read), the plan read back, and the predicate's fp8
rules (SM90 only, K-major operands, K tiles of whole fp8 MMAs, block scaling's tile, alignment in fp8
elements, two accumulators' registers). The printed facts are pinned in tests/filecheck/*fp8*.mlir."""
import pytest
from hypothesis import given, settings, strategies as st
from xdsl.utils.exceptions import VerifyException

import gemmc
from gemmc import GemmSpec, Scaling
from gemmc.errors import ScheduleError
from gemmc.ir import parse_module, print_module
from gemmc.ir.build import find_gemm, spec_from_module, spec_of, spec_to_module
from gemmc.ir.extract import plan_from_module
from gemmc.schedule import (Schedule, accumulator_count, accumulator_regs, check_schedule, consumer_regs_needed,
                            enumerate_schedules, is_valid, promotion_interval)
from gemmc.types import DType


def fp8(mode="row", m="M", n=4096, k=4096, b_dtype="f8e4m3", **kw) -> GemmSpec:
    return GemmSpec(m=m, n=n, k=k, dtype="f8e4m3", b_dtype=b_dtype, scaling=Scaling(mode, "sx", "sw"),
                    name=f"fp8_{mode}", **kw)


TILE = Schedule(tile=(128, 128, 128))


def limits(s: Schedule, spec: GemmSpec) -> list[str]:
    return [v.limit for v in check_schedule(s, spec)]


# ---- IR ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,types", [
    ("tensor", ("!gemmc.tensor<f32, scalar>", "!gemmc.tensor<f32, scalar>")),
    ("row", ("!gemmc.tensor<M x f32, col>", "!gemmc.tensor<4096 x f32, row>")),
    ("block", ("!gemmc.tensor<M x 32 x f32, mk>", "!gemmc.tensor<32 x 32 x f32, nk>")),
])
def test_ir_prints_the_scaling_and_typed_scales_and_reads_back(mode, types):
    spec = fp8(mode, b_dtype="f8e5m2")
    text = print_module(spec_to_module(spec, TILE))
    assert f'%sx = gemm.arg "sx" : {types[0]}' in text and f'%sw = gemm.arg "sw" : {types[1]}' in text
    assert (f"gemm.matmul @fp8_{mode}(%a, %b) scaled {mode}(%sx, %sw) acc f32 -> "
            "!gemmc.tensor<M x 4096 x bf16, mn>") in text
    assert "!gemmc.tensor<4096 x 4096 x f8e5m2, nk>" in text
    assert spec_from_module(parse_module(text)) == spec


@given(mode=st.sampled_from(["tensor", "row", "block"]), m=st.one_of(st.just("M"), st.integers(1, 9000)),
       n=st.integers(1, 9000).map(lambda x: 16 * x), k=st.integers(1, 900).map(lambda x: 16 * x),
       b_dtype=st.sampled_from(["f8e4m3", "f8e5m2"]), bias=st.booleans())
@settings(max_examples=30, deadline=None)
def test_any_fp8_spec_survives_ir_and_passes(mode, m, n, k, b_dtype, bias):
    from gemmc.spec import EpilogueInput, EpilogueOp, Ref
    extra = dict(inputs=(EpilogueInput("bias", "row", "bf16"),),
                 epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),)) if bias else {}
    spec = fp8(mode, m=m, n=n, k=k, b_dtype=b_dtype, **extra)
    assert spec_of(find_gemm(parse_module(print_module(spec_to_module(spec))))) == spec
    k_ = gemmc.compile(spec, schedule=TILE, emit="ir")
    final = k_.ir(after="verify-resources")
    assert spec_from_module(parse_module(final)) == spec
    assert plan_from_module(parse_module(final)) == k_.plan
    plan = k_.plan
    assert plan.problem.a_dtype == DType.f8e4m3 and plan.problem.b_dtype == DType(b_dtype)
    assert plan.mma.inst_shape == (64, 128, 32)
    assert (plan.scaling.mode, plan.scaling.a, plan.scaling.b) == (mode, "sx", "sw")
    assert plan.scaling.promote == (128 if mode == "block" else 0)
    assert plan.scaling.accumulators == (2 if mode == "block" else 1)
    assert {c.operand: c.kind for c in plan.copies if c.operand in ("sx", "sw")} == {"sx": "ldg", "sw": "ldg"}


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace("!gemmc.tensor<M x f32, col>", "!gemmc.tensor<M x bf16, col>"),
     "A's row scale sx must be !gemmc.tensor<M x f32, col>"),
    (lambda t: t.replace('"sw" : !gemmc.tensor<4096 x f32, row>', '"sw" : !gemmc.tensor<4096 x f32, col>'),
     "B's row scale sw must be !gemmc.tensor<4096 x f32, row>"),
    (lambda t: t.replace("scaled row(", "scaled colwise("), "scaling 'colwise'; use one of"),
    (lambda t: t.replace("scaled row(%sx, %sw)", "scaled row(%sx)"), "takes two scales (A's, B's), got 1"),
    (lambda t: t.replace("f8e4m3, mk", "bf16, mk"), "scaling row takes an fp8 A (f8e4m3)"),
    (lambda t: t.replace("kernel.scaling row", "kernel.scaling block promote 128 accumulators 2"),
     "kernel.scaling block, but the kernel's scaling is row"),
    (lambda t: t.replace("inst 64x128x32", "inst 64x128x16"), "inst K 16, but the operands are f8e4m3"),
    (lambda t: t.replace("kernel.scaling row", "kernel.scaling row promote 64"), "accumulators 1: promotion holds 2"),
])
def test_the_verifier_refuses_malformed_fp8_ir(edit, needle):
    text = gemmc.compile(fp8("row"), schedule=TILE, emit="ir").ir(after="verify-resources")
    with pytest.raises(VerifyException) as err:
        parse_module(edit(text))
    assert needle in str(err.value)


def test_bf16_ir_is_unchanged_by_fp8():
    """A bf16 kernel's IR carries no scaling and its MMA K stays 16 (the cache key is the final IR)."""
    text = gemmc.compile(GemmSpec(m="M", n=4096, k=4096), schedule=Schedule(), emit="ir").ir(after="verify-resources")
    assert "scaled" not in text and "kernel.scaling" not in text and "inst 64x128x16" in text
    with pytest.raises(VerifyException, match="inst K 32, but the operands are bf16"):
        parse_module(text.replace("inst 64x128x16", "inst 64x128x32"))


# ---- the predicate -------------------------------------------------------------------------------

def test_fp8_is_sm90_only_and_k_major():
    assert limits(Schedule(tile=(128, 128, 64), arch="sm_80"), fp8()) == ["fp8 (sm_80)"]
    assert enumerate_schedules(fp8(), "sm_80") == []
    spec = GemmSpec(m="M", n=4096, k=4096, dtype="f8e4m3", scaling="row", a_layout="km")
    (v,) = [v for v in check_schedule(TILE, spec) if v.limit == "fp8 layouts"]
    assert "reads K-major operands only" in v.fix
    assert "fp8 layouts" in limits(TILE, GemmSpec(m="M", n=4096, k=4096, dtype="f8e4m3", scaling="row",
                                                  b_layout="kn"))


@pytest.mark.parametrize("bk,ok", [(32, True), (64, True), (128, True), (16, False), (48, False), (96, False)])
def test_fp8_tile_k_is_whole_fp8_mmas(bk, ok):
    assert is_valid(Schedule(tile=(128, 128, bk)), fp8("row")) == ok
    if not ok:
        assert "tile K (fp8)" in limits(Schedule(tile=(128, 128, bk)), fp8("row"))


def test_block_scaling_pins_tile_k_to_128_and_n_to_one_scale_block():
    assert is_valid(TILE, fp8("block"))
    assert limits(Schedule(tile=(128, 128, 64)), fp8("block")) == ["tile K (block scaling)"]
    assert "tile N (block scaling)" in limits(Schedule(tile=(128, 256, 128)), fp8("block"))
    assert "tile N (block scaling)" in limits(Schedule(tile=(128, 96, 128)), fp8("block"))
    for bn in (16, 32, 64):
        assert is_valid(Schedule(tile=(128, bn, 128)), fp8("block"))
    swapped = Schedule(tile=(64, 16, 128), mode="pingpong", swap_ab=True)
    assert limits(swapped, fp8("block", m=16)) == ["swap_ab (block scaling)"]
    assert is_valid(swapped, fp8("row", m=16)) and is_valid(swapped, fp8("tensor", m=16))
    # split-K sums promoted (already scaled) partials: allowed, with the in-kernel fix-up or the reduce kernel
    assert is_valid(Schedule(tile=(128, 128, 128), split_k=2), fp8("block", m=256))
    assert is_valid(Schedule(tile=(128, 128, 128), split_k=4), fp8("block", m=256))


def test_alignment_counts_16_bytes_in_fp8_elements():
    """K must be a multiple of 16 fp8 elements (8 bf16 ones): TMA moves 16-byte rows."""
    assert "16-byte alignment of A's contiguous dim K" in limits(TILE, fp8("row", k=4104))
    assert "16-byte alignment of B's contiguous dim K" in limits(TILE, fp8("row", k=4104))
    assert is_valid(TILE, fp8("row", k=4112))
    assert is_valid(Schedule(tile=(128, 128, 64)), GemmSpec(m="M", n=4096, k=4104))    # bf16: 8 elements


def test_block_scaling_budgets_two_accumulators():
    assert (promotion_interval(fp8("block")), accumulator_count(fp8("block"))) == (128, 2)
    assert (promotion_interval(fp8("row")), accumulator_count(fp8("row"))) == (0, 1)
    s = Schedule(tile=(128, 128, 128))
    assert accumulator_regs(s, fp8("block")) == 2 * accumulator_regs(s, fp8("row")) == 128
    # the scales per tensor / per row are an epilogue (64 others), even with no ops of the user's
    assert consumer_regs_needed(s, fp8("row")) == 64 + 64
    assert consumer_regs_needed(s, fp8("block")) == 128 + 64
    wide = Schedule(tile=(128, 256, 128))
    assert is_valid(wide, fp8("row"))              # 128 accumulator registers + 64
    big = Schedule(tile=(256, 128, 128))           # block: 2 x 128 + 64 > 240
    assert "registers" in limits(big, fp8("block")) and is_valid(big, fp8("row"))


def test_every_enumerated_fp8_schedule_lowers():
    for mode, m in (("row", 4096), ("block", 4096), ("tensor", 8), ("row", 96)):
        spec = fp8(mode, m=m, n=7168, k=7168)
        schedules = enumerate_schedules(spec)
        assert schedules and all(s.tile[2] in ((128,) if mode == "block" else (64, 128)) for s in schedules)
        for s in schedules[:: max(1, len(schedules) // 6)]:
            plan = gemmc.compile(spec, schedule=s, emit="ir").plan
            assert plan.mma.inst_shape[2] == 32 and plan.scaling.mode == mode


def test_an_invalid_fp8_schedule_is_refused_before_lowering():
    with pytest.raises(ScheduleError, match="tile K \\(block scaling\\): got 64"):
        gemmc.compile(fp8("block"), schedule=Schedule(tile=(128, 128, 64)), emit="ir")


def test_gemmc_compile_prints_an_fp8_kernels_ir(capsys):
    from gemmc import cli
    rc = cli.main(["compile", "--m", "M", "--n", "7168", "--k", "7168", "--dtype", "f8e4m3", "--b-dtype", "f8e5m2",
                   "--scaling", "block", "--tile", "128x128x128"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "kernel.gemm @gemm(%a, %b) scaled block(%scale_a, %scale_b) acc f32" in out
    assert "!gemmc.tensor<7168 x 7168 x f8e5m2, nk>" in out and "kernel.scaling block promote 128" in out
    assert cli.main(["compile", "--m", "64", "--n", "64", "--k", "64", "--scaling", "row"]) == 1
    assert "scaling='row' with bf16 inputs" in capsys.readouterr().err
