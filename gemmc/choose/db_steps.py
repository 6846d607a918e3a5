"""The tuning DB's steps of `schedule="auto"` (gemmc.choose.auto): 1. its best for this exact problem; 3. a tuned
neighbour (gemmc.choose.neighbours), else its trained policy, else a farther tuned shape.

A pick this gemmc cannot run gives way to the next: one it finds invalid for the problem, one whose figure rests
on an older gemmc's rows and which this gemmc failed to build or run, and (for a neighbour's) one that failed on
this very problem; `detail` names what was passed over. The DB is read, never written.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import replace
from typing import Optional

from .. import __version__
from ..schedule import enumerate_schedules, is_valid
from ..spec import GemmSpec
from .decision import EPILOGUE_KEEPS_THE_KERNEL, Decision
from .neighbours import FAR_LOG2, log2_distance, m_neighbours
from .notices import warn_once
from .tuning_db import TuningDBReader
from .tuning_db_schema import TuningDBError, default_path, problem_fields


def skip_db(path, why: str) -> None:
    warn_once(("db", str(path)), f"gemmc: schedule='auto' goes on without the tuning DB, so its tuning is not "
                                 f"used: {why}")


def open_db(db):
    """(TuningDBReader or None, whether this call opened it). A path that is missing means no tuning; one that
    cannot be opened as a tuning DB is skipped with a warning (like an unloadable policy), not fatal."""
    if db is None or isinstance(db, (str, bytes)) or hasattr(db, "__fspath__"):
        try:
            return TuningDBReader.open_existing(db), True
        except TuningDBError as e:
            skip_db(db if db is not None else default_path(), str(e))
            return None, False
    return db, False


_policy_cache: dict = {}
_policy_lock = threading.Lock()


def _policy(db, gpu_name: Optional[str] = None):
    """The DB's policy for `gpu_name` (`TuningDBReader.policy_for`: the one trained for that GPU, else the one of
    unknown GPU, saved by an older gemmc or trained on several GPUs' rows; None if neither, so another GPU's
    policy never serves; an unknown target, as in an ahead-of-time build, takes the "default" one, else the
    only one, else the newest), loaded once per (file, target GPU, save time): a retrain is picked up."""
    stamp = db.policy_stamp(gpu_name)
    if stamp is None:
        return None
    key = (str(db.path), gpu_name, stamp)
    with _policy_lock:
        if key not in _policy_cache:
            try:
                _policy_cache[key] = db.policy_for(gpu_name)
            except Exception as e:   # an incompatible policy is skipped, not fatal: the heuristic still answers
                _policy_cache[key] = None
                warnings.warn(f"gemmc: schedule='auto' skips the policy saved in {db.path}: {e}", stacklevel=3)
        return _policy_cache[key]


def _shape(e) -> tuple:
    return (e.fields["m"], e.fields["n"], e.fields["k"])


def _shape_of(e) -> str:
    return "x".join(map(str, _shape(e)))


def _farther(db, spec: GemmSpec, arch: str, gpu_name: Optional[str]) -> list:
    """Other tuned problems with the same dtypes/layouts/epilogue within FAR_LOG2, nearest first (the problem
    itself is the exact step's: its picks that this gemmc cannot run must not come back here)."""
    want = problem_fields(spec, arch)
    same = ("dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout", "epilogue_class", "arch", "batch")
    here = (want["m"], want["n"], want["k"])
    out = []
    for e in db.best_all(arch):
        if any(e.fields[f] != want[f] for f in same) or (gpu_name is not None and e.gpu_name != gpu_name):
            continue
        if _shape(e) == here:
            continue
        d = log2_distance(_shape(e), here)
        if d <= FAR_LOG2:
            out.append((d, e))
    out.sort(key=lambda t: t[0])
    return [e for _, e in out]


def _failed_here(tdb, conc: GemmSpec, arch: str, gpu: str) -> dict:
    """{Schedule: why} of the schedules that cannot run on the requested problem itself, by its own rows on
    `gpu`: those that failed their check there (the DB's verdict disqualifies them) and those whose latest
    row of the running gemmc version is a failure (to build, or to run)."""
    out = {q.schedule: f"failed its check on this problem: {q.error}" for q in tdb.disqualified(conc, arch, gpu)}
    for m in tdb.prior(conc, arch, gpu, version=__version__):
        if not m.ok:
            out.setdefault(m.schedule, f"gemmc {__version__} failed it on this problem: {m.error}")
    return out


def _neighbour_unusable(tdb, conc: GemmSpec, arch: str, e, here: dict) -> Optional[str]:
    """Why this gemmc cannot run the pick of the tuned neighbour `e` for `conc`; None when it can. As at
    the exact step (`_unusable`): invalid for `conc`, or a figure resting on an older gemmc's rows of a
    schedule the running version failed on that neighbour; besides, a schedule that cannot run on `conc`
    itself (`_failed_here`, memoised per GPU in `here`)."""
    if not is_valid(e.schedule, conc):
        return "not valid for this problem under this gemmc"
    if e.gpu_name not in here:
        here[e.gpu_name] = _failed_here(tdb, conc, arch, e.gpu_name)
    if e.schedule in here[e.gpu_name]:
        return here[e.gpu_name][e.schedule]
    there = conc.with_dims(m=e.fields["m"], n=e.fields["n"], k=e.fields["k"])
    failed = _stale_pick_failure(tdb, there, arch, e)
    return f"gemmc {__version__} failed it on {_shape_of(e)}: {failed.error}" if failed else None


def _first_usable_neighbour(tdb, conc: GemmSpec, arch: str, near: list, whys: dict, here: dict, passed: list):
    """The first entry of `near` (BestEntry, nearest first) whose pick this gemmc can run for `conc`, or None.
    `whys` memoises `_neighbour_unusable` per entry (by id: the entries live through one `neighbour_step`),
    `here` its `_failed_here` per GPU; the ones passed over on the way are appended to `passed` once each."""
    for e in near:
        if id(e) not in whys:
            whys[id(e)] = _neighbour_unusable(tdb, conc, arch, e, here)
        why = whys[id(e)]
        if why is None:
            return e
        note = f"{e.schedule.short()} of {_shape_of(e)} ({why})"
        if note not in passed:
            passed.append(note)
    return None


def neighbour_step(tdb, conc: GemmSpec, arch: str, gpu_name: Optional[str], passed: list) -> Optional[Decision]:
    """Step 3: a tuned neighbour's pick, else the policy's, else a farther tuned shape's; None when none answers.
    The neighbours' picks passed over are appended to `passed`, nearest first."""
    far = _farther(tdb, conc, arch, gpu_name)
    whys: dict = {}
    here: dict = {}
    close = m_neighbours(far, (conc.m, conc.n, conc.k), _shape)
    e = _first_usable_neighbour(tdb, conc, arch, close, whys, here, passed)
    if e is not None:
        return Decision(e.schedule, "nearest", detail=f"tuned {_shape_of(e)}")
    pol = _policy(tdb, gpu_name)
    if pol is not None:
        feasible = enumerate_schedules(conc, arch)
        if feasible:
            of = f" of {pol.gpu_name}" if getattr(pol, "gpu_name", None) else ""
            return Decision(pol.best(conc, feasible), "policy", detail=f"policy trained on {pol.trained_shapes} "
                                                                       f"shapes{of}")
    e = _first_usable_neighbour(tdb, conc, arch, far, whys, here, passed)
    if e is not None:
        return Decision(e.schedule, "nearest", detail=f"tuned {_shape_of(e)}")
    return None


def with_passed_neighbours(d: Decision, passed: list) -> Decision:
    """`d`, its detail naming the neighbours' picks passed over before it (the first 3, and how many more)."""
    if not passed:
        return d
    named = ", ".join(passed[:3]) + (f" and {len(passed) - 3} more" if len(passed) > 3 else "")
    return replace(d, detail="; ".join(x for x in (d.detail, "passed over the DB's neighbour picks " + named) if x))


def db_decision(e, plain: bool, keeps: str = EPILOGUE_KEEPS_THE_KERNEL) -> Decision:
    """Step 1: the DB's best of this exact problem (a gemmc.choose.tuning_db.BestEntry); torch.matmul (an fp8
    GEMM's torch._scaled_mm) for a plain GEMM whose paired speed-up is below 1; `keeps`: why any other keeps the
    kernel when the baseline was faster."""
    slower = e.speedup is not None and e.speedup < 1.0
    where = f"{e.n_measured} measured, {e.gpu_name}" + _stale_note(e)
    if e.speedup is None:
        return Decision(e.schedule, "db", detail=f"{e.time_us:.2f} us, no paired cuBLAS time ({where})")
    return Decision(e.schedule, "db", use_cublas=slower and plain,
                    detail=f"paired {e.speedup:.3f}x: {e.time_us:.2f} us vs cuBLAS {e.cublas_us:.2f} us, "
                           f"{'median' if e.n_rows >= 3 else 'geomean'} of {e.n_rows} row{'s' if e.n_rows > 1 else ''} "
                           f"({where})" + (f"; {keeps}" if slower and not plain else ""))


def _stale_note(e) -> str:
    """Says so when the pick rests on an older gemmc's rows, whose kernels may have run at another speed."""
    if not e.stale:
        return ""
    return (f"; rows of gemmc {e.version}, older than this {__version__}: `gemmc-search tune --budget 1` "
            f"re-measures them")


def db_exact(tdb, conc: GemmSpec, arch: str, gpu_name: Optional[str]):
    """(entry, passed over): the DB's best for this exact problem (a BestEntry) among the schedules this gemmc
    can run, or None; and why any better-ranked ones were passed over. A schedule is passed over when this
    gemmc finds it invalid, or when its figure rests on an older gemmc's rows and this gemmc failed to build or
    run it: those rows no longer describe a kernel that runs."""
    best = tdb.best(conc, arch, gpu_name)
    if best is None or _unusable(tdb, conc, arch, best) is None:
        return best, []
    passed = []
    for f in tdb.ranked_schedules(conc, arch, best.gpu_name):
        why = _unusable(tdb, conc, arch, replace(best, schedule=f.schedule, version=f.version))
        if why is None:
            return replace(best, schedule=f.schedule, time_us=f.time_us, cublas_us=f.cublas_us, n_rows=f.n_rows,
                           version=f.version, own_clock=f.own_clock), passed
        passed.append(f"{f.schedule.short()} ({why})")
    return None, passed


def _unusable(tdb, conc: GemmSpec, arch: str, e) -> Optional[str]:
    """Why this gemmc cannot run the DB's pick `e` for `conc`; None when it can."""
    if not is_valid(e.schedule, conc):
        return "not valid for this problem under this gemmc"
    failed = _stale_pick_failure(tdb, conc, arch, e)
    return f"gemmc {__version__} failed it: {failed.error}" if failed else None


def _stale_pick_failure(tdb, spec: GemmSpec, arch: str, e):
    """A row of the running gemmc that failed the DB pick `e` on `spec`, when `e`'s figure rests on an older
    gemmc's rows (such a figure has no successful row of the running version: any such row is a failure);
    else None."""
    if not e.stale:
        return None
    return next((m for m in tdb.prior(spec, arch, e.gpu_name, version=__version__) if m.schedule == e.schedule),
                None)
