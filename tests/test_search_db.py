"""The tuning DB: what it stores, the best-per-problem view, crash safety and resume, export/import."""
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gemmc
from gemmc.search.db import TuningDB, default_path, epilogue_class, problem_key
from gemmc.search.strategy import Measurement, SearchProblem
from gemmc.spec import EpilogueInput, EpilogueOp, Ref

REPO = Path(__file__).resolve().parents[1]
SPEC = gemmc.GemmSpec(256, 1024, 512)


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
    assert db.best(SPEC, "sm_90a").gpu_name == "H100"          # fastest over GPUs without a name
    view = db.conn.execute("SELECT COUNT(*) FROM best_per_problem").fetchone()[0]
    assert view == 2                                             # one row per (problem, GPU)
    assert {m.schedule for m in db.prior(SPEC, "sm_90a", "H200")} == {_sched(i) for i in range(3)}


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
from gemmc.search.strategy import Measurement, SearchProblem, run_search, make_strategy
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
    assert n == {"measurements": 6, "policies": 1}
    b = TuningDB(tmp_path / "b.sqlite")
    b.record(SPEC, "sm_90a", Measurement(_sched(9), 30.0), "H100", "random")
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 6, "policies": 1}
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 0, "policies": 0}   # idempotent
    assert b.count() == 7
    assert b.best(SPEC, "sm_90a", "H200").time_us == 10.0
    loaded = b.load_policy()
    cands = list(SearchProblem.of(SPEC).candidates)
    assert loaded.best(SPEC, cands) == pol.best(SPEC, cands)
    assert (loaded.scores(SPEC, cands) == pol.scores(SPEC, cands)).all()
