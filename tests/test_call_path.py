"""The call path of a symbolic-M `auto` kernel: one table lookup per call once an M has been seen, and
`prepare(ms)`, which does a first call's work (build, load, route) ahead of a CUDA-graph capture.

No GPU here: the bucket kernels' launchers are real Launchers on device "cpu" over a function that records
its calls (as tests/test_call_checks.py does), so the Python path is what runs.
"""
import pytest
import torch

import gemmc
from gemmc.compiler import CompiledGemm, CublasRoute
from gemmc.runtime import Launcher

from conftest import mixed_weights


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *values):
        self.calls.append(values)


@pytest.fixture
def cpu_launchers(monkeypatch):
    """Every kernel's launcher runs a Recorder on CPU tensors; the cuBLAS route runs torch.matmul there."""
    recorder = Recorder()
    monkeypatch.setattr(CompiledGemm, "launcher", property(
        lambda self: self.__dict__.setdefault("_test_launcher", Launcher(
            self.emitted.params, function=recorder, name=self.emitted.entry, device_type="cpu"))))
    monkeypatch.setattr(CompiledGemm, "cublas_route", property(
        lambda self: self.__dict__.setdefault("_test_route", CublasRoute(
            self.spec, self.emitted.params, device_type="cpu"))))
    return recorder


def test_a_seen_m_is_routed_without_resolving_its_bucket_again(shipped_only, cpu_launchers, monkeypatch):
    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    b = torch.randn(n, k_).bfloat16()
    won_a, lost_a = torch.randn(won_m, k_).bfloat16(), torch.randn(lost_m, k_).bfloat16()
    k(won_a, b)
    assert torch.equal(k(lost_a, b), lost_a @ b.T)
    resolved = []
    real_route = k.m_buckets.route
    monkeypatch.setattr(k.m_buckets, "route", lambda m: resolved.append(m) or real_route(m))
    for _ in range(3):
        out = k(won_a, b)
        assert out.shape == (won_m, n) and out.dtype == torch.bfloat16
        assert torch.equal(k(lost_a, b), lost_a @ b.T)
    assert resolved == []                                   # both Ms came from the table
    assert len(cpu_launchers.calls) == 4 and cpu_launchers.calls[-1][0] is won_a
    k(torch.randn(won_m - 1, k_).bfloat16(), b)             # a new M resolves once, then joins the table
    k(torch.randn(won_m - 1, k_).bfloat16(), b)
    assert resolved == [won_m - 1]


def test_the_table_keeps_the_checks_and_the_fallback(shipped_only, cpu_launchers):
    n, k_, won_m, _ = mixed_weights(shipped_only)
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    a, b = torch.randn(won_m, k_).bfloat16(), torch.randn(n, k_).bfloat16()
    k(a, b)
    with pytest.raises(gemmc.LaunchError, match="takes 2 arguments"):
        k(a, b, b)
    out = torch.full((won_m, n), float("nan")).bfloat16()
    assert k(a, b, out=out) is out                          # out= through the table's route
    assert k(a=a, b=b).shape == (won_m, n)                  # a named A takes the resolving path
    assert k(torch.empty(0, k_).bfloat16(), b).shape == (0, n)      # an empty A never enters the table
    assert 0 not in k._routes


def test_prepare_routes_every_m_ahead_of_the_calls(shipped_only, cpu_launchers, monkeypatch):
    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    built = []
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build", lambda self: built.append(self.schedule))
    done = dict(k.prepare([won_m, lost_m]))
    assert done[lost_m] == "torch.matmul"
    assert done[won_m] == shipped_only.entries[(won_m, n, k_)].schedule.short()
    assert built == [shipped_only.entries[(won_m, n, k_)].schedule]
    assert set(k._routes) == {won_m, lost_m}
    resolved = []
    monkeypatch.setattr(k.m_buckets, "route", lambda m: resolved.append(m))
    k(torch.randn(won_m, k_).bfloat16(), torch.randn(n, k_).bfloat16())
    assert resolved == [] and len(cpu_launchers.calls) == 1


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "16"])
def test_prepare_refuses_what_is_not_a_row_count(bad):
    k = gemmc.compile(gemmc.GemmSpec("M", 256, 256), schedule="auto")
    with pytest.raises(gemmc.SpecError, match="row counts must be ints >= 1"):
        k.prepare([bad])


def test_prepare_refuses_another_m_of_a_static_kernel():
    k = gemmc.compile(gemmc.GemmSpec(64, 256, 256), schedule="auto")
    with pytest.raises(gemmc.SpecError, match="static M = 64"):
        k.prepare([128])


def test_the_ops_call_torch_directly_where_auto_runs_cublas(shipped_only, cpu_launchers, monkeypatch):
    """gemmc.torch_ops' call path asks the compiled GEMM for M's route once: a bucket `auto` gives to cuBLAS
    runs torch's own F.linear (no gemmc glue on the call), a kernel bucket the kernel's launcher."""
    from gemmc.torch_ops import kernels, launch
    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    monkeypatch.setattr(kernels, "LINEAR_KERNELS", {})
    monkeypatch.setattr(kernels, "_COMPILED", {})
    torch_calls = []
    monkeypatch.setattr(launch, "_torch_linear", lambda x, w: torch_calls.append(x) or x @ w.T)
    w = torch.randn(n, k_).bfloat16()
    x_lost = torch.randn(1, lost_m, k_).bfloat16()
    assert torch.equal(launch.run_linear(x_lost, w, None, "none"), x_lost @ w.T)
    assert torch_calls == [x_lost] and cpu_launchers.calls == []
    y = launch.run_linear(torch.randn(won_m, k_).bfloat16(), w, None, "none")
    assert y.shape == (won_m, n) and len(cpu_launchers.calls) == 1 and len(torch_calls) == 1
