import os

import pytest
from hypothesis import settings

# CI has two cores and no GPU: keep hypothesis quick and deterministic there.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("GEMMC_HYPOTHESIS", "dev"))


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run with -m gpu on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Tests never touch the user's ~/.cache/gemmc: each session gets its own cache dir."""
    if "GEMMC_TEST_CACHE_DIR" not in os.environ:
        os.environ["GEMMC_TEST_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "gemmc-cache")
    monkeypatch.setenv("GEMMC_CACHE_DIR", os.environ["GEMMC_TEST_CACHE_DIR"])


@pytest.fixture
def shipped_only(monkeypatch, tmp_path):
    """No tuning DB, no GPU visible (an ahead-of-time build): `auto` reads the shipped sm_90a table,
    then the heuristic. Returns that table."""
    from gemmc.pretuned import table_for
    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "none.sqlite"))
    monkeypatch.setattr("gemmc.pretuned._visible_gpu", lambda: None)
    return table_for("sm_90a")


def mixed_weights(table):
    """(n, k, won_m, lost_m) of the first (N, K) in `table` whose M = 16 or 64 entry runs a gemmc kernel and
    whose M = 128 or 256 entry runs torch.matmul (cuBLAS measured faster): the tests of per-M routing
    use it, and a re-tuned table moves which shape that is."""
    for n, k in sorted({(n, k) for _, n, k in table.entries}):
        won = [m for m in (64, 16) if (m, n, k) in table.entries and not table.entries[(m, n, k)].cublas_faster]
        lost = [m for m in (256, 128) if (m, n, k) in table.entries and table.entries[(m, n, k)].cublas_faster]
        if won and lost:
            return n, k, won[0], lost[0]
    raise AssertionError("the shipped table has no (N, K) with a kernel at small M and cuBLAS at M 128-256")


def not_a_tuning_db(tmp_path):
    """{kind: path} of files a tuning-DB path could point at by mistake: unreadable bytes, an empty file, a
    foreign sqlite DB (with tables of gemmc's names but not its columns) and a folder."""
    import sqlite3
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_text("not a database\n" * 100)
    zero = tmp_path / "zero.sqlite"
    zero.write_bytes(b"")
    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE measurements (x INTEGER)")
    conn.execute("CREATE TABLE policies (y INTEGER)")
    conn.commit()
    conn.close()
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"corrupt": corrupt, "zero": zero, "foreign": foreign, "folder": folder}


@pytest.fixture
def fp32_precision_tf32():
    """torch's newer precision API set to TF32 for the test (skipped where torch has no such API), restored
    after. Returns torch.backends.cuda.matmul."""
    import torch
    cuda = torch.backends.cuda.matmul
    if not hasattr(cuda, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision API")
    before = cuda.fp32_precision
    cuda.fp32_precision = "tf32"
    yield cuda
    cuda.fp32_precision = before


@pytest.fixture
def count_compiles(monkeypatch):
    """The entries compiled during the test (gemmc.build.compile_with_ptx calls)."""
    import gemmc.build as gb
    calls = []
    real = gb.compile_with_ptx

    def counting(emitted, *args, **kwargs):
        calls.append(emitted.entry)
        return real(emitted, *args, **kwargs)

    monkeypatch.setattr(gb, "compile_with_ptx", counting)
    return calls
