"""bench/llama.py and examples/llama_decode.py: a transformers Llama end to end, torch against gemmc.nn. On the
CPU (--tiny, the GPU hidden) they run the whole plumbing: transformers' StaticCache across versions, the cache
rewind, swap_linears, torch.compile's tracing (eager backend), the checks and the report; on a GPU (-m gpu) the
real shapes with CUDA graphs."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "llama.py"
EXAMPLE = ROOT / "examples" / "llama_decode.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("llama_bench_script", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


llama = load_bench()


def run(script: Path, tmp_path: Path, *args: str, gpu: bool = False, timeout: int = 300):
    """(returncode, stdout, stderr) of a script, with a private kernel cache; the GPU hidden unless `gpu`."""
    env = dict(os.environ, GEMMC_CACHE_DIR=str(tmp_path / "cache"), GEMMC_TUNING_DB=str(tmp_path / "db.sqlite"))
    env.pop("OUT", None)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, str(script), *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def cases(report: dict) -> dict:
    name = {"decode": lambda r: f"decode b{r['batch']} {r['variant']}",
            "prefill": lambda r: f"prefill {r['batch']}x{r['length']} {r['variant']}",
            "mlp": lambda r: f"mlp {r['tokens']}"}
    return {name[r["phase"]](r): r for r in report["results"]}


def test_tiny_run_checks_times_and_reports_every_phase_with_compile_and_fused_mlp(tmp_path):
    out = tmp_path / "llama.json"
    rc, stdout, stderr = run(BENCH, tmp_path, "--tiny", "--fuse-mlp", "--compile", "--compile-backend", "eager",
                             "--batches", "2", "--prefill-lens", "16", "--out", str(out))
    assert rc == 0, stdout + stderr
    report = json.loads(out.read_text())
    assert report["format"] == "gemmc-llama-bench/1" and report["ok"] is True and report["errors"] == []
    assert report["transformers"] == transformers.__version__ and report["torch"] == torch.__version__
    assert report["hf_api"]["cache_kw"] in ("cache", "past_key_values")
    assert report["model"]["num_hidden_layers"] == 2 and report["config"]["fuse_mlp"] is True
    assert report["swap"]["kept"] == {} and len(report["swap"]["fused_mlps"]) == 2     # one per decoder layer
    assert set(report["phase_seconds"]) >= {"build", "decode", "prefill", "mlp"}
    got = cases(report)
    assert set(got) == {"decode b2 eager", "decode b2 compiled+eager", "prefill 1x16 eager",
                        "prefill 1x16 compiled", "mlp 32"}
    for name, r in got.items():
        assert r["checks"] and all(c["ok"] for c in r["checks"]), name
        assert len(r["torch_samples_ms"]) == len(r["gemmc_samples_ms"]) == 2, name        # --tiny: 2 repeats
        assert r["ratio"] == pytest.approx(r["torch_ms"]["median"] / r["gemmc_ms"]["median"]), name
    decode = got["decode b2 eager"]
    assert decode["gemmc_tokens_per_s"] == pytest.approx(2000 / decode["gemmc_ms"]["median"])
    # the cache plumbing: the decode step matches a cache-less forward of prompt + token within bf16 noise
    plumbing = [c for c in decode["checks"] if "cache-less" in c["what"]]
    assert len(plumbing) == 1 and 0 < plumbing[0]["value"] < 1e-2
    for name in ("decode b2 compiled+eager", "prefill 1x16 compiled"):   # fullgraph: no graph break
        assert {side: c["graph_breaks"] for side, c in got[name]["compile"].items()} == {"torch": 0, "gemmc": 0}
    mlp = got["mlp 32"]
    assert set(mlp["grad_rel_diff"]) == {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                                         "input"}     # the fused [gate; up] gradient split back per parameter
    assert mlp["swap"]["fused_mlps"] == ["mlp"]
    table = stdout.strip().splitlines()
    assert table[0].startswith("# llama bench: 2 layers of a tiny config") and "CPU plumbing" in table[1]
    assert table[-1].startswith("# checks: ") and " 0 failed; 0 errors" in table[-1] and str(out) in table[-1]
    assert "[llama" in stderr and "decode: " in stderr        # progress and phase times go to stderr


def test_a_check_off_its_tolerance_fails_the_run_and_skips_that_timing(tmp_path, monkeypatch, capsys):
    # On the CPU every side can be bit-identical (gemmc's CPU layers are torch's), so the failure is made: each
    # comparison reads 1e-3 more than it is, over a tolerance of 1e-4.
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "db.sqlite"))
    monkeypatch.setattr(llama, "rel_diff", lambda out, ref: llama.rel_frobenius(out.float(), ref.float()) + 1e-3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "llama.json"
    rc = llama.main(["--tiny", "--phases", "decode", "--batches", "1", "--logits-tol", "1e-4", "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert rc == 1, stdout + stderr
    report = json.loads(out.read_text())
    (decode,) = report["results"]
    assert report["ok"] is False and "ratio" not in decode
    assert any(not c["ok"] and "cache-less" in c["what"] for c in decode["checks"])
    assert "CHECK FAILED" in stderr and "FAIL" in stdout


def test_the_example_generates_with_both_models_on_the_cpu(tmp_path):
    rc, stdout, stderr = run(EXAMPLE, tmp_path, "--new-tokens", "6", "--batch", "2", "--prompt-len", "5")
    assert rc == 0, stdout + stderr
    assert "no GPU here: a tiny config on the CPU" in stdout
    assert "0 layers keep torch's path" in stdout
    rel = float(stdout.split("relative difference ")[1].split()[0])
    assert rel < 2e-2
    seqs = [line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("# sequence 0")]
    assert len(seqs) == 2 and all(len(json.loads(s)) == 6 for s in seqs)


# ---- the pieces, in process -------------------------------------------------------------------------------

def tiny_model():
    return llama.build_model(llama.llama_config(1, tiny=True), "cpu", torch.bfloat16, seed=0)


def test_static_cache_passes_only_what_this_transformers_constructor_takes(monkeypatch):
    seen = {}

    class Old:          # transformers 4.44's signature
        def __init__(self, config, max_batch_size, max_cache_len, device, dtype=None):
            seen.update(config=config, max_batch_size=max_batch_size, max_cache_len=max_cache_len, device=device,
                        dtype=dtype)

    class New:          # 4.56+ (allocated lazily)
        def __init__(self, config, max_cache_len, offloading=False, **kwargs):
            seen.update(config=config, max_cache_len=max_cache_len, kwargs=kwargs)

    # the module `from transformers import` reads now (an earlier test may have reloaded transformers)
    monkeypatch.setattr(sys.modules["transformers"], "StaticCache", Old)
    llama.static_cache("cfg", 3, 40, "cpu", torch.bfloat16)
    assert seen == {"config": "cfg", "max_batch_size": 3, "max_cache_len": 40, "device": "cpu",
                    "dtype": torch.bfloat16}
    seen.clear()
    monkeypatch.setattr(sys.modules["transformers"], "StaticCache", New)
    llama.static_cache("cfg", 3, 40, "cpu", torch.bfloat16)
    assert seen == {"config": "cfg", "max_cache_len": 40, "kwargs": {}}


def test_a_rewound_decoder_repeats_its_steps_and_they_match_cache_less_forwards():
    model = tiny_model()
    api = llama.HFApi.of(model)
    prompt = torch.randint(model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        d = llama.Decoder(model, api, prompt, cache_len=16)
        d.first.copy_(d.prompt_logits[:, -1].argmax(-1, keepdim=True))
        d.rewind()
        seq, steps = torch.cat([prompt, d.first], dim=1), []
        full = llama.prefill_forward(model)
        for _ in range(3):
            steps.append(d.step().clone())
            assert llama.rel_diff(steps[-1][:, -1:], full(seq)) < 1e-2    # bf16 noise, cached vs not
            seq = torch.cat([seq, d.ids], dim=1)
        d.rewind()
        again = [d.step().clone() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(again, steps))
    assert d.pos.flatten().tolist() == [9, 9] and d.cache_pos.tolist() == [9]


def test_grads_by_key_splits_a_fused_gate_up_gradient():
    block = torch.nn.Module()
    block.mlp = torch.nn.Module()
    block.mlp.gate_up_proj = torch.nn.Linear(4, 6, bias=False)
    block.mlp.down_proj = torch.nn.Linear(3, 4, bias=False)
    for p in block.parameters():
        p.grad = torch.arange(p.numel(), dtype=torch.float32).view_as(p)
    got = llama.grads_by_key(block)
    assert set(got) == {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}
    assert torch.equal(torch.cat([got["mlp.gate_proj.weight"], got["mlp.up_proj.weight"]]),
                       block.mlp.gate_up_proj.weight.grad)


class StepClock:
    """A fake clock: each unit's time is its side's fixed cost; records the order the sides ran in."""

    def __init__(self):
        self.order = []

    def time_ms(self, unit):
        name, ms = unit()
        self.order.append(name)
        return ms


@given(repeats=st.integers(1, 9), warmup=st.integers(0, 3), calls=st.integers(1, 8))
def test_time_sides_alternates_the_order_and_reports_per_call_times(repeats, warmup, calls):
    clock, resets = StepClock(), []
    sides = {"torch": llama.Side(lambda: ("torch", 3.0 * calls), calls, lambda: resets.append("torch")),
             "gemmc": llama.Side(lambda: ("gemmc", 2.0 * calls), calls)}
    samples = llama.time_sides(sides, clock, repeats, warmup)
    assert samples == {"torch": [3.0] * repeats, "gemmc": [2.0] * repeats}
    timed = clock.order[2 * warmup:]
    assert timed == [n for r in range(repeats) for n in (("torch", "gemmc") if r % 2 == 0 else ("gemmc", "torch"))]
    assert len(resets) == warmup + repeats      # the reset runs before every unit of its side
    fields = llama.timing_fields(samples)
    assert fields["ratio"] == pytest.approx(1.5) and fields["paired_ratio"] == pytest.approx(1.5)


def test_options_are_checked_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as e:
        llama.parse_args(["--tiny", "--prompt", "30", "--decode-steps", "8", "--cache-len", "32"])
    assert e.value.code == 2 and "use --cache-len >= 39" in capsys.readouterr().err
    for bad in (["--batches", "1,0"], ["--phases", "decode,train"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            llama.parse_args(bad)
    args = llama.parse_args(["--quick"])
    assert (args.layers, args.repeats, args.decode_steps, args.batches) == (2, 5, 16, [1, 16, 64])
    args = llama.parse_args([])
    assert (args.layers, args.prompt, args.prefill_lens, args.mlp_tokens) == (8, 128, [256, 2048], 4096)
    assert llama.row_counts(args) == [1, 16, 64, 128, 256, 2048, 8192]


# ---- on the GPU -------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_quick_bench_on_the_gpu_checks_and_times_every_phase(tmp_path):
    out = tmp_path / "llama.json"
    rc, stdout, stderr = run(BENCH, tmp_path, "--quick", "--batches", "1,16", "--prefill-lens", "256",
                             "--out", str(out), gpu=True, timeout=900)
    print(stdout)
    assert rc == 0, stdout + stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["swap"]["kept"] == {} and report["errors"] == []
    for r in report["results"]:
        assert all(c["ok"] for c in r["checks"]) and r["ratio"] > 0
        if r["phase"] == "decode":
            assert r["variant"] == "graph" and r["logits_rel_diff"] < llama.LOGITS_TOL


@pytest.mark.gpu
def test_the_example_captures_and_matches_torch_on_the_gpu(tmp_path):
    rc, stdout, stderr = run(EXAMPLE, tmp_path, gpu=True, timeout=900)
    print(stdout)
    assert rc == 0, stdout + stderr[-4000:]
    assert "prepared" in stdout and "per step (batch 4)" in stdout
