"""gemmc.compile(..., cache_dir=DIR): every kernel of the compile (each M bucket's too) is built into and
loaded from DIR, `auto` reads DIR/tuning.sqlite, nothing goes to GEMMC_CACHE_DIR; `k.artifacts` and the
public M-bucket list (gemmc.choose.m_buckets.M_BUCKETS)."""
from pathlib import Path
from types import SimpleNamespace

import pytest

import gemmc
from gemmc.compiler import CompiledGemm
from gemmc.choose.decision import Decision
from gemmc.choose.shipped_steps import heuristic_schedule
from gemmc.choose.m_buckets import BUCKETS, M_BUCKETS, bucket_of, range_label
from gemmc.schedule import enumerate_schedules, is_valid
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement, SearchProblem

from conftest import mixed_weights

LABELS = [range_label(*r) for r in M_BUCKETS]


@pytest.fixture
def aot_host(monkeypatch, tmp_path):
    """No GPU named or visible, no GEMMC_TUNING_DB, and GEMMC_CACHE_DIR an empty folder of its own
    (returned): what cache_dir must leave alone."""
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)
    monkeypatch.delenv("GEMMC_TUNING_DB", raising=False)
    env = tmp_path / "env-cache"
    env.mkdir()
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(env))
    return env


def test_every_kernel_is_built_into_cache_dir_and_nothing_under_gemmc_cache_dir(aot_host, tmp_path, monkeypatch,
                                                                                 count_compiles):
    """Real builds (CPU): the default kernel and a second bucket's; a middle bucket runs torch.matmul."""
    spec = gemmc.GemmSpec("M", 256, 256)
    small = heuristic_schedule(spec, "sm_90a")
    large = next(s for s in enumerate_schedules(spec, "sm_90a") if s.tile != small.tile and s.cluster == (1, 1))
    asked = []

    def resolve(spec_, arch, m=None, db=None, **kw):    # three routes: small kernel, torch.matmul, large kernel
        asked.append(db)
        if m is None or m <= 16:
            return Decision(small, "heuristic")
        return Decision(small, "db", use_cublas=True) if m <= 256 else Decision(large, "db")
    monkeypatch.setattr("gemmc.choose.auto.resolve_auto", resolve)

    mine = tmp_path / "mine"
    k = gemmc.compile(spec, schedule="auto", cache_dir=str(mine))
    assert k.cache_dir == mine and k.schedule == small
    art = k.build()                                   # compatible: the default kernel's artifact
    assert Path(art.so_path).is_relative_to(mine) and k.kernel.cache.root == mine
    assert len(count_compiles) == 2                   # the default kernel and the large bucket's
    arts = k.artifacts                                # everything is built: only cache hits
    assert len(count_compiles) == 2
    assert list(arts) == LABELS
    for (lo, hi), label in zip(M_BUCKETS, LABELS):
        if hi is not None and hi <= 16:
            assert arts[label] == art
        elif hi is not None and hi <= 256:
            assert arts[label] is None
        else:
            assert arts[label].key != art.key and Path(arts[label].so_path).is_relative_to(mine)
            assert arts[label] == k.for_m(lo)[1].artifact
    assert len(list(mine.glob("kernels/*/*/kernel.so"))) == 2 and (mine / "sources").is_dir()
    assert set(asked) == {mine / "tuning.sqlite"}     # the compile and every bucket read the cache's DB
    assert len(asked) == 1 + len(BUCKETS)
    assert list(aot_host.rglob("*")) == []            # GEMMC_CACHE_DIR: nothing written, not even a lock


def _db_pick(spec, symbolic):
    """A schedule valid for the symbolic-M spec that the heuristic would not pick at spec's M."""
    heuristic = heuristic_schedule(spec, "sm_90a")
    return next(s for s in SearchProblem.of(spec).candidates
                if is_valid(s, symbolic) and s.tile != heuristic.tile and s.split_k == 1)


def test_auto_reads_the_tuning_db_in_cache_dir_unless_gemmc_tuning_db_is_set(aot_host, tmp_path, monkeypatch,
                                                                            capsys):
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    spec, symbolic = gemmc.GemmSpec(256, 4096, 4096), gemmc.GemmSpec("M", 4096, 4096)
    pick = _db_pick(spec, symbolic)
    cache = tmp_path / "aot"
    with TuningDB(cache / "tuning.sqlite") as db:
        db.record(spec, "sm_90a", Measurement(pick, 40.0, None, 45.0), "H200")
    k = gemmc.compile(spec, schedule="auto", cache_dir=cache)
    assert k.decision.source == "db" and k.schedule == pick
    assert gemmc.compile(spec, schedule="auto").decision.source != "db"       # GEMMC_CACHE_DIR's: no DB
    ks = gemmc.compile(symbolic, schedule="auto", cache_dir=cache)
    d, kernel = ks.for_m(200)                                                  # the M = 256 bucket
    assert d.source == "db" and kernel.schedule == pick and kernel.cache_dir == cache
    assert ks.for_m(1000)[0].source != "db"

    # `gemmc build --cache-dir`: schedule flags edit auto's pick from that DB (here --raster keeps it whole)
    from gemmc.cli import main
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build",
                        lambda self: SimpleNamespace(key=f"key-{self.schedule.short()}", directory=str(cache)))
    assert main(["build", "--m", "256", "--n", "4096", "--k", "4096", "--cache-dir", str(cache),
                 "--raster", pick.raster]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[1] == pick.short() and lines[-1] == f"cache: {cache}"

    monkeypatch.setenv("GEMMC_TUNING_DB", str(tmp_path / "elsewhere.sqlite"))      # set: it wins
    assert gemmc.compile(spec, schedule="auto", cache_dir=cache).decision.source != "db"


def test_a_file_as_cache_dir_is_refused_before_anything_compiles(tmp_path, monkeypatch, capsys, count_compiles):
    plain = tmp_path / "plain"
    plain.write_text("not a folder\n")
    spec = gemmc.GemmSpec(256, 256, 256)
    with pytest.raises(gemmc.SpecError) as e:
        gemmc.compile(spec, schedule="heuristic", cache_dir=plain)
    assert str(e.value).startswith(f"cache_dir={str(plain)!r}: {plain} is a file, not a folder; pass a folder")
    assert "leave cache_dir out to use GEMMC_CACHE_DIR" in str(e.value)
    with pytest.raises(gemmc.SpecError, match=r"cache_dir=42: not a folder's path"):
        gemmc.compile(spec, schedule="heuristic", cache_dir=42)

    from gemmc.cli import main
    assert main(["build", "--m", "256", "--n", "256", "--k", "256", "--schedule", "heuristic",
                 "--cache-dir", str(plain)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gemmc build: error: --cache-dir {plain}: {plain} is a file, not a folder")
    assert "leave --cache-dir out" in err and count_compiles == []
    assert plain.read_text() == "not a folder\n"

    monkeypatch.setenv("HOME", str(tmp_path))                  # `~` expanded, the path made absolute
    assert gemmc.compile(spec, schedule="heuristic", cache_dir="~/c").cache_dir == tmp_path / "c"
    monkeypatch.chdir(tmp_path)
    assert gemmc.compile(spec, schedule="heuristic", cache_dir="rel").cache_dir == tmp_path / "rel"


def test_the_public_bucket_list_is_what_calls_route_by(shipped_only, monkeypatch):
    assert M_BUCKETS[0][0] == 1 and M_BUCKETS[-1][1] is None and len(M_BUCKETS) == len(BUCKETS)
    for (lo, hi), (next_lo, _), b in zip(M_BUCKETS, M_BUCKETS[1:] + ((None, None),), BUCKETS):
        assert bucket_of(lo) == b and (hi is None or (hi == b and next_lo == hi + 1))
    assert bucket_of(10 ** 7) == BUCKETS[-1] and LABELS[:3] == ["1..1", "2..2", "3..4"] and LABELS[-1] == "32769.."

    n, k_, won_m, lost_m = mixed_weights(shipped_only)
    k = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="auto")
    rows = k.m_buckets.describe()
    assert [label for label, _, _ in rows] == LABELS
    built = []
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build",
                        lambda self: built.append(self) or SimpleNamespace(key=self.schedule.short()))
    arts = k.artifacts
    assert list(arts) == LABELS and "torch.matmul" in {route for _, _, route in rows}
    for (lo, hi), (label, decision, route) in zip(M_BUCKETS, rows):
        for m in (lo, hi or 10 ** 6):                    # both ends of a range take the same route
            d, kernel = k.for_m(m)
            assert d == decision
            assert route == ("torch.matmul" if kernel is None else kernel.schedule.short())
            assert arts[label] == (None if kernel is None else SimpleNamespace(key=kernel.schedule.short()))
    assert arts[LABELS[BUCKETS.index(lost_m)]] is None and arts[LABELS[BUCKETS.index(won_m)]] is not None

    # without M buckets: {"all": ...}, None where `auto` runs torch.matmul
    fixed = gemmc.compile(gemmc.GemmSpec("M", n, k_), schedule="heuristic")
    assert fixed.artifacts == {"all": SimpleNamespace(key=fixed.schedule.short())}
    lost = gemmc.compile(gemmc.GemmSpec(lost_m, n, k_), schedule="auto")
    assert isinstance(lost, CompiledGemm) and lost.decision.use_cublas and lost.artifacts == {"all": None}
    assert gemmc.compile(gemmc.GemmSpec(256, 32001, 4096), schedule="auto").artifacts == {"all": None}
