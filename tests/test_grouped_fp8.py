"""Grouped fp8 GEMMs with DeepSeek-V3 block scales on the CPU: the spec's and the DSL's rules and errors, the scales'
IR types with the group dim, the predicate's union of the grouped and block-scaled rules, the promotion's scale
indices (its own code run as plain Python), the per-group dequantized reference, the launcher's checks, `auto`'s
picks and the tuning DB's keys. Kernels built on the CPU (PTX) are tests/test_grouped_fp8_kernel.py; the torch op
is tests/test_grouped_fp8_torch_op.py."""
import importlib.util
import math
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import gemmc
from gemmc.errors import LaunchError, SpecError, TraceError
from gemmc.reference import (error_figures, grouped_call_args, grouped_reference_and_bound, make_grouped_inputs)
from gemmc.schedule import Schedule, check_schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref, Scaling, scale_shapes

T, f8, f32 = gemmc.Tensor, gemmc.f8e4m3, gemmc.f32
BLOCK = Scaling("block", "sx", "sw")


def grouped_fp8(layout="contiguous", groups=256, n=2048, k=7168, **kw) -> GemmSpec:
    return GemmSpec(m="M", n=n, k=k, dtype="f8e4m3", scaling=BLOCK, groups=groups, group_layout=layout,
                    **{"name": f"experts_{layout}", **kw})


# ---- the spec ----------------------------------------------------------------------------------

def test_a_grouped_gemm_takes_block_scales_with_its_groups_dims():
    assert grouped_fp8().scale_shapes == (("M", 56), (256, 16, 56))
    assert grouped_fp8("masked", "E", n=1536, k=4096).scale_shapes == (("E", "M", 32), ("E", 12, 32))
    # partial blocks round up; a plain GEMM's shapes are what they were
    assert scale_shapes("block", "M", 448, 528, 8, "contiguous") == (("M", 5), (8, 4, 5))
    assert scale_shapes("block", "M", 448, 528) == (("M", 5), (4, 5))
    assert GemmSpec(m=4, n=256, k=256, dtype="f8e4m3", scaling="row").scale_shapes == ((4,), (256,))


@pytest.mark.parametrize("kw, needle", [
    (dict(scaling="row"), "groups=256 with row scaling (use scaling='block'"),
    (dict(scaling="tensor"), "per-tensor and per-row scales of a grouped GEMM are not built"),
    (dict(gate="silu"), "gate='silu' (use gate=None: a gated fp8 kernel is not built"),
    (dict(n="N"), "n='N' (use a static N"),
    (dict(b_dtype="bf16"), "fp8 operands f8e4m3 @ bf16"),
])
def test_spec_refuses_the_grouped_fp8_gemms_it_does_not_build(kw, needle):
    args = dict(m="M", n=2048, k=7168, dtype="f8e4m3", scaling=BLOCK, groups=256, group_layout="contiguous")
    with pytest.raises(SpecError) as e:
        GemmSpec(**{**args, **kw})
    assert needle in str(e.value)


# ---- the DSL ------------------------------------------------------------------------------------

@gemmc.kernel
def experts_fp8(x: T[("M", 7168), f8], w: T[(256, 2048, 7168), f8], sx: T[("M", 56), f32],
                sw: T[(256, 16, 56), f32], offsets: gemmc.GroupOffsets[256]):
    return gemmc.grouped_mm(gemmc.scaled(x, sx), gemmc.scaled(w, sw).mT, offsets)


@gemmc.kernel
def decode_fp8(x: T[("E", "M", 4096), f8], w: T[("E", 1536, 4096), gemmc.f8e5m2], sx: T[("E", "M", 32), f32],
               sw: T[("E", 12, 32), f32], counts: gemmc.GroupCounts["E"], alpha: gemmc.Scalar):
    return (gemmc.grouped_mm(gemmc.scaled(x, sx), gemmc.scaled(w, sw).mT, counts) * alpha).to(gemmc.f32)


def test_the_dsl_traces_grouped_scaled_matmuls_into_the_hand_written_specs():
    assert experts_fp8.spec == grouped_fp8(name="experts_fp8")
    assert experts_fp8.params == ["x", "w", "sx", "sw", "offsets"]
    masked = GemmSpec(m="M", n=1536, k=4096, dtype="f8e4m3", b_dtype="f8e5m2", out_dtype="f32", scaling=BLOCK,
                      groups="E", group_layout="masked", inputs=(EpilogueInput("alpha", "scalar"),),
                      epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))),), name="decode_fp8")
    assert decode_fp8.spec == masked
    # a call passes the kernel a, b, the scales, the counts, then the epilogue's inputs
    assert decode_fp8.launch_args("x", "w", "sx", "sw", "c", 2.0) == ("x", "w", "sx", "sw", "c", 2.0)


@pytest.mark.parametrize("sx, sw, needle", [
    (("M", 56), (16, 56), "are not the block scales of this contiguous grouped matmul of 8 groups"),
    (("M", 56), (8, 16, 55), "B's (8, 16, 56) (128 x 128 blocks of each group's weight)"),
    (("M",), (2048,), "A's (M, 56) (1 x 128 blocks of each row)"),
    ((), (), "a grouped fp8 GEMM takes block scales"),
])
def test_dsl_errors_name_the_block_scales_a_grouped_gemm_takes(sx, sw, needle):
    with pytest.raises(TraceError) as e:
        @gemmc.kernel
        def bad(x: T[("M", 7168), f8], w: T[(8, 2048, 7168), f8], sx: T[sx, f32], sw: T[sw, f32],
                offsets: gemmc.GroupOffsets[8]):
            return gemmc.grouped_mm(gemmc.scaled(x, sx), gemmc.scaled(w, sw).mT, offsets)
    assert needle in str(e.value)


def test_the_dsl_refuses_a_masked_a_scale_without_its_groups():
    with pytest.raises(TraceError, match=r"A's \(E, M, 4\)"):
        @gemmc.kernel
        def bad(x: T[("E", "M", 512), f8], w: T[("E", 256, 512), f8], sx: T[("M", 4), f32],
                sw: T[("E", 2, 4), f32], counts: gemmc.GroupCounts["E"]):
            return gemmc.grouped_mm(gemmc.scaled(x, sx), gemmc.scaled(w, sw).mT, counts)


def test_scaled_grouped_mm_on_torch_tensors_is_the_dequantized_per_group_product():
    from gemmc.quantize import dequantize, quantize
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(10, 256, generator=g), torch.randn(3, 200, 256, generator=g)
    x8, sx = quantize(x, "block")
    q = [quantize(w[e], "block", weight=True) for e in range(3)]
    w8, sw = torch.stack([a for a, _ in q]), torch.stack([s for _, s in q])
    offsets = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    y = gemmc.grouped_mm(gemmc.scaled(x8, sx), gemmc.scaled(w8, sw).mT, offsets)
    assert torch.equal(y[4:9], dequantize(x8[4:9], sx[4:9]) @ dequantize(w8[2], sw[2]).T) and not y[9].any()
    assert torch.equal(dequantize(w8, sw)[1], dequantize(w8[1], sw[1]))


# ---- the IR and the passes ----------------------------------------------------------------------

from gemmc.ir import parse_module  # noqa: E402
from gemmc.ir.build import find_gemm, spec_of, spec_to_module  # noqa: E402


@given(layout=st.sampled_from(["contiguous", "masked"]), groups=st.one_of(st.integers(1, 300), st.just("E")),
       n=st.sampled_from([128, 448, 2048]), k=st.sampled_from([128, 528, 7168]), m=st.sampled_from(["M", 64]))
def test_grouped_fp8_ir_types_the_scales_with_the_group_dim_and_round_trips(layout, groups, n, k, m):
    spec = GemmSpec(m=m, n=n, k=k, dtype="f8e4m3", scaling=BLOCK, groups=groups, group_layout=layout, name="e")
    text = str(spec_to_module(spec, Schedule(tile=(128, 128, 128))))
    kb, nb = -(-k // 128), -(-n // 128)
    lead = f"{groups} x " if layout == "masked" else ""
    assert f'%sx = gemm.arg "sx" : !gemmc.tensor<{lead}{m} x {kb} x f32, mk>' in text
    assert f'%sw = gemm.arg "sw" : !gemmc.tensor<{groups} x {nb} x {kb} x f32, nk>' in text
    assert f"grouped {layout}(%{spec.group_operand}) scaled block(%sx, %sw) acc f32" in text
    assert spec_of(find_gemm(parse_module(text))) == spec


def _ir(sx, sw, mode="block"):
    return f'''builtin.module {{
  %a = gemm.arg "a" : !gemmc.tensor<M x 256 x f8e4m3, mk>
  %b = gemm.arg "b" : !gemmc.tensor<8 x 256 x 256 x f8e4m3, nk>
  %offsets = gemm.arg "offsets" : !gemmc.tensor<8 x i32, offsets>
  %sx = gemm.arg "sx" : !gemmc.tensor<{sx}>
  %sw = gemm.arg "sw" : !gemmc.tensor<{sw}>
  %out = gemm.matmul @e(%a, %b) grouped contiguous(%offsets) scaled {mode}(%sx, %sw) acc f32 -> !gemmc.tensor<M x 256 x bf16, mn> epilogue {{
  ^bb0(%acc: f32):
    gemm.yield %acc
  }}
}}'''


@pytest.mark.parametrize("text, needle", [
    (_ir("M x 2 x f32, mk", "8 x 2 x 2 x f32, nk"), None),
    (_ir("M x 2 x f32, mk", "2 x 2 x f32, nk"), "B's block scale sw must be !gemmc.tensor<8 x 2 x 2 x f32, nk>"),
    (_ir("8 x M x 2 x f32, mk", "8 x 2 x 2 x f32, nk"), "A's block scale sx must be !gemmc.tensor<M x 2 x f32, mk>"),
    (_ir("M x f32, col", "256 x f32, row", "row"), "a grouped GEMM takes block scales, not row ones"),
])
def test_the_ir_verifier_checks_the_grouped_scales(text, needle):
    if needle is None:
        assert spec_of(find_gemm(parse_module(text))).scale_shapes == (("M", 2), (8, 2, 2))
        return
    with pytest.raises(Exception) as e:
        parse_module(text).verify()
    assert needle in str(e.value)


def test_the_passes_decide_the_group_and_the_promotion_and_the_plan_reads_both():
    for layout in ("contiguous", "masked"):
        k = gemmc.compile(grouped_fp8(layout), Schedule(tile=(128, 128, 128), cluster=(2, 1)), emit="ir")
        text = k.ir("verify-resources")
        assert "kernel.scaling block promote 128 accumulators 2" in text
        assert f"kernel.group {layout} groups 256 order m" in text and "kernel.epilogue store direct" in text
        plan = k.plan
        assert plan.groups.layout == layout and (plan.scaling.mode, plan.scaling.promote) == ("block", 128)
        assert plan.copy("out").kind == "st_global" and plan.mma.inst_shape == (64, 128, 32)


@pytest.mark.parametrize("kw, limits", [
    (dict(tile=(128, 128, 128), cluster=(2, 1)), []),
    (dict(tile=(64, 128, 128), mode="pingpong"), []),
    (dict(tile=(128, 128, 64)), ["tile K (block scaling)"]),
    (dict(tile=(128, 256, 128)), ["tile N (block scaling)", "registers"]),
    (dict(tile=(128, 128, 128), split_k=2), ["grouped GEMM"]),
    (dict(tile=(128, 128, 128), stream_k=True), ["grouped GEMM"]),
    (dict(tile=(64, 16, 128), mode="pingpong", swap_ab=True), ["grouped GEMM", "swap_ab (block scaling)"]),
    (dict(tile=(128, 128, 128), swizzle=4), ["grouped GEMM"]),
    (dict(tile=(128, 128, 128), arch="sm_80"), ["grouped GEMM (sm_80)", "fp8 (sm_80)"]),
])
def test_the_predicate_is_the_union_of_the_grouped_and_the_block_scaled_rules(kw, limits):
    got = [v.limit for v in check_schedule(Schedule(**kw), grouped_fp8())]
    assert [x for x in got if x in limits or not limits] == limits and set(limits) <= set(got)


# ---- the promotion's scale indices, as plain Python -----------------------------------------------

from gemmc.backends.sm90.kernel import promotion as promotion_module  # noqa: E402
from gemmc.backends.sm90.kernel.scheduler import Work  # noqa: E402


def plain_promotion(tile, grouped, masked):
    """PromotingMainLoop's scale_coords and block_scale_factors over plain Python numbers and numpy arrays."""
    spec = importlib.util.spec_from_file_location("gemmc.backends.sm90.kernel.plain_promotion",
                                                  promotion_module.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.cutlass = types.SimpleNamespace(min=min, Float32=float, const_expr=lambda v: v)
    loop = module.PromotingMainLoop()
    loop.TILE_MNK, loop.GROUPED, loop.GROUP_MASKED = tile, grouped, masked
    return module, loop


def host_views(sa, sb, grouped, masked):
    """The kernel's views of the scales: (rows, Kb, L), L the groups where the scales have them (Sm90Gemm.view)."""
    sa_v = np.moveaxis(sa, 0, -1) if masked else sa[..., None]
    sb_v = np.moveaxis(sb, 0, -1) if grouped else sb[..., None]
    return sa_v, sb_v


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(["plain", "contiguous", "masked"]), tm=st.sampled_from([64, 128, 256]),
       tn=st.sampled_from([16, 32, 64, 128]), data=st.data())
def test_each_element_is_scaled_by_its_groups_rows_and_weight_block(layout, tm, tn, data):
    """Every accumulator element of a work unit's tile, at its row in the tile's frame, gets sa[row] * sb[block]
    of the group's rows and weight (rows past M clamped; a tile's columns share one B block)."""
    grouped, masked = layout != "plain", layout == "masked"
    e = data.draw(st.integers(1, 6)) if grouped else 1
    n, kb = data.draw(st.integers(1, 400)), data.draw(st.integers(1, 5))
    rows = data.draw(st.lists(st.integers(0, 300), min_size=e, max_size=e))
    m = max(rows + [1]) if masked else max(1, sum(rows))
    nb = -(-n // 128)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    sa = rng.random((e, m, kb) if masked else (m, kb)) + 1
    sb = rng.random((e, nb, kb) if grouped else (nb, kb)) + 1
    module, loop = plain_promotion((tm, tn, 128), grouped, masked)
    sa_v, sb_v = host_views(sa, sb, grouped, masked)
    g = data.draw(st.integers(0, e - 1))
    row0 = sum(rows[:g]) if layout == "contiguous" else 0
    tile_m = data.draw(st.integers(0, max(0, -(-max(rows[g], 1) // tm) - 1)))
    tile_n = data.draw(st.integers(0, -(-n // tn) - 1))
    work = Work(tile_m, tile_n, g if masked else 0, 0, 0, kb, 0, group=g if grouped else None,
                row0=row0 if grouped else None, rows=rows[g])
    promo = module.Promotion(None, sa_v, sb_v, None, None, m)
    coords = [(tile_m * tm + i, tile_n * tn + j) for i in range(0, tm, 7) for j in range(0, tn, 5)]
    kt = data.draw(st.integers(0, kb - 1))
    factors = loop.block_scale_factors(promo, coords, loop.scale_coords(work, nb), kt, len(coords))
    for (r, c), f in zip(coords, factors):
        a_row = min(row0 + r, m - 1)
        a = sa[g, a_row, kt] if masked else sa[a_row, kt]
        b_block = min(c // 128, nb - 1)
        b = sb[g, b_block, kt] if grouped else sb[b_block, kt]
        assert f == pytest.approx(a * b, rel=1e-12)


# ---- the reference and the inputs ---------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_the_reference_is_each_groups_dequantized_product_and_catches_another_groups_scales(layout):
    from gemmc.quantize import dequantize
    spec = grouped_fp8(layout, groups=4, n=200, k=300)
    rows = [5, 0, 9, 2]
    m = 20 if layout == "contiguous" else 12
    a, b, groups, extra = make_grouped_inputs(spec, rows, 200, 300, m=m, device="cpu",
                                              generator=torch.Generator().manual_seed(1))
    sa, sb = extra
    assert (a.dtype, b.dtype, tuple(sa.shape), tuple(sb.shape)) == (
        torch.float8_e4m3fn, torch.float8_e4m3fn, (20, 3) if layout == "contiguous" else (4, 12, 3), (4, 2, 3))
    assert len(grouped_call_args(spec, a, b, groups, extra)) == 5
    ref, bound = grouped_reference_and_bound(spec, a, b, groups, extra)
    starts = [0, 5, 5, 14]

    def kernel_like(scale_of_b):
        out = torch.full(ref.shape, math.nan, dtype=torch.bfloat16)
        for g, r in enumerate(rows):
            at = (slice(starts[g], starts[g] + r),) if layout == "contiguous" else (g, slice(0, r))
            y = dequantize(a[at], sa[at]).double() @ dequantize(b[g], scale_of_b(g)).double().T
            out[at] = y.to(torch.bfloat16)
        return out

    rel, elem = error_figures(kernel_like(lambda g: sb[g]), ref, bound)
    assert rel < 1e-2 and elem <= 1
    unwritten = ref.isnan().all(dim=-1)
    assert unwritten.sum() == (20 - 16 if layout == "contiguous" else 4 * 12 - 16)
    # a kernel reading the next group's weight scales (their magnitudes differ) is out of bounds
    wrong = kernel_like(lambda g: sb[(g + 1) % 4])
    assert error_figures(wrong, ref, bound)[1] > 1


def test_the_inputs_quantize_each_groups_weight_on_its_own():
    from gemmc.quantize import quantize
    spec = grouped_fp8("contiguous", groups=3, n=200, k=300)
    a, b, _, (sa, sb) = make_grouped_inputs(spec, [3, 4, 5], 200, 300, device="cpu",
                                            generator=torch.Generator().manual_seed(2))
    for g in range(3):
        q, s = quantize(b[g].float() * sb[g].repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300],
                        "block", weight=True)
        assert torch.equal(s, sb[g]) and torch.equal(q, b[g])      # its own blocks' amax reach the e4m3 max
    assert torch.isfinite(sa).all() and (sa > 0).all()


# ---- the launcher ------------------------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *values):
        self.calls.append(values)


def fp8_launcher(layout, always_validate=True):
    from gemmc.runtime import Launcher
    e = gemmc.compile(grouped_fp8(layout, groups="E", n=256, k=512), Schedule(tile=(128, 128, 128))).emitted
    rec = Recorder()
    return Launcher(e.params, function=rec, device_type="cpu", name=e.entry, always_validate=always_validate), rec, e


def test_params_put_the_scales_after_b_and_before_the_groups():
    _, _, e = fp8_launcher("contiguous")
    assert [(p.name, p.shape, p.role) for p in e.params] == [
        ("a", ("M", 512), "a"), ("b", ("E", 256, 512), "b"), ("sx", ("M", 4), "scale"), ("sw", ("E", 2, 4), "scale"),
        ("offsets", ("E_plus_1",), "group_offsets"), ("out", ("M", 256), "out")]
    assert "KERNEL(a, b, out, (), None, None, offsets, stream, block_scales=(sx, sw))" in e.source
    _, _, e = fp8_launcher("masked")
    assert [p.shape for p in e.params][:5] == [("E", "M", 512), ("E", 256, 512), ("E", "M", 4), ("E", 2, 4), ("E",)]


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_the_launcher_checks_the_grouped_scales_before_launch(layout):
    k, rec, _ = fp8_launcher(layout)
    f8e4, i32 = torch.float8_e4m3fn, torch.int32
    if layout == "contiguous":
        a, sa, groups = torch.zeros(40, 512, dtype=f8e4), torch.ones(40, 4), torch.tensor([0, 10, 40], dtype=i32)
    else:
        a, sa, groups = torch.zeros(2, 16, 512, dtype=f8e4), torch.ones(2, 16, 4), torch.tensor([3, 16], dtype=i32)
    b, sb = torch.zeros(2, 256, 512, dtype=f8e4), torch.ones(2, 2, 4)
    out = k(a, b, sa, sb, groups)
    assert out.shape == a.shape[:-1] + (256,) and out.dtype == torch.bfloat16 and len(rec.calls) == 1
    for bad, needle in (((a, b, sa[..., :3], sb, groups), "sx.shape"),
                        ((a, b, sa, torch.ones(3, 2, 4), groups), "the arguments disagree on E"),
                        ((a, b, sa, sb.bfloat16(), groups), "sw must be f32"),
                        ((a, b, sa, torch.ones(2, 3, 4), groups), "sw.shape[1] must be 2")):
        with pytest.raises(LaunchError) as e:
            k(*bad)
        assert needle in str(e.value)
    # the debug check still reads the groups back
    bad_groups = torch.tensor([0, 41, 40], dtype=torch.int32) if layout == "contiguous" else \
        torch.tensor([3, 17], dtype=torch.int32)
    with pytest.raises(LaunchError, match="past M|a masked group holds 0 to M"):
        k(a, b, sa, sb, bad_groups)
    assert len(rec.calls) == 1


# ---- auto and the tuning DB ---------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(["contiguous", "masked"]), groups=st.sampled_from([1, 8, 128, 256, "E"]),
       n=st.sampled_from([448, 2048, 4096, 7168]), k=st.sampled_from([2048, 4096, 7168]), m=st.integers(1, 1 << 17))
def test_auto_picks_a_valid_block_scaled_schedule_for_any_rows_per_group(layout, groups, n, k, m):
    from gemmc.choose.auto import resolve_auto
    spec = grouped_fp8(layout, groups, n, k)
    d = resolve_auto(spec, "sm_90a", m=m, db=None)
    assert not check_schedule(d.schedule, spec.with_dims(m=m)) and not d.use_cublas
    assert d.schedule.tile[2] == 128 and d.schedule.tile[1] <= 128


def test_fp8_grouped_problems_are_keyed_apart_from_bf16_ones():
    from gemmc.bench.suites import GroupedShape
    from gemmc.choose.tuning_db_schema import problem_fields, problem_key
    shape = GroupedShape("deepseek-v3", "down", 16)
    bf16, fp8 = shape.spec(), shape.spec("fp8-block")
    assert (fp8.dtype, fp8.scaling.mode, fp8.groups, fp8.n, fp8.k) == (gemmc.f8e4m3, "block", 256, 7168, 2048)
    fields = problem_fields(fp8, "sm_90a")
    assert fields["epilogue_class"].startswith("grouped_contiguous/scaled_block:") and fields["dtype"] == "f8e4m3"
    assert (fields["m"], fields["batch"]) == (16, 256)
    assert problem_key(fp8, "sm_90a") != problem_key(bf16, "sm_90a")
    assert problem_key(fp8, "sm_90a") != problem_key(fp8.with_dims(groups=None, group_layout=None, m=16), "sm_90a")
    masked = problem_fields(fp8.with_dims(group_layout="masked", m=16), "sm_90a")["epilogue_class"]
    assert masked.startswith("grouped_masked/scaled_block:")
    up = GroupedShape("deepseek-v3", "up", 16).spec("fp8-block")
    assert (up.n, up.gate) == (4096, None) and GroupedShape("deepseek-v3", "up", 16).spec().gate == "silu"


def test_tune_on_fp8_moe_problems_then_auto_takes_the_dbs_best(tmp_path):
    from gemmc.bench.suites import GroupedShape
    from gemmc.choose.auto import resolve_auto
    from gemmc.search import tune
    from gemmc.search.builder import BuildResult
    from gemmc.search.db import TuningDB
    from gemmc.search.runner import Runner
    from gemmc.search.strategy import Measurement, SearchProblem

    class InlineBuilder:
        def build(self, spec, schedules, arch, on_result=None):
            out = [BuildResult(s, True, 0.1, None) for s in schedules]
            for r in out if on_result else ():
                on_result(r)
            return out

    shape = GroupedShape("qwen3-30b-a3b", "down", 16)
    spec = shape.spec("fp8-block")
    candidates = SearchProblem.of(spec).candidates
    assert candidates and all(not check_schedule(s, spec) and s.tile[2] == 128 for s in candidates)
    pick = next(s for s in candidates if s.tile == (64, 64, 128) and s.mode == "pingpong")

    def measure(spec, s, arch):
        assert spec.scaling.mode == "block" and spec.grouped
        return Measurement(s, 10.0 if s == pick else 20.0, None, cublas_us=15.0)

    db = TuningDB(tmp_path / "t.sqlite")
    summary = tune([shape], dtype="fp8-block", arch="sm_90a", strategy="exhaustive", budget=len(candidates), batch=8,
                   db=db, builder=InlineBuilder(), runner=Runner(measure_fn=measure), gpu_name="fake",
                   progress=False, confirm=0, symbolic=True)
    assert summary[0][1].schedule == pick
    d = resolve_auto(spec.with_dims(m="M"), "sm_90a", m=128 * 9, db=db, gpu_name="fake")
    assert (d.source, d.schedule) == ("db", pick)
    bf16 = resolve_auto(shape.spec().with_dims(m="M"), "sm_90a", m=128 * 9, db=db, gpu_name="fake")
    assert bf16.source == "heuristic"       # the bf16 problem never reads the fp8 entry


def test_the_tune_flags_take_the_moe_suite_in_fp8_with_block_scales(tmp_path, capsys, monkeypatch):
    import gemmc.search.runner as runner_mod
    from gemmc.search.cli import main
    monkeypatch.setattr(runner_mod.Runner, "gpu_name", staticmethod(lambda: "cpu"))
    db = str(tmp_path / "t.sqlite")
    for extra in ([], ["--symbolic"]):      # past the flag checks: it stops at the GPU lookup
        assert main(["--db", db, "tune", "--suite", "moe", "--dtype", "fp8", "--scaling", "block", *extra]) == 2
        assert "no GPU is visible" in capsys.readouterr().err
    assert main(["--db", db, "tune", "--suite", "moe", "--dtype", "fp8", "--scaling", "tensor"]) == 2
    assert "use --scaling block" in capsys.readouterr().err
