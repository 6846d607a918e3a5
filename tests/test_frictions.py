"""The rough edges a new user hit (issue 32's "Frictions" list), one group of tests per friction.

Each test names the friction it holds fixed; the heavier ones (a real simulate run, the whole suite's
collection) are marked slow and stay out of the quick subset (`scripts/dev test -m quick`).
"""
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import gemmc
from gemmc import cli
from gemmc.compiler import CublasOnlyGemm
from gemmc.errors import GemmcError, ScheduleError, SpecError
import gemmc.schedule as schedule_rules
from gemmc.schedule import Schedule, check_schedule
from gemmc.spec import EpilogueOp, GemmSpec, Ref

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
INT32_MAX, GRID_YZ_MAX = 2 ** 31 - 1, 65535     # what CUDA and the kernels' 32-bit integers allow


def gemmc_cmd(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- a tuning DB on a read-only filesystem is read (auto, gemmc-search report) ----------------------------

def _tuned_db(path: Path) -> tuple[GemmSpec, Schedule]:
    """A closed tuning DB (WAL mode, as tune leaves it) whose one problem has a measured best."""
    from gemmc.search.db import TuningDB
    from gemmc.search.strategy import Measurement, SearchProblem
    spec = GemmSpec(256, 4096, 4096)
    best = SearchProblem.of(spec).candidates[7]
    with TuningDB(path) as db:
        db.record(spec, "sm_90a", Measurement(best, 40.0, None, 45.0), "NVIDIA H200")
    return spec, best


def _read_only_mount(folder: Path, then: str) -> list[str]:
    """The command that runs `then` (shell) where `folder` is bind-mounted read-only over itself."""
    q = shlex.quote(str(folder))
    return ["unshare", "-rm", "sh", "-c", f"mount --bind {q} {q} && mount -o remount,bind,ro {q} && {then}"]


def _read_only_mount_works() -> bool:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        try:
            return subprocess.run(_read_only_mount(Path(d), "true"), capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


# The reader runs in a mount namespace of its own (`unshare -rm`) where the DB's folder is bind-mounted
# read-only: writes fail with EROFS whoever asks, root included, as on a read-only volume. chmod would not do
# (the tests run as root, which ignores permission bits).
READ_ONLY_READER = r'''
import os, sys, warnings
warnings.simplefilter("error")          # a DB skipped with a warning fails the check
import gemmc
from gemmc.choose.auto import resolve_auto
from gemmc.search.cli import main
cache = sys.argv[1]
db = os.path.join(cache, "tuning.sqlite")
try:
    open(os.path.join(cache, "probe"), "w")
    sys.exit("the folder is writable: the read-only mount did not take")
except OSError:
    pass
d = resolve_auto(gemmc.GemmSpec(256, 4096, 4096), "sm_90a", db=db)
print("auto:", d.source, d.schedule.short())
k = gemmc.compile(gemmc.GemmSpec(256, 4096, 4096), cache_dir=cache, emit="ir")
print("compile:", k.decision.source, k.schedule.short())
sys.exit(main(["--db", db, "report"]))
'''


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("unshare") or not _read_only_mount_works(),
                    reason="needs `unshare -rm` (user and mount namespaces) for a read-only bind mount")
def test_read_only_db_on_a_read_only_filesystem_is_read_by_auto_and_report(tmp_path):
    cache = tmp_path / "ci-cache"
    spec, best = _tuned_db(cache / "tuning.sqlite")
    assert sorted(os.listdir(cache)) == ["tuning.sqlite"]      # closed cleanly: no -wal or -shm left
    script = tmp_path / "reader.py"
    script.write_text(READ_ONLY_READER)
    env = {**os.environ, "GEMMC_PRETUNED": "0"}
    env.pop("GEMMC_TUNING_DB", None)
    env.pop("GEMMC_GPU", None)
    reader = f"exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(cache))}"
    out = subprocess.run(_read_only_mount(cache, reader), capture_output=True, text=True, env=env,
                         cwd=str(TESTS), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"auto: db {best.short()}" in out.stdout
    assert f"compile: db {best.short()}" in out.stdout
    assert "cannot be read" not in out.stdout + out.stderr
    assert "256x4096x4096" in out.stdout                        # report lists the tuned problem


def test_read_only_db_that_this_process_may_not_write_is_read_by_auto_and_report(tmp_path, monkeypatch, capsys):
    """The portable half of the test above (no namespaces needed): where os.access says the DB and its folder
    cannot be written, as on a read-only mount or in another account's cache, auto and report read it
    through a connection that refuses writes, with no warning."""
    import sqlite3
    from gemmc.choose.auto import resolve_auto
    from gemmc.search.cli import main
    from gemmc.search.db import TuningDB
    folder = tmp_path / "ci"
    spec, best = _tuned_db(folder / "tuning.sqlite")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if (mode & os.W_OK) and
                        Path(p).resolve().is_relative_to(folder.resolve()) else real_access(p, mode, **kw))
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)
    with TuningDB(folder / "tuning.sqlite", create=False) as db:
        assert db.best(spec, "sm_90a").schedule == best
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.conn.execute("DELETE FROM measurements")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_auto(spec, "sm_90a", db=folder / "tuning.sqlite").schedule == best
    assert main(["--db", str(folder / "tuning.sqlite"), "report"]) == 0
    assert "256x4096x4096" in capsys.readouterr().out


# ---- gemmc opt: any file name, `-` for stdin, -o under a file ----------------------------------------------

@pytest.fixture(scope="module")
def gemm_ir_text():
    k = gemmc.compile(GemmSpec(4096, 4096, 4096), schedule=Schedule(), emit="ir")
    return k.ir()


def test_opt_reads_a_file_whatever_its_name_ends_with(gemm_ir_text, tmp_path, capsys):
    f = tmp_path / "gemm.txt"
    f.write_text(gemm_ir_text)
    rc, out, err = gemmc_cmd(capsys, "opt", str(f), "-p", "assign-warpgroup-roles")
    assert rc == 0, err
    assert "kernel.mma wgmma" in out and "Traceback" not in err


def test_opt_reads_stdin_from_dash(gemm_ir_text, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gemm_ir_text.encode())))
    rc, out, err = gemmc_cmd(capsys, "opt", "-", "-p", "assign-warpgroup-roles")
    assert rc == 0, err
    assert "kernel.mma wgmma" in out


def test_opt_output_under_a_file_says_what_is_wrong_with_it(gemm_ir_text, tmp_path, capsys):
    f = tmp_path / "gemm.mlir"
    f.write_text(gemm_ir_text)
    rc, _, err = gemmc_cmd(capsys, "opt", str(f), "-o", str(f / "out.mlir"))
    assert rc == 1
    assert err.strip() == f"gemmc opt: error: -o {f / 'out.mlir'}: {f} is a file, not a folder; choose another path"
    rc, _, err = gemmc_cmd(capsys, "opt", str(f), "-o", str(tmp_path))
    assert rc == 1 and "is a folder; name the file to write" in err
    rc, _, err = gemmc_cmd(capsys, "opt", str(tmp_path / "missing.txt"))
    assert rc == 1 and "Traceback" not in err
    assert err.startswith(f"gemmc opt: error: cannot open {tmp_path / 'missing.txt'}: No such file or directory")
    out = tmp_path / "new" / "out.mlir"                     # a missing folder below a writable one is made
    rc, _, err = gemmc_cmd(capsys, "opt", str(f), "-p", "assign-warpgroup-roles", "-o", str(out))
    assert rc == 0, err
    assert "kernel.mma wgmma" in out.read_text()


# ---- launch grids and Int32 sizes past their limits are refused before compiling ---------------------------

def _limits_named(violations):
    return {v.limit for v in violations}


def test_the_issues_split_k_schedule_is_refused_for_its_reduce_grid():
    spec = GemmSpec(1048576, 1048576, 1048576)
    s = Schedule(tile=(128, 256, 64), cluster=(2, 1), swizzle=8, split_k=16)
    (v,) = [v for v in check_schedule(s, spec) if "grid" in v.limit]
    # the reduce kernel's grid x: one block per output row and 128 columns, 2^20 * 2^13 = 2^33
    assert v.limit == "split-K reduce grid x" and str(2 ** 33) in str(v.value)
    assert str(INT32_MAX) in v.fix and "split_k" in v.fix
    assert not any("grid" in v.limit for v in check_schedule(s.with_(split_k=2), spec))   # the fix-up: no grid


def test_gemmc_build_refuses_it_before_compiling(capsys, tmp_path, count_compiles):
    rc, out, err = gemmc_cmd(capsys, "build", "--m", "1048576", "--n", "1048576", "--k", "1048576",
                             "--schedule", "heuristic", "--split-k", "16", "--cache-dir", str(tmp_path / "c"))
    assert rc == 1 and count_compiles == []
    assert "split-K reduce grid x" in err and str(INT32_MAX) in err
    assert not (tmp_path / "c" / "kernels").exists()


@pytest.mark.parametrize("spec, schedule, limit, value, most", [
    # the persistent scheduler's work-unit count is a 32-bit kernel argument
    (GemmSpec(2 ** 21, 2 ** 21, 64), Schedule(tile=(128, 16, 64)), "work units (32-bit)",
     (2 ** 21 // 128) * (2 ** 21 // 16), INT32_MAX),
    # sm_80: one CTA per output tile along grid x
    (GemmSpec(2 ** 22, 2 ** 22, 64), Schedule(tile=(64, 64, 32), arch="sm_80"), "launch grid x",
     (2 ** 22 // 64) ** 2, INT32_MAX),
    # sm_80: the batch is grid z
    (GemmSpec(64, 64, 64, batch=70000), Schedule(tile=(64, 64, 32), arch="sm_80"), "launch grid z (batch)",
     70000, GRID_YZ_MAX),
    # serial split-K: the batch is the reduce kernel's grid y
    (GemmSpec(64, 64, 1024, batch=70000), Schedule(tile=(128, 64, 64), split_k=4), "split-K reduce grid y (batch)",
     70000, GRID_YZ_MAX),
    # the split-K partials are indexed with 32-bit integers
    (GemmSpec(32768, 32768, 8192), Schedule(tile=(128, 256, 64), split_k=4), "split-K scratch (32-bit index)",
     4 * 32768 * 32768, INT32_MAX),
])
def test_each_launch_limit_names_itself_the_value_and_a_fix(spec, schedule, limit, value, most):
    assert (schedule_rules.INT32_MAX, schedule_rules.GRID_YZ_MAX) == (INT32_MAX, GRID_YZ_MAX)
    got = {v.limit: v for v in check_schedule(schedule, spec)}
    assert limit in got, [str(v) for v in got.values()]
    assert str(value) in str(got[limit].value)
    assert f"at most {most}" in got[limit].fix


def test_a_static_dim_past_int32_is_refused():
    (v,) = [v for v in check_schedule(Schedule(), GemmSpec(64, 2 ** 31, 64)) if "32-bit" in v.limit]
    assert v.limit == "problem size N (32-bit)" and str(2 ** 31) in str(v.value)


def test_ordinary_and_symbolic_problems_are_untouched():
    from gemmc.choose.heuristic import choose_schedule
    for spec in (GemmSpec(16384, 16384, 16384), GemmSpec("M", 4096, 4096, batch="L"),
                 GemmSpec(4096, 4096, 4096, batch=8)):
        s = choose_schedule(spec, "sm_90a")
        assert not any("grid" in v.limit or "32-bit" in v.limit for v in check_schedule(s.with_(split_k=4), spec))


# ---- auto on an unaligned N with an output cast takes the torch.matmul fallback ----------------------------

def _cast_only(dtype):
    return (EpilogueOp("cast", (Ref.acc(),), (("dtype", dtype),)),)


def test_auto_on_an_unaligned_n_with_out_dtype_runs_torch_matmul(shipped_only):
    k = gemmc.compile(GemmSpec("M", 32001, 64, out_dtype="f32"), schedule="auto")
    assert isinstance(k, CublasOnlyGemm) and k.decision.use_cublas
    cpu = CublasOnlyGemm(k.spec, "sm_90a", k.why, device_type="cpu")
    a, b = torch.randn(5, 64).bfloat16(), torch.randn(32001, 64).bfloat16()
    y = cpu(a, b)
    assert y.dtype == torch.float32 and y.shape == (5, 32001)
    # accumulated in f32 and never rounded to bf16, as the kernel's f32 output would be
    assert torch.allclose(y, a.float() @ b.float().T, rtol=1e-5, atol=1e-4)
    out = torch.full((5, 32001), float("nan"))
    assert cpu(a, b, out=out) is out and torch.equal(out, y)


def test_auto_on_an_unaligned_n_with_a_cast_only_epilogue_runs_torch_matmul(shipped_only):
    spec = GemmSpec("M", 1001, 64, out_dtype="bf16", epilogue=_cast_only("f16"))
    k = gemmc.compile(spec, schedule="auto")
    assert isinstance(k, CublasOnlyGemm)
    cpu = CublasOnlyGemm(spec, "sm_90a", k.why, device_type="cpu")
    a, b = torch.randn(3, 64).bfloat16(), torch.randn(1001, 64).bfloat16()
    assert torch.equal(cpu(a, b), (a.float() @ b.float().T).half().bfloat16())


def test_a_kernel_function_casting_its_output_takes_the_fallback_too(shipped_only):
    @gemmc.kernel
    def head(x: gemmc.Tensor[("M", 64), gemmc.bf16], w: gemmc.Tensor[(1001, 64), gemmc.bf16]):
        return (x @ w.T).to(gemmc.f32)
    k = gemmc.compile(head)
    assert isinstance(k, CublasOnlyGemm) and k.spec.out_dtype == gemmc.f32


def test_an_epilogue_that_does_more_than_cast_still_refuses_it():
    spec = GemmSpec("M", 1001, 64, epilogue=(EpilogueOp("relu", (Ref.acc(),)),
                                             EpilogueOp("cast", (Ref.node(0),), (("dtype", "f16"),))))
    with pytest.raises(ScheduleError, match="pad it to a multiple of 8"):
        gemmc.compile(spec, schedule="auto")


@pytest.mark.gpu
def test_gpu_the_cast_fallback_matches_f32_accumulation():
    k = gemmc.compile(GemmSpec("M", 32001, 4096, out_dtype="f32"), schedule="auto")
    a = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(32001, 4096, device="cuda", dtype=torch.bfloat16)
    y = k(a, b)
    assert y.dtype == torch.float32
    ref = a.float() @ b.float().T
    assert ((y - ref).norm() / ref.norm()).item() < 1e-5        # no bf16 rounding of the product


# ---- the fallback object answers what examples read --------------------------------------------------------

def test_the_fallback_has_the_attributes_examples_read(shipped_only):
    k = gemmc.compile(GemmSpec("M", 32001, 4096), schedule="auto")
    assert k.passes == () and k.m_buckets is None and k.schedule is None
    assert k.spec.n == 32001 and k.arch == "sm_90a" and k.cache_dir is None
    assert k.for_m(16) == (k.decision, None) and k.build() is None and k.artifacts == {"all": None}
    assert k.prepare([1, 16]) == [(1, "torch.matmul"), (16, "torch.matmul")]
    for after in [None, *k.passes]:             # examples/main.py's loop: a gemmc error, not AttributeError
        with pytest.raises(SpecError, match="no IR"):
            k.ir(after=after)
    for what in ("source", "ptx", "plan"):
        with pytest.raises(SpecError, match="runs torch.matmul"):
            getattr(k, what)


# ---- --version, and ir(after=...) names -------------------------------------------------------------------

def test_gemmc_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"gemmc {gemmc.__version__}"


def test_gemmc_search_version(capsys):
    from gemmc.search.cli import main
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"gemmc-search {gemmc.__version__}"


def test_ir_after_input_is_the_input_ir_and_an_unknown_pass_is_a_spec_error():
    k = gemmc.compile(GemmSpec(4096, 4096, 4096), schedule=Schedule(), emit="ir")
    assert k.ir(after="input") == k.ir() == k.ir(None)
    assert "gemm.matmul" in k.ir("input")
    with pytest.raises(SpecError) as e:
        k.ir(after="pipeline_staging")
    assert isinstance(e.value, ValueError) and isinstance(e.value, GemmcError)    # old callers still catch it
    assert "'pipeline_staging'" in str(e.value) and "input, " + ", ".join(k.passes) in str(e.value)


# ---- compile(arch=...) that contradicts the Schedule's arch ------------------------------------------------

def test_an_arch_contradicting_the_schedules_is_refused():
    with pytest.raises(SpecError) as e:
        gemmc.compile(GemmSpec(4096, 4096, 4096), Schedule(arch="sm_90a"), arch="sm_80", emit="ir")
    msg = str(e.value)
    assert "arch='sm_80'" in msg and "sm_90a" in msg
    assert "Schedule(..., arch='sm_80')" in msg and "leave arch= out" in msg
    with pytest.raises(SpecError, match="arch='sm_90a'"):
        gemmc.compile(GemmSpec(4096, 4096, 4096), Schedule(tile=(128, 128, 32), arch="sm_80"), arch="sm_90a")


def test_an_arch_that_agrees_or_is_left_out_is_fine():
    k = gemmc.compile(GemmSpec(4096, 4096, 4096), Schedule(tile=(128, 128, 32), arch="sm_80"), emit="ir")
    assert k.arch == "sm_80"
    k = gemmc.compile(GemmSpec(4096, 4096, 4096), Schedule(tile=(128, 128, 32), arch="sm_80"), arch="sm80",
                      emit="ir")
    assert k.arch == "sm_80"
    assert gemmc.compile(GemmSpec(4096, 4096, 4096), Schedule(), arch="sm_90a", emit="ir").arch == "sm_90a"
    assert gemmc.compile(GemmSpec(4096, 4096, 4096), Schedule().to_dict(), emit="ir").arch == "sm_90a"


# ---- a damaged cache entry is rebuilt with one warning naming it --------------------------------------------

def _fake_builder(staging: Path) -> dict:
    (staging / "kernel.so").write_bytes(b"\x7fELF fake shared object")
    (staging / "kernel.ptx").write_text("// ptx")
    return {"function": "f"}


def _rebuild_warnings(record):
    return [str(w.message) for w in record if "rebuilding it" in str(w.message)]


@pytest.mark.parametrize("damage", ["so", "manifest", "ptx"])
def test_a_damaged_cache_entry_is_rebuilt_with_one_warning_naming_it(tmp_path, damage):
    from gemmc.cache import KernelCache
    key = "ab" * 32
    entry = KernelCache(tmp_path).get_or_build(key, _fake_builder)
    d = Path(entry.directory)
    if damage == "so":
        (d / "kernel.so").write_bytes(b"truncated")
    elif damage == "manifest":
        (d / "manifest.json").write_text("{not json")
    else:
        (d / "kernel.ptx").write_text("// edited")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        art = KernelCache(tmp_path).get_or_build(key, _fake_builder)       # a fresh process's view
        KernelCache(tmp_path).get_or_build(key, _fake_builder)             # sound again: no second warning
    (msg,) = _rebuild_warnings(rec)
    assert str(d) in msg
    why = {"so": "kernel.so fails its sha256", "manifest": "manifest.json is damaged",
           "ptx": "kernel.ptx fails its sha256"}[damage]
    assert why in msg
    assert (Path(art.directory) / "kernel.so").read_bytes().startswith(b"\x7fELF")


def test_a_missing_entry_is_built_without_a_warning(tmp_path):
    from gemmc.cache import KernelCache
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        KernelCache(tmp_path).get_or_build("cd" * 32, _fake_builder)
    assert _rebuild_warnings(rec) == []


def test_a_so_damaged_at_load_is_rebuilt_with_a_warning(tmp_path, monkeypatch):
    """The .so passed its lookup but fails to load (runtime.DamagedKernelError): the one rebuild says so."""
    import gemmc.build as gb
    import gemmc.runtime as rt
    from gemmc.cache import KernelCache
    from gemmc.compiled import CompiledKernel
    from toy_kernel import toy_emitted
    cache = KernelCache(tmp_path)
    builds = []

    def fake_build(emitted, cache_, material=None):
        builds.append(1)
        return cache_.get_or_build("ef" * 32, _fake_builder)
    monkeypatch.setattr(gb, "build", fake_build)
    monkeypatch.setattr(gb, "compiler_available", lambda: True)
    monkeypatch.setattr(rt, "load_function", lambda *a: "loaded")
    ck = CompiledKernel(toy_emitted(tag="damaged-at-load-warning"), cache=cache)
    entry = ck.build().directory
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert ck._rebuild_after_load_error(rt.DamagedKernelError("not a whole shared object")) == "loaded"
    (msg,) = _rebuild_warnings(rec)
    assert entry in msg and "not a whole shared object" in msg and len(builds) == 2


# ---- gemmc-search simulate: progress per strategy and fold; the documented command is quick ----------------

@pytest.mark.slow
def test_simulate_shows_progress_per_strategy_and_fold():
    from gemmc.search.simulate import group_problems, simulate
    from gemmc.search.synthetic import synthetic_records, synthetic_shapes
    problems = group_problems(synthetic_records(synthetic_shapes(4, seed=1), seed=1))
    lines = []
    simulate(problems, ["random", "rl"], [4], seeds=2, rl_folds=2, rl_epochs=2, progress=lines.append)
    assert lines[0].startswith("random: 2 seeds over 4 problems")
    assert "random seed 1/2 done" in lines
    rl = [x for x in lines if x.startswith("rl")]
    assert rl[0].startswith("rl: 2 folds over 4 problems")
    for f in (1, 2):
        assert any(x.startswith(f"rl fold {f}/2: training on ") for x in rl)
        assert any(x.startswith(f"rl fold {f}/2 done") for x in rl)


@pytest.mark.slow
def test_simulate_reports_progress_within_a_long_run(monkeypatch):
    """A run of many problems says how far it is at least every PROGRESS_EVERY_S seconds."""
    import gemmc.search.simulate as sim
    from gemmc.search.synthetic import synthetic_records, synthetic_shapes
    problems = sim.group_problems(synthetic_records(synthetic_shapes(3, seed=2), seed=2))
    clock = iter(range(0, 10 ** 6, 100))
    monkeypatch.setattr(sim, "_now", lambda: next(clock))
    lines = []
    sim.simulate(problems, ["exhaustive"], [4], seeds=1, progress=lines.append)
    assert "exhaustive seed 1/1: 1/3 problems" in lines and "exhaustive seed 1/1: 2/3 problems" in lines


def test_simulate_quick_is_ten_shapes_two_seeds_and_three_budgets(monkeypatch, capsys):
    """The flags --quick stands for. The dataset is faked too (15 recorded problems): reading bench/data's
    48k records takes ~6 s a call, too long for the quick subset; the slow test below replays it for real."""
    import gemmc.search.simulate as sim
    from gemmc.search.cli import main
    seen, recorded = {}, [f"problem {i}" for i in range(15)]

    def fake(problems, strategies, budgets, seeds, **kw):
        seen.update(problems=len(problems), budgets=list(budgets), seeds=seeds)
        return {s: {str(b): {"median_fraction": 1.0, "score_vs_random": 1.0} for b in [1, *budgets]}
                for s in strategies}
    monkeypatch.setattr(sim, "simulate", fake)
    monkeypatch.setattr(sim, "load_records", lambda path: (seen.update(data=str(path)) or {}, ["a record"]))
    monkeypatch.setattr(sim, "group_problems", lambda records, header=None: list(recorded))
    assert main(["simulate", "--data", "bench/data", "--quick"]) == 0
    assert seen == {"data": "bench/data", "problems": 10, "budgets": [4, 8, 16], "seeds": 2}
    assert main(["simulate", "--data", "bench/data", "--quick", "--seeds", "3"]) == 0     # a flag given wins
    assert seen["seeds"] == 3 and seen["problems"] == 10
    assert main(["simulate", "--data", "bench/data", "--strategy", "random"]) == 0           # the full replay
    assert seen["seeds"] == 20 and seen["budgets"] == [4, 8, 16, 32] and seen["problems"] == 15


def _documented_simulate_commands():
    """Every `gemmc-search simulate ...` command line in README.md and docs/ (comments dropped)."""
    cmds = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            m = re.match(r"\s*(?:\$\s*)?gemmc-search simulate (.*)", line)     # a command line in a code block
            if m:
                cmds.append(shlex.split(m.group(1).split("#")[0]))
    return cmds


@pytest.mark.slow
def test_the_documented_simulate_commands_finish_within_a_minute_and_say_how_far_they_are(capsys, monkeypatch):
    from gemmc.search.cli import main
    cmds = _documented_simulate_commands()
    assert cmds, "README.md documents a gemmc-search simulate command"
    monkeypatch.chdir(REPO)
    for argv in cmds:
        t0 = time.process_time()        # CPU time: a machine shared with other work still gives the bound
        assert main(["simulate", *argv]) == 0, argv
        assert time.process_time() - t0 < 60, argv
        err = capsys.readouterr().err
        strategies = re.search(r"--strategy (\S+)", " ".join(argv))
        for name in (strategies.group(1).split(",") if strategies else ["exhaustive", "random", "bayes", "rl"]):
            assert re.search(rf"\] {name}: .* over \d+ problems", err), (name, err)
            assert re.search(rf"\] {name} (seed|fold) 1/\d+ done", err), (name, err)


# ---- a quick subset of the suite ---------------------------------------------------------------------------

@pytest.mark.slow
def test_the_quick_subset_covers_every_layer():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--strict-markers", "-m", "quick", str(TESTS)],
                         capture_output=True, text=True, cwd=str(REPO), timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ids = [x for x in out.stdout.splitlines() if "::" in x]
    per_module = {}
    for i in ids:
        per_module.setdefault(Path(i.split("::")[0]).name, []).append(i)
    from conftest import SLOW_MODULES, SLOW_TESTS
    assert not set(per_module) & set(SLOW_MODULES)
    for entry in sorted(SLOW_MODULES) + sorted(SLOW_TESTS):    # the lists name what exists (none went stale)
        module, _, test = entry.partition("::")
        assert (TESTS / module).exists(), entry
        assert not test or re.search(rf"^def {test}\(", (TESTS / module).read_text(), re.M), entry
    for layer in ("test_dsl.py", "test_ir.py", "test_passes.py", "test_schedule.py", "test_sm90_emit.py",
                  "test_sm80_emit.py", "test_call_checks.py", "test_input_validation.py", "test_search_dispatch.py",
                  "test_search_db.py", "test_heuristic.py", "test_cli.py"):
        assert len(per_module.get(layer, [])) >= 3, layer
    assert not any(m.startswith("test_gpu_") for m in per_module)       # GPU modules: every test marked gpu
    frictions = {i.split("::")[1] for i in per_module["test_frictions.py"]}
    assert "test_the_quick_subset_covers_every_layer" not in frictions      # marked slow
    assert "test_gemmc_version" in frictions
