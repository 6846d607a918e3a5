"""scripts/gpu_grouped.py on the CPU: its --compile-only mode builds the checked variants and checks their PTX;
every variant is a valid schedule of its spec and together they cover both layouts, both modes, clusters, the
gate and an epilogue; and the MoE problems it times (gemmc.bench.moe): models, seeded routing, offsets."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from script_support import load_script

import gemmc
from gemmc.bench import moe
from gemmc.schedule import check_schedule

ROOT = Path(__file__).resolve().parent.parent
gpu_grouped = load_script("gpu_grouped")


def test_compile_only_builds_and_checks_the_ptx(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_grouped.py"), "--compile-only", "--only",
                           "contiguous_swiglu_c2x1,masked_pp,fp8_contiguous_coop_c2x1,fp8_masked_pp_c2x1"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compiled contiguous_swiglu_c2x1" in proc.stdout and "PTX ok" in proc.stdout
    assert proc.stdout.count("PTX ok") == 4 and "compiled fp8_masked_pp_c2x1" in proc.stdout
    report = json.loads((tmp_path / "grouped_results.json").read_text())
    assert report["errors"] == [] and report["check"] == []
    assert proc.stdout.rstrip().splitlines()[-1].startswith("checks: 0")      # the summary comes last


def test_the_variants_are_valid_and_cover_the_kernel():
    seen = set()
    for name in gpu_grouped.VARIANTS:
        spec, sched = gpu_grouped.variant_spec(name)
        assert not check_schedule(sched, spec), name
        seen |= {spec.group_layout, sched.mode, "cluster" if sched.cluster != (1, 1) else "plain",
                 "gate" if spec.gate else "", "epilogue" if spec.epilogue else "", f"order {sched.raster}"}
    assert seen >= {"contiguous", "masked", "cooperative", "pingpong", "cluster", "gate", "epilogue", "order n"}
    assert max(len(r) for r in gpu_grouped.CHECK_ROWS) == 256 and 0 in gpu_grouped.CHECK_ROWS[0]


def test_the_ptx_check_names_what_is_missing():
    errs = gpu_grouped.check_ptx("v", "wgmma.mma_async cp.async.bulk.tensor st.global", gemmc.Schedule(cluster=(2, 1)))
    assert any("shfl.sync.up" in e for e in errs) and any("multicast" in e for e in errs)
    spec, sched = gpu_grouped.variant_spec("fp8_contiguous_e5m2_256")
    walk = "cp.async.bulk.tensor shfl.sync.up vote.sync.ballot st.global wgmma.wait_group.sync.aligned 0;"
    bf16 = walk + " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"
    assert gpu_grouped.check_ptx("v", bf16, sched, spec) == ["v: PTX lacks the fp8 WGMMA (k32, e4m3 x e5m2)"]
    assert gpu_grouped.check_ptx("v", walk + " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2", sched, spec) == []


def test_the_fp8_variants_cover_both_layouts_and_time_deepseeks_experts():
    fp8 = [n for n in gpu_grouped.VARIANTS if gpu_grouped.variant_dtype(n) == "fp8"]
    specs = [gpu_grouped.variant_spec(n) for n in fp8]
    assert all(s.scaling.mode == "block" and s.k % 16 == 0 and s.k % 128 for s, _ in specs)   # a partial k-tile
    assert {s.group_layout for s, _ in specs} == {"contiguous", "masked"}
    assert {str(s.b_dtype) for s, _ in specs} == {"f8e4m3", "f8e5m2"} and any(s.epilogue for s, _ in specs)
    assert {t.mode for _, t in specs} == {"cooperative", "pingpong"} and any(t.cluster != (1, 1) for _, t in specs)
    up, down = (moe.spec_of(moe.model("deepseek-v3"), p, scaling="block") for p in moe.PROJECTIONS)
    assert (up.n, up.k, up.groups, up.gate) == (4096, 7168, 256, None) and (down.n, down.k) == (7168, 2048)


@pytest.mark.parametrize("routing", moe.ROUTINGS)
def test_routing_is_seeded_and_sends_each_token_to_top_k_experts(routing):
    counts = moe.route(512, 128, 8, routing, seed=3)
    assert counts.sum() == 512 * 8 and counts.max() <= 512 and len(counts) == 128
    assert np.array_equal(counts, moe.route(512, 128, 8, routing, seed=3))
    assert not np.array_equal(counts, moe.route(512, 128, 8, routing, seed=4))


def test_imbalanced_routing_loads_some_experts_far_more():
    uniform, zipf = (moe.route(4096, 256, 8, r, seed=0).max() for r in ("uniform", "zipf"))
    assert zipf > 4 * uniform
    assert list(moe.offsets_of([3, 0, 2])) == [0, 3, 3, 5] and moe.offsets_of([1]).dtype == np.int32
    with pytest.raises(gemmc.SpecError, match="top_k=9"):
        moe.route(4, 8, 9)


@pytest.mark.parametrize("m", moe.MODELS, ids=lambda m: m.name)
def test_every_models_projections_compile_under_auto(m):
    for proj in moe.PROJECTIONS:
        spec = moe.spec_of(m, proj)
        assert spec.grouped and spec.groups == m.experts and (spec.gate == "silu") == (proj == "up")
        k = gemmc.compile(spec, schedule="auto", emit="ir")
        for tokens in moe.TOKENS:
            decision, _ = k.for_m(tokens * m.top_k)
            assert not check_schedule(decision.schedule, spec) and not decision.use_cublas
    assert moe.tokens_per_expert_bucket(8, 256) == 1 and moe.tokens_per_expert_bucket(300, 256) == 2
