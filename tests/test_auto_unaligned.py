"""`schedule="auto"` on a plain GEMM that no gemmc kernel can run (a static dim that breaks the kernels' 16-byte
alignment, e.g. a vocabulary of N = 32001): torch.matmul runs it behind the spec's checks, and the object says
so instead of showing IR. Explicit schedules, "heuristic" and fused epilogues still refuse the problem."""
import pytest
import torch

import gemmc
from gemmc import cli
from gemmc.compiler import CublasOnlyGemm
from gemmc.errors import LaunchError, ScheduleError, SpecError


def test_auto_runs_torch_matmul_where_no_kernel_can(shipped_only):
    k = gemmc.compile(gemmc.GemmSpec("M", 32001, 4096), schedule="auto")
    assert isinstance(k, CublasOnlyGemm) and k.schedule is None
    assert k.decision.use_cublas and k.decision.source == "alignment"
    assert "the output's N: got 32001 bf16 elements" in k.decision.detail
    assert k.for_m(7) == (k.decision, None) and k.build() is None
    for what in ("source", "ptx", "plan"):
        with pytest.raises(SpecError, match="`auto` runs torch.matmul for gemm: no gemmc kernel takes it"):
            getattr(k, what)
    with pytest.raises(SpecError, match="no IR"):
        k.ir()


@pytest.mark.parametrize("schedule", ["heuristic", gemmc.Schedule()])
def test_other_schedules_still_refuse_it(schedule):
    with pytest.raises(ScheduleError, match="pad it to a multiple of 8"):
        gemmc.compile(gemmc.GemmSpec("M", 32001, 4096), schedule=schedule)


def test_a_fused_epilogue_still_refuses_it():
    """torch.matmul cannot run the epilogue: the alignment error stands."""
    R = gemmc.spec.Ref
    spec = gemmc.GemmSpec("M", 32001, 4096, epilogue=(gemmc.EpilogueOp("relu", (R("acc"),)),))
    with pytest.raises(ScheduleError, match="pad it to a multiple of 8"):
        gemmc.compile(spec, schedule="auto")


def test_calls_check_the_spec_and_take_any_strides():
    spec = gemmc.GemmSpec("M", 1001, "K", batch="L", a_layout="km", b_layout="kn")
    k = CublasOnlyGemm(spec, "sm_90a", "N = 1001", device_type="cpu")
    a = torch.randn(2, 40, 5).bfloat16()            # (L, K, M)
    b = torch.randn(2, 40, 1001).bfloat16()         # (L, K, N)
    assert torch.equal(k(a, b), a.mT @ b)
    out = torch.full((2, 5, 1001), float("nan")).bfloat16()
    assert k(a, b, out=out) is out and torch.equal(out, a.mT @ b)
    odd = torch.randn(2, 41, 5).bfloat16()[:, :40]  # K = 40 in a 41-row buffer: strides no kernel takes
    assert torch.equal(k(odd, b), odd.mT @ b)
    with pytest.raises(LaunchError, match="must be bf16"):
        k(a.float(), b)
    with pytest.raises(LaunchError, match="b.shape\\[2\\] must be 1001"):
        k(a, b[..., :1000])
    assert not k(a[:, :0], b[:, :0]).any()         # K = 0: zeros, as torch gives


def test_a_kernel_functions_arguments_reach_it():
    @gemmc.kernel
    def lm_head(x: gemmc.Tensor[("M", 64), gemmc.bf16], w: gemmc.Tensor[(1001, 64), gemmc.bf16]):
        return x @ w.T
    k = gemmc.compile(lm_head)
    assert isinstance(k, CublasOnlyGemm) and k.launcher.signature.names == ("x", "w")
    cpu = CublasOnlyGemm(k.spec, "sm_90a", k.why, signature=k.signature, device_type="cpu")
    x, w = torch.randn(3, 64).bfloat16(), torch.randn(1001, 64).bfloat16()
    assert torch.equal(cpu(w=w, x=x), x @ w.T)
    with pytest.raises(LaunchError, match="w must be bf16"):
        cpu(x, w.half())


def test_the_commands_say_so(capsys, tmp_path):
    assert cli.main(["compile", "--m", "M", "--n", "32001", "--k", "4096", "--schedule", "auto"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("// auto: no gemmc kernel takes this problem (16-byte alignment of the output's N")
    assert cli.main(["build", "--m", "M", "--n", "32001", "--k", "4096", "--cache-dir", str(tmp_path)]) == 0
    assert "nothing to build: no gemmc kernel takes this problem" in capsys.readouterr().out


def _refusing_kernel_with_a_cpu_fallback(spec, schedule="auto"):
    """A compiled GEMM whose kernel route refuses every call (here: CPU tensors, as a GPU kernel would refuse
    an N of 1001 at run time), with the torch.matmul route on the CPU."""
    k = gemmc.compile(spec, schedule=schedule)
    k._fallback = CublasOnlyGemm(spec, "sm_90a", "test", device_type="cpu")
    return k


def test_a_call_no_kernel_takes_runs_torch_matmul_under_auto(shipped_only):
    """Symbolic N = 1001 at run time: the kernel (and the cuBLAS route's kernel checks) refuse it; `auto` runs
    torch.matmul and warns once. A call torch.matmul cannot take either is still refused, without a warning."""
    from gemmc.errors import PerformanceWarning
    k = _refusing_kernel_with_a_cpu_fallback(gemmc.GemmSpec("M", "N", "K"))
    a, b = torch.randn(5, 64).bfloat16(), torch.randn(1001, 64).bfloat16()
    with pytest.raises(LaunchError, match="a must be on a cuda device"):    # the kernel route's message
        k(a.float(), b)
    with pytest.warns(PerformanceWarning, match="`auto` runs torch.matmul for calls no gemmc kernel takes"):
        assert torch.equal(k(a, b), a @ b.T)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(k(a, b), a @ b.T)          # warned once


def test_explicit_schedules_and_epilogues_keep_the_kernels_refusal():
    a, b = torch.randn(5, 64).bfloat16(), torch.randn(1001, 64).bfloat16()
    k = _refusing_kernel_with_a_cpu_fallback(gemmc.GemmSpec("M", "N", "K"), gemmc.Schedule())
    with pytest.raises(LaunchError, match="cuda"):
        k(a, b)
    R = gemmc.spec.Ref
    epi = gemmc.GemmSpec("M", "N", "K", epilogue=(gemmc.EpilogueOp("relu", (R("acc"),)),))
    with pytest.raises(LaunchError, match="cuda"):
        _refusing_kernel_with_a_cpu_fallback(epi)(a, b)
