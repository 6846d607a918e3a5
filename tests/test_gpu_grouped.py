"""Grouped GEMMs on a GPU: both layouts, every schedule family the predicate admits for them, against each group's
fp32 reference with NaN-filled outputs (rows of no group must stay NaN: not written), then CUDA graphs whose
offsets change between replays (no host synchronisation, no recapture) and a 256-expert decode. fp8 with
DeepSeek-V3 block scales: the same against each group's reference of its dequantized operands, the torch op and
`auto` at DeepSeek-V3's expert shapes."""
import math

import pytest
import torch

import gemmc
from gemmc.reference import error_figures, grouped_call_args, grouped_reference_and_bound, make_grouped_inputs
from gemmc.schedule import Schedule, is_valid
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
from gemmc.types import torch_dtype

pytestmark = pytest.mark.gpu

# N = 448 and K = 520: edge tiles along N and a partial last k-tile
N, K = 448, 520
SCHEDULES = [
    Schedule(tile=(128, 128, 64)),
    Schedule(tile=(128, 256, 64), cluster=(2, 1)),
    Schedule(tile=(256, 128, 64), cluster=(1, 2)),
    Schedule(tile=(128, 64, 64), cluster=(2, 2), raster="n"),
    Schedule(tile=(64, 128, 64), mode="pingpong"),
    Schedule(tile=(128, 128, 64), mode="pingpong", cluster=(2, 1), raster="n"),
    Schedule(tile=(64, 96, 128), mode="pingpong", pdl=False, stages=3),
]
# rows per group: empty groups, single rows, a group past one tile, one past several
ROWS = [0, 1, 130, 0, 0, 7, 300, 64, 0, 1, 257]


def run_checked(kernel, spec, rows, m=None, extra=None):
    a, b, groups, inputs = make_grouped_inputs(spec, rows, N, spec.k, m=m)
    inputs = inputs if extra is None else extra
    out = torch.full(a.shape[:-1] + (N,), math.nan, device="cuda", dtype=torch_dtype(spec.out_dtype))
    kernel(*grouped_call_args(spec, a, b, groups, inputs), out=out)
    torch.cuda.synchronize()
    ref, bound = grouped_reference_and_bound(spec, a, b, groups, inputs)
    return error_figures(out, ref, bound)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.short())
def test_grouped_schedules_match_each_groups_reference(layout, schedule):
    spec = GemmSpec(m="M", n=N, k=K, groups="E", group_layout=layout, name=f"grouped_{layout}")
    assert is_valid(schedule, spec)
    kernel = gemmc.compile(spec, schedule=schedule)
    # contiguous: 9 rows past the last group stay unwritten; masked: M above the largest group
    rel, elem = run_checked(kernel, spec, ROWS, m=sum(ROWS) + 9 if layout == "contiguous" else 320)
    assert elem <= 1.0, f"{elem:.3g} of the bound (rel {rel:.3g}); NaN: a row of no group was written"
    rel, elem = run_checked(kernel, spec, [3])      # one group, one partial tile
    assert elem <= 1.0


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_gated_grouped_swiglu(layout):
    spec = GemmSpec(m="M", n=N, k=K, groups=len(ROWS), group_layout=layout, gate="silu", name=f"swiglu_{layout}")
    for schedule in (Schedule(tile=(128, 128, 64), cluster=(2, 1)), Schedule(tile=(64, 128, 64), mode="pingpong")):
        rel, elem = run_checked(gemmc.compile(spec, schedule=schedule), spec, ROWS)
        assert elem <= 1.0, f"{schedule.short()}: {elem:.3g} of the bound"


def test_scalar_epilogue_and_f32_output():
    spec = GemmSpec(m="M", n=N, k=K, groups="E", group_layout="contiguous", out_dtype="f32",
                    inputs=(EpilogueInput("alpha", "scalar"),),
                    epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))), EpilogueOp("silu", (Ref.node(0),))),
                    name="grouped_epi")
    kernel = gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 64)))
    a, b, groups, _ = make_grouped_inputs(spec, ROWS, N, K)
    out = torch.full((a.shape[0], N), math.nan, device="cuda", dtype=torch.float32)
    kernel(a, b, groups, 0.75, out=out)
    ref, bound = grouped_reference_and_bound(spec, a, b, groups, [0.75])
    assert error_figures(out, ref, bound)[1] <= 1.0


def test_a_cuda_graph_follows_offsets_written_on_the_device():
    """The router writes new offsets into the same tensor between replays: the captured launch reads them on the
    device (no host copy, no recapture) and computes the new grouping."""
    spec = GemmSpec(m="M", n=N, k=K, groups=8, group_layout="contiguous", name="graph_grouped")
    kernel = gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 64), cluster=(2, 1)))
    a, b, groups, _ = make_grouped_inputs(spec, [40] * 8, N, K)
    out = torch.empty(a.shape[0], N, device="cuda", dtype=torch.bfloat16)
    kernel(a, b, groups, out=out)               # loads the kernel before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(a, b, groups, out=out)
    for rows in ([40] * 8, [0, 0, 320, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 292], [0] * 7 + [320]):
        groups.copy_(torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref, bound = grouped_reference_and_bound(spec, a, b, groups, [])
        assert error_figures(out, ref, bound)[1] <= 1.0, rows


def test_decode_over_256_experts_and_the_debug_check(monkeypatch):
    """One token routed to 8 of 256 experts (7 windows of empty groups before the last), masked and contiguous;
    GEMMC_VALIDATE=1 reads the offsets back and refuses unsorted ones."""
    rows = [0] * 256
    for g in (3, 17, 40, 41, 128, 200, 254, 255):
        rows[g] = 1
    for layout in ("contiguous", "masked"):
        spec = GemmSpec(m="M", n=N, k=K, groups=256, group_layout=layout, name=f"decode_{layout}")
        kernel = gemmc.compile(spec, schedule=Schedule(tile=(64, 128, 64), mode="pingpong"))
        rel, elem = run_checked(kernel, spec, rows)
        assert elem <= 1.0, f"{layout}: {elem:.3g} of the bound"
    monkeypatch.setenv("GEMMC_VALIDATE", "1")
    spec = GemmSpec(m="M", n=N, k=K, groups=256, group_layout="contiguous", name="decode_checked")
    kernel = gemmc.compile(spec, schedule=Schedule(tile=(64, 128, 64), mode="pingpong"))
    a, b, groups, _ = make_grouped_inputs(spec, rows, N, K)
    groups[5] = 7
    with pytest.raises(gemmc.LaunchError, match="unsorted"):
        kernel(a, b, groups)


def test_the_torch_op_eager_compiled_and_in_a_graph():
    import gemmc.torch_ops as gto
    rows = [5, 0, 130, 1, 64]
    spec = GemmSpec(m="M", n=N, k=K, groups="E", group_layout="contiguous", gate="silu")
    a, b, groups, _ = make_grouped_inputs(spec, rows, N, K)
    ref, bound = grouped_reference_and_bound(spec, a, b, groups, [])
    y = gto.grouped_gemm(a, b, groups, gate="silu")
    assert error_figures(y, ref, bound)[1] <= 1.0
    compiled = torch.compile(lambda x, w, o: gto.grouped_gemm(x, w, o, gate="silu"), fullgraph=True, dynamic=True)
    assert error_figures(compiled(a, b, groups), ref, bound)[1] <= 1.0
    graph, static_out = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        static_out = gto.grouped_gemm(a, b, groups, gate="silu")
    static_out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert error_figures(static_out, ref, bound)[1] <= 1.0


# ---- fp8 with block scales --------------------------------------------------------------------------

K_FP8 = 528     # a partial last k-tile of 16 (fp8 rows are 16-byte aligned at 16 elements)
FP8_SCHEDULES = [
    Schedule(tile=(128, 128, 128)),
    Schedule(tile=(128, 128, 128), cluster=(2, 1)),
    Schedule(tile=(128, 64, 128), cluster=(1, 2), raster="n"),
    Schedule(tile=(256, 64, 128)),
    Schedule(tile=(64, 128, 128), mode="pingpong"),
    Schedule(tile=(64, 64, 128), mode="pingpong", cluster=(2, 1), pdl=False, stages=3),
]


def grouped_fp8(layout, groups="E", b_dtype="f8e4m3", **kw):
    return GemmSpec(m="M", n=N, k=K_FP8, dtype="f8e4m3", b_dtype=b_dtype, scaling="block", groups=groups,
                    group_layout=layout, name=f"grouped_fp8_{layout}", **kw)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
@pytest.mark.parametrize("schedule", FP8_SCHEDULES, ids=lambda s: s.short())
def test_block_scaled_grouped_schedules_match_each_groups_dequantized_reference(layout, schedule):
    spec = grouped_fp8(layout)
    assert is_valid(schedule, spec)
    kernel = gemmc.compile(spec, schedule=schedule)
    rel, elem = run_checked(kernel, spec, ROWS, m=sum(ROWS) + 9 if layout == "contiguous" else 320)
    assert elem <= 1.0, f"{elem:.3g} of the bound (rel {rel:.3g}); NaN: a row of no group was written"
    rel, elem = run_checked(kernel, spec, [3])
    assert elem <= 1.0


def test_block_scaled_grouped_e5m2_weights_a_scalar_epilogue_and_the_256_expert_decode():
    spec = grouped_fp8("contiguous", b_dtype="f8e5m2", out_dtype="f32", inputs=(EpilogueInput("alpha", "scalar"),),
                       epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))),))
    rel, elem = run_checked(gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 128))), spec, ROWS)
    assert elem <= 1.0, f"{elem:.3g} of the bound"
    rows = [0] * 256
    for g in (3, 17, 40, 41, 128, 200, 254, 255):
        rows[g] = 1
    for layout in ("contiguous", "masked"):
        spec = grouped_fp8(layout, groups=256)
        kernel = gemmc.compile(spec, schedule=Schedule(tile=(64, 128, 128), mode="pingpong"))
        assert run_checked(kernel, spec, rows)[1] <= 1.0, layout


def test_block_scaled_grouped_in_a_cuda_graph_follows_new_offsets():
    spec = grouped_fp8("contiguous", groups=8)
    kernel = gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 128), cluster=(2, 1)))
    a, b, groups, extra = make_grouped_inputs(spec, [40] * 8, N, K_FP8)
    args = grouped_call_args(spec, a, b, groups, extra)
    out = torch.empty(a.shape[0], N, device="cuda", dtype=torch.bfloat16)
    kernel(*args, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(*args, out=out)
    for rows in ([40] * 8, [0, 0, 320, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 292]):
        groups.copy_(torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert error_figures(out, *grouped_reference_and_bound(spec, a, b, groups, extra))[1] <= 1.0, rows


@pytest.mark.parametrize("proj", ["up", "down"])
def test_deepseek_v3_experts_in_fp8_under_auto_and_the_torch_op(proj):
    """DeepSeek-V3's expert shapes (256 experts, hidden 7168, width 2048; up: the [gate; up] product), routed
    top-8: auto's kernel at decode and prefill sizes, and torch.ops.gemmc.grouped_scaled_gemm."""
    import gemmc.torch_ops as gto
    from gemmc.bench.moe import model, offsets_of, route, spec_of
    mdl = model("deepseek-v3")
    spec = spec_of(mdl, proj, scaling="block")
    kernel = gemmc.compile(spec, schedule="auto")
    for tokens in (1, 512):
        counts = route(tokens, mdl.experts, mdl.top_k, "zipf", seed=1)
        a, b, groups, extra = make_grouped_inputs(spec, [int(c) for c in counts], spec.n, spec.k)
        assert torch.equal(groups.cpu(), torch.tensor(offsets_of(counts)))
        out = torch.full((a.shape[0], spec.n), math.nan, device="cuda", dtype=torch.bfloat16)
        kernel(*grouped_call_args(spec, a, b, groups, extra), out=out)
        ref, bound = grouped_reference_and_bound(spec, a, b, groups, extra)
        assert error_figures(out, ref, bound)[1] <= 1.0, tokens
        y = gto.grouped_scaled_gemm(a, b, *extra, groups)
        assert error_figures(y, ref, bound)[1] <= 1.0, tokens
