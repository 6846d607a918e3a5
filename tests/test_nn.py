"""gemmc.nn on the CPU: Linear against torch.nn.Linear (outputs, gradients, state_dict, routing and its cache),
GatedMLP's fusion and state_dict keys, swap_linears on plain torch models, and prepare's bookkeeping.
CPU layers reach gemmc's op only with allow_cpu=True, where the op runs its torch reference."""
import copy
import io
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import gemmc.nn as gnn
import gemmc.torch_ops as gto
from gemmc.errors import PerformanceWarning, SpecError
from gemmc.nn.gated_mlp import fusion_problem, recognize_activation

ACTS = {"none": lambda y: y, "relu": F.relu, "gelu": F.gelu,
        "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu}
# bf16 through gemmc's op (f32 accumulation, one rounding) against torch's bf16 F.linear: a few bf16 ulps.
BF16_RTOL, BF16_ATOL = 2e-2, 2e-2


def close_bf16(got, want):
    torch.testing.assert_close(got.float(), want.float(), rtol=BF16_RTOL, atol=BF16_ATOL * want.abs().max().item())


class CountCalls:
    """Wraps a gemmc.torch_ops function and counts its calls."""

    def __init__(self, monkeypatch, name):
        self.calls = []
        real = getattr(gto, name)

        def counted(*args, **kwargs):
            self.calls.append((args, kwargs))
            return real(*args, **kwargs)
        monkeypatch.setattr(gto, name, counted)


# --- Linear: outputs and gradients ---------------------------------------------------------------------------

@settings(max_examples=25)
@given(k=st.sampled_from([8, 16, 24, 33]), n=st.sampled_from([8, 40, 7]), bias=st.booleans(),
       act=st.sampled_from(sorted(ACTS)), lead=st.sampled_from([(3,), (2, 5), ()]))
def test_linear_torch_path_equals_nn_linear(k, n, bias, act, lead):
    """An f32 CPU layer runs torch's path: outputs and gradients equal nn.Linear's followed by the activation."""
    torch.manual_seed(0)
    ref = nn.Linear(k, n, bias=bias)
    layer = gnn.Linear.from_linear(copy.deepcopy(ref), activation=act)
    assert layer.fallback_reason is not None
    x = torch.randn(*lead, k, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, want = layer(x), ACTS[act](ref(x2))
    assert torch.equal(y, want)
    y.sum().backward()
    want.sum().backward()
    assert torch.equal(x.grad, x2.grad)
    assert torch.equal(layer.weight.grad, ref.weight.grad)
    if bias:
        assert torch.equal(layer.bias.grad, ref.bias.grad)


@settings(max_examples=25)
@given(k=st.sampled_from([16, 64, 24, 33]), n=st.sampled_from([8, 48, 20]), bias=st.booleans(),
       act=st.sampled_from(sorted(ACTS)), m=st.integers(1, 9))
def test_linear_bf16_allow_cpu_runs_gemmc_op_where_aligned(k, n, bias, act, m):
    """A bf16 layer with allow_cpu runs gemmc's op (its CPU reference) iff N and K are 16-byte aligned, and
    matches torch's bf16 output and gradients within bf16 tolerance either way."""
    torch.manual_seed(1)
    ref = nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    layer = gnn.Linear.from_linear(copy.deepcopy(ref), activation=act, allow_cpu=True)
    assert (layer.fallback_reason is None) == (k % 8 == 0 and n % 8 == 0)
    x = torch.randn(m, k, dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, want = layer(x), ACTS[act](ref(x2))
    assert y.dtype == torch.bfloat16 and y.shape == want.shape
    close_bf16(y, want)
    grad = torch.randn_like(want)
    y.backward(grad)
    want.backward(grad)
    close_bf16(x.grad, x2.grad)
    close_bf16(layer.weight.grad, ref.weight.grad)


def test_forward_calls_gemmc_op_only_when_gemmc_can_run_it(monkeypatch):
    linear = CountCalls(monkeypatch, "linear")
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    gnn.Linear(16, 32, dtype=torch.bfloat16)(x)                       # CPU, no allow_cpu: torch's path
    gnn.Linear(16, 33, dtype=torch.bfloat16, allow_cpu=True)(x)       # unaligned N: torch's path
    gnn.Linear(16, 32, allow_cpu=True)(x.float())                     # f32: torch's path
    assert linear.calls == []
    layer = gnn.Linear(16, 32, dtype=torch.bfloat16, activation="silu", allow_cpu=True)
    layer(x)
    (args, kwargs), = linear.calls
    assert args[1] is layer.weight and args[2] is layer.bias and "silu" in list(args) + list(kwargs.values())


def test_input_of_another_dtype_takes_torch_path_so_autocast_works(monkeypatch):
    linear = CountCalls(monkeypatch, "linear")
    torch.manual_seed(2)
    ref = nn.Linear(16, 32, dtype=torch.bfloat16)
    layer = gnn.Linear.from_linear(ref, allow_cpu=True)
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer(x), ref(x))
    assert linear.calls == []


def test_route_is_cached_and_remade_when_dtype_or_device_changes(monkeypatch):
    """The forward asks gemmc.torch_ops.unsupported_reason only after the parameters moved, changed dtype or
    were reassigned (or activation / allow_cpu changed); otherwise the route is cached."""
    reason = CountCalls(monkeypatch, "unsupported_reason")
    linear = CountCalls(monkeypatch, "linear")
    layer = gnn.Linear(16, 32, dtype=torch.bfloat16, allow_cpu=True)
    x = torch.randn(2, 16, dtype=torch.bfloat16)

    def forward_asks(inp=x):
        asked, ran = len(reason.calls), len(linear.calls)
        layer(inp)
        return len(reason.calls) > asked, len(linear.calls) > ran    # (route re-decided, gemmc's op ran)

    assert forward_asks() == (False, True)
    assert forward_asks() == (False, True)
    layer.float()                                                      # nn.Module._apply, new dtype
    assert forward_asks(x.float()) == (True, False)
    assert forward_asks(x.float()) == (False, False)
    layer.weight.data = layer.weight.data.to(torch.bfloat16)           # behind nn.Module's back
    layer.bias.data = layer.bias.data.to(torch.bfloat16)
    assert forward_asks() == (True, True)
    layer.to("meta")                                                   # same dtype, another device
    assert forward_asks(x.to("meta")) == (True, False)
    layer.to_empty(device="cpu")
    assert forward_asks() == (True, True)
    layer.load_state_dict({k: v.float() for k, v in layer.state_dict().items()}, assign=True)
    assert layer.weight.dtype == torch.float32 and forward_asks(x.float()) == (True, False)
    layer.weight = nn.Parameter(torch.randn(32, 16, dtype=torch.bfloat16))
    layer.bias = nn.Parameter(torch.randn(32, dtype=torch.bfloat16))
    assert forward_asks() == (True, True) and layer.fallback_reason is None
    layer.allow_cpu = False
    assert forward_asks() == (True, False) and "cuda" in layer.fallback_reason.lower()
    layer.allow_cpu = True
    layer.activation = "relu"
    assert forward_asks() == (True, True)


# --- Linear: parameters, state_dict, construction -------------------------------------------------------------

def test_state_dict_round_trips_both_ways_and_isinstance_holds():
    torch.manual_seed(3)
    ref = nn.Linear(24, 40)
    layer = gnn.Linear(24, 40, activation="gelu")
    assert isinstance(layer, nn.Linear)
    assert list(layer.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    layer.load_state_dict(ref.state_dict(), strict=True)
    assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias)
    fresh = nn.Linear(24, 40)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf), strict=True)
    assert torch.equal(fresh.weight, ref.weight)
    no_bias = gnn.Linear(24, 40, bias=False)
    assert list(no_bias.state_dict()) == ["weight"] and no_bias.bias is None


def test_from_linear_shares_parameters():
    torch.manual_seed(4)
    lin = nn.Linear(16, 8)
    layer = gnn.Linear.from_linear(lin, activation="relu")
    assert layer.weight is lin.weight and layer.bias is lin.bias
    assert (layer.in_features, layer.out_features) == (16, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    x = torch.randn(5, 16)
    before = layer(x)
    layer(x).square().sum().backward()                 # gradients land on lin's Parameters
    opt.step()
    assert not torch.equal(layer(x), before)
    assert torch.equal(layer(x), F.relu(lin(x)))
    lin.eval()
    assert gnn.Linear.from_linear(lin).training is False
    no_bias = gnn.Linear.from_linear(nn.Linear(16, 8, bias=False))
    assert no_bias.bias is None and list(no_bias.state_dict()) == ["weight"]


def test_device_and_dtype_factory_kwargs_and_meta():
    layer = gnn.Linear(16, 8, device="meta", dtype=torch.float16)
    assert layer.weight.device.type == "meta" and layer.weight.dtype == torch.float16
    assert layer.fallback_reason is not None


@pytest.mark.parametrize("act", ["tanh", "GELU", None, "swiglu"])
def test_bad_activation_is_a_spec_error_naming_the_choices(act):
    with pytest.raises(SpecError, match="activation .* is not one of .*'gelu_tanh'"):
        gnn.Linear(8, 8, activation=act)
    with pytest.raises(SpecError, match="not one of"):
        gnn.Linear.from_linear(nn.Linear(8, 8), activation=act)
    layer = gnn.Linear(8, 8)
    with pytest.raises(SpecError, match="not one of"):
        layer.activation = act
    assert layer.activation == "none"


def test_from_linear_takes_only_a_linear():
    with pytest.raises(TypeError, match="takes a torch.nn.Linear, got Conv1d"):
        gnn.Linear.from_linear(nn.Conv1d(4, 4, 1))


def test_activation_setter_changes_the_output():
    torch.manual_seed(5)
    layer = gnn.Linear(8, 8)
    x = torch.randn(3, 8)
    plain = layer(x)
    layer.activation = "silu"
    assert torch.equal(layer(x), F.silu(plain))


def test_extra_repr_names_activation_and_path():
    text = repr(gnn.Linear(16, 33, bias=False, dtype=torch.bfloat16, activation="gelu_tanh", allow_cpu=True))
    assert "in_features=16, out_features=33, bias=False, activation='gelu_tanh', runs=torch (" in text
    assert "runs=gemmc" in repr(gnn.Linear(16, 32, dtype=torch.bfloat16, allow_cpu=True))


def test_pickle_and_deepcopy_keep_behaviour():
    torch.manual_seed(6)
    layer = gnn.Linear(8, 16, activation="gelu_tanh")
    x = torch.randn(2, 8)
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert torch.equal(other(x), layer(x)) and other.activation == "gelu_tanh"


def test_torch_compile_fullgraph_dynamic_traces_the_layer():
    """No graph break through the routing check, with gemmc's op (allow_cpu) and with torch's path."""
    torch.manual_seed(7)
    for layer in (gnn.Linear(16, 32, dtype=torch.bfloat16, activation="silu", allow_cpu=True),
                  gnn.Linear(16, 33, dtype=torch.bfloat16, activation="silu", allow_cpu=True)):
        compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
        for m in (3, 5, 17):
            x = torch.randn(m, 16, dtype=torch.bfloat16)
            close_bf16(compiled(x), layer(x))


# --- GatedMLP ---------------------------------------------------------------------------------------------------

class ToyMLP(nn.Module):
    """The Llama MLP's shape: down(act(gate(x)) * up(x))."""

    def __init__(self, h=16, i=24, act=None, bias=False, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=bias, dtype=dtype)
        self.up_proj = nn.Linear(h, i, bias=bias, dtype=dtype)
        self.down_proj = nn.Linear(i, h, bias=bias, dtype=dtype)
        self.act_fn = act if act is not None else nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ScaledMLP(ToyMLP):
    def forward(self, x):
        return 2 * super().forward(x)


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


@pytest.mark.parametrize("act, name", [(nn.SiLU(), "silu"), (nn.GELU(), "gelu"), (nn.GELU("tanh"), "gelu_tanh"),
                                       (nn.ReLU(), "relu"), (F.silu, "silu"), (QuickGELU(), None),
                                       (nn.PReLU(), None), (nn.Tanh(), None), (lambda x: x[:1], None)])
def test_recognize_activation_on_a_probe(act, name):
    assert recognize_activation(act) == name


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", [nn.SiLU(), nn.GELU("tanh")])
def test_gated_mlp_equals_the_unfused_mlp_and_keeps_its_state_dict_keys(bias, act):
    torch.manual_seed(8)
    mlp = ToyMLP(act=act, bias=bias)
    fused = gnn.GatedMLP.from_mlp(mlp)
    assert tuple(fused.gate_up_proj.weight.shape) == (48, 16) and fused.down_proj is mlp.down_proj
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(fused(x), mlp(x), rtol=1e-6, atol=1e-6)
    assert list(fused.state_dict()) == list(mlp.state_dict())
    fresh = ToyMLP(act=act, bias=bias)
    fresh.load_state_dict(fused.state_dict(), strict=True)
    torch.testing.assert_close(fresh(x), mlp(x), rtol=1e-6, atol=1e-6)
    other = ToyMLP(act=act, bias=bias)
    fused.load_state_dict(other.state_dict(), strict=True)        # an unfused checkpoint loads into the fused MLP
    torch.testing.assert_close(fused(x), other(x), rtol=1e-6, atol=1e-6)


def test_gated_mlp_state_dict_is_views_and_keep_vars_gives_views_of_the_parameter():
    fused = gnn.GatedMLP.from_mlp(ToyMLP())
    sd = fused.state_dict()
    w = fused.gate_up_proj.weight
    assert sd["gate_proj.weight"].data_ptr() == w.data_ptr()
    assert torch.equal(torch.cat([sd["gate_proj.weight"], sd["up_proj.weight"]]), w.detach())
    kept = fused.state_dict(keep_vars=True)
    assert kept["up_proj.weight"].requires_grad


def test_gated_mlp_gradients_reach_the_fused_parameter():
    torch.manual_seed(9)
    mlp = ToyMLP()
    fused = gnn.GatedMLP.from_mlp(copy.deepcopy(mlp))
    x = torch.randn(4, 16)
    mlp(x).sum().backward()
    fused(x).sum().backward()
    grad = fused.gate_up_proj.weight.grad
    torch.testing.assert_close(grad[:24], mlp.gate_proj.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad[24:], mlp.up_proj.weight.grad, rtol=1e-5, atol=1e-6)


def test_fusion_problems_are_named():
    assert fusion_problem(ToyMLP()) == ("silu", None)
    assert "act_fn (QuickGELU)" in fusion_problem(ToyMLP(act=QuickGELU()))[1]
    assert "forward is not" in fusion_problem(ScaledMLP())[1]
    odd = ToyMLP()
    odd.up_proj = nn.Linear(16, 24, bias=True)
    assert "differ in having a bias" in fusion_problem(odd)[1]
    short = ToyMLP()
    short.up_proj = nn.Linear(16, 8, bias=False)
    assert "do not chain" in fusion_problem(short)[1]
    dropout = ToyMLP(act=nn.Sequential(nn.SiLU(), nn.Dropout(0.5)))
    assert "is not one of" in fusion_problem(dropout)[1]           # train mode: the probe sees the dropout
    assert fusion_problem(dropout.eval()) == ("silu", None)
    with pytest.raises(SpecError, match="cannot fuse ScaledMLP: its forward is not"):
        gnn.GatedMLP.from_mlp(ScaledMLP())


# --- swap_linears on plain torch models -------------------------------------------------------------------------

class Doubled(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def toy_model(dtype=torch.bfloat16):
    torch.manual_seed(10)
    shared = nn.Linear(16, 16, dtype=dtype)
    return nn.ModuleDict({
        "a": nn.Sequential(nn.Linear(16, 32, dtype=dtype), nn.ReLU(), nn.Linear(32, 16, dtype=dtype)),
        "b": nn.Sequential(shared, nn.Linear(16, 32, dtype=dtype)),
        "c": nn.Sequential(shared),
        "odd": nn.Linear(16, 33, dtype=dtype),
        "doubled": Doubled(16, 16, dtype=dtype),
    })


def test_swap_linears_swaps_shares_kernels_and_warns_once():
    model = toy_model()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    want = {k: model[k](x) for k in ("a", "b", "c", "odd", "doubled")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = gnn.swap_linears(model, allow_cpu=True)
    perf = [w for w in caught if issubclass(w.category, PerformanceWarning)]
    assert len(perf) == 1 and len(caught) == 1
    message = str(perf[0].message)
    assert "2 Linear layers keep torch's path" in message and "odd" in message and "doubled: Doubled overrides" in message
    assert perf[0].filename == __file__
    assert sorted(report.swapped) == ["a.0", "a.2", "b.0", "b.1"]
    assert set(report.kept) == {"odd", "doubled"} and "overrides nn.Linear's forward" in report.kept["doubled"]
    assert model["b"][0] is model["c"][0] and isinstance(model["c"][0], gnn.Linear)    # shared: swapped everywhere
    keys = {(k.n, k.k): names for k, names in report.kernels.items()}
    assert keys == {(32, 16): ["a.0", "b.1"], (16, 32): ["a.2"], (16, 16): ["b.0"]}
    assert type(model["odd"]) is nn.Linear and type(model["doubled"]) is Doubled
    for k, y in want.items():
        close_bf16(model[k](x), y)
    assert "swapped 4 Linear layers onto 3 shared gemmc kernels" in str(report)


def test_swap_linears_is_idempotent_and_quiet_with_nothing_kept():
    model = nn.Sequential(nn.Linear(16, 32, dtype=torch.bfloat16), nn.Linear(32, 16, dtype=torch.bfloat16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = gnn.swap_linears(model, allow_cpu=True)
        again = gnn.swap_linears(model, allow_cpu=True)
    assert first.swapped == again.swapped == ["0", "1"] and again.kernels == first.kernels


def test_layers_with_hooks_or_parametrizations_are_kept():
    model = nn.Sequential(*(nn.Linear(16, 16, dtype=torch.bfloat16) for _ in range(3)))
    model[0].register_forward_hook(lambda mod, inp, out: out)
    torch.nn.utils.parametrize.register_parametrization(model[1], "weight", nn.Identity())
    with pytest.warns(PerformanceWarning, match="forward hooks"):
        report = gnn.swap_linears(model, allow_cpu=True)
    assert report.swapped == ["2"] and set(report.kept) == {"0", "1"}
    assert "parametrized" in report.kept["1"]


def test_multihead_attention_out_proj_is_kept_since_its_forward_is_never_called():
    model = nn.ModuleDict({"attn": nn.MultiheadAttention(16, 2, dtype=torch.bfloat16),
                           "lin": nn.Linear(16, 16, dtype=torch.bfloat16)})
    with pytest.warns(PerformanceWarning, match="attn.out_proj: nn.MultiheadAttention reads"):
        report = gnn.swap_linears(model, allow_cpu=True)
    assert report.swapped == ["lin"] and type(model["attn"].out_proj) is not gnn.Linear


def test_root_linear_is_kept_not_crashed():
    with pytest.warns(PerformanceWarning, match="<the model itself>"):
        report = gnn.swap_linears(nn.Linear(16, 16, dtype=torch.bfloat16), allow_cpu=True)
    assert "from_linear" in report.kept[""]


def test_filters_by_glob_list_and_predicate():
    model = toy_model()
    report = gnn.swap_linears(model, include="a.*", allow_cpu=True)
    assert report.swapped == ["a.0", "a.2"] and not report.kept
    assert set(report.filtered) == {"b.0", "b.1", "odd", "doubled"}
    model = toy_model()
    with pytest.warns(PerformanceWarning):
        report = gnn.swap_linears(model, exclude=["a.*", "b.1"], allow_cpu=True)
    assert report.swapped == ["b.0"]
    model = toy_model()
    report = gnn.swap_linears(model, include=lambda name, mod: mod.out_features == 32, allow_cpu=True)
    assert sorted(report.swapped) == ["a.0", "b.1"]
    with pytest.raises(TypeError, match="include takes a glob string"):
        gnn.swap_linears(toy_model(), include=[3])


def test_cpu_model_without_allow_cpu_keeps_everything_with_a_hint():
    model = toy_model()
    with pytest.warns(PerformanceWarning, match="Move the model to CUDA before swap_linears") as caught:
        report = gnn.swap_linears(model)
    assert len(caught) == 1 and report.swapped == [] and len(report.kept) == 6
    assert not any(isinstance(m, gnn.Linear) for m in model.modules())
    with pytest.warns(PerformanceWarning, match=r"model.to\(torch.bfloat16\)"):
        gnn.swap_linears(toy_model(torch.float32), allow_cpu=True)


def test_fuse_mlp_in_a_plain_model():
    torch.manual_seed(11)
    model = nn.ModuleDict({"mlp": ToyMLP(dtype=torch.bfloat16), "quick": ToyMLP(act=QuickGELU(), dtype=torch.bfloat16),
                           "hooked": ToyMLP(dtype=torch.bfloat16)})
    model["hooked"].register_forward_pre_hook(lambda mod, args: None)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    want = model["mlp"](x)
    keys = list(model.state_dict())
    with pytest.warns(PerformanceWarning, match=r"2 MLPs were not fused \(their Linear layers are swapped one by one\):\n  - quick: its act_fn"):
        report = gnn.swap_linears(model, fuse_mlp=True, allow_cpu=True)
    assert report.fused_mlps == ["mlp"] and set(report.unfused_mlps) == {"quick", "hooked"}
    assert "forward hooks" in report.unfused_mlps["hooked"]
    assert isinstance(model["mlp"], gnn.GatedMLP) and isinstance(model["mlp"].down_proj, gnn.Linear)
    assert "mlp.gate_up_proj" in report.swapped and isinstance(model["quick"].gate_proj, gnn.Linear)
    assert list(model.state_dict()) == keys
    close_bf16(model["mlp"](x), want)


# --- prepare ----------------------------------------------------------------------------------------------------

def test_prepare_prepares_each_shared_kernel_once(monkeypatch):
    prepared = []
    monkeypatch.setattr(gto, "prepare_linear", lambda *a, **kw: prepared.append((a, kw)))
    model = toy_model()
    with pytest.warns(PerformanceWarning):
        gnn.swap_linears(model, allow_cpu=True)
    model["odd"] = gnn.Linear(16, 33, dtype=torch.bfloat16, allow_cpu=True)
    summary = gnn.prepare(model, batch_sizes=[16, 1, 4, 16], training=True)
    assert summary.row_counts == [1, 4, 16] and summary.layers == 4 and set(summary.skipped) == {"odd"}
    got = sorted((a[0], a[1], a[2], a[3], a[4], tuple(a[5]), kw["training"]) for a, kw in prepared)
    assert got == sorted((n, k, torch.bfloat16, True, "none", (1, 4, 16), True)
                         for n, k in [(32, 16), (16, 32), (16, 16)])
    assert "prepared 3 gemmc kernels (forward and backward) for 4 layers at M = [1, 4, 16]" in str(summary)


def test_prepare_includes_gated_mlps_and_shows_progress_on_request(monkeypatch, capsys):
    prepared, gated = [], []
    monkeypatch.setattr(gto, "prepare_linear", lambda *a, **kw: prepared.append(a[:2]))
    monkeypatch.setattr(gto, "prepare_gated", lambda *a, **kw: gated.append((a[0], a[1], a[3], a[4])))
    model = nn.ModuleDict({"mlp": ToyMLP(dtype=torch.bfloat16)})
    gnn.swap_linears(model, fuse_mlp=True, allow_cpu=True)
    summary = gnn.prepare(model, [8], progress=True)
    # inference: the MLP's gated kernel (N = 24 outputs over K = 16), its [gate; up] Linear (decode-sized calls
    # run it) and down_proj
    assert sorted(prepared) == [(16, 24), (48, 16)] and gated == [(24, 16, "silu", [8])] and not summary.training
    assert "gemmc.nn.prepare" in capsys.readouterr().err
    # training: the [gate; up] Linear and down_proj, forward and backward
    prepared.clear(), gated.clear()
    summary = gnn.prepare(model, [8], training=True, progress=False)
    assert sorted(prepared) == [(16, 24), (48, 16)] and gated == [] and summary.training


@pytest.mark.parametrize("bad", [[], [0], [2, -1], [1.5], "16", [True]])
def test_prepare_rejects_bad_row_counts(bad):
    with pytest.raises(SpecError, match="positive ints"):
        gnn.prepare(nn.Linear(4, 4), bad)


def test_prepare_warns_when_there_is_nothing_to_prepare(monkeypatch):
    monkeypatch.setattr(gto, "prepare_linear", lambda *a, **kw: pytest.fail("nothing to prepare"))
    with pytest.warns(UserWarning, match="no layer that runs gemmc"):
        summary = gnn.prepare(nn.Sequential(nn.Linear(4, 4)), [1])
    assert summary.kernels == {}
