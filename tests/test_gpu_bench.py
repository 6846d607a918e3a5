"""GPU end-to-end: a 3-shape bench against cuBLAS, and a one-shape sweep (H200; `pytest -m gpu`)."""
import json

import pytest

from gemmc.bench import dataset as ds
from gemmc.bench.cli import main as bench_main

pytestmark = pytest.mark.gpu

SHAPES = "# three shapes: decode, a ragged M, a square\n128 4096 4096\n1000, 2048, 1024\n2048 2048 2048\n"


def test_bench_three_shapes_end_to_end(tmp_path, capsys):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text(SHAPES)
    out = tmp_path / "r.json"
    rc = bench_main(["--shapes", str(shapes), "--policy", "heuristic", "--repeats", "5", "--out", str(out),
                     "--compile-workers", "3", "--quiet"])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    statuses = {r["shape"]: (r["status"], r.get("error")) for r in report["results"]}
    assert rc == 0 and all(s == "ok" for s, _ in statuses.values()), statuses
    for r in report["results"]:
        assert r["rel_err"] < 1e-2 and r["cublas_rel_err"] < 1e-2
        assert r["gemmc_us"]["n"] == 5 and r["gemmc_us"]["min"] <= r["gemmc_us"]["median"] <= r["gemmc_us"]["max"]
        assert 1 < r["cublas_tflops"] < 1500 and 0.05 < r["ratio"] < 20
        assert r["rotated_bytes"] >= 2 * report["environment"]["gpu"]["l2_bytes"] or r["input_sets"] == 4096
        assert r["schedule"] and r["launches"] >= r["input_sets"]
    assert report["environment"]["gpu"]["name"] and report["environment"]["versions"]["torch"]
    assert report["method"]["timing"] == "cuda-graphs"
    assert "geomean" in printed and "128x4096x4096" in printed
    png = out.with_suffix(".png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 5000


def test_bench_host_timing_mode(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("256 4096 4096\n")
    out = tmp_path / "h.json"
    assert bench_main(["--shapes", str(shapes), "--host-timing", "--repeats", "3", "--out", str(out), "--no-plot",
                       "--quiet"]) == 0
    r = json.loads(out.read_text())
    assert r["method"]["timing"] == "host" and r["results"][0]["status"] == "ok"


def test_sweep_one_shape_few_schedules(tmp_path):
    from gemmc.bench import sweep as sw
    from gemmc.bench.suites import Shape
    from gemmc.schedule import ScheduleSpace

    space = ScheduleSpace(tile_m=(128,), tile_n=(128, 256), tile_k=(64,), clusters=((1, 1), (2, 1)),
                          modes=("cooperative",), rasters=("m",), swizzles=(1,), split_ks=(1,), stages=("auto",))
    cfg = sw.SweepConfig(budget_s=240, workers=4, top=2)
    footer = sw.run_sweep([Shape(256, 4096, 4096)], cfg, tmp_path / "d.jsonl.gz", space=space, progress=False)
    header, recs = ds.load_dataset(tmp_path / "d.jsonl.gz")
    assert footer["complete"] and len(recs) == 4, [r.get("error") for r in recs]
    assert all(r["time_us"] and r["time_us"] > 0 and r["cublas_us"] > 0 for r in recs), recs
    assert sum(r["refined"] for r in recs) == 2 and header["device"]["name"]
