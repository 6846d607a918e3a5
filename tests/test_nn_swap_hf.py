"""swap_linears on a small Hugging Face LlamaForCausalLM (random init, no download) on the CPU: which layers
swap, the one warning for the kept ones, filters, fuse_mlp, state_dict round trips with a fresh HF model, and
logits / gradients against the original model. CPU layers run gemmc's op (its torch reference) via allow_cpu."""
import copy
import io
import warnings

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

import gemmc.nn as gnn  # noqa: E402
from gemmc.errors import PerformanceWarning  # noqa: E402

LAYERS = 2
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_LINEARS = sorted([f"model.layers.{i}.self_attn.{p}" for i in range(LAYERS) for p in ATTN]
                     + [f"model.layers.{i}.mlp.{p}" for i in range(LAYERS) for p in MLP] + ["lm_head"])
# Logits of the swapped bf16 model against the original's: gemmc's op rounds each GEMM once from f32 as torch's
# CPU bf16 GEMM does, so they differ by at most a few bf16 ulps carried through two layers.
LOGITS_RTOL = 2e-2


def tiny_llama(seed=0, dtype=torch.bfloat16):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def with_unaligned_extra(model):
    """The model plus a Linear gemmc cannot run (N = 33 breaks 16-byte alignment), not used by forward."""
    model.extra = nn.Linear(64, 33, dtype=model.dtype)
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def assert_logits_close(got, want, rtol=LOGITS_RTOL):
    rel = (got - want).norm() / want.norm()
    assert rel <= rtol, f"relative logits difference {rel:.3g} > {rtol}"


def swap_quietly(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return gnn.swap_linears(model, allow_cpu=True, **kwargs)


IDS = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))


def test_swap_llama_keeps_the_unaligned_layer_with_one_warning_and_matches_logits():
    model = with_unaligned_extra(tiny_llama())
    want = logits(model, IDS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gnn.swap_linears(model, allow_cpu=True)
    assert len(caught) == 1 and issubclass(caught[0].category, PerformanceWarning)
    message = str(caught[0].message)
    assert "1 Linear layers keep torch's path" in message and "  - extra: " in message and "33" in message
    assert sorted(report.swapped) == ALL_LINEARS and list(report.kept) == ["extra"]
    assert type(model.extra) is nn.Linear
    assert all(isinstance(model.get_submodule(n), gnn.Linear) for n in ALL_LINEARS)
    # one kernel per (N, K): q/o share [64, 64], k/v share [32, 64], gate/up share [128, 64]
    shapes = {(k.n, k.k): len(names) for k, names in report.kernels.items()}
    assert shapes == {(64, 64): 4, (32, 64): 4, (128, 64): 4, (64, 128): 2, (256, 64): 1}
    assert_logits_close(logits(model, IDS), want)


def test_cpu_llama_without_allow_cpu_stays_torch_with_one_warning():
    model = tiny_llama()
    want = logits(model, IDS)
    with pytest.warns(PerformanceWarning, match="Move the model to CUDA") as caught:
        report = gnn.swap_linears(model, fuse_mlp=True)
    assert len(caught) == 1 and report.swapped == [] and report.fused_mlps == []
    assert sorted(report.kept) == ALL_LINEARS and not report.unfused_mlps
    assert not any(isinstance(m, (gnn.Linear, gnn.GatedMLP)) for m in model.modules())
    assert torch.equal(logits(model, IDS), want)


def test_include_and_exclude_filters():
    model = tiny_llama()
    report = swap_quietly(model, include="*.mlp.*")
    assert sorted(report.swapped) == sorted(n for n in ALL_LINEARS if ".mlp." in n)
    assert sorted(report.filtered) == sorted(n for n in ALL_LINEARS if ".mlp." not in n)
    model = tiny_llama()
    report = swap_quietly(model, exclude=["lm_head", "*.k_proj", "*.v_proj"])
    assert sorted(report.filtered) == sorted(n for n in ALL_LINEARS if n == "lm_head" or n[-6:] in ("k_proj", "v_proj"))
    assert type(model.lm_head) is nn.Linear and isinstance(model.model.layers[1].self_attn.q_proj, gnn.Linear)
    model = tiny_llama()
    report = swap_quietly(model, include=lambda name, mod: name.startswith("model.layers.1."), exclude="*o_proj")
    assert sorted(report.swapped) == sorted(f"model.layers.1.{p}" for p in
                                            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])


def test_fuse_mlp_matches_unfused_and_round_trips_state_dict_with_fresh_hf_models():
    original = tiny_llama()
    unfused = copy.deepcopy(original)
    swap_quietly(unfused)
    fused = copy.deepcopy(original)
    report = swap_quietly(fused, fuse_mlp=True)
    mlps = [f"model.layers.{i}.mlp" for i in range(LAYERS)]
    assert report.fused_mlps == mlps and all(isinstance(fused.get_submodule(n), gnn.GatedMLP) for n in mlps)
    assert {f"{n}.gate_up_proj" for n in mlps} <= set(report.swapped)
    # lm_head shares [256, 64]; (128, 64) is the MLPs' gated kernel (N = intermediate 128 outputs)
    assert {(k.n, k.k) for k in report.kernels} == {(64, 64), (32, 64), (256, 64), (64, 128), (128, 64)}
    assert [k.gate for k in report.kernels if k.gate is not None] == ["silu"]
    # The fused GEMM computes each gate/up column as the unfused GEMMs do.
    torch.testing.assert_close(logits(fused, IDS), logits(unfused, IDS), rtol=1e-2, atol=1e-2)
    assert_logits_close(logits(fused, IDS), logits(original, IDS))

    keys = list(original.state_dict())
    assert list(fused.state_dict()) == keys
    fresh = tiny_llama(seed=1)
    fresh.load_state_dict(fused.state_dict(), strict=True)               # swapped -> a fresh HF model
    assert torch.equal(logits(fresh, IDS), logits(original, IDS))
    checkpoint = tiny_llama(seed=2)
    fused.load_state_dict(checkpoint.state_dict(), strict=True)          # an HF checkpoint -> the swapped model
    assert_logits_close(logits(fused, IDS), logits(checkpoint, IDS))
    buf = io.BytesIO()
    torch.save(fused.state_dict(), buf)
    buf.seek(0)
    fresh = tiny_llama(seed=3)
    fresh.load_state_dict(torch.load(buf), strict=True)
    assert torch.equal(logits(fresh, IDS), logits(checkpoint, IDS))


def test_fuse_mlp_respects_filters_and_leaves_layers_gemmc_cannot_run():
    model = tiny_llama()
    report = swap_quietly(model, fuse_mlp=True, exclude="model.layers.0.mlp.up_proj")
    assert report.fused_mlps == ["model.layers.1.mlp"]
    assert isinstance(model.model.layers[0].mlp.gate_proj, gnn.Linear)
    assert type(model.model.layers[0].mlp.up_proj) is nn.Linear
    model = tiny_llama(dtype=torch.float32)
    with pytest.warns(PerformanceWarning, match="cast the model first"):
        report = gnn.swap_linears(model, fuse_mlp=True, allow_cpu=True)
    assert report.fused_mlps == [] and not report.unfused_mlps and sorted(report.kept) == ALL_LINEARS


def test_gradients_of_the_swapped_fused_model_match_the_original():
    original = tiny_llama()
    swapped = copy.deepcopy(original)
    swap_quietly(swapped, fuse_mlp=True)
    for model in (original, swapped):
        model.train()
        model(IDS, labels=IDS).loss.backward()
    mlp, ref = swapped.model.layers[0].mlp, original.model.layers[0].mlp
    grad = mlp.gate_up_proj.weight.grad.float()
    for got, want in ((grad[:128], ref.gate_proj.weight.grad), (grad[128:], ref.up_proj.weight.grad),
                      (mlp.down_proj.weight.grad, ref.down_proj.weight.grad),
                      (swapped.model.layers[1].self_attn.q_proj.weight.grad,
                       original.model.layers[1].self_attn.q_proj.weight.grad)):
        want = want.float()
        assert (got.float() - want).norm() <= 3e-2 * want.norm()
