"""The tune loop: for each shape, search its schedules on the GPU, measure the --also schedules, confirm the
best ones; every measurement goes to the tuning DB, so an interrupted run resumes where it stopped.

`gemmc-search tune` parses its flags and calls `tune`; a script calls it with its own Builder and Runner.
torch, the strategies and the timing code are imported on first use, so importing this module is cheap.
"""
from __future__ import annotations

import sys

from .. import __version__
from ..errors import GemmcError


def tune(shapes, *, dtype: str, arch: str, strategy: str, budget: int, batch: int, db, builder, runner,
         gpu_name: str, seed: int = 0, progress: bool = True, symbolic: bool = False,
         confirm: int = 3, also=(), fresh: bool = False, sustained: bool = False, profiler=None,
         reward=None) -> list:
    """Tune every shape (resuming from what `db` holds); [(shape, BestEntry | None)].

    symbolic: compile each schedule once for symbolic M, N, K (one kernel serves every shape, as in
    the bench's sweep) instead of once per static shape.
    confirm: once a shape's search budget is spent, re-measure its `confirm` best schedules (paired
    verdict over the search's rows, so the pick does not depend on confirmations already made) once
    more each, stored with strategy "confirm". Those rows are extra to `budget` (which counts distinct
    schedules), and a resumed run measures only the confirmations not stored yet.
    also: schedules measured on every shape where they are valid, after the search and before the
    confirmations (stored with strategy "also"; extra to `budget`; skipped where stored).
    fresh: only the running gemmc version's rows count toward `budget` and reach the strategy, so a
    kernel change is searched again; older rows stay in the ranking, and the confirmations re-measure
    the ones that reach the top.
    sustained: the runner times long calls at their own clock (`--sustained-s`). On a shape whose stored
    rows show a call of >= SETTLE_MIN_CALL_US, only rows timed that way count toward `budget`, reach the
    strategy and count as confirmed (interleaved rows stay, and rank below them: `db.schedule_figures`).
    profiler: `tune --profile l2` (gemmc.search.profiling.NcuProfiler): each batch's successful schedules are
    profiled under ncu, stored in the DB's profiles table and handed to the strategy with their measurements.
    reward: what the strategy minimises (gemmc.search.reward; None: the time); the DB keeps the times."""
    from tqdm import tqdm

    from ..schedule import is_valid
    from ..spec import GemmSpec
    from ..choose.tuning_db_schema import ALSO
    from .profiling import profile_batch, with_stored_profiles
    from .registry import make_strategy
    from .strategy import SearchProblem, run_search
    kw = {"policy": _rl_policy(db, gpu_name, seed, progress)} if strategy == "rl" else {}
    strat = make_strategy(strategy, seed=seed, **kw)
    bar = tqdm(total=len(shapes) * (budget + confirm), desc=f"tune ({strategy})", unit="meas", file=sys.stderr,
               dynamic_ncols=True, disable=not progress)
    summary = []
    from ..bench.fp8 import spec_kwargs
    for sh in shapes:
        # a grouped problem (the moe suite's GroupedShape) is keyed by its rows per group (choose/group_keys.py);
        # dtype "fp8-<scaling>": an fp8 GEMM
        spec = sh.spec(dtype) if hasattr(sh, "spec") else GemmSpec(sh.m, sh.n, sh.k, **spec_kwargs(dtype))
        problem = SearchProblem.of(spec, arch)
        # one per schedule: confirm rows add none
        stored = db.prior(spec, arch, gpu_name, version=__version__ if fresh else None)
        own_clock = sustained and _long_call(stored)
        if own_clock:
            stored = db.prior(spec, arch, gpu_name, version=__version__ if fresh else None, sustained_only=True)
        # the strategy sees only its own space (an --also schedule may lie outside it)
        cands = set(problem.candidates)
        prior = [m for m in stored if m.schedule in cands]
        if reward is not None and reward.uses_profiles:
            prior = with_stored_profiles(prior, db, spec, arch, gpu_name)
        bar.update(min(len(prior), budget))
        bar.set_postfix_str(str(sh))

        kspec = spec
        if symbolic:    # a grouped kernel keeps N and K (a gate needs a static N), and serves every group count
            kspec = spec.with_dims(m="M", groups="E") if spec.grouped else spec.with_dims(m="M", n="N", k="K")

        def evaluate(schedules, label=strategy, spec=spec, kspec=kspec, profile=True):
            out = _build_and_measure(schedules, spec, kspec, arch, builder, runner, db, gpu_name, label, bar)
            if profile and profiler is not None:
                bar.set_postfix_str(f"{sh} {label}: profiling under ncu")
                out = profile_batch(profiler, spec, arch, out, db, gpu_name)
            return out

        run_search(strat, problem, evaluate, budget=max(0, budget - len(prior)), batch=batch, prior=prior,
                   reward=reward)
        done = {m.schedule for m in stored}
        todo = [s for s in also if s.arch == arch and is_valid(s, spec) and s not in done]
        if todo:
            bar.total += len(todo)
            bar.set_postfix_str(f"{sh} also")
            evaluate(todo, ALSO)
        if confirm > 0:
            bar.set_postfix_str(f"{sh} confirm")
            # re-measurements of schedules profiled already: not profiled again
            _confirm(spec, arch, gpu_name, confirm, db, bar, lambda ss, label: evaluate(ss, label, profile=False),
                     sustained_only=own_clock)
        summary.append((sh, db.best(spec, arch, gpu_name)))
    bar.close()
    return summary


def _rl_policy(db, gpu_name: str, seed: int = 0, say: bool = True):
    """The policy `tune --strategy rl` starts from: the DB's policy for `gpu_name`, else its policy of unknown
    GPU (`TuningDB.policy_for`), else a fresh one trained now on the DB's rows of `gpu_name` (not stored:
    `gemmc-search train-policy --gpu` stores one). Another GPU's policy is never used. GemmcError when there
    is none and too few rows of `gpu_name` to train one."""
    from .rl import train_policy_from_db
    pol = db.policy_for(gpu_name)
    if pol is not None:
        return pol
    try:
        pol = train_policy_from_db(db, seed=seed, save=False, gpu_name=gpu_name)
    except ValueError:
        others = sorted({p.gpu_name for p in db.policies()} - {None, gpu_name})
        held = f" (its policies are of {', '.join(others)}; another GPU's is not used)" if others else ""
        raise GemmcError(f"{db.path} holds no policy for {gpu_name} or of unknown GPU{held}, and no problem measured "
                         f"on {gpu_name} has two or more schedules to train one on: tune with another strategy "
                         f"first, or `gemmc-search import` one, or `gemmc-search train-policy --gpu NAME`") from None
    if say:
        print(f"--strategy rl: no policy stored for {gpu_name}: starting from one trained now on the "
              f"{pol.trained_shapes} problems measured on it (not stored; `gemmc-search train-policy` stores one)",
              file=sys.stderr)
    return pol


def _build_and_measure(schedules, spec, kspec, arch, builder, runner, db, gpu_name, label, bar) -> list:
    from .runner import GpuLostError
    from .strategy import Measurement
    shape, n, built = f"{spec.m}x{spec.n}x{spec.k}", len(schedules), 0

    def compiled(_):          # a long compile batch shows its progress, not a frozen bar
        nonlocal built
        built += 1
        bar.set_postfix_str(f"{shape} {label}: compiled {built}/{n}")

    bar.set_postfix_str(f"{shape} {label}: compiling {n}")
    out = []
    for b in builder.build(kspec, schedules, arch, on_result=compiled):
        if not b.ok:
            m = Measurement(b.schedule, None, b.error, compile_s=b.compile_s)
        else:
            bar.set_postfix_str(f"{shape} {label}: measuring")
            try:
                r = runner.measure(spec, b.schedule, arch, kspec)
            except GpuLostError as e:
                # the schedule that broke the GPU is stored; those after it stay unmeasured, for a resume
                if e.measurement is not None:
                    db.record(spec, arch, Measurement(b.schedule, None, e.measurement.error, compile_s=b.compile_s),
                              gpu_name, label)
                raise
            m = Measurement(b.schedule, r.time_us, r.error, r.cublas_us, b.compile_s, r.timing)
        db.record(spec, arch, m, gpu_name, label)   # one transaction each
        bar.update(1)
        out.append(m)
    return out


def _long_call(stored) -> bool:
    """Do the stored rows show a call long enough for `--sustained-s` to time it at its own clock?"""
    from ..bench.timing import SETTLE_MIN_CALL_US
    return any(m.cublas_us is not None and m.cublas_us >= SETTLE_MIN_CALL_US for m in stored)


def _confirm(spec, arch, gpu_name, n, db, bar, evaluate, sustained_only: bool = False) -> None:
    """Re-measure the search's `n` best schedules that have no confirm row yet (see tune). Then,
    while the `n` best overall hold a schedule measured once, or one whose two paired rows disagree by
    more than CONFIRM_SPREAD, or one measured only by an older gemmc (stale), measure it again: from
    three rows the verdict takes the median row, so a run whose cuBLAS side happened to be slow cannot
    pick the schedule. At most two such rows per schedule and run (three for a stale one); a resumed run
    finds those stored."""
    from ..choose.tuning_db_schema import CONFIRM
    top = [f.schedule for f in db.ranked_schedules(spec, arch, gpu_name, search_only=True)[:n]]
    done = db.confirmed(spec, arch, gpu_name, sustained_only)
    todo = [s for s in top if s not in done]
    bar.update(n - len(todo))        # stored by an earlier run, or fewer than n schedules ran
    _say_failed(evaluate(todo, CONFIRM) if todo else (), bar)
    tried: dict = {}
    for _ in range(4 * n):            # each row can reorder the top: look again, a bounded number of times
        again = [f.schedule for f in db.ranked_schedules(spec, arch, gpu_name)[:n]
                 if f.cublas_us is not None and (f.n_rows == 1 or f.unsettled or f.stale)
                 and tried.get(f.schedule, 0) < (3 if f.stale else 2)]
        if not again:
            break
        for s in again:
            tried[s] = tried.get(s, 0) + 1
        bar.total += len(again)
        bar.set_postfix_str(f"{spec.m}x{spec.n}x{spec.k} settling the top {n}")
        _say_failed(evaluate(again, CONFIRM), bar)


def _say_failed(measurements, bar) -> None:
    """A schedule that passed its check before and fails on re-measure is worth a look; a failed check
    disqualifies it (db.failed_check), and the next best takes its place."""
    from ..choose.tuning_db_verdict import failed_check
    for m in measurements:
        if failed_check(m.error):
            bar.write(f"confirm: {m.schedule.short()} failed its correctness check on re-measure, so it is "
                      f"disqualified (no longer ranked or picked): {m.error}", file=sys.stderr)
        elif not m.ok:
            bar.write(f"confirm: {m.schedule.short()} failed on re-measure: {m.error}", file=sys.stderr)
