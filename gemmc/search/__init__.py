"""Schedule search: strategies, the Builder/Runner, the tuning database and the simulator.

Strategies see only a `SearchProblem` (the spec with concrete dims, the arch and the feasible
schedules from `gemmc.schedule.enumerate_schedules`) and the history of `Measurement`s:

    strat = make_strategy("bayes")            # exhaustive | random | bayes | rl (policy=...)
    results = run_search(strat, SearchProblem.of(spec), evaluate, budget=16, batch=4, prior=db.prior(...))

`evaluate(list[Schedule]) -> list[Measurement]` is the Builder + Runner on a GPU (see
`cli.tune_shapes`), or a recorded dataset (`simulate.RecordedProblem.evaluate`) on the CPU.
`gemmc.dispatch.resolve_auto` turns the tuning DB into `schedule="auto"` decisions, by the DB's paired
verdict (`db.TuningDB.best`: the highest cuBLAS / gemmc timed in the same runs, as the geometric mean of a
schedule's rows, or its median row from three rows on).
"""
from .strategy import (STRATEGIES, Measurement, SearchProblem, Strategy, make_strategy,  # noqa: F401
                       run_search)
