"""Schedule search: strategies, the Builder/Runner, the tuning database and the simulator.

Strategies see only a `SearchProblem` (the spec with concrete dims, the arch and the feasible
schedules from `gemmc.schedule.enumerate_schedules`) and the history of measurements.
"""
from .strategy import Measurement, SearchProblem, Strategy, make_strategy, run_search, STRATEGIES  # noqa: F401
