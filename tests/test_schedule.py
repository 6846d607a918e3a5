"""Properties of the one validity predicate (gemmc.schedule.check_schedule) and the schedule space."""
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Schedule, ScheduleError, check_schedule, is_valid
from gemmc.bench.dataset import load_dataset, record_schedule
from gemmc.schedule import (ARCH_LIMITS, SM80_COMPILE_ARCHS, ScheduleSpace, accumulator_regs, consumer_reg_overhead,
                            enumerate_schedules, max_stages, register_budgets, require_valid, resolve_stages,
                            sm80_ring_smem_bytes, smem_bytes)

SPEC = GemmSpec(m=4096, n=4096, k=4096)


def limits(s, spec=SPEC):
    return {v.limit for v in check_schedule(s, spec)}


# ---- one rule at a time ----------------------------------------------------------------------

def test_default_schedules_are_valid():
    assert check_schedule(Schedule(), SPEC) == []
    assert check_schedule(Schedule((128, 128, 32), arch="sm_80"), SPEC) == []


def test_rejects_shared_memory_overflow():
    # one 256x256x128 bf16 stage is 128 KiB: two do not fit in 227 KiB
    assert limits(Schedule((256, 256, 128))) >= {"shared memory"}
    # explicit stages beyond what fits, with the fix naming the stage count that does
    s = Schedule((128, 256, 64), stages=8)
    (v,) = [v for v in check_schedule(s, SPEC) if v.limit == "shared memory"]
    assert f"stages<={max_stages(s, SPEC)}" in v.fix and "232448" in v.fix


def test_rejects_register_overflow():
    s = Schedule((128, 256, 64), mode="pingpong")  # one warpgroup holds 128x256 f32: 256 regs/thread
    assert accumulator_regs(s, SPEC) == 256
    assert "registers" in limits(s)
    assert "registers" not in limits(s.with_(mode="cooperative"))  # two warpgroups share it: 128 regs
    fix = {v.limit: v.fix for v in check_schedule(s, SPEC)}["registers"]
    assert "mode='cooperative'" in fix
    # already cooperative (two warpgroups of 128x224): only a smaller tile helps, and the fix says so
    coop = {v.limit: v.fix for v in check_schedule(Schedule((256, 224, 64), mode="cooperative"), SPEC)}
    assert coop["registers"] == "use a smaller tile (M x N)"
    # 256x192 and 256x208 fit (192 and 208 accumulator registers, + 32 others, in 232 and 240)
    assert is_valid(Schedule((256, 192, 64)), SPEC) and is_valid(Schedule((256, 208, 64)), SPEC)


def test_rejects_clusters_over_16():
    assert "cluster size" in limits(Schedule((256, 256, 64), (4, 8)))
    assert "cluster size" not in limits(Schedule((256, 256, 64), (4, 4)))


def test_rejects_multicast_slices_that_are_not_8_row_multiples():
    assert "multicast slice of A" in limits(Schedule((64, 64, 64), (1, 16), mode="pingpong"))
    assert "multicast slice of B" in limits(Schedule((128, 64, 64), (16, 1)))
    assert not {"multicast slice of A", "multicast slice of B"} & limits(Schedule((128, 128, 64), (2, 2)))


def test_each_broken_rule_is_reported_once():
    # stages=1 breaks the stages rule only: the shared-memory bullet is for tiles whose ring cannot fit 2 stages
    s = Schedule(stages=1)
    assert max_stages(s, SPEC) == 6 and [str(v) for v in check_schedule(s, SPEC)] == [
        "stages: got 1; use at least 2 (or 'auto')"]
    # a 96 KiB stage beside 64 KiB of f32 epilogue staging (C and a full f32 input): one stage fits
    residual = GemmSpec(m=4096, n=4096, k=4096, out_dtype="f32", inputs=(EpilogueInput("r", "full", "f32"),),
                        epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("r"))),))
    big = Schedule((128, 256, 128))
    assert [str(v) for v in check_schedule(big, residual)] == [
        "shared memory: got 1 A/B stage(s) of 98304 B fit in 232448 B; use a smaller tile (the ring needs 2 stages)"]
    # an explicit ring gets the same fix: 'auto' would not help
    assert [(v.limit, v.fix) for v in check_schedule(big.with_(stages=3), residual)] == [
        ("shared memory", "use a smaller tile (the ring needs 2 stages)")]


def test_multicast_slices_are_checked_only_where_an_operand_is_multicast():
    # 100 rows break the cooperative tile rule; on a 1x1 cluster nothing is sliced, so no slice bullet
    assert limits(Schedule((100, 128, 64))) == {"tile M (cooperative)"}
    # 1x2 multicasts A in 50-row slices: now the slice rule fires, naming cluster N
    (v,) = [v for v in check_schedule(Schedule((100, 128, 64), (1, 2)), SPEC) if v.limit.startswith("multicast")]
    assert (v.limit, v.value) == ("multicast slice of A", "100/2") and "shrink cluster N" in v.fix


def test_a_192_row_tile_names_the_settings_it_cannot_take():
    (v,) = check_schedule(Schedule((192, 192, 64), swap_ab=True), SPEC)
    assert (v.limit, v.value) == ("tile M 192", "swap_ab=True")
    assert v.fix.endswith("use swap_ab=False, or a 128- or 256-row tile")
    found = check_schedule(Schedule((192, 192, 64), split_k=2, swap_ab=True), SPEC)
    (v,) = [v for v in found if v.limit == "tile M 192"]
    assert v.value == "swap_ab=True, split_k=2" and "use swap_ab=False and split_k=1, or" in v.fix
    assert str(v).startswith("tile M 192: got swap_ab=True, split_k=2; ")     # no raw (True, 2, False) tuple


def test_stream_k_hint_describes_the_decomposition():
    (v,) = check_schedule(Schedule(stream_k="yes"), SPEC)
    assert v.limit == "stream_k" and "whole waves run data-parallel" in v.fix and "last partial wave" in v.fix
    assert "k-iteration shares per CTA" not in v.fix


def test_rejects_sm80_clusters_and_pingpong():
    assert "cluster" in limits(Schedule((128, 128, 32), (2, 1), arch="sm_80"))
    assert "mode" in limits(Schedule((128, 128, 32), mode="pingpong", arch="sm_80"))


@pytest.mark.parametrize("bk", [16, 48, 80, 96, 112])
def test_rejects_sm80_k_tiles_its_kernel_cannot_build(bk):
    """The SM80 kernel double-buffers two 16-deep k-blocks and spreads 16-byte cp.async vectors evenly along K:
    32, 64 or 128. (16 and 48-112 passed the predicate and failed in the backend.) SM90 takes any 16 multiple."""
    assert "tile K (sm_80)" in limits(Schedule((128, 128, bk), arch="sm_80"))
    assert not {"tile K", "tile K (sm_80)"} & limits(Schedule((128, 128, bk), mode="cooperative"))


def test_rejects_f16_accumulation_on_sm80_and_does_not_send_sm90_users_there():
    f16acc = GemmSpec(m=4096, n=4096, k=4096, dtype="f16", acc_dtype="f16")
    (v,) = check_schedule(Schedule((128, 128, 32), arch="sm_80"), f16acc)
    assert v.limit == "acc_dtype (sm_80)" and "acc_dtype='f32'" in v.fix
    epi = GemmSpec(m=4096, n=4096, k=4096, dtype="f16", acc_dtype="f16", epilogue=(EpilogueOp("relu", (Ref.acc(),)),))
    (v,) = check_schedule(Schedule(), epi)
    assert "sm_80" not in v.fix


def test_rejects_split_k_beyond_k_tiles():
    small_k = GemmSpec(m=4096, n=4096, k=128)  # two k-tiles of 64
    assert "split_k" in limits(Schedule(split_k=4), small_k)
    assert "split_k" not in limits(Schedule(split_k=2), small_k)
    assert "split_k" not in limits(Schedule(split_k=4), GemmSpec(m=4096, n=4096, k="K"))  # unknown K: runtime


@pytest.mark.parametrize("spec, what", [
    (GemmSpec(m=4096, n=4096, k=4100), "A's contiguous dim K"),
    (GemmSpec(m=4100, n=4096, k=4096, a_layout="km"), "A's contiguous dim M"),
    (GemmSpec(m=4096, n=4100, k=4096, b_layout="kn"), "B's contiguous dim N"),
    (GemmSpec(m=4096, n=4102, k=4096, out_dtype="f32"), "the output's N"),  # 4102 is not a multiple of 4 f32
    (GemmSpec(m=4096, n=4102, k=4096, out_dtype="f32", inputs=(EpilogueInput("r", "full", "f32"),),
              epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("r"))),)), "input r's N"),
])
def test_rejects_16_byte_misaligned_static_dims(spec, what):
    assert f"16-byte alignment of {what}" in limits(Schedule(), spec)
    assert "16-byte alignment of A's contiguous dim K" not in limits(Schedule(), GemmSpec(m=4096, n=4096, k="K"))


def test_require_valid_raises_every_violation():
    with pytest.raises(ScheduleError) as info:
        require_valid(Schedule((256, 256, 128), (4, 8), mode="pingpong"), SPEC)
    names = {v.limit for v in info.value.violations}
    assert {"tile M (pingpong)", "cluster size", "registers", "shared memory"} <= names
    assert "shared memory" in str(info.value) and "cluster size" in str(info.value)


# ---- properties ------------------------------------------------------------------------------

_specs = st.builds(
    GemmSpec,
    m=st.one_of(st.just("M"), st.integers(1, 2048).map(lambda x: 8 * x)),
    n=st.one_of(st.just("N"), st.integers(1, 2048).map(lambda x: 8 * x)),
    k=st.one_of(st.just("K"), st.integers(1, 2048).map(lambda x: 8 * x)),
    dtype=st.sampled_from(["bf16", "f16"]),
    out_dtype=st.sampled_from(["bf16", "f16", "f32"]),
    a_layout=st.sampled_from(["mk", "km"]),
    b_layout=st.sampled_from(["nk", "kn"]),
    inputs=st.sampled_from([(), (EpilogueInput("r", "full", "f32"),), (EpilogueInput("r", "full", "bf16"),
                                                                        EpilogueInput("q", "full", "f32"))]),
)
_archs = st.sampled_from(["sm_90a", "sm_80"])


@given(spec=_specs, arch=_archs)
def test_every_enumerated_schedule_is_valid_and_fits(spec, arch):
    schedules = enumerate_schedules(spec, arch)
    assert schedules, "the standard space always has a schedule for aligned problems"
    lim = ARCH_LIMITS[arch]
    for s in schedules:
        assert check_schedule(s, spec) == [] and s.arch == arch
        stages = resolve_stages(s, spec)
        assert 2 <= stages and smem_bytes(s, spec) <= lim.smem_bytes


_schedules = st.builds(
    Schedule,
    tile=st.tuples(st.sampled_from([32, 64, 128, 192, 256]), st.sampled_from([16, 32, 64, 96, 128, 192, 256]),
                   st.sampled_from([16, 32, 64, 128])),
    cluster=st.tuples(st.sampled_from([1, 2, 3, 4, 8, 16]), st.sampled_from([1, 2, 4, 8, 16])),
    stages=st.one_of(st.just("auto"), st.integers(1, 10)),
    mode=st.sampled_from(["cooperative", "pingpong"]),
    split_k=st.sampled_from([1, 2, 4, 8, 32]),
    arch=_archs,
)


@given(s=_schedules, spec=_specs)
def test_valid_schedules_respect_every_resource_limit(s, spec):
    """Whatever the predicate accepts is within each limit it claims to enforce (checked independently)."""
    lim = ARCH_LIMITS[s.arch]
    if not is_valid(s, spec):
        assert all(v.limit and v.fix for v in check_schedule(s, spec))
        with pytest.raises(ScheduleError):
            require_valid(s, spec)
        return
    bm, bn, bk = s.tile
    cm, cn = s.cluster
    assert smem_bytes(s, spec) <= lim.smem_bytes and resolve_stages(s, spec) >= 2
    assert cm * cn <= lim.max_cluster
    if s.arch == "sm_80":
        assert (cm, cn) == (1, 1) and s.mode == "cooperative"
    else:
        assert bm % (8 * cn) == 0 and bn % (8 * cm) == 0
    threads = 128 if (s.arch == "sm_90a" and s.mode == "pingpong") else (256 if s.arch == "sm_90a" else None)
    if threads:
        # the accumulators and what ptxas keeps beside them (tests/test_register_model.py) fit the consumers'
        # setmaxnreg budget, and the budgets fit the CTA's launch registers (384 x 168)
        producer, consumer = register_budgets(s, spec)
        assert math.ceil(bm * bn / threads) + consumer_reg_overhead(s, spec) <= consumer <= 240
        assert 128 * producer + 256 * consumer <= 384 * 168
    if isinstance(spec.k, int):
        assert math.ceil(spec.k / bk) >= s.split_k


@given(s=_schedules, spec=_specs)
def test_auto_stages_fill_but_never_overflow_shared_memory(s, spec):
    s = s.with_(stages="auto")
    lim = ARCH_LIMITS[s.arch]
    stages = resolve_stages(s, spec)
    cap = 8 if s.arch == "sm_90a" else 5
    assert stages == min(cap, max_stages(s, spec))
    if stages >= 2:
        assert smem_bytes(s, spec) <= lim.smem_bytes
        if stages < cap:  # one more stage would not fit
            assert smem_bytes(s.with_(stages=stages + 1), spec) > lim.smem_bytes


def test_space_for_arch_matches_the_predicate():
    assert ScheduleSpace.for_arch("sm_80").clusters == ((1, 1),)
    assert all(s.mode == "cooperative" for s in enumerate_schedules(SPEC, "sm_80"))
    sm90 = enumerate_schedules(SPEC, "sm_90a")
    assert any(s.mode == "pingpong" and s.tile[0] == 64 for s in sm90)
    assert not any(s.mode == "pingpong" and s.tile[1] == 256 and s.tile[0] == 128 for s in sm90)  # registers


def test_split_k_stages_f32_partials_through_the_epilogue_smem():
    # Measured on the H200 (2026-11-30): a 128x192 cooperative split-K kernel allocated 238592 B, over the
    # 232448 B limit, when the model counted bf16 epilogue buffers; its partials are f32. Since the in-kernel
    # fix-up (split_k_mode "fixup", 2 splits on sm_90a) the last split stores the output dtype, as an unsplit
    # kernel does; only the reduce-kernel mode ("serial", from 3 splits) stages f32.
    from gemmc.schedule import ARCH_LIMITS, FIXUP_MAX_SPLITS, epilogue_smem_bytes, smem_bytes, split_k_mode
    spec = GemmSpec(m=4096, n=4096, k=4096)
    plain = Schedule(tile=(128, 192, 64))
    fixup = plain.with_(split_k=FIXUP_MAX_SPLITS)
    serial = plain.with_(split_k=FIXUP_MAX_SPLITS + 1)
    assert [split_k_mode(s) for s in (plain, fixup, serial)] == ["none", "fixup", "serial"]
    assert epilogue_smem_bytes(fixup, spec) == epilogue_smem_bytes(plain, spec) == 128 * 32 * 2 * 2
    assert epilogue_smem_bytes(serial, spec) == 2 * epilogue_smem_bytes(plain, spec)
    assert all(smem_bytes(s, spec) <= ARCH_LIMITS["sm_90a"].smem_bytes for s in (plain, fixup, serial))
    assert resolve_stages(serial, spec) == 4 and resolve_stages(fixup, spec) == resolve_stages(plain, spec) == 5
    # sm_80 has no fix-up: its split-K always sums in a second kernel
    assert split_k_mode(Schedule(tile=(128, 128, 32), arch="sm_80", split_k=2)) == "serial"


def test_split_k_epilogue_inputs_are_staged_only_where_the_kernel_runs_the_epilogue():
    # a full (M x N) residual goes through smem in the kernel that runs the epilogue: the GEMM kernel
    # unsplit and under the fix-up; under the reduce kernel ("serial") the main kernel stages only f32
    from gemmc.schedule import epilogue_smem_bytes
    spec = GemmSpec(m=4096, n=4096, k=4096, inputs=(EpilogueInput("res", "full", "bf16"),),
                    epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("res"))),))
    plain = Schedule(tile=(128, 128, 64))
    c_bytes, res_bytes = 128 * 32 * 2 * 2, 128 * 32 * 2 * 2
    assert epilogue_smem_bytes(plain, spec) == c_bytes + res_bytes
    assert epilogue_smem_bytes(plain.with_(split_k=2), spec) == c_bytes + res_bytes
    assert epilogue_smem_bytes(plain.with_(split_k=4), spec) == 128 * 32 * 4 * 2
    assert epilogue_smem_bytes(plain.with_(swap_ab=True), spec) == c_bytes


# ---- pdl (programmatic dependent launch): on by default, off by choice, never searched --------------

def test_pdl_off_is_a_suffix_of_the_id_and_a_key_of_the_dict():
    on = Schedule(tile=(128, 256, 64), cluster=(2, 1), stages=4, raster="n", swizzle=8, split_k=2)
    off = on.with_(pdl=False)
    assert on.short() == "128x256x64_c2x1_coop_s4_rn_sw8_k2"
    assert off.short() == "128x256x64_c2x1_coop_s4_rn_sw8_k2_nopdl"
    assert on.to_dict() == {"tile": (128, 256, 64), "cluster": (2, 1), "stages": 4, "mode": "cooperative",
                            "raster": "n", "swizzle": 8, "split_k": 2, "arch": "sm_90a"}
    assert off.to_dict() == {**on.to_dict(), "pdl": False}
    assert Schedule.from_dict(on.to_dict()) == on and Schedule.from_dict(off.to_dict()) == off
    assert Schedule.from_dict(json.loads(json.dumps(off.to_dict()))) == off


def test_recorded_schedules_without_pdl_load_as_pdl_on():
    from gemmc.choose.pretuned import DATA_DIR, table_from_json
    shipped = json.loads((Path(DATA_DIR) / "h200.json").read_text())
    table = table_from_json(shipped)
    assert table.entries and all(e.schedule.pdl for e in table.entries.values())
    assert json.loads(json.dumps(table.to_json())) == shipped     # written back unchanged: no pdl key
    _, records = load_dataset(Path(__file__).parents[1] / "bench" / "data" / "2026-11-30-h200-sweep-splitk.jsonl.gz")
    for rec in records[:50]:
        s = record_schedule(rec)
        assert "pdl" not in rec["schedule"] and s.pdl
        assert json.loads(json.dumps(s.to_dict())) == rec["schedule"]


def test_pdl_must_be_a_bool_and_is_not_searched():
    assert check_schedule(Schedule(pdl=False), SPEC) == []
    assert check_schedule(Schedule((128, 128, 32), arch="sm_80", pdl=False), SPEC) == []
    assert limits(Schedule(pdl="no")) == {"pdl"}
    for arch in ("sm_90a", "sm_80"):
        assert all(s.pdl for s in enumerate_schedules(SPEC, arch))


def test_the_swapped_spaces_join_only_for_small_known_m_on_sm90():
    from gemmc.schedule import SWAP_DECODE_MAX_M, SWAP_MAX_M, ScheduleSpace, standard_spaces
    assert standard_spaces(GemmSpec(m=16, n=4096, k=4096)) == (ScheduleSpace.for_arch("sm_90a"),
                                                               ScheduleSpace.swapped_decode())
    for m in (SWAP_DECODE_MAX_M + 1, 64, SWAP_MAX_M):
        assert standard_spaces(GemmSpec(m=m, n=4096, k=4096)) == (ScheduleSpace.for_arch("sm_90a"),
                                                                  ScheduleSpace.swapped_batch(),
                                                                  ScheduleSpace.odd_n_tiles())
    for spec, arch in ((GemmSpec(m=SWAP_MAX_M + 1, n=4096, k=4096), "sm_90a"),
                       (GemmSpec(m="M", n=4096, k=4096), "sm_90a"),          # M unknown at compile time
                       (GemmSpec(m=16, n=4096, k=4096), "sm_80"),
                       (GemmSpec(m=64, n=4096, k=4096), "sm_80")):
        assert not any(s.swap_ab for s in enumerate_schedules(spec, arch))
    small = enumerate_schedules(GemmSpec(m=16, n=4096, k=4096), "sm_90a")
    swapped = [s for s in small if s.swap_ab]
    assert swapped and all(is_valid(s, GemmSpec(m=16, n=4096, k=4096)) for s in swapped)
    assert {s.tile[1] for s in swapped} == {8, 16, 32} and all(s.split_k == 1 for s in swapped)
    assert {s.stages for s in swapped} == {"auto", 10, 16}          # 16 stages only where they fit
    assert {s.cluster for s in swapped} == {(1, 1), (1, 2)}         # alone, or two activation tiles per weight tile
    assert len(small) == len(set(small))                               # the two spaces do not overlap


def test_the_odd_n_tiles_join_for_m_33_to_128_and_hold_the_h200_table_winners():
    from gemmc.schedule import SWAP_DECODE_MAX_M, SWAP_MAX_M
    narrow = lambda spec: {s.short() for s in enumerate_schedules(spec, "sm_90a") if s.tile[1] in (48, 80, 112)}
    spec = GemmSpec(m=64, n=57344, k=8192)
    got = narrow(spec)
    # 3 widths x 3 clusters, all 64-row ping-pong, K tile 128, unswapped
    assert len(got) == 9 and all(x.startswith("64x") and "_pp_sauto_rm_sw1_k1" in x and "swap" not in x for x in got)
    for name in ("64x48x128_c1x1_pp_sauto_rm_sw1_k1", "64x80x128_c1x2_pp_sauto_rm_sw1_k1",
                 "64x112x128_c1x2_pp_sauto_rm_sw1_k1"):
        assert name in got, name
    for m in (SWAP_DECODE_MAX_M, SWAP_MAX_M + 1, "M"):
        assert not narrow(GemmSpec(m=m, n=57344, k=8192)), m
    assert not narrow(GemmSpec(m=64, n=57344, k=8192)) - {s.short() for s in enumerate_schedules(spec)}
    assert not any(s.tile[1] in (48, 80, 112) for s in enumerate_schedules(GemmSpec(m=64, n=4096, k=4096), "sm_80"))


def test_the_swapped_batch_space_pairs_activation_tiles_in_a_cluster_and_fills_smem():
    spec = GemmSpec(m=64, n=4096, k=4096)
    swapped = [s for s in enumerate_schedules(spec, "sm_90a") if s.swap_ab]
    assert {s.tile[1] for s in swapped} == {32, 64} and {s.cluster for s in swapped} == {(1, 1), (1, 2)}
    assert all(s.split_k == 1 and is_valid(s, spec) for s in swapped)
    # the H200 winners at M = 64 / 128 are in it (bench/results/2026-11-30-h200-session7.json.gz)
    for name in ("64x32x128_c1x2_pp_s9_rm_sw1_k1_swap", "128x32x64_c1x2_pp_s10_rm_sw1_k1_swap",
                 "64x64x128_c1x1_pp_sauto_rm_sw1_k1_swap", "64x64x128_c1x2_pp_sauto_rm_sw1_k1_swap"):
        assert name in {s.short() for s in swapped}, name
    # a depth is offered only where it fits: 64x32x128 (24 KiB a stage) takes 9, not 10
    depths = {s.stages for s in swapped if s.tile == (64, 32, 128) and s.cluster == (1, 2) and s.mode == "pingpong"}
    assert depths == {"auto", 9}


def test_a_swapped_kernel_stages_only_c_in_smem():
    """Swapped kernels read full epilogue inputs from global memory (ldg), so only C's staging is charged:
    9 stages of 64x32x128 still fit beside a residual input (unswapped, the input's staging would not)."""
    from gemmc.schedule import epilogue_smem_bytes
    res = GemmSpec(m=64, n=4096, k=4096, inputs=(EpilogueInput("res", "full", "bf16"),),
                   epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("res"))),))
    swapped = Schedule((64, 32, 128), (1, 2), 9, "pingpong", swap_ab=True)
    plain = GemmSpec(m=64, n=4096, k=4096)
    assert epilogue_smem_bytes(swapped, res) == epilogue_smem_bytes(swapped, plain) > 0
    assert is_valid(swapped, res)
    unswapped = Schedule((64, 32, 128), (1, 2), 9, "pingpong")
    assert epilogue_smem_bytes(unswapped, res) > epilogue_smem_bytes(unswapped, plain)
    assert not is_valid(unswapped, res)


def test_one_limits_table_covers_every_target_the_sm80_kernel_builds_for():
    """The schedule archs and the SM80 kernel's other compile targets share ARCH_LIMITS: sm_86/sm_89 CTAs get
    99 KB of shared memory, sm_90 is sm_90a's chip."""
    assert set(SM80_COMPILE_ARCHS) <= set(ARCH_LIMITS)
    smem = {arch: ARCH_LIMITS[arch].smem_bytes for arch in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")}
    assert smem == {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448, "sm_90a": 232448}
    assert ARCH_LIMITS["sm_90"] is ARCH_LIMITS["sm_90a"]
    assert all(ARCH_LIMITS[a].name == a and not ARCH_LIMITS[a].has_tma and ARCH_LIMITS[a].max_cluster == 1
               for a in ("sm_80", "sm_86", "sm_89"))


def test_the_sm80_ring_is_each_operands_stages_at_a_1024_byte_boundary():
    s = Schedule(tile=(128, 256, 64), arch="sm_80")
    assert resolve_stages(s, SPEC) == 3
    assert sm80_ring_smem_bytes(s, SPEC) == 3 * (128 + 256) * 64 * 2 == smem_bytes(s, SPEC) - 1024
    odd = Schedule(tile=(16, 24, 16), stages=3, arch="sm_80")     # 16 x 16 x 3 x 2 B = 1536 B -> 2048 B
    assert sm80_ring_smem_bytes(odd, SPEC) == 2048 + 3072
