"""fp8 in `auto`, the tuning DB and the search, on the CPU: fp8 problems keyed by their dtypes and scaling (a bf16
problem's keys unchanged), the heuristic's picks and their honest detail, torch._scaled_mm where the DB measured
it faster (per tensor and per row only), the route's checks (torch._scaled_mm runs on a CPU), and
`gemmc-search tune --dtype fp8 --scaling ...`'s flags."""
import pytest
import torch

import gemmc
from gemmc import GemmSpec, LaunchError, Scaling, Schedule
from gemmc.choose.auto import resolve_auto
from gemmc.choose.decision import BLOCKWISE_KEEPS_THE_KERNEL, FP8_HEURISTIC_NOTE
from gemmc.choose.tuning_db_schema import epilogue_class, problem_fields, problem_key
from gemmc.scaled_mm import ScaledMmRoute
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement
from gemmc.spec import EpilogueInput, EpilogueOp, Ref

H200 = "NVIDIA H200"


def fp8(mode, m=2048, n=4096, k=4096, b_dtype="f8e4m3", names=("sx", "sw"), **kw):
    return GemmSpec(m=m, n=n, k=k, dtype="f8e4m3", b_dtype=b_dtype, scaling=Scaling(mode, *names), **kw)


@pytest.fixture(autouse=True)
def no_tables_no_gpu(monkeypatch):
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)


# ---- keys ------------------------------------------------------------------------------------------

def test_a_bf16_problems_keys_are_as_they_were():
    assert problem_key(GemmSpec(m=64, n=128, k=256), "sm_90a") == (
        '{"a_layout":"mk","acc_dtype":"f32","arch":"sm_90a","b_layout":"nk","batch":null,"dtype":"bf16",'
        '"epilogue_class":"plain","k":256,"m":64,"n":128,"out_dtype":"bf16"}')
    bias = GemmSpec(m=64, n=128, k=256, inputs=(EpilogueInput("bias", "row"),),
                    epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))
    assert epilogue_class(bias) == "add:" + epilogue_class(bias).split(":")[1] and "scaled" not in epilogue_class(bias)


def test_fp8_problems_are_keyed_by_dtypes_and_scaling_not_by_scale_names():
    classes = {epilogue_class(fp8(mode, b_dtype=b)) for mode in ("tensor", "row", "block")
               for b in ("f8e4m3", "f8e5m2")}
    assert len(classes) == 6
    assert epilogue_class(fp8("row")).startswith("scaled_row:")
    assert epilogue_class(fp8("row", b_dtype="f8e5m2")).startswith("scaled_row_f8e5m2:")
    assert problem_key(fp8("row"), "sm_90a") == problem_key(fp8("row", names=("scale_a", "scale_b")), "sm_90a")
    fields = problem_fields(fp8("block"), "sm_90a")
    assert fields["dtype"] == "f8e4m3" and fields["out_dtype"] == "bf16"
    assert problem_key(fp8("row"), "sm_90a") != problem_key(GemmSpec(m=2048, n=4096, k=4096), "sm_90a")


# ---- auto ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
@pytest.mark.parametrize("m", [1, 16, 96, 4096])
def test_the_heuristic_picks_a_valid_fp8_schedule_and_says_so(mode, m, tmp_path):
    spec = fp8(mode, m=m, n=7168, k=7168)
    d = resolve_auto(spec, "sm_90a", db=tmp_path / "none.sqlite")
    assert d.source == "heuristic" and not d.use_cublas and d.detail == FP8_HEURISTIC_NOTE
    assert gemmc.is_valid(d.schedule, spec) and d.schedule.tile[2] in ((128,) if mode == "block" else (64, 128))


def test_symbolic_m_fp8_kernels_choose_per_m_bucket():
    k = gemmc.compile(fp8("row", m="M"), schedule="auto", emit="ir")
    for m in (1, 64, 4096):
        d, kernel = k.for_m(m)
        assert kernel is not None and kernel.plan.scaling.mode == "row" and not d.use_cublas


@pytest.fixture
def db(tmp_path):
    with TuningDB(tmp_path / "t.sqlite") as d:
        yield d


@pytest.mark.parametrize("mode,falls_back", [("row", True), ("tensor", True), ("block", False)])
def test_torch_scaled_mm_runs_where_the_db_measured_it_faster(db, mode, falls_back):
    spec = fp8(mode)
    s = Schedule(tile=(128, 128, 128))
    db.record(spec, "sm_90a", Measurement(s, 50.0, cublas_us=40.0), H200)      # torch's fp8 GEMM faster
    d = resolve_auto(spec, "sm_90a", db=db)
    assert (d.source, d.schedule, d.use_cublas) == ("db", s, falls_back)
    if not falls_back:
        assert BLOCKWISE_KEEPS_THE_KERNEL in d.detail
    # an epilogue keeps the kernel
    biased = fp8(mode, inputs=(EpilogueInput("bias", "row"),), epilogue=(EpilogueOp("add", (Ref.acc(),
                                                                                              Ref.input("bias"))),))
    db.record(biased, "sm_90a", Measurement(s, 50.0, cublas_us=40.0), H200)
    assert not resolve_auto(biased, "sm_90a", db=db).use_cublas
    # a faster gemmc keeps the kernel
    other = fp8(mode, m=1024)
    db.record(other, "sm_90a", Measurement(s, 30.0, cublas_us=40.0), H200)
    assert not resolve_auto(other, "sm_90a", db=db).use_cublas


def test_fp8_never_takes_a_torch_matmul_fallback():
    from gemmc.compiler import output_casts
    assert output_casts(fp8("row")) is None and output_casts(GemmSpec(out_dtype="f32")) == ("f32",)


# ---- the torch._scaled_mm route ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["tensor", "row"])
def test_the_scaled_mm_route_checks_then_runs_torch_scaled_mm(mode):
    spec = fp8(mode, m="M", n=256, k=512)
    params = gemmc.compile(spec, schedule=Schedule(tile=(128, 128, 128))).emitted.params
    route = ScaledMmRoute(spec, params, device_type="cpu")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(32, 512, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(256, 512, generator=g).to(torch.float8_e4m3fn)
    sa, sb = (torch.full((1,), 0.5), torch.full((1,), 2.0)) if mode == "tensor" else (torch.rand(32), torch.rand(256))
    out = route(a, b, sa, sb)
    want = (a.float() * (sa if mode == "tensor" else sa[:, None])) @ (b.float() * (sb if mode == "tensor"
                                                                                    else sb[:, None])).T
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), want, rtol=2e-2, atol=1e-2)
    with pytest.raises(LaunchError, match="sx must be f32"):
        route(a, b, sa.bfloat16(), sb)
    with pytest.raises(LaunchError, match="a must be f8e4m3"):
        route(a.to(torch.bfloat16), b, sa, sb)


def test_the_scaled_mm_route_refuses_blockwise_and_epilogues():
    with pytest.raises(gemmc.SpecError, match="per-tensor or per-row scales and no epilogue op"):
        ScaledMmRoute(fp8("block"), (), device_type="cpu")
    assert fp8("row").plain_scaled and not fp8("block").plain_scaled
    assert not fp8("row", epilogue=(EpilogueOp("relu", (Ref.acc(),)),)).plain_scaled


# ---- gemmc-search tune --dtype fp8 ---------------------------------------------------------------------

@pytest.mark.parametrize("argv,needle", [
    (["--dtype", "fp8"], "--dtype fp8 needs --scaling tensor, row or block"),
    (["--scaling", "row"], "--scaling row scales fp8 inputs: add --dtype fp8"),
    (["--dtype", "fp8", "--scaling", "block", "--symbolic"], "block scales need a static N and K"),
])
def test_tune_flags_pair_fp8_with_a_scaling(argv, needle, capsys):
    from gemmc.search import cli
    rc = cli.main(["tune", "--suite", "llm", *argv])
    assert rc != 0 and needle in capsys.readouterr().err


def test_tune_builds_fp8_problems_of_the_scaling(monkeypatch):
    """The tune loop reads "fp8-<scaling>" as an fp8 GemmSpec; its search space is fp8's."""
    from gemmc.bench.fp8 import spec_kwargs
    from gemmc.search.strategy import SearchProblem
    spec = GemmSpec(4096, 7168, 7168, **spec_kwargs("fp8-block"))
    cands = SearchProblem.of(spec, "sm_90a").candidates
    assert spec.scaling.mode == "block" and cands and all(s.tile[2] == 128 for s in cands)
