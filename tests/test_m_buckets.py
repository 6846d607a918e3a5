"""schedule="auto" with a symbolic M: one decision per runtime M bucket (gemmc/choose/m_buckets.py)."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import gemmc
from gemmc.compiler import CompiledGemm
from gemmc.choose.m_buckets import BUCKETS, bucket_of, runtime_m

from conftest import mixed_weights


def test_buckets_round_m_up_to_a_power_of_two():
    assert [bucket_of(m) for m in (1, 2, 3, 16, 17, 4096, 4097, 65536, 10**6)] == \
        [1, 2, 4, 16, 32, 4096, 8192, 65536, 65536]
    with pytest.raises(ValueError, match="M must be >= 1"):
        bucket_of(0)


def test_runtime_m_reads_the_a_operand():
    spec = gemmc.GemmSpec("M", 64, 32)
    assert runtime_m(spec, (torch.empty(5, 32),), {}) == 5
    assert runtime_m(gemmc.GemmSpec("M", 64, 32, a_layout="km"), (torch.empty(32, 5),), {}) == 5
    assert runtime_m(spec, (torch.empty(3, 5, 32),), {}) == 5          # batched
    assert runtime_m(spec, (), {"a": torch.empty(5, 32)}) == 5          # A by name
    assert runtime_m(spec, (), {"b": torch.empty(64, 32)}) is None


def test_each_bucket_takes_the_shipped_choice_at_its_m(shipped_only):
    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    won, lost = shipped_only.entries[(won_m, n, k_)], shipped_only.entries[(lost_m, n, k_)]
    assert not won.cublas_faster and lost.cublas_faster
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    assert k.m_buckets is not None and k.decision.source == "heuristic"    # the default: no M known
    d, kernel = k.for_m(won_m)
    assert d.source == "pretuned" and isinstance(kernel, CompiledGemm) and kernel.schedule == won.schedule
    assert k.for_m(won_m // 2 + 1)[1] is kernel          # rounds up to the same bucket: the same kernel
    assert kernel.spec.m == "M"                         # compiled for the symbolic spec: serves every M
    d, kernel = k.for_m(lost_m)
    assert d.source == "pretuned" and d.use_cublas and kernel is None
    assert k.for_m(lost_m // 2 + 1)[1] is None           # rounds up to the lost bucket: torch.matmul
    table = dict(k.m_buckets.table())
    assert set(table) == set(BUCKETS) and table[won_m].schedule == won.schedule


def _cpu_cublas_route(monkeypatch):
    """The cuBLAS route checks devices as a kernel does: on CPU tensors for these tests."""
    from gemmc.compiler import CublasRoute
    monkeypatch.setattr(CompiledGemm, "cublas_route",
                        property(lambda self: CublasRoute(self.spec, self.emitted.params, device_type="cpu")))


def test_calls_route_by_m(shipped_only, monkeypatch):
    _cpu_cublas_route(monkeypatch)
    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    a, b = torch.randn(lost_m - 1, k_).bfloat16(), torch.randn(n, k_).bfloat16()
    assert torch.equal(k(a, b), a @ b.T)                                # the lost bucket: torch.matmul, no kernel
    launched = []
    monkeypatch.setattr(CompiledGemm, "launcher", property(lambda self: lambda *x, **kw: launched.append(self)))
    k(torch.randn(won_m - 1, k_).bfloat16(), b)                                   # the won bucket: its own kernel
    assert [x.schedule for x in launched] == [shipped_only.entries[(won_m, n, k_)].schedule]


def test_calls_with_named_operands_route_by_m(shipped_only, monkeypatch):
    _cpu_cublas_route(monkeypatch)
    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    a, b = torch.randn(lost_m - 1, k_).bfloat16(), torch.randn(n, k_).bfloat16()
    launched = []
    monkeypatch.setattr(CompiledGemm, "launcher", property(lambda self: lambda *x, **kw: launched.append(self)))
    out = k(a=a, b=b)                                   # the lost bucket: torch.matmul, as k(a, b) does
    assert not launched and torch.equal(out, a @ b.T)
    k(a=torch.randn(won_m - 1, k_).bfloat16(), b=b)                # the won bucket: its own kernel, not the default
    assert [x.schedule for x in launched] == [shipped_only.entries[(won_m, n, k_)].schedule]


def test_an_empty_a_takes_the_default_path(shipped_only, monkeypatch):
    k = gemmc.compile(gemmc.GemmSpec("M", 8192, 28672), schedule="auto")
    launched = []
    monkeypatch.setattr(CompiledGemm, "launcher", property(lambda self: lambda *x, **kw: launched.append(self)))
    k(torch.empty(0, 28672), torch.randn(8192, 28672))  # no bucket for M = 0: no ValueError from bucket_of
    assert launched == [k]


def test_static_m_and_fixed_schedules_choose_once(shipped_only):
    k = gemmc.compile(gemmc.GemmSpec(64, 8192, 28672), schedule="auto")
    assert k.m_buckets is None and k.for_m(64) == (k.decision, k)
    k = gemmc.compile(gemmc.GemmSpec("M", 8192, 28672), schedule="heuristic")
    assert k.m_buckets is None and k.for_m(7) == (None, k)


def test_build_covers_every_bucket_kernel(shipped_only, monkeypatch):
    built = []
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build", lambda self: built.append(self.schedule))
    k = gemmc.compile(gemmc.GemmSpec("M", 8192, 28672), schedule="auto")
    k.build()
    kernels = {d.schedule for _, d in k.m_buckets.table() if not d.use_cublas}
    assert set(built) == kernels | {k.schedule} and len(built) == len(set(built))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 200_000), nk=st.sampled_from([(4096, 4096), (8192, 28672), (1000, 2048), (6144, 4096)]))
def test_any_m_routes_to_its_bucket_decision(shipped_only, m, nk):
    from gemmc.choose.auto import resolve_auto
    n, k = nk
    spec = gemmc.GemmSpec("M", n, k)
    c = _compiled(spec)
    decision, kernel = c.for_m(m)
    assert decision == c.m_buckets.decision(bucket_of(m))
    expected = resolve_auto(spec, "sm_90a", m=bucket_of(m))
    assert decision.schedule == expected.schedule and decision.use_cublas == expected.use_cublas
    assert (kernel is None) == decision.use_cublas
    if kernel is not None:
        assert kernel.schedule == decision.schedule and kernel.spec == spec


_COMPILED = {}


def _compiled(spec):
    """One compile per spec across the drawn examples (compiling runs the passes: keep the test fast)."""
    if spec not in _COMPILED:
        _COMPILED[spec] = gemmc.compile(spec, schedule="auto")
    return _COMPILED[spec]


def test_an_ir_only_compile_refuses_calls_even_where_auto_would_run_cublas(shipped_only):
    k = gemmc.compile(gemmc.GemmSpec("M", 8192, 28672), schedule="auto", emit="ir")
    with pytest.raises(gemmc.SpecError, match="emit='kernel'"):
        k(torch.randn(16, 28672), torch.randn(8192, 28672))
