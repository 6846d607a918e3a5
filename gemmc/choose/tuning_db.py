"""The tuning DB, read: the best stored schedule of a problem by the paired verdict, its neighbours' bests,
what was disqualified, and the policy trained for a GPU. `schedule="auto"` reads the DB through this; it never
writes it (gemmc.search.db does: `TuningDB` is this class with the writes).

The file's tables are gemmc.choose.tuning_db_schema's; the verdict (which schedule is best, and when a figure
is stale or disqualified) is gemmc.choose.tuning_db_verdict's.

A saved policy records the GPU whose rows trained it (`policies.gpu_name`, schema 4; NULL when unknown: one
trained on several GPUs' rows, or saved by an older gemmc). The DB keeps one policy per GPU: a policy trained
for GPU G is stored under the name G, one of unknown GPU under "default", so training for one GPU leaves the
others' policies alone. `policy_for(gpu)` picks the policy a target GPU uses: the one trained
for it, else the one of unknown GPU, else none (a policy of another GPU never serves); with no target, the
"default" one, else the only one, else the newest. `schedule="auto"` and `gemmc-search tune --strategy rl`
use that choice.
"""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from .. import __version__
from ..schedule import Schedule
from ..spec import GemmSpec
from ..types import as_arch
from .measurement import SUSTAINED, L2Profile, Measurement
from .tuning_db_schema import (CONFIRM, CUBLAS_SCHEDULE, DEFAULT_POLICY, FIELDS, HINT, KEY_COLUMNS, TABLES,
                               TuningDBError, default_path, problem_key)
from .tuning_db_verdict import (PairedFigure, ScheduleFigure, disqualifying, failed_check, parse_schedule,
                                rank_by_verdict, schedule_figures, succeeded, timing_of, version_key)

# rows timed at their own clock, and failures (a schedule that fails to build or check fails either way)
_OWN_CLOCK_OR_FAILED = " AND (timing = ? OR time_us IS NULL)"


def policy_gpu(r) -> Optional[str]:
    """The GPU a policy row was trained for; None when unknown, as for a row of a schema-3 or older file
    opened read-only (no such column)."""
    return r["gpu_name"] if "gpu_name" in r.keys() else None


@dataclass(frozen=True)
class StoredPolicy:
    """One stored policy, without its weights (`TuningDB.policies`)."""
    name: str
    gpu_name: Optional[str]     # the GPU whose rows trained it; None: unknown
    trained_shapes: Optional[int]
    gemmc_version: str
    created_at: float


def _choose_policy(stored: list, gpu_name: Optional[str]) -> Optional[StoredPolicy]:
    """The policy `TuningDB.policy_for(gpu_name)` loads, among `stored` (module docstring)."""
    def prefer(name):       # the named row first, then the newest (then by name, for a tie)
        return lambda p: (p.name == name, p.created_at, p.name)
    if gpu_name is not None:
        mine = [p for p in stored if p.gpu_name == gpu_name]
        if mine:
            return max(mine, key=prefer(gpu_name))
        stored = [p for p in stored if p.gpu_name is None]
    return max(stored, key=prefer(DEFAULT_POLICY)) if stored else None


@dataclass(frozen=True)
class BestEntry(PairedFigure):
    """The best stored schedule of one problem on one GPU, by the paired verdict (module docstring).

    time_us and cublas_us are the schedule's geometric means over its paired rows, so cublas_us /
    time_us (`speedup`) is the geometric mean of its paired ratios; from three paired rows on, they are
    the median row's; without a paired row, time_us is the geometric mean of its times and cublas_us is
    None."""
    fields: dict
    gpu_name: str
    schedule: Schedule
    time_us: float
    cublas_us: Optional[float]
    n_measured: int         # successful rows of the problem on this GPU, every schedule
    n_rows: int = 1         # rows of this schedule behind time_us and cublas_us
    version: str = __version__  # the gemmc version of those rows
    own_clock: bool = False     # those rows were timed at their own power-capped clock (`--sustained-s`)


@dataclass(frozen=True)
class Disqualified:
    """A schedule of one problem on one GPU left out of the verdict: it failed its correctness check at the
    newest gemmc version that measured it."""
    fields: dict
    gpu_name: str
    schedule: Schedule
    error: str              # the first failed check at that version
    version: str            # that gemmc version
    n_failed: int           # its failed checks at that version
    n_ok: int               # its successful rows at that version (timed before or after the failure)


class TuningDBReader:
    """A tuning DB opened read-only, for lookups and reports: no write is allowed, no write lock taken."""

    def __init__(self, path=None):
        """Open the existing DB at `path` (default `default_path()`). A missing file, a folder or a file that
        is not a gemmc tuning DB raises TuningDBError, naming it, and is left as it was."""
        self.path = Path(path) if path is not None else default_path()
        if self.path.is_dir():
            raise TuningDBError(f"{self.path} is a folder, not a tuning DB file; {HINT}")
        if not self.path.exists():
            raise TuningDBError(f"{self.path}: no tuning DB there; {HINT}")
        self.conn = self._connect_read_only()
        self._check_is_gemmc_db(empty_ok=False)

    def _connect(self, target: str, uri: bool = False) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(target, timeout=60, uri=uri)
        except sqlite3.Error as e:
            raise TuningDBError(f"cannot open the tuning DB {self.path}: {e}; {HINT}") from None
        conn.row_factory = sqlite3.Row
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """A connection that never writes. Where this process may write the file and its folder: mode=rw
        (never creates the file) with query_only (refuses every write); unlike mode=ro, the last reader to
        close still tidies away the -wal and -shm files. Elsewhere (a read-only mount, a cache CI built):
        mode=ro, which reads a WAL-mode file only where its -shm index exists or can be made beside it; if
        it cannot, the file is read as immutable (no locks, no index), which a folder nobody can write
        keeps true."""
        uri = self.path.absolute().as_uri()
        folder = self.path.absolute().parent
        if os.access(self.path, os.W_OK) and os.access(folder, os.W_OK | os.X_OK):
            conn = self._connect(uri + "?mode=rw", uri=True)
            conn.execute("PRAGMA query_only = ON")
            return conn
        conn = self._connect(uri + "?mode=ro", uri=True)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:        # "unable to open database file": no -shm, none can be made
            conn.close()
        return self._connect(uri + "?mode=ro&immutable=1", uri=True)

    def _check_is_gemmc_db(self, empty_ok: bool) -> None:
        """Raise TuningDBError (and close) unless the file holds gemmc's tables; an empty file passes
        when `empty_ok` (it is about to get them)."""
        try:
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise TuningDBError(f"{self.path} cannot be read as a tuning DB ({e}); {HINT}") from None
        if not tables and empty_ok:
            return
        why = None
        if not tables:
            why = "it is empty (no tables)"
        elif not TABLES <= tables:
            why = (f"it has no {' or '.join(sorted(TABLES - tables))} table "
                   f"(its tables: {', '.join(sorted(tables)[:6])})")
        elif not KEY_COLUMNS <= columns:
            why = f"its measurements table lacks {', '.join(sorted(KEY_COLUMNS - columns))}"
        if why:
            self.conn.close()
            raise TuningDBError(f"{self.path} is not a gemmc tuning DB: {why}; {HINT}")


    @classmethod
    def open_existing(cls, path=None) -> Optional["TuningDBReader"]:
        """The DB, read-only, if the file exists; None if it does not (lookups never create one). A file
        that is not a gemmc tuning DB raises TuningDBError."""
        p = Path(path) if path is not None else default_path()
        return cls(p) if p.exists() else None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- reading ------------------------------------------------------------------------------
    def prior(self, spec: GemmSpec, arch: str, gpu_name: Optional[str] = None,
              version: Optional[str] = None, sustained_only: bool = False) -> list[Measurement]:
        """Stored measurements of this problem (the latest per schedule): a resumed run starts from these.
        version: only the rows that gemmc version measured. sustained_only: only rows timed at their own
        clock (`timing` SUSTAINED), and failures (a schedule that failed to build or check fails either way)."""
        q = "SELECT * FROM measurements WHERE problem = ?"
        args: list = [problem_key(spec, arch)]
        if gpu_name is not None:
            q += " AND gpu_name = ?"
            args.append(gpu_name)
        if version is not None:
            q += " AND gemmc_version = ?"
            args.append(version)
        if sustained_only:
            q += _OWN_CLOCK_OR_FAILED
            args.append(SUSTAINED)
        out: dict[Schedule, Measurement] = {}
        for r in self.conn.execute(q + " ORDER BY id", args):
            s = Schedule.from_dict(json.loads(r["schedule"]))
            out[s] = Measurement(s, r["time_us"], r["error"], r["cublas_us"], r["compile_s"], timing_of(r))
        return list(out.values())

    def _select(self, where: str = "", args: Iterable = ()) -> list[sqlite3.Row]:
        """The rows `where` (SQL after AND) selects, failed ones too: a failed check disqualifies."""
        return list(self.conn.execute(f"SELECT * FROM measurements WHERE 1 {where} ORDER BY id", list(args)))

    def _groups(self, where: str = "", args: Iterable = ()) -> dict[tuple, list[sqlite3.Row]]:
        """{(problem, GPU): its rows} among `_select`'s."""
        groups: dict[tuple, list[sqlite3.Row]] = {}
        for r in self._select(where, args):
            groups.setdefault((r["problem"], r["gpu_name"]), []).append(r)
        return groups

    @staticmethod
    def _order(entries: list) -> list:
        return sorted(entries, key=lambda e: (e.fields["m"], e.fields["n"], e.fields["k"], e.gpu_name,
                                              json.dumps(e.fields, sort_keys=True)))

    def _best_rows(self, where: str = "", args: Iterable = ()) -> list[BestEntry]:
        """One BestEntry per (problem, GPU) among the rows `where` (SQL after AND) selects."""
        out = []
        for (_, gpu), rows in self._groups(where, args).items():
            ranked = rank_by_verdict(schedule_figures(rows), tiebreak=lambda f: f.first_id)
            if not ranked:
                continue
            top = ranked[0]
            out.append(BestEntry({c: rows[0][c] for c in FIELDS}, gpu, top.schedule, top.time_us, top.cublas_us,
                                 sum(map(succeeded, rows)), top.n_rows, top.version, top.own_clock))
        return self._order(out)

    def disqualified(self, spec: Optional[GemmSpec] = None, arch: Optional[str] = None,
                     gpu_name: Optional[str] = None) -> list[Disqualified]:
        """The schedules left out of the verdict because they failed their correctness check (module
        docstring): of the problem `spec` on `arch` when given, else of every problem; on `gpu_name` when
        given."""
        where, args = "", []
        if spec is not None:
            if arch is None:
                raise ValueError("disqualified(spec): give the arch the problem was tuned for, e.g. 'sm_90a'")
            where, args = "AND problem = ?", [problem_key(spec, arch)]
        elif arch is not None:
            where, args = "AND arch = ?", [as_arch(arch)]
        if gpu_name is not None:
            where += " AND gpu_name = ?"
            args.append(gpu_name)
        out = []
        for (_, gpu), rows in self._groups(where, args).items():
            parsed: dict[str, Schedule] = {}
            for schedule, first in disqualifying(rows).items():
                at = [r for r in rows if parse_schedule(r["schedule"], parsed) == schedule
                      and version_key(r["gemmc_version"]) == version_key(first["gemmc_version"])]
                out.append(Disqualified({c: rows[0][c] for c in FIELDS}, gpu, schedule, first["error"],
                                        first["gemmc_version"], sum(failed_check(r["error"]) for r in at),
                                        sum(map(succeeded, at))))
        return self._order(out)

    def best(self, spec: GemmSpec, arch: str, gpu_name: Optional[str] = None) -> Optional[BestEntry]:
        """The exact problem's best on `gpu_name`; when None, the best GPU's entry by the same verdict
        (the highest paired speedup)."""
        where, args = "AND problem = ?", [problem_key(spec, arch)]
        if gpu_name is not None:
            where += " AND gpu_name = ?"
            args.append(gpu_name)
        ranked = rank_by_verdict(self._best_rows(where, args), tiebreak=lambda e: e.gpu_name)
        return ranked[0] if ranked else None

    def best_all(self, arch: Optional[str] = None) -> list[BestEntry]:
        if arch is None:
            return self._best_rows()
        return self._best_rows("AND arch = ?", [as_arch(arch)])

    def ranked_schedules(self, spec: GemmSpec, arch: str, gpu_name: str,
                         search_only: bool = False) -> list[ScheduleFigure]:
        """The problem's schedules on `gpu_name`, best first by the paired verdict; search_only leaves
        out the confirm rows (what `gemmc-search tune` picks its confirmations from)."""
        rows = self._select("AND problem = ? AND gpu_name = ?", [problem_key(spec, arch), gpu_name])
        if search_only:
            # a failed check in a confirm row disqualifies too: the confirmations go to the next best
            out = disqualifying(rows)
            figs = [f for f in schedule_figures([r for r in rows if r["strategy"] != CONFIRM])
                    if f.schedule not in out]
        else:
            figs = schedule_figures(rows)
        return rank_by_verdict(figs, tiebreak=lambda f: f.first_id)

    def confirmed(self, spec: GemmSpec, arch: str, gpu_name: str, sustained_only: bool = False) -> set[Schedule]:
        """Schedules of this problem with a confirm row on `gpu_name` (failed ones too: never retried);
        sustained_only: a confirm row timed at its own clock, or a failed one. A disqualified schedule
        (`disqualified`) is never among the ones `ranked_schedules` offers for confirmation."""
        rows = self.conn.execute("SELECT DISTINCT schedule FROM measurements WHERE problem = ? AND gpu_name = ? "
                                 "AND strategy = ?" + (_OWN_CLOCK_OR_FAILED if sustained_only else ""),
                                 (problem_key(spec, arch), gpu_name, CONFIRM) + ((SUSTAINED,) if sustained_only else ()))
        return {Schedule.from_dict(json.loads(r[0])) for r in rows}

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]

    def failures(self) -> list[tuple[str, int]]:
        """[(error, rows)] of the failed measurements, the most frequent first."""
        return [(r[0], r[1]) for r in self.conn.execute(
            "SELECT COALESCE(error, 'no time'), COUNT(*) AS n FROM measurements "
            "WHERE error IS NOT NULL OR time_us IS NULL GROUP BY 1 ORDER BY n DESC, 1")]

    def rows(self) -> list[dict]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM measurements ORDER BY id")]

    # ---- profiles: ncu's metrics per schedule (schema 5) ---------------------------------------------
    def has_profiles(self) -> bool:
        """Whether the file has the profiles table (a schema-4 or older file opened read-only has not)."""
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'profiles'"
                                 ).fetchone() is not None

    def profile_rows(self) -> list[dict]:
        if not self.has_profiles():
            return []
        return [dict(r) for r in self.conn.execute("SELECT * FROM profiles ORDER BY id")]

    def profiles(self, problem: str, gpu_name: Optional[str] = None) -> dict:
        """{Schedule, or None for cuBLAS: its newest profile} of one problem (its `problem_key`), on `gpu_name`
        when given (else on any GPU, the newest)."""
        if not self.has_profiles():
            return {}
        q, args = "SELECT * FROM profiles WHERE problem = ?", [problem]
        if gpu_name is not None:
            q += " AND gpu_name = ?"
            args.append(gpu_name)
        out: dict = {}
        for r in self.conn.execute(q + " ORDER BY created_at, id", args):
            key = None if r["schedule"] == CUBLAS_SCHEDULE else Schedule.from_dict(json.loads(r["schedule"]))
            out[key] = L2Profile.from_dict(dict(r))
        return out

    def profiles_of(self, spec: GemmSpec, arch: str, gpu_name: Optional[str] = None) -> dict:
        return self.profiles(problem_key(spec, arch), gpu_name)

    # ---- policy weights: one per GPU (module docstring) -------------------------------------------
    def policies(self) -> list[StoredPolicy]:
        """The stored policies, without their weights: known GPUs' by name, then those of unknown GPU."""
        has_gpu = "gpu_name" in {r[1] for r in self.conn.execute("PRAGMA table_info(policies)")}
        gpu = "gpu_name" if has_gpu else "NULL"     # a schema-3 or older file opened read-only: unknown
        rows = self.conn.execute(f"SELECT name, {gpu}, trained_shapes, gemmc_version, created_at FROM policies")
        return sorted((StoredPolicy(*r) for r in rows), key=lambda p: (p.gpu_name is None, p.gpu_name or "", p.name))

    def policy_stamp(self, gpu_name: Optional[str] = None) -> Optional[float]:
        """When the policy `policy_for(gpu_name)` loads was saved (None if it finds none): a retrain changes it."""
        p = _choose_policy(self.policies(), gpu_name)
        return p.created_at if p is not None else None

    def policy_for(self, gpu_name: Optional[str] = None):
        """The policy for the target GPU `gpu_name`: the one trained for that GPU, else the one of unknown GPU
        ("default", as older gemmc versions saved it), else None: another GPU's policy never serves. With no
        target (None): the "default" one, else the only one, else the newest. PolicyLoadError when the chosen
        one cannot be loaded."""
        p = _choose_policy(self.policies(), gpu_name)
        return self.load_policy(p.name) if p is not None else None

    def load_policy(self, name: Optional[str] = None):
        """The policy saved under `name` (None if none; with no name, `policy_for(None)`'s), its `gpu_name` the
        GPU it was trained for (None: unknown)."""
        if name is None:
            return self.policy_for(None)
        r = self.conn.execute("SELECT * FROM policies WHERE name = ?", (name,)).fetchone()
        if r is None:
            return None
        from .schedule_policy import SchedulePolicy     # imports torch: only where a policy is loaded
        pol = SchedulePolicy.from_bytes(bytes(r["blob"]))
        pol.gpu_name = policy_gpu(r)
        return pol

    def gpus(self) -> list[str]:
        """The GPUs the DB holds measurements of, sorted."""
        return [r[0] for r in self.conn.execute("SELECT DISTINCT gpu_name FROM measurements ORDER BY gpu_name")]

    # ---- moving results between machines ----------------------------------------------------------
