"""The rl policy is GPU-aware: it trains on the target GPU's rows only, the DB records the GPU it was trained for
(schema 4: policies.gpu_name, NULL for an older file's policy), export/import carry it, and schedule="auto" passes
over a policy of another GPU. Also: gemmc.search exports the simulator's functions."""
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
from gemmc.dispatch import resolve_auto
from gemmc.search.db import SCHEMA_VERSION, TuningDB, TuningDBError, problem_fields, problem_key
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
    monkeypatch.setattr("gemmc.pretuned._visible_gpu", lambda: None)
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


def _small_policy(gpu=None):
    from gemmc.search.rl import ShapeExamples, train_policy
    c = _cands(P2)
    pol = train_policy([ShapeExamples(P2, c[:12], [0.01 * i for i in range(12)])], epochs=2)
    pol.gpu_name = gpu
    return pol


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
    monkeypatch.setattr(climod, "tune_shapes", lambda shapes, **kw: [])
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
    assert SCHEMA_VERSION == 4
    path = tmp_path / "old.sqlite"
    pol = _small_policy()
    _schema_v3_file(path, pol)
    cands = _cands(ASK)
    with TuningDB.open_existing(path) as ro:          # read-only (a lookup, report, export): nothing changes
        old = ro.load_policy()
        assert old.gpu_name is None and torch.equal(old.scores(ASK, cands), pol.scores(ASK, cands))
        assert ro.export(tmp_path / "old.json.gz") == {"measurements": 1, "policies": 1}
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
        db.save_policy(_small_policy(H200))
        assert db.load_policy().gpu_name == H200
    with TuningDB(path) as db:                        # reopening is a no-op
        assert db.load_policy().gpu_name == H200 and _schema_version(path) == str(SCHEMA_VERSION)


def test_export_and_import_carry_the_policys_gpu(tmp_path):
    a = TuningDB(tmp_path / "a.sqlite")
    _record(a, H200, P2, [40.0, 45.0])
    a.save_policy(_small_policy(H100))
    a.export(tmp_path / "x.json.gz")
    with gzip.open(tmp_path / "x.json.gz", "rt") as f:
        data = json.load(f)
    assert data["schema_version"] == SCHEMA_VERSION and data["policies"][0]["gpu_name"] == H100
    b = TuningDB(tmp_path / "b.sqlite")
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 2, "policies": 1}
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
    assert db.import_(tmp_path / "old.json.gz") == {"measurements": 0, "policies": 1}
    assert db.load_policy().gpu_name is None
    old["policies"][0]["gpu_name"] = 7                  # damaged: refused, naming the policy
    with gzip.open(tmp_path / "bad.json.gz", "wt") as f:
        json.dump(old, f)
    with pytest.raises(TuningDBError, match="policy 0 has a gpu_name that is not a GPU's name"):
        TuningDB.read_export(tmp_path / "bad.json.gz")


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
