"""The examples in examples/ run as scripts: on the CPU (the GPU hidden, so the output is the same on any
host) they compile, build or simulate and print what they decided; with a GPU they also run and check."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gemmc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SOURCES = ("db", "pretuned", "policy", "nearest", "heuristic")


def run_example(name: str, tmp_path: Path, *args: str, hide_gpu: bool = True, timeout: int = 240):
    """(returncode, stdout + stderr) of examples/<name>, with a private kernel cache and tuning DB."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", GEMMC_CACHE_DIR=str(tmp_path / "cache"),
               GEMMC_TUNING_DB=str(tmp_path / "tuning.sqlite"))
    if hide_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_main_example_prints_the_ir_after_each_pass_and_builds_the_kernel(tmp_path):
    """examples/main.py, what the README's `scripts/dev example` runs: on a CPU it prints the IR before and
    after every pass of the compiled kernel, builds it and finds the Hopper instructions in its PTX."""
    dev = (EXAMPLES.parent / "scripts" / "dev").read_text()
    assert re.search(r"^\s*example\)\s+exec python examples/main\.py ", dev, re.M), "scripts/dev example runs main.py"
    rc, out = run_example("main.py", tmp_path)
    assert rc == 0, out
    import runpy
    k = gemmc.compile(runpy.run_path(str(EXAMPLES / "main.py"))["linear_gelu"], schedule="heuristic", arch="sm_90a")
    assert re.findall(r"^// ----- IR after (\S+) -----$", out, re.M) == list(k.passes), out
    assert "// ----- IR (input) -----" in out and "gemm.gelu_tanh" in out
    assert re.search(r"^// built in [\d.]+ s ", out, re.M), out
    for needle in ("wgmma.mma_async", "cp.async.bulk.tensor", "setmaxnreg", "mbarrier"):
        assert f"// PTX has {needle}: True" in out, out
    assert "no GPU here" in out


def test_residual_epilogue_shows_the_decision_the_explicit_schedule_and_the_refusal(tmp_path):
    rc, out = run_example("residual_epilogue.py", tmp_path)
    assert rc == 0, out
    auto = re.search(r"^# auto: (\S+)\s+\[source: (\w+)\] (.+)$", out, re.M)
    assert auto and auto.group(2) in SOURCES and "k.for_m" in auto.group(3), out
    for m in (16, 128, 512, 8192):          # one line per runtime M, each naming its schedule and source
        assert re.search(rf"^#   M={m}\s+runs \S+_k\d\S*\s+\[source: ({'|'.join(SOURCES)})\]", out, re.M), out
    assert "# explicit: 128x128x64_c1x2_coop_s4_rn_sw1_k1, " in out
    ir = out[out.index("// ----- IR after verify-resources"):]
    assert "tile = 128x128x64, cluster = 1x2, stages = 4, mode = cooperative, raster = n" in ir
    assert "kernel.pipeline stages 4" in ir and "gemm.add" in ir and "-> !gemmc.tensor<M x 4096 x f32" in ir
    assert "# check_schedule(128x256x64_c1x2_coop_s6_rm_sw1_k1) -> 1 violation(s)" in out
    refused = out[out.index("# refused 128x256x64_c1x2_coop_s6_rm_sw1_k1"):]
    assert "shared memory: got 345088 B" in refused and "limit 232448 B on sm_90a" in refused
    assert "use stages<=3" in refused
    assert "no GPU here" in out


def test_aot_build_fills_the_cache_dir_with_every_bucket_kernel(tmp_path):
    cache = tmp_path / "aot-cache"
    rc, out = run_example("aot_build.py", tmp_path, "--cache-dir", str(cache))
    assert rc == 0, out
    keys = re.findall(r"^#   M \S+\s+\S+_k\d\S*\s+key ([0-9a-f]{12})", out, re.M)
    assert keys, out
    built = sorted(cache.glob("kernels/*/*/kernel.so"))
    assert built and f"# {len(built)} kernel(s) in {cache}" in out
    for key in keys:        # each bucket's printed key is an entry with its kernel.so and manifest
        entry = cache / "kernels" / key[:2]
        assert any((d / "kernel.so").is_file() and (d / "manifest.json").is_file() for d in entry.glob(key + "*"))
    assert {d.name[:12] for d in (p.parent for p in built)} == set(keys)
    assert re.search(r"^#   M 1\.\.", out, re.M) and re.search(r"^#   M \d+\.\.\s", out, re.M)   # all M covered
    assert "export GEMMC_CACHE_DIR=" in out and "no GPU here" in out
    assert not (tmp_path / "cache" / "kernels").exists()      # nothing went to the env's cache


def test_search_simulate_prints_fractions_per_strategy_and_the_tune_command(tmp_path):
    rc, out = run_example("search_simulate.py", tmp_path)
    assert rc == 0, out
    assert re.search(r"^# \d+ records, 100 recorded shapes; replaying 10: ", out, re.M), out
    header = re.search(r"^\s*strategy((?:\s+@\d+)+)$", out, re.M)
    assert header and header.group(1).split() == ["@1", "@4", "@8", "@16"], out
    rows = {m.group(1): [float(x) for x in m.group(2).split()]
            for m in re.finditer(r"^\s*(exhaustive|random|bayes|rl)((?:\s+\d+\.\d+)+)$", out, re.M)}
    assert set(rows) == {"exhaustive", "random", "bayes", "rl"}, out
    for name, fractions in rows.items():
        assert len(fractions) == 4 and all(0 < f <= 1 for f in fractions), (name, fractions)
        assert fractions == sorted(fractions), (name, fractions)    # more measurements never find worse
    assert re.search(r"^gemmc-search tune --shapes shapes.txt --strategy (random|bayes) --budget 16 --confirm 3$",
                     out, re.M), out
    assert "> shapes.txt" in out


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["main.py", "residual_epilogue.py", "aot_build.py"])
def test_examples_run_and_check_on_the_gpu(name, tmp_path):
    rc, out = run_example(name, tmp_path, hide_gpu=False, timeout=600)
    print(out)      # shown with -rP: the errors and what ran
    assert rc == 0, out
    errors = [float(e) for e in re.findall(r"relative error vs fp32 torch = (\S+)", out)]
    assert errors and all(e < 1e-2 for e in errors), out
    if name == "aot_build.py":
        assert "kernels compiled while running: 0" in out
