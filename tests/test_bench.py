"""CPU tests of the benchmark harness: suites, shape files, statistics, policy strings, the timing
loop (fake kernels on a virtual clock), the report/plot, the dataset format and the CLI's errors."""
import gzip
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gemmc.bench import dataset as ds
from gemmc.bench import report, stats, suites, timing
from gemmc.bench.cli import main as bench_main
from gemmc.bench.policy import PolicyError, parse_policy, parse_schedule, policy_name
from gemmc.errors import SpecError
from gemmc.schedule import MODES, RASTERS, SWIZZLES, Schedule



@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The fake kernels do thousands of tiny CPU matmuls: with more threads than free cores each one
    takes milliseconds instead of microseconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- suites ----------------------------------------------------------------------------------------


def test_square_suite_is_powers_of_two_256_to_16384():
    shapes = suites.get_suite("square")
    assert [s.m for s in shapes] == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert all(s.m == s.n == s.k for s in shapes)


def test_llm_suite_is_8_nk_pairs_times_8_m():
    shapes = suites.get_suite("llm")
    assert len(shapes) == 64 == len(set(shapes))
    assert {(s.n, s.k) for s in shapes} == {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                                            (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)}
    assert sorted({s.m for s in shapes}) == [1, 16, 64, 128, 256, 1024, 4096, 16384]
    assert suites.Shape(4096, 57344, 8192) in shapes


def test_cuda_l2_full_grid_has_1000_shapes():
    shapes = suites.get_suite("cuda-l2")
    dims = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384]
    assert len(shapes) == 1000 == len(set(shapes))
    assert {s.m for s in shapes} == {s.n for s in shapes} == {s.k for s in shapes} == set(dims)


def test_cuda_l2_sample_is_seeded_and_from_the_grid():
    a = suites.get_suite("cuda-l2", sample=100, seed=0)
    b = suites.get_suite("cuda-l2", sample=100, seed=0)
    c = suites.get_suite("cuda-l2", sample=100, seed=1)
    grid = set(suites.cuda_l2())
    assert a == b and a != c
    assert len(a) == 100 == len(set(a)) and set(a) <= grid


def test_unknown_suite_and_bad_sample_are_clear_errors():
    with pytest.raises(SpecError, match="unknown suite 'big'.*square, llm, cuda-l2"):
        suites.get_suite("big")
    with pytest.raises(SpecError, match="positive"):
        suites.get_suite("cuda-l2", sample=0)


def test_shape_flops_and_name():
    s = suites.Shape(2, 3, 4)
    assert s.flops == 48.0 and str(s) == "2x3x4"
    with pytest.raises(SpecError, match="N=0"):
        suites.Shape(1, 0, 1)


# ---- shape files ---------------------------------------------------------------------------------

GOOD = """\
# my shapes
M,N,K
1, 4096, 4096
  16 6144\t4096   # decode
 
8192;8192;8192
"""


def test_parse_shapes_accepts_comments_csv_header_and_separators(tmp_path):
    f = tmp_path / "s.csv"
    f.write_text(GOOD)
    assert suites.load_shapes(f) == [suites.Shape(1, 4096, 4096), suites.Shape(16, 6144, 4096),
                                     suites.Shape(8192, 8192, 8192)]


@pytest.mark.parametrize("text, line, msg", [
    ("1 2 3\n4 5\n", 2, "expected 3 numbers"),
    ("1 2 3 4\n", 1, "got 4 field"),
    ("# c\n1 2 x\n", 2, "must be integers"),
    ("1 2 3\n1.5 2 3\n", 2, "must be integers"),
    ("0 2 3\n", 1, "positive"),
    ("-1 2 3\n", 1, "positive"),
])
def test_parse_shapes_bad_lines_name_the_line(text, line, msg):
    with pytest.raises(suites.ShapeFileError, match=rf"f\.txt:{line}: .*{msg}"):
        suites.parse_shapes(text, "f.txt")


def test_parse_shapes_empty_and_missing_file(tmp_path):
    with pytest.raises(suites.ShapeFileError, match="no shapes found"):
        suites.parse_shapes("# nothing\n\n", "e.txt")
    with pytest.raises(suites.ShapeFileError, match="cannot read shapes file"):
        suites.load_shapes(tmp_path / "missing.txt")


@given(st.lists(st.tuples(*[st.integers(1, 100000)] * 3), min_size=1, max_size=20),
       st.sampled_from([" ", ",", "\t", ", "]))
def test_parse_shapes_round_trip(rows, sep):
    text = "\n".join(sep.join(map(str, r)) + "  # c" for r in rows)
    assert suites.parse_shapes(text) == [suites.Shape(*r) for r in rows]


# ---- statistics -----------------------------------------------------------------------------------

def test_summarize_median_quartiles_min_max():
    s = stats.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3, s.min, s.max, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert s.iqr == 2.0 and s.rel_iqr == pytest.approx(2 / 3)
    one = stats.summarize([7.0])
    assert (one.median, one.q1, one.q3) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError):
        stats.summarize([])


def test_geomean_share_and_ratio_summary():
    assert stats.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert stats.geomean([2.0, 2.0, 2.0]) == pytest.approx(2.0)
    assert stats.share_at_least([0.9, 1.0, 1.2, 0.5]) == 0.5
    assert stats.tflops(2e12, 1e6) == pytest.approx(2.0)   # 2 TFLOP in 1 s
    r = stats.ratio_summary([0.5, 2.0, 1.0, float("nan")], n_failed=2)
    assert (r.geomean, r.min, r.max, r.share_ge_1, r.n_ok, r.n_failed) == (pytest.approx(1.0), 0.5, 2.0,
                                                                           pytest.approx(2 / 3), 3, 2)
    assert r.line() == "geomean 1.000x cuBLAS, min 0.500x, max 2.000x, 67% of 3 shapes >= 1.0, 2 failed"
    assert stats.ratio_summary([], 3).line() == "no shape ran (3 failed)"


@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=50))
def test_geomean_lies_between_min_and_max(xs):
    g = stats.geomean(xs)
    assert min(xs) * (1 - 1e-9) <= g <= max(xs) * (1 + 1e-9)


# ---- policy strings --------------------------------------------------------------------------------

@given(st.sampled_from([64, 128, 256]), st.sampled_from([64, 128, 192, 256]), st.sampled_from([32, 64, 128]),
       st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), st.sampled_from(["auto", 2, 4, 7]), st.sampled_from(MODES),
       st.sampled_from(RASTERS), st.sampled_from(SWIZZLES), st.sampled_from([1, 2, 4]), st.booleans())
def test_schedule_short_string_round_trips(bm, bn, bk, cl, stg, mode, raster, sw, sk, pdl):
    s = Schedule((bm, bn, bk), cl, stg, mode, raster, sw, sk, pdl=pdl)
    assert s.short().endswith("_nopdl") != pdl
    assert parse_schedule(s.short()) == s
    assert parse_policy(s.short()) == s and policy_name(s) == s.short()


def test_parse_policy_names_and_partial_schedules():
    assert parse_policy("heuristic") == "heuristic" and parse_policy(" AUTO ") == "auto"
    s = parse_policy("128x256x64_c2x1_coop")
    assert s == Schedule(tile=(128, 256, 64), cluster=(2, 1), mode="cooperative")
    assert parse_policy("64x128_pp_k2").tile == (64, 128, 64)
    assert parse_policy("64x128_pp_k2").split_k == 2
    assert parse_policy("64x128_k2_nopdl") == Schedule(tile=(64, 128, 64), split_k=2, pdl=False)
    with pytest.raises(PolicyError, match="pdl given twice"):
        parse_policy("64x128_nopdl_nopdl")


@pytest.mark.parametrize("text, msg", [
    ("fastest", "first token must be the tile"),
    ("128x128x64_c2", "unknown token 'c2'"),
    ("128x128x64_coop_pp", "mode given twice"),
    ("128x128x64_zz", "unknown token 'zz'"),
])
def test_parse_policy_errors_say_what_to_write(text, msg):
    with pytest.raises(PolicyError, match=msg):
        parse_policy(text)


# ---- timing on a virtual clock ------------------------------------------------------------------------

from bench_fakes import FakeKernel, VirtualClock  # noqa: E402  (shared with test_bench_audit.py)


SMALL = [suites.Shape(64, 32, 48), suites.Shape(8, 16, 32)]


def _cpu_bench(kernels, cfg=timing.TimingConfig(repeats=5, warmup=1, min_unit_us=100), shapes=SMALL,
               cublas_us=12.0, **kw):
    clock = VirtualClock()
    log = []
    made = {}

    def compile_fn(shape):
        k = kernels(clock, log, shape)
        made[shape] = k
        return k

    cublas = FakeKernel(clock, cublas_us, "cublas", log)
    results = timing.run_bench(shapes, "heuristic", cfg, device="cpu", compile_fn=compile_fn, cublas=cublas,
                               clock=clock, l2_bytes=64 * 1024, progress=False, **kw)
    return results, made, cublas, clock, log


def test_side_by_side_checks_the_named_kernels_then_times_all_beside_cublas():
    clock = VirtualClock()
    shape = suites.Shape(64, 32, 48)
    kernels = {"kernel": FakeKernel(clock, 10.0), "variant": FakeKernel(clock, 4.0, wrong=True)}
    cublas = FakeKernel(clock, 12.0, "cublas")
    cfg = timing.TimingConfig(min_unit_us=100)
    res = timing.time_side_by_side(shape, kernels, clock, checked=["kernel"], repeats=3, cfg=cfg, cublas=cublas,
                                   device="cpu", l2_bytes=64 * 1024)
    assert res["us"] == pytest.approx({"cublas": 12.0, "kernel": 10.0, "variant": 4.0})
    assert list(res["rel_err"]) == ["kernel"] and res["rel_err"]["kernel"] < 1e-2   # the variant is only timed
    assert res["launches"] == timing.launch_count(12.0, res["sets"].n, cfg) and set(res["units"]) == set(res["us"])
    # (1 warm-up + 3 repeats) units per side, after the estimate (warm-up + best of 3) and the checked kernel's
    # one call; then the checked kernel's graph replayed once more onto NaN, and checked on the slots of its first
    # and last launch (cuBLAS's own error on each: one call per input set)
    launches, n = res["launches"], res["sets"].n
    slots = {0, (launches - 1) % n}
    assert cublas.calls == 4 + 4 * launches + len(slots) and kernels["kernel"].calls == 1 + 5 * launches
    with pytest.raises(ValueError, match="64x32x48 variant: relative Frobenius error"):
        timing.time_side_by_side(shape, kernels, clock, cfg=cfg, cublas=cublas, device="cpu", l2_bytes=64 * 1024)


def test_prepare_units_gives_every_side_one_launch_count_and_its_own_outputs():
    clock = VirtualClock()
    shape = suites.Shape(64, 32, 48)
    cfg = timing.TimingConfig(min_unit_us=100)
    sets = timing.make_input_sets(shape, torch.bfloat16, "cpu", 3)
    cublas, other = FakeKernel(clock, 12.0, "cublas"), FakeKernel(clock, 5.0, "other")
    sides = {"other": (other, sets.out_gemmc), "cublas": (cublas, sets.out_cublas)}
    units, launches, est_us = timing.prepare_units(sides, sets, clock, cfg, cublas, host_timing=False)
    assert list(units) == ["other", "cublas"] and est_us == pytest.approx(12.0)
    assert launches == timing.launch_count(12.0, 3, cfg) == 9 and clock.prepared == [1, 9, 9]
    assert cublas.calls == 4    # the estimate: one warm-up replay, then the best of 3
    for out in sets.out_gemmc:
        out.fill_(float("nan"))
    units["other"]()
    # launch i reads input set i mod 3 and writes its slot: every gemmc slot written, cuBLAS's left alone
    assert other.calls == 9 and all(o.isfinite().all() for o in sets.out_gemmc)
    assert cublas.calls == 4


def test_timing_loop_measures_each_side_and_the_ratio():
    sched = Schedule(tile=(128, 128, 64))
    results, made, cublas, clock, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log, schedule=sched))
    assert [r["status"] for r in results] == ["ok", "ok"]
    r = results[0]
    assert r["gemmc_us"]["median"] == pytest.approx(10.0) and r["cublas_us"]["median"] == pytest.approx(12.0)
    assert r["gemmc_us"]["n"] == 5 and len(r["gemmc_samples_us"]) == 5
    assert r["ratio"] == pytest.approx(1.2)
    assert r["gemmc_tflops"] == pytest.approx(2 * 64 * 32 * 48 / 10e-6 / 1e12)
    assert r["schedule"] == sched.short() and r["schedule_dict"] == sched.to_dict()
    assert r["rel_err"] < 1e-2 and r["cublas_rel_err"] < 1e-2 and r["elem_err"] <= 0.5 and r["cublas_elem_err"] <= 0.5
    # the timed launches' own outputs: the slots of the unit's first and last call, every slot finite
    assert r["timed_slots"] == sorted({0, (r["launches"] - 1) % r["input_sets"]}) and r["timed_nonfinite_slots"] == 0
    assert r["timed_elem_err"] <= 0.5 and r["timed_rel_err"] < 1e-2
    # launches: >= min_unit_us / estimate (100 / 12 -> 9), and >= one per input set
    assert r["launches"] == max(9, r["input_sets"])
    assert r["input_sets"] == timing.input_set_count(SMALL[0], 2, 64 * 1024)
    assert r["rotated_bytes"] >= 2 * 64 * 1024
    # every call of a timed unit writes into the preallocated output (graph mode)
    assert all(made[SMALL[0]].out_args)


class SteppingKernel(FakeKernel):
    """A kernel whose cost rises by `step` (a clock step-down under the power cap) after `after` calls
    of either side; `state` is shared between the two sides like the GPU's clock."""

    def __init__(self, clock, us, name, log, state, step=1.10, after=10 ** 9):
        super().__init__(clock, us, name, log)
        self.state, self.step, self.after = state, step, after

    def __call__(self, a, b, out=None):
        self.state["calls"] += 1
        slow = self.step if self.state["calls"] > self.after else 1.0
        self.clock.now_ms += self.us * (slow - 1.0) / 1000
        return super().__call__(a, b, out)


def test_a_clock_step_mid_run_cancels_in_the_paired_ratio():
    """Measured on the H200 (16384x8192x8192): both sides stepped ~9% slower part-way through the
    repeats, and the ratio of the medians read 0.94 where each back-to-back pair read 0.98 or 1.05.
    The ratio is now the median of the per-repeat ratios; the step shows up as drift."""
    cfg = timing.TimingConfig(repeats=10, warmup=0, min_unit_us=100)
    sh = suites.Shape(64, 32, 48)

    def run(after):
        clock, log, state = VirtualClock(), [], {"calls": 0}
        sets = timing.make_input_sets(sh, torch.bfloat16, "cpu", 4, 0)
        gemmc = SteppingKernel(clock, 10.0, "gemmc", log, state, after=after)
        cublas = SteppingKernel(clock, 11.0, "cublas", log, state, after=after)
        return timing.bench_shape(sh, gemmc, sets, clock, cfg, cublas=cublas), log

    steady, log = run(after=10 ** 9)
    assert steady["ratio"] == pytest.approx(1.1) and steady["ratio_of_medians"] == pytest.approx(1.1)
    # step the clock between gemmc and cuBLAS of repeat 4 (order g, c): gemmc gets 5 fast samples, cuBLAS 4
    units = steady["launches"]
    tail = len(steady["timed_slots"]) - 1       # after timing: cuBLAS's own error on the last launch's input set
    start = len(log) - tail - 2 * cfg.repeats * units
    rec, _ = run(after=start + 2 * 4 * units + units)
    assert rec["ratio"] == pytest.approx(1.1)                          # 9 of 10 pairs: 11 / 10
    assert rec["ratio_of_medians"] == pytest.approx(11 * 1.1 / (10 * 1.05))   # straddles the step: 1.152
    assert rec["drift"]["gemmc"] == pytest.approx(0.10) and rec["drift"]["cublas"] == pytest.approx(0.10)
    assert rec["settle_units"] == 0


def test_settle_runs_cublas_before_timing_long_shapes_only():
    clock, log = VirtualClock(), []
    sh = suites.Shape(64, 32, 48)
    sets = timing.make_input_sets(sh, torch.bfloat16, "cpu", 2, 0)
    cfg = timing.TimingConfig(repeats=2, warmup=0, min_unit_us=100, settle_s=0.01)
    long_call = timing.SETTLE_MIN_CALL_US * 1.01     # (exactly at the threshold, the virtual clock's rounding decides)
    rec = timing.bench_shape(sh, FakeKernel(clock, 10.0, "gemmc", log), sets, clock, cfg,
                             cublas=FakeKernel(clock, long_call, "cublas", log))
    assert rec["settle_units"] >= 1
    log.clear()
    rec = timing.bench_shape(sh, FakeKernel(clock, 10.0, "gemmc", log), sets, clock, cfg,
                             cublas=FakeKernel(clock, long_call / 2, "cublas", log))
    assert rec["settle_units"] == 0


class PowerCappedKernel(FakeKernel):
    """Under a power cap the clock follows the energy the recent calls draw: a call costs its cycles times
    the mean energy intensity of the last WINDOW calls of either side (`state`, shared like the GPU)."""
    WINDOW = 200

    def __init__(self, clock, cycles, intensity, name, log, state):
        super().__init__(clock, 0.0, name, log)
        self.cycles, self.intensity, self.state = cycles, intensity, state

    def __call__(self, a, b, out=None):
        recent = self.state.setdefault("recent", [])
        recent.append(self.intensity)
        del recent[:-self.WINDOW]
        self.us = self.cycles * sum(recent) / len(recent)
        return super().__call__(a, b, out)


def test_sustained_timing_sees_what_a_kernel_costs_at_its_own_power_capped_clock():
    """Measured on the H200 (scripts/power_clock.py, session 16): at 16384x57344x8192 a 128x128 ping-pong
    kernel took 2% fewer cycles than cuBLAS but ran at 1170 against 1400 MHz in its own sustained window
    (0.85x), while short interleaved units read it 1.045x faster: their shared clock is set by both."""
    sh = suites.Shape(64, 32, 48)
    sets = timing.make_input_sets(sh, torch.bfloat16, "cpu", 2, 0)

    def run(cfg, cycles=100.0):
        clock, log, state = VirtualClock(), [], {}
        gemmc = PowerCappedKernel(clock, cycles, 1.25, "gemmc", log, state)      # fewer cycles, more energy
        cublas = PowerCappedKernel(clock, 1.1 * cycles, 1.0, "cublas", log, state)
        return timing.bench_shape(sh, gemmc, sets, clock, cfg, cublas=cublas)

    short = run(timing.TimingConfig(repeats=4, warmup=1, min_unit_us=1000))
    assert short["sustained"] is False and short["ratio"] == pytest.approx(1.1, rel=0.03)
    cfg = timing.TimingConfig(repeats=4, warmup=1, min_unit_us=1000, sustained_s=0.02, settle_s=5.0)
    held = run(cfg)
    assert held["sustained"] is True and held["settle_units"] == 0           # sustained replaces settling
    assert held["gemmc_us"]["median"] == pytest.approx(125.0, rel=0.01)       # 100 cycles x 1.25
    assert held["cublas_us"]["median"] == pytest.approx(110.0, rel=0.01)      # 110 cycles x 1.0
    assert held["ratio"] == pytest.approx(0.88, rel=0.01)
    # calls under SETTLE_MIN_CALL_US are not power-capped in a unit's time: timed interleaved as before
    assert run(cfg, cycles=10.0)["sustained"] is False


def test_sustained_timing_settles_each_side_before_each_sample_in_alternating_order():
    clock, log = VirtualClock(), []
    units = {"gemmc": lambda: log.append("g"), "cublas": lambda: log.append("c")}
    samples = timing.time_sustained(units, clock, repeats=2, seconds=0.002)
    runs = "".join(log)
    assert {k: len(v) for k, v in samples.items()} == {"gemmc": 2, "cublas": 2}
    # one run of gemmc units (settle + sample), then cuBLAS, then cuBLAS again, then gemmc
    assert [k for k, _ in itertools.groupby(runs)] == ["g", "c", "g"]
    assert runs.startswith("gg") and runs.endswith("gg")


def test_timing_interleaves_and_alternates_the_order():
    clock = VirtualClock()
    log = []
    units = {"gemmc": lambda: log.append("g"), "cublas": lambda: log.append("c")}
    samples = timing.time_interleaved(units, clock, repeats=4, warmup=1)
    assert "".join(log) == "gc" + "gccggccg"
    assert {k: len(v) for k, v in samples.items()} == {"gemmc": 4, "cublas": 4}


def test_a_wrong_result_is_reported_and_not_timed():
    results, made, _, _, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log, wrong=True))
    r = results[0]
    assert r["status"] == "check_failed" and "relative Frobenius error" in r["error"]
    assert r["rel_err"] == pytest.approx(0.5, rel=1e-2)
    assert made[SMALL[0]].calls == 1          # the check only
    assert "gemmc_us" not in r and "ratio" not in r


def test_unwritten_output_fails_the_check_through_the_nan_fill():
    results, made, _, _, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log, skip_write=True))
    assert results[0]["status"] == "check_failed" and math.isnan(results[0]["rel_err"])


def test_an_f16_output_rounded_through_bf16_fails_the_check():
    """Its relative error (~0.0017) passed the old check (< 1e-2); it is ~8x cuBLAS's, and up to 4x the
    elementwise bound of an f16 output."""
    def via_bf16(n, a, res):
        return res.to(torch.bfloat16).to(res.dtype)
    results, made, _, _, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log, bug=via_bf16),
                                        dtype="f16")
    r = results[0]
    assert r["status"] == "check_failed" and made[SMALL[0]].calls == 1      # not timed
    assert r["rel_err"] < 1e-2 and r["elem_err"] > 1 and r["rel_err"] > 2 * r["cublas_rel_err"] + 1e-4
    assert r["error"].startswith(f"relative Frobenius error {r['rel_err']:.3g} (limit ")
    assert f"max elementwise error {r['elem_err']:.3g} x its bound (limit 1" in r["error"]
    ok, _, _, _, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log), dtype="f16")
    assert [x["status"] for x in ok] == ["ok", "ok"] and ok[0]["elem_err"] <= 0.5


# ---- the timed launches are checked ------------------------------------------------------------------

def _stale_after_first(n, a, res):   # right in the eager check, wrong in every replay (say a stale semaphore)
    return res if n == 1 else res * 1.5


def _skips_after_first(n, a, res):   # writes in the eager check, nothing in the replays
    return res if n == 1 else None


@pytest.mark.parametrize("bug, what", [(_stale_after_first, "relative Frobenius error"),
                                       (_skips_after_first, "relative Frobenius error nan")])
@pytest.mark.parametrize("aa_check", [False, True])
def test_a_kernel_wrong_only_in_the_timed_replays_fails(bug, what, aa_check):
    """The eager check passes; the timed graph's replays are wrong (or write nothing into the NaN-filled slots).
    With the A/A check cuBLAS writes into gemmc's slots too: gemmc's graph is replayed once more onto NaN."""
    cfg = timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100, aa_check=aa_check)
    results, made, _, _, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log, bug=bug), cfg=cfg)
    for r in results:
        assert r["rel_err"] < 1e-2 and r["elem_err"] <= 1            # the eager check passed
        assert r["status"] == "check_failed" and r["error"].startswith("timed launches (slots ")
        assert what in r["error"] and not r["timed_elem_err"] <= 1


def test_a_slot_left_unwritten_by_the_replays_fails_through_the_finiteness_scan():
    """Only the slots of the unit's first and last call are compared with their references; every other slot is
    scanned for NaN (the fill before the first replay)."""
    clock, log = VirtualClock(), []
    sh = suites.Shape(64, 32, 48)
    sets = timing.make_input_sets(sh, torch.bfloat16, "cpu", 5, 0)
    cfg = timing.TimingConfig(repeats=2, warmup=1, min_unit_us=100)
    bad = sets.a[2].data_ptr()                    # launches = 9 over 5 sets: slots 0 and 3 are compared
    kernel = FakeKernel(clock, 10.0, "gemmc", log, bug=lambda n, a, res: None if a.data_ptr() == bad else res)
    rec = timing.bench_shape(sh, kernel, sets, clock, cfg, cublas=FakeKernel(clock, 12.0, "cublas", log))
    assert rec["launches"] == 9 and rec["timed_slots"] == [0, 3] and rec["timed_elem_err"] <= 0.5
    assert rec["status"] == "check_failed" and rec["timed_nonfinite_slots"] == 1
    assert "non-finite output in 1 of 5 slots (first: slot 2" in rec["error"]


def test_side_by_side_checks_the_timed_graphs_of_the_checked_kernels():
    clock = VirtualClock()
    kernels = {"kernel": FakeKernel(clock, 10.0, bug=_stale_after_first)}
    with pytest.raises(ValueError, match=r"64x32x48 kernel: timed launches \(slots"):
        timing.time_side_by_side(suites.Shape(64, 32, 48), kernels, clock, repeats=2, cfg=timing.TimingConfig(
            min_unit_us=100), cublas=FakeKernel(clock, 12.0, "cublas"), device="cpu", l2_bytes=64 * 1024)


def test_the_launch_estimate_is_the_best_warm_replay():
    """A fresh graph's first replay is slow (cold instruction cache, clocks): the estimate that sizes the units
    skips it and takes the best of 3 more."""
    clock = VirtualClock()
    sets = timing.make_input_sets(suites.Shape(64, 32, 48), torch.bfloat16, "cpu", 3)
    cublas = FakeKernel(clock, 12.0, "cublas")

    def slow_first(n, a, res):    # 120 us the first time, 14 the third, else 12
        clock.now_ms += {1: 108.0, 3: 2.0}.get(n, 0.0) / 1000
        return res
    cold = FakeKernel(clock, 12.0, "cublas", bug=slow_first)
    cfg = timing.TimingConfig(min_unit_us=100)
    _, launches, est_us = timing.prepare_units({"cublas": (cublas, sets.out_cublas)}, sets, clock, cfg, cold, False)
    assert est_us == pytest.approx(12.0) and launches == timing.launch_count(12.0, 3, cfg) == 9
    assert cold.calls == 4


def test_a_compile_error_is_recorded_and_the_run_goes_on():
    def kernels(clock, log, shape):
        if shape == SMALL[0]:
            raise SpecError("tile too big")
        return FakeKernel(clock, 20.0, "gemmc", log)
    results, _, _, _, _ = _cpu_bench(kernels)
    assert results[0]["status"] == "compile_error" and results[0]["error"] == "SpecError: tile too big"
    assert results[1]["status"] == "ok" and results[1]["ratio"] == pytest.approx(0.6)


def test_host_timing_makes_user_calls_without_out():
    cfg = timing.TimingConfig(repeats=3, warmup=0, min_unit_us=100, host_timing=True)
    results, made, cublas, _, _ = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log), cfg=cfg)
    k = made[SMALL[0]]
    assert k.out_args[0] is True                  # the check writes into the NaN-filled output
    assert not any(k.out_args[1:])                # timed calls allocate, as a user's loop does
    assert results[0]["ratio"] == pytest.approx(1.2)


def test_input_sets_cover_twice_the_l2_in_aligned_distinct_slots():
    shape = suites.Shape(3, 5, 8)                 # odd sizes: slots must still be 128B aligned
    n = timing.input_set_count(shape, 2, l2_bytes=4096, l2_factor=2.0)
    assert n == math.ceil(2 * 4096 / ((3 * 8 + 5 * 8 + 3 * 5) * 2))
    sets = timing.make_input_sets(shape, torch.bfloat16, "cpu", n, seed=0)
    assert sets.n == n and sets.rotated_bytes >= 2 * 4096
    for slots in (sets.a, sets.b, sets.out_gemmc):
        base = slots[0].data_ptr()                # CUDA bases are 512B aligned; the CPU's at least 16B
        for t in slots:
            assert (t.data_ptr() - base) % 128 == 0 and t.data_ptr() % 16 == 0 and t.is_contiguous()
    assert sets.a[0].shape == (3, 8) and sets.b[0].shape == (5, 8) and sets.out_gemmc[0].shape == (3, 5)
    assert not torch.equal(sets.a[0], sets.a[1])
    again = timing.make_input_sets(shape, torch.bfloat16, "cpu", n, seed=0)
    assert torch.equal(sets.a[1], again.a[1])     # seeded
    assert timing.input_set_count(suites.Shape(16384, 16384, 16384), 2, 60 << 20) == 1
    assert timing.input_set_count(suites.Shape(64, 64, 64), 2, 60 << 20, max_sets=4096) == 4096


def test_launch_count_bounds():
    cfg = timing.TimingConfig(min_unit_us=1000, min_launches=1, max_launches=200)
    assert timing.launch_count(10.0, 1, cfg) == 100
    assert timing.launch_count(1.0, 1, cfg) == 200
    assert timing.launch_count(5000.0, 1, cfg) == 1
    assert timing.launch_count(5000.0, 7, cfg) == 7     # every input set in every unit


def test_reference_check_error_value():
    a = torch.randn(16, 32, dtype=torch.bfloat16)
    b = torch.randn(8, 32, dtype=torch.bfloat16)
    ref = timing.reference(a, b)
    out = torch.empty(16, 8, dtype=torch.bfloat16)
    assert timing.check_output(timing.cublas_matmul, a, b, out, ref) < 1e-2
    assert timing.check_output(lambda a, b, out: out.zero_(), a, b, out, ref) == pytest.approx(1.0)
    assert timing.check_output(lambda a, b, out: None, a, b, out, ref) == math.inf     # left unwritten


# ---- report -------------------------------------------------------------------------------------------

def _recorded_results():
    """Numbers as a GPU run records them (hand-made), two ok shapes and one failure."""
    def ok(m, n, k, g_us, c_us, sched):
        sh = suites.Shape(m, n, k)
        g = stats.summarize([g_us * 0.99, g_us, g_us * 1.02]).as_dict()
        c = stats.summarize([c_us, c_us * 1.01, c_us * 0.98]).as_dict()
        return {"shape": str(sh), **sh.as_dict(), "flops": sh.flops, "status": "ok", "error": None,
                "schedule": sched, "gemmc_us": g, "cublas_us": c, "gemmc_tflops": stats.tflops(sh.flops, g_us),
                "cublas_tflops": stats.tflops(sh.flops, c_us), "ratio": c_us / g_us, "rel_err": 0.002}
    bad = {"shape": "1x4096x4096", "m": 1, "n": 4096, "k": 4096, "flops": 2.0 * 4096 * 4096,
           "status": "check_failed", "error": "relative Frobenius error nan >= 0.01", "rel_err": float("nan"),
           "schedule": "64x64x64_c1x1_pp_sauto_rm_sw1_k1"}
    return [ok(4096, 4096, 4096, 180.0, 190.0, "128x256x64_c2x1_coop_sauto_rm_sw1_k1"),
            ok(8192, 8192, 8192, 1500.0, 1400.0, "128x256x64_c1x2_coop_sauto_rn_sw8_k1"), bad]


def test_table_lists_every_shape_with_numbers_and_failures():
    table = report.format_table(_recorded_results())
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["shape", "gemmc"] and len(lines) == 5
    assert "4096x4096x4096" in lines[2] and "1.056" in lines[2] and "128x256x64_c2x1_coop" in lines[2]
    assert f"{stats.tflops(2.0 * 4096 ** 3, 180.0):.1f}" in lines[2]
    assert "0.933" in lines[3]
    assert "CHECK_FAILED: relative Frobenius error" in lines[4]
    assert "[own clock]" not in table
    held = [dict(r, sustained=True) if r["shape"] == "8192x8192x8192" else r for r in _recorded_results()]
    marked = report.format_table(held).splitlines()
    assert marked[3].endswith("128x256x64_c1x2_coop_sauto_rn_sw8_k1  [own clock]") and "[own clock]" not in marked[2]


def test_json_report_round_trips_with_nan_as_null(tmp_path):
    cfg = timing.TimingConfig()
    env = {"date": "2026-11-30T00:00:00+00:00", "gpu": {"name": "NVIDIA H200"}, "versions": {"gemmc": "0.1.0"}}
    rep = report.make_report(_recorded_results(), suite="square", policy="heuristic", dtype="bf16", arch="sm_90a",
                             cfg=cfg, environment=env)
    assert rep["summary"]["n_ok"] == 2 and rep["summary"]["n_failed"] == 1
    assert rep["summary"]["geomean"] == pytest.approx(math.sqrt((190 / 180) * (1400 / 1500)))
    assert rep["summary"]["share_ge_1"] == 0.5
    assert rep["summary_line"].startswith("geomean 0.993x cuBLAS, min 0.933x")
    assert "interleaved" in rep["method"]["text"] and rep["method"]["timing"] == "cuda-graphs"
    path = report.write_json(rep, tmp_path / "r.json")
    back = report.load_json(path)
    assert back["results"][2]["rel_err"] is None
    assert back["results"][0]["gemmc_us"] == rep["results"][0]["gemmc_us"]
    assert back["environment"]["gpu"]["name"] == "NVIDIA H200"
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a gemmc bench report"):
        report.load_json(tmp_path / "other.json")


def test_plot_writes_a_png(tmp_path):
    rep = report.make_report(_recorded_results(), suite="llm", policy="auto", dtype="bf16", arch="sm_90a",
                             cfg=timing.TimingConfig(), environment={"gpu": {"name": "NVIDIA H200"}})
    png = report.plot_ratios(rep, tmp_path / "plot.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_default_output_path_names_date_gpu_suite():
    p = report.default_output_path("llm", "NVIDIA H200", date="2026-11-30")
    assert p == Path("bench/results/2026-11-30-h200-llm.json")
    assert report.default_output_path("square", "NVIDIA H100 80GB HBM3", True, date="d").name == \
        "d-h100-80gb-hbm3-square-host.json"


def test_environment_has_versions_without_a_gpu():
    env = report.collect_environment()
    assert env["versions"]["gemmc"] and env["versions"]["torch"] == torch.__version__
    assert "nvidia-cutlass-dsl" in env["versions"] and env["date"]


# ---- dataset ------------------------------------------------------------------------------------------

def _records():
    s1, s2 = Schedule(tile=(128, 256, 64), cluster=(2, 1)), Schedule(tile=(64, 128, 64), mode="pingpong")
    return [
        {"m": 128, "n": 4096, "k": 4096, "schedule": s1.to_dict(), "time_us": 20.5, "error": None,
         "cublas_us": 22.0, "compile_s": 1.25, "rel_err": 0.0031, "refined": True, "time_us_short": 21.0},
        {"m": 128, "n": 4096, "k": 4096, "schedule": s2.to_dict(), "time_us": 18.25, "error": None,
         "cublas_us": 22.0, "compile_s": 1.5, "rel_err": 0.0029, "refined": False},
        {"m": 1, "n": 4096, "k": 4096, "schedule": s2.to_dict(), "time_us": None,
         "error": "compile: BuildError: ptxas failed", "cublas_us": 9.0, "compile_s": None},
    ]


def test_dataset_round_trip(tmp_path):
    header = {"device": {"name": "NVIDIA H200"}, "date": "2026-11-30", "method": {"text": "graphs"},
              "versions": {"gemmc": "0.1.0"}}
    path = ds.write_dataset(tmp_path / "d.jsonl.gz", header, _records())
    h, recs = ds.load_dataset(path)
    assert h["format"] == ds.FORMAT and h["device"]["name"] == "NVIDIA H200"
    assert h["footer"] == {"complete": True, "records": 3} and "truncated" not in h
    assert recs == json.loads(json.dumps(_records()))   # tuples come back as lists
    assert ds.record_schedule(recs[0]) == Schedule(tile=(128, 256, 64), cluster=(2, 1))
    best = ds.best_per_shape(recs)   # the careful time ranks first: the short pass's 18.25 is another method's
    assert best[(128, 4096, 4096)]["time_us"] == 20.5 and (1, 4096, 4096) not in best
    assert [len(v) for v in ds.by_shape(recs).values()] == [2, 1]


def test_dataset_cut_off_mid_run_still_loads(tmp_path):
    w = ds.DatasetWriter(tmp_path / "d.jsonl.gz", {"device": "x"})
    w.write_many(_records()[:2])          # flushed, never closed: as if the run was killed
    h, recs = ds.load_dataset(tmp_path / "d.jsonl.gz")
    assert h.get("truncated") is True and len(recs) == 2 and "footer" not in h
    w.close({"complete": False})
    h, recs = ds.load_dataset(tmp_path / "d.jsonl.gz")
    assert h["footer"]["complete"] is False and len(recs) == 2


def test_dataset_rejects_bad_records_and_foreign_files(tmp_path):
    with pytest.raises(ds.DatasetError, match="neither time_us nor error"):
        ds.write_dataset(tmp_path / "a.gz", {}, [{"m": 1, "n": 1, "k": 1, "schedule": {}}])
    with gzip.open(tmp_path / "b.gz", "wt") as f:
        f.write(json.dumps({"format": "other"}) + "\n")
    with pytest.raises(ds.DatasetError, match="format 'other'"):
        ds.load_dataset(tmp_path / "b.gz")


def test_dataset_is_compact():
    """30k records of the full sweep must fit the 2 MB budget: measure bytes per record."""
    import io
    recs = []
    for i in range(2000):
        s = Schedule(tile=(128, 64 * (1 + i % 4), 64), cluster=(1 + i % 2, 1), swizzle=(1, 8)[i % 2],
                     split_k=(1, 2, 4)[i % 3])
        recs.append({"m": 64 * (1 + i % 50), "n": 4096, "k": 4096, "schedule": s.to_dict(),
                     "time_us": 10 + (i * 7919 % 1000) / 7.0, "error": None, "cublas_us": 50.123456,
                     "compile_s": 1.0 + (i % 13) / 10, "rel_err": 0.0031 + i * 1e-7, "refined": False})
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as f:
        for r in recs:
            f.write(ds._line(r))
    assert len(buf.getvalue()) / len(recs) * 30000 < 2e6


# ---- CLI ------------------------------------------------------------------------------------------------

def test_cli_reports_bad_input_before_running(tmp_path, capsys):
    bad = tmp_path / "s.txt"
    bad.write_text("1 2\n")
    assert bench_main(["--shapes", str(bad)]) == 2
    assert "s.txt:1" in capsys.readouterr().err
    assert bench_main(["--suite", "square", "--policy", "fastest"]) == 2
    assert "not 'heuristic', 'auto' or a schedule" in capsys.readouterr().err
    assert bench_main(["--suite", "square", "--settle-s", "-1"]) == 2
    assert "--settle-s must be >= 0" in capsys.readouterr().err
    assert bench_main(["--suite", "square", "--sustained-s", "-0.5"]) == 2
    assert "--sustained-s must be >= 0" in capsys.readouterr().err


def test_cli_without_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    assert bench_main(["--suite", "square", "--limit", "1"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_python_dash_m_entry_point_prints_help():
    res = subprocess.run([sys.executable, "-m", "gemmc.bench", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "--suite" in res.stdout and "--host-timing" in res.stdout


# ---- the sweep (fake compiles and kernels on the virtual clock) ------------------------------------------

from gemmc.bench import compile_pool  # noqa: E402
from gemmc.bench import sweep as sw  # noqa: E402
from gemmc.schedule import ScheduleSpace  # noqa: E402

TINY_SPACE = ScheduleSpace(tile_m=(128,), tile_n=(64, 128), tile_k=(64,), clusters=((1, 1),), modes=("cooperative",),
                           rasters=("m",), swizzles=(1,), split_ks=(1, 2), stages=("auto",))


class FakePool:
    def __init__(self, schedules, broken=()):
        self.schedules, self.broken = schedules, broken

    def collect(self, deadline, on_result=None):
        out = {}
        for s in self.schedules:
            bad = s.short() in self.broken
            out[compile_pool._key(s.to_dict())] = {"job": s.to_dict(), "ok": not bad, "compile_s": 1.5,
                                                   "error": "BuildError: ptxas died" if bad else None}
        return out


def _fake_sweep(tmp_path, shapes, cfg=None, broken=(), wrong=(), load_fail=(), bugs=None, **kw):
    clock = VirtualClock()
    made = {}

    def load_kernel(s):
        if s.short() in load_fail:
            raise OSError("corrupt .so")
        # the faster, the wider the tile and the less split-K; one schedule computes garbage
        us = 30.0 - s.tile[1] / 16 + 3 * s.split_k
        made[s] = FakeKernel(clock, us, s.short(), wrong=s.short() in wrong, schedule=s,
                             bug=(bugs or {}).get(s.short()))
        return made[s]

    cfg = cfg or sw.SweepConfig(budget_s=1e6, workers=1, short_max_sets=4,
                                refine=timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100, max_sets=16))
    footer = sw.run_sweep(shapes, cfg, tmp_path / "d.jsonl.gz", space=TINY_SPACE, device="cpu",
                          start_compiles=lambda scheds: FakePool(scheds, broken), load_kernel=load_kernel,
                          cublas=FakeKernel(clock, 25.0, "cublas"), graph_clock=clock, eager_clock=clock,
                          l2_bytes=64 * 1024, environment={"gpu": {"name": "fake"}, "date": "d", "versions": {}},
                          progress=False, watchdog=False, **kw)
    return footer, made, ds.load_dataset(tmp_path / "d.jsonl.gz")


def test_sweep_plan_takes_each_shapes_valid_schedules_and_their_union():
    shapes = [suites.Shape(64, 64, 64), suites.Shape(128, 128, 256)]
    per_shape, union = sw.plan(shapes, TINY_SPACE)
    assert [s.split_k for s in per_shape[shapes[0]]] == [1, 1]          # K=64 has one k-tile: no split-K
    assert len(per_shape[shapes[1]]) == 4 and len(union) == 4
    full = sw.sweep_shapes(30, seed=0)
    assert len(full) >= 60 and set(suites.llm()) <= set(full) and set(suites.square()) <= set(full)
    assert len(sw.plan(full[:2])[1]) > 300                                # the real space is large


def test_sweep_records_every_point_checks_first_and_refines_the_top(tmp_path):
    shapes = [suites.Shape(64, 64, 64), suites.Shape(128, 128, 256)]
    footer, made, (header, recs) = _fake_sweep(tmp_path, shapes, broken=("128x64x64_c1x1_coop_sauto_rm_sw1_k2",),
                                                wrong=("128x64x64_c1x1_coop_sauto_rm_sw1_k1",))
    assert footer["complete"] and footer["shapes_done"] == 2 and header["footer"]["records"] == 6
    assert header["device"] == {"name": "fake"} and header["compile"] == {"workers": 1, "wall_s": header["compile"]
                                                                         ["wall_s"], "ok": 3, "failed": 1}
    assert header["space"]["split_ks"] == [1, 2] and "NaN-filled" in header["method"]["text"]
    by = {(r["m"], Schedule.from_dict(r["schedule"]).short()): r for r in recs}
    assert len(by) == 6
    bad = by[(64, "128x64x64_c1x1_coop_sauto_rm_sw1_k1")]
    assert bad["time_us"] is None and bad["error"].startswith("check: relative Frobenius error")
    assert by[(128, "128x64x64_c1x1_coop_sauto_rm_sw1_k2")]["error"] == "compile: BuildError: ptxas died"
    good = by[(128, "128x128x64_c1x1_coop_sauto_rm_sw1_k1")]
    assert good["time_us"] == pytest.approx(25.0) and good["refined"] and good["time_us_short"] == pytest.approx(25.0)
    assert good["cublas_us"] == pytest.approx(25.0) and good["compile_s"] == 1.5 and good["rel_err"] < 1e-2
    assert by[(128, "128x128x64_c1x1_coop_sauto_rm_sw1_k2")]["time_us"] == pytest.approx(28.0)
    assert all(r["cublas_us"] == pytest.approx(25.0) for r in recs)
    best = ds.best_per_shape(recs)
    assert Schedule.from_dict(best[(128, 128, 256)]["schedule"]).tile == (128, 128, 64)
    # one kernel object serves both shapes; the wrong one ran once per shape (its check), never timed
    assert made[Schedule(tile=(128, 64, 64))].calls == 2


def test_sweep_times_long_kernels_eagerly(tmp_path):
    cfg = sw.SweepConfig(budget_s=1e6, workers=1, eager_above_us=5.0, top=1,
                         refine=timing.TimingConfig(repeats=3, warmup=0, min_unit_us=10, max_sets=4))
    footer, made, (header, recs) = _fake_sweep(tmp_path, [suites.Shape(64, 64, 64)], cfg=cfg)
    # not in the top 1: its check, then one eager timed call, nothing more
    assert made[Schedule(tile=(128, 64, 64))].calls == 2
    assert made[Schedule(tile=(128, 128, 64))].calls > 2 and sum(r["refined"] for r in recs) == 1
    assert [r["time_us"] for r in recs if not r["refined"]] == [pytest.approx(29.0)]


def test_sweep_stops_within_the_budget_and_says_so(tmp_path):
    cfg = sw.SweepConfig(budget_s=0.0, workers=1, reserve_s=0.0)
    footer, _, (header, recs) = _fake_sweep(tmp_path, [suites.Shape(64, 64, 64)], cfg=cfg)
    assert header["footer"] == footer | {"records": 0}
    assert not footer["complete"] and footer["stop_reason"] == "budget"
    assert footer["shapes_skipped"] == ["64x64x64"] and recs == []


def _sleepy_worker(sched, dtype="bf16", arch="sm_90a"):
    import time as _t
    _t.sleep(sched["sleep"])
    return {"job": sched, "ok": True, "error": None, "compile_s": sched["sleep"]}


def test_compile_pool_collects_until_the_deadline_then_terminates():
    import time as _t
    pool = compile_pool.CompilePool([{"sleep": 0.0, "i": 0}, {"sleep": 60.0, "i": 1}], workers=2,
                                    worker=_sleepy_worker)
    t0 = _t.perf_counter()
    res = pool.collect(_t.perf_counter() + 10.0)   # generous: spawning a worker imports torch
    assert _t.perf_counter() - t0 < 25
    assert compile_pool.result_for(res, {"sleep": 0.0, "i": 0})["ok"] is True
    late = compile_pool.result_for(res, {"sleep": 60.0, "i": 1})
    assert late["ok"] is False and "not compiled within the compile budget" in late["error"]


def test_compile_worker_reports_errors_instead_of_raising():
    r = compile_pool.compile_worker({"tile": [100, 128, 64]})
    assert r["ok"] is False and "tile M" in r["error"] and r["compile_s"] >= 0


def test_sweep_script_dry_run_prints_the_plan():
    res = subprocess.run([sys.executable, "scripts/sweep.py", "--dry-run", "--cuda-l2-sample", "5"],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert "distinct schedules to compile" in first and "1x6144x4096" in res.stdout


@pytest.mark.slow
def test_compile_job_builds_through_the_public_api():
    """The real compile path (no GPU needed to build): a static shape with a fixed schedule."""
    r = compile_pool.compile_worker({"m": 128, "n": 4096, "k": 4096,
                                     "policy": Schedule(tile=(128, 128, 64)).to_dict()})
    assert r["ok"], r["error"]
    k = timing.compile_gemmc(suites.Shape(128, 4096, 4096), Schedule(tile=(128, 128, 64)))
    assert k.schedule == Schedule(tile=(128, 128, 64)) and callable(k)


def test_sweep_plan_drops_fixed_stages_equal_to_auto():
    from gemmc import GemmSpec
    from gemmc.schedule import resolve_stages
    space = ScheduleSpace(tile_m=(128,), tile_n=(128,), tile_k=(64,), clusters=((1, 1),), modes=("cooperative",),
                          rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto", 4, 6))
    assert resolve_stages(Schedule(tile=(128, 128, 64)), GemmSpec(m=256, n=256, k=256)) == 6
    _, union = sw.plan([suites.Shape(256, 256, 256)], space)
    assert [s.stages for s in union] == ["auto", 4]


def test_sweep_gives_up_early_when_nothing_runs(tmp_path):
    shapes = [suites.Shape(64, 64, 64), suites.Shape(128, 128, 256), suites.Shape(256, 128, 128)]
    wrong = tuple(s.short() for s in sw.plan(shapes, TINY_SPACE)[1])
    footer, _, (header, recs) = _fake_sweep(tmp_path, shapes, wrong=wrong)
    assert footer["shapes_done"] == 2 and not footer["complete"]
    assert footer["stop_reason"].startswith("no schedule ran on the first 2 shapes; first error: check: relative")
    assert all(r["time_us"] is None for r in recs)


def test_cli_show_prints_a_recorded_report_and_replots(tmp_path, capsys):
    rep = report.make_report(_recorded_results(), suite="square", policy="heuristic", dtype="bf16", arch="sm_90a",
                             cfg=timing.TimingConfig(), environment={"gpu": {"name": "NVIDIA H200"}})
    path = report.write_json(rep, tmp_path / "r.json")
    assert bench_main(["--show", str(path), "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "suite square, policy heuristic, bf16, NVIDIA H200, cuda-graphs" in out
    assert "8192x8192x8192" in out and out.count("geomean 0.993x cuBLAS") == 1
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert bench_main(["--show", str(tmp_path / "missing.json")]) == 2


def test_sweep_checks_the_timed_launches_of_both_passes(tmp_path):
    """Right in the eager check, wrong in the short pass's replays: an error, not a time. Right through the
    short pass (1 check + 4 x 4 launches), wrong later: the careful pass's check catches it."""
    short_bad, late_bad = "128x64x64_c1x1_coop_sauto_rm_sw1_k1", "128x128x64_c1x1_coop_sauto_rm_sw1_k1"
    bugs = {short_bad: _stale_after_first, late_bad: lambda n, a, res: res if n <= 17 else None}
    footer, made, (header, recs) = _fake_sweep(tmp_path, [suites.Shape(64, 64, 64)], bugs=bugs)
    by = {Schedule.from_dict(r["schedule"]).short(): r for r in recs}
    assert by[short_bad]["rel_err"] < 1e-2 and by[short_bad]["time_us"] is None
    assert by[short_bad]["error"].startswith("check: timed launches (slots [0, 3] of 4 checked")
    assert made[Schedule(tile=(128, 64, 64))].calls == 17                     # never in the careful pass
    late = by[late_bad]
    assert late["time_us"] is None and late["time_us_short"] == pytest.approx(25.0) and late["refined"]
    assert late["error"].startswith("check (careful pass): timed launches") and "relative Frobenius error nan" in \
        late["error"]
    assert "within gemmc.reference's bound" in header["method"]["text"]


def test_sweep_records_a_kernel_that_fails_to_load(tmp_path):
    name = "128x128x64_c1x1_coop_sauto_rm_sw1_k1"
    footer, _, (header, recs) = _fake_sweep(tmp_path, [suites.Shape(64, 64, 64)], load_fail=(name,))
    errs = {Schedule.from_dict(r["schedule"]).short(): r["error"] for r in recs}
    assert errs[name] == "load: OSError: corrupt .so" and errs["128x64x64_c1x1_coop_sauto_rm_sw1_k1"] is None


def test_describe_schedule_says_when_auto_dispatches_to_cublas():
    from types import SimpleNamespace

    from gemmc.bench.timing import describe_schedule
    from gemmc.choose.decision import Decision
    from gemmc.schedule import Schedule
    s = Schedule(tile=(64, 128, 64), mode="pingpong", split_k=2)
    tuned = SimpleNamespace(schedule=s, decision=Decision(s, "db", use_cublas=False))
    fallback = SimpleNamespace(schedule=s, decision=Decision(s, "db", use_cublas=True))
    assert describe_schedule(tuned) == (s.short(), s.to_dict())
    text, d = describe_schedule(fallback)
    assert text == f"cuBLAS (tuned {s.short()})" and d["dispatch"] == "cublas" and d["split_k"] == 2
    # an untuned shape whose measured neighbours lost to cuBLAS sets aside the heuristic's pick, not a tuned one
    verdict = SimpleNamespace(schedule=s, decision=Decision(s, "heuristic", use_cublas=True))
    assert describe_schedule(verdict)[0] == f"cuBLAS (heuristic {s.short()})"


def test_aa_check_times_cublas_against_itself_and_reports_the_noise_floor():
    from gemmc.bench.report import make_report
    cfg = timing.TimingConfig(repeats=4, warmup=1, min_unit_us=100, aa_check=True)
    results, made, cublas, clock, log = _cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log), cfg=cfg)
    r = results[0]
    assert r["aa_ratio"] == pytest.approx(1.0) and r["ratio"] == pytest.approx(1.2)
    assert r["cublas_aa_us"]["n"] == 4
    # interleaved: every repeat runs the three sides, in alternating order
    timed = [name for name in log if name in ("gemmc", "cublas")]
    verify = sum(r["launches"] for r in results)   # gemmc's graph replayed onto NaN after timing (A/A wrote there)
    assert timed.count("cublas") > 2 * (timed.count("gemmc") - verify) - 4
    rep = make_report(results, suite="test", policy="heuristic", dtype="bf16", arch="sm_90a", cfg=cfg,
                      environment={})
    assert rep["aa_summary"]["geomean"] == pytest.approx(1.0) and rep["aa_summary"]["n_ok"] == 2
    assert "A/A (cuBLAS vs itself" in rep["summary_line"] and "A/A check" in rep["method"]["text"]
    plain = make_report(_cpu_bench(lambda c, log, s: FakeKernel(c, 10.0, "gemmc", log))[0], suite="t",
                        policy="heuristic", dtype="bf16", arch="sm_90a", cfg=timing.TimingConfig(), environment={})
    assert "aa_summary" not in plain and "A/A" not in plain["summary_line"]


def test_a_shape_whose_compile_worker_crashed_is_not_compiled_again_in_the_bench(monkeypatch):
    """A compiler crash in a prebuild worker (segfault, OOM kill) would take the bench process down if the
    measuring loop compiled that shape again: it is recorded as a compile error and the run goes on."""
    clock = VirtualClock()
    crashed, fine = SMALL
    monkeypatch.setattr(timing, "prebuild", lambda shapes, *a, **k: {
        crashed: {"ok": False, "error": "compile worker crashed: its process (123) died while compiling this job"},
        fine: {"ok": True, "error": None, "compile_s": 1.0}})
    compiled = []

    def compile_gemmc(shape, **kw):
        compiled.append(shape)
        return FakeKernel(clock, 10.0)
    monkeypatch.setattr(timing, "compile_gemmc", compile_gemmc)
    results = timing.run_bench(SMALL, "heuristic", timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100),
                               device="cpu", cublas=FakeKernel(clock, 12.0, "cublas"), clock=clock,
                               l2_bytes=64 * 1024, progress=False, compile_workers=2)
    assert compiled == [fine]
    assert results[0]["status"] == "compile_error" and "compile worker crashed" in results[0]["error"]
    assert results[1]["status"] == "ok" and results[1]["compile_s"] == 1.0
