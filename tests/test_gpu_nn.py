"""gemmc.nn on a GPU: a tiny bf16 Llama swapped onto gemmc kernels against torch's logits, and prepare followed
by a manual CUDA-graph capture (nothing builds or loads during capture, replays match eager)."""
import copy
import warnings

import pytest
import torch
from torch import nn

import gemmc.nn as gnn
import gemmc.torch_ops as gto

pytestmark = pytest.mark.gpu

# The bf16 tolerance, as gemmc.torch_ops states it per GEMM, applied to the logits: with err(R) = ||R - R32|| /
# ||R32|| (Frobenius) against the same model run in fp32 from the same bf16 weights, the swapped model's err is
# at most 2 err(torch's bf16 model) + 2u, u = 2^-8. Both accumulate in f32 and round each GEMM once; they differ
# by summation order and a rounding step or two. (On this tiny model err(torch) is about 0.5%.)
BF16_U = 2.0 ** -8
# A replayed graph runs the same kernels on the same inputs as the eager call: equal up to far below an ulp.
REPLAY_RTOL = 1e-3


def tiny_llama_cuda(seed=0):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=128, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def rel_diff(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits.float()


def assert_within_bf16_tolerance(got, torch_bf16, fp32):
    err, err_torch = rel_diff(got, fp32), rel_diff(torch_bf16, fp32)
    assert err <= 2 * err_torch + 2 * BF16_U, f"err {err:.4g} > 2 * {err_torch:.4g} + 2u"


def count_gemmc_calls(monkeypatch):
    """Every call of gemmc's Linear op and of its gated op (a fused MLP's [gate; up] layer), by weight shape."""
    calls = []
    for name in ("linear", "gated_linear"):
        real = getattr(gto, name)

        def counted(*args, _real=real, **kwargs):
            calls.append(args[1].shape)
            return _real(*args, **kwargs)
        monkeypatch.setattr(gto, name, counted)
    return calls


@pytest.mark.parametrize("fuse_mlp", [False, True])
def test_swapped_llama_logits_match_torch_in_bf16(fuse_mlp, monkeypatch):
    model = tiny_llama_cuda()
    ref = copy.deepcopy(model)
    fp32 = copy.deepcopy(model).float()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = gnn.swap_linears(model, fuse_mlp=fuse_mlp)
    assert not report.kept and len(report.swapped) == (13 if fuse_mlp else 15)
    calls = count_gemmc_calls(monkeypatch)
    for batch, seq in [(1, 1), (4, 1), (2, 33), (1, 128)]:
        ids = torch.randint(0, 512, (batch, seq), device="cuda")
        assert_within_bf16_tolerance(logits(model, ids), logits(ref, ids), logits(fp32, ids))
    assert len(calls) == 4 * len(report.swapped)       # every swapped layer ran gemmc's op on every forward


def test_prepare_then_cuda_graph_capture_of_a_swapped_llama_replays(count_compiles):
    model = tiny_llama_cuda()
    ref = copy.deepcopy(model)
    fp32 = copy.deepcopy(model).float()
    gnn.swap_linears(model, fuse_mlp=True)
    batch, seq = 2, 8
    summary = gnn.prepare(model, batch_sizes=[batch * seq])
    # q/k/v/o, [gate; up] and down_proj Linear kernels, and the MLP's gated kernel
    assert len(summary.kernels) == 5 and summary.row_counts == [16] and not summary.skipped
    static_ids = torch.randint(0, 512, (batch, seq), device="cuda")
    # Warm torch's own parts (cuBLAS handles, attention) with the torch model; the gemmc layers are never
    # called before capture, so only prepare can have loaded their kernels.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            ref(static_ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(side)
    compiled_before = len(count_compiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_logits = model(static_ids, use_cache=False).logits
    assert len(count_compiles) == compiled_before
    for seed in range(3):
        ids = torch.randint(0, 512, (batch, seq), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        static_ids.copy_(ids)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_diff(static_logits, logits(model, ids)) <= REPLAY_RTOL
        assert_within_bf16_tolerance(static_logits, logits(ref, ids), logits(fp32, ids))


def test_prepare_then_capture_one_graph_per_batch_size(count_compiles):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to("cuda", torch.bfloat16)
    model[0] = gnn.Linear.from_linear(model[0], activation="gelu")
    model[1] = nn.Identity()
    gnn.swap_linears(model)
    fp32 = copy.deepcopy(model).float()         # its gemmc layers run torch's path in f32
    sizes = [1, 5, 16, 64]
    summary = gnn.prepare(model, batch_sizes=sizes)
    assert summary.row_counts == sizes and summary.layers == 2
    compiled_before = len(count_compiles)
    graphs = {}
    for m in sizes:
        x = torch.zeros(m, 256, device="cuda", dtype=torch.bfloat16)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            y = model(x)
        graphs[m] = (graph, x, y)
    assert len(count_compiles) == compiled_before
    for m, (graph, x, y) in graphs.items():
        x.copy_(torch.randn(m, 256, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert rel_diff(y, model(x)) <= REPLAY_RTOL, m
            assert rel_diff(y, fp32(x.float())) <= 4 * BF16_U, m     # two GEMMs, each rounded once
