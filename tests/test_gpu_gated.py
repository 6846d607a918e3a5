"""Gated GEMMs (SwiGLU and its kin) on a GPU: every schedule family the predicate admits for them against the
fp32 reference with NaN-filled outputs, an epilogue after the gating, the torch op (eager, compiled, with
gradients) and GatedMLP against the unfused MLP."""
import math

import pytest
import torch

import gemmc
import gemmc.nn as gnn
import gemmc.torch_ops as gto
from gemmc.reference import error_figures, make_inputs, reference_and_bound
from gemmc.schedule import Schedule, is_valid
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

pytestmark = pytest.mark.gpu

# N = 448 and K = 520: edge tiles along N for 64/96/128/160-wide tiles and a partial last k-tile
N, K = 448, 520
SCHEDULES = [
    Schedule(tile=(128, 128, 64)),
    Schedule(tile=(128, 64, 64), cluster=(2, 1)),
    Schedule(tile=(128, 96, 64), cluster=(1, 2), raster="n", swizzle=8),
    Schedule(tile=(256, 64, 64), cluster=(1, 2)),
    Schedule(tile=(64, 128, 64), mode="pingpong"),
    Schedule(tile=(64, 160, 64), mode="pingpong", cluster=(2, 1)),
    Schedule(tile=(64, 112, 128), mode="pingpong"),
    Schedule(tile=(128, 64, 64), mode="pingpong", pdl=False, stages=3),
]


def run_checked(kernel, spec, m, extra=()):
    a, b, inputs = make_inputs(spec, m, N, K)
    inputs = list(extra) or inputs
    out = torch.full((m, N), math.nan, device="cuda", dtype=torch.bfloat16)
    kernel(a, b, *inputs, out=out)
    ref, bound = reference_and_bound(spec, a, b, inputs)
    return error_figures(out, ref, bound)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.short())
def test_gated_schedules_match_the_reference(schedule):
    spec = GemmSpec(m="M", n=N, k=K, gate="silu", name="swiglu")
    assert is_valid(schedule, spec)
    kernel = gemmc.compile(spec, schedule=schedule)
    for m in (1, 77, 300):
        rel, elem = run_checked(kernel, spec, m)
        assert elem <= 1.0, f"M={m}: {elem:.3g} of the bound (rel {rel:.3g})"


@pytest.mark.parametrize("gate", ["gelu_erf", "gelu_tanh", "relu", "sigmoid"])
def test_each_gate_activation(gate):
    spec = GemmSpec(m="M", n=N, k=K, gate=gate, name=f"g_{gate}")
    kernel = gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 64)))
    rel, elem = run_checked(kernel, spec, 200)
    assert elem <= 1.0, f"{gate}: {elem:.3g} of the bound"


def test_epilogue_runs_on_the_gated_value():
    # out = silu(g) * u * scale + residual (a TMA-staged full input)
    spec = GemmSpec(m="M", n=N, k=K, gate="silu", inputs=(EpilogueInput("scale", "scalar"),
                                                         EpilogueInput("res", "full", "bf16")),
                    epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("scale"))),
                              EpilogueOp("add", (Ref.node(0), Ref.input("res")))), name="swiglu_res")
    kernel = gemmc.compile(spec, schedule="auto")
    for m in (16, 300):
        res = torch.randn(m, N, device="cuda").to(torch.bfloat16)
        rel, elem = run_checked(kernel, spec, m, extra=(0.5, res))
        assert elem <= 1.0, f"M={m}: {elem:.3g} of the bound"


@pytest.mark.parametrize("m", [1, 16, 64, 256, 2048])
def test_auto_gated_at_llama_width(m):
    spec = GemmSpec(m="M", n=1024, k=4096, gate="silu", name="swiglu_auto")
    kernel = gemmc.compile(spec, schedule="auto")
    a, b, _ = make_inputs(spec, m, 1024, 4096)
    out = torch.full((m, 1024), math.nan, device="cuda", dtype=torch.bfloat16)
    kernel(a, b, out=out)
    ref, bound = reference_and_bound(spec, a, b, [])
    assert error_figures(out, ref, bound)[1] <= 1.0


def test_gated_linear_op_eager_compiled_and_grad():
    torch.manual_seed(0)
    x = torch.randn(4, 33, 256, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(2 * 384, 256, device="cuda") / 16).to(torch.bfloat16)
    g, u = torch.nn.functional.linear(x.float(), w.float()).chunk(2, dim=-1)
    want = torch.nn.functional.silu(g) * u
    got = gto.gated_linear(x, w, "silu")
    assert got.shape == (4, 33, 384) and got.dtype == torch.bfloat16
    rel = ((got.float() - want).norm() / want.norm()).item()
    assert rel < 2 * 2.0 ** -8
    compiled = torch.compile(lambda t: gto.gated_linear(t, w, "silu"), fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), got)
    xr = x.clone().requires_grad_(True)
    gto.gated_linear(xr, w, "silu").float().sum().backward()
    xt = x.float().clone().requires_grad_(True)
    gt, ut = torch.nn.functional.linear(xt, w.float()).chunk(2, dim=-1)
    (torch.nn.functional.silu(gt) * ut).sum().backward()
    assert ((xr.grad.float() - xt.grad).norm() / xt.grad.norm()).item() < 4 * 2.0 ** -8


class ToyMLP(torch.nn.Module):
    def __init__(self, hidden=256, inter=768):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=False)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=False)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_gated_mlp_runs_the_gated_kernel_and_matches_the_unfused_mlp(monkeypatch):
    torch.manual_seed(0)
    mlp = ToyMLP().to("cuda", torch.bfloat16)
    fused = gnn.GatedMLP.from_mlp(mlp)
    assert fused.gated_kernel_args == (768, 256, torch.bfloat16, "silu")
    calls = []
    real = gto.gated_linear
    monkeypatch.setattr(gto, "gated_linear", lambda *a: calls.append(a[2]) or real(*a))
    x = torch.randn(3, 40, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got, want = fused(x), mlp(x)
        ref = ToyMLP().to("cuda")
        ref.load_state_dict({k: v.float() for k, v in mlp.state_dict().items()})
        want32 = ref(x.float())
    assert calls == ["silu"]
    err = ((got.float() - want32).norm() / want32.norm()).item()
    err_torch = ((want.float() - want32).norm() / want32.norm()).item()
    assert err <= 2 * err_torch + 2 * 2.0 ** -8
    summary = gnn.prepare(fused, batch_sizes=[1, 16])
    assert any(key.gate == "silu" for key in summary.kernels)


@pytest.mark.parametrize("rows", [1, 16, 17])
def test_decode_sized_calls_route_unfused_and_agree(rows, monkeypatch):
    from gemmc.choose.heuristic import GATED_UNFUSED_MAX_M
    import gemmc.torch_ops.launch as launch
    torch.manual_seed(1)
    x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(2 * 384, 256, device="cuda") / 16).to(torch.bfloat16)
    linear_calls = []
    real = launch.run_linear
    monkeypatch.setattr(launch, "run_linear", lambda *a: linear_calls.append(a[0].shape) or real(*a))
    got = gto.gated_linear(x, w, "silu")
    assert bool(linear_calls) == (rows <= GATED_UNFUSED_MAX_M)
    g, u = torch.nn.functional.linear(x.float(), w.float()).chunk(2, dim=-1)
    want = torch.nn.functional.silu(g) * u
    assert ((got.float() - want).norm() / want.norm()).item() < 4 * 2.0 ** -8
