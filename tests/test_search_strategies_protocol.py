"""The Strategy protocol under hostile histories: every proposal valid, new and as many as asked; history
outside the space, failures and NaN times; the rl policy's persistence and its default policy lookup."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import gemmc
from gemmc.errors import GemmcError
from gemmc.schedule import is_valid
from gemmc.search.simulate import group_problems
from gemmc.search.registry import make_strategy
from gemmc.search.strategy import Measurement, SearchProblem, run_search
from gemmc.search.synthetic import synthetic_records

torch.set_num_threads(1)

SPEC = gemmc.GemmSpec(512, 1024, 1024)


@pytest.fixture(scope="module")
def problem():
    return SearchProblem.of(SPEC)


@pytest.fixture(scope="module")
def policy():
    """A small policy trained on two synthetic shapes: enough for rl to run, fast to train."""
    from gemmc.search.rl import train_policy_on_problems
    probs = group_problems(synthetic_records([(512, 1024, 1024), (64, 4096, 4096)], seed=0))
    torch.manual_seed(0)
    return train_policy_on_problems(probs, epochs=2, seed=0)


def _strategy(name, policy, seed=0):
    # short GP fits keep the fuzzing fast; the proposals' validity does not depend on the fit
    kw = {"rl": {"policy": policy}, "bayes": {"fit_maxiter": 10, "warm_maxiter": 5}}.get(name, {})
    return make_strategy(name, seed=seed, **kw)


def _outside(problem):
    """Valid schedules of another problem (swapped decode kernels) that `problem`'s space lacks."""
    other = SearchProblem.of(gemmc.GemmSpec(16, 4096, 4096)).candidates
    return [s for s in other if s not in set(problem.candidates)]


@pytest.mark.parametrize("name", ["exhaustive", "random", "bayes", "rl"])
def test_propose_zero_or_negative_asks_for_nothing(name, problem, policy):
    strat = _strategy(name, policy)
    strat.start(problem)
    assert strat.propose(0) == []
    with pytest.raises(ValueError, match="at least 0"):
        strat.propose(-1)
    assert len(strat.propose(2)) == 2          # the refused calls took nothing from the space


def test_run_search_refuses_an_empty_batch(problem):
    with pytest.raises(ValueError, match="batch"):
        run_search(make_strategy("random"), problem, lambda ss: [Measurement(s, 1.0) for s in ss], budget=4, batch=0)


@pytest.mark.parametrize("name", ["exhaustive", "random", "bayes", "rl"])
def test_successes_outside_the_space_do_not_break_the_search(name, problem, policy):
    """A resumed run's history may hold schedules of another space (an --also row, an older gemmc's
    space); bayes counted them as its initial design and then fitted its GP on no points."""
    prior = [Measurement(s, 5.0 + i) for i, s in enumerate(_outside(problem)[:5])]
    ev = lambda ss: [Measurement(s, 10.0 + i) for i, s in enumerate(ss)]
    res = run_search(_strategy(name, policy), problem, ev, budget=4, batch=2, prior=prior)
    assert len(res) == 4 and all(r.schedule in set(problem.candidates) for r in res)


_outcome = st.sampled_from(["ok", "ok", "ok", "error", "nan", "inf", "zero"])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["exhaustive", "random", "bayes", "rl"]), seed=st.integers(0, 3),
       size=st.integers(1, 12), batch=st.integers(1, 5), budget=st.integers(1, 10),
       outcomes=st.lists(_outcome, min_size=16, max_size=16), n_prior=st.integers(0, 3), data=st.data())
def test_every_proposal_is_valid_new_and_as_many_as_asked(name, seed, size, batch, budget, outcomes, n_prior, data,
                                                          problem, policy):
    start = data.draw(st.integers(0, len(problem.candidates) - size))
    sub = SearchProblem.of(SPEC, candidates=problem.candidates[start:start + size])
    times = {"ok": None, "error": None, "nan": math.nan, "inf": math.inf, "zero": 0.0}

    def evaluate(ss):
        out = []
        for s in ss:
            kind = outcomes[sub.candidates.index(s) % len(outcomes)]
            if kind == "ok":
                out.append(Measurement(s, 10.0 + sub.candidates.index(s) % 7))
            else:
                out.append(Measurement(s, times[kind], "boom" if kind == "error" else None))
        return out

    prior = evaluate(list(sub.candidates[:min(n_prior, size)])) + [Measurement(s, 1.0) for s in _outside(problem)[:2]]
    strat = _strategy(name, policy, seed)
    strat.start(sub)
    strat.observe(prior)
    seen = {m.schedule for m in prior}
    left = size - len({m.schedule for m in prior if m.schedule in set(sub.candidates)})
    while True:
        want = min(batch, budget)
        picks = strat.propose(want)
        assert len(picks) == min(want, left)
        assert len(set(picks)) == len(picks) and not set(picks) & seen
        assert all(s in set(sub.candidates) and is_valid(s, SPEC) for s in picks)
        if not picks:
            break
        seen |= set(picks)
        left -= len(picks)
        strat.observe(evaluate(picks))
    assert left == 0


def test_bayes_survives_a_history_of_only_failures_and_equal_times(problem):
    strat = make_strategy("bayes", seed=0)
    strat.start(problem)
    strat.observe([Measurement(s, math.nan) for s in problem.candidates[:4]])
    strat.observe([Measurement(s, None, "boom") for s in problem.candidates[4:8]])
    assert len(strat.propose(3)) == 3
    strat.observe([Measurement(s, 7.0) for s in problem.candidates[8:14]])   # a flat landscape: GP std 0
    picks = strat.propose(3)
    assert len(picks) == 3 and not set(picks) & set(problem.candidates[:14])


def test_rl_without_a_policy_does_not_create_a_tuning_db(tmp_path, monkeypatch):
    """make_strategy('rl') looked for a policy by opening the default DB for writing, which made the file
    (and its folder) and left its connection open."""
    path = tmp_path / "nothing" / "tuning.sqlite"
    monkeypatch.setenv("GEMMC_TUNING_DB", str(path))
    with pytest.raises(ValueError, match="trained policy"):
        make_strategy("rl")
    assert not path.exists() and not path.parent.exists()


def test_rl_reads_the_default_db_policy(tmp_path, monkeypatch, policy):
    from gemmc.search.db import TuningDB
    path = tmp_path / "tuning.sqlite"
    with TuningDB(path) as db:
        db.save_policy(policy)
    monkeypatch.setenv("GEMMC_TUNING_DB", str(path))
    strat = make_strategy("rl")
    p = SearchProblem.of(SPEC)
    assert torch.equal(strat.base.scores(SPEC, p.candidates), policy.scores(SPEC, p.candidates))


def test_policy_round_trip_keeps_everything(policy):
    from gemmc.choose.schedule_policy import SchedulePolicy
    again = SchedulePolicy.from_bytes(policy.to_bytes())
    assert again.hidden == policy.hidden and again.trained_shapes == policy.trained_shapes == 2
    assert again.feature_spec == policy.feature_spec
    for (k, a), (k2, b) in zip(policy.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b)


@pytest.mark.parametrize("blob", [b"", b"not a policy", b"PK\x03\x04garbage"])
def test_unreadable_policy_is_a_gemmc_error(blob):
    """`gemmc-search tune --strategy rl` prints a GemmcError as one line; anything else is a traceback."""
    from gemmc.choose.schedule_policy import SchedulePolicy
    with pytest.raises(GemmcError, match="train-policy"):
        SchedulePolicy.from_bytes(blob)


def test_stale_policy_is_a_gemmc_error(policy):
    import dataclasses

    from gemmc.choose.features import FeatureSpec
    from gemmc.choose.schedule_policy import SchedulePolicy
    old = SchedulePolicy(hidden=8)
    old.feature_spec = dataclasses.replace(FeatureSpec(), version=0)
    with pytest.raises(GemmcError, match="retrain"):
        SchedulePolicy.from_bytes(old.to_bytes())


def test_rl_fine_tuning_is_repeatable_and_leaves_the_global_rng_alone(policy, problem):
    """Fine-tuning reseeded torch's global RNG on every propose, resetting the caller's random stream."""
    ev = lambda ss: [Measurement(s, 10.0 + problem.candidates.index(s) % 5) for s in ss]
    picks = []
    for _ in range(2):
        strat = make_strategy("rl", policy=policy)
        strat.start(problem)
        strat.observe(ev(list(problem.candidates[:4])))
        torch.manual_seed(123)
        before = torch.get_rng_state()
        picks.append(strat.propose(3))
        assert torch.equal(before, torch.get_rng_state())
    assert picks[0] == picks[1]


def test_training_on_recorded_problems_leaves_out_what_the_features_cannot_describe(monkeypatch):
    """simulate's rl training skips stream-K and 192-row tiles as the DB's does: the features would read them
    as their static twins and teach the policy their times."""
    from types import SimpleNamespace
    from gemmc.search import rl
    seen = []
    monkeypatch.setattr(rl, "train_policy", lambda ex, **kw: seen.extend(ex))
    plain, twin = gemmc.Schedule(tile=(128, 128, 64)), gemmc.Schedule(tile=(128, 128, 64), stream_k=True)
    other = gemmc.Schedule(tile=(128, 256, 64))
    results = {s: Measurement(s, time_us=t) for s, t in ((plain, 10.0), (twin, 5.0), (other, 12.0))}
    rl.train_policy_on_problems([SimpleNamespace(spec=SPEC, results=results, cublas_us=11.0)])
    (ex,) = seen
    assert ex.schedules == [plain, other] and len(ex.rewards) == 2
