"""schedule="auto" decides from data measured on the problem and GPU the calls run on (gemmc/choose/auto.py)."""
import pytest

import gemmc
from gemmc.choose.auto import resolve_auto
from gemmc.choose.pretuned import table_for
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem
from gemmc.spec import EpilogueInput, EpilogueOp, Ref

H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
SPEC = gemmc.GemmSpec(300, 4096, 4096)      # a shape the shipped table does not have


@pytest.fixture
def no_gpu(monkeypatch):
    """No GPU visible and none named: each test names the GPU it decides for."""
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)


@pytest.fixture
def two_gpu_db(tmp_path, no_gpu):
    """SPEC tuned on two GPUs: on the H100 candidate 3 beats cuBLAS 2x; on the H200 candidate 5 loses to it."""
    c = SearchProblem.of(SPEC).candidates
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.record(SPEC, "sm_90a", Measurement(c[3], 50.0, None, 100.0), H100)
        db.record(SPEC, "sm_90a", Measurement(c[5], 50.0, None, 40.0), H200)
    return path, c[3], c[5]


def test_the_db_verdict_is_the_one_measured_on_the_gpu_named(two_gpu_db, monkeypatch):
    path, h100_pick, h200_pick = two_gpu_db
    monkeypatch.setenv("GEMMC_GPU", H200)
    d = resolve_auto(SPEC, "sm_90a", db=path)
    assert (d.source, d.schedule, d.use_cublas) == ("db", h200_pick, True) and H200 in d.detail
    monkeypatch.setenv("GEMMC_GPU", H100)
    d = resolve_auto(SPEC, "sm_90a", db=path)
    assert (d.source, d.schedule, d.use_cublas) == ("db", h100_pick, False) and H100 in d.detail
    # an explicit name wins over GEMMC_GPU, as for the shipped tables
    assert resolve_auto(SPEC, "sm_90a", db=path, gpu_name=H200).schedule == h200_pick


def test_the_db_verdict_is_the_one_measured_on_the_visible_gpu(two_gpu_db, monkeypatch):
    path, h100_pick, h200_pick = two_gpu_db
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: H200)
    d = resolve_auto(SPEC, "sm_90a", db=path)
    assert (d.schedule, d.use_cublas) == (h200_pick, True)
    # a neighbour of SPEC (M within 2x) lends the visible GPU's pick, not the other GPU's
    d = resolve_auto(SPEC.with_dims(m=400), "sm_90a", db=path)
    assert (d.source, d.schedule) == ("nearest", h200_pick)


def test_a_gpu_the_db_never_measured_takes_none_of_its_rows(two_gpu_db, monkeypatch):
    path, _, _ = two_gpu_db
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: "NVIDIA GH200 480GB")
    assert resolve_auto(SPEC, "sm_90a", db=path).source == "heuristic"
    assert resolve_auto(SPEC.with_dims(m=400), "sm_90a", db=path).source == "heuristic"


def test_an_ahead_of_time_build_naming_no_gpu_takes_the_best_gpus_rows(two_gpu_db):
    path, h100_pick, _ = two_gpu_db
    d = resolve_auto(SPEC, "sm_90a", db=path)
    assert (d.schedule, d.use_cublas) == (h100_pick, False)       # the higher paired speed-up, 2x


def test_compile_auto_follows_the_named_gpus_verdict(two_gpu_db, monkeypatch):
    path, _, h200_pick = two_gpu_db
    monkeypatch.setenv("GEMMC_TUNING_DB", str(path))
    monkeypatch.setenv("GEMMC_GPU", H200)
    k = gemmc.compile(SPEC, schedule="auto", emit="ir")
    assert k.schedule == h200_pick and k.decision.use_cublas


# ---- k.decision says what runs, and why ------------------------------------------------------------------

BIAS = dict(inputs=(EpilogueInput("bias", "row"),), epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))


@pytest.fixture
def h200_table(no_gpu, monkeypatch, tmp_path):
    """No tuning DB; the shipped H200 table."""
    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "none.sqlite"))
    monkeypatch.setenv("GEMMC_GPU", H200)
    return table_for("sm_90a")


def test_a_fused_epilogue_on_a_cublas_win_says_the_kernel_runs_anyway(h200_table):
    lost = next(e for e in h200_table.entries.values() if e.cublas_faster)
    d = resolve_auto(gemmc.GemmSpec(lost.m, lost.n, lost.k, **BIAS), "sm_90a")
    assert d.source == "pretuned" and not d.use_cublas
    assert f"{lost.time_us:.2f} us vs cuBLAS {lost.cublas_us:.2f} us" in d.detail
    assert "fused epilogue keeps the kernel" in d.detail
    won = next(e for e in h200_table.entries.values() if not e.cublas_faster)
    d = resolve_auto(gemmc.GemmSpec(won.m, won.n, won.k, **BIAS), "sm_90a")
    assert not d.use_cublas and "keeps the kernel" not in d.detail and "measured without the epilogue" in d.detail


def test_the_tables_neighbour_says_which_times_carry_its_verdict(h200_table):
    lost = next(e for (m, n, k), e in sorted(h200_table.entries.items())
                if e.cublas_faster and (m + m // 2, n, k) not in h200_table.entries and m >= 2)
    d = resolve_auto(gemmc.GemmSpec(lost.m + lost.m // 2, lost.n, lost.k), "sm_90a")
    assert d.source == "pretuned" and d.use_cublas
    assert f"measured {lost.m}x{lost.n}x{lost.k}, {lost.time_us:.2f} us vs cuBLAS {lost.cublas_us:.2f} us" in d.detail


def test_a_db_epilogue_pick_slower_than_cublas_says_the_kernel_runs_anyway(tmp_path, no_gpu):
    spec = gemmc.GemmSpec(256, 4096, 4096, **BIAS)
    c = SearchProblem.of(spec).candidates
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.record(spec, "sm_90a", Measurement(c[3], 60.0, None, 40.0), H200)
    d = resolve_auto(spec, "sm_90a", db=tmp_path / "t.sqlite", pretuned=False)
    assert d.source == "db" and not d.use_cublas
    assert "paired 0.667x" in d.detail and "fused epilogue keeps the kernel" in d.detail


def test_a_db_pick_of_an_older_gemmc_says_so(tmp_path, no_gpu, monkeypatch):
    c = SearchProblem.of(SPEC).candidates
    with TuningDB(tmp_path / "t.sqlite") as db:
        with monkeypatch.context() as old:
            old.setattr("gemmc.search.db.__version__", "0.0.1")
            db.record(SPEC, "sm_90a", Measurement(c[3], 50.0, None, 60.0), H200)
        db.record(SPEC.with_dims(m=512), "sm_90a", Measurement(c[4], 50.0, None, 60.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=tmp_path / "t.sqlite", pretuned=False)
    assert d.schedule == c[3] and f"rows of gemmc 0.0.1, older than this {gemmc.__version__}" in d.detail
    d = resolve_auto(SPEC.with_dims(m=512), "sm_90a", db=tmp_path / "t.sqlite", pretuned=False)
    assert d.schedule == c[4] and "older" not in d.detail


@pytest.mark.parametrize("spec, says", [
    (gemmc.GemmSpec(4096, 4096, 4096, dtype="f16"), "holds plain bf16 A [M, K] @ B [N, K].T, unbatched, only"),
    (gemmc.GemmSpec(4096, 4096, 4096, batch=4), "holds plain bf16 A [M, K] @ B [N, K].T, unbatched, only"),
    (gemmc.GemmSpec(16, 4096, 4096, a_layout="km"), "holds plain bf16 A [M, K] @ B [N, K].T, unbatched, only"),
    (gemmc.GemmSpec(3, 4096, 4096, **BIAS), "a fused epilogue keeps the kernel"),
    (gemmc.GemmSpec(64, 64, 64), "no shape measured on NVIDIA H200 within 8x"),
    (gemmc.GemmSpec("M", 4096, 4096), "symbolic M: no measurement applies (a symbolic-M `auto` compile decides "
                                      "per runtime M: see k.for_m(M))"),
    (gemmc.GemmSpec(64, "N", 4096, batch="L"), "symbolic N and batch: no measurement applies"),
])
def test_the_heuristic_step_says_why_no_measurement_decided(h200_table, spec, says):
    d = resolve_auto(spec, "sm_90a")
    assert d.source == "heuristic" and not d.use_cublas and says in d.detail


def test_another_layout_takes_only_a_cublas_win_of_the_table(h200_table):
    """A plain GEMM in a layout the table did not measure (a backward pass's dX or dW) runs torch.matmul where the
    table has cuBLAS winning the same (M, N, K) as A [M, K] @ B [N, K].T; a gemmc win there does not carry over,
    and an epilogue keeps the kernel."""
    assert resolve_auto(gemmc.GemmSpec(4096, 4096, 4096), "sm_90a").use_cublas        # the table's verdict
    for layouts in (dict(a_layout="km"), dict(b_layout="kn"), dict(a_layout="km", b_layout="kn")):
        d = resolve_auto(gemmc.GemmSpec(4096, 4096, 4096, **layouts), "sm_90a")
        assert d.source == "heuristic" and d.use_cublas, (layouts, d)
        assert "measured cuBLAS faster as A [M, K] @ B [N, K].T at this shape" in d.detail
    near = resolve_auto(gemmc.GemmSpec(4096, 4096, 4104, b_layout="kn"), "sm_90a")     # between measured shapes
    assert near.use_cublas and "nearest shapes measured as A [M, K] @ B [N, K].T" in near.detail
    assert not resolve_auto(gemmc.GemmSpec(16, 4096, 4096), "sm_90a").use_cublas       # gemmc won here
    d = resolve_auto(gemmc.GemmSpec(16, 4096, 4096, b_layout="kn"), "sm_90a")
    assert not d.use_cublas and "holds plain bf16" in d.detail
    d = resolve_auto(gemmc.GemmSpec(4096, 4096, 4096, b_layout="kn", out_dtype="f32"), "sm_90a")
    assert not d.use_cublas


def test_the_heuristic_step_says_when_gemmc_won_nearby(h200_table):
    spec = gemmc.GemmSpec(5, 8192, 8192)         # no entry within 2x in M; the checks near it all won
    assert h200_table.cublas_verdict(spec) == (False, "checks")
    d = resolve_auto(spec, "sm_90a")
    assert d.source == "heuristic" and not d.use_cublas
    assert d.detail == "gemmc won at each of the nearest shapes measured (up to 5, within 8x) on NVIDIA H200 " \
                       "(the heuristic's picks)"


# ---- GEMMC_GPU that names no table ------------------------------------------------------------------------

@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr("gemmc.choose.notices._warned", set())


def test_a_gemmc_gpu_in_the_wrong_case_is_pointed_at_the_known_name(no_gpu, monkeypatch, fresh_warnings):
    monkeypatch.setenv("GEMMC_GPU", "nvidia h200")
    with pytest.warns(UserWarning, match="did you mean 'NVIDIA H200'"):
        assert resolve_auto(SPEC, "sm_90a", db=None).source == "heuristic"


def test_another_gpus_name_is_told_what_auto_does_for_it(no_gpu, monkeypatch, fresh_warnings):
    """An H100's own name must not read as a misspelt H200: following that would run the H200's table there."""
    monkeypatch.setenv("GEMMC_GPU", H100)
    with pytest.warns(UserWarning, match="matches no shipped table") as caught:
        resolve_auto(SPEC, "sm_90a", db=None)
    message = str(caught[0].message)
    assert "If that is a typo (did you mean 'NVIDIA H200'?)" in message
    assert "if it is another GPU, `auto` uses your tuning DB's rows of it, then the heuristic" in message


# ---- the DB's picks that this gemmc cannot run ------------------------------------------------------------

CRASH = "run: CUDA error: an illegal memory access was encountered"


def _record_on_an_older_gemmc(db, monkeypatch, spec, m):
    with monkeypatch.context() as old:
        old.setattr("gemmc.search.db.__version__", "0.0.1")
        db.record(spec, "sm_90a", m, H200)


def test_a_stale_pick_this_gemmc_failed_to_run_is_passed_over(tmp_path, no_gpu, monkeypatch):
    c = SearchProblem.of(SPEC).candidates
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _record_on_an_older_gemmc(db, monkeypatch, SPEC, Measurement(c[3], 50.0, cublas_us=100.0))   # 2x, once
        db.record(SPEC, "sm_90a", Measurement(c[3], None, error=CRASH), H200)        # this gemmc: it crashes
        db.record(SPEC, "sm_90a", Measurement(c[5], 125.0, cublas_us=100.0), H200)   # 0.8x: cuBLAS is faster
        assert db.best(SPEC, "sm_90a", H200).schedule == c[3]                        # the ranking keeps it first
    d = resolve_auto(SPEC, "sm_90a", db=path, gpu_name=H200, pretuned=False)
    assert (d.source, d.schedule, d.use_cublas) == ("db", c[5], True)
    assert "paired 0.800x" in d.detail
    assert f"passed over the DB's {c[3].short()} (gemmc {gemmc.__version__} failed it: {CRASH})" in d.detail


def test_a_stale_pick_this_gemmc_never_measured_still_decides(tmp_path, no_gpu, monkeypatch):
    c = SearchProblem.of(SPEC).candidates
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _record_on_an_older_gemmc(db, monkeypatch, SPEC, Measurement(c[3], 50.0, cublas_us=100.0))
        db.record(SPEC, "sm_90a", Measurement(c[5], 125.0, cublas_us=100.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=path, gpu_name=H200, pretuned=False)
    assert (d.schedule, d.use_cublas) == (c[3], False) and "passed over" not in d.detail


def test_when_every_db_pick_failed_the_order_goes_on_and_says_why(tmp_path, no_gpu, monkeypatch):
    c = SearchProblem.of(SPEC).candidates
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        _record_on_an_older_gemmc(db, monkeypatch, SPEC, Measurement(c[3], 50.0, cublas_us=100.0))
        db.record(SPEC, "sm_90a", Measurement(c[3], None, error="compile: cute.compile failed"), H200)
    d = resolve_auto(SPEC, "sm_90a", db=path, gpu_name=H200, pretuned=False)
    assert d.source == "heuristic" and d.schedule != c[3]
    assert d.detail.endswith(f"passed over the DB's {c[3].short()} (gemmc {gemmc.__version__} failed it: "
                             "compile: cute.compile failed)")


def test_a_db_pick_invalid_under_this_gemmc_gives_way_to_the_next_measured(tmp_path, no_gpu):
    c = SearchProblem.of(SPEC).candidates
    too_deep = c[3].with_(stages=64)                   # more shared memory than an SM has
    assert not gemmc.is_valid(too_deep, SPEC)
    path = tmp_path / "t.sqlite"
    with TuningDB(path) as db:
        db.record(SPEC, "sm_90a", Measurement(too_deep, 40.0, cublas_us=100.0), H200)
        db.record(SPEC, "sm_90a", Measurement(c[5], 50.0, cublas_us=100.0), H200)
    d = resolve_auto(SPEC, "sm_90a", db=path, gpu_name=H200, pretuned=False)
    assert (d.source, d.schedule) == ("db", c[5]) and "paired 2.000x" in d.detail
    assert f"{too_deep.short()} (not valid for this problem under this gemmc)" in d.detail
