"""The tuning DB: what it stores, the paired verdict, schema-1 files, crash safety and resume, export/import."""
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gemmc
from gemmc.choose.tuning_db_schema import (COLUMNS, CONFIRM, SCHEMA_VERSION, default_path, epilogue_class,
                                          problem_fields, problem_key)
from gemmc.choose.tuning_db_verdict import version_key
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem, schedule_key
from gemmc.spec import EpilogueInput, EpilogueOp, Ref

from conftest import as_gemmc_version, not_a_tuning_db

REPO = Path(__file__).resolve().parents[1]
SPEC = gemmc.GemmSpec(256, 1024, 512)
BIG = gemmc.GemmSpec(16384, 8192, 8192)
BIAS = gemmc.GemmSpec(256, 1024, 512, inputs=(EpilogueInput("bias", "row"),),
                      epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))
GPU = "NVIDIA H200"


def _sched(i):
    return SearchProblem.of(SPEC).candidates[i]


def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.delenv("GEMMC_TUNING_DB", raising=False)
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path / "c"))
    assert default_path() == tmp_path / "c" / "tuning.sqlite"
    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "x.sqlite"))
    assert default_path() == tmp_path / "x.sqlite"


def test_record_keeps_every_field_and_best_view(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.record(SPEC, "sm_90a", Measurement(_sched(0), 12.0, None, 11.0, 1.5), "H200", "bayes")
    db.record(SPEC, "sm_90a", Measurement(_sched(1), 9.0, None, 10.5, 1.2), "H200", "bayes")
    db.record(SPEC, "sm_90a", Measurement(_sched(2), None, "compile: boom", None, 0.3), "H200", "bayes")
    db.record(SPEC, "sm_90a", Measurement(_sched(3), 8.0, None, 7.0), "H100", "random")
    rows = db.rows()
    assert len(rows) == 4
    r = rows[2]
    assert (r["m"], r["n"], r["k"], r["dtype"], r["a_layout"], r["b_layout"], r["epilogue_class"], r["arch"],
            r["gpu_name"], r["error"], r["compile_s"], r["gemmc_version"]) == \
        (256, 1024, 512, "bf16", "mk", "nk", "plain", "sm_90a", "H200", "compile: boom", 0.3, gemmc.__version__)
    assert r["time_us"] is None and r["created_at"] > 0
    best = db.best(SPEC, "sm_90a", "H200")
    assert best.schedule == _sched(1) and best.time_us == 9.0
    assert best.cublas_us == 10.5 and best.n_measured == 2 and abs(best.speedup - 10.5 / 9.0) < 1e-12
    # without a name, the GPU with the best paired verdict (H200 1.167x), not the fastest one (H100 8 us)
    assert db.best(SPEC, "sm_90a").gpu_name == "H200"
    assert len(db.best_all()) == 2                               # one entry per (problem, GPU)
    assert {m.schedule for m in db.prior(SPEC, "sm_90a", "H200")} == {_sched(i) for i in range(3)}


# A tune of one large problem while the GPU heats up: both clocks slow down together, so each row's
# ratio is sound, but the early (cool) rows have the lowest times of gemmc and of cuBLAS alike.
DRIFT = [(0, 100.0, 95.0),     # cool: gemmc 0.95x of cuBLAS in its own run
         (1, 103.0, 96.0),     # cool: 0.93x
         (2, 118.0, 125.0),    # hot: 1.059x, the best schedule
         (3, 121.0, 124.0)]    # hot: 1.025x


def _record_drift(db, spec=BIG):
    c = SearchProblem.of(spec).candidates
    for i, t, cub in DRIFT:
        db.record(spec, "sm_90a", Measurement(c[i], t, None, cub), GPU, "bayes")
    return c


def test_the_verdict_is_paired_under_thermal_drift(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    c = _record_drift(db)
    e = db.best(BIG, "sm_90a", GPU)
    # the min-time rule picked schedule 0 and judged it against the coolest cuBLAS row: 95 / 100 = 0.95x
    assert e.schedule == c[2] and e.time_us == 118.0 and e.cublas_us == 125.0
    assert e.speedup == 125.0 / 118.0 > 1.0 and e.n_rows == 1 and e.n_measured == 4
    assert [f.schedule for f in db.ranked_schedules(BIG, "sm_90a", GPU)] == [c[2], c[3], c[0], c[1]]


def test_repeats_of_a_schedule_count_by_their_geometric_mean_then_the_median_row(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    c = SearchProblem.of(BIG).candidates
    db.record(BIG, "sm_90a", Measurement(c[0], 100.0, None, 120.0), GPU)    # 1.20x: a lucky run
    db.record(BIG, "sm_90a", Measurement(c[1], 100.0, None, 104.5), GPU)    # 1.045x
    db.record(BIG, "sm_90a", Measurement(c[0], 110.0, None, 99.0), GPU)     # 0.90x: schedule 0 again
    # schedule 0: geomean 1.039 < 1.045 (its best row, 1.2, or its mean, 1.05, would have won)
    e = db.best(BIG, "sm_90a", GPU)
    assert e.schedule == c[1] and e.speedup == 104.5 / 100.0 and e.n_rows == 1 and e.n_measured == 3
    f0 = next(f for f in db.ranked_schedules(BIG, "sm_90a", GPU) if f.schedule == c[0])
    assert f0.unsettled and f0.spread == pytest.approx(1.2 / 0.9 - 1)       # two rows 33% apart
    db.record(BIG, "sm_90a", Measurement(c[0], 105.0, None, 120.75), GPU)   # 1.15x: the median of three
    e = db.best(BIG, "sm_90a", GPU)
    assert e.schedule == c[0] and e.n_rows == 3 and e.n_measured == 4
    assert (e.time_us, e.cublas_us) == (105.0, 120.75) and e.speedup == pytest.approx(1.15)
    f0 = next(f for f in db.ranked_schedules(BIG, "sm_90a", GPU) if f.schedule == c[0])
    assert not f0.unsettled


def test_one_outlier_among_three_rows_cannot_carry_a_schedule(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    c = SearchProblem.of(BIG).candidates
    db.record(BIG, "sm_90a", Measurement(c[1], 100.0, None, 103.0), GPU)    # 1.03x
    for t, cu in ((100.0, 130.0), (100.0, 99.0), (100.0, 100.0)):          # 1.30x (cuBLAS slow), 0.99x, 1.00x
        db.record(BIG, "sm_90a", Measurement(c[0], t, None, cu), GPU)
    # the geometric mean (1.088) would pick schedule 0; its median row (1.00) does not
    e = db.best(BIG, "sm_90a", GPU)
    assert e.schedule == c[1] and e.speedup == pytest.approx(1.03)


def test_rows_of_a_newer_gemmc_supersede_a_schedules_older_rows(tmp_path, monkeypatch):
    """New kernels may run at another speed: a schedule's figure takes only the rows of the newest gemmc
    that measured it; one measured only by an older gemmc is stale (tune --confirm re-measures it)."""
    db = TuningDB(tmp_path / "t.sqlite")
    c = SearchProblem.of(BIG).candidates
    as_gemmc_version(monkeypatch, "0.9.0")
    for cu in (110.0, 109.0, 111.0):                                       # schedule 0: 1.10x, three rows
        db.record(BIG, "sm_90a", Measurement(c[0], 100.0, None, cu), GPU)
    db.record(BIG, "sm_90a", Measurement(c[1], 100.0, None, 105.0), GPU)    # schedule 1: 1.05x
    assert not any(f.stale for f in db.ranked_schedules(BIG, "sm_90a", GPU))
    as_gemmc_version(monkeypatch, "0.10.0")                    # an upgrade (0.10 > 0.9)
    f0, f1 = db.ranked_schedules(BIG, "sm_90a", GPU)
    assert (f0.schedule, f0.n_rows, f0.version, f0.stale) == (c[0], 3, "0.9.0", True) and f1.stale
    db.record(BIG, "sm_90a", Measurement(c[0], 100.0, None, 98.0), GPU)     # the new kernel: 0.98x
    f1, f0 = db.ranked_schedules(BIG, "sm_90a", GPU)
    assert (f0.schedule, f0.n_rows, f0.speedup, f0.version, f0.stale) == (c[0], 1, 0.98, "0.10.0", False)
    e = db.best(BIG, "sm_90a", GPU)
    assert e.schedule == c[1] and e.speedup == 1.05 and e.n_measured == 5     # every row stays stored
    assert version_key("0.10.0") > version_key("0.9.1") > version_key("0.9")


def test_rows_without_cublas_rank_by_time(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    c = SearchProblem.of(BIAS).candidates
    db.record(BIAS, "sm_90a", Measurement(c[0], 40.0), GPU)          # epilogue rows: no cuBLAS beside them
    db.record(BIAS, "sm_90a", Measurement(c[1], 45.0), GPU)
    db.record(BIAS, "sm_90a", Measurement(c[0], 60.0), GPU)          # schedule 0 again: geomean 49 us
    e = db.best(BIAS, "sm_90a", GPU)
    assert e.schedule == c[1] and e.time_us == 45.0 and e.cublas_us is None and e.speedup is None
    db.record(BIAS, "sm_90a", Measurement(c[2], 44.0), GPU)
    assert db.best(BIAS, "sm_90a", GPU).schedule == c[2]
    # on a plain problem, a row without a paired cuBLAS time (other runs' clocks) never beats paired ones
    p = SearchProblem.of(SPEC).candidates
    db.record(SPEC, "sm_90a", Measurement(p[0], 30.0), GPU)
    db.record(SPEC, "sm_90a", Measurement(p[1], 50.0, None, 52.0), GPU)
    e = db.best(SPEC, "sm_90a", GPU)
    assert e.schedule == p[1] and e.speedup == 52.0 / 50.0 and e.n_measured == 2


def test_ranked_schedules_and_confirmed(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    c = _record_drift(db)
    db.record(BIG, "sm_90a", Measurement(c[3], 100.0, None, 140.0), GPU, CONFIRM)   # 1.4x on re-measure
    db.record(BIG, "sm_90a", Measurement(c[1], None, "check: mismatch"), GPU, CONFIRM)
    assert db.ranked_schedules(BIG, "sm_90a", GPU)[0].schedule == c[3]
    assert [f.schedule for f in db.ranked_schedules(BIG, "sm_90a", GPU, search_only=True)][:2] == [c[2], c[3]]
    assert db.confirmed(BIG, "sm_90a", GPU) == {c[3], c[1]}
    assert db.confirmed(BIG, "sm_90a", "H100") == set()


_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT, problem TEXT NOT NULL,
    m INTEGER NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL, batch INTEGER,
    dtype TEXT NOT NULL, out_dtype TEXT NOT NULL, acc_dtype TEXT NOT NULL,
    a_layout TEXT NOT NULL, b_layout TEXT NOT NULL, epilogue_class TEXT NOT NULL,
    arch TEXT NOT NULL, gpu_name TEXT NOT NULL, schedule TEXT NOT NULL,
    time_us REAL, cublas_us REAL, compile_s REAL, error TEXT,
    strategy TEXT, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_problem ON measurements (problem, gpu_name);
CREATE VIEW IF NOT EXISTS best_per_problem AS
    SELECT * FROM (
        SELECT measurements.*,
               MIN(cublas_us) OVER (PARTITION BY problem, gpu_name) AS cublas_best_us,
               COUNT(*) OVER (PARTITION BY problem, gpu_name) AS n_measured,
               ROW_NUMBER() OVER (PARTITION BY problem, gpu_name ORDER BY time_us, id) AS rank
        FROM measurements WHERE error IS NULL AND time_us IS NOT NULL
    ) WHERE rank = 1;
CREATE TABLE IF NOT EXISTS policies (
    name TEXT PRIMARY KEY, blob BLOB NOT NULL, feature_spec TEXT NOT NULL,
    trained_shapes INTEGER, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '1');
"""


def _schema_v1_file(path):
    """A tuning DB as gemmc wrote it before the paired verdict, holding the drift rows."""
    conn = sqlite3.connect(str(path))
    conn.executescript(_SCHEMA_V1)
    c = SearchProblem.of(BIG).candidates
    for n, (i, t, cub) in enumerate(DRIFT):
        row = {"problem": problem_key(BIG, "sm_90a"), **problem_fields(BIG, "sm_90a"), "gpu_name": GPU,
               "schedule": schedule_key(c[i]), "time_us": t,
               "cublas_us": cub, "compile_s": 1.0, "error": None, "strategy": "bayes", "gemmc_version": "0.old",
               "created_at": 1000.0 + n}
        cols = [k for k in COLUMNS if k != "timing"]       # schema 1 and 2 had no `timing`
        conn.execute(f"INSERT INTO measurements ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     [row[k] for k in cols])
    conn.commit()
    conn.close()
    return c


def test_a_schema_1_file_opens_read_only_and_migrates_on_write(tmp_path):
    path = tmp_path / "old.sqlite"
    c = _schema_v1_file(path)
    conn = sqlite3.connect(str(path))                 # what the old view decided: the cool row, 0.95x
    old = conn.execute("SELECT schedule, time_us, cublas_best_us FROM best_per_problem").fetchone()
    conn.close()
    assert gemmc.Schedule.from_dict(json.loads(old[0])) == c[0] and old[2] / old[1] == 0.95
    ro = TuningDB.open_existing(path)                 # a lookup (dispatch) leaves the file as it is
    e = ro.best(BIG, "sm_90a", GPU)
    assert e.schedule == c[2] and e.speedup == 125.0 / 118.0
    ro.close()
    views = "SELECT name FROM sqlite_master WHERE type = 'view'"
    conn = sqlite3.connect(str(path))
    assert [r[0] for r in conn.execute(views)] == ["best_per_problem"]
    conn.close()
    db = TuningDB(path)                               # a writer migrates: the min-time view goes
    assert db.conn.execute(views).fetchall() == []
    assert db.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert db.count() == 4 and db.best(BIG, "sm_90a", GPU).schedule == c[2]
    assert {r["timing"] for r in db.rows()} == {None}      # the old rows: interleaved
    db.record(BIG, "sm_90a", Measurement(c[2], 119.0, None, 120.0), GPU, CONFIRM)
    assert len(db.prior(BIG, "sm_90a", GPU)) == 4
    db.close()
    assert TuningDB(path).count() == 5                # reopening is a no-op


def test_a_newer_schema_is_left_alone(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    db.conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.conn.commit()
    db.close()
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "99"


def test_epilogue_class_separates_problems():
    bias = gemmc.GemmSpec(256, 1024, 512, inputs=(EpilogueInput("bias", "row"),),
                          epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))), EpilogueOp("relu", (Ref.node(0),))))
    assert epilogue_class(SPEC) == "plain"
    assert epilogue_class(bias).startswith("add+relu:")
    assert problem_key(SPEC, "sm_90a") != problem_key(bias, "sm_90a")
    with pytest.raises(ValueError, match="concrete"):
        problem_key(gemmc.GemmSpec("M", 1024, 512), "sm_90a")


_WRITER = r"""
import sys, time
import gemmc
from gemmc.search.db import TuningDB
from gemmc.search.registry import make_strategy
from gemmc.search.strategy import Measurement, SearchProblem, run_search
spec = gemmc.GemmSpec(256, 1024, 512)
db = TuningDB(sys.argv[1])
prior = db.prior(spec, "sm_90a", "fake")
def evaluate(ss):
    out = []
    for s in ss:
        time.sleep(float(sys.argv[3]))
        m = Measurement(s, 10.0 + s.tile[0] / 64 + s.split_k, None, 12.0)
        db.record(spec, "sm_90a", m, "fake", "random")
        print("recorded", flush=True)
        out.append(m)
    return out
run_search(make_strategy("random", seed=7), SearchProblem.of(spec), evaluate,
           budget=int(sys.argv[2]) - len(prior), batch=2, prior=prior)
print("done", flush=True)
"""


def test_killed_run_loses_nothing_committed_and_resumes_without_duplicates(tmp_path):
    path = tmp_path / "crash.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "40", "0.05"], stdout=subprocess.PIPE,
                            text=True, env=env)
    seen = 0
    deadline = time.time() + 60
    while seen < 6 and time.time() < deadline:
        if proc.stdout.readline().startswith("recorded"):
            seen += 1
    proc.send_signal(signal.SIGKILL)                 # mid-run, no cleanup
    proc.wait()
    assert seen == 6
    db = TuningDB(path)
    assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n_after_kill = db.count()
    assert 6 <= n_after_kill < 40
    db.close()
    out = subprocess.run([sys.executable, "-c", _WRITER, str(path), "40", "0"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("recorded") == 40 - n_after_kill    # resumed: only the missing ones
    db = TuningDB(path)
    scheds = [r["schedule"] for r in db.rows()]
    assert len(scheds) == 40 and len(set(scheds)) == 40


def test_export_import_round_trip_with_policy(tmp_path):
    from gemmc.search.rl import ShapeExamples, train_policy
    a = TuningDB(tmp_path / "a.sqlite")
    for i in range(6):
        a.record(SPEC, "sm_90a", Measurement(_sched(i), 10.0 + i, None, 12.0), "H200", "bayes")
    ex = [ShapeExamples(SPEC, [_sched(i) for i in range(6)], [0.1 * (6 - i) for i in range(6)])]
    pol = train_policy(ex, epochs=3)
    a.save_policy(pol)
    n = a.export(tmp_path / "x.json.gz")
    assert n == {"measurements": 6, "policies": 1, "profiles": 0}
    b = TuningDB(tmp_path / "b.sqlite")
    b.record(SPEC, "sm_90a", Measurement(_sched(9), 30.0), "H100", "random")
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 6, "policies": 1, "profiles": 0}
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 0, "policies": 0, "profiles": 0}   # idempotent
    assert b.count() == 7
    assert b.best(SPEC, "sm_90a", "H200").time_us == 10.0
    loaded = b.load_policy()
    cands = list(SearchProblem.of(SPEC).candidates)
    assert loaded.best(SPEC, cands) == pol.best(SPEC, cands)
    assert (loaded.scores(SPEC, cands) == pol.scores(SPEC, cands)).all()


def test_policy_examples_rank_schedules_by_their_paired_speedup(tmp_path):
    """The RL policy's training rewards use each schedule's own cuBLAS pairs: a schedule timed while the
    clock was high (fast, but cuBLAS fast too) must not outrank one timed after the clock stepped down."""
    from gemmc.search.rl import ERROR_MARGIN, examples_from_db
    db = TuningDB(tmp_path / "t.sqlite")
    cool, hot, broken = _sched(0), _sched(1), _sched(2)
    db.record(SPEC, "sm_90a", Measurement(cool, 10.0, None, 10.0), GPU)      # 1.00x at a high clock
    db.record(SPEC, "sm_90a", Measurement(hot, 11.0, None, 12.1), GPU)       # 1.10x after the step
    db.record(SPEC, "sm_90a", Measurement(hot, 11.5, None, 12.65), GPU)      # repeat: 1.10x again
    db.record(SPEC, "sm_90a", Measurement(broken, None, "compile: boom"), GPU)
    db.record(BIAS, "sm_90a", Measurement(cool, 20.0, None), GPU)            # no cuBLAS time: by time
    db.record(BIAS, "sm_90a", Measurement(hot, 25.0, None), GPU)
    ex = examples_from_db(db)         # one per problem (the fused one keyed by its epilogue class)
    assert len(ex) == 2
    plain_ex, fused_ex = sorted(ex, key=lambda e: broken not in e.schedules)
    plain = dict(zip(plain_ex.schedules, plain_ex.rewards))
    assert plain[hot] == pytest.approx(math.log(1.1)) and plain[cool] == pytest.approx(0.0)
    assert plain[broken] == pytest.approx(0.0 - ERROR_MARGIN)
    fused = dict(zip(fused_ex.schedules, fused_ex.rewards))
    assert fused[cool] == pytest.approx(0.0) and fused[hot] == pytest.approx(math.log(20 / 25))


def test_own_clock_rows_outrank_interleaved_ones_and_survive_export(tmp_path):
    """A long call's interleaved rows let a kernel borrow the clock cuBLAS's load sets (H200, session 16:
    1.045x interleaved, 0.85x alone at 16384x57344x8192). Once a problem has rows timed at their own clock,
    only they decide its verdict."""
    from gemmc.search.strategy import SUSTAINED
    db = TuningDB(tmp_path / "t.sqlite")
    c = SearchProblem.of(BIG).candidates
    db.record(BIG, "sm_90a", Measurement(c[0], 100.0, None, 120.0), GPU, "bayes")                 # 1.2x
    assert db.best(BIG, "sm_90a", GPU).schedule == c[0]
    db.record(BIG, "sm_90a", Measurement(c[1], 110.0, None, 99.0, timing=SUSTAINED), GPU, "bayes")  # 0.9x
    best = db.best(BIG, "sm_90a", GPU)
    assert best.schedule == c[1] and best.speedup == pytest.approx(0.9)
    assert [m.schedule for m in db.prior(BIG, "sm_90a", GPU, sustained_only=True)] == [c[1]]
    assert {m.timing for m in db.prior(BIG, "sm_90a", GPU)} == {None, SUSTAINED}
    db.record(BIG, "sm_90a", Measurement(c[1], 110.0, None, 99.0, timing=SUSTAINED), GPU, CONFIRM)
    db.record(BIG, "sm_90a", Measurement(c[0], 100.0, None, 120.0), GPU, CONFIRM)
    assert db.confirmed(BIG, "sm_90a", GPU, sustained_only=True) == {c[1]}
    db.record(BIG, "sm_90a", Measurement(c[2], None, "check: wrong"), GPU, CONFIRM)   # fails whatever the clock
    assert db.confirmed(BIG, "sm_90a", GPU, sustained_only=True) == {c[1], c[2]}
    assert {m.schedule for m in db.prior(BIG, "sm_90a", GPU, sustained_only=True)} == {c[1], c[2]}
    assert db.confirmed(BIG, "sm_90a", GPU) == {c[0], c[1], c[2]}
    db.export(tmp_path / "x.json.gz")
    other = TuningDB(tmp_path / "o.sqlite")
    assert other.import_(tmp_path / "x.json.gz")["measurements"] == 5
    assert other.best(BIG, "sm_90a", GPU).schedule == c[1]
    assert sorted(str(r["timing"]) for r in other.rows()) == ["None"] * 3 + [SUSTAINED] * 2


# ---- files that are not a tuning DB, and exports that are not exports -----------------------------

@pytest.mark.parametrize("kind, needle", [("corrupt", "cannot be read as a tuning DB"), ("zero", "it is empty"),
                                          ("foreign", "its measurements table lacks"), ("folder", "is a folder")])
def test_opening_a_file_that_is_not_a_tuning_db_names_it_and_leaves_it_alone(tmp_path, kind, needle):
    from gemmc.choose.tuning_db_schema import TuningDBError
    path = not_a_tuning_db(tmp_path)[kind]
    before = None if path.is_dir() else path.read_bytes()
    with pytest.raises(TuningDBError, match=needle) as e:
        TuningDB.open_existing(path)
    assert str(path) in str(e.value) and "GEMMC_TUNING_DB" in str(e.value)
    if kind != "zero":                                  # an empty file is a new DB to a writer
        with pytest.raises(TuningDBError, match=needle):
            TuningDB(path)
    assert before is None or path.read_bytes() == before
    assert not list(tmp_path.glob("*-wal")) and not list(tmp_path.glob("*-journal"))


def test_a_writer_makes_an_empty_file_a_db_and_a_reader_never_creates_or_writes(tmp_path):
    from gemmc.choose.tuning_db_schema import TuningDBError
    zero = not_a_tuning_db(tmp_path)["zero"]
    TuningDB(zero).close()                              # e.g. `touch`ed, or cut off before its schema
    assert TuningDB(zero, create=False).count() == 0
    missing = tmp_path / "no" / "such.sqlite"
    assert TuningDB.open_existing(missing) is None
    with pytest.raises(TuningDBError, match="no tuning DB there"):
        TuningDB(missing, create=False)
    assert not (tmp_path / "no").exists()
    ro = TuningDB(zero, create=False)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        ro.record(SPEC, "sm_90a", Measurement(_sched(0), 1.0, None, 1.0), GPU)
    ro.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.sqlite", "folder", "foreign.sqlite",
                                                         "zero.sqlite"]       # the reader left no -wal / -shm


def _gz(path, text):
    import gzip
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("make, needle", [
    (lambda p: p, "does not exist"),
    (lambda p: (p.write_text("{}"), p)[1], "not gzipped"),
    (lambda p: _gz(p, "[1, 2]"), "not a gemmc-search export"),
    (lambda p: _gz(p, '{"format": "gemmc-tuning"}'), "lists of 'measurements' and 'policies'"),
    (lambda p: _gz(p, '{"format": "gemmc-tuning", "measurements": [{"problem": "x"}]}'),
     "measurement 0 lacks m, n, k"),
    (lambda p: _gz(p, '{"format": "gemmc-dataset/1"}\n{"m": 1}\n'), "one JSON record per line"),
    (lambda p: _gz(p, '{"format": "gemmc-tun'), "damaged or not JSON|not one JSON document"),
])
def test_import_names_the_file_and_what_is_wrong_with_it(tmp_path, make, needle):
    from gemmc.choose.tuning_db_schema import TuningDBError
    src = make(tmp_path / "x.json.gz")
    db = TuningDB(tmp_path / "t.sqlite")
    with pytest.raises(TuningDBError, match=needle) as e:
        db.import_(src)
    assert str(src) in str(e.value) and db.count() == 0


def test_export_never_overwrites_its_own_db(tmp_path, monkeypatch):
    from gemmc.choose.tuning_db_schema import TuningDBError
    db = TuningDB(tmp_path / "t.sqlite")
    db.record(SPEC, "sm_90a", Measurement(_sched(0), 10.0, None, 11.0), GPU)
    monkeypatch.chdir(tmp_path)
    for dest in (tmp_path / "t.sqlite", "t.sqlite", "./t.sqlite"):
        with pytest.raises(TuningDBError, match="is the tuning DB being exported"):
            db.export(dest)
    assert db.count() == 1 and TuningDB(tmp_path / "t.sqlite", create=False).count() == 1


def test_failures_count_failed_rows_by_error(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    for i, err in enumerate(["compile: a", "compile: a", "check: b"]):
        db.record(SPEC, "sm_90a", Measurement(_sched(i), None, err), GPU)
    db.record(SPEC, "sm_90a", Measurement(_sched(3), 10.0, None, 11.0), GPU)
    assert db.failures() == [("compile: a", 2), ("check: b", 1)]
