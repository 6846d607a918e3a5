"""scripts/gpu_floor.py: its source edits apply to every SM90 kernel form and remove what they say."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_support import load_script

import gemmc
from gemmc.bench.policy import parse_schedule

ROOT = Path(__file__).resolve().parent.parent
gpu_floor = load_script("gpu_floor")

FORMS = ["128x256x64_c2x1_coop_sauto_rm_sw1_k1", "64x128x64_c1x1_pp_sauto_rm_sw1_k1",
         "128x128x64_c1x2_pp_sauto_rm_sw8_k1", "64x128x64_c1x1_pp_sauto_rm_sw1_k4",
         "64x8x128_c1x2_pp_s10_rm_sw1_k1_swap", "128x16x64_c1x1_coop_sauto_rm_sw1_k1_swap"]


def _source(name: str) -> str:
    return gemmc.compile(gemmc.GemmSpec(m="M", n="N", k="K"), schedule=parse_schedule(name)).emitted.source


@pytest.mark.parametrize("name", FORMS)
def test_the_edits_remove_the_mma_or_the_loads(name):
    src = _source(name)
    assert src.count("cute.gemm(tiled_mma, accumulators") == 1
    stream = gpu_floor.edit_source(src, "stream")
    assert "cute.gemm(" not in stream
    assert stream.count("cute.copy(tma_a") == src.count("cute.copy(tma_a") == 1      # loads kept
    mma = gpu_floor.edit_source(src, "mma")
    assert mma.count("cute.gemm(tiled_mma, accumulators") == 1
    assert "for kt in range(0):" in mma and "consumer_wait(read_state)" not in mma
    assert "consumer_release(release_state)" not in mma
    compile(stream, "<stream>", "exec")          # both are still Python
    compile(mma, "<mma>", "exec")


def test_an_unknown_variant_or_a_changed_template_is_refused():
    src = _source(FORMS[0])
    with pytest.raises(ValueError, match="use one of"):
        gpu_floor.edit_source(src, "nothing")
    with pytest.raises(ValueError, match="the WGMMA loop: found 0"):
        gpu_floor.edit_source(gpu_floor.edit_source(src, "stream"), "stream")


def test_compile_only_builds_every_variant(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"16x4096x4096": ["64x8x128_c1x2_pp_s10_rm_sw1_k1_swap"]}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_floor.py"), str(plan), "--compile-only"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[1/1] built 64x8x128_c1x2_pp_s10_rm_sw1_k1_swap and its variants" in proc.stdout
