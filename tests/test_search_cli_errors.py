"""`gemmc-search` errors: one line naming the file and the fix, a non-zero exit, no traceback; read-only
commands never create or change a DB; flags are checked before anything runs."""
import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import gemmc
from gemmc.search.cli import main
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem

REPO = Path(__file__).resolve().parents[1]
SPEC = gemmc.GemmSpec(128, 4096, 4096)


def _error(capsys, cmd: str) -> str:
    """The one error line a command printed (and that it printed nothing else to stderr)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gemmc-search {cmd}: error: "), err
    return lines[0]


def _usage_error(capsys, cmd: str) -> str:
    """argparse's: a usage block, then the one error line."""
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"gemmc-search {cmd}: error: argument "), last
    return last


def _tuned_db(path, gpus=("NVIDIA H200",), cublas=(28.0,)):
    cands = SearchProblem.of(SPEC).candidates
    with TuningDB(path) as db:
        for gpu, cub in zip(gpus, cublas):
            for i, t in enumerate([30.0, 25.0, 27.0]):
                db.record(SPEC, "sm_90a", Measurement(cands[i], t, None, cub), gpu, "bayes")
    return path


@pytest.fixture
def files(tmp_path):
    """Files that are not what a command expects, each the kind a user could pass by mistake."""
    f = {"plain": tmp_path / "plain.json", "list": tmp_path / "list.json.gz", "bare": tmp_path / "bare.json.gz",
         "corrupt": tmp_path / "corrupt.sqlite", "foreign": tmp_path / "foreign.sqlite",
         "zero": tmp_path / "zero.sqlite", "dataset": tmp_path / "ds.jsonl.gz"}
    f["plain"].write_text('{"format": "gemmc-tuning", "measurements": []}')
    with gzip.open(f["list"], "wt") as g:
        g.write("[1, 2]")
    with gzip.open(f["bare"], "wt") as g:
        g.write(json.dumps({"format": "gemmc-tuning"}))
    f["corrupt"].write_text("this is not a database\n" * 100)
    conn = sqlite3.connect(f["foreign"])
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    f["zero"].write_bytes(b"")
    assert main(["synth", str(f["dataset"]), "--shapes", "1", "--seed", "1"]) == 0
    return f


@pytest.mark.parametrize("kind, needle", [
    ("missing", "does not exist"),
    ("plain", "not gzipped"),
    ("list", "not a gemmc-search export"),
    ("bare", "lists of 'measurements'"),
    ("dataset", "simulate --data"),                 # a bench dataset: one JSON record per line
])
def test_import_of_a_wrong_file_is_one_line_naming_it(files, tmp_path, capsys, kind, needle):
    path = files[kind] if kind in files else tmp_path / "missing.json.gz"
    capsys.readouterr()
    db = tmp_path / "new.sqlite"
    assert main(["--db", str(db), "import", str(path)]) == 1
    line = _error(capsys, "import")
    assert str(path) in line and needle in line
    assert not db.exists()                          # the file is refused before the DB is made


@pytest.mark.parametrize("kind, needle", [
    ("corrupt", "cannot be read as a tuning DB"),
    ("foreign", "not a gemmc tuning DB: it has no measurements or policies table (its tables: users)"),
    ("zero", "it is empty"),
])
@pytest.mark.parametrize("cmd", ["report", "export", "train-policy"])
def test_read_commands_refuse_a_file_that_is_not_a_tuning_db_and_leave_it_alone(files, tmp_path, capsys,
                                                                                  kind, needle, cmd):
    path = files[kind]
    before = path.read_bytes()
    capsys.readouterr()
    extra = [str(tmp_path / "out.json.gz")] if cmd == "export" else []
    assert main(["--db", str(path), cmd, *extra]) == 1
    line = _error(capsys, cmd)
    assert str(path) in line and needle in line and "GEMMC_TUNING_DB" in line
    assert path.read_bytes() == before              # no tables added, no switch to WAL
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(path.name)) == [path.name]
    assert not (tmp_path / "out.json.gz").exists()


def test_tune_and_import_refuse_a_foreign_sqlite_file(files, tmp_path, capsys):
    export = tmp_path / "x.json.gz"
    assert main(["--db", str(_tuned_db(tmp_path / "t.sqlite")), "export", str(export)]) == 0
    before = files["foreign"].read_bytes()
    capsys.readouterr()
    assert main(["--db", str(files["foreign"]), "import", str(export)]) == 1
    assert "not a gemmc tuning DB" in _error(capsys, "import")
    assert files["foreign"].read_bytes() == before


@pytest.mark.parametrize("cmd", ["report", "export", "train-policy"])
def test_a_read_command_on_a_mistyped_db_creates_nothing(tmp_path, capsys, cmd):
    db = tmp_path / "typo" / "dir" / "x.sqlite"
    extra = [str(tmp_path / "out.json.gz")] if cmd == "export" else []
    assert main(["--db", str(db), cmd, *extra]) == 1
    line = _error(capsys, cmd)
    assert f"{db}: no tuning DB there" in line and "--db" in line
    assert not (tmp_path / "typo").exists() and not (tmp_path / "out.json.gz").exists()


def test_export_refuses_to_overwrite_its_own_db_and_an_impossible_destination(tmp_path, capsys, monkeypatch):
    db = _tuned_db(tmp_path / "victim.sqlite")
    before = db.read_bytes()
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    for dest in (str(db), "victim.sqlite", "./victim.sqlite"):
        assert main(["--db", str(db), "export", dest]) == 1
        assert "is the tuning DB being exported" in _error(capsys, "export")
    assert db.read_bytes() == before and TuningDB(db, create=False).count() == 3
    (tmp_path / "file").write_text("")
    assert main(["--db", str(db), "export", str(tmp_path / "file" / "x.json.gz")]) == 1
    assert "is a file, not a folder" in _error(capsys, "export")
    assert main(["--db", str(db), "export", str(tmp_path)]) == 1
    assert "is a folder" in _error(capsys, "export")
    # missing folders are made, as for every file a gemmc command writes (gemmc/output_file.py)
    assert main(["--db", str(db), "export", str(tmp_path / "new" / "x.json.gz")]) == 0
    assert TuningDB.read_export(tmp_path / "new" / "x.json.gz")["measurements"]


def test_report_leaves_a_tuning_db_as_it_was(tmp_path, capsys):
    db = _tuned_db(tmp_path / "t.sqlite")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=DELETE")      # e.g. a copy someone made: report must not switch it to WAL
    conn.close()
    before = db.read_bytes()
    assert main(["--db", str(db), "report"]) == 0
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.sqlite"]


def test_train_policy_on_a_db_with_too_little_data_says_what_to_do(tmp_path, capsys):
    db = tmp_path / "empty.sqlite"
    TuningDB(db).close()
    assert main(["--db", str(db), "train-policy"]) == 1
    line = _error(capsys, "train-policy")
    assert str(db) in line and "two or more measured schedules" in line and "gemmc-search tune" in line


def test_a_db_damaged_past_its_header_is_one_line(tmp_path, capsys, monkeypatch):
    db = _tuned_db(tmp_path / "t.sqlite")

    def malformed(self, arch=None):
        raise sqlite3.DatabaseError("database disk image is malformed")
    monkeypatch.setattr(TuningDB, "best_all", malformed)
    capsys.readouterr()
    assert main(["--db", str(db), "report"]) == 1
    line = _error(capsys, "report")
    assert str(db) in line and "malformed" in line and "integrity_check" in line


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        main(["--debug", "--db", str(tmp_path / "t.sqlite"), "import", str(tmp_path / "missing.json.gz")])


def test_the_console_command_prints_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gemmc.search", "--db", str(tmp_path / "t.sqlite"), "import",
                          str(tmp_path / "missing.json.gz")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("gemmc-search import: error: ") and "missing.json.gz" in out.stderr


# ---- tune: every flag is checked before the GPU is looked for ------------------------------------

@pytest.fixture
def no_gpu_lookup(monkeypatch):
    """Fails the test if tune gets as far as looking for a GPU."""
    import gemmc.search.runner as runner_mod

    def looked():
        raise AssertionError("tune looked for a GPU before checking its flags")
    monkeypatch.setattr(runner_mod.Runner, "gpu_name", staticmethod(looked))


@pytest.mark.parametrize("args, needle", [
    (["--suite", "nosuch"], "unknown suite 'nosuch'"),
    (["--shapes", "missing.txt"], "cannot read shapes file missing.txt"),
    (["--suite", "llm", "--dtype", "int8"], "--dtype int8: unknown dtype 'int8'"),
    (["--suite", "llm", "--dtype", "f32"], "--dtype f32"),
    (["--suite", "llm", "--arch", "sm_70"], "unknown arch 'sm_70'"),
    (["--shapes", "shapes.txt", "--sample", "2"], "--sample draws from a --suite"),
    (["--suite", "llm", "--settle-s", "2", "--sustained-s", "1"], "--settle-s and --sustained-s both given"),
    (["--suite", "moe", "--dtype", "fp8", "--scaling", "row"], "grouped fp8 GEMMs are built with block scales "
     "(per-tensor and per-row ones are not); use --scaling block"),
])
def test_tune_reports_a_bad_flag_before_looking_for_a_gpu(tmp_path, capsys, monkeypatch, no_gpu_lookup, args,
                                                          needle):
    (tmp_path / "shapes.txt").write_text("16 4096 4096\n")
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "t.sqlite"
    assert main(["--db", str(db), "tune", *args]) == 2
    assert needle in _error(capsys, "tune")
    assert not db.exists()


@pytest.mark.parametrize("args, needle", [
    (["--budget", "-3"], "argument --budget: '-3': use a whole number >= 0"),
    (["--sample", "0"], "argument --sample: '0': use a whole number >= 1"),
    (["--batch", "0"], "argument --batch: '0'"),
    (["--workers", "0"], "argument --workers: '0'"),
    (["--compile-timeout", "0"], "argument --compile-timeout: '0'"),
])
def test_tune_numbers_out_of_range_are_usage_errors(tmp_path, capsys, no_gpu_lookup, args, needle):
    with pytest.raises(SystemExit) as e:
        main(["--db", str(tmp_path / "t.sqlite"), "tune", "--suite", "llm", *args])
    assert e.value.code == 2 and needle in _usage_error(capsys, "tune")


def test_tune_without_a_gpu_is_one_line(tmp_path, capsys, monkeypatch):
    import gemmc.search.runner as runner_mod
    monkeypatch.setattr(runner_mod.Runner, "gpu_name", staticmethod(lambda: "cpu"))
    assert main(["--db", str(tmp_path / "t.sqlite"), "tune", "--suite", "llm", "--sample", "1"]) == 2
    assert "no GPU is visible" in _error(capsys, "tune")


# ---- simulate --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--seeds", "0"], "argument --seeds: '0': use a whole number >= 1"),
    (["--seeds", "-1"], "argument --seeds: '-1'"),
    (["--batch", "0"], "argument --batch: '0'"),
    (["--max-shapes", "-1"], "argument --max-shapes: '-1'"),
    (["--max-shapes", "0"], "argument --max-shapes: '0'"),
    (["--strategy", ""], "argument --strategy: '': name at least one strategy"),
    (["--strategy", "", "--json"], "argument --strategy: '': name at least one strategy"),
    (["--folds", "1"], "argument --folds: '1': use a whole number >= 2"),
])
def test_simulate_refuses_counts_that_measure_nothing(files, capsys, args, needle):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--data", str(files["dataset"]), *args])
    assert e.value.code == 2 and needle in _usage_error(capsys, "simulate")
    assert capsys.readouterr().out == ""           # no {} from --json


def test_simulate_leaves_rl_out_of_all_on_one_problem_with_a_note(files, capsys):
    capsys.readouterr()
    assert main(["simulate", "--data", str(files["dataset"]), "--budget", "2", "--seeds", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert "rl" not in res and {"random", "exhaustive", "bayes"} <= set(res)
    capsys.readouterr()
    assert main(["simulate", "--data", str(files["dataset"]), "--strategy", "random,rl", "--budget", "2",
                 "--seeds", "1"]) == 0
    assert "note: rl left out" in capsys.readouterr().err
    assert main(["simulate", "--data", str(files["dataset"]), "--strategy", "rl", "--budget", "2"]) == 1
    line = _error(capsys, "simulate")
    assert "rl needs at least two recorded problems" in line and "has 1" in line


def test_simulate_says_a_db_export_or_a_db_is_the_wrong_kind_of_file(files, tmp_path, capsys):
    export = tmp_path / "tuned.json.gz"
    assert main(["--db", str(_tuned_db(tmp_path / "t.sqlite")), "export", str(export)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--data", str(export)]) == 1
    line = _error(capsys, "simulate")
    assert "is a tuning-DB export" in line and f"gemmc-search import {export}" in line
    for kind in ("corrupt", "list"):
        assert main(["simulate", "--data", str(files[kind])]) == 1
        line = _error(capsys, "simulate")
        assert str(files[kind]) in line and "--data takes" in line


def test_simulate_help_shows_defaults_and_strategy_names(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exhaustive, random, bayes, rl (default all" in text
    assert "(default 4,8,16,32" in text and "(default 20" in text


# ---- report ----------------------------------------------------------------------------------

def test_report_has_a_gpu_column_and_a_geomean_per_gpu(tmp_path, capsys):
    db = _tuned_db(tmp_path / "t.sqlite", gpus=("NVIDIA H200", "NVIDIA H100 80GB HBM3"), cublas=(28.0, 20.0))
    capsys.readouterr()
    assert main(["--db", str(db), "report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(ln for ln in lines if "shape" in ln)
    assert "arch" in header and "gpu" in header
    rows = [ln for ln in lines if "128x4096x4096" in ln]
    assert len(rows) == 2 and any("NVIDIA H200" in r and "1.120" in r for r in rows)
    assert any("NVIDIA H100 80GB HBM3" in r and "0.800" in r for r in rows)
    assert all("sm_90a" in r for r in rows)
    means = [ln for ln in lines if ln.startswith("geomean")]
    assert means == ["geomean paired speedup over cuBLAS: 0.800x over 1 problems on NVIDIA H100 80GB HBM3; "
                     "with the cuBLAS fallback: 1.000x",
                     "geomean paired speedup over cuBLAS: 1.120x over 1 problems on NVIDIA H200; "
                     "with the cuBLAS fallback: 1.120x"]


def test_report_of_a_db_of_failures_says_they_all_failed(tmp_path, capsys):
    cands = SearchProblem.of(SPEC).candidates
    db = tmp_path / "t.sqlite"
    with TuningDB(db) as t:
        for i in range(3):
            t.record(SPEC, "sm_90a", Measurement(cands[i], None, "compile: ptxas ran out of registers"), "H200")
        t.record(SPEC, "sm_90a", Measurement(cands[3], None, "check: max error 3.1"), "H200")
    capsys.readouterr()
    assert main(["--db", str(db), "report"]) == 0
    out = capsys.readouterr().out
    assert "4 measurements, none successful" in out
    assert "most often, 3 of them: compile: ptxas ran out of registers" in out
