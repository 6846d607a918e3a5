"""`schedule="auto"`: which schedule a problem runs with, and whether cuBLAS should run it instead.

Order: 1. the tuning DB's best for this exact problem; 2. the table shipped for this GPU
(gemmc/pretuned.py) for this exact shape; 3. a tuned neighbour (same N, K, dtypes, layouts, epilogue; M
within 2x) or else the trained policy (the DB's policy for this GPU, else its policy of unknown GPU, never
another GPU's: TuningDB.policy_for), or else
a farther neighbour; a neighbour whose pick this gemmc finds invalid for the problem, or that this gemmc
version failed to build or run (on the neighbour, as for the exact step, or on this problem), or that failed
its check on this problem, gives way to the next neighbour (`detail` names what was passed over); 4. the
shipped table's neighbour
(same N, K, M within 2x); 5. the analytic heuristic. A plain GEMM goes to torch.matmul when cuBLAS was
measured faster on this exact problem (the DB's or the table's), or on the table's neighbour, or (at the
heuristic step) at any of the 5 nearest shapes the table measured (its checks of the heuristic's own
picks where any lies near, else its tuned entries); a fused epilogue never does (cuBLAS
would need extra passes to match it). "Measured faster" is the paired verdict: cuBLAS and gemmc timed in
the same runs (gemmc.search.db); for the DB, the best schedule's speed-up over cuBLAS is the geometric mean
over its paired rows, or from three such rows on the median row's (one slow cuBLAS run cannot carry it);
torch.matmul runs exactly when that speed-up is below 1. The DB's best passes over a schedule this gemmc
finds invalid, or one whose figure rests on an older gemmc's rows and which this gemmc failed to build or run
(the next best of the problem decides; `detail` names what was passed over). `resolve_auto` reads the DB
and never writes it: it is a function of (spec, arch, GPU, db contents, shipped tables); `pretuned=False`
(or GEMMC_PRETUNED=0) leaves the tables out. The DB's rows and the tables count only on the GPU they were
measured on: the GPU the calls will run on (GEMMC_GPU, else the visible one); with neither (an
ahead-of-time build), any GPU's rows and the arch's table. A DB file that cannot be read (damaged, not
gemmc's, a folder) is skipped with a warning, once per file, as is a GEMMC_GPU that names no shipped table:
`auto` never fails a compile over either.
"""
from __future__ import annotations

import difflib
import math
import os
import sqlite3
import threading
import warnings
from dataclasses import dataclass, replace
from typing import Optional

from . import __version__
from .pretuned import target_gpu
from .schedule import Schedule, default_schedule, enumerate_schedules, is_valid
from .spec import GemmSpec
from .types import as_arch

NEAR_LOG2 = 1.0      # a neighbour within 2x in M (same N, K) beats the policy
FAR_LOG2 = 3.0       # beyond this log2 distance over (M, N, K) a neighbour is not used at all


@dataclass(frozen=True)
class Decision:
    schedule: Schedule
    source: str               # "db" | "pretuned" | "policy" | "nearest" | "heuristic" | "alignment" (compiler.py)
    use_cublas: bool = False
    detail: str = ""


def _concrete(spec: GemmSpec, m: Optional[int]) -> Optional[GemmSpec]:
    if m is not None and not isinstance(spec.m, int):
        spec = replace(spec, m=int(m))
    # a symbolic batch is a different problem from no batch: the DB cannot tell them apart, so neither
    # is looked up (the heuristic answers)
    concrete = all(isinstance(d, int) for d in (spec.m, spec.n, spec.k))
    return spec if concrete and (spec.batch is None or isinstance(spec.batch, int)) else None


_warned: set = set()
_warn_lock = threading.Lock()


def _warn_once(key, message: str) -> None:
    """Warn about `key` once per process: every compile (and every M bucket) resolves again."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, stacklevel=3)


def _skip_db(path, why: str) -> None:
    _warn_once(("db", str(path)), f"gemmc: schedule='auto' goes on without the tuning DB, so its tuning is not "
                                  f"used: {why}")


def _open_db(db):
    """(TuningDB or None, whether this call opened it). A path that is missing means no tuning; one that
    cannot be opened as a tuning DB is skipped with a warning (like an unloadable policy), not fatal."""
    from .search.db import TuningDB, TuningDBError, default_path
    if db is None or isinstance(db, (str, bytes)) or hasattr(db, "__fspath__"):
        try:
            return TuningDB.open_existing(db), True
        except TuningDBError as e:
            _skip_db(db if db is not None else default_path(), str(e))
            return None, False
    return db, False


_policy_cache: dict = {}
_policy_lock = threading.Lock()


def _policy(db, gpu_name: Optional[str] = None):
    """The DB's policy for `gpu_name` (`TuningDB.policy_for`: the one trained for that GPU, else the one of
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


def _neighbours(db, spec: GemmSpec, arch: str, gpu_name: Optional[str]):
    """Other tuned problems with the same dtypes/layouts/epilogue, nearest first, by log2 distance (the
    problem itself is the exact step's: its picks that this gemmc cannot run must not come back here)."""
    from .search.db import problem_fields
    want = problem_fields(spec, arch)
    same = ("dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout", "epilogue_class", "arch", "batch")
    out = []
    for e in db.best_all(arch):
        if any(e.fields[f] != want[f] for f in same) or (gpu_name is not None and e.gpu_name != gpu_name):
            continue
        if all(e.fields[x] == want[x] for x in ("m", "n", "k")):
            continue
        d = math.sqrt(sum(math.log2(e.fields[x] / want[x]) ** 2 for x in ("m", "n", "k")))
        out.append((d, e))
    out.sort(key=lambda t: t[0])
    return out


def _shape_of(e) -> str:
    return f"{e.fields['m']}x{e.fields['n']}x{e.fields['k']}"


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
    """The nearest entry of `near` ((distance, BestEntry), nearest first) whose pick this gemmc can run for
    `conc`, or None. `whys` memoises `_neighbour_unusable` per entry (by id: the entries live through one
    `_decide`), `here` its `_failed_here` per GPU; the ones passed over on the way are appended to `passed`
    once each."""
    for _, e in near:
        if id(e) not in whys:
            whys[id(e)] = _neighbour_unusable(tdb, conc, arch, e, here)
        why = whys[id(e)]
        if why is None:
            return e
        note = f"{e.schedule.short()} of {_shape_of(e)} ({why})"
        if note not in passed:
            passed.append(note)
    return None


def _with_passed_neighbours(d: Decision, passed: list) -> Decision:
    """`d`, its detail naming the neighbours' picks passed over before it (the first 3, and how many more)."""
    if not passed:
        return d
    named = ", ".join(passed[:3]) + (f" and {len(passed) - 3} more" if len(passed) > 3 else "")
    return replace(d, detail="; ".join(x for x in (d.detail, "passed over the DB's neighbour picks " + named) if x))


def heuristic_schedule(spec: GemmSpec, arch: str) -> Schedule:
    """The analytic heuristic's choice (gemmc.heuristic), else the first feasible default."""
    try:
        from .heuristic import choose_schedule
        s = choose_schedule(spec, arch=arch)
        if isinstance(s, Schedule) and (not _concrete(spec, None) or is_valid(s, spec)):
            return s
    except ImportError:
        pass
    s = default_schedule(arch)
    if _concrete(spec, None) is None or is_valid(s, spec):
        return s
    feasible = enumerate_schedules(spec, arch)
    return feasible[0] if feasible else s


def _shipped_table(conc: Optional[GemmSpec], arch: str, gpu: Optional[str], named: bool, enabled: bool):
    """The table shipped for `gpu` (gemmc.pretuned), once per resolve; None for a symbolic problem.
    `named`: the caller passed the GPU's name (then GEMMC_GPU played no part)."""
    if not enabled or conc is None:
        return None
    from .pretuned import table_for
    table = table_for(arch, gpu)
    if table is None and not named:
        _check_gemmc_gpu()
    return table


def _check_gemmc_gpu() -> None:
    """Warn (once) when GEMMC_GPU names no GPU that has a shipped table: a typo there would otherwise
    silently turn the tables off and leave `auto` to the heuristic."""
    name = os.environ.get("GEMMC_GPU")
    if not name or os.environ.get("GEMMC_PRETUNED", "1") == "0":
        return
    from .pretuned import load_tables
    known = sorted({t.gpu for t in load_tables()})
    if name in known:
        return      # a known GPU, with no table for this arch: nothing was misspelled
    close = _closest_name(name, known)
    # a real name of another GPU resembles a known one too ('NVIDIA H100 ...', 'NVIDIA H800'): the message
    # must not send its user to another GPU's table
    _warn_once(("GEMMC_GPU", name),
               f"gemmc: GEMMC_GPU={name!r} matches no shipped table, so schedule='auto' goes on without one; "
               f"tables ship for: {', '.join(repr(k) for k in known)}. If that is a typo"
               + (f" (did you mean {close!r}?)" if close else "")
               + ", name the GPU exactly as torch.cuda.get_device_name() does, or unset GEMMC_GPU to use the "
                 "visible GPU's; if it is another GPU, `auto` uses your tuning DB's rows of it, then the heuristic")


def _closest_name(name: str, known: list) -> Optional[str]:
    """The known GPU name `name` most resembles, ignoring case; None when none is close."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.5)
    return by_lower[close[0]] if close else None


def _pretuned_decision(table, spec: GemmSpec) -> Optional[tuple[Decision, bool]]:
    """(decision, exact) from the table's entry for this shape, or its neighbour (same N, K, M within 2x),
    when valid for `spec`.
    A neighbour passes on its cuBLAS verdict too: the table is coarse, and a shape between two measured
    cuBLAS wins is far likelier a cuBLAS win than not."""
    hit = table.lookup(spec) if table is not None else None
    if hit is None or not is_valid(hit[0].schedule, spec):
        return None
    e, exact = hit
    times = f"{e.time_us:.2f} us vs cuBLAS {e.cublas_us:.2f} us"
    detail = (f"{times} (shipped table, {table.gpu})" if exact
              else f"shipped table, {table.gpu}: measured {e.m}x{e.n}x{e.k}, {times}")
    if spec.has_epilogue:       # the table timed the plain GEMM
        detail += f"; {_EPILOGUE_KEEPS_THE_KERNEL if e.cublas_faster else 'measured without the epilogue'}"
    return Decision(e.schedule, "pretuned", use_cublas=e.cublas_faster and not spec.has_epilogue,
                    detail=detail), exact


_EPILOGUE_KEEPS_THE_KERNEL = ("cuBLAS was faster, but the fused epilogue keeps the kernel (cuBLAS would need extra "
                              "passes)")


def _db_decision(e, plain: bool) -> Decision:
    """The DB's best of this exact problem (a gemmc.search.db.BestEntry); torch.matmul for a plain GEMM
    whose paired speed-up is below 1."""
    slower = e.speedup is not None and e.speedup < 1.0
    where = f"{e.n_measured} measured, {e.gpu_name}" + _stale_note(e)
    if e.speedup is None:
        return Decision(e.schedule, "db", detail=f"{e.time_us:.2f} us, no paired cuBLAS time ({where})")
    return Decision(e.schedule, "db", use_cublas=slower and plain,
                    detail=f"paired {e.speedup:.3f}x: {e.time_us:.2f} us vs cuBLAS {e.cublas_us:.2f} us, "
                           f"{'median' if e.n_rows >= 3 else 'geomean'} of {e.n_rows} row{'s' if e.n_rows > 1 else ''} "
                           f"({where})" + (f"; {_EPILOGUE_KEEPS_THE_KERNEL}" if slower and not plain else ""))


def _stale_note(e) -> str:
    """Says so when the pick rests on an older gemmc's rows, whose kernels may have run at another speed."""
    if not e.stale:
        return ""
    return (f"; rows of gemmc {e.version}, older than this {__version__}: `gemmc-search tune --budget 1` "
            f"re-measures them")


def _heuristic_decision(conc: Optional[GemmSpec], spec: GemmSpec, arch: str, table) -> Decision:
    """The heuristic's schedule; for a plain GEMM on a GPU with a shipped table, torch.matmul when cuBLAS
    won at any of the nearest measured shapes (gemmc.pretuned.PretunedTable.predicted_cublas_faster).
    The detail says which measurements were read, or why none applied."""
    schedule = heuristic_schedule(conc or spec, arch)
    why_none = _why_no_verdict(conc, spec, table)
    if why_none is not None:
        return Decision(schedule, "heuristic", detail=why_none)
    from .pretuned import VERDICT_MAX_LOG2, VERDICT_NEIGHBOURS
    cublas_faster, read = table.cublas_verdict(conc)
    if cublas_faster is None:
        return Decision(schedule, "heuristic", detail=f"no shape measured on {table.gpu} within "
                                                      f"{2 ** VERDICT_MAX_LOG2:g}x")
    what = {"checks": "the heuristic's picks", "entries": "tuned schedules"}[read]
    won = (f"cuBLAS won at one or more of the {VERDICT_NEIGHBOURS} nearest shapes measured" if cublas_faster
           else f"gemmc won at each of the nearest shapes measured (up to {VERDICT_NEIGHBOURS}, within "
                f"{2 ** VERDICT_MAX_LOG2:g}x)")
    return Decision(schedule, "heuristic", use_cublas=cublas_faster, detail=f"{won} on {table.gpu} ({what})")


def _why_no_verdict(conc: Optional[GemmSpec], spec: GemmSpec, table) -> Optional[str]:
    """Why the shipped table cannot give this problem a cuBLAS verdict; None when it can."""
    if conc is None:
        return _symbolic_note(spec)
    if table is None:
        return ("no tuning of this problem, and no shipped table in use (none for this GPU and arch, or "
                "GEMMC_PRETUNED=0)")
    if not table.covers(conc):
        return (f"no tuning of this problem; the shipped table of the {table.gpu} holds plain bf16 A [M, K] @ "
                f"B [N, K].T, unbatched, only")
    if conc.has_epilogue:
        return "no tuning of this problem or shape; a fused epilogue keeps the kernel"
    return None


def _symbolic_note(spec: GemmSpec) -> str:
    dims = [name for name, d in (("M", spec.m), ("N", spec.n), ("K", spec.k), ("batch", spec.batch))
            if d is not None and not isinstance(d, int)]
    note = f"symbolic {' and '.join(dims)}: no measurement applies"
    if dims == ["M"]:
        note += " (a symbolic-M `auto` compile decides per runtime M: see k.for_m(M))"
    return note


def resolve_auto(spec: GemmSpec, arch: str = "sm_90a", m: Optional[int] = None, db=None,
                 gpu_name: Optional[str] = None, pretuned: bool = True) -> Decision:
    """The schedule for `spec` (M may be symbolic: pass the runtime `m`); see the module docstring.

    `db`: a TuningDB, a path, or None for the default location (a missing file means no tuning; one that
    cannot be read is skipped with a warning). `gpu_name`: the GPU the calls will run on (default
    GEMMC_GPU, else the visible GPU's); the DB's rows of other GPUs are left out, as the shipped tables
    of other GPUs are: a schedule and a cuBLAS verdict measured on one GPU do not carry to another. With
    no GPU named or visible (an ahead-of-time build), any GPU's rows count."""
    arch = as_arch(arch)
    conc = _concrete(spec, m)
    tdb, owned = _open_db(db) if conc is not None else (None, False)
    gpu = target_gpu(gpu_name) if conc is not None else gpu_name
    try:
        return _resolve(spec, conc, arch, tdb, gpu, gpu_name is not None, pretuned)
    except sqlite3.DatabaseError as e:      # damaged past the pages the open read, or locked for a minute
        _skip_db(tdb.path, f"reading {tdb.path} failed ({e}); check it with `sqlite3 FILE 'PRAGMA "
                           f"integrity_check'`, or point GEMMC_TUNING_DB at another")
        return _resolve(spec, conc, arch, None, gpu, gpu_name is not None, pretuned)
    finally:
        if owned and tdb is not None:
            tdb.close()


def _resolve(spec: GemmSpec, conc: Optional[GemmSpec], arch: str, tdb, gpu_name: Optional[str], named: bool,
             pretuned: bool) -> Decision:
    exact, passed_over = _db_exact(tdb, conc, arch, gpu_name) if tdb is not None else (None, [])
    d = _decide(spec, conc, arch, tdb, exact, _shipped_table(conc, arch, gpu_name, named, pretuned), gpu_name)
    if passed_over:     # the DB's own picks that this gemmc cannot run: say why they did not decide
        d = replace(d, detail="; ".join(x for x in (d.detail, "passed over the DB's " + ", ".join(passed_over)) if x))
    return d


def _decide(spec: GemmSpec, conc: Optional[GemmSpec], arch: str, tdb, exact, table,
            gpu_name: Optional[str]) -> Decision:
    """The documented order (module docstring), given the DB's usable exact entry and the shipped table."""
    if exact is not None:
        return _db_decision(exact, plain=not conc.has_epilogue)
    shipped = _pretuned_decision(table, conc)
    if shipped is not None and shipped[1]:
        return shipped[0]
    passed: list = []       # the neighbours' picks this gemmc cannot run, nearest first
    if tdb is not None:
        near = [(d, e) for d, e in _neighbours(tdb, conc, arch, gpu_name) if d <= FAR_LOG2]
        whys: dict = {}
        here: dict = {}
        close = [(d, e) for d, e in near if d <= NEAR_LOG2 and e.fields["n"] == conc.n and e.fields["k"] == conc.k]
        e = _first_usable_neighbour(tdb, conc, arch, close, whys, here, passed)
        if e is not None:
            return _with_passed_neighbours(Decision(e.schedule, "nearest", detail=f"tuned {_shape_of(e)}"), passed)
        pol = _policy(tdb, gpu_name)
        if pol is not None:
            feasible = enumerate_schedules(conc, arch)
            if feasible:
                of = f" of {pol.gpu_name}" if getattr(pol, "gpu_name", None) else ""
                return _with_passed_neighbours(
                    Decision(pol.best(conc, feasible), "policy",
                             detail=f"policy trained on {pol.trained_shapes} shapes{of}"), passed)
        e = _first_usable_neighbour(tdb, conc, arch, near, whys, here, passed)
        if e is not None:
            return _with_passed_neighbours(Decision(e.schedule, "nearest", detail=f"tuned {_shape_of(e)}"), passed)
    if shipped is not None:
        return _with_passed_neighbours(shipped[0], passed)
    return _with_passed_neighbours(_heuristic_decision(conc, spec, arch, table), passed)


def _db_exact(tdb, conc: GemmSpec, arch: str, gpu_name: Optional[str]):
    """(entry, passed over): the DB's best for this exact problem (a gemmc.search.db.BestEntry) among the
    schedules this gemmc can run, or None; and why any better-ranked ones were passed over. A schedule is
    passed over when this gemmc finds it invalid, or when its figure rests on an older gemmc's rows and this
    gemmc failed to build or run it: those rows no longer describe a kernel that runs."""
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
