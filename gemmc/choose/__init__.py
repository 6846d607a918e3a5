"""Every "which schedule" decision of gemmc: `schedule="auto"` and what it reads, below the compiler.

    resolve.py            compile()'s `schedule=` resolved once: auto, heuristic, a Schedule or a dict
    auto.py               the documented `auto` order (resolve_auto)
    db_steps.py           its tuning-DB steps: the exact problem's best, a tuned neighbour, the policy
    shipped_steps.py      its shipped steps: the table's entry and neighbour, the heuristic with the table's verdict
    decision.py           what `auto` decides (Decision) and the concrete problem it decides for
    neighbours.py         which measured shapes are a problem's neighbours (the DB's and the table's alike)
    gpu.py                the GPU `auto` decides for (GEMMC_GPU, else the visible one)
    notices.py            the warnings `auto` gives once per process
    m_buckets.py          a symbolic-M `auto` compile's choice per runtime M bucket
    pretuned.py           the tables shipped with gemmc (pretuned_data/), read and built
    heuristic.py          the analytic heuristic (`schedule="heuristic"`)
    tuning_db.py          the tuning DB's reader (TuningDBReader)
    tuning_db_schema.py   the DB file's tables, location and problem keys (shared with the writer)
    tuning_db_verdict.py  the paired verdict over a problem's rows
    measurement.py        one measured schedule: a DB row, and what a search strategy observes
    schedule_policy.py    the trained policy: its network, stored form and inference
    features.py           the policy's (and the search GP's) encodings of a problem and a schedule

gemmc.search writes the tuning DB and trains the policy, importing what it shares from here; nothing here
imports gemmc.search (tests/test_structure.py checks it).
"""
