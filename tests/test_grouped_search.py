"""Grouped GEMMs in `auto` and the search: keyed by (E, N, K, rows-per-group bucket), never another problem's DB
entries; `gemmc-search tune --suite moe` records them (a fake runner here), and `auto` then picks the DB's best for
every M of the bucket; the heuristic's picks are valid for any rows per group."""
import pytest
from hypothesis import given, settings, strategies as st

from gemmc.bench.suites import GroupedShape, get_suite
from gemmc.choose.auto import resolve_auto
from gemmc.choose.group_keys import rows_bucket, rows_per_group
from gemmc.choose.tuning_db_schema import problem_fields, problem_key
from gemmc.schedule import check_schedule
from gemmc.search.db import TuningDB
from gemmc.search.runner import Runner
from gemmc.search.strategy import Measurement
from gemmc.spec import GemmSpec

from search_fakes import InlineBuilder

UP = GroupedShape("qwen3-30b-a3b", "up", 16)


def test_the_moe_suite_holds_every_models_projections_at_their_buckets():
    shapes = get_suite("moe")
    assert {(s.model, s.projection) for s in shapes} >= {("deepseek-v3", "up"), ("mixtral-8x7b", "down")}
    deepseek = sorted(s.rows for s in shapes if s.model == "deepseek-v3" and s.projection == "up")
    assert deepseek == [1, 2, 16, 128, 512]          # 1 .. 16384 tokens, top-8 of 256 experts
    spec = UP.spec()
    assert (spec.m, spec.n, spec.k, spec.groups, spec.gate) == (128 * 16, 768, 2048, 128, "silu")
    assert str(UP) == "qwen3-30b-a3b/up/16" and UP.m == spec.m


def test_the_db_key_is_the_rows_bucket_and_never_a_plain_problems():
    spec = UP.spec()
    fields = problem_fields(spec, "sm_90a")
    assert (fields["m"], fields["batch"], fields["epilogue_class"].split("/")[0]) == (16, 128, "grouped_contiguous")
    same_bucket = spec.with_dims(m=128 * 9)          # 9 rows per group: bucket 16
    assert problem_key(same_bucket, "sm_90a") == problem_key(spec, "sm_90a")
    assert problem_key(spec.with_dims(m=128 * 17), "sm_90a") != problem_key(spec, "sm_90a")
    plain = GemmSpec(m=16, n=768, k=2048, batch=128)
    assert problem_key(plain, "sm_90a") != problem_key(spec, "sm_90a")
    masked = GemmSpec(m=16, n=768, k=2048, groups=128, group_layout="masked")
    assert problem_fields(masked, "sm_90a")["epilogue_class"].startswith("grouped_masked/")
    with pytest.raises(ValueError, match="known group count"):
        problem_fields(spec.with_dims(groups="E"), "sm_90a")



def test_tune_on_the_moe_suite_then_auto_takes_the_dbs_best_for_the_bucket(tmp_path):
    from gemmc.search import tune
    seen = []

    def measure(spec, s, arch):      # a fake GPU on which the 64 x 96 ping-pong tile is fastest
        assert spec.grouped and spec.groups == 128
        seen.append(spec)
        fast = s.tile == (64, 96, 64) and s.mode == "pingpong" and s.cluster == (1, 1)
        return Measurement(s, 10.0 if fast else 20.0 + s.tile[1] / 64, None, cublas_us=15.0)

    db = TuningDB(tmp_path / "t.sqlite")
    candidates = [s for s in __import__("gemmc.search.strategy", fromlist=["SearchProblem"]).SearchProblem.of(
        UP.spec()).candidates]
    pick = next(s for s in candidates if s.tile == (64, 96, 64) and s.mode == "pingpong" and s.cluster == (1, 1))
    summary = tune([UP], dtype="bf16", arch="sm_90a", strategy="exhaustive", budget=len(candidates), batch=8, db=db,
                   builder=InlineBuilder(), runner=Runner(measure_fn=measure), gpu_name="fake", progress=False,
                   confirm=0, symbolic=True)
    ((shape, best),) = summary
    assert shape == UP and best.schedule == pick and len(seen) == len(candidates)
    symbolic = UP.spec().with_dims(m="M")
    for m in (128 * 9, 128 * 16):                    # both in the bucket of 16 rows per group
        d = resolve_auto(symbolic, "sm_90a", m=m, db=db, gpu_name="fake")
        assert (d.source, d.schedule) == ("db", pick) and "16 rows per group" in d.detail
    other = resolve_auto(symbolic, "sm_90a", m=128 * 200, db=db, gpu_name="fake")
    assert other.source == "heuristic"
    # a plain GEMM of the same N and K never borrows the grouped entry
    plain = resolve_auto(GemmSpec(m=2048, n=768, k=2048), "sm_90a", db=db, gpu_name="fake")
    assert plain.source != "db"


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(["contiguous", "masked"]), groups=st.sampled_from([1, 8, 128, 256, "E"]),
       n=st.sampled_from([768, 1536, 2048, 4096, 7168, 14336]), k=st.sampled_from([768, 2048, 4096, 7168]),
       gate=st.sampled_from([None, "silu"]), m=st.integers(1, 1 << 17))
def test_the_heuristic_picks_a_valid_schedule_for_any_rows_per_group(layout, groups, n, k, gate, m):
    spec = GemmSpec(m="M", n=n, k=k, groups=groups, group_layout=layout, gate=gate)
    d = resolve_auto(spec, "sm_90a", m=m, db=None)
    assert not check_schedule(d.schedule, spec.with_dims(m=m)) and not d.use_cublas
    rows = rows_per_group(spec, m)
    if rows <= 64:
        assert d.schedule.mode == "pingpong"         # decode: the most CTAs stream the weights
    assert rows_bucket(rows) >= rows and rows_bucket(rows) < 2 * max(rows, 1)
