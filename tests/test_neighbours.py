"""One neighbour rule (gemmc/choose/neighbours.py) for the tuning DB's step 3 and the shipped table's step 4: the
same N and K, M within 2x, the nearest M first (the smaller on a tie), and a pick that is not valid for the
problem gives way to the next neighbour."""
from types import SimpleNamespace

import pytest

import gemmc
from gemmc import Schedule
from gemmc.choose.auto import resolve_auto
from gemmc.choose.neighbours import m_neighbours
from gemmc.choose.pretuned import PretunedEntry, PretunedTable
from gemmc.choose.shipped_steps import pretuned_decision
from gemmc.schedule import is_valid
from gemmc.search.db import TuningDB
from gemmc.search.strategy import Measurement

SPEC = gemmc.GemmSpec(256, 4096, 4096)
INVALID = Schedule(tile=(256, 256, 64))                  # too many accumulator registers at any shape
VALID = Schedule(tile=(128, 128, 64), mode="pingpong")
OTHER = Schedule(tile=(128, 256, 64))


def _shape(x):
    return (x.m, x.n, x.k)


def test_the_rule():
    at = [SimpleNamespace(m=m, n=n, k=k) for m, n, k in
          [(512, 4096, 4096), (128, 4096, 4096), (384, 4096, 4096), (256, 4096, 4096), (600, 4096, 4096),
           (256, 4096, 8192), (100, 4096, 4096)]]
    near = m_neighbours(at, (256, 4096, 4096), _shape)
    # 384 first (log2 1.5), then 128 and 512 tied at 2x (the smaller first); not 256 itself, not beyond 2x
    # (600, 100), not another K
    assert [x.m for x in near] == [384, 128, 512]


def _table(*entries):
    return PretunedTable("NVIDIA H200", "sm_90a", "test",
                         {(m, n, k): PretunedEntry(m, n, k, s, 10.0, 12.0) for m, n, k, s in entries})


def test_the_table_s_neighbour_with_an_invalid_pick_gives_way_to_the_next():
    assert not is_valid(INVALID, SPEC) and is_valid(VALID, SPEC)
    table = _table((384, 4096, 4096, INVALID), (512, 4096, 4096, VALID))
    d, exact = pretuned_decision(table, SPEC)
    assert (d.schedule, d.source, exact) == (VALID, "pretuned", False) and "measured 512x4096x4096" in d.detail
    assert pretuned_decision(_table((384, 4096, 4096, INVALID)), SPEC) is None


def test_an_invalid_exact_entry_gives_way_to_its_neighbour():
    d, exact = pretuned_decision(_table((256, 4096, 4096, INVALID), (128, 4096, 4096, VALID)), SPEC)
    assert (d.schedule, exact) == (VALID, False)


@pytest.fixture
def no_tables(monkeypatch):
    monkeypatch.setenv("GEMMC_PRETUNED", "0")
    monkeypatch.setattr("gemmc.choose.gpu._visible_gpu", lambda: None)
    monkeypatch.delenv("GEMMC_GPU", raising=False)


def test_the_db_and_the_table_take_the_same_neighbour(tmp_path, no_tables):
    """Neighbours at 2x on either side: both steps lend the smaller M's pick."""
    table = _table((128, 4096, 4096, VALID), (512, 4096, 4096, OTHER))
    assert pretuned_decision(table, SPEC)[0].schedule == VALID
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.record(SPEC.with_dims(m=512), "sm_90a", Measurement(OTHER, 40.0, cublas_us=50.0), "NVIDIA H200")
        db.record(SPEC.with_dims(m=128), "sm_90a", Measurement(VALID, 40.0, cublas_us=50.0), "NVIDIA H200")
        d = resolve_auto(SPEC, "sm_90a", db=db)
    assert (d.source, d.schedule, d.detail) == ("nearest", VALID, "tuned 128x4096x4096")
