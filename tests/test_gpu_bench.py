"""GPU end-to-end: a 3-shape bench against cuBLAS, and a one-shape sweep (H200; `pytest -m gpu`); the
correctness check's bound against real fp32-accumulating GEMMs, and the check of the timed CUDA graphs."""
import json
import math

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
        # within the elementwise bound with 2x margin, in the eager check and in the timed graph's own outputs
        assert r["elem_err"] <= 0.6 and r["timed_elem_err"] <= 0.6 and r["timed_nonfinite_slots"] == 0
        assert r["rel_err"] <= 2 * r["cublas_rel_err"] + 1e-4 and r["timed_rel_err"] <= 2 * r["cublas_rel_err"] + 1e-4
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


@pytest.fixture
def fp32_reductions():
    """cuBLAS's split-K reductions in fp32, as a kernel with an fp32 accumulator does (torch lets cuBLAS reduce
    16-bit GEMMs in 16 bits by default)."""
    import torch
    m = torch.backends.cuda.matmul
    before = (m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction)
    m.allow_bf16_reduced_precision_reduction = m.allow_fp16_reduced_precision_reduction = False
    yield
    m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction = before


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("m, n, k", [(16, 6144, 4096), (128, 4096, 4096), (1000, 2048, 1024), (64, 4096, 16384),
                                     (2048, 2048, 8192), (4096, 4096, 4096)])
def test_cublas_meets_the_elementwise_bound_with_margin(fp32_reductions, m, n, k, dtype):
    """A second, independent fp32-accumulating GEMM on this hardware: within half the bound (2x margin)."""
    import torch
    from gemmc.bench import timing
    from gemmc.reference import error_figures
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=g).to(tdt)
    b = torch.randn(n, k, device="cuda", generator=g).to(tdt)
    r = timing.reference_with_bound(a, b)
    out = torch.full((m, n), math.nan, device="cuda", dtype=tdt)
    timing.cublas_matmul(a, b, out=out)
    rel, elem = error_figures(out, r.ref, r.bound)
    assert elem <= 0.6 and rel < 1e-2, (rel, elem)


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("epilogue", ["alpha_bias_gelu_res", "col_silu_clamp_tanh", "cast_bf16_sigmoid"])
def test_gemmc_fused_epilogues_meet_the_elementwise_bound(epilogue, out_dtype):
    """gemmc's own fused epilogues (f32 math, the DSL's tanh/erf/exp, casts), split-K among them, within half
    gemmc.reference's bound."""
    import torch

    import gemmc
    from gemmc.reference import error_figures, make_inputs, reference_and_bound
    from gemmc.spec import Ref
    A, I, N = Ref.acc, Ref.input, Ref.node
    Op, In = gemmc.EpilogueOp, gemmc.EpilogueInput
    specs = {
        "alpha_bias_gelu_res": (dict(
            inputs=(In("alpha", "scalar"), In("bias", "row", "bf16"), In("res", "full", "bf16")),
            epilogue=(Op("mul", (A(), I("alpha"))), Op("add", (N(0), I("bias"))), Op("gelu_tanh", (N(1),)),
                      Op("add", (N(2), I("res"))))), gemmc.Schedule(tile=(128, 128, 64), split_k=2)),
        "col_silu_clamp_tanh": (dict(
            inputs=(In("scale", "col", "f32"),),
            epilogue=(Op("mul", (A(), I("scale"))), Op("silu", (N(0),)),
                      Op("clamp", (N(1),), (("min", -2.0), ("max", 3.0))), Op("tanh", (A(),)),
                      Op("add", (N(2), N(3))))), gemmc.Schedule(tile=(128, 128, 64))),
        "cast_bf16_sigmoid": (dict(
            inputs=(In("bias", "row", "f32"),),
            epilogue=(Op("sub", (A(), I("bias"))), Op("cast", (N(0),), (("dtype", "bf16"),)),
                      Op("sigmoid", (N(1),)), Op("gelu_erf", (A(),)), Op("add", (N(2), N(3))))),
                              gemmc.Schedule(tile=(128, 256, 64), cluster=(2, 1))),
    }
    kw, sched = specs[epilogue]
    spec = gemmc.GemmSpec(m="M", n="N", k="K", out_dtype=out_dtype, **kw)
    k = gemmc.compile(spec, schedule=sched)
    for m, n, kk in [(300, 392, 3000), (2048, 1024, 8192)]:
        a, b, extra = make_inputs(spec, m, n, kk)
        out = torch.full((m, n), math.nan, device="cuda", dtype={"bf16": torch.bfloat16, "f32": torch.float32}[out_dtype])
        k(a, b, *extra, out=out)
        ref, bound = reference_and_bound(spec, a, b, extra)
        rel, elem = error_figures(out, ref, bound)
        assert elem <= 0.6 and rel < 1e-2, (m, n, kk, rel, elem)


def test_a_kernel_wrong_only_in_its_cuda_graph_fails_the_timed_check():
    """Right when called eagerly (the first check), wrong in the captured graph the bench times: the timed
    launches' outputs, NaN-filled before the first replay, are checked after timing. A correct one passes."""
    import torch
    from gemmc.bench import timing
    from gemmc.bench.suites import Shape

    def graph_bug(a, b, out=None):
        torch.matmul(a, b.T, out=out)
        if torch.cuda.is_current_stream_capturing():
            out.mul_(1.5)
        return out

    shape = Shape(1000, 2048, 1024)
    clock = timing.CudaClock(graphs=True)
    for aa in (False, True):
        cfg = timing.TimingConfig(repeats=3, aa_check=aa)
        n = timing.input_set_count(shape, 2, timing.l2_bytes_of(), cfg.l2_factor)
        sets = timing.make_input_sets(shape, torch.bfloat16, "cuda", n, 0)
        bad = timing.bench_shape(shape, graph_bug, sets, clock, cfg)
        assert bad["elem_err"] <= 1 and bad["status"] == "check_failed", bad.get("error")
        assert bad["error"].startswith("timed launches (slots ") and bad["timed_elem_err"] > 1
        good = timing.bench_shape(shape, timing.cublas_matmul, sets, clock, cfg)
        assert good["status"] == "ok" and good["timed_elem_err"] <= 0.6 and good["timed_nonfinite_slots"] == 0


def test_the_reference_is_fp32_after_the_fp32_precision_api_set_tf32(fp32_precision_tf32):
    """(f32 inputs: bf16 and f16 ones are exact in TF32, which would not tell the two apart.)"""
    import torch
    from gemmc.bench import timing
    a = torch.randn(512, 4096, device="cuda")
    b = torch.randn(256, 4096, device="cuda")
    exact = a.double() @ b.double().T
    err = ((timing.reference(a, b).double() - exact).norm() / exact.norm()).item()
    tf32 = ((a @ b.T).double() - exact).norm().item() / exact.norm().item()
    assert err < 1e-6 < 1e-4 < tf32 and fp32_precision_tf32.fp32_precision == "tf32", (err, tf32)
