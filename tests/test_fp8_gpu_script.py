"""scripts/gpu_fp8.py on the CPU: every variant's schedule is valid for its problem, the PTX check names what a
kernel lacks, and --compile-only builds a small plan (the next GPU session runs the whole script in one call)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from script_support import load_script

from gemmc.schedule import check_schedule

ROOT = Path(__file__).resolve().parent.parent
script = load_script("gpu_fp8")


def test_every_variant_is_a_valid_fp8_problem_and_schedule():
    for name, (mode, b_dtype, _, sched) in script.VARIANTS.items():
        nk = (512, 4096) if script.static_nk(name) else ("N", "K")
        spec = script.make_spec(name, *nk)
        assert spec.scaling.mode == mode and str(spec.b_dtype) == b_dtype
        assert not check_schedule(sched, spec), (name, check_schedule(sched, spec))
    assert {v[0] for v in script.VARIANTS.values()} == {"tensor", "row", "block"}
    assert {v[1] for v in script.VARIANTS.values()} == {"f8e4m3", "f8e5m2"}
    for mode, schedules in script.SPEED.items():
        spec = script.GemmSpec(m="M", n=7168, k=7168, dtype="f8e4m3", scaling=mode)
        assert all(not check_schedule(s, spec) for s in schedules.values()), mode


def test_the_ptx_check_names_a_missing_fp8_wgmma():
    errs = script.check_ptx("row_pp_128x128_c1x2", "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16")
    assert any("lacks wgmma.mma_async ... k32.f32.e4m3.e4m3" in e for e in errs)
    assert any("multicast in PTX = False for cluster (1, 2)" in e for e in errs)


def test_compile_only_builds_a_small_plan(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_fp8.py"), "--compile-only", "--only",
                           "row_swap_pp_64x16_c1x2,block_pp_128x32,tensor_e5m2_coop_128x256_c2x1"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("row_swap_pp_64x16_c1x2", "block_pp_128x32@", "tensor_e5m2_coop_128x256_c2x1"):
        assert f"compiled {name}" in proc.stdout and "PTX ok" in proc.stdout
    assert proc.stdout.rstrip().endswith("checks: 0/0 ok; errors: 0")
    report = json.loads((tmp_path / "fp8_results.json").read_text())
    assert report["errors"] == [] and (tmp_path / "fp8_log.txt").exists()
