"""The bench harness's audit: CLI options checked before anything runs, the cold-L2 rotation of every suite
shape, the report paths, the re-spin after a long compile and the sweep dataset's best record. CPU only: the
GPU-side loop runs on fake kernels and a virtual clock, and the CLI's run with `run_bench` replaced."""
import json
from pathlib import Path

import pytest
import torch

from gemmc.bench import report, suites, timing
from gemmc.bench import dataset as ds
from gemmc.bench.cli import main as bench_main

from bench_fakes import FakeKernel, VirtualClock


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _error_of(argv, capsys) -> str:
    assert bench_main(argv) == 2
    return capsys.readouterr().err


# ---- options checked before anything is compiled or launched ---------------------------------------------

@pytest.mark.parametrize("flags, msg", [
    (["--limit", "0"], "--limit 0: must be >= 1"),
    (["--limit", "-3"], "--limit -3: must be >= 1"),
    (["--warmup", "-1"], "--warmup -1: must be >= 0"),
    (["--compile-workers", "0"], "--compile-workers 0: must be >= 1"),
    (["--min-unit-us", "0"], "--min-unit-us 0.0: must be > 0"),
    (["--l2-factor", "-2"], "--l2-factor -2.0: must be > 0"),
    (["--arch", "sm_99"], "unknown arch 'sm_99'"),
])
def test_numbers_that_would_run_nothing_or_something_else_are_refused(flags, msg, capsys):
    err = _error_of(["--suite", "square", *flags], capsys)
    assert msg in err and "no CUDA GPU" not in err


@pytest.mark.parametrize("flags, msg", [
    (["--plot", "p.png", "--no-plot"], "--plot p.png and --no-plot contradict each other"),
    (["--settle-s", "1", "--sustained-s", "2"], "--settle-s and --sustained-s both given"),
])
def test_contradictory_flags_are_refused(flags, msg, capsys):
    assert msg in _error_of(["--suite", "square", *flags], capsys)


def test_show_refuses_the_measuring_options_it_would_ignore(tmp_path, capsys):
    rep = report.make_report([], suite="square", policy="heuristic", dtype="bf16", arch="sm_90a",
                             cfg=timing.TimingConfig(), environment={"gpu": None})
    path = report.write_json(rep, tmp_path / "r.json")
    for flags, named in ((["--policy", "auto"], "--policy"), (["--out", "x.json"], "--out"),
                         (["--limit", "3", "--seed", "1"], "--seed, --limit")):
        err = _error_of(["--show", str(path), *flags], capsys)
        assert f"measures nothing: {named} would have no effect" in err
    assert bench_main(["--show", str(path), "--quiet"]) == 0
    assert "would overwrite the report it plots" in _error_of(["--show", str(path), "--plot", str(path)], capsys)
    assert report.load_json(path)["suite"] == "square"


def test_show_names_the_file_that_is_not_a_report(tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "text.json").write_text("M N K\n")
    assert "list.json: not a gemmc bench report (format 'list'" in _error_of(["--show", str(tmp_path / "list.json")],
                                                                              capsys)
    assert "text.json: not a gemmc bench report (not JSON" in _error_of(["--show", str(tmp_path / "text.json")], capsys)


def test_a_fixed_schedule_no_shape_can_run_is_refused_but_one_some_can_run_is_not(capsys):
    err = _error_of(["--suite", "square", "--policy", "128x128x64_sw3"], capsys)
    assert "is invalid on every shape (on 256x256x256: swizzle: got 3" in err
    # split-K 16 needs K >= 16 k-tiles: 256^3 and 512^3 cannot, the larger squares can
    err = _error_of(["--suite", "square", "--policy", "128x128x64_k16"], capsys)
    assert "invalid on every shape" not in err


def test_bad_out_paths_are_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert "is a folder" in _error_of(["--suite", "square", "--out", str(tmp_path)], capsys)
    err = _error_of(["--suite", "square", "--out", str(tmp_path / "file" / "r.json")], capsys)
    assert f"{tmp_path / 'file'} is a file, not a folder" in err
    # a .png report would be overwritten by its own default plot, and --plot the same path likewise
    assert "both be written to" in _error_of(["--suite", "square", "--out", str(tmp_path / "r.png")], capsys)
    err = _error_of(["--suite", "square", "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.json")],
                    capsys)
    assert "both be written to" in err


def test_a_missing_matplotlib_is_said_before_the_run(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    err = _error_of(["--suite", "square", "--out", str(tmp_path / "r.json")], capsys)
    assert "needs matplotlib" in err and "--no-plot" in err
    assert "no CUDA GPU" in _error_of(["--suite", "square", "--out", str(tmp_path / "r.json"), "--no-plot"], capsys)


def test_a_shapes_file_with_a_bom_loads_and_a_binary_one_is_named(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_bytes("M,N,K\r\n128,256,64\r\n".encode("utf-8-sig"))
    assert suites.load_shapes(csv) == [suites.Shape(128, 256, 64)]
    blob = tmp_path / "s.xlsx"
    blob.write_bytes(b"PK\x03\x04\xff\xfe\x00\x81")
    with pytest.raises(suites.ShapeFileError, match=r"s.xlsx is not text \(byte 4 is not UTF-8\)"):
        suites.load_shapes(blob)


# ---- cold L2 ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("l2_mib", [50, 60])    # H100, H200
@pytest.mark.parametrize("name", suites.SUITES)
def test_every_suite_shape_rotates_through_twice_the_l2(name, l2_mib):
    l2 = l2_mib * 1024 * 1024
    cfg = timing.TimingConfig()
    short = [str(s) for s in suites.get_suite(name)
             if timing.input_set_count(s, 2, l2, cfg.l2_factor, cfg.max_sets) * timing.set_bytes(s, 2) < 2 * l2]
    assert short == []


def _bench(shapes, l2_bytes, cfg=timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100), **kw):
    clock = VirtualClock()
    return timing.run_bench(shapes, "heuristic", cfg, device="cpu", compile_fn=lambda s: FakeKernel(clock, 10.0),
                            cublas=FakeKernel(clock, 12.0), clock=clock, l2_bytes=l2_bytes, progress=False, **kw)


def test_a_shape_too_small_to_reach_the_rotation_is_flagged_in_its_record_and_the_table():
    cfg = timing.TimingConfig(repeats=3, warmup=1, min_unit_us=100, max_sets=4)
    tiny, big = suites.Shape(8, 16, 32), suites.Shape(64, 32, 48)
    res = _bench([tiny, big], l2_bytes=8 * 1024, cfg=cfg)
    assert [r["status"] for r in res] == ["ok", "ok"]
    # tiny: 4 sets of (8*32 + 16*32 + 8*16) * 2 bytes = 7 KiB, under 2 x 8 KiB; big: 3 sets, 21 KiB
    assert res[0]["input_sets"] == 4 and res[0]["rotated_l2_factor"] == pytest.approx(4 * 1792 / 8192)
    assert res[0]["below_l2_factor"] is True
    assert res[1]["below_l2_factor"] is False and res[1]["rotated_l2_factor"] >= 2
    lines = report.format_table(res).splitlines()
    assert lines[2].endswith("[inputs 0.88x L2: partly warm]") and "L2" not in lines[3]


def test_the_gpu_is_spun_up_again_after_a_long_compile_in_the_loop(monkeypatch):
    spins = []
    shapes = [suites.Shape(64, 32, 48), suites.Shape(8, 16, 32)]
    monkeypatch.setattr(timing, "RESPIN_AFTER_COMPILE_S", 3600.0)
    _bench(shapes, 64 * 1024, spin=lambda: spins.append("spin"))
    assert spins == ["spin"]                      # before the first shape only: the compiles were quick
    spins.clear()
    monkeypatch.setattr(timing, "RESPIN_AFTER_COMPILE_S", -1.0)   # every compile counts as long
    _bench(shapes, 64 * 1024, spin=lambda: spins.append("spin"))
    assert spins == ["spin"] * 3


# ---- report paths and the end of a run ------------------------------------------------------------------

def test_a_default_report_path_never_overwrites_an_earlier_report(tmp_path):
    first = tmp_path / "2026-12-01-h200-llm.json"
    assert report.unused_path(first) == first
    first.write_text("{}")
    assert report.unused_path(first) == tmp_path / "2026-12-01-h200-llm-2.json"
    (tmp_path / "2026-12-01-h200-llm-2.png").write_bytes(b"")      # a plot alone still claims the name
    assert report.unused_path(first) == tmp_path / "2026-12-01-h200-llm-3.json"


def _fake_gpu_run(monkeypatch, results):
    """cli.run with a GPU that is not there: run_bench returns `results`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(timing, "run_bench", lambda shapes, *a, **kw: results)
    monkeypatch.setattr(report, "collect_environment", lambda: {"gpu": {"name": "NVIDIA H200"}, "date": "d"})
    monkeypatch.setattr(report, "nvidia_smi", lambda *a: None)


def _ok_record(shape: suites.Shape, g_us: float, c_us: float) -> dict:
    from gemmc.bench import stats
    return {"shape": str(shape), **shape.as_dict(), "flops": shape.flops, "status": "ok", "error": None,
            "schedule": "s", "gemmc_us": stats.summarize([g_us]).as_dict(),
            "cublas_us": stats.summarize([c_us]).as_dict(), "gemmc_tflops": 1.0, "cublas_tflops": 1.0,
            "ratio": c_us / g_us}


def test_two_runs_on_one_day_keep_both_default_reports(tmp_path, monkeypatch, capsys):
    _fake_gpu_run(monkeypatch, [_ok_record(suites.Shape(256, 256, 256), 10.0, 12.0)])
    monkeypatch.chdir(tmp_path)
    assert bench_main(["--suite", "square", "--limit", "1", "--no-plot"]) == 0
    assert bench_main(["--suite", "square", "--limit", "1", "--no-plot", "--policy", "auto"]) == 0
    results = tmp_path / "bench" / "results"
    first, second = sorted(results.glob("*-h200-square.json")), sorted(results.glob("*-h200-square-2.json"))
    assert len(first) == len(second) == 1 and len(list(results.iterdir())) == 2
    assert json.loads(first[0].read_text())["policy"] == "heuristic"
    assert json.loads(second[0].read_text())["policy"] == "auto"


def test_the_table_is_printed_and_the_report_kept_when_its_path_fails_at_the_end(tmp_path, monkeypatch, capsys):
    _fake_gpu_run(monkeypatch, [_ok_record(suites.Shape(256, 256, 256), 10.0, 12.0)])
    import tempfile
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    out = tmp_path / "gone" / "r.json"
    real_write = report.write_json

    def failing_write(rep, path):      # the disk fills up (or the dir goes away) during the run
        if Path(path) == out:
            raise OSError(28, "No space left on device")
        return real_write(rep, path)

    monkeypatch.setattr(report, "write_json", failing_write)
    assert bench_main(["--suite", "square", "--limit", "1", "--no-plot", "--out", str(out)]) == 0
    res = capsys.readouterr()
    assert "256x256x256" in res.out and "geomean 1.200x cuBLAS" in res.out
    assert "cannot write" in res.err and "No space left on device" in res.err
    kept = tmp_path / "tmp" / "r.json"
    assert json.loads(kept.read_text())["summary"]["geomean"] == pytest.approx(1.2)
    assert f"report: {kept}" in res.out


# ---- the sweep dataset's best record --------------------------------------------------------------------

def test_the_best_record_compares_careful_times_with_careful_times():
    """The short pass rotates few sets (a small shape runs partly from L2, faster); the top few are timed again
    over >= 2x L2. A short-pass time must not beat the careful times of the schedules that were faster than it
    in that same short pass."""
    def rec(tile_n, short_us, careful_us=None, error=None):
        r = {"m": 256, "n": 256, "k": 256, "schedule": {"tile": [128, tile_n, 64]}, "error": error,
             "refined": careful_us is not None, "time_us": careful_us if careful_us is not None else short_us}
        if careful_us is not None:
            r["time_us_short"] = short_us
        return r

    recs = [rec(64, 2.6, careful_us=3.30), rec(128, 2.7, careful_us=3.27), rec(192, 2.95)]
    assert ds.best_per_shape(recs)[(256, 256, 256)]["schedule"]["tile"][1] == 128
    # no careful time (its check failed): the short pass decides
    failed = [rec(64, 2.6, error="check (careful pass): ..."), rec(192, 2.95)]
    failed[0]["time_us"] = None
    assert ds.best_record(failed)["schedule"]["tile"][1] == 192
    assert ds.best_record([]) is None


def test_the_recorded_sweeps_best_is_a_refined_record_wherever_one_succeeded():
    data = Path(__file__).resolve().parent.parent / "bench" / "data" / "2026-11-30-h200-sweep.jsonl.gz"
    if not data.exists():
        pytest.skip("the recorded sweep is not in this checkout")
    _, recs = ds.load_dataset(data)
    best = ds.best_per_shape(recs)
    for key, shape_recs in ds.by_shape(recs).items():
        if any(r.get("refined") and r.get("time_us") is not None and not r.get("error") for r in shape_recs):
            assert best[key]["refined"], key


def test_the_method_text_claims_the_timed_launches_check_only_where_it_is_made():
    graphs = report.method_of(timing.TimingConfig())["text"]
    host = report.method_of(timing.TimingConfig(host_timing=True))["text"]
    assert "The timed graph launches are checked the same way after timing" in graphs
    assert "timed graph launches are checked" not in host and "are not read back" in host


def test_a_shape_auto_runs_on_torch_matmul_because_no_kernel_takes_it_says_so():
    from gemmc.compiler import CublasOnlyGemm
    from gemmc.spec import GemmSpec
    k = CublasOnlyGemm(GemmSpec(m=64, n=32001, k=4096, dtype="bf16"), "sm_90a", "N=32001 breaks 16-byte alignment",
                       device_type="cpu")
    name, d = timing.describe_schedule(k)
    assert name == "cuBLAS (no gemmc kernel: alignment)"
    assert d == {"dispatch": "cublas", "why": k.decision.detail} and "32001" in d["why"]


def test_a_wrong_result_on_any_shape_fails_the_run(capsys):
    """A shape whose output failed the check means gemmc computed a wrong result: the run exits 1 and names it,
    even when other shapes passed; a shape that only failed to compile does not fail the run."""
    from gemmc.bench.cli import exit_status

    def report(*statuses):
        rows = [{"m": 64 * (i + 1), "n": 128, "k": 256, "status": s} for i, s in enumerate(statuses)]
        return {"results": rows, "summary": {"n_ok": statuses.count("ok")}}

    assert exit_status(report("ok", "ok")) == 0
    assert exit_status(report("ok", "compile_error")) == 0
    assert exit_status(report("compile_error")) == 1
    assert exit_status(report("ok", "check_failed", "ok")) == 1
    assert "1 shape(s) failed the correctness check: 128x128x256" in capsys.readouterr().err
