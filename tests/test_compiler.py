"""gemmc.compile / lower: schedule choice, the IR after each pass, the plan, errors before work."""
import pytest
from hypothesis import given, settings

import gemmc
from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Schedule, ScheduleError, SpecError
from gemmc.compiler import CompiledGemm, lower
from gemmc.ir import parse_module
from gemmc.ir.build import spec_from_module
from gemmc.ir.extract import plan_from_module
from gemmc.passes import PIPELINE
from gemmc.schedule import is_valid
from gemmc.types import DType
from ir_strategies import aligned_specs

SQUARE = GemmSpec(m=4096, n=4096, k=4096)


@pytest.mark.parametrize("arch,schedule,threads,mma", [
    ("sm_90a", Schedule(tile=(128, 256, 64), cluster=(2, 1)), 384, "wgmma"),
    ("sm_90a", Schedule(tile=(128, 128, 64), mode="pingpong"), 384, "wgmma"),
    ("sm_80", Schedule(tile=(128, 128, 32), arch="sm_80"), 128, "mma.sync"),
])
def test_compile_emit_ir(arch, schedule, threads, mma):
    k = gemmc.compile(SQUARE, schedule=schedule, arch=arch, emit="ir")
    assert isinstance(k, CompiledGemm)
    assert (k.spec, k.schedule, k.arch, k.passes) == (SQUARE, schedule, arch, PIPELINE)
    assert "gemm.matmul" in k.ir() and "kernel.gemm" not in k.ir()
    assert spec_from_module(parse_module(k.ir())) == SQUARE
    for name in PIPELINE:
        assert "kernel.gemm" in k.ir(after=name)
    assert "kernel.pipeline" not in k.ir(after="tma-cluster-layout")
    assert "kernel.pipeline" in k.ir(after="pipeline-staging")
    assert k.ir(after="verify-resources") == k.ir(after="pipeline-staging")   # verification changes nothing
    assert k.plan == plan_from_module(parse_module(k.ir(after="verify-resources")))
    assert (k.plan.threads, k.plan.mma.kind, k.plan.tile) == (threads, mma, schedule.tile)


def test_unknown_pass_name():
    k = gemmc.compile(SQUARE, Schedule(), emit="ir")
    with pytest.raises(SpecError, match=r"ir\(after='pipeline'\): no such pass; use one of: input, "
                                        "assign-warpgroup-roles"):
        k.ir(after="pipeline")


@pytest.mark.parametrize("choice", ["auto", "heuristic"])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_auto_and_heuristic_pick_a_valid_schedule(choice, arch):
    spec = GemmSpec(m="M", n=11008, k=4096, inputs=(EpilogueInput("bias", "row"),),
                    epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))
    k = gemmc.compile(spec, schedule=choice, arch=arch, emit="ir")
    assert k.arch == arch == k.schedule.arch
    assert is_valid(k.schedule, spec)
    assert f"arch {arch}" in k.ir(after="assign-warpgroup-roles")


def test_explicit_arch_must_agree_with_the_schedules():
    """A Schedule carries its arch (default sm_90a): compile(arch=) agrees with it or is left out; a dict that
    names no arch takes the explicit one (tests/test_frictions.py has the refusal's message)."""
    with pytest.raises(SpecError, match="contradicts the schedule's arch 'sm_90a'"):
        gemmc.compile(SQUARE, Schedule(tile=(128, 128, 32)), arch="sm80", emit="ir")
    k = gemmc.compile(SQUARE, Schedule(tile=(128, 128, 32), arch="sm_80"), arch="sm80", emit="ir")
    assert k.arch == "sm_80" and k.schedule == Schedule(tile=(128, 128, 32), arch="sm_80")
    assert k.plan.mode == "multistage"
    k = gemmc.compile(SQUARE, {"tile": (128, 128, 32)}, arch="sm80", emit="ir")
    assert k.schedule == Schedule(tile=(128, 128, 32), arch="sm_80")


def test_schedule_as_dict():
    k = gemmc.compile(SQUARE, Schedule(cluster=(2, 1)).to_dict(), emit="ir")
    assert k.schedule == Schedule(cluster=(2, 1))


def test_invalid_schedule_fails_before_any_ir_is_built(monkeypatch):
    import gemmc.compiler as compiler
    monkeypatch.setattr(compiler, "spec_to_module", lambda *a: pytest.fail("built IR for an invalid schedule"))
    with pytest.raises(ScheduleError, match="shared memory") as err:
        gemmc.compile(SQUARE, Schedule(tile=(256, 256, 128)))
    assert "use a smaller tile" in str(err.value)
    with pytest.raises(ScheduleError, match="thread-block clusters are SM90-only"):
        gemmc.compile(SQUARE, Schedule(tile=(128, 128, 32), cluster=(2, 1), arch="sm_80"))


def test_bad_arguments():
    with pytest.raises(SpecError, match="schedule='fastest'"):
        gemmc.compile(SQUARE, schedule="fastest")
    with pytest.raises(SpecError, match="emit='ptx'"):
        gemmc.compile(SQUARE, emit="ptx")
    with pytest.raises(SpecError, match="takes a gemmc.GemmSpec"):
        gemmc.compile("4096x4096")
    with pytest.raises(SpecError, match="unknown arch"):
        gemmc.compile(SQUARE, arch="sm_70")


def test_emit_ir_has_no_kernel():
    k = gemmc.compile(SQUARE, Schedule(), emit="ir")
    with pytest.raises(SpecError, match="emit='ir'"):
        k.source


def test_traced_kernel_and_equivalent_spec_lower_to_the_same_ir():
    T = gemmc.Tensor

    @gemmc.kernel
    def gemm(x: T[("M", 4096), gemmc.bf16], w: T[(11008, 4096), gemmc.bf16], bias: T[(11008,), gemmc.f32]):
        return gemmc.relu(x @ w.T + bias)

    spec = GemmSpec(m="M", n=11008, k=4096, inputs=(EpilogueInput("bias", "row"),),
                    epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))), EpilogueOp("relu", (Ref.node(0),))))
    traced = gemmc.compile(gemm, Schedule(), emit="ir")
    plain = gemmc.compile(spec, Schedule(), emit="ir")
    assert traced.spec == spec
    for after in (None, *PIPELINE):
        assert traced.ir(after) == plain.ir(after)


def test_lower_returns_ir_after_each_pass_and_the_plan():
    texts, plan = lower(SQUARE, Schedule(cluster=(1, 2)))
    assert tuple(texts) == PIPELINE
    assert plan.copy("a").multicast == 2 and plan.copy("a").multicast_along == "n"
    with pytest.raises(ScheduleError):
        lower(SQUARE, Schedule(cluster=(1, 32)))


def test_source_comes_from_the_backend():
    from gemmc.backends import emit
    k = gemmc.compile(SQUARE, Schedule())
    assert k.source == emit(k.plan).source


@settings(max_examples=25)
@given(aligned_specs())
def test_compile_is_deterministic_and_fast_for_random_problems(spec):
    if spec.acc_dtype == DType.f16 and spec.epilogue:     # SM90 runs an epilogue on f32 accumulators only
        with pytest.raises(ScheduleError, match="acc_dtype f16 with an epilogue"):
            gemmc.compile(spec, "heuristic", emit="ir")
        return
    a = gemmc.compile(spec, "heuristic", emit="ir")
    b = gemmc.compile(spec, "heuristic", emit="ir")
    assert a.schedule == b.schedule and a.plan == b.plan
    assert a.ir("verify-resources") == b.ir("verify-resources")


def test_auto_uses_the_tuning_db_and_falls_back_to_cublas_where_it_measured_faster(tmp_path, monkeypatch):
    import torch
    from gemmc.search.db import TuningDB
    from gemmc.search.strategy import Measurement
    from gemmc.schedule import enumerate_schedules
    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "t.sqlite"))
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)    # rows of "H200" count on any host
    monkeypatch.delenv("GEMMC_GPU", raising=False)
    spec = GemmSpec(m=64, n=256, k=128)
    tuned = enumerate_schedules(spec)[3]
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.record(spec, "sm_90a", Measurement(tuned, 9.0, None, 6.0), "H200")   # cuBLAS faster
    k = gemmc.compile(spec, schedule="auto")
    assert k.schedule == tuned and k.decision.source == "db" and k.decision.use_cublas
    a, b = torch.randn(64, 128).bfloat16(), torch.randn(256, 128).bfloat16()
    with pytest.raises(gemmc.LaunchError, match="a must be on a cuda device"):
        k(a, b)                                               # checked as the kernel checks its arguments
    from gemmc.compiler import CublasRoute
    assert torch.equal(CublasRoute(k.spec, k.emitted.params, device_type="cpu")(a, b), a @ b.T)
    assert gemmc.compile(spec, schedule="heuristic").decision is None
