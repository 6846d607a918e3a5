"""The schedule search under failure: a schedule that fails its correctness check is disqualified, a
crashing compile worker is recorded without aborting the tune (Builder) or stalling the prebuild
(CompilePool), a sticky CUDA error stops the tune without storing poisoned rows, the clocks are spun up
again after a compile batch, and the bar shows compile progress."""
import json
import os
import time
from types import SimpleNamespace

import pytest

import gemmc
from gemmc.choose.tuning_db_schema import CONFIRM
from gemmc.choose.tuning_db_verdict import failed_check
from gemmc.search.cli import main
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem

from conftest import as_gemmc_version
from search_fakes import InlineBuilder

SPEC = gemmc.GemmSpec(256, 1024, 512)
GPU = "NVIDIA H200"
WRONG = "check: relative Frobenius error 0.3 >= 0.01 against the fp32 reference (NaN: output elements left unwritten)"


def _sched(i):
    return SearchProblem.of(SPEC).candidates[i]


# ---- 1. a failed correctness check disqualifies ------------------------------------------------------

@pytest.mark.parametrize("error, wrong", [
    (WRONG, True),
    ("check: None", True),                                   # the Runner's words, whatever bench_shape said
    ("compile: ScheduleError: stages x stage bytes exceed smem; check the tile", False),
    ("compile timed out after 600 s", False),
    ("compile worker crashed: its process died while compiling this schedule", False),
    ("run: RuntimeError: CUDA error: an illegal memory access was encountered", False),
    ("run: LaunchError: gemm_sm90: the kernel needs 2 CTAs per cluster", False),
    ("no time", False),
    (None, False),
])
def test_failed_check_is_only_the_runners_check_failure(error, wrong):
    assert failed_check(error) is wrong


def _repro(db, version_rows=None):
    """S1: one search row at 1.2x, then two confirm rows that failed the check; S2: one row at 1.1x."""
    s1, s2 = _sched(0), _sched(1)
    db.record(SPEC, "sm_90a", Measurement(s1, 10.0, None, 12.0), GPU, "bayes")
    db.record(SPEC, "sm_90a", Measurement(s2, 10.0, None, 11.0), GPU, "bayes")
    for _ in range(2):
        db.record(SPEC, "sm_90a", Measurement(s1, None, WRONG), GPU, CONFIRM)
    return s1, s2


def test_a_schedule_that_fails_its_check_on_re_measure_is_never_the_best(tmp_path):
    from gemmc.search.rl import ERROR_MARGIN, examples_from_db
    db = TuningDB(tmp_path / "t.sqlite")
    s1, s2 = _repro(db)
    assert db.best(SPEC, "sm_90a", GPU).schedule == s2
    assert db.best(SPEC, "sm_90a").schedule == s2 and [e.schedule for e in db.best_all()] == [s2]
    assert [f.schedule for f in db.ranked_schedules(SPEC, "sm_90a", GPU)] == [s2]
    # a failed check in a confirm row counts for the confirmations' pick too: the next best is confirmed
    assert [f.schedule for f in db.ranked_schedules(SPEC, "sm_90a", GPU, search_only=True)] == [s2]
    (d,) = db.disqualified()
    assert (d.schedule, d.gpu_name, d.error, d.n_failed, d.n_ok) == (s1, GPU, WRONG, 2, 1)
    assert db.disqualified(SPEC, "sm_90a", GPU) == [d] and db.disqualified(SPEC, "sm_90a", "H100") == []
    # the policy learns it as a failure, not as the best schedule
    (ex,) = examples_from_db(db)
    rewards = dict(zip(ex.schedules, ex.rewards))
    assert rewards[s1] == pytest.approx(rewards[s2] - ERROR_MARGIN)


def test_other_failures_do_not_disqualify(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    s1, s2 = _sched(0), _sched(1)
    db.record(SPEC, "sm_90a", Measurement(s1, 10.0, None, 12.0), GPU, "bayes")
    db.record(SPEC, "sm_90a", Measurement(s2, 10.0, None, 11.0), GPU, "bayes")
    for err in ("run: RuntimeError: CUDA out of memory", "compile timed out after 600 s"):
        db.record(SPEC, "sm_90a", Measurement(s1, None, err), GPU, CONFIRM)
    assert db.best(SPEC, "sm_90a", GPU).schedule == s1 and db.disqualified() == []


def test_a_newer_gemmc_that_passes_the_check_requalifies_and_one_that_fails_disqualifies(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "t.sqlite")
    as_gemmc_version(monkeypatch, "0.1.0")
    s1, s2 = _repro(db)
    as_gemmc_version(monkeypatch, "0.2.0")
    db.record(SPEC, "sm_90a", Measurement(s1, 10.0, None, 12.5), GPU, CONFIRM)     # the kernel was fixed
    best = db.best(SPEC, "sm_90a", GPU)
    assert best.schedule == s1 and best.version == "0.2.0" and db.disqualified() == []
    as_gemmc_version(monkeypatch, "0.3.0")
    db.record(SPEC, "sm_90a", Measurement(s1, None, WRONG), GPU, CONFIRM)          # and broken again
    assert db.best(SPEC, "sm_90a", GPU).schedule == s2
    assert [(d.schedule, d.version, d.n_ok) for d in db.disqualified()] == [(s1, "0.3.0", 0)]


def test_a_disqualified_own_clock_schedule_does_not_hide_the_others(tmp_path):
    """Own-clock rows alone rank their problem, but not those of a disqualified schedule: the problem keeps
    its interleaved verdict instead of losing every schedule."""
    from gemmc.search.strategy import SUSTAINED
    db = TuningDB(tmp_path / "t.sqlite")
    s1, s2 = _sched(0), _sched(1)
    db.record(SPEC, "sm_90a", Measurement(s1, 100.0, None, 120.0, timing=SUSTAINED), GPU, "bayes")
    db.record(SPEC, "sm_90a", Measurement(s2, 100.0, None, 110.0), GPU, "bayes")
    db.record(SPEC, "sm_90a", Measurement(s1, None, WRONG), GPU, CONFIRM)
    best = db.best(SPEC, "sm_90a", GPU)
    assert best.schedule == s2 and not best.own_clock


def test_report_says_which_schedule_was_disqualified_and_why(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        s1, s2 = _repro(db)
    assert main(["--db", str(path), "report"]) == 0
    out = capsys.readouterr().out
    table = out.split("1 schedule disqualified")[0]
    assert s2.short() in table and s1.short() not in table
    line = next(ln for ln in out.splitlines() if s1.short() in ln)
    assert "256x1024x512" in line and GPU in line and "2 failed checks" in line and "passed 1 time" in line
    assert "relative Frobenius error 0.3" in line and "cannot be picked" in out
    assert main(["--db", str(path), "report", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert gemmc.Schedule.from_dict(row["schedule"]) == s2
    (d,) = row["disqualified"]
    assert gemmc.Schedule.from_dict(d["schedule"]) == s1 and d["error"] == WRONG and d["failed_checks"] == 2


def test_report_of_only_disqualified_schedules_does_not_say_none_succeeded(tmp_path, capsys):
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.record(SPEC, "sm_90a", Measurement(_sched(0), 10.0, None, 12.0), GPU, "bayes")
        db.record(SPEC, "sm_90a", Measurement(_sched(0), None, WRONG), GPU, CONFIRM)
    assert main(["--db", str(path), "report"]) == 0
    out = capsys.readouterr().out
    assert "every schedule that ran was disqualified" in out and "none successful" not in out
    assert _sched(0).short() in out



def test_tune_confirms_the_next_best_when_the_best_fails_its_check_on_re_measure(tmp_path, capsys):
    from gemmc.bench.suites import Shape
    from gemmc.search import tune
    from gemmc.search.runner import Runner
    from gemmc.search.synthetic import model_time_us
    seen = []

    def measure(spec, s, arch):
        seen.append(s)
        if seen.count(s) == 2 and s == first_best[0]:      # passes once, then computes garbage
            return Measurement(s, None, WRONG)
        return Measurement(s, model_time_us(s, spec), None, cublas_us=25.0)

    first_best = []
    db = TuningDB(tmp_path / "t.sqlite")
    shape = Shape(64, 4096, 4096)
    spec = gemmc.GemmSpec(shape.m, shape.n, shape.k)
    kw = dict(dtype="bf16", arch="sm_90a", strategy="bayes", batch=2, db=db, builder=InlineBuilder(),
              runner=Runner(measure_fn=measure), gpu_name="fake", progress=False)
    tune([shape], budget=6, confirm=0, **kw)
    first_best.append(db.best(spec, "sm_90a", "fake").schedule)
    ((_, best),) = tune([shape], budget=6, confirm=2, **kw)
    assert best.schedule != first_best[0]
    assert [d.schedule for d in db.disqualified()] == first_best
    confirmed = db.confirmed(spec, "sm_90a", "fake")
    top2 = [f.schedule for f in db.ranked_schedules(spec, "sm_90a", "fake", search_only=True)[:2]]
    assert set(top2) <= confirmed                  # the two best that remain were both re-measured
    err = capsys.readouterr().err
    assert f"confirm: {first_best[0].short()} failed its correctness check on re-measure, so it is disqualified" in err


# ---- 2. a crashing compile worker (Builder) ------------------------------------------------------------

def crashing_compile(spec, schedule, arch):
    """Runs in a spawned worker: split-K 2 kills the process outright, as a segfault in the compiler does."""
    if schedule.split_k == 2:
        os._exit(3)
    time.sleep(0.3)      # the others are in flight when it dies
    return f"{schedule.short()}.so"


def test_a_crashing_compile_worker_is_recorded_and_the_others_build():
    from gemmc.search.builder import Builder
    cands = SearchProblem.of(SPEC).candidates
    crash = next(s for s in cands if s.split_k == 2)
    fine = [s for s in cands if s.split_k == 1][:4]
    pick = fine[:2] + [crash] + fine[2:]
    seen = []
    with Builder(crashing_compile, workers=3, timeout_s=120.0) as b:
        res = b.build(SPEC, pick, "sm_90a", on_result=seen.append)
        again = b.build(SPEC, fine[:2], "sm_90a")       # the Builder still works
    assert [r.schedule for r in res] == pick and len(seen) == len(pick)
    assert not res[2].ok and res[2].error.startswith("compile worker crashed")
    assert all(r.ok and r.artifact == f"{r.schedule.short()}.so" for i, r in enumerate(res) if i != 2)
    assert all(r.ok for r in again)


def test_a_tune_records_a_crashed_compile_and_a_resume_does_not_propose_it_again(tmp_path):
    from gemmc.bench.suites import Shape
    from gemmc.search.builder import Builder
    from gemmc.search import tune
    from gemmc.search.runner import Runner
    shape = Shape(256, 1024, 512)
    spec = gemmc.GemmSpec(shape.m, shape.n, shape.k)
    crash = next(s for s in SearchProblem.of(spec).candidates if s.split_k == 2)
    db = TuningDB(tmp_path / "t.sqlite")
    measured = []

    def measure(spec, s, arch):
        measured.append(s)
        return Measurement(s, 10.0, None, cublas_us=11.0)
    with Builder(crashing_compile, workers=2, timeout_s=120.0) as b:
        tune([shape], dtype="bf16", arch="sm_90a", strategy="random", budget=2, batch=2, db=db,
             builder=b, runner=Runner(measure_fn=measure), gpu_name="fake", progress=False, confirm=0,
             also=[crash])
    rows = db.rows()
    for r in rows:
        s = gemmc.Schedule.from_dict(json.loads(r["schedule"]))
        assert (r["error"] or "").startswith("compile worker crashed") == (s.split_k == 2)
    assert crash in {gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in rows} and crash not in measured
    assert len(measured) == sum(r["error"] is None for r in rows)
    n = db.count()
    with Builder(crashing_compile, workers=2, timeout_s=120.0) as b:       # resume: nothing left to do
        tune([shape], dtype="bf16", arch="sm_90a", strategy="random", budget=2, batch=2, db=db,
             builder=b, runner=Runner(measure_fn=measure), gpu_name="fake", progress=False, confirm=0,
             also=[crash])
    assert db.count() == n


# ---- 3. a crashing compile worker (CompilePool, the bench's prebuild and the sweep) ---------------------

def crashing_worker(job, dtype="bf16", arch="sm_90a"):
    if job.get("crash"):
        os._exit(3)
    time.sleep(job.get("sleep", 0.0))
    return {"job": job, "ok": True, "error": None, "compile_s": 0.0}


def test_compile_pool_reports_a_crashed_worker_at_once_and_finishes_the_rest():
    from gemmc.bench.compile_pool import CompilePool, result_for
    jobs = [{"i": 0, "sleep": 0.5}, {"i": 1, "crash": True}, {"i": 2, "sleep": 0.5}, {"i": 3}]
    got = []
    t0 = time.perf_counter()
    res = CompilePool(jobs, workers=2, worker=crashing_worker).collect(time.perf_counter() + 600.0,
                                                                       on_result=got.append)
    assert time.perf_counter() - t0 < 60              # not the deadline
    crashed = result_for(res, jobs[1])
    assert crashed["ok"] is False and crashed["error"].startswith("compile worker crashed")
    assert "compile budget" not in crashed["error"]
    assert all(result_for(res, j)["ok"] for j in jobs if j is not jobs[1])
    assert len(got) == len(jobs)


# ---- 4. a sticky CUDA error stops the tune ---------------------------------------------------------------

class _FakeCuda:
    """torch.cuda's synchronize: fine until `poison()`, then the sticky error of an illegal address."""

    def __init__(self):
        self.error = None

    def poison(self):
        self.error = RuntimeError("CUDA error: an illegal memory access was encountered")

    def synchronize(self, device=None):
        if self.error is not None:
            raise self.error


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU Runner's path with torch.cuda.synchronize, compile, spin-up and bench_shape faked.
    bench_shape poisons the GPU for schedules in `bad`, and raises for every schedule after that."""
    import torch

    import gemmc.bench.timing as timing
    cuda = _FakeCuda()
    state = SimpleNamespace(cuda=cuda, bad=set(), benched=[], spins=0)
    monkeypatch.setattr(torch.cuda, "synchronize", cuda.synchronize)
    monkeypatch.setattr(gemmc, "compile", lambda spec, schedule, arch: schedule)

    def bench_shape(shape, kernel, sets, clock, cfg):
        if cuda.error is not None:
            raise cuda.error
        if kernel in state.bad:
            cuda.poison()
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        state.benched.append(kernel)
        return {"status": "ok", "gemmc_us": {"median": 10.0}, "ratio": 1.1}

    def spin_up(*a, **k):
        state.spins += 1
    monkeypatch.setattr(timing, "bench_shape", bench_shape)
    monkeypatch.setattr(timing, "spin_up", spin_up)
    return state


def _gpu_runner():
    from gemmc.search.runner import Runner
    r = Runner()
    r._inputs = lambda spec: (None, None)
    return r


def test_a_sticky_cuda_error_stops_the_tune_and_a_resume_measures_the_rest(tmp_path, fake_gpu, capsys):
    from gemmc.bench.suites import Shape
    from gemmc.search import tune
    from gemmc.search.runner import GpuLostError
    shape = Shape(256, 1024, 512)
    spec = gemmc.GemmSpec(shape.m, shape.n, shape.k)
    db = TuningDB(tmp_path / "t.sqlite")
    kw = dict(dtype="bf16", arch="sm_90a", strategy="random", budget=6, batch=6, db=db, builder=InlineBuilder(),
              gpu_name="fake", progress=False, confirm=0, seed=3)
    order = [m.schedule for m in _dry_order(tmp_path, kw, shape)]
    fake_gpu.bad = {order[2]}
    with pytest.raises(GpuLostError, match="left the GPU unusable") as e:
        tune([shape], runner=_gpu_runner(), **kw)
    assert order[2].short() in str(e.value) and "gemmc-search tune" in str(e.value)
    rows = db.rows()
    # the two before it, and the one that broke the GPU; nothing poisoned after it
    assert [gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in rows] == order[:3]
    assert rows[2]["error"].startswith("run: RuntimeError: CUDA error: an illegal memory access")
    assert "left the GPU unusable" in rows[2]["error"] and all(r["error"] is None for r in rows[:2])
    fake_gpu.cuda.error = None                     # a new process: a fresh CUDA context
    tune([shape], runner=_gpu_runner(), **kw)
    rows = db.rows()
    assert len(rows) == 6 and sum(r["error"] is not None for r in rows) == 1
    assert db.best(spec, "sm_90a", "fake") is not None


def test_a_gpu_broken_before_a_measurement_stores_nothing_of_it(fake_gpu):
    from gemmc.search.runner import GpuLostError
    fake_gpu.cuda.poison()
    with pytest.raises(GpuLostError, match="unusable before measuring") as e:
        _gpu_runner().measure(SPEC, _sched(0), "sm_90a")
    assert e.value.measurement is None and "was not stored" in str(e.value) and fake_gpu.benched == []


def _dry_order(tmp_path, kw, shape):
    """The schedules the tune measures, in order (a dry run on another DB with an injected runner)."""
    from gemmc.search import tune
    from gemmc.search.runner import Runner
    dry = TuningDB(tmp_path / "dry.sqlite")
    tune([shape], runner=Runner(measure_fn=lambda spec, s, arch: Measurement(s, 10.0, None, 11.0)),
         **{**kw, "db": dry})
    return [m for m in dry.prior(gemmc.GemmSpec(shape.m, shape.n, shape.k), "sm_90a")]


def test_an_ordinary_run_error_is_that_schedules_and_the_tune_goes_on(fake_gpu, monkeypatch):
    import gemmc.bench.timing as timing

    def out_of_memory(*a, **k):
        raise MemoryError("CUDA OOM")           # not sticky: synchronize still works
    monkeypatch.setattr(timing, "bench_shape", out_of_memory)
    m = _gpu_runner().measure(SPEC, _sched(0), "sm_90a")
    assert not m.ok and m.error == "run: MemoryError: CUDA OOM"


# ---- 5. the clocks are spun up again after a compile batch ---------------------------------------------

def test_the_runner_spins_the_clocks_up_after_an_idle_gap_not_between_back_to_back_measurements(
        fake_gpu, monkeypatch):
    import gemmc.search.runner as runner_mod
    now = [1000.0]
    monkeypatch.setattr(runner_mod, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    r = _gpu_runner()
    r.measure(SPEC, _sched(0), "sm_90a")
    assert fake_gpu.spins == 1                      # the first measurement
    now[0] += 0.2
    r.measure(SPEC, _sched(1), "sm_90a")
    assert fake_gpu.spins == 1                      # back to back, within a batch
    now[0] += runner_mod.RESPIN_AFTER_IDLE_S + 60   # a compile batch ran meanwhile
    r.measure(SPEC, _sched(2), "sm_90a")
    assert fake_gpu.spins == 2 and len(fake_gpu.benched) == 3


# ---- 6. the bar shows compile progress --------------------------------------------------------------------

def test_the_bar_shows_how_many_of_the_batch_compiled():
    from gemmc.search.tuning import _build_and_measure
    from gemmc.search.runner import Runner

    class Bar:
        def __init__(self):
            self.postfix = []

        def set_postfix_str(self, s):
            self.postfix.append(s)

        def update(self, n):
            pass

    class DB:
        def record(self, *a, **k):
            pass
    bar = Bar()
    schedules = [_sched(i) for i in range(3)]
    _build_and_measure(schedules, SPEC, SPEC, "sm_90a", InlineBuilder(),
                       Runner(measure_fn=lambda spec, s, arch: Measurement(s, 10.0, None, 11.0)), DB(), "fake",
                       "bayes", bar)
    compiled = [p for p in bar.postfix if "compil" in p]
    assert compiled == ["256x1024x512 bayes: compiling 3", "256x1024x512 bayes: compiled 1/3",
                        "256x1024x512 bayes: compiled 2/3", "256x1024x512 bayes: compiled 3/3"]


def test_a_host_that_cannot_start_workers_fails_the_build_instead_of_retrying_forever(monkeypatch):
    """A refused submit means a worker died (the pool is replaced and the job retried), but fresh pools that
    keep refusing mean the host cannot start processes (limits): the build stops with a BuildError."""
    from gemmc.errors import BuildError
    from gemmc.search.builder import Builder

    class RefusingPool:
        def submit(self, *a, **k):
            raise OSError("[Errno 24] Too many open files")

        def shutdown(self, *a, **k):
            pass
    monkeypatch.setattr(Builder, "_new_pool", lambda self: RefusingPool())
    monkeypatch.setattr(Builder, "_kill_pool", lambda self: None)
    cands = SearchProblem.of(SPEC).candidates[:2]
    with Builder(crashing_compile, workers=2, timeout_s=10.0) as b:
        with pytest.raises(BuildError, match="cannot start worker processes"):
            b.build(SPEC, cands, "sm_90a")
