"""Gated GEMMs on the CPU: the spec's rules, the IR (printed, parsed back), the predicate and resource model,
`auto`'s picks, the emitted kernel (facts, gate function, PTX), the fp32 reference and the torch op."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemmc
import gemmc.torch_ops as gto
from gemmc.errors import LaunchError, SpecError
from gemmc.ir import parse_module
from gemmc.ir.build import find_gemm, spec_of, spec_to_module
from gemmc.reference import make_inputs, reference_and_bound
from gemmc.schedule import (Schedule, ab_stage_bytes, accumulator_regs, check_schedule, enumerate_schedules,
                            is_valid)
from gemmc.spec import GATE_ACTIVATIONS, EpilogueInput, EpilogueOp, GemmSpec, Ref

SWIGLU = GemmSpec(m="M", n=14336, k=4096, gate="silu", name="swiglu")


# ---- the spec ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, needle", [
    (dict(gate="swish"), "use one of"),
    (dict(gate="silu", b_layout="kn"), "b_layout='kn'"),
    (dict(gate="silu", a_layout="km"), "a_layout='km'"),
    (dict(gate="silu", batch=4), "batch=4"),
    (dict(gate="silu", n="N"), "a static N"),
])
def test_spec_refuses_what_a_gated_gemm_cannot_be(kw, needle):
    with pytest.raises(SpecError, match="gate") as e:
        GemmSpec(m="M", n=kw.pop("n", 256), k=128, **kw)
    assert needle in str(e.value)


def test_gated_spec_facts():
    assert SWIGLU.b_rows == 2 * 14336 and SWIGLU.has_epilogue
    assert SWIGLU.flops(m=8) == 2 * 2.0 * 8 * 14336 * 4096
    assert GemmSpec(n=64, k=64).b_rows == 64


# ---- IR --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gate", GATE_ACTIVATIONS)
def test_ir_prints_the_gate_and_b_as_two_n_rows_and_reads_back(gate):
    spec = GemmSpec(m="M", n=256, k=128, gate=gate, name="g")
    module = spec_to_module(spec, Schedule(tile=(128, 128, 64)))
    text = str(module)
    assert f"acc f32 gate {gate} -> !gemmc.tensor<M x 256 x bf16, mn>" in text
    assert "!gemmc.tensor<512 x 128 x bf16, nk>" in text
    assert spec_of(find_gemm(module)) == spec
    assert spec_of(find_gemm(parse_module(text))) == spec


def test_the_gate_survives_the_passes_into_the_plan():
    k = gemmc.compile(GemmSpec(m="M", n=256, k=128, gate="gelu_tanh", name="geglu"),
                      schedule=Schedule(tile=(128, 64, 64), cluster=(2, 1)))
    for after in (None, "assign-warpgroup-roles", "verify-resources"):
        assert "acc f32 gate gelu_tanh ->" in k.ir(after)
    assert k.plan.problem.gate == "gelu_tanh"
    assert "GATED = True" in k.source and "def gate_function(g, u):" in k.source
    assert "cute.math.tanh" in k.source.split("def gate_function")[1].split("\n\n")[0]
    plain = gemmc.compile(GemmSpec(m="M", n=256, k=128), schedule=Schedule(tile=(128, 64, 64)))
    assert "GATED = False" in plain.source and "gate_function" not in plain.source


# ---- the predicate and resource model ---------------------------------------------------------------

def test_gated_tiles_budget_two_accumulators_and_two_b_tiles():
    s = Schedule(tile=(128, 128, 64))
    plain = GemmSpec(m=256, n=14336, k=4096)
    assert accumulator_regs(s, SWIGLU) == 2 * accumulator_regs(s, plain) == 128
    assert ab_stage_bytes(s, SWIGLU) == (128 + 2 * 128) * 64 * 2
    # 128 x 192 holds 192 regs of accumulators per thread: over the budget
    assert any("registers" in v.limit for v in check_schedule(Schedule(tile=(128, 192, 64)), SWIGLU))


@pytest.mark.parametrize("kw, field", [
    (dict(swap_ab=True, tile=(64, 16, 128), mode="pingpong"), "swap_ab=True"),
    (dict(split_k=2), "split_k=2"),
    (dict(stream_k=True), "stream_k=True"),
])
def test_predicate_refuses_what_splits_or_transposes_a_gated_tile(kw, field):
    s = Schedule(**{"tile": (128, 64, 64), **kw})
    assert is_valid(s, GemmSpec(m=256, n=14336, k=4096))
    problems = [str(v) for v in check_schedule(s, SWIGLU)]
    assert any("gated GEMM" in p and field in p for p in problems), problems


def test_predicate_refuses_192_row_tiles_and_sm80():
    assert any("192" in str(v) for v in check_schedule(Schedule(tile=(192, 64, 64)), SWIGLU))
    assert any("sm_90a only" in str(v) for v in check_schedule(Schedule(tile=(128, 128, 32), arch="sm_80"),
                                                                 SWIGLU))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 16384), n=st.sampled_from([256, 768, 1536, 2048, 11008, 14336]),
       k=st.sampled_from([256, 2048, 4096, 7168]))
def test_every_enumerated_gated_schedule_fits_and_auto_picks_one(m, n, k):
    spec = GemmSpec(m=m, n=n, k=k, gate="silu")
    for s in enumerate_schedules(spec)[::7]:
        assert not s.swap_ab and s.split_k == 1 and not s.stream_k
        assert accumulator_regs(s, spec) + 64 <= 232
    d, _ = gemmc.compile(GemmSpec(m="M", n=n, k=k, gate="silu", name="g"), schedule="auto").for_m(m)
    assert is_valid(d.schedule, spec) and not d.use_cublas


def test_auto_never_borrows_the_plain_tables_for_a_gated_gemm():
    k = gemmc.compile(SWIGLU, schedule="auto")
    for m in (1, 64, 4096):
        d, _ = k.for_m(m)
        assert d.source == "heuristic" and not d.use_cublas


# ---- the kernel ----------------------------------------------------------------------------------------

def test_ptx_runs_two_wgmma_chains_over_one_a_tile():
    spec = GemmSpec(m="M", n=256, k=128, gate="silu", name="swiglu_ptx")
    k = gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 64)))
    k.build()
    # each 64-wide k-tile: 4 k-blocks of 16, each a WGMMA into the gate and one into the up accumulators,
    # m64n128k16 (the output tile's N, not twice it)
    count = k.ptx.count("wgmma.mma_async")
    assert count >= 8 and count % 8 == 0 and k.ptx.count("m64n128k16") == count
    assert "ex2.approx" in k.ptx          # the silu's exp


# ---- the reference -------------------------------------------------------------------------------------

def test_reference_is_the_gated_product_and_its_bound_covers_a_bf16_kernel():
    spec = GemmSpec(m=64, n=128, k=256, gate="silu")
    a, b, _ = make_inputs(spec, 64, 128, 256, device="cpu", generator=torch.Generator().manual_seed(0))
    ref, bound = reference_and_bound(spec, a, b, [])
    g, u = (a.double() @ b.double().T).chunk(2, dim=-1)
    assert torch.allclose(ref.double(), torch.nn.functional.silu(g) * u, rtol=1e-5, atol=1e-4)
    # a kernel that rounds gate and up to bf16 before gating is within the bound
    gb, ub = g.to(torch.bfloat16).double(), u.to(torch.bfloat16).double()
    approx = (torch.nn.functional.silu(gb) * ub).to(torch.bfloat16).double()
    assert ((approx - ref.double()).abs() <= bound.double()).float().mean() > 0.99


# ---- the torch op --------------------------------------------------------------------------------------

def test_op_on_cpu_equals_the_reference_and_traces_without_graph_breaks():
    x = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    w = torch.randn(96, 32, dtype=torch.bfloat16)
    got = gto.gated_linear(x, w, "silu")
    g, u = torch.nn.functional.linear(x.float(), w.float()).chunk(2, dim=-1)
    assert got.shape == (2, 7, 48)
    assert torch.allclose(got.float(), torch.nn.functional.silu(g) * u, rtol=2 ** -7, atol=1e-2)
    compiled = torch.compile(lambda t: gto.gated_linear(t, w, "gelu"), fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), gto.gated_linear(x, w, "gelu"))


def test_op_fake_kernel_and_inductor_lowering():
    from torch._inductor.utils import run_and_get_code
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        y = torch.ops.gemmc.launch_gated_linear(torch.empty(5, 3, 64, dtype=torch.bfloat16),
                                                torch.empty(256, 64, dtype=torch.bfloat16), "silu")
    assert y.shape == (5, 3, 128) and y.dtype == torch.bfloat16 and y.is_contiguous()
    w = torch.randn(64, 32, dtype=torch.bfloat16)
    fn = torch.compile(lambda t: gto.gated_linear(t, w, "silu"), fullgraph=True)
    with torch.no_grad():
        _, code = run_and_get_code(fn, torch.randn(4, 32, dtype=torch.bfloat16))
    assert "gemmc_gated_linear_out" in "\n".join(code)


def test_op_gradients_flow_through_the_linear_and_torch_gating():
    x = torch.randn(6, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    # float64 takes the reference path: the gated op's composition under autograd
    assert torch.autograd.gradcheck(lambda a, b: gto.gated_linear(a, b, "silu"), (x, w))


@pytest.mark.parametrize("args, cls, needle", [
    ((torch.randn(4, 32), torch.randn(64, 32), "swish"), SpecError, "not one of"),
    ((torch.randn(4, 32), torch.randn(63, 32), "silu"), LaunchError, "even"),
    ((torch.randn(4, 16), torch.randn(64, 32), "silu"), LaunchError, "K = 32"),
    ((torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(64, 32), "silu"), LaunchError, "cast x"),
])
def test_op_errors_name_the_problem(args, cls, needle):
    with pytest.raises(cls, match="gated_linear") as e:
        gto.gated_linear(*args)
    assert needle in str(e.value)


def test_unsupported_reason_judges_the_output_width():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():      # CUDA stand-ins: no GPU needed
        w12 = torch.empty_strided((24, 64), (64, 1), dtype=torch.bfloat16, device="cuda")
        w16 = torch.empty_strided((32, 64), (64, 1), dtype=torch.bfloat16, device="cuda")
        odd = torch.empty_strided((5, 64), (64, 1), dtype=torch.bfloat16, device="cuda")
    assert "N = 12 (half the [gate; up] weight" in gto.gated_unsupported_reason(w12, "silu")
    assert gto.gated_unsupported_reason(w16, "silu") is None
    assert "even" in gto.gated_unsupported_reason(odd, "silu")
    assert "not one of" in gto.gated_unsupported_reason(w16, "tanh")
