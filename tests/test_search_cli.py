"""`gemmc-search`: simulate --json, synth, report/export/import/train-policy round trip, tune and its
confirm phase."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemmc
from gemmc.search.cli import main
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem

from conftest import as_gemmc_version
from search_fakes import InlineBuilder

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "synthetic.jsonl.gz"
    assert main(["synth", str(path), "--shapes", "6", "--seed", "1"]) == 0
    return path


def test_simulate_json_parses(dataset):
    out = subprocess.run([sys.executable, "-m", "gemmc.search", "simulate", "--data", str(dataset),
                          "--strategy", "random,exhaustive,rl", "--budget", "2,4", "--seeds", "2", "--folds", "2",
                          "--epochs", "5", "--json"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert set(res) == {"random", "exhaustive", "rl"}
    for name, row in res.items():
        assert set(row) == {"1", "2", "4"}
        for b, cell in row.items():
            assert 0.0 < cell["median_fraction"] <= 1.0
            assert isinstance(cell["score_vs_random"], float)
        assert row["1"]["median_fraction"] <= row["2"]["median_fraction"] <= row["4"]["median_fraction"]
    assert all(cell["score_vs_random"] == 0.0 for cell in res["random"].values())


def test_simulate_table_and_bad_arguments(dataset, capsys):
    assert main(["simulate", "--data", str(dataset), "--strategy", "random", "--budget", "4", "--seeds", "2"]) == 0
    text = capsys.readouterr().out
    assert "random" in text and "@4" in text and "6 problems" in text
    with pytest.raises(SystemExit):
        main(["simulate", "--data", str(dataset), "--strategy", "annealing"])
    capsys.readouterr()
    assert main(["simulate", "--data", str(dataset.parent / "nope.jsonl.gz")]) == 1     # one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("gemmc-search simulate: error: dataset ") and "does not exist" in err
    assert err.count("\n") == 1


def test_report_export_import_round_trip(tmp_path, capsys):
    spec = gemmc.GemmSpec(128, 4096, 4096)
    cands = SearchProblem.of(spec).candidates
    a = tmp_path / "a.sqlite"
    db = TuningDB(a)
    for i, t in enumerate([30.0, 25.0, 27.0]):
        db.record(spec, "sm_90a", Measurement(cands[i], t, None, 28.0), "NVIDIA H200", "bayes")
    db.close()
    assert main(["--db", str(a), "train-policy", "--epochs", "3"]) == 0
    assert main(["--db", str(a), "report"]) == 0
    text = capsys.readouterr().out
    assert "128x4096x4096" in text and cands[1].short() in text
    assert "25.00" in text and "1.120" in text          # speedup 28 / 25
    assert "paired" in text and "geomean paired speedup over cuBLAS: 1.120x over 1 problems" in text
    assert main(["--db", str(a), "export", str(tmp_path / "x.json.gz")]) == 0
    b = tmp_path / "b.sqlite"
    assert main(["--db", str(b), "import", str(tmp_path / "x.json.gz")]) == 0
    assert "imported 3 new measurements and 1 policies" in capsys.readouterr().out
    assert main(["--db", str(b), "report", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["time_us"] == 25.0 and gemmc.Schedule.from_dict(rows[0]["schedule"]) == cands[1]
    assert abs(rows[0]["speedup"] - 28.0 / 25.0) < 1e-9
    assert rows[0]["paired"] and rows[0]["rows"] == 1 and rows[0]["measured"] == 3
    assert TuningDB(b).load_policy() is not None


def test_tune_refuses_without_gpu(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert main(["--db", str(tmp_path / "t.sqlite"), "tune", "--suite", "llm", "--budget", "2"]) == 2
    assert "simulate" in capsys.readouterr().err


def test_tune_settle_reaches_the_runner_and_is_checked(tmp_path, capsys, monkeypatch):
    import gemmc.search.runner as runner_mod
    from gemmc.bench.timing import TimingConfig
    seen = {}

    class _Runner(runner_mod.Runner):
        def __init__(self, *a, timing=None, **k):
            super().__init__(*a, timing=timing, **k)
            seen["timing"] = timing

        @staticmethod
        def gpu_name():
            return "cpu"          # stop right after construction: the CPU refusal path

    monkeypatch.setattr(runner_mod, "Runner", _Runner)
    db = str(tmp_path / "t.sqlite")
    assert main(["--db", db, "tune", "--suite", "llm", "--budget", "2", "--settle-s", "-1"]) == 2
    assert "--settle-s must be >= 0" in capsys.readouterr().err and "timing" not in seen
    assert main(["--db", db, "tune", "--suite", "llm", "--budget", "2", "--settle-s", "1.5"]) == 2
    assert seen["timing"].settle_s == 1.5
    seen.clear()
    assert main(["--db", db, "tune", "--suite", "llm", "--budget", "2", "--sustained-s", "-1"]) == 2
    assert "--sustained-s must be >= 0" in capsys.readouterr().err and "timing" not in seen
    assert main(["--db", db, "tune", "--suite", "llm", "--budget", "2", "--sustained-s", "2"]) == 2
    assert seen["timing"].sustained_s == 2.0 and seen["timing"].settle_s == 0.0
    assert seen["timing"].repeats == TimingConfig.repeats            # --repeats left out: the bench's default
    seen.clear()
    assert main(["--db", db, "tune", "--suite", "llm", "--budget", "2", "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err and "timing" not in seen
    assert main(["--db", db, "tune", "--suite", "llm", "--budget", "2", "--sustained-s", "1", "--repeats", "4"]) == 2
    assert seen["timing"].repeats == 4 and seen["timing"].sustained_s == 1.0


def test_the_tune_loop_is_gemmc_search_tune_and_imports_without_the_cli():
    """A script tunes through `gemmc.search.tune` (the loop `gemmc-search tune` runs) without the CLI module."""
    code = ("import sys; import gemmc.search as s; from gemmc.search.tuning import tune; "
            "assert s.tune is tune; print('gemmc.search.cli' in sys.modules, 'tqdm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False"], out.stderr


def test_tune_fresh_reaches_the_tune_loop(tmp_path, monkeypatch):
    """The CLI passes --fresh through (default off), with a fake GPU and no measurements."""
    import gemmc.search.cli as climod
    import gemmc.search.runner as runner_mod
    seen = []
    monkeypatch.setattr(runner_mod.Runner, "gpu_name", staticmethod(lambda: "fake"))
    monkeypatch.setattr(climod, "tune", lambda shapes, **kw: seen.append(kw["fresh"]) or [])
    db = str(tmp_path / "t.sqlite")
    for extra, want in (([], False), (["--fresh"], True)):
        assert main(["--db", db, "tune", "--suite", "llm", "--sample", "1", "--budget", "2", "--workers", "1",
                     "--no-train-policy"] + extra) == 0
        assert seen[-1] is want



class _FakeRunner:
    def __init__(self):
        self.calls = 0

    def measure(self, spec, s, arch, kernel_spec=None):
        from gemmc.search.synthetic import model_time_us
        self.calls += 1
        return Measurement(s, model_time_us(s, spec), None, cublas_us=30.0)


def test_tune_writes_every_measurement_and_resumes(tmp_path, capsys):
    from gemmc.bench.suites import Shape
    from gemmc.search import tune
    from gemmc.search.cli import print_summary
    db = TuningDB(tmp_path / "t.sqlite")
    shapes = [Shape(64, 4096, 4096), Shape(2048, 2048, 2048)]
    runner = _FakeRunner()
    kw = dict(dtype="bf16", arch="sm_90a", strategy="bayes", batch=3, db=db, builder=InlineBuilder(fails=lambda s: s.split_k == 4),
              runner=runner, gpu_name="fake", progress=False, confirm=0)
    tune(shapes, budget=5, **kw)
    assert db.count() == 10
    summary = tune(shapes, budget=8, symbolic=True, **kw)   # resume: 3 more per shape, none repeated
    assert db.count() == 16
    for sh in shapes:
        rows = [r for r in db.rows() if (r["m"], r["n"], r["k"]) == (sh.m, sh.n, sh.k)]
        assert len({r["schedule"] for r in rows}) == 8
    assert runner.calls == sum(r["error"] is None for r in db.rows())
    print_summary(summary)
    out = capsys.readouterr().out
    assert "64x4096x4096" in out and "geomean paired speedup over cuBLAS" in out and "same runs" in out


def _drifting(fail_at=None):
    """A measure_fn whose GPU warms up: gemmc and cuBLAS slow down together, 1% per measurement.
    fail_at: raise KeyboardInterrupt on that call (1-based), like a run killed mid-measurement."""
    from gemmc.search.synthetic import model_time_us
    calls = []

    def measure(spec, s, arch):
        if fail_at is not None and len(calls) + 1 == fail_at:
            raise KeyboardInterrupt
        calls.append(s)
        heat = 1.0 + 0.01 * len(calls)
        return Measurement(s, model_time_us(s, spec) * heat, None, cublas_us=25.0 * heat)
    return measure, calls


def _tune(db, measure, budget=6, confirm=3, fresh=False):
    from gemmc.bench.suites import Shape
    from gemmc.search import tune
    from gemmc.search.runner import Runner
    shape = Shape(64, 4096, 4096)
    tune([shape], dtype="bf16", arch="sm_90a", strategy="bayes", budget=budget, batch=2, db=db,
         builder=InlineBuilder(fails=lambda s: s.split_k == 4), runner=Runner(measure_fn=measure), gpu_name="fake", progress=False,
         confirm=confirm, fresh=fresh)
    return gemmc.GemmSpec(shape.m, shape.n, shape.k)


def _split(db):
    search = [r for r in db.rows() if r["strategy"] != "confirm"]
    confirm = [r for r in db.rows() if r["strategy"] == "confirm"]
    return search, confirm


def test_confirm_re_measures_the_best_schedules_once_and_resume_skips_them(tmp_path):
    from gemmc.choose.tuning_db_schema import CONFIRM
    db = TuningDB(tmp_path / "t.sqlite")
    measure, calls = _drifting()
    spec = _tune(db, measure)
    search, confirm = _split(db)
    assert len(search) == 6 and len({r["schedule"] for r in search}) == 6      # the budget: search rows only
    top3 = [f.schedule for f in db.ranked_schedules(spec, "sm_90a", "fake", search_only=True)[:3]]
    assert [gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in confirm] == top3
    assert all(r["error"] is None and r["cublas_us"] for r in confirm)
    assert calls[-3:] == top3 and len(calls) == sum(r["error"] is None for r in search) + 3
    assert {f.schedule for f in db.ranked_schedules(spec, "sm_90a", "fake") if f.n_rows == 2} == set(top3)
    assert db.best(spec, "sm_90a", "fake").n_measured == len(calls)

    again, calls2 = _drifting()
    _tune(db, again)                       # the same run again: nothing to search, nothing to confirm
    assert calls2 == [] and db.count() == 9

    # a bigger budget: the search goes on (6 distinct schedules stored, 2 to go), then the new top 3
    # are confirmed, each schedule at most once
    before = db.confirmed(spec, "sm_90a", "fake")
    more, calls3 = _drifting()
    _tune(db, more, budget=8)
    search, confirm = _split(db)
    assert len(search) == 8 and len({r["schedule"] for r in search}) == 8
    top3 = {f.schedule for f in db.ranked_schedules(spec, "sm_90a", "fake", search_only=True)[:3]}
    new = [gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in confirm[3:]]
    assert set(new) == top3 - before and len(new) == len(set(new)) and new == calls3[len(calls3) - len(new):]
    assert {r["strategy"] for r in confirm} == {CONFIRM}


def test_two_rows_that_disagree_get_a_third_and_the_median_row_decides(tmp_path):
    """cuBLAS ran slow (+10%) in each schedule's first measurement: every search row flatters gemmc, each
    confirmation disagrees with it by ~10%, so the top schedules get a third row and their verdict is the
    median row, a confirmed one."""
    from gemmc.choose.tuning_db_schema import CONFIRM
    from gemmc.search.synthetic import model_time_us
    calls = []

    def measure(spec, s, arch):
        slow_cublas = 1.10 if s not in calls else 1.0
        calls.append(s)
        return Measurement(s, model_time_us(s, spec), None, cublas_us=25.0 * slow_cublas)
    db = TuningDB(tmp_path / "t.sqlite")
    spec = _tune(db, measure)
    search, confirm = _split(db)
    per = {}
    for r in confirm:
        per.setdefault(r["schedule"], []).append(r)
    assert len(search) == 6 and len(confirm) > 3 and {r["strategy"] for r in confirm} == {CONFIRM}
    assert max(len(v) for v in per.values()) == 2           # at most three rows per schedule
    for f in db.ranked_schedules(spec, "sm_90a", "fake")[:3]:
        assert f.n_rows == 3 and not f.unsettled
        assert f.speedup == pytest.approx(25.0 / model_time_us(f.schedule, spec))   # a normal run's figure
    n = len(calls)
    _tune(db, measure)                         # resumed: nothing left to measure
    assert len(calls) == n


def test_after_an_upgrade_confirm_re_measures_the_stale_top(tmp_path, monkeypatch):
    """Rows of an older gemmc: a run with no search left re-measures the schedules at the top, each at
    most three times, until the best rest on the running version's rows."""
    db = TuningDB(tmp_path / "t.sqlite")
    as_gemmc_version(monkeypatch, "0.1.0")
    measure, calls = _drifting()
    spec = _tune(db, measure)
    n_old = db.count()
    as_gemmc_version(monkeypatch, "0.2.0")
    assert all(f.stale for f in db.ranked_schedules(spec, "sm_90a", "fake"))
    again, calls2 = _drifting()
    _tune(db, again)                           # the budget is spent: no search, only re-measures
    new = [r for r in db.rows()[n_old:]]
    assert new and all(r["gemmc_version"] == "0.2.0" and r["strategy"] == "confirm" for r in new)
    per = {}
    for r in new:
        per[r["schedule"]] = per.get(r["schedule"], 0) + 1
    assert max(per.values()) <= 3 and len(calls2) == len(new)
    top = db.ranked_schedules(spec, "sm_90a", "fake")[:3]
    assert all(not f.stale and f.n_rows >= 2 and not f.unsettled for f in top)
    assert not db.best(spec, "sm_90a", "fake").stale


def test_fresh_searches_the_budget_again_under_a_new_gemmc(tmp_path, monkeypatch):
    """--fresh after an upgrade: the budget counts only the running version's rows, so the search runs
    again (re-measuring schedules an older gemmc measured); without it, a spent budget searches nothing."""
    import gemmc.search.tuning as tuningmod
    db = TuningDB(tmp_path / "t.sqlite")
    as_gemmc_version(monkeypatch, "0.1.0")
    monkeypatch.setattr(tuningmod, "__version__", "0.1.0")
    measure, _ = _drifting()
    spec = _tune(db, measure, confirm=0)
    old = {r["schedule"] for r in db.rows()}
    assert len(old) == 6
    as_gemmc_version(monkeypatch, "0.2.0")
    monkeypatch.setattr(tuningmod, "__version__", "0.2.0")
    again, calls = _drifting()
    _tune(db, again, confirm=0)
    assert calls == []                                   # the budget counts the 0.1.0 rows
    _tune(db, again, confirm=0, fresh=True)
    new = [r for r in db.rows() if r["gemmc_version"] == "0.2.0"]
    assert len(calls) == len(new) == 6 and {r["strategy"] for r in new} == {"bayes"}
    assert len({r["schedule"] for r in new}) == 6
    assert {r["schedule"] for r in new} & old           # the heuristic's first picks, measured again
    assert len(db.prior(spec, "sm_90a", "fake", version="0.2.0")) == 6
    assert len(db.prior(spec, "sm_90a", "fake", version="0.1.0")) == 6
    _tune(db, again, confirm=0, fresh=True)
    assert len(calls) == 6                               # resumed: this version's budget is spent


def test_report_marks_picks_measured_by_an_older_gemmc(tmp_path, capsys, monkeypatch):
    import gemmc.search.cli as climod
    path = tmp_path / "t.sqlite"
    db = TuningDB(path)
    spec = gemmc.GemmSpec(128, 4096, 4096)
    c = SearchProblem.of(spec).candidates
    as_gemmc_version(monkeypatch, "0.1.0")
    db.record(spec, "sm_90a", Measurement(c[0], 25.0, None, 28.0), "NVIDIA H200", "bayes")
    assert main(["--db", str(path), "report"]) == 0
    assert "older gemmc" not in capsys.readouterr().out
    as_gemmc_version(monkeypatch, "0.2.0")
    monkeypatch.setattr(climod, "__version__", "0.2.0")
    assert main(["--db", str(path), "report"]) == 0
    out = capsys.readouterr().out
    assert c[0].short() + "  (gemmc 0.1.0)" in out
    assert "1 of the picks rest on measurements of an older gemmc" in out and "with gemmc 0.2.0" in out
    assert main(["--db", str(path), "report", "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert row["gemmc_version"] == "0.1.0" and row["stale"] is True


def test_a_run_killed_while_confirming_resumes_with_the_missing_confirmations(tmp_path):
    whole = TuningDB(tmp_path / "whole.sqlite")
    measure, calls = _drifting()
    spec = _tune(whole, measure)
    killed = TuningDB(tmp_path / "killed.sqlite")
    dying, _ = _drifting(fail_at=len(calls) - 1)          # dies measuring the 2nd confirmation
    with pytest.raises(KeyboardInterrupt):
        _tune(killed, dying)
    assert len(_split(killed)[1]) == 1
    resumed, calls2 = _drifting()
    _tune(killed, resumed)
    assert calls2 == calls[-2:]                            # just the two missing confirmations
    assert [(r["schedule"], r["time_us"]) for r in _split(killed)[0]] == \
        [(r["schedule"], r["time_us"]) for r in _split(whole)[0]]           # the search was not redone
    assert whole.confirmed(spec, "sm_90a", "fake") == killed.confirmed(spec, "sm_90a", "fake")
    assert killed.count() == whole.count()


def test_confirm_zero_turns_it_off_and_negative_is_refused(tmp_path, capsys):
    from gemmc.search.cli import _parser
    db = TuningDB(tmp_path / "t.sqlite")
    measure, calls = _drifting()
    _tune(db, measure, confirm=0)
    assert _split(db)[1] == [] and db.count() == 6
    assert _parser().parse_args(["tune", "--suite", "llm"]).confirm == 3
    with pytest.raises(SystemExit):
        _parser().parse_args(["tune", "--suite", "llm", "--confirm", "-1"])
    assert "0 turns it off" in capsys.readouterr().err


def test_tune_also_measures_listed_schedules_once_and_keeps_them_out_of_the_strategy(tmp_path, capsys):
    from gemmc.bench.policy import parse_schedule
    from gemmc.choose.tuning_db_schema import ALSO
    from gemmc.search.rl import examples_from_db
    db = TuningDB(tmp_path / "t.sqlite")
    swapped = [parse_schedule("128x16x64_pp_s12_swap"), parse_schedule("64x16x128_pp_s10_swap"),
               parse_schedule("128x16x64_pp_k8_swap")]          # the last is invalid (swapped: split_k <= 4)
    measure, calls = _drifting()

    def tune_to(budget):
        from gemmc.bench.suites import Shape
        from gemmc.search import tune
        from gemmc.search.runner import Runner
        tune([Shape(256, 4096, 4096)], dtype="bf16", arch="sm_90a", strategy="bayes", budget=budget, batch=2,
             db=db, builder=InlineBuilder(fails=lambda s: s.split_k == 4), runner=Runner(measure_fn=measure), gpu_name="fake",
             progress=False, confirm=0, also=swapped)
    tune_to(4)
    also = [r for r in db.rows() if r["strategy"] == ALSO]
    assert [gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in also] == swapped[:2]
    assert calls[-2:] == swapped[:2]
    searched = lambda: [r for r in db.rows() if r["strategy"] == "bayes"]   # noqa: E731
    assert len(searched()) == 4
    n = len(calls)
    tune_to(6)          # resume with a bigger budget: 2 more searched (the swapped rows do not count), none re-measured;
    # M = 256 is past SWAP_MAX_M, so swapped schedules come only from --also
    assert len(searched()) == 6 and not any(s.swap_ab for s in calls[n:])
    assert len([r for r in db.rows() if r["strategy"] == ALSO]) == 2
    # the policy's features describe the swap (FeatureSpec v2): the --also rows train it too
    (ex,) = examples_from_db(db)
    assert len(ex.schedules) == 8 and sum(s.swap_ab for s in ex.schedules) == 2


def test_tune_searches_swapped_kernels_for_decode_shapes(tmp_path):
    """At M <= 32 the swapped decode space joins the strategy's candidates; where swapping pays (here a
    measure_fn that halves swapped times), the search finds it within a small budget."""
    from gemmc.bench.suites import Shape
    from gemmc.search import tune
    from gemmc.search.runner import Runner
    from gemmc.search.synthetic import model_time_us
    db = TuningDB(tmp_path / "t.sqlite")

    def measure(spec, s, arch):
        return Measurement(s, model_time_us(s, spec) * (0.5 if s.swap_ab else 1.0), None, cublas_us=20.0)
    (_, best), = tune([Shape(16, 4096, 4096)], dtype="bf16", arch="sm_90a", strategy="bayes", budget=8,
                      batch=2, db=db, builder=InlineBuilder(fails=lambda s: s.split_k == 4), runner=Runner(measure_fn=measure),
                      gpu_name="fake", progress=False, confirm=0)
    searched = [gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in db.rows()]
    assert len(searched) == 8 and any(s.swap_ab for s in searched)
    assert best.schedule.swap_ab


def test_tune_also_rejects_a_bad_schedule_string_and_another_arch(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--db", str(tmp_path / "t.sqlite"), "tune", "--suite", "llm", "--also", "128x16x64_pp_bogus"])
    assert "bogus" in capsys.readouterr().err
    assert main(["--db", str(tmp_path / "t.sqlite"), "tune", "--suite", "llm", "--arch", "sm_80",
                 "--also", "128x16x64_pp_swap"]) == 2
    assert "--arch sm_80" in capsys.readouterr().err


def test_tune_sustained_searches_a_long_call_again_at_its_own_clock(tmp_path, capsys):
    """`tune --sustained-s`: on a long call (cuBLAS >= 100 us) the stored interleaved rows neither count
    toward the budget nor reach the strategy; the new rows are stored as sustained and, once present, alone
    decide the verdict. A short call keeps its rows (`--sustained-s` times it interleaved anyway)."""
    from gemmc.bench.suites import Shape
    from gemmc.search import tune
    from gemmc.search.runner import Runner
    from gemmc.search.strategy import SUSTAINED

    def measure_for(own_clock):
        def measure(spec, s, arch):
            cublas = 500.0 if spec.m == 4096 else 20.0
            long = cublas >= 100.0
            # interleaved, every schedule reads 1.2x; at its own clock 0.9x
            ratio = 0.9 if own_clock and long else 1.2
            return Measurement(s, cublas / ratio, None, cublas_us=cublas,
                               timing=SUSTAINED if own_clock and long else None)
        return measure

    db = TuningDB(tmp_path / "t.sqlite")
    long, short = Shape(4096, 4096, 4096), Shape(64, 4096, 4096)
    kw = dict(dtype="bf16", arch="sm_90a", strategy="random", batch=2, db=db, builder=InlineBuilder(fails=lambda s: s.split_k == 4),
              gpu_name="fake", progress=False, confirm=0)
    tune([long, short], budget=4, runner=Runner(measure_fn=measure_for(False)), **kw)
    assert db.count() == 8 and db.best(gemmc.GemmSpec(4096, 4096, 4096), "sm_90a", "fake").speedup == pytest.approx(1.2)
    tune([long, short], budget=4, runner=Runner(measure_fn=measure_for(True)), sustained=True, **kw)
    rows = db.rows()
    long_rows = [r for r in rows if r["m"] == 4096]
    first = long_rows[:4]
    failed = sum(r["error"] is not None for r in first)      # the inline builder fails split_k=4 schedules
    assert 0 < failed < 4 and all(r["timing"] is None for r in first)
    # searched again: the timed rows no longer count toward the budget, the failures still do
    assert len(long_rows) == 8 - failed
    assert {r["timing"] for r in long_rows[4:] if r["error"] is None} == {SUSTAINED}
    timed_again = {r["schedule"] for r in long_rows[4:]}
    assert not timed_again & {r["schedule"] for r in first if r["error"] is not None}   # not retried
    assert sum(r["m"] == 64 for r in rows) == 4 and all(r["timing"] is None for r in rows if r["m"] == 64)
    best = db.best(gemmc.GemmSpec(4096, 4096, 4096), "sm_90a", "fake")
    assert best.speedup == pytest.approx(0.9) and best.n_rows == 1     # only the own-clock rows rank
    assert db.best(gemmc.GemmSpec(64, 4096, 4096), "sm_90a", "fake").speedup == pytest.approx(1.2)
    assert best.own_clock and not db.best(gemmc.GemmSpec(64, 4096, 4096), "sm_90a", "fake").own_clock
    db.close()
    assert main(["--db", str(tmp_path / "t.sqlite"), "report", "--json"]) == 0
    report = {(r["m"], r["k"]): r for r in json.loads(capsys.readouterr().out)}
    assert report[(4096, 4096)]["timing"] == "sustained" and report[(64, 4096)]["timing"] == "interleaved"
    assert main(["--db", str(tmp_path / "t.sqlite"), "report"]) == 0
    text = capsys.readouterr().out
    assert text.count("[own clock]") == 2 and "timed by `tune --sustained-s`" in text   # the row and the note
