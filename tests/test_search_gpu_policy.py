"""The rl policy is GPU-aware: it trains on the target GPU's rows only, the DB records the GPU it was trained for
(schema 4: policies.gpu_name, NULL for an older file's policy) and keeps one policy per GPU, export/import carry
them, and schedule="auto" and `tune --strategy rl` use the target GPU's policy, else the one of unknown GPU, never
another GPU's. Also: gemmc.search exports the simulator's functions."""
import ast
import base64
import gzip
import inspect
import json
import sqlite3
import sys
from pathlib import Path

import pytest
import torch

import gemmc
from gemmc.choose.auto import resolve_auto
from gemmc.choose.tuning_db_schema import SCHEMA_VERSION, TuningDBError, problem_fields, problem_key
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem, schedule_key

H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
P1 = gemmc.GemmSpec(128, 4096, 4096)
P2 = gemmc.GemmSpec(256, 4096, 4096)
P3 = gemmc.GemmSpec(512, 2048, 2048)
ASK = gemmc.GemmSpec(2048, 1024, 8192)          # a shape no row is near (other N and K): the policy's step


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """No GPU named or visible, no shipped tables: each test names the GPU it means."""
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)
    monkeypatch.setenv("GEMMC_PRETUNED", "0")


def _cands(spec):
    return list(SearchProblem.of(spec).candidates)


def _record(db, gpu, spec, times, cublas=50.0):
    for i, t in enumerate(times):
        db.record(spec, "sm_90a", Measurement(_cands(spec)[i], t, None, cublas), gpu, "bayes")


def _two_gpu_rows(db, with_h100=True):
    """The H200's rows of P1 and P2; with_h100: the H100's of P1 (ranked the other way round) and P3,
    recorded in between."""
    _record(db, H200, P1, [40.0, 45.0, 50.0, 55.0])
    if with_h100:
        _record(db, H100, P1, [55.0, 50.0, 45.0, 40.0])
    _record(db, H200, P2, [60.0, 50.0, 40.0])
    if with_h100:
        _record(db, H100, P3, [30.0, 35.0, 20.0])


def _small_policy(gpu=None, flip=False):
    """A policy trained on one problem; flip: on the opposite ranking (it picks other schedules)."""
    from gemmc.search.rl import ShapeExamples, train_policy
    c = _cands(P2)
    pol = train_policy([ShapeExamples(P2, c[:12], [(-0.01 if flip else 0.01) * i for i in range(12)])], epochs=2)
    pol.gpu_name = gpu
    return pol


def _same(a, b, spec=ASK):
    cands = _cands(spec)
    return torch.equal(a.scores(spec, cands), b.scores(spec, cands))


# ---- training uses the target GPU's rows ------------------------------------------------------------------

def test_examples_and_training_read_only_the_target_gpus_rows(tmp_path):
    from gemmc.search.rl import examples_from_db, train_policy_from_db
    both, alone = TuningDB(tmp_path / "both.sqlite"), TuningDB(tmp_path / "alone.sqlite")
    _two_gpu_rows(both)
    _two_gpu_rows(alone, with_h100=False)
    ex = examples_from_db(both, H200)
    assert [(e.spec.m, e.gpu_name) for e in ex] == [(128, H200), (256, H200)]
    assert ex[0].schedules[0] == _cands(P1)[0]              # the H200's ranking of P1, not the H100's
    # the H100's rows change nothing: the same policy as from a DB that never held them
    a = train_policy_from_db(both, epochs=3, gpu_name=H200)
    b = train_policy_from_db(alone, epochs=3, gpu_name=H200, save=False)
    cands = _cands(ASK)
    assert a.trained_shapes == b.trained_shapes == 2
    assert torch.equal(a.scores(ASK, cands), b.scores(ASK, cands))
    saved = both.load_policy()
    assert saved.gpu_name == H200 and torch.equal(saved.scores(ASK, cands), a.scores(ASK, cands))
    assert both.conn.execute("SELECT gpu_name FROM policies").fetchall()[0][0] == H200
    # the H100's own policy: its two problems
    assert train_policy_from_db(both, epochs=3, gpu_name=H100).trained_shapes == 2
    assert both.load_policy().gpu_name == H100


def test_with_no_target_every_gpus_rows_train_a_policy_of_unknown_gpu(tmp_path):
    from gemmc.search.rl import examples_from_db, train_policy_from_db
    db = TuningDB(tmp_path / "t.sqlite")
    _two_gpu_rows(db)
    ex = examples_from_db(db)               # each GPU's rows of a problem: an example of their own
    assert sorted((e.spec.m, e.gpu_name) for e in ex) == [(128, H100), (128, H200), (256, H200), (512, H100)]
    pol = train_policy_from_db(db, epochs=2)
    assert pol.trained_shapes == 4 and pol.gpu_name is None and db.load_policy().gpu_name is None
    one = TuningDB(tmp_path / "one.sqlite")
    _two_gpu_rows(one, with_h100=False)
    assert train_policy_from_db(one, epochs=2).gpu_name == H200     # all of one GPU's rows: that GPU's


def test_train_policy_cli_trains_for_the_gpu_it_names(tmp_path, capsys, monkeypatch):
    from gemmc.search.cli import main
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _two_gpu_rows(db)
    assert main(["--db", str(path), "train-policy", "--gpu", H100, "--epochs", "2"]) == 0
    assert f"trained the policy on 2 problems measured on {H100}" in capsys.readouterr().out
    with TuningDB(path, create=False) as db:
        assert db.load_policy().gpu_name == H100
    monkeypatch.setenv("GEMMC_GPU", H200)                  # no --gpu: the target GPU, as `auto` names it
    assert main(["--db", str(path), "train-policy", "--epochs", "2"]) == 0
    with TuningDB(path, create=False) as db:
        pol = db.load_policy()
        assert (pol.gpu_name, pol.trained_shapes) == (H200, 2)
    monkeypatch.delenv("GEMMC_GPU")                        # none named or visible: every GPU's rows
    assert main(["--db", str(path), "train-policy", "--epochs", "2"]) == 0
    assert "on 4 problems measured on several GPUs" in capsys.readouterr().out
    with TuningDB(path, create=False) as db:
        assert db.load_policy().gpu_name is None


def test_train_policy_for_a_gpu_with_no_rows_names_the_ones_there(tmp_path, capsys):
    from gemmc.search.cli import main
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _two_gpu_rows(db)
    assert main(["--db", str(path), "train-policy", "--gpu", "NVIDIA GH200 480GB"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no problem measured on NVIDIA GH200 480GB has two or more" in err
    assert f"the DB holds rows of '{H100}', '{H200}': name one with --gpu" in err
    with TuningDB(path, create=False) as db:
        assert db.load_policy() is None                    # nothing saved


def test_tune_retrains_the_policy_on_the_gpu_it_tuned_on(tmp_path, capsys, monkeypatch):
    import gemmc.search.cli as climod
    import gemmc.search.runner as runner_mod
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _two_gpu_rows(db)
    monkeypatch.setattr(runner_mod.Runner, "gpu_name", staticmethod(lambda: H100))
    monkeypatch.setattr(climod, "tune", lambda shapes, **kw: [])
    assert climod.main(["--db", str(path), "tune", "--suite", "llm", "--sample", "1", "--budget", "2",
                        "--workers", "1"]) == 0
    assert f"policy retrained on 2 problems measured on {H100}" in capsys.readouterr().err
    with TuningDB(path, create=False) as db:
        pol = db.load_policy()
        assert (pol.gpu_name, pol.trained_shapes) == (H100, 2)


# ---- auto uses a policy of the target GPU (or of an unknown one) ------------------------------------------

def test_auto_passes_over_a_policy_of_another_gpu(tmp_path):
    path = tmp_path / "t.sqlite"
    pol = _small_policy(H100)
    with TuningDB(path) as db:
        db.record(ASK.with_dims(m=512), "sm_90a", Measurement(_cands(ASK)[3], 40.0, None, 50.0), H200)  # 4x in M
        db.save_policy(pol)
    d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=H200)
    assert (d.source, d.schedule) == ("nearest", _cands(ASK)[3])       # the farther neighbour, not the policy
    d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=H100)
    assert (d.source, d.schedule) == ("policy", pol.best(ASK, _cands(ASK)))
    assert d.detail == f"policy trained on 1 shapes of {H100}"
    d = resolve_auto(ASK, "sm_90a", db=path)                             # no GPU named or visible
    assert d.source == "policy"


def test_auto_uses_a_policy_of_unknown_gpu_on_any(tmp_path):
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.record(ASK.with_dims(m=512), "sm_90a", Measurement(_cands(ASK)[3], 40.0, None, 50.0), H200)
        db.save_policy(_small_policy(None))
    for gpu in (H200, H100, None):
        d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=gpu)
        assert d.source == "policy" and d.detail == "policy trained on 1 shapes"


# ---- schema 4: an older file, older exports ----------------------------------------------------------------

_SCHEMA_V3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT, problem TEXT NOT NULL,
    m INTEGER NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL, batch INTEGER,
    dtype TEXT NOT NULL, out_dtype TEXT NOT NULL, acc_dtype TEXT NOT NULL,
    a_layout TEXT NOT NULL, b_layout TEXT NOT NULL, epilogue_class TEXT NOT NULL,
    arch TEXT NOT NULL, gpu_name TEXT NOT NULL, schedule TEXT NOT NULL,
    time_us REAL, cublas_us REAL, compile_s REAL, error TEXT,
    strategy TEXT, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL, timing TEXT
);
CREATE INDEX measurements_problem ON measurements (problem, gpu_name);
CREATE TABLE policies (
    name TEXT PRIMARY KEY, blob BLOB NOT NULL, feature_spec TEXT NOT NULL,
    trained_shapes INTEGER, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '3');
"""


def _schema_v3_file(path, pol):
    """A tuning DB as gemmc wrote it at schema 3: one measurement, and `pol` saved with no GPU column."""
    conn = sqlite3.connect(str(path))
    conn.executescript(_SCHEMA_V3)
    row = {"problem": problem_key(P2, "sm_90a"), **problem_fields(P2, "sm_90a"), "gpu_name": H200,
           "schedule": schedule_key(_cands(P2)[0]), "time_us": 40.0, "cublas_us": 50.0, "compile_s": 1.0,
           "error": None, "strategy": "bayes", "gemmc_version": "0.old", "created_at": 1000.0, "timing": None}
    conn.execute(f"INSERT INTO measurements ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    conn.execute("INSERT INTO policies VALUES (?, ?, ?, ?, ?, ?)",
                 ("default", pol.to_bytes(), json.dumps(pol.feature_spec.to_dict()), pol.trained_shapes, "0.old",
                  1000.0))
    conn.commit()
    conn.close()


def _columns(path, table):
    conn = sqlite3.connect(str(path))
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def _schema_version(path):
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    finally:
        conn.close()


def test_a_schema_3_file_reads_as_is_and_migrates_on_write(tmp_path):
    assert SCHEMA_VERSION == 5        # 5: the profiles table (tests/test_l2_profile.py); 4: policies.gpu_name
    path = tmp_path / "old.sqlite"
    pol = _small_policy()
    _schema_v3_file(path, pol)
    cands = _cands(ASK)
    with TuningDB.open_existing(path) as ro:          # read-only (a lookup, report, export): nothing changes
        old = ro.load_policy()
        assert old.gpu_name is None and torch.equal(old.scores(ASK, cands), pol.scores(ASK, cands))
        assert ro.export(tmp_path / "old.json.gz") == {"measurements": 1, "policies": 1, "profiles": 0}
    assert "gpu_name" not in _columns(path, "policies") and _schema_version(path) == "3"
    with gzip.open(tmp_path / "old.json.gz", "rt") as f:
        assert json.load(f)["policies"][0]["gpu_name"] is None
    # `auto` reads the old policy as of unknown GPU: it serves any GPU
    assert resolve_auto(ASK, "sm_90a", db=path, gpu_name=H100).source == "policy"
    with TuningDB(path) as db:                        # a writer migrates, keeping the old policy's GPU unknown
        assert _schema_version(path) == str(SCHEMA_VERSION)
        assert _columns(path, "policies")[-1] == "gpu_name"
        rows = db.conn.execute("SELECT name, gpu_name, created_at FROM policies").fetchall()
        assert [tuple(r) for r in rows] == [("default", None, 1000.0)]
        assert db.load_policy().gpu_name is None and db.count() == 1
        db.save_policy(_small_policy(H200))           # stored beside the old one: it stays the unknown GPU's
        assert db.policy_for(H200).gpu_name == H200
        assert _same(db.policy_for(H100), pol) and _same(db.load_policy(), pol)
    with TuningDB(path) as db:                        # reopening is a no-op
        assert _schema_version(path) == str(SCHEMA_VERSION)
        assert [(p.name, p.gpu_name) for p in db.policies()] == [(H200, H200), ("default", None)]


def test_export_and_import_carry_the_policys_gpu(tmp_path):
    a = TuningDB(tmp_path / "a.sqlite")
    _record(a, H200, P2, [40.0, 45.0])
    a.save_policy(_small_policy(H100))
    a.export(tmp_path / "x.json.gz")
    with gzip.open(tmp_path / "x.json.gz", "rt") as f:
        data = json.load(f)
    assert data["schema_version"] == SCHEMA_VERSION and data["policies"][0]["gpu_name"] == H100
    b = TuningDB(tmp_path / "b.sqlite")
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 2, "policies": 1, "profiles": 0}
    assert b.load_policy().gpu_name == H100


def test_an_export_of_an_older_gemmc_imports_with_an_unknown_gpu(tmp_path):
    pol = _small_policy()
    old = {"format": "gemmc-tuning", "schema_version": 3, "measurements": [],
           "policies": [{"name": "default", "blob": base64.b64encode(pol.to_bytes()).decode(),
                         "feature_spec": json.dumps(pol.feature_spec.to_dict()), "trained_shapes": 1,
                         "gemmc_version": "0.old", "created_at": 1000.0}]}
    with gzip.open(tmp_path / "old.json.gz", "wt") as f:
        json.dump(old, f)
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.import_(tmp_path / "old.json.gz") == {"measurements": 0, "policies": 1, "profiles": 0}
    assert db.load_policy().gpu_name is None
    old["policies"][0]["gpu_name"] = 7                  # damaged: refused, naming the policy
    with gzip.open(tmp_path / "bad.json.gz", "wt") as f:
        json.dump(old, f)
    with pytest.raises(TuningDBError, match="policy 0 has a gpu_name that is not a GPU's name"):
        TuningDB.read_export(tmp_path / "bad.json.gz")


# ---- one policy per GPU ------------------------------------------------------------------------------------

def test_each_gpus_policy_is_kept_when_another_gpu_trains(tmp_path):
    from gemmc.search.rl import train_policy_from_db
    db = TuningDB(tmp_path / "t.sqlite")
    _two_gpu_rows(db)
    h200 = train_policy_from_db(db, epochs=3, gpu_name=H200)
    h100 = train_policy_from_db(db, epochs=3, gpu_name=H100)
    assert not _same(h200, h100)
    assert [(p.name, p.gpu_name, p.trained_shapes) for p in db.policies()] == [(H100, H100, 2), (H200, H200, 2)]
    assert _same(db.policy_for(H200), h200) and db.policy_for(H200).gpu_name == H200
    assert _same(db.policy_for(H100), h100) and db.policy_for(H100).gpu_name == H100
    assert db.policy_for("NVIDIA GH200 480GB") is None          # no policy of its own, none of unknown GPU
    h100_saved = db.policy_stamp(H100)
    again = train_policy_from_db(db, epochs=5, gpu_name=H200)    # a retrain replaces the H200's policy only
    assert len(db.policies()) == 2 and db.policy_stamp(H100) == h100_saved
    assert _same(db.policy_for(H200), again) and not _same(again, h200)
    assert db.policy_stamp(H200) > h100_saved
    unknown = train_policy_from_db(db, epochs=2)                 # every GPU's rows: the unknown GPU's, beside
    assert [(p.name, p.gpu_name) for p in db.policies()] == [(H100, H100), (H200, H200), ("default", None)]
    assert _same(db.policy_for("NVIDIA GH200 480GB"), unknown) and _same(db.policy_for(H100), h100)


def test_with_no_target_the_default_policy_else_the_only_one_else_the_newest(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    assert db.policy_for(None) is None and db.policy_stamp() is None and db.load_policy() is None
    h100 = _small_policy(H100)
    db.save_policy(h100)
    assert _same(db.policy_for(None), h100) and _same(db.load_policy(), h100)       # the only one
    h200 = _small_policy(H200, flip=True)
    db.save_policy(h200)
    assert _same(db.policy_for(None), h200) and db.policy_stamp() == db.policy_stamp(H200)   # the newest
    unknown = _small_policy(None)
    db.save_policy(unknown)
    db.save_policy(_small_policy(H100, flip=True))     # newer than the unknown GPU's, yet "default" is preferred
    assert _same(db.policy_for(None), unknown) and db.policy_stamp() == db.policy_stamp("NVIDIA GH200 480GB")


def test_auto_uses_the_target_gpus_own_policy_else_the_unknown_gpus(tmp_path):
    path = tmp_path / "t.sqlite"
    h200, h100 = _small_policy(H200), _small_policy(H100, flip=True)
    cands = _cands(ASK)
    assert h200.best(ASK, cands) != h100.best(ASK, cands)
    with TuningDB(path) as db:
        db.record(ASK.with_dims(m=512), "sm_90a", Measurement(cands[3], 40.0, None, 50.0), H200)  # 4x in M
        db.save_policy(h200)
        db.save_policy(h100)
    for gpu, pol in ((H200, h200), (H100, h100)):
        d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=gpu)
        assert (d.source, d.schedule) == ("policy", pol.best(ASK, cands))
        assert d.detail == f"policy trained on 1 shapes of {gpu}"
    gh200 = "NVIDIA GH200 480GB"           # neither policy is its own, none is of unknown GPU, no row is its
    assert resolve_auto(ASK, "sm_90a", db=path, gpu_name=gh200).source == "heuristic"
    unknown = _small_policy(None, flip=True)
    unknown.trained_shapes = 7             # tells it apart in `detail`
    with TuningDB(path) as db:
        db.save_policy(unknown)
    d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=gh200)
    assert (d.source, d.schedule, d.detail) == ("policy", unknown.best(ASK, cands), "policy trained on 7 shapes")
    assert resolve_auto(ASK, "sm_90a", db=path, gpu_name=H200).detail == f"policy trained on 1 shapes of {H200}"
    assert resolve_auto(ASK, "sm_90a", db=path).detail == "policy trained on 7 shapes"   # no target: "default"
    retrained = _small_policy(H200, flip=True)     # the per-file cache follows the H200's own save time
    retrained.trained_shapes = 3
    with TuningDB(path) as db:
        db.save_policy(retrained)
    d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=H200)
    assert (d.schedule, d.detail) == (retrained.best(ASK, cands), f"policy trained on 3 shapes of {H200}")


class _InlineBuilder:
    """Builds nothing: every schedule compiles (no processes, no GPU)."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def build(self, spec, schedules, arch, on_result=None):
        from gemmc.search.builder import BuildResult
        out = [BuildResult(s, True, 0.1, None) for s in schedules]
        for r in out if on_result else ():
            on_result(r)
        return out


def _fake_gpu(monkeypatch, gpu):
    """`gemmc-search tune` on a fake `gpu`: compiles pass, every schedule measures 40 us against cuBLAS's 50."""
    import gemmc.search.builder as builder_mod
    import gemmc.search.runner as runner_mod
    monkeypatch.setattr(runner_mod.Runner, "gpu_name", staticmethod(lambda: gpu))
    monkeypatch.setattr(runner_mod.Runner, "measure",
                        lambda self, spec, s, arch, kspec=None: Measurement(s, 40.0, None, 50.0))
    monkeypatch.setattr(builder_mod, "Builder", _InlineBuilder)


def _tune_rl(path, shapes_file, capsys):
    """`gemmc-search tune --strategy rl --budget 1` of `shapes_file`: (exit status, stderr, the schedules it
    measured for P2, in order). rl's first proposal is its starting policy's best schedule."""
    from gemmc.search.cli import main
    with TuningDB(path) as db:
        before = {r["id"] for r in db.rows()}
    rc = main(["--db", str(path), "tune", "--shapes", str(shapes_file), "--strategy", "rl", "--budget", "1",
               "--confirm", "0", "--workers", "1"])
    err = capsys.readouterr().err
    with TuningDB(path, create=False) as db:
        new = [gemmc.Schedule.from_dict(json.loads(r["schedule"])) for r in db.rows() if r["id"] not in before]
    return rc, err, new


def test_tune_rl_starts_from_the_target_gpus_policy(tmp_path, capsys, monkeypatch):
    from gemmc.search.rl import train_policy_from_db
    path, shapes = tmp_path / "t.sqlite", tmp_path / "shapes.txt"
    shapes.write_text(f"{P2.m} {P2.n} {P2.k}\n")
    cands = _cands(P2)
    h200, h100 = _small_policy(H200), _small_policy(H100, flip=True)
    assert h200.best(P2, cands) != h100.best(P2, cands)
    with TuningDB(path) as db:
        db.save_policy(h200)
        db.save_policy(h100)                # the newest: `tune` on the H200 must not start from it
    for gpu, pol in ((H200, h200), (H100, h100)):
        _fake_gpu(monkeypatch, gpu)
        rc, err, measured = _tune_rl(path, shapes, capsys)
        assert rc == 0 and measured == [pol.best(P2, cands)], err
    gh200 = "NVIDIA GH200 480GB"
    _fake_gpu(monkeypatch, gh200)           # no policy of its own, none of unknown GPU, no rows: refused
    rc, err, measured = _tune_rl(path, shapes, capsys)
    assert rc == 1 and measured == [] and err.count("\n") == 1
    assert f"holds no policy for {gh200} or of unknown GPU (its policies are of {H100}, {H200}" in err
    unknown = _small_policy(None, flip=True)
    unknown.trained_shapes = 5
    with TuningDB(path) as db:
        db.save_policy(unknown)
        db.save_policy(_small_policy(H200, flip=True))      # newer still, and another GPU's
    rc, err, measured = _tune_rl(path, shapes, capsys)
    assert rc == 0 and measured == [unknown.best(P2, cands)], err
    h20 = "NVIDIA H20"                      # a policy of its own beats the unknown GPU's
    with TuningDB(path) as db:
        _record(db, h20, P1, [50.0, 45.0, 40.0])
        own = train_policy_from_db(db, epochs=3, gpu_name=h20)
    assert own.best(P2, cands) != unknown.best(P2, cands)
    _fake_gpu(monkeypatch, h20)
    rc, err, measured = _tune_rl(path, shapes, capsys)
    assert rc == 0 and measured == [own.best(P2, cands)], err


def test_tune_rl_trains_a_fresh_policy_on_the_target_gpus_rows_when_none_is_stored(tmp_path, capsys, monkeypatch):
    from gemmc.search.rl import train_policy_from_db
    path, shapes = tmp_path / "t.sqlite", tmp_path / "shapes.txt"
    shapes.write_text(f"{P2.m} {P2.n} {P2.k}\n")
    gh200 = "NVIDIA GH200 480GB"
    with TuningDB(path) as db:
        _two_gpu_rows(db)
        _record(db, gh200, P1, [40.0, 45.0, 50.0])
        _record(db, gh200, P3, [30.0, 20.0])
        db.save_policy(_small_policy(H200))
        fresh = train_policy_from_db(db, gpu_name=gh200, save=False)     # tune's defaults: 60 epochs, seed 0
    _fake_gpu(monkeypatch, gh200)
    rc, err, measured = _tune_rl(path, shapes, capsys)
    assert rc == 0 and measured == [fresh.best(P2, _cands(P2))], err
    assert f"no policy stored for {gh200}: starting from one trained now on the 2 problems measured on it" in err
    with TuningDB(path, create=False) as db:
        assert [p.gpu_name for p in db.policies()] == [H200]          # not stored


def test_export_and_import_keep_every_gpus_policy(tmp_path):
    b = TuningDB(tmp_path / "b.sqlite")
    b.save_policy(_small_policy(H100))          # an older H100 policy: the export's newer one replaces it
    a = TuningDB(tmp_path / "a.sqlite")
    _two_gpu_rows(a)
    h200, h100, unknown = _small_policy(H200), _small_policy(H100, flip=True), _small_policy(None)
    for pol in (h200, h100, unknown):
        a.save_policy(pol)
    assert a.export(tmp_path / "x.json.gz") == {"measurements": 14, "policies": 3, "profiles": 0}
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 14, "policies": 3, "profiles": 0}
    assert [(p.name, p.gpu_name) for p in b.policies()] == [(H100, H100), (H200, H200), ("default", None)]
    for gpu, pol in ((H200, h200), (H100, h100), ("NVIDIA GH200 480GB", unknown), (None, unknown)):
        assert _same(b.policy_for(gpu), pol)
        assert b.policy_stamp(gpu) == a.policy_stamp(gpu)
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 0, "policies": 0, "profiles": 0}    # idempotent
    c = TuningDB(tmp_path / "c.sqlite")         # a newer local policy is kept
    newer = _small_policy(H200, flip=True)
    c.save_policy(newer)
    assert c.import_(tmp_path / "x.json.gz")["policies"] == 2 and _same(c.policy_for(H200), newer)


def test_an_older_single_default_policy_db_works_unchanged(tmp_path):
    """A schema-3 file (one "default" policy, no GPU column) and an export of it: the policy serves any GPU,
    read-only and after the migration, and imports as the unknown GPU's policy."""
    path = tmp_path / "old.sqlite"
    pol = _small_policy()
    _schema_v3_file(path, pol)
    with TuningDB.open_existing(path) as ro:
        assert [(p.name, p.gpu_name, p.trained_shapes) for p in ro.policies()] == [("default", None, 1)]
        for gpu in (H200, H100, None):
            assert _same(ro.policy_for(gpu), pol) and ro.policy_stamp(gpu) == 1000.0
        ro.export(tmp_path / "old.json.gz")
    for gpu in (H200, None):
        d = resolve_auto(ASK, "sm_90a", db=path, gpu_name=gpu)
        assert (d.source, d.schedule) == ("policy", pol.best(ASK, _cands(ASK)))
    with TuningDB(path) as db:                  # migrated: the same single "default" policy
        assert [(p.name, p.gpu_name) for p in db.policies()] == [("default", None)]
        assert _same(db.policy_for(H100), pol) and _same(db.load_policy(), pol)
    fresh = TuningDB(tmp_path / "t.sqlite")
    assert fresh.import_(tmp_path / "old.json.gz") == {"measurements": 1, "policies": 1, "profiles": 0}
    assert [(p.name, p.gpu_name) for p in fresh.policies()] == [("default", None)]
    assert _same(fresh.policy_for(H200), pol)


def test_report_lists_each_policy_with_its_gpu(tmp_path, capsys):
    from gemmc.search.cli import main
    from gemmc.search.rl import train_policy_from_db
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _two_gpu_rows(db)
        train_policy_from_db(db, epochs=2, gpu_name=H200)
        train_policy_from_db(db, epochs=2, gpu_name=H100)
        train_policy_from_db(db, epochs=2)
    assert main(["--db", str(path), "report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("rl policies (schedule='auto' and `tune --strategy rl` use the target GPU's, else the unknown "
                     "GPU's):")
    v = gemmc.__version__
    assert lines[at + 1:] == [f"  {H100}: trained on 2 problems (gemmc {v})",
                              f"  {H200}: trained on 2 problems (gemmc {v})",
                              f"  unknown GPU: trained on 4 problems (gemmc {v})"]
    assert main(["--db", str(path), "report", "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)     # the JSON report is unchanged


# ---- gemmc.search exports the simulator --------------------------------------------------------------------

def _imported_from(source: str, module: str, level: int) -> set:
    return {a.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
            and node.module == module and node.level == level for a in node.names}


def test_gemmc_search_exports_the_simulator_functions_the_cli_and_the_example_use():
    import gemmc.search
    from gemmc.search import cli
    sim = sys.modules["gemmc.search.simulate"]
    used = _imported_from(inspect.getsource(cli.cmd_simulate), "simulate", 1)
    assert used == {"group_problems", "load_records", "simulate"}
    exported = {"simulate": "simulate_strategies"}     # the package keeps `simulate` for the submodule
    public = {exported.get(name, name) for name in used}
    for name in used:
        assert getattr(gemmc.search, exported.get(name, name)) is getattr(sim, name) and callable(getattr(sim, name))
    assert gemmc.search.simulate is sim
    example = (Path(__file__).resolve().parents[1] / "examples" / "search_simulate.py").read_text()
    assert _imported_from(example, "gemmc.search", 0) == public
    assert not _imported_from(example, "gemmc.search.simulate", 0)
    for name in public:                                 # the package docstring shows each
        assert f"{name}(" in gemmc.search.__doc__


# ---- fp8 and grouped rows ------------------------------------------------------------------------------

FP8 = gemmc.GemmSpec(128, 4096, 4096, dtype="f8e4m3", b_dtype="f8e5m2", scaling="row")
GROUPED = gemmc.GemmSpec(8 * 64, 1536, 4096, groups=8, group_layout="contiguous")


def test_fp8_rows_train_the_policy_as_fp8_problems_and_grouped_rows_are_left_out(tmp_path):
    from gemmc.choose.features import SHAPE_FEATURES, shape_features
    from gemmc.choose.tuning_db_schema import class_scaling
    from gemmc.search.rl import examples_from_db, policy_spec, train_policy_from_db
    db = TuningDB(tmp_path / "t.sqlite")
    _record(db, H200, P1, [40.0, 45.0, 50.0])
    _record(db, H200, FP8, [20.0, 25.0, 30.0])
    _record(db, H200, GROUPED, [30.0, 35.0])
    # the DB key's problem, rebuilt: the fp8 scaling and B's dtype come back from its epilogue class
    assert policy_spec(problem_fields(FP8, "sm_90a")) == FP8
    assert class_scaling(problem_fields(FP8, "sm_90a")["epilogue_class"]) == ("row", "f8e5m2")
    assert class_scaling(problem_fields(P1, "sm_90a")["epilogue_class"]) is None
    assert policy_spec(problem_fields(GROUPED, "sm_90a")) is None
    ex = examples_from_db(db, H200)
    assert sorted(e.spec.dtype.value for e in ex) == ["bf16", "f8e4m3"]
    fp8_row = dict(zip(SHAPE_FEATURES, shape_features(FP8)))
    assert (fp8_row["dtype_f8e4m3"], fp8_row["b_f8e5m2"], fp8_row["scaling_row"], fp8_row["scaling_block"]) == \
        (1.0, 1.0, 1.0, 0.0)
    assert train_policy_from_db(db, epochs=2, gpu_name=H200).trained_shapes == 2
    # auto asks the policy for an fp8 problem it has not seen
    ask = gemmc.GemmSpec(2048, 1024, 8192, dtype="f8e4m3", scaling="tensor")
    d = resolve_auto(ask, "sm_90a", db=db, gpu_name=H200, pretuned=False)
    assert d.source == "policy", d
