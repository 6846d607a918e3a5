"""The Builder: parallel spawned compiles, a failing candidate and a hung one are recorded and skipped."""
import time

import pytest

import gemmc
from gemmc.search.builder import Builder
from gemmc.search.runner import Runner
from gemmc.search.registry import make_strategy
from gemmc.search.strategy import Measurement, SearchProblem, run_search

SPEC = gemmc.GemmSpec(256, 1024, 512)


def fake_compile(spec, schedule, arch):
    """Runs in a spawned worker: 'compiles' most schedules, fails on split-K 2, hangs on split-K 4."""
    if schedule.split_k == 2:
        raise RuntimeError(f"no kernel for {schedule.short()}")
    if schedule.split_k == 4:
        time.sleep(60)
    return f"{spec.m}x{spec.n}x{spec.k}/{schedule.short()}.so"


def test_failures_and_timeouts_are_recorded_and_the_rest_build():
    cands = SearchProblem.of(SPEC).candidates
    pick = [next(s for s in cands if s.split_k == k) for k in (1, 2, 4)]
    pick += [s for s in cands if s.split_k == 1][1:4]
    t0 = time.perf_counter()
    with Builder(fake_compile, workers=2, timeout_s=3.0) as b:
        res = b.build(SPEC, pick, "sm_90a")
        again = b.build(SPEC, pick[3:], "sm_90a")      # the pool still works after a timeout
    elapsed = time.perf_counter() - t0
    assert [r.schedule for r in res] == pick
    assert res[0].ok and res[0].artifact.endswith(pick[0].short() + ".so")
    assert not res[1].ok and "RuntimeError: no kernel" in res[1].error
    assert not res[2].ok and "timed out after 3 s" in res[2].error and res[2].compile_s >= 3.0
    assert all(r.ok for r in res[3:]) and all(r.ok for r in again)
    assert elapsed < 40                                 # the hung compile did not hold the batch


def test_search_loop_skips_failed_builds():
    """Builder + injected Runner through run_search: failed compiles become error measurements."""
    measured = []

    def measure(spec, s, arch):
        measured.append(s)
        return Measurement(s, 10.0 + s.tile[1] / 64, None, 12.0)

    runner = Runner(measure_fn=measure)
    with Builder(fake_compile, workers=2, timeout_s=30.0) as b:
        prob = SearchProblem.of(SPEC, candidates=[s for s in SearchProblem.of(SPEC).candidates if s.split_k < 4])

        def evaluate(ss):
            out = []
            for r in b.build(SPEC, ss, "sm_90a"):
                out.append(runner.measure(SPEC, r.schedule, "sm_90a") if r.ok else
                           Measurement(r.schedule, None, r.error, compile_s=r.compile_s))
            return out

        res = run_search(make_strategy("random", seed=2), prob, evaluate, budget=8, batch=4)
    assert len(res) == 8
    failed = [r for r in res if not r.ok]
    assert all(r.schedule.split_k == 2 for r in failed)
    assert set(measured) == {r.schedule for r in res if r.ok}   # only built ones were measured


@pytest.mark.gpu
def test_runner_checks_and_times_on_the_gpu():
    """The default Runner: gemmc.compile + the bench's check-then-time, cuBLAS interleaved."""
    from gemmc.choose.shipped_steps import heuristic_schedule
    spec = gemmc.GemmSpec(1024, 1024, 1024)
    s = heuristic_schedule(spec, "sm_90a")
    m = Runner().measure(spec, s, "sm_90a")
    assert m.ok, m.error
    assert 1.0 < m.time_us < 10_000 and 1.0 < m.cublas_us < 10_000


def test_runner_stores_the_cublas_time_paired_with_its_gemmc_time(monkeypatch):
    """The DB verdict is cublas_us / time_us: the Runner stores cublas_us = gemmc median x the bench's
    per-repeat (drift-proof) ratio, not the cuBLAS median, which a clock step can shift alone."""
    import torch

    import gemmc.bench.timing as timing
    rec = {"status": "ok", "gemmc_us": {"median": 100.0}, "cublas_us": {"median": 90.0}, "ratio": 1.05}
    monkeypatch.setattr(timing, "bench_shape", lambda *a, **k: rec)
    monkeypatch.setattr(timing, "spin_up", lambda *a, **k: None)
    monkeypatch.setattr(gemmc, "compile", lambda *a, **k: object())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)    # a healthy GPU, without one
    runner = Runner()
    monkeypatch.setattr(runner, "_inputs", lambda spec: (None, None))
    m = runner.measure(gemmc.GemmSpec(m=4096, n=4096, k=4096), gemmc.Schedule(), "sm_90a")
    assert m.ok and m.time_us == 100.0 and m.cublas_us == pytest.approx(105.0)
