"""`simulate`'s statistics on hand-made datasets whose answers are known, and its errors on bad ones."""
import json

import pytest
import torch

import gemmc
from gemmc.errors import GemmcError
from gemmc.schedule import Schedule, is_valid
from gemmc.search.cli import main
from gemmc.search.simulate import group_problems, simulate
from gemmc.search.strategy import SearchProblem

torch.set_num_threads(1)

SPEC = gemmc.GemmSpec(256, 4096, 4096)
CANDS = SearchProblem.of(SPEC).candidates
# a schedule an older gemmc could have recorded that today's predicate rejects (a 4x4 cluster)
REJECTED = Schedule(tile=(256, 256, 64), cluster=(4, 4))


def _rec(s, t, m=256, **kw):
    return {"m": m, "n": 4096, "k": 4096, "schedule": s.to_dict(), "time_us": t,
            "error": None if t is not None else "boom", **kw}


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_best_is_the_best_the_search_can_reach():
    """A faster record the validity predicate rejects is no strategy's to find: exhaustive over the whole
    feasible set must read 1.0, not best_feasible / rejected_time."""
    assert not is_valid(REJECTED, SPEC)
    recs = [_rec(s, 10.0 + i) for i, s in enumerate(CANDS[:6])] + [_rec(REJECTED, 5.0)]
    (p,) = group_problems(recs)
    assert p.best_us == 10.0
    res = simulate([p], ["exhaustive"], [6], seeds=1)
    assert res["exhaustive"]["6"]["median_fraction"] == 1.0


def test_a_problem_whose_only_successes_are_infeasible_is_left_out():
    recs = [_rec(s, None) for s in CANDS[:3]] + [_rec(REJECTED, 5.0)]
    recs += [_rec(s, 10.0 + i, m=512) for i, s in enumerate(CANDS[:3])]
    assert [p.spec.m for p in group_problems(recs)] == [512]


def _problems(n=4):
    """n problems with 8 schedules each, times 10..17 in a per-problem order: random rarely finds the best."""
    recs = []
    for j in range(n):
        for i, s in enumerate(CANDS[:8]):
            recs.append(_rec(s, 10.0 + (i * (j + 3)) % 8, m=256 * (j + 1)))
    return group_problems(recs)


def test_score_vs_random_is_there_when_random_is_not_asked_for():
    """The JSON promises {"median_fraction", "score_vs_random"} per strategy and budget; without
    `random` among the strategies the score was null. The baseline runs anyway and is not reported."""
    probs = _problems()
    alone = simulate(probs, ["exhaustive"], [2, 4], seeds=3)
    both = simulate(probs, ["exhaustive", "random"], [2, 4], seeds=3)
    assert set(alone) == {"exhaustive"}
    for b in ("1", "2", "4"):
        assert isinstance(alone["exhaustive"][b]["score_vs_random"], float)
        assert alone["exhaustive"][b] == both["exhaustive"][b]


def test_score_vs_random_formula():
    probs = _problems()
    res = simulate(probs, ["exhaustive", "random"], [2, 8], seeds=4)
    for b in ("1", "2", "8"):
        f, r = res["exhaustive"][b]["median_fraction"], res["random"][b]["median_fraction"]
        assert 0.0 < f <= 1.0 and 0.0 < r <= 1.0
        assert res["random"][b]["score_vs_random"] == 0.0
        if r < 1.0:
            assert res["exhaustive"][b]["score_vs_random"] == pytest.approx((f - r) / (1.0 - r))
    # the whole space measured: everyone at the optimum, and no division by zero
    assert res["random"]["8"]["median_fraction"] == 1.0 == res["exhaustive"]["8"]["median_fraction"]
    assert res["exhaustive"]["8"]["score_vs_random"] == 0.0


def test_seeds_vary_random_and_fix_it():
    probs = _problems()
    a = simulate(probs, ["random"], [2], seeds=1)
    b = simulate(probs, ["random"], [2], seeds=1)
    c = simulate(probs, ["random"], [2], seeds=6)
    assert a == b and a["random"]["2"] != c["random"]["2"]


def test_rl_with_nothing_to_train_on_is_one_line(tmp_path, capsys):
    """Two problems of one recorded schedule each: the training folds have no ranking to learn, which
    was a ValueError traceback out of `gemmc-search simulate --strategy all`."""
    data = _write(tmp_path / "one-each.jsonl", [_rec(CANDS[0], 10.0), _rec(CANDS[0], 12.0, m=512)])
    with pytest.raises(GemmcError, match="two measured schedules"):
        simulate(group_problems([_rec(CANDS[0], 10.0), _rec(CANDS[0], 12.0, m=512)]), ["rl"], [2], seeds=1)
    assert main(["simulate", "--data", str(data), "--strategy", "all", "--budget", "2", "--seeds", "1",
                 "--epochs", "1", "--json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gemmc-search simulate: error: ") and err.count("\n") == 1 and "rl" in err


@pytest.mark.parametrize("field,value,needle", [("m", "abc", "record 2"), ("time_us", "fast", "record 2"),
                                                ("schedule", {"tiles": [1]}, "record 2")])
def test_a_malformed_record_is_one_line_naming_it(tmp_path, capsys, field, value, needle):
    data = _write(tmp_path / "bad.jsonl", [_rec(CANDS[0], 10.0), {**_rec(CANDS[1], 9.0), field: value}])
    assert main(["simulate", "--data", str(data), "--strategy", "random", "--budget", "2", "--seeds", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gemmc-search simulate: error: ") and needle in err and err.count("\n") == 1
