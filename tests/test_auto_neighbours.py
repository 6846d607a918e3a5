"""schedule="auto", step 3: a tuned neighbour's pick that this gemmc cannot run gives way to the next neighbour,
as the exact step's picks give way to the next best (gemmc/choose/auto.py `_decide`); `detail` names them."""
import pytest

import gemmc
from gemmc.choose.auto import resolve_auto
from gemmc.choose.shipped_steps import heuristic_schedule
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem

H200 = "NVIDIA H200"
SPEC = gemmc.GemmSpec(256, 4096, 4096)          # the problem asked for: never tuned itself
NEAR = SPEC.with_dims(m=384)                     # close neighbours (same N, K; M within 2x), nearest first
NEXT = SPEC.with_dims(m=512)
FAR = SPEC.with_dims(m=1024)                     # 4x in M: a farther neighbour (after the policy)
CRASH = "run: CUDA error: an illegal memory access was encountered"
C = SearchProblem.of(SPEC).candidates


@pytest.fixture(autouse=True)
def no_tables_no_gpu(monkeypatch):
    """The tuning DB's order alone (no shipped table), and no GPU named or visible: the rows here are the
    H200's, and `auto` reads every GPU's."""
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)


@pytest.fixture
def db(tmp_path):
    with TuningDB(tmp_path / "t.sqlite") as d:
        yield d


def _on_an_older_gemmc(db, monkeypatch, spec, m):
    with monkeypatch.context() as old:
        old.setattr("gemmc.search.db.__version__", "0.0.1")
        db.record(spec, "sm_90a", m, H200)


def _note(schedule, spec, why):
    return f"{schedule.short()} of {spec.m}x{spec.n}x{spec.k} ({why})"


def test_a_usable_nearest_neighbour_decides_as_before(db):
    db.record(NEAR, "sm_90a", Measurement(C[3], 40.0, cublas_us=50.0), H200)
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule, d.detail) == ("nearest", C[3], "tuned 384x4096x4096")


def test_a_stale_neighbour_pick_this_gemmc_failed_there_gives_way_to_the_next(db, monkeypatch):
    _on_an_older_gemmc(db, monkeypatch, NEAR, Measurement(C[3], 40.0, cublas_us=80.0))      # 2x, then
    db.record(NEAR, "sm_90a", Measurement(C[3], None, error=CRASH), H200)                   # this gemmc crashes
    db.record(NEAR, "sm_90a", Measurement(C[4], 50.0, cublas_us=50.0), H200)
    assert db.best(NEAR, "sm_90a", H200).schedule == C[3]          # the neighbour's ranking keeps it first
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule, d.use_cublas) == ("nearest", C[5], False)
    assert d.detail == ("tuned 512x4096x4096; passed over the DB's neighbour picks "
                        + _note(C[3], NEAR, f"gemmc {gemmc.__version__} failed it on 384x4096x4096: {CRASH}"))


def test_a_stale_neighbour_pick_this_gemmc_never_ran_still_decides(db, monkeypatch):
    """As at the exact step: rows of an older gemmc alone are no failure."""
    _on_an_older_gemmc(db, monkeypatch, NEAR, Measurement(C[3], 40.0, cublas_us=80.0))
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[3]) and "passed over" not in d.detail


def test_a_current_pick_with_one_failed_run_still_decides(db):
    """A schedule this gemmc ran successfully on the neighbour has a current figure: one failed run beside it
    does not pass it over (the exact step's rule)."""
    db.record(NEAR, "sm_90a", Measurement(C[3], None, error=CRASH), H200)
    db.record(NEAR, "sm_90a", Measurement(C[3], 40.0, cublas_us=80.0), H200)
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[3]) and "passed over" not in d.detail


def test_a_neighbour_pick_this_gemmc_failed_on_this_very_problem_gives_way(db):
    """The problem's own rows say this gemmc cannot build the neighbour's pick for it: the exact step has
    nothing, and the neighbour must not bring that schedule back."""
    db.record(SPEC, "sm_90a", Measurement(C[3], None, error="compile: cute.compile failed"), H200)
    db.record(NEAR, "sm_90a", Measurement(C[3], 40.0, cublas_us=80.0), H200)
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[5])
    assert d.detail.endswith("passed over the DB's neighbour picks " + _note(
        C[3], NEAR, f"gemmc {gemmc.__version__} failed it on this problem: compile: cute.compile failed"))


def test_a_neighbour_pick_that_failed_its_check_on_this_problem_gives_way(db, monkeypatch):
    """A failed correctness check disqualifies the schedule for this problem (whatever gemmc measured it):
    `auto` never runs it here, through a neighbour either."""
    _on_an_older_gemmc(db, monkeypatch, SPEC, Measurement(C[3], None, error="check: max abs err 3.5"))
    db.record(NEAR, "sm_90a", Measurement(C[3], 40.0, cublas_us=80.0), H200)
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[5])
    assert _note(C[3], NEAR, "failed its check on this problem: check: max abs err 3.5") in d.detail


def test_a_neighbour_pick_invalid_for_this_problem_gives_way_and_is_named(db):
    too_deep = C[3].with_(stages=64)                  # more shared memory than an SM has
    assert not gemmc.is_valid(too_deep, SPEC)
    db.record(NEAR, "sm_90a", Measurement(too_deep, 30.0, cublas_us=80.0), H200)
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[5])
    assert _note(too_deep, NEAR, "not valid for this problem under this gemmc") in d.detail


def test_with_no_usable_close_neighbour_the_policy_decides_and_says_what_it_passed(db, monkeypatch):
    from gemmc.search.rl import ShapeExamples, train_policy
    cands = list(SearchProblem.of(FAR).candidates)
    db.save_policy(train_policy([ShapeExamples(FAR, cands[:20], [0.01 * i for i in range(20)])], epochs=3))
    _on_an_older_gemmc(db, monkeypatch, NEAR, Measurement(C[3], 40.0, cublas_us=80.0))
    db.record(NEAR, "sm_90a", Measurement(C[3], None, error=CRASH), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.source == "policy"
    assert d.detail.startswith("policy trained on 1 shapes; passed over the DB's neighbour picks "
                               f"{C[3].short()} of 384x4096x4096 (gemmc {gemmc.__version__} failed it")


def test_a_far_neighbour_that_cannot_run_gives_way_to_the_next_far_one(db, monkeypatch):
    _on_an_older_gemmc(db, monkeypatch, FAR, Measurement(C[3], 40.0, cublas_us=80.0))
    db.record(FAR, "sm_90a", Measurement(C[3], None, error=CRASH), H200)
    farther = SPEC.with_dims(m=2048)                 # 8x: still within the farther neighbours' reach
    db.record(farther, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[5])
    assert d.detail.startswith("tuned 2048x4096x4096; passed over the DB's neighbour picks "
                               f"{C[3].short()} of 1024x4096x4096")


def test_when_no_neighbour_can_run_the_order_goes_on_and_names_them(db, monkeypatch):
    shapes = [SPEC.with_dims(m=m) for m in (320, 384, 448, 512, 640)]
    for i, s in enumerate(shapes):
        _on_an_older_gemmc(db, monkeypatch, s, Measurement(C[i], 40.0, cublas_us=80.0))
        db.record(s, "sm_90a", Measurement(C[i], None, error=CRASH), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.source == "heuristic" and d.schedule == heuristic_schedule(SPEC, "sm_90a")
    note = d.detail.split("; passed over the DB's neighbour picks ")[1]
    assert note.startswith(f"{C[0].short()} of 320x4096x4096 ") and note.endswith(" and 2 more")  # nearest first
    assert note.count(f"gemmc {gemmc.__version__} failed it on ") == 3


def test_the_exact_steps_note_follows_the_neighbours(db, monkeypatch):
    """Both steps passed something over: each says so, the exact step last (as before)."""
    _on_an_older_gemmc(db, monkeypatch, SPEC, Measurement(C[7], 40.0, cublas_us=80.0))
    db.record(SPEC, "sm_90a", Measurement(C[7], None, error=CRASH), H200)
    _on_an_older_gemmc(db, monkeypatch, NEAR, Measurement(C[3], 40.0, cublas_us=80.0))
    db.record(NEAR, "sm_90a", Measurement(C[3], None, error=CRASH), H200)
    db.record(NEXT, "sm_90a", Measurement(C[5], 40.0, cublas_us=50.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule) == ("nearest", C[5])
    parts = d.detail.split("; ")
    assert parts[0] == "tuned 512x4096x4096"
    assert parts[1].startswith(f"passed over the DB's neighbour picks {C[3].short()} of 384x4096x4096")
    assert parts[-1] == f"passed over the DB's {C[7].short()} (gemmc {gemmc.__version__} failed it: {CRASH})"
