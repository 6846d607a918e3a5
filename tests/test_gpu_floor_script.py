"""scripts/gpu_floor.py: its edits of the SM90 kernel modules remove what they say, and every kernel form
builds over the edited copy."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_support import load_script

import gemmc
from gemmc.compiled import CompiledKernel
from gemmc.bench.policy import parse_schedule

ROOT = Path(__file__).resolve().parent.parent
gpu_floor = load_script("gpu_floor")

FORMS = ["128x256x64_c2x1_coop_sauto_rm_sw1_k1", "64x128x64_c1x1_pp_sauto_rm_sw1_k1",
         "128x128x64_c1x2_pp_sauto_rm_sw8_k1", "64x128x64_c1x1_pp_sauto_rm_sw1_k4",
         "64x8x128_c1x2_pp_s10_rm_sw1_k1_swap", "128x16x64_c1x1_coop_sauto_rm_sw1_k1_swap"]


def _kernel(name: str):
    return gemmc.compile(gemmc.GemmSpec(m="M", n="N", k="K"), schedule=parse_schedule(name))


def test_the_edits_remove_the_mma_or_the_loads():
    src = gpu_floor.kernel_sources()
    # one WGMMA into the accumulators per kernel form (plain or gated), and the gated kernel's up chain
    assert src["consumer"].count("cute.gemm(tiled_mma, accumulators") == 2
    assert src["consumer"].count("cute.gemm(tiled_mma, up_accumulators") == 1
    stream = gpu_floor.edit_modules("stream")
    assert "cute.gemm(" not in stream["consumer"]
    assert stream["producer"] == src["producer"] and stream["producer"].count("cute.copy(tma_a") == 1  # loads kept
    mma = gpu_floor.edit_modules("mma")
    assert mma["consumer"].count("cute.gemm(tiled_mma, accumulators") == 2
    assert "for kt in range(0):" in mma["producer"] and "consumer_wait(read_state)" not in mma["consumer"]
    assert "consumer_release(release_state)" not in mma["consumer"]
    for edited in (stream, mma):     # only the named modules change, and they are still Python
        assert {n for n in src if edited[n] != src[n]} <= {"consumer", "producer"}
        for module, text in edited.items():
            compile(text, module, "exec")


@pytest.mark.parametrize("name", FORMS)
def test_every_kernel_form_builds_over_the_edited_copy(name):
    k = _kernel(name)
    for variant in gpu_floor.VARIANTS:
        edited = gpu_floor.edited_kernel(k, gpu_floor.edit_modules(variant), "gpu_floor.py")
        assert edited.source.replace("from gemmc_kernel_edit_", "from gemmc.backends.sm90.kernel ") != k.source
        assert "from gemmc_kernel_edit_" in edited.source and edited.key != CompiledKernel(k.emitted).key
        edited.build()          # the DSL compiles the edited modules (CPU: to PTX and a .so)


def test_an_unknown_variant_or_a_changed_template_is_refused():
    with pytest.raises(ValueError, match="use one of"):
        gpu_floor.edit_modules("nothing")
    with pytest.raises(ValueError, match="the WGMMA loop: found 0"):
        gpu_floor.edit_modules("stream", gpu_floor.edit_modules("stream"))
    with pytest.raises(ValueError, match="the kernel package: found 0"):
        source = _kernel(FORMS[0]).emitted
        bare = type("K", (), {"emitted": dataclasses.replace(source, source=source.source.replace(
            "from gemmc.backends.sm90.kernel import", "from elsewhere import"))})()
        gpu_floor.edited_kernel(bare, gpu_floor.kernel_sources(), "gpu_floor.py")


def test_compile_only_builds_every_variant(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"16x4096x4096": ["64x8x128_c1x2_pp_s10_rm_sw1_k1_swap"]}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_floor.py"), str(plan), "--compile-only"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[1/1] built 64x8x128_c1x2_pp_s10_rm_sw1_k1_swap and its variants" in proc.stdout
