"""ncu on the CPU: the CSV reader on a synthetic sample in ncu's layouts, the split of a run into jobs and calls,
the profile of a call, the whole `profile()` plumbing against a stand-in ncu, the tuning DB's profiles table
(schema 5: record, read, export/import, older files), and the "no ncu on this host" errors of `gemmc profile`
and `gemmc-search tune --profile l2`."""
from __future__ import annotations

import json
import math
import os
import sqlite3
import stat
import sys
import textwrap

import pytest

from gemmc.bench import ncu
from gemmc.bench.ncu import (METRICS, TENSOR_METRICS, KernelRecord, ProfileError, ProfileJob, call_profile,
                             parse_ncu_csv, results_of, split_calls, split_markers)
from gemmc.choose.measurement import L2Profile, Measurement, ideal_dram_bytes
from gemmc.schedule import Schedule
from gemmc.spec import GemmSpec

SPEC = GemmSpec(m=128, n=4096, k=4096)
SCHED = Schedule((128, 128, 64), (2, 1))
GMMA = TENSOR_METRICS[0]
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def details_rows(idx: int, name: str, metrics: dict) -> list[str]:
    """ncu's details page: one row per (kernel, metric), values as ncu prints them (thousands separators)."""
    return [f'"{idx}","4242","python3.12","127.0.0.1","{name}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"' for metric, (unit, value) in metrics.items()]


def gemm_metrics(read_mb=33.6, write_mb=1.05, hit=61.5, sectors=2_000_000, ns=21_500, ghz=1.755, tensor=42.0):
    return {METRICS["l2_hit_pct"]: ("%", f"{hit}"), METRICS["l2_sectors"]: ("sector", f"{sectors:,}"),
            METRICS["dram_read"]: ("Mbyte", f"{read_mb}"), METRICS["dram_write"]: ("Kbyte", f"{write_mb * 1e3:,.1f}"),
            METRICS["sm_hz"]: ("cycle/nsecond", f"{ghz}"), METRICS["duration"]: ("usecond", f"{ns / 1e3}"),
            GMMA: ("%", f"{tensor}")}


SPIN = {METRICS["duration"]: ("nsecond", "1,216"), METRICS["dram_read"]: ("byte", "0")}
GEMM = "kernel_cutlass_kernel_gemmcbackendssm90kernelgemmSm90Gemm_object_at_0"


def sample_csv(jobs_calls_kernels: list[list[int]]) -> str:
    """A synthetic `ncu --csv` log in ncu's details layout: per job a spin_kernel marker, then per call its
    kernels (the last of a call with more than one is a reduce kernel), among ==PROF== lines."""
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", HEADER]
    idx = 0
    for calls in jobs_calls_kernels:
        lines += details_rows(idx, "at::cuda::spin_kernel(long)", SPIN)
        idx += 1
        for per_call in calls:
            for j in range(per_call):
                lines += details_rows(idx, GEMM if j == 0 else "splitk_reduce_kernel", gemm_metrics())
                idx += 1
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


# ---- reading the CSV ------------------------------------------------------------------------------------------

def test_the_details_page_reads_into_kernels_in_base_units():
    ks = parse_ncu_csv(sample_csv([[1, 1]]))
    assert [k.index for k in ks] == [0, 1, 2] and "spin_kernel" in ks[0].name and ks[1].name == GEMM
    m = ks[1].metrics
    assert m[METRICS["dram_read"]] == pytest.approx(33.6e6)
    assert m[METRICS["dram_write"]] == pytest.approx(1.05e6)            # "1,050.0" Kbyte
    assert m[METRICS["l2_sectors"]] == 2_000_000                         # "2,000,000"
    assert m[METRICS["sm_hz"]] == pytest.approx(1.755e9)
    assert m[METRICS["duration"]] == pytest.approx(21.5e-6)
    assert ks[0].metrics[METRICS["duration"]] == pytest.approx(1.216e-6)


def test_the_raw_page_reads_too():
    cols = [METRICS["dram_read"], METRICS["duration"], METRICS["l2_hit_pct"]]
    text = "\n".join(['"ID","Process ID","Kernel Name",' + ",".join(f'"{c}"' for c in cols),
                      '"","","",' + '"byte","nsecond","%"',
                      f'"0","1","{GEMM}","1,000,000","2,500","75.5"'])
    (k,) = parse_ncu_csv(text)
    assert k.metrics == {cols[0]: 1e6, cols[1]: pytest.approx(2.5e-6), cols[2]: 75.5}


def test_no_table_reads_as_no_kernels_and_an_unknown_unit_says_how_to_fix_it():
    assert parse_ncu_csv("==PROF== nothing profiled\n") == []
    with pytest.raises(ProfileError, match="--print-units base"):
        parse_ncu_csv(HEADER + "\n" + details_rows(0, GEMM, {METRICS["dram_read"]: ("furlong", "3")})[0])


def test_ncu_errors_are_read_with_a_hint_for_the_counter_permission():
    assert ncu.ncu_error("==PROF== ok\n") is None
    msg = ncu.ncu_error("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert "ERR_NVGPUCTRPERM" in msg and "NVreg_RestrictProfilingToAdminUsers" in msg


# ---- jobs, calls, a call's profile ---------------------------------------------------------------------------

def test_markers_split_jobs_and_calls_split_evenly():
    ks = parse_ncu_csv(sample_csv([[1, 1, 1], [2, 2, 2]]))
    groups = split_markers(ks)
    assert [len(g) for g in groups] == [3, 6]
    calls = split_calls(groups[1], 3, "job 2")
    assert [[k.name for k in c] for c in calls] == [[GEMM, "splitk_reduce_kernel"]] * 3
    with pytest.raises(ProfileError, match="5 kernels profiled for 3 calls"):
        split_calls(groups[1][:5], 3, "job 2")


def test_a_calls_profile_sums_bytes_and_weights_rates():
    a = KernelRecord(1, GEMM, {METRICS["l2_hit_pct"]: 50.0, METRICS["l2_sectors"]: 1000.0, METRICS["dram_read"]: 4e6,
                               METRICS["dram_write"]: 1e6, METRICS["sm_hz"]: 1.8e9, METRICS["duration"]: 30e-6,
                               GMMA: 60.0})
    b = KernelRecord(2, "reduce", {METRICS["l2_hit_pct"]: 100.0, METRICS["l2_sectors"]: 3000.0,
                                   METRICS["dram_read"]: 0.0, METRICS["dram_write"]: 2e6, METRICS["sm_hz"]: 1.5e9,
                                   METRICS["duration"]: 10e-6, GMMA: 0.0})
    p = call_profile([a, b], GMMA)
    assert p.l2_hit_rate == pytest.approx((500 + 3000) / 4000)          # over all sectors, not a mean of rates
    assert (p.dram_read_bytes, p.dram_write_bytes, p.kernels) == (4e6, 3e6, 2)
    assert p.duration_us == pytest.approx(40.0)
    assert p.sm_clock_mhz == pytest.approx((1800 * 30 + 1500 * 10) / 40)
    assert p.tensor_pipe_pct == pytest.approx(45.0)
    assert call_profile([a], None).tensor_pipe_pct is None


def test_results_follow_the_manifest_and_keep_each_jobs_error():
    jobs = [ProfileJob(SPEC, SCHED), ProfileJob(SPEC, SCHED.with_(cluster=(1, 1))), ProfileJob(SPEC, None)]
    ran = [{"marker": True, "ok": True}, {"marker": False, "error": "BuildError: no"}, {"marker": True, "ok": True}]
    res = results_of(jobs, ran, parse_ncu_csv(sample_csv([[1, 1, 1], [1, 1, 1]])), 3, GMMA)
    assert [r.error for r in res] == [None, "BuildError: no", None]
    assert res[0].profile.dram_read_bytes == pytest.approx(33.6e6) and res[2].job.side == "cublas"
    assert res[0].profile.l2_hit_rate == pytest.approx(0.615)
    with pytest.raises(ProfileError, match="1 job markers where the target launched 2"):
        results_of(jobs, ran, parse_ncu_csv(sample_csv([[1, 1, 1]])), 3, GMMA)
    short = results_of(jobs, ran[:1], parse_ncu_csv(sample_csv([[1, 1, 1]])), 3, GMMA)
    assert short[0].profile is not None and "stopped before it" in short[2].error


def test_dram_ratio_is_against_the_compulsory_bytes():
    assert ideal_dram_bytes(SPEC) == (128 * 4096 + 4096 * 4096) * 2 + 128 * 4096 * 2
    p = L2Profile(0.5, 2.0 * ideal_dram_bytes(SPEC), 0.0, 1700.0, 10.0)
    assert p.dram_ratio(SPEC) == pytest.approx(2.0)
    assert L2Profile.from_dict(p.to_dict()) == p
    assert ideal_dram_bytes(GemmSpec(m=16, n=4096, k=4096, gate="silu")) == \
        (16 * 4096 + 2 * 4096 * 4096) * 2 + 16 * 4096 * 2


# ---- the whole run, against a stand-in ncu ------------------------------------------------------------------------

FAKE_NCU = textwrap.dedent('''\
    #!{python}
    """A stand-in for ncu: writes the manifest the target would and a details-page log of its kernels."""
    import json, sys
    sys.path.insert(0, {tests!r})
    from test_l2_profile import sample_csv
    args = sys.argv[1:]
    metrics = args[args.index("--metrics") + 1]
    if {refuse!r} and {refuse!r} in metrics:
        print("==ERROR== Failed to find metric " + {refuse!r})
        sys.exit(1)
    log = args[args.index("--log-file") + 1]
    job_file, manifest = args[-2:]
    cfg = json.load(open(job_file))
    ran = [{{"marker": True, "ok": True}} for _ in cfg["jobs"]]
    json.dump(ran, open(manifest, "w"))
    open(log, "w").write(sample_csv([[1] * cfg["calls"] for _ in cfg["jobs"]]))
''')


def fake_ncu(tmp_path, refuse: str = "") -> str:
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU.format(python=sys.executable, tests=os.path.dirname(__file__), refuse=refuse))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_profile_runs_ncu_on_the_target_and_reads_back_every_job(tmp_path):
    jobs = [ProfileJob(SPEC, SCHED), ProfileJob(SPEC, None)]
    res = ncu.profile(jobs, calls=3, ncu=fake_ncu(tmp_path))
    assert [r.error for r in res] == [None, None]
    assert res[0].profile.tensor_pipe_pct == pytest.approx(42.0) and res[0].profile.sm_clock_mhz == pytest.approx(1755)


def test_an_ncu_without_the_wgmma_metric_is_asked_with_the_next_one(tmp_path):
    res = ncu.profile([ProfileJob(SPEC, SCHED)], calls=1, ncu=fake_ncu(tmp_path, refuse=GMMA))
    assert res[0].profile is not None       # the run fell back to the MMA pipe's metric


def test_the_command_asks_for_the_metrics_at_the_gpus_own_clock():
    cmd = ncu.ncu_command("ncu", ["python", "-m", "x"], "/tmp/log", GMMA)
    assert cmd[:1] == ["ncu"] and cmd[-3:] == ["python", "-m", "x"]
    for flag in ("--csv", "--clock-control none", "--cache-control all", "--profile-from-start off",
                 "--print-units base", "--log-file /tmp/log"):
        assert flag in " ".join(cmd)
    assert set(cmd[cmd.index("--metrics") + 1].split(",")) == {*METRICS.values(), GMMA}


# ---- no ncu on this host ------------------------------------------------------------------------------------------

@pytest.fixture
def no_ncu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))          # nothing on it
    monkeypatch.delenv("GEMMC_NCU", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(ncu, "Path", _NoToolkitPath)


class _NoToolkitPath(type(ncu.Path())):
    """pathlib.Path, but /usr/local/cuda/bin/ncu does not exist (this test must not depend on the host)."""
    def is_file(self):
        return False if str(self).endswith("bin/ncu") else super().is_file()


def test_find_ncu_says_what_to_do_when_there_is_none(no_ncu):
    with pytest.raises(ProfileError, match="ncu \\(Nsight Compute\\) is not on this host.*GEMMC_NCU"):
        ncu.find_ncu()
    with pytest.raises(ProfileError, match="'/nowhere/ncu' \\(from GEMMC_NCU\\) is not an executable"):
        os.environ["GEMMC_NCU"] = "/nowhere/ncu"
        try:
            ncu.find_ncu()
        finally:
            del os.environ["GEMMC_NCU"]


def test_gemmc_profile_without_ncu_is_one_line_and_builds_nothing(no_ncu, capsys, monkeypatch):
    from gemmc import cli
    import gemmc.bench.ncu as module
    monkeypatch.setattr(module, "profile", lambda *a, **k: pytest.fail("profiled without ncu"))
    rc = cli.main(["profile", "--m", "128", "--n", "4096", "--k", "4096", "--cublas"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("gemmc profile: error: ncu (Nsight Compute) is not on this host")
    assert len(err.strip().splitlines()) == 1


def test_gemmc_profile_needs_a_concrete_plain_problem(capsys):
    from gemmc import cli
    assert cli.main(["profile", "--m", "M", "--n", "4096", "--k", "4096"]) == 1
    assert "give numbers for --m, --n and --k" in capsys.readouterr().err
    assert cli.main(["profile", "--m", "16", "--n", "4096", "--k", "4096", "--b-layout", "kn"]) == 1
    assert "plain GEMMs" in capsys.readouterr().err


def test_tune_profile_l2_without_ncu_is_one_line(no_ncu, tmp_path, capsys, monkeypatch):
    from gemmc.search import cli as search_cli
    from gemmc.search.runner import Runner
    monkeypatch.setattr(Runner, "gpu_name", staticmethod(lambda: "NVIDIA H200"))
    db = tmp_path / "t.sqlite"
    rc = search_cli.main(["--db", str(db), "tune", "--suite", "llm", "--sample", "1", "--profile", "l2"])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("gemmc-search tune: error: ncu (Nsight Compute) is not on this host")
    assert len(err.strip().splitlines()) == 1 and not db.exists()      # nothing created before the check


def test_gemmc_profile_prints_and_records_what_ncu_measured(tmp_path, capsys, monkeypatch):
    from gemmc import cli
    from gemmc.search.db import TuningDB
    monkeypatch.setattr(ncu, "profile", lambda jobs, **kw: results_of(
        jobs, [{"marker": True, "ok": True}] * len(jobs), parse_ncu_csv(sample_csv([[1] * 3] * len(jobs))), 3, GMMA))
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "NVIDIA H200")
    db = tmp_path / "t.sqlite"
    rc = cli.main(["profile", "--m", "128", "--n", "4096", "--k", "4096", "--tile", "128x128x64", "--cluster", "2x1",
                   "--ncu", fake_ncu(tmp_path), "--cublas", "--record", "--db", str(db)])
    out = capsys.readouterr().out
    assert rc == 0 and "gemmc     61.5%       33.60        1.05" in out and "torch.matmul" in out
    with TuningDB(db, create=False) as r:
        profs = r.profiles_of(SPEC, "sm_90a", "NVIDIA H200")
    (ours,) = [s for s in profs if s is not None]
    assert None in profs and len(profs) == 2 and (ours.tile, ours.cluster) == ((128, 128, 64), (2, 1))
    assert all(p.dram_read_bytes == pytest.approx(33.6e6) for p in profs.values())


# ---- the tuning DB's profiles table ------------------------------------------------------------------------------

PROFILE = L2Profile(0.62, 34e6, 1e6, 1750.0, 22.0, 41.0, 1)


def test_profiles_are_stored_read_exported_and_imported(tmp_path):
    from gemmc.search.db import TuningDB
    a = TuningDB(tmp_path / "a.sqlite")
    a.record(SPEC, "sm_90a", Measurement(SCHED, 20.0, None, 22.0), "NVIDIA H200", "bayes")
    a.record_profile(SPEC, "sm_90a", "NVIDIA H200", SCHED, PROFILE, tool=ncu.TOOL, created_at=1.0)
    newer = L2Profile(0.70, 30e6, 1e6, 1760.0, 21.0, 40.0, 1)
    a.record_profile(SPEC, "sm_90a", "NVIDIA H200", SCHED, newer, tool=ncu.TOOL, created_at=2.0)
    a.record_profile(SPEC, "sm_90a", "NVIDIA H200", None, PROFILE, tool=ncu.TOOL, created_at=1.0)
    assert a.profiles_of(SPEC, "sm_90a", "NVIDIA H200") == {SCHED: newer, None: PROFILE}     # the newest
    assert a.profiles_of(SPEC, "sm_90a", "NVIDIA H100") == {}
    assert a.export(tmp_path / "x.json.gz") == {"measurements": 1, "policies": 0, "profiles": 3}
    b = TuningDB(tmp_path / "b.sqlite")
    assert b.import_(tmp_path / "x.json.gz") == {"measurements": 1, "policies": 0, "profiles": 3}
    assert b.import_(tmp_path / "x.json.gz")["profiles"] == 0          # idempotent
    assert b.profiles_of(SPEC, "sm_90a") == {SCHED: newer, None: PROFILE}


def test_a_schema_4_file_gets_the_profiles_table_and_reads_without_it(tmp_path):
    from gemmc.choose.tuning_db import TuningDBReader
    from gemmc.search.db import TuningDB
    path = tmp_path / "old.sqlite"
    db = TuningDB(path)
    db.record(SPEC, "sm_90a", Measurement(SCHED, 20.0, None, 22.0), "NVIDIA H200", "bayes")
    db.close()
    with sqlite3.connect(path) as conn:          # as a schema-4 gemmc left it
        conn.execute("DROP TABLE profiles")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    with TuningDBReader(path) as r:              # read-only: no table, no profiles, no error
        assert not r.has_profiles() and r.profiles_of(SPEC, "sm_90a") == {} and r.profile_rows() == []
    with TuningDB(path) as w:                    # opened for writing: migrated
        assert w.has_profiles() and w.count() == 1
        w.record_profile(SPEC, "sm_90a", "NVIDIA H200", SCHED, PROFILE, tool=ncu.TOOL)
        assert w.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "5"


def test_report_shows_the_best_schedules_profile(tmp_path, capsys):
    from gemmc.search import cli as search_cli
    from gemmc.search.db import TuningDB
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.record(SPEC, "sm_90a", Measurement(SCHED, 20.0, None, 22.0), "NVIDIA H200", "bayes")
        db.record(SPEC, "sm_90a", Measurement(SCHED.with_(cluster=(1, 1)), 25.0, None, 22.0), "NVIDIA H200", "bayes")
        assert search_cli.main(["--db", str(path), "report"]) == 0
        assert "L2 hit" not in capsys.readouterr().out                  # no profile: the table as before
        db.record_profile(SPEC, "sm_90a", "NVIDIA H200", SCHED, PROFILE, tool=ncu.TOOL)
        db.record_profile(SPEC, "sm_90a", "NVIDIA H200", None, PROFILE, tool=ncu.TOOL)
    assert search_cli.main(["--db", str(path), "report"]) == 0
    out = capsys.readouterr().out
    ratio = PROFILE.dram_ratio(SPEC)
    assert "L2 hit DRAM/id SM MHz tens%" in out and f" 62.0% {ratio:7.2f}   1750    41  {SCHED.short()}" in out
    assert search_cli.main(["--db", str(path), "report", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["profile"]["l2_hit_rate"] == 0.62 and row["profile"]["dram_ratio"] == pytest.approx(ratio)
    assert row["cublas_profile"]["sm_clock_mhz"] == 1750.0
    assert math.isclose(row["time_us"], 20.0)
