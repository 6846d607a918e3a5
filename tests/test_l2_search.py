"""The L2 term in the search, on the CPU: the reward's formula and flags, what a strategy observes under it
(while the DB and the returned results keep the times), a tune with a stand-in profiler (profiles stored and
handed on, a resume reading them back), and replays of a synthetic dataset whose records carry modelled
profiles (the rewards side by side; without profiles time+l2 is the time reward exactly)."""
from __future__ import annotations

import json
import math

import pytest

from gemmc.bench.suites import Shape
from gemmc.choose.measurement import L2Profile, Measurement, ideal_dram_bytes
from gemmc.schedule import Schedule
from gemmc.search.reward import DEFAULT_WEIGHTS, Reward, RewardError, parse_reward
from gemmc.search.strategy import BaseStrategy, SearchProblem, run_search
from gemmc.spec import GemmSpec

from search_fakes import InlineBuilder

SPEC = GemmSpec(m=64, n=4096, k=4096)


def profile(hit: float, dram_ratio: float, spec: GemmSpec = SPEC) -> L2Profile:
    return L2Profile(hit, dram_ratio * ideal_dram_bytes(spec), 0.0, 1750.0, 10.0, 40.0)


# ---- the reward -----------------------------------------------------------------------------------------------

def test_time_plus_l2_scales_the_time_by_the_misses_and_the_excess_bytes():
    s = Schedule()
    r = parse_reward("time+l2", "l2=0.2,dram=0.5")
    assert (r.l2_weight, r.dram_weight) == (0.2, 0.5)
    m = Measurement(s, 10.0, None, 11.0, profile=profile(0.75, 1.5))
    assert r.score(m, SPEC) == pytest.approx(10.0 * (1 + 0.2 * 0.25 + 0.5 * 0.5))
    assert r.score(Measurement(s, 10.0, None, profile=profile(0.9, 0.8)), SPEC) == pytest.approx(10.0 * 1.02)
    assert r.score(Measurement(s, 10.0), SPEC) == 10.0              # no profile: the time
    assert r.score(Measurement(s, None, "boom"), SPEC) is None
    assert parse_reward("time").score(m, SPEC) == 10.0
    shaped = r.shaped(m, SPEC)
    assert shaped.time_us == pytest.approx(r.score(m, SPEC)) and shaped.cublas_us == 11.0 and m.time_us == 10.0
    assert parse_reward("time+l2") == Reward("time+l2", DEFAULT_WEIGHTS["l2"], DEFAULT_WEIGHTS["dram"])
    assert r.describe() == "time+l2 (l2=0.2, dram=0.5)" and parse_reward("time").describe() == "time"


@pytest.mark.parametrize("kind,weights,msg", [
    ("speed", None, "use one of time, time\\+l2"),
    ("time+l2", "l2=x", "write l2=W,dram=W"),
    ("time+l2", "hits=1", "write l2=W,dram=W"),
    ("time+l2", "l2=-1", "weights >= 0"),
    ("time", "l2=1", "--reward time has none"),
])
def test_bad_reward_flags_say_what_they_take(kind, weights, msg):
    with pytest.raises(RewardError, match=msg):
        parse_reward(kind, weights)


class Spy(BaseStrategy):
    """Proposes the candidates in order; remembers the times it observed."""
    name = "spy"

    def propose(self, n):
        return self._take(self.remaining()[:n])


def test_a_strategy_observes_the_score_while_the_results_keep_the_time():
    problem = SearchProblem.of(SPEC)
    cands = problem.candidates[:4]
    prof = {s: profile(0.5, 2.0) for s in cands[:2]}

    def evaluate(schedules):
        return [Measurement(s, 10.0, None, 12.0, profile=prof.get(s)) for s in schedules]
    spy = Spy()
    reward = parse_reward("time+l2")
    prior = [Measurement(cands[0], 9.0, None, 12.0, profile=prof[cands[0]])]
    out = run_search(spy, SearchProblem(SPEC, "sm_90a", cands), evaluate, budget=3, prior=prior, reward=reward)
    assert [m.time_us for m in out] == [10.0, 10.0, 10.0]
    seen = [m.time_us for m in spy.history]
    assert seen == pytest.approx([9.0 * 1.15, 10.0 * 1.15, 10.0, 10.0])      # 1 + 0.1 * 0.5 + 0.1 * 1.0
    spy2 = Spy()
    run_search(spy2, SearchProblem(SPEC, "sm_90a", cands), evaluate, budget=3)
    assert [m.time_us for m in spy2.history] == [10.0] * 3


# ---- a tune with profiles ----------------------------------------------------------------------------------------


def test_tune_profiles_each_batch_stores_it_and_a_resume_reads_it_back(tmp_path):
    from gemmc.search import tune
    from gemmc.search.db import TuningDB
    from gemmc.search.runner import Runner
    from gemmc.search.synthetic import model_profile, model_time_us
    batches = []

    def profiler(spec, schedules):
        batches.append(list(schedules))
        return {s: model_profile(s, spec) for s in schedules}
    db = TuningDB(tmp_path / "t.sqlite")
    shape = Shape(64, 4096, 4096)
    kw = dict(dtype="bf16", arch="sm_90a", strategy="random", batch=2, db=db, builder=InlineBuilder(),
              runner=Runner(measure_fn=lambda spec, s, arch: Measurement(s, model_time_us(s, spec), None, 30.0)),
              gpu_name="fake", progress=False, reward=parse_reward("time+l2"), profiler=profiler)
    tune([shape], budget=4, confirm=1, **kw)
    assert [len(b) for b in batches] == [2, 2]             # the search's batches; not the confirmation
    profs = db.profiles_of(SPEC, "sm_90a", "fake")
    assert set(profs) == {s for b in batches for s in b}
    assert all(p == model_profile(s, SPEC) for s, p in profs.items())
    rows = db.rows()
    assert len(rows) == 5 and all(r["time_us"] == pytest.approx(model_time_us(
        Schedule.from_dict(json.loads(r["schedule"])), SPEC)) for r in rows)      # the DB keeps the times
    # a resume under time+l2 hands the strategy the stored profiles with the stored rows
    seen = []
    import gemmc.search.registry as registry
    real = registry.make_strategy

    def spying(name, **k):
        strat = real(name, **k)
        orig = strat.observe
        strat.observe = lambda results: (seen.extend(results), orig(results))[-1]
        return strat
    registry.make_strategy = spying
    try:
        tune([shape], budget=4, confirm=0, **kw)
    finally:
        registry.make_strategy = real
    assert len(seen) == 4 and all(m.profile is not None for m in seen)
    scores = [(m.time_us, model_time_us(m.schedule, SPEC)) for m in seen]      # observed: the scores
    assert all(a >= t for a, t in scores) and any(a > t for a, t in scores)


# ---- replays ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic_problems(tmp_path_factory):
    from gemmc.search.simulate import group_problems, load_records
    from gemmc.search.synthetic import make_synthetic_dataset
    path = make_synthetic_dataset(tmp_path_factory.mktemp("syn") / "syn.jsonl.gz", n_shapes=3, seed=1,
                                  profiles=True)
    header, records = load_records(path)
    assert all("profile" in r for r in records if r.get("time_us") is not None)
    return group_problems(records, header)


def test_a_replay_hands_the_recorded_profiles_to_the_reward(synthetic_problems):
    from gemmc.search.simulate import profiled_share, simulate
    done, total = profiled_share(synthetic_problems)
    assert 0 < done <= total and done >= 0.95 * total          # every successful record carries one
    p = synthetic_problems[0]
    s = next(iter(p.profiles))
    assert p.evaluate([s])[0].profile == p.profiles[s]
    base = simulate(synthetic_problems, ["exhaustive", "bayes"], [4, 8], seeds=1)
    l2 = simulate(synthetic_problems, ["exhaustive", "bayes"], [4, 8], seeds=1, reward=parse_reward("time+l2"))
    assert base["exhaustive"] == l2["exhaustive"]              # a fixed order does not look at what it observes
    assert set(l2["bayes"]) == {"1", "4", "8"} and all(0 < c["median_fraction"] <= 1 for c in l2["bayes"].values())


def test_without_profiles_time_plus_l2_replays_exactly_as_time(synthetic_problems):
    from dataclasses import replace

    from gemmc.search.simulate import simulate
    bare = [replace(p, profiles={}) for p in synthetic_problems]
    kw = dict(strategies=["bayes"], budgets=[4, 8], seeds=1)
    assert simulate(bare, **kw) == simulate(bare, reward=parse_reward("time+l2", "l2=5,dram=5"), **kw)


def test_profiles_from_a_tuning_db_join_the_replay(synthetic_problems, tmp_path):
    from dataclasses import replace

    from gemmc.search.db import TuningDB
    from gemmc.search.simulate import attach_profiles
    bare = [replace(p, profiles={}) for p in synthetic_problems]
    p = bare[0]
    s = next(s for s, m in p.results.items() if m.ok)
    with TuningDB(tmp_path / "t.sqlite") as db:
        db.record_profile(p.spec, p.arch, "NVIDIA H200", s, profile(0.5, 1.2, p.spec), tool="ncu")
        db.record_profile(p.spec, p.arch, "NVIDIA H200", None, profile(0.9, 1.0, p.spec), tool="ncu")   # cuBLAS
        assert attach_profiles(bare, db) == 1
    assert p.profiles == {s: profile(0.5, 1.2, p.spec)}


def test_simulate_cli_replays_the_rewards_side_by_side(synthetic_problems, tmp_path, capsys):
    from gemmc.search import cli
    from gemmc.search.synthetic import make_synthetic_dataset
    path = make_synthetic_dataset(tmp_path / "syn.jsonl.gz", n_shapes=2, seed=2, profiles=True)
    rc = cli.main(["simulate", "--data", str(path), "--strategy", "exhaustive,random", "--seeds", "1",
                   "--budget", "4", "--reward", "time,time+l2", "--reward-weights", "l2=0.3"])
    out = capsys.readouterr().out
    assert rc == 0 and "rewards: time; time+l2 (l2=0.3, dram=0.1); ncu profiles on" in out
    for row in ("exhaustive [time]", "random [time+l2]"):
        assert row in out
    rc = cli.main(["simulate", "--data", str(path), "--strategy", "random", "--seeds", "1", "--budget", "4",
                   "--reward", "time,time+l2", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert set(res) == {"time", "time+l2 (l2=0.1, dram=0.1)"} and set(res["time"]) == {"random"}
    assert cli.main(["simulate", "--data", str(path), "--reward", "fastest"]) == 2
    assert "--reward 'fastest': use one of time, time+l2" in capsys.readouterr().err


def test_synth_profiles_keep_the_times_of_the_model():
    from gemmc.search.synthetic import model_profile, model_time_us, synthetic_records
    with_p = synthetic_records([(64, 4096, 4096)], profiles=True)
    without = synthetic_records([(64, 4096, 4096)])
    assert [r["time_us"] for r in with_p] == [r["time_us"] for r in without]
    s = Schedule.from_dict(next(r for r in with_p if r.get("profile"))["schedule"])
    p = model_profile(s, SPEC)
    assert 0 <= p.l2_hit_rate <= 1 and p.dram_read_bytes > 0 and not math.isnan(p.duration_us)
    assert model_time_us(s, SPEC) > 0
