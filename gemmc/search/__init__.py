"""Schedule search: strategies, the Builder/Runner, the tuning database and the simulator.

Strategies see only a `SearchProblem` (the spec with concrete dims, the arch and the feasible
schedules from `gemmc.schedule.enumerate_schedules`) and the history of `Measurement`s:

    strat = make_strategy("bayes")            # exhaustive | random | bayes | rl (policy=...)
    results = run_search(strat, SearchProblem.of(spec), evaluate, budget=16, batch=4, prior=db.prior(...))

`evaluate(list[Schedule]) -> list[Measurement]` is the Builder + Runner on a GPU (see
`tune`, the loop `gemmc-search tune` runs), or a recorded dataset (`simulate.RecordedProblem.evaluate`) on the CPU.

The search writes the tuning DB (`db.TuningDB`) and trains the policy (`rl`); `schedule="auto"` reads both
through gemmc.choose (`gemmc.choose.auto.resolve_auto`), by the DB's paired verdict
(`gemmc.choose.tuning_db_verdict`: the highest cuBLAS / gemmc timed in the same runs, as the geometric mean of
a schedule's rows, or its median row from three rows on). gemmc.choose never imports this package.

The simulator (`gemmc-search simulate`, examples/search_simulate.py) replays recorded sweeps through the
strategies on the CPU; its functions are exported here:

    header, records = load_records("bench/data")      # a dataset file, or a folder of them
    problems = group_problems(records, header)         # one RecordedProblem per recorded problem
    result = simulate_strategies(problems, ["random", "bayes", "rl"], budgets=[4, 8, 16], seeds=2)

`simulate_strategies` is `gemmc.search.simulate.simulate`, renamed so that `gemmc.search.simulate` stays the
submodule.

What a strategy minimises is a `Reward` (gemmc.search.reward): the time, or with `parse_reward("time+l2")` the
time scaled by the measurement's ncu profile (`run_search(..., reward=)`, `tune(..., reward=, profiler=)`,
`simulate_strategies(..., reward=)`); the results and the DB keep the times.
"""
from .registry import STRATEGIES, make_strategy  # noqa: F401
from .reward import Reward, parse_reward  # noqa: F401
from .strategy import Measurement, SearchProblem, Strategy, run_search  # noqa: F401
from .tuning import tune  # noqa: F401
# the simulator's functions, as `gemmc-search simulate` calls them
from .simulate import group_problems, load_records  # noqa: F401
from .simulate import simulate as simulate_strategies  # noqa: F401

__all__ = ["STRATEGIES", "Measurement", "SearchProblem", "Strategy", "make_strategy", "run_search", "tune",
           "group_problems", "load_records", "simulate_strategies", "Reward", "parse_reward"]
