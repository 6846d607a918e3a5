"""Strategies on synthetic landscapes (gemmc.search.synthetic): the protocol, and that they search well."""
import math
import statistics

import pytest
import torch
from hypothesis import given, settings, strategies as st

import gemmc
from gemmc.schedule import enumerate_schedules, is_valid
from gemmc.choose.features import FeatureSpec, gp_features, policy_features
from gemmc.search.simulate import fractions, group_problems, simulate, split_folds
from gemmc.search.registry import make_strategy
from gemmc.search.strategy import Measurement, SearchProblem, best_so_far, run_search
from gemmc.search.synthetic import model_time_us, synthetic_records, synthetic_shapes

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def problems():
    return group_problems(synthetic_records(synthetic_shapes(16, seed=0), seed=0))


def test_synthetic_landscape_is_plausible():
    spec = gemmc.GemmSpec(4096, 4096, 4096)
    times = {s: model_time_us(s, spec) for s in enumerate_schedules(spec)}
    best = min(times.values())
    tflops = 2 * 4096 ** 3 / best / 1e6
    assert 600 < tflops < 989                      # below the H200's dense bf16 peak
    # big square: a large cooperative tile without split-K wins
    s = min(times, key=times.get)
    assert s.split_k == 1 and s.tile[0] * s.tile[1] >= 128 * 256
    # decode (M=16): split-K pays off on a K-heavy weight
    spec = gemmc.GemmSpec(16, 4096, 14336)
    t = {s: model_time_us(s, spec) for s in enumerate_schedules(spec)}
    assert min(t, key=t.get).split_k > 1
    # the landscape is not flat: the median schedule is far from the best
    assert best / statistics.median(times.values()) < 0.8


@pytest.mark.parametrize("name", ["exhaustive", "random", "bayes"])
def test_proposals_are_feasible_and_never_repeat(name, problems):
    p = problems[3]
    prob = p.problem()
    strat = make_strategy(name, seed=1)
    res = run_search(strat, prob, p.evaluate, budget=12, batch=3)
    scheds = [r.schedule for r in res]
    assert len(scheds) == 12 == len(set(scheds))
    assert all(s in set(prob.candidates) and is_valid(s, prob.spec) for s in scheds)


def test_exhaustive_finds_the_optimum_and_stops(problems):
    p = problems[0]
    res = run_search(make_strategy("exhaustive"), p.problem(), p.evaluate, budget=10_000, batch=64)
    assert len(res) == len(p.problem().candidates)
    assert min(r.time_us for r in res if r.ok) == p.best_us


def test_random_depends_on_seed_only(problems):
    p = problems[1]
    a = run_search(make_strategy("random", seed=3), p.problem(), p.evaluate, budget=8)
    b = run_search(make_strategy("random", seed=3), p.problem(), p.evaluate, budget=8)
    c = run_search(make_strategy("random", seed=4), p.problem(), p.evaluate, budget=8)
    assert [r.schedule for r in a] == [r.schedule for r in b] != [r.schedule for r in c]


def test_resume_skips_prior_measurements(problems):
    p = problems[2]
    first = run_search(make_strategy("bayes"), p.problem(), p.evaluate, budget=5)
    rest = run_search(make_strategy("bayes"), p.problem(), p.evaluate, budget=4, prior=first)
    assert not {r.schedule for r in first} & {r.schedule for r in rest}
    assert len(rest) == 4


def test_errors_are_skipped_not_fatal():
    spec = gemmc.GemmSpec(512, 1024, 1024)
    prob = SearchProblem.of(spec)
    bad = set(prob.candidates[::2])
    ev = lambda ss: [Measurement(s, None, "compile: boom") if s in bad else Measurement(s, 10.0 + i)
                     for i, s in enumerate(ss)]
    res = run_search(make_strategy("bayes", seed=0), prob, ev, budget=10)
    assert len(res) == 10 and any(not r.ok for r in res) and any(r.ok for r in res)


def test_best_so_far_and_fractions():
    s = gemmc.Schedule()
    rs = [Measurement(s, None, "x"), Measurement(s, 20.0), Measurement(s, 25.0), Measurement(s, 10.0)]
    assert best_so_far(rs) == [math.inf, 20.0, 20.0, 10.0]
    assert fractions(10.0, rs, [1, 2, 4, 9]) == {1: 0.0, 2: 0.5, 4: 1.0, 9: 1.0}


@settings(max_examples=25, deadline=None)
@given(m=st.sampled_from([1, 16, 100, 1024, 5000]), n=st.sampled_from([256, 4096, 11008]),
       k=st.sampled_from([64, 512, 4096, 14336]))
def test_features_are_finite_and_sized(m, n, k):
    spec = gemmc.GemmSpec(m, n, k)
    for s in enumerate_schedules(spec)[::37]:
        f = policy_features(s, spec)
        assert len(f) == FeatureSpec().dim and all(math.isfinite(x) for x in f)
        assert all(math.isfinite(x) for x in gp_features(s, spec))


def test_folds_split_by_weight_shape(problems):
    folds = split_folds(problems, 4, seed=0)
    assert sorted(i for f in folds for i in f) == list(range(len(problems)))
    nk = [{(problems[i].spec.n, problems[i].spec.k) for i in f} for f in folds]
    for a in range(len(nk)):
        for b in range(a + 1, len(nk)):
            assert not nk[a] & nk[b]            # a held-out weight shape is unseen at every M


def test_small_simulation_meets_the_targets(problems):
    """The CI version of the issue's simulation: bayes >= 97% within 16, rl >= 90% zero-shot and
    >= 97% within 8 (trained on other shapes), both clearly above random."""
    # all 16 shapes, 3 seeds: a 7-shape, 2-seed subset read 0.989 before and 0.952 after a small change to
    # the heuristic prior (gemmc 0.3.3's fix-up staging), while the 16-shape figure moved 0.985 -> 0.980
    res = simulate(problems, ["random", "bayes"], [4, 8, 16], seeds=3)
    rl = simulate(problems, ["random", "rl"], [4, 8, 16], seeds=2, rl_folds=2, rl_epochs=30)
    print(res, rl)
    frac = lambda r, s, b: r[s][str(b)]["median_fraction"]
    assert frac(res, "bayes", 16) >= 0.97
    assert frac(res, "bayes", 16) > frac(res, "random", 16) + 0.03
    assert res["bayes"]["16"]["score_vs_random"] > 0.5
    assert frac(rl, "rl", 1) >= 0.90
    assert frac(rl, "rl", 8) >= 0.97
    assert frac(rl, "rl", 8) > frac(rl, "random", 8) + 0.05
    assert rl["random"]["8"]["score_vs_random"] == 0.0


def test_rl_policy_zero_shot_finetune_and_persistence(problems):
    from gemmc.search.rl import RLStrategy, train_policy_on_problems
    from gemmc.choose.schedule_policy import SchedulePolicy
    train, held = problems[:-3], problems[-3:]
    unseen = [p for p in held if (p.spec.n, p.spec.k) not in {(q.spec.n, q.spec.k) for q in train}] or held
    pol = train_policy_on_problems(train, epochs=25, seed=0)
    p = unseen[0]
    prob = p.problem()
    first = pol.best(p.spec, list(prob.candidates))
    assert p.best_us / p.results[first].time_us > 0.85          # zero-shot, never trained on this shape
    strat = RLStrategy(policy=pol)
    strat.start(prob)
    assert strat.propose(1) == [first]
    before = strat._scores.clone()
    strat.observe(p.evaluate([first]) + p.evaluate(list(prob.candidates[:5])))
    strat.propose(1)
    assert not torch.equal(before, strat._scores)               # fine-tuned online on this shape
    assert torch.equal(pol.scores(p.spec, prob.candidates), before)   # the trained policy is untouched
    again = SchedulePolicy.from_bytes(pol.to_bytes())
    assert torch.equal(again.scores(p.spec, prob.candidates), before)
    blob = SchedulePolicy(hidden=8)
    import dataclasses
    from gemmc.choose.features import FeatureSpec
    blob.feature_spec = dataclasses.replace(FeatureSpec(), version=0)
    with pytest.raises(ValueError, match="retrain"):
        SchedulePolicy.from_bytes(blob.to_bytes())


def test_heuristic_prior_ranks_every_candidate_of_the_standard_space():
    from gemmc.choose.heuristic import estimate
    from gemmc.search.heuristic_prior import heuristic_order
    spec = gemmc.GemmSpec(m=64, n=28672, k=4096)
    problem = SearchProblem.of(spec)
    order = heuristic_order(problem)
    assert sorted(map(str, order)) == sorted(map(str, problem.candidates))
    assert order[0].tile[1] == 224                      # 128 balanced tiles, the model's best
    # model order throughout: 2x2 clusters and the wave tiles are ranked, not appended
    times = [estimate(s, spec).time for s in order]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:]))


def test_features_tell_a_swapped_kernel_from_the_same_tile_unswapped():
    spec = gemmc.GemmSpec(m=16, n=4096, k=4096)
    swapped = gemmc.Schedule(tile=(64, 16, 128), mode="pingpong", stages=10, swap_ab=True)
    flat = gemmc.Schedule(tile=(64, 16, 128), mode="pingpong", stages=10)
    assert FeatureSpec().version >= 4       # 5: the L2 fields (tests/test_l2_schedule.py)
    assert len(policy_features(swapped, spec)) == FeatureSpec().dim
    # an 8-wide activation tile (version 3) has its own choice, not an all-zero tile N
    from gemmc.choose.features import choice_features
    eight = gemmc.Schedule(tile=(64, 8, 128), cluster=(1, 2), mode="pingpong", stages=10, swap_ab=True)
    assert choice_features(eight) != choice_features(swapped) and sum(choice_features(eight)) == sum(choice_features(swapped))
    # the odd-N tiles (version 4) likewise: 48/80/112 are choices the policy can learn from
    from gemmc.choose.features import describes
    waves = [gemmc.Schedule(tile=(64, n, 128), mode="pingpong") for n in (48, 80, 112)]
    assert all(describes(w) for w in waves) and len({tuple(choice_features(w)) for w in waves}) == 3
    assert gp_features(swapped, spec) != gp_features(flat, spec)
    # the derived part describes the kernel's problem: 4096 / 64 = 64 CTAs, not 1 x 256
    from gemmc.choose.features import DERIVED_FEATURES, derived_features
    d = dict(zip(DERIVED_FEATURES, derived_features(swapped, spec)))
    assert d["log2_ctas"] == 6.0 and d["pad_eff_n"] == 1.0
    assert d["log2_stages"] == math.log2(10)
    # ring depth separates schedules that differ only in stages
    deep = gemmc.Schedule(tile=(64, 16, 128), mode="pingpong", stages="auto", swap_ab=True)
    assert gp_features(deep, spec) != gp_features(swapped, spec)
