"""schedule="auto": DB exact match, then neighbour / policy, then the heuristic; cuBLAS fallback."""
import pytest
from hypothesis import given, settings, strategies as st

import gemmc
from gemmc.choose.auto import resolve_auto
from gemmc.choose.decision import Decision
from gemmc.choose.shipped_steps import heuristic_schedule
from gemmc.choose.tuning_db import TuningDBReader
from gemmc.schedule import is_valid
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem
from gemmc.spec import EpilogueInput, EpilogueOp, Ref

from conftest import not_a_tuning_db

SPEC = gemmc.GemmSpec(256, 4096, 4096)
BIAS = gemmc.GemmSpec(256, 4096, 4096, inputs=(EpilogueInput("bias", "row"),),
                      epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))


def _cands(spec):
    return SearchProblem.of(spec).candidates


@pytest.fixture(autouse=True, scope="module")
def no_shipped_tables():
    """These tests pin the tuning-DB order; the shipped tables have their own (tests/test_pretuned.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMC_PRETUNED", "0")
        yield


@pytest.fixture(autouse=True)
def no_gpu_named(monkeypatch):
    """No GPU named or visible (the rows here are measured on "H200"): `auto` reads any GPU's rows, on any
    host (a visible GPU would take only its own rows: tests/test_dispatch_audit.py)."""
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)


@pytest.fixture
def db(tmp_path):
    return TuningDB(tmp_path / "t.sqlite")


def test_no_db_uses_the_heuristic(tmp_path):
    d = resolve_auto(SPEC, "sm_90a", db=tmp_path / "missing.sqlite")
    assert d.source == "heuristic" and not d.use_cublas and is_valid(d.schedule, SPEC)
    assert not (tmp_path / "missing.sqlite").exists()           # a lookup never creates the DB
    assert d.schedule == heuristic_schedule(SPEC, "sm_90a")


def test_exact_match_and_cublas_fallback(db):
    c = _cands(SPEC)
    db.record(SPEC, "sm_90a", Measurement(c[5], 50.0, None, 45.0), "H200")
    db.record(SPEC, "sm_90a", Measurement(c[7], 47.0, None, 45.5), "H200")
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d == Decision(c[7], "db", use_cublas=True, detail=d.detail)   # cuBLAS 45 < 47
    db.record(SPEC, "sm_90a", Measurement(c[9], 40.0, None, 45.0), "H200")
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.schedule == c[9] and d.source == "db" and not d.use_cublas


def test_the_fallback_follows_the_paired_verdict_under_drift(db):
    """A tune during which the GPU heats up: the early rows are cool for gemmc and cuBLAS alike."""
    big = gemmc.GemmSpec(16384, 8192, 8192)
    c = _cands(big)
    for i, t, cub in [(0, 100.0, 95.0), (1, 103.0, 96.0), (2, 118.0, 125.0), (3, 121.0, 124.0)]:
        db.record(big, "sm_90a", Measurement(c[i], t, None, cub), "H200")
    # fastest row (100 us) vs the fastest cuBLAS row (95 us) would run torch.matmul; schedule 2 beat
    # cuBLAS in its own runs by 1.059x
    d = resolve_auto(big, "sm_90a", db=db)
    assert d.schedule == c[2] and not d.use_cublas and "paired 1.059x" in d.detail


def test_torch_matmul_exactly_when_the_paired_speedup_is_below_1(db):
    c = _cands(SPEC)
    db.record(SPEC, "sm_90a", Measurement(c[1], 45.0, None, 45.0), "H200")          # 1.000x: a tie keeps gemmc
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.schedule == c[1] and not d.use_cublas
    db.record(SPEC, "sm_90a", Measurement(c[1], 50.0, None, 49.0), "H200")          # repeat: geomean 0.990x
    e = db.best(SPEC, "sm_90a", "H200")
    assert e.schedule == c[1] and e.n_rows == 2 and e.speedup < 1.0
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.schedule == c[1] and d.use_cublas and "geomean of 2 rows" in d.detail
    # one lucky row of another schedule (1.04x) beats it; two repeats of it at 0.97x: its median row,
    # 0.97x, falls below the first schedule's 0.990x, and torch.matmul runs again
    db.record(SPEC, "sm_90a", Measurement(c[2], 50.0, None, 52.0), "H200")
    assert not resolve_auto(SPEC, "sm_90a", db=db).use_cublas
    db.record(SPEC, "sm_90a", Measurement(c[2], 50.0, None, 48.5), "H200")
    db.record(SPEC, "sm_90a", Measurement(c[2], 50.0, None, 48.5), "H200")
    e = db.best(SPEC, "sm_90a", "H200")
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.schedule == e.schedule == c[1] and e.speedup < 1.0 and d.use_cublas
    c2 = next(f for f in db.ranked_schedules(SPEC, "sm_90a", "H200") if f.schedule == c[2])
    assert c2.n_rows == 3 and c2.speedup == pytest.approx(0.97)
    db.record(SPEC, "sm_90a", Measurement(c[2], 50.0, None, 53.0), "H200")          # 4 rows: the lower middle
    c2 = next(f for f in db.ranked_schedules(SPEC, "sm_90a", "H200") if f.schedule == c[2])
    assert c2.n_rows == 4 and c2.speedup == pytest.approx(0.97)
    db.record(SPEC, "sm_90a", Measurement(c[2], 50.0, None, 53.0), "H200")          # 5 rows: 1.04x in the middle
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.schedule == c[2] and not d.use_cublas and "median of 5 rows" in d.detail


def test_epilogue_never_falls_back_to_cublas(db):
    c = _cands(BIAS)
    db.record(BIAS, "sm_90a", Measurement(c[3], 60.0, None, 40.0), "H200")
    d = resolve_auto(BIAS, "sm_90a", db=db)
    assert d.source == "db" and d.schedule == c[3] and not d.use_cublas
    # the plain problem's tuning is a different problem: it does not leak into the epilogue one
    assert resolve_auto(gemmc.GemmSpec(256, 4096, 4096), "sm_90a", db=db).source == "heuristic"


def test_symbolic_m_resolves_with_runtime_m(db):
    c = _cands(SPEC)
    db.record(SPEC, "sm_90a", Measurement(c[11], 30.0, None, 45.0), "H200")
    sym = gemmc.GemmSpec("M", 4096, 4096)
    assert resolve_auto(sym, "sm_90a", m=256, db=db).schedule == c[11]
    assert resolve_auto(sym, "sm_90a", db=db).source == "heuristic"   # no m: nothing to look up


def test_nearest_tuned_shape_then_heuristic(db):
    c = _cands(SPEC)
    db.record(SPEC, "sm_90a", Measurement(c[11], 30.0, None, 20.0), "H200")
    near = gemmc.GemmSpec(384, 4096, 4096)
    d = resolve_auto(near, "sm_90a", db=db)
    assert d.source == "nearest" and d.schedule == c[11] and not d.use_cublas   # cuBLAS only on exact
    far = gemmc.GemmSpec(8192, 1024, 256)
    assert resolve_auto(far, "sm_90a", db=db).source == "heuristic"


def test_policy_before_a_distant_neighbour(db):
    from gemmc.search.rl import ShapeExamples, train_policy
    c = list(_cands(SPEC))
    pol = train_policy([ShapeExamples(SPEC, c[:20], [0.01 * i for i in range(20)])], epochs=5)
    db.record(SPEC, "sm_90a", Measurement(c[11], 30.0, None, 20.0), "H200")
    db.save_policy(pol)
    other = gemmc.GemmSpec(1024, 4096, 4096)     # 4x in M: not a close neighbour
    d = resolve_auto(other, "sm_90a", db=db)
    assert d.source == "policy"
    assert d.schedule == pol.best(other, list(_cands(other)))
    assert resolve_auto(gemmc.GemmSpec(512, 4096, 4096), "sm_90a", db=db).source == "nearest"  # within 2x


def test_a_policy_of_older_features_is_skipped_with_a_warning(db):
    """A policy saved under another feature version (e.g. 3, before the odd-N tile widths) cannot score this
    gemmc's schedules: `auto` says so once, and answers from the neighbours and the heuristic."""
    import dataclasses
    from gemmc.choose.features import FeatureSpec
    from gemmc.choose.schedule_policy import SchedulePolicy
    old = SchedulePolicy(hidden=8)
    old.feature_spec = dataclasses.replace(FeatureSpec(), version=3)
    db.save_policy(old)
    other = gemmc.GemmSpec(1024, 4096, 4096)
    with pytest.warns(UserWarning, match="skips the policy saved in .*retrain"):
        d = resolve_auto(other, "sm_90a", db=db)
    assert d.source == "heuristic" and is_valid(d.schedule, other)


_DIMS = st.sampled_from([16, 64, 128, 256, 512, 1024, 4096])


@settings(max_examples=30, deadline=None)
@given(m=_DIMS, n=_DIMS, k=_DIMS, cublas=st.floats(5.0, 100.0), epi=st.booleans())
def test_decisions_are_always_valid_and_fallback_only_on_exact_plain(tmp_path_factory, m, n, k, cublas, epi):
    path = tmp_path_factory.mktemp("db") / "t.sqlite"
    db = TuningDB(path)
    for tm, tn, tk in [(128, 4096, 4096), (1024, 1024, 1024), (64, 512, 4096)]:
        spec = gemmc.GemmSpec(tm, tn, tk)
        db.record(spec, "sm_90a", Measurement(_cands(spec)[-1], 40.0, None, cublas), "H200")
    spec = BIAS.with_dims(m=m, n=n, k=k) if epi else gemmc.GemmSpec(m, n, k)
    d = resolve_auto(spec, "sm_90a", db=db)
    assert is_valid(d.schedule, spec)
    if d.use_cublas:
        assert d.source == "db" and not epi and cublas < 40.0
    if d.source == "db" and not epi:
        assert d.use_cublas == (cublas < 40.0)               # the paired speed-up cublas / 40 below 1
    exact = (m, n, k) in [(128, 4096, 4096), (1024, 1024, 1024), (64, 512, 4096)] and not epi
    assert (d.source == "db") == exact


def test_a_symbolic_batch_never_reuses_unbatched_entries(db):
    c = _cands(SPEC)
    db.record(SPEC, "sm_90a", Measurement(c[5], 50.0, None, 45.0), "H200")     # unbatched: cuBLAS faster
    batched = gemmc.GemmSpec(256, 4096, 4096, batch="L")
    d = resolve_auto(batched, "sm_90a", db=db)
    assert d.source == "heuristic" and not d.use_cublas


# ---- a tuning DB that cannot be read, a GEMMC_GPU that names no table --------------------------------

@pytest.fixture
def fresh_warnings(monkeypatch):
    """`auto` warns once per process about each file or name; each test starts with none said."""
    monkeypatch.setattr("gemmc.choose.notices._warned", set())


def test_an_unreadable_db_is_skipped_with_one_warning_naming_it(tmp_path, monkeypatch, fresh_warnings):
    import warnings
    for path in not_a_tuning_db(tmp_path).values():
        monkeypatch.setenv("GEMMC_TUNING_DB", str(path))
        before = None if path.is_dir() else path.read_bytes()
        with pytest.warns(UserWarning, match="goes on without the tuning DB") as caught:
            d = resolve_auto(SPEC, "sm_90a")            # the default DB: what every compile consults
        assert d.source == "heuristic" and is_valid(d.schedule, SPEC)
        message = str(caught[0].message)
        assert str(path) in message and "GEMMC_TUNING_DB" in message
        with warnings.catch_warnings():
            warnings.simplefilter("error")              # once per file: the next compile says nothing
            assert resolve_auto(gemmc.GemmSpec(512, 4096, 4096), "sm_90a").source == "heuristic"
        assert before is None or path.read_bytes() == before


def test_a_compile_with_a_corrupt_db_still_compiles(tmp_path, monkeypatch, fresh_warnings):
    monkeypatch.setenv("GEMMC_TUNING_DB", str(not_a_tuning_db(tmp_path)["corrupt"]))
    with pytest.warns(UserWarning, match="corrupt.sqlite"):
        k = gemmc.compile(gemmc.GemmSpec(4096, 4096, 4096))
    assert k.decision.source == "heuristic"


def test_a_db_that_fails_mid_read_is_skipped_with_a_warning(db, monkeypatch, fresh_warnings):
    import sqlite3
    c = _cands(SPEC)
    db.record(SPEC, "sm_90a", Measurement(c[5], 50.0, None, 55.0), "H200")

    def malformed(*a, **k):
        raise sqlite3.DatabaseError("database disk image is malformed")
    monkeypatch.setattr(TuningDBReader, "best", malformed)      # auto reads a DB path through the reader
    with pytest.warns(UserWarning, match="reading .*t.sqlite failed .*malformed"):
        d = resolve_auto(SPEC, "sm_90a", db=db.path)
    assert d.source == "heuristic"


def test_a_misspelled_gemmc_gpu_warns_once_with_the_known_names(monkeypatch, fresh_warnings):
    import warnings
    from gemmc.choose.pretuned import load_tables
    monkeypatch.setenv("GEMMC_PRETUNED", "1")
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    known = sorted({t.gpu for t in load_tables()})
    monkeypatch.setenv("GEMMC_GPU", "NVIDIA H20O")
    with pytest.warns(UserWarning, match="GEMMC_GPU='NVIDIA H20O' matches no shipped table") as caught:
        d = resolve_auto(SPEC, "sm_90a", db=None)
    message = str(caught[0].message)
    assert all(repr(name) in message for name in known) and "did you mean 'NVIDIA H200'" in message
    assert d.source == "heuristic"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_auto(SPEC, "sm_90a")                    # once per name
        for name in (known[0], None):                   # a known name, or none: nothing to say
            if name is None:
                monkeypatch.delenv("GEMMC_GPU")
            else:
                monkeypatch.setenv("GEMMC_GPU", name)
            resolve_auto(SPEC, "sm_90a")
        monkeypatch.setenv("GEMMC_GPU", "bogus")
        monkeypatch.setenv("GEMMC_PRETUNED", "0")       # the tables are off anyway: no typo to report
        resolve_auto(SPEC, "sm_90a")


def test_the_docstring_describes_the_verdict_the_db_gives(db):
    """Three paired rows: the median row decides (not the geometric mean), as the module says."""
    import gemmc.choose.auto
    doc = " ".join(gemmc.choose.auto.__doc__.split())
    assert "median row's" in doc and "geometric mean over the best schedule's rows" not in doc
    c = _cands(SPEC)
    for t, cub in [(50.0, 49.0), (50.0, 49.5), (50.0, 80.0)]:   # geomean 1.14x, median row 0.99x
        db.record(SPEC, "sm_90a", Measurement(c[5], t, None, cub), "H200")
    d = resolve_auto(SPEC, "sm_90a", db=db)
    assert d.use_cublas and "median of 3 rows" in d.detail
