"""The tuning database: every measurement ever made, the paired verdict per problem, and policy weights.

SQLite in WAL mode; each measurement is its own transaction, so a run killed at any moment loses
at most the measurement in flight, and `TuningDB.prior` lets the next run skip what is stored.
Location: $GEMMC_TUNING_DB, else <$GEMMC_CACHE_DIR or ~/.cache/gemmc>/tuning.sqlite.

The verdict (`TuningDB.best`) is paired: a row's gemmc and cuBLAS times were measured interleaved in
the same CUDA-graph runs, so they share the GPU's clocks and temperature, which drift by up to ~30%
over a long tune. The best schedule of a problem on a GPU is the one with the highest geometric
mean of its rows' cublas_us / time_us, or, from three paired rows on, the median row's (one run whose
cuBLAS or gemmc side was slow cannot carry it); rows without a cuBLAS time (problems the Runner cannot
pair, such as fused epilogues) rank by the geometric mean of their times. Comparing the fastest row with
the fastest cuBLAS row of the whole run (schema 1's view) judged a thermal state, not a schedule.

A schedule's figure uses only its rows from the newest gemmc version that measured it: a new version's
kernels may run at another speed, so its rows supersede the older ones (which stay stored). A figure
whose rows all predate the running version is `stale`, and `gemmc-search tune --confirm` re-measures it
when it is among the best.

A schedule whose correctness check failed (`failed_check`) in a row of that newest version is
disqualified: a kernel that once computed a wrong result cannot be the pick, whatever its times, so it
leaves the ranking, `best`, the report's picks and the policy's positives (`disqualified` says which and
why). A compile failure, a compile timeout or a run error says nothing about the results, and does not.

A saved policy records the GPU whose rows trained it (`policies.gpu_name`, schema 4; NULL when unknown: one
trained on several GPUs' rows, or saved by an older gemmc). The DB keeps one policy per GPU: a policy trained
for GPU G is stored under the name G, one of unknown GPU under "default", so training for one GPU leaves the
others' policies alone. `policy_for(gpu)` picks the policy a target GPU uses: the one trained
for it, else the one of unknown GPU, else none (a policy of another GPU never serves); with no target, the
"default" one, else the only one, else the newest. `schedule="auto"` and `gemmc-search tune --strategy rl`
use that choice.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from .. import __version__
from ..errors import GemmcError
from ..output_file import check_output_file, make_parent
from ..schedule import Schedule
from ..spec import GemmSpec
from ..types import as_arch
from .strategy import SUSTAINED, Measurement, schedule_key

SCHEMA_VERSION = 4      # 2: the min-time view best_per_problem is gone (the verdict is paired, in Python);
                        # 3: a measurement's `timing` (own-clock rows of long calls outrank interleaved ones);
                        # 4: the GPU a policy was trained for (policies.gpu_name; NULL: unknown, as in older files)
CONFIRM = "confirm"     # the strategy of the rows `gemmc-search tune` re-measures after a search
# two paired rows of one schedule whose speedups differ by more than this (relative) get a third
# (`gemmc-search tune`): H200 cuBLAS runs of one shape read up to 7% apart between measurements
CONFIRM_SPREAD = 0.02
ALSO = "also"           # the strategy of the rows `gemmc-search tune --also` measures besides the search

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem TEXT NOT NULL,            -- canonical JSON of the problem (exact-match identity)
    m INTEGER NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL, batch INTEGER,
    dtype TEXT NOT NULL, out_dtype TEXT NOT NULL, acc_dtype TEXT NOT NULL,
    a_layout TEXT NOT NULL, b_layout TEXT NOT NULL, epilogue_class TEXT NOT NULL,
    arch TEXT NOT NULL, gpu_name TEXT NOT NULL,
    schedule TEXT NOT NULL,           -- canonical JSON of the Schedule
    time_us REAL, cublas_us REAL, compile_s REAL, error TEXT,
    strategy TEXT, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL,
    timing TEXT                       -- 'sustained': each side timed at its own power-capped clock; NULL: interleaved
);
CREATE INDEX IF NOT EXISTS measurements_problem ON measurements (problem, gpu_name);
CREATE TABLE IF NOT EXISTS policies (
    name TEXT PRIMARY KEY, blob BLOB NOT NULL, feature_spec TEXT NOT NULL,
    trained_shapes INTEGER, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL,
    gpu_name TEXT                     -- the GPU whose rows trained it; NULL: unknown (several GPUs', or an older gemmc)
);
"""

_COLUMNS = ("problem", "m", "n", "k", "batch", "dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout",
            "epilogue_class", "arch", "gpu_name", "schedule", "time_us", "cublas_us", "compile_s", "error",
            "strategy", "gemmc_version", "created_at", "timing")
DEFAULT_POLICY = "default"  # the name of a policy of unknown GPU; a GPU's policy is stored under the GPU's name
_POLICY_COLUMNS = ("name", "blob", "feature_spec", "trained_shapes", "gemmc_version", "created_at", "gpu_name")
_INSERT_POLICY = (f"INSERT OR REPLACE INTO policies ({', '.join(_POLICY_COLUMNS)}) VALUES "
                  f"({', '.join('?' * len(_POLICY_COLUMNS))})")


# a file is gemmc's tuning DB when it holds these tables, and the measurements table these columns
_TABLES = {"measurements", "policies"}
_KEY_COLUMNS = {"problem", "gpu_name", "schedule", "time_us", "cublas_us", "gemmc_version"}
_HINT = "point gemmc-search --db or GEMMC_TUNING_DB at a gemmc tuning DB (`gemmc-search tune` writes one)"


class TuningDBError(GemmcError):
    """A tuning DB (or an export of one) is missing, unreadable, or not gemmc's."""


def default_path() -> Path:
    if os.environ.get("GEMMC_TUNING_DB"):
        return Path(os.environ["GEMMC_TUNING_DB"]).expanduser()
    cache = os.environ.get("GEMMC_CACHE_DIR") or os.path.join("~", ".cache", "gemmc")
    return Path(cache).expanduser() / "tuning.sqlite"


def epilogue_class(spec: GemmSpec) -> str:
    """'plain' for a bare GEMM (cuBLAS computes the same thing), else the ops plus a digest of the DAG."""
    if not spec.has_epilogue:
        return "plain"
    ops = "+".join(op.op for op in spec.epilogue) or "cast"
    body = repr((spec.inputs, spec.epilogue, str(spec.out_dtype)))
    return f"{ops}:{hashlib.blake2b(body.encode(), digest_size=4).hexdigest()}"


def problem_fields(spec: GemmSpec, arch: str) -> dict:
    if not all(isinstance(d, int) for d in (spec.m, spec.n, spec.k)):
        raise ValueError(f"the tuning DB stores concrete problems; got m={spec.m!r} n={spec.n!r} k={spec.k!r}")
    return {"m": spec.m, "n": spec.n, "k": spec.k, "batch": spec.batch if isinstance(spec.batch, int) else None,
            "dtype": str(spec.dtype), "out_dtype": str(spec.out_dtype), "acc_dtype": str(spec.acc_dtype),
            "a_layout": spec.a_layout, "b_layout": spec.b_layout, "epilogue_class": epilogue_class(spec),
            "arch": as_arch(arch)}


def problem_key(spec: GemmSpec, arch: str) -> str:
    return json.dumps(problem_fields(spec, arch), sort_keys=True, separators=(",", ":"))


def version_key(version: str) -> tuple:
    """'0.10.1' -> (0, 10, 1): versions order by their numeric parts (a non-numeric part counts 0)."""
    return tuple(int(p) if p.isdigit() else 0 for p in str(version).split("."))


def older_than_running(version: str) -> bool:
    """Rows of this gemmc version predate the running one: its kernels may have run at another speed."""
    return version_key(version) < version_key(__version__)


CHECK_FAILED = "check: "   # how the Runner words a failed correctness check (bench status check_failed)


def failed_check(error: Optional[str]) -> bool:
    """Is this stored error a failed correctness check (the kernel ran and its output was wrong against the
    fp32 reference)? Only the Runner's "check: ..." rows are; "compile: ...", "compile timed out ...",
    "compile worker ...", "run: ..." and "no time" rows failed before a result could be judged."""
    return isinstance(error, str) and error.startswith(CHECK_FAILED)


def _succeeded(r) -> bool:
    return r["error"] is None and r["time_us"] is not None and r["time_us"] > 0


def _parse(text: str, cache: dict) -> Schedule:
    if text not in cache:
        cache[text] = Schedule.from_dict(json.loads(text))
    return cache[text]


def _disqualifying(rows: list) -> dict:
    """{Schedule: its failed-check row} for the schedules of `rows` that failed their check at the newest
    gemmc version that measured them (successful rows and failed checks; a newer version's clean rows
    requalify a schedule, whose kernel may have been fixed)."""
    parsed: dict[str, Schedule] = {}
    newest: dict[Schedule, tuple] = {}
    for r in rows:
        if _succeeded(r) or failed_check(r["error"]):
            s = _parse(r["schedule"], parsed)
            newest[s] = max(newest.get(s, ()), version_key(r["gemmc_version"]))
    out: dict[Schedule, object] = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        if failed_check(r["error"]):
            s = _parse(r["schedule"], parsed)
            if version_key(r["gemmc_version"]) == newest[s]:
                out.setdefault(s, r)      # the first failure at that version says why
    return out


def _geomean(xs: list[float]) -> float:
    # one row stays exact: a single measurement reads back as stored
    return xs[0] if len(xs) == 1 else math.exp(math.fsum(map(math.log, xs)) / len(xs))


@dataclass(frozen=True)
class ScheduleFigure:
    """One schedule's standing in a problem: geometric means over its paired rows (cuBLAS timed in the
    same run), the median row's times from three paired rows on, or geometric means over all its rows
    when none is paired (then cublas_us is None)."""
    schedule: Schedule
    time_us: float
    cublas_us: Optional[float]
    n_rows: int             # the rows behind the figure
    first_id: int           # ties go to the schedule measured first
    spread: float = 0.0     # max / min - 1 of the paired rows' speedups (0 with fewer than two)
    version: str = __version__  # the gemmc version of the rows behind the figure (the newest that measured it)
    own_clock: bool = False     # the rows were timed at their own power-capped clock (`timing` SUSTAINED)

    @property
    def speedup(self) -> Optional[float]:
        return self.cublas_us / self.time_us if self.cublas_us else None

    @property
    def stale(self) -> bool:
        """Measured only by an older gemmc, whose kernels may have run at another speed."""
        return older_than_running(self.version)

    @property
    def unsettled(self) -> bool:
        """Two paired rows that disagree by more than CONFIRM_SPREAD: a third decides (median)."""
        return self.n_rows == 2 and self.cublas_us is not None and self.spread > CONFIRM_SPREAD


# rows timed at their own clock, and failures (a schedule that fails to build or check fails either way)
_OWN_CLOCK_OR_FAILED = " AND (timing = ? OR time_us IS NULL)"


def _timing(r) -> Optional[str]:
    """A row's `timing`; None for a row of an older file opened read-only (no such column)."""
    return r["timing"] if "timing" in r.keys() else None


def _policy_gpu(r) -> Optional[str]:
    """The GPU a policy row was trained for; None when unknown, as for a row of a schema-3 or older file
    opened read-only (no such column)."""
    return r["gpu_name"] if "gpu_name" in r.keys() else None


def policy_name(gpu_name: Optional[str]) -> str:
    """The name a policy trained for `gpu_name` is stored under: the GPU's name, or "default" when unknown."""
    return gpu_name if gpu_name is not None else DEFAULT_POLICY


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


def schedule_figures(rows: Iterable) -> list[ScheduleFigure]:
    """Per schedule, from the rows of ONE problem on ONE GPU (mappings with id, schedule, time_us, cublas_us,
    error and gemmc_version; failed rows are skipped): only the rows of the newest version that measured
    the schedule count, and a schedule that failed its correctness check at that version has no figure
    (module docstring). Where the problem has rows timed at their own clock (`timing` SUSTAINED: a long
    call, each side run alone under the power cap), only those count: interleaved units let a kernel that
    spends more energy per call borrow the clock cuBLAS's load sets, so their verdict does not hold in a
    long job."""
    rows = list(rows)
    out_of_it = _disqualifying(rows)
    parsed: dict[str, Schedule] = {}
    rows = [r for r in rows if _succeeded(r) and _parse(r["schedule"], parsed) not in out_of_it]
    own_clock = any(_timing(r) == SUSTAINED for r in rows)
    if own_clock:
        rows = [r for r in rows if _timing(r) == SUSTAINED]
    by_schedule: dict[Schedule, list] = {}    # by the Schedule, not its JSON: as `TuningDB.prior` does
    for r in sorted(rows, key=lambda r: r["id"]):
        by_schedule.setdefault(_parse(r["schedule"], parsed), []).append(r)
    out = []
    for schedule, rs in by_schedule.items():
        version = max((r["gemmc_version"] for r in rs), key=version_key)
        rs = [r for r in rs if r["gemmc_version"] == version]
        paired = [r for r in rs if r["cublas_us"] is not None and r["cublas_us"] > 0]
        use = paired or rs
        ratios = sorted((r["cublas_us"] / r["time_us"], r["id"]) for r in paired)
        spread = ratios[-1][0] / ratios[0][0] - 1 if len(ratios) > 1 else 0.0
        if len(paired) >= 3:     # the median row (the lower one of an even count): an outlier cannot move it
            mid = next(r for r in paired if r["id"] == ratios[(len(ratios) - 1) // 2][1])
            time_us, cublas_us = mid["time_us"], mid["cublas_us"]
        else:
            time_us = _geomean([r["time_us"] for r in use])
            cublas_us = _geomean([r["cublas_us"] for r in paired]) if paired else None
        out.append(ScheduleFigure(schedule, time_us, cublas_us, len(use), rs[0]["id"], spread, version, own_clock))
    return out


def rank_by_verdict(items: Iterable, tiebreak=lambda x: 0) -> list:
    """Best first: by paired speedup (highest first) when any item has one, else by time. An item without
    a paired cuBLAS time is then left out: its time came from other runs (another thermal state), so it
    cannot be set against the paired ones."""
    items = list(items)
    paired = [x for x in items if x.speedup is not None]
    if paired:
        return sorted(paired, key=lambda x: (-x.speedup, x.time_us, tiebreak(x)))
    return sorted(items, key=lambda x: (x.time_us, tiebreak(x)))


@dataclass(frozen=True)
class BestEntry:
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

    @property
    def speedup(self) -> Optional[float]:
        return self.cublas_us / self.time_us if self.cublas_us else None

    @property
    def stale(self) -> bool:
        """The pick rests on rows of an older gemmc (`gemmc-search tune --budget 1` re-measures it)."""
        return older_than_running(self.version)


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


_FIELDS = ("m", "n", "k", "batch", "dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout", "epilogue_class",
           "arch")


class TuningDB:
    def __init__(self, path=None, create: bool = True):
        """create=True: open for writing, making the file (and its folder) when missing and bringing its
        schema up to date. create=False: open an existing DB read-only, for lookups and reports (no
        write is allowed, no write lock taken). Either way a file that is not a gemmc tuning DB raises
        TuningDBError, naming it, and is left as it was."""
        self.path = Path(path) if path is not None else default_path()
        if self.path.is_dir():
            raise TuningDBError(f"{self.path} is a folder, not a tuning DB file; {_HINT}")
        if not create:
            if not self.path.exists():
                raise TuningDBError(f"{self.path}: no tuning DB there; {_HINT}")
            self.conn = self._connect_read_only()
            self._check_is_gemmc_db(empty_ok=False)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TuningDBError(f"cannot create the folder of the tuning DB {self.path}: {e.strerror or e}; "
                                f"{_HINT}") from None
        self.conn = self._connect(str(self.path))
        self._check_is_gemmc_db(empty_ok=True)     # before anything is written: a foreign file stays untouched
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")   # WAL + NORMAL: a killed process loses nothing committed
            with self.conn:
                self.conn.executescript(_SCHEMA)
                self._migrate()
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise TuningDBError(f"cannot write the tuning DB {self.path}: {e}") from None

    def _connect(self, target: str, uri: bool = False) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(target, timeout=60, uri=uri)
        except sqlite3.Error as e:
            raise TuningDBError(f"cannot open the tuning DB {self.path}: {e}; {_HINT}") from None
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
            raise TuningDBError(f"{self.path} cannot be read as a tuning DB ({e}); {_HINT}") from None
        if not tables and empty_ok:
            return
        why = None
        if not tables:
            why = "it is empty (no tables)"
        elif not _TABLES <= tables:
            why = (f"it has no {' or '.join(sorted(_TABLES - tables))} table "
                   f"(its tables: {', '.join(sorted(tables)[:6])})")
        elif not _KEY_COLUMNS <= columns:
            why = f"its measurements table lacks {', '.join(sorted(_KEY_COLUMNS - columns))}"
        if why:
            self.conn.close()
            raise TuningDBError(f"{self.path} is not a gemmc tuning DB: {why}; {_HINT}")

    def _migrate(self) -> None:
        """Bring a schema-1, -2 or -3 file up to date (its rows are kept as they are, interleaved; its policy
        keeps an unknown GPU, and its name "default"); a newer file is left alone."""
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
        if "timing" not in columns:
            self.conn.execute("ALTER TABLE measurements ADD COLUMN timing TEXT")
        if "gpu_name" not in {r[1] for r in self.conn.execute("PRAGMA table_info(policies)")}:
            self.conn.execute("ALTER TABLE policies ADD COLUMN gpu_name TEXT")
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) >= SCHEMA_VERSION:
            return
        self.conn.execute("DROP VIEW IF EXISTS best_per_problem")   # schema 1's min-time verdict: misleading
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    @classmethod
    def open_existing(cls, path=None) -> Optional["TuningDB"]:
        """The DB, read-only, if the file exists; None if it does not (lookups never create one). A file
        that is not a gemmc tuning DB raises TuningDBError."""
        p = Path(path) if path is not None else default_path()
        return cls(p, create=False) if p.exists() else None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- writing ------------------------------------------------------------------------------
    def record(self, spec: GemmSpec, arch: str, m: Measurement, gpu_name: str, strategy: str = "",
               created_at: Optional[float] = None) -> int:
        """Store one measurement in its own transaction."""
        row = {"problem": problem_key(spec, arch), **problem_fields(spec, arch), "gpu_name": gpu_name,
               "schedule": schedule_key(m.schedule), "time_us": m.time_us if m.ok else None,
               "cublas_us": m.cublas_us, "compile_s": m.compile_s,
               "error": m.error if m.error is not None or m.ok else "no time",
               "strategy": strategy, "gemmc_version": __version__,
               "created_at": created_at if created_at is not None else time.time(), "timing": m.timing}
        with self.conn:
            cur = self.conn.execute(f"INSERT INTO measurements ({', '.join(_COLUMNS)}) VALUES "
                                    f"({', '.join('?' * len(_COLUMNS))})", [row[c] for c in _COLUMNS])
        return cur.lastrowid

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
            out[s] = Measurement(s, r["time_us"], r["error"], r["cublas_us"], r["compile_s"], _timing(r))
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
            out.append(BestEntry({c: rows[0][c] for c in _FIELDS}, gpu, top.schedule, top.time_us, top.cublas_us,
                                 sum(map(_succeeded, rows)), top.n_rows, top.version, top.own_clock))
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
            for schedule, first in _disqualifying(rows).items():
                at = [r for r in rows if _parse(r["schedule"], parsed) == schedule
                      and version_key(r["gemmc_version"]) == version_key(first["gemmc_version"])]
                out.append(Disqualified({c: rows[0][c] for c in _FIELDS}, gpu, schedule, first["error"],
                                        first["gemmc_version"], sum(failed_check(r["error"]) for r in at),
                                        sum(map(_succeeded, at))))
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
            out = _disqualifying(rows)
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

    # ---- policy weights: one per GPU (module docstring) -------------------------------------------
    def save_policy(self, policy, name: Optional[str] = None) -> None:
        """Store `policy` with the GPU it was trained for (its `gpu_name`; None: unknown), under `name`; by
        default the GPU's name ("default" when unknown: `policy_name`), replacing only that GPU's policy."""
        gpu = getattr(policy, "gpu_name", None)
        with self.conn:
            self.conn.execute(_INSERT_POLICY, (name if name is not None else policy_name(gpu), policy.to_bytes(),
                                               json.dumps(policy.feature_spec.to_dict()), policy.trained_shapes,
                                               __version__, time.time(), gpu))

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
        pol.gpu_name = _policy_gpu(r)
        return pol

    def gpus(self) -> list[str]:
        """The GPUs the DB holds measurements of, sorted."""
        return [r[0] for r in self.conn.execute("SELECT DISTINCT gpu_name FROM measurements ORDER BY gpu_name")]

    # ---- moving results between machines ----------------------------------------------------------
    def export(self, path) -> dict:
        """Every measurement and policy to a gzipped JSON file (never over this DB's own file)."""
        dest = check_output_file(path, str(path), "tuned.json.gz", error=TuningDBError)
        if dest.exists() and dest.samefile(self.path):
            raise TuningDBError(f"{dest} is the tuning DB being exported; name another file, e.g. tuned.json.gz")
        pols = [{"name": r["name"], "blob": base64.b64encode(bytes(r["blob"])).decode(),
                 "feature_spec": r["feature_spec"], "trained_shapes": r["trained_shapes"],
                 "gemmc_version": r["gemmc_version"], "created_at": r["created_at"], "gpu_name": _policy_gpu(r)}
                for r in self.conn.execute("SELECT * FROM policies")]
        # .get: a file of an older schema opened read-only may lack a column (timing)
        rows = [{c: r.get(c) for c in _COLUMNS} for r in self.rows()]
        make_parent(dest, str(path), error=TuningDBError)
        try:
            with gzip.open(dest, "wt") as f:
                json.dump({"format": "gemmc-tuning", "schema_version": SCHEMA_VERSION, "measurements": rows,
                           "policies": pols}, f)
        except OSError as e:
            raise TuningDBError(f"cannot write {dest}: {e.strerror or e}") from None
        return {"measurements": len(rows), "policies": len(pols)}

    @staticmethod
    def read_export(path) -> dict:
        """The contents of a `gemmc-search export` file, checked; TuningDBError says what else it is."""
        src = Path(path)
        what = "give the .json.gz file that `gemmc-search export` writes"
        try:
            with gzip.open(src, "rt") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise TuningDBError(f"{src} does not exist; {what}") from None
        except gzip.BadGzipFile:
            raise TuningDBError(f"{src} is not gzipped, so not a gemmc-search export; {what}") from None
        except json.JSONDecodeError as e:
            hint = (" (a bench dataset, one JSON record per line? `gemmc-search simulate --data` replays those)"
                    if e.msg == "Extra data" else "")
            raise TuningDBError(f"{src} is not one JSON document{hint}: {e}; {what}") from None
        except (UnicodeDecodeError, EOFError) as e:
            raise TuningDBError(f"{src} is damaged or not JSON ({e}); {what}") from None
        except OSError as e:
            raise TuningDBError(f"cannot read {src}: {e.strerror or e}") from None
        if not isinstance(data, dict) or data.get("format") != "gemmc-tuning":
            raise TuningDBError(f"{src} is not a gemmc-search export (missing format='gemmc-tuning'); {what}")
        rows, pols = data.get("measurements"), data.get("policies", [])
        if not isinstance(rows, list) or not isinstance(pols, list):
            raise TuningDBError(f"{src}: a gemmc-search export holds lists of 'measurements' and 'policies'; this "
                                f"one does not (a damaged file?); export it again")
        # the columns a row cannot be stored without, and time_us (it identifies a row already merged)
        need = ("problem", "m", "n", "k", "dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout",
                "epilogue_class", "arch", "gpu_name", "schedule", "time_us", "gemmc_version", "created_at")
        need_pol = ("name", "blob", "feature_spec", "trained_shapes", "gemmc_version", "created_at")
        for what_row, items, keys in (("measurement", rows, need), ("policy", pols, need_pol)):
            for i, r in enumerate(items):
                missing = [c for c in keys if c not in r] if isinstance(r, dict) else None
                if missing is None or missing:
                    lack = "is not a JSON object" if missing is None else f"lacks {', '.join(missing)}"
                    raise TuningDBError(f"{src}: {what_row} {i} {lack} (a damaged file, or not gemmc's?); "
                                        f"export it again")
        for i, p in enumerate(pols):      # gpu_name: absent from exports of schema 3 and older (unknown GPU)
            if not isinstance(p.get("gpu_name"), (str, type(None))):
                raise TuningDBError(f"{src}: policy {i} has a gpu_name that is not a GPU's name "
                                    f"({p['gpu_name']!r}; a damaged file?); export it again")
        return data

    def import_(self, path) -> dict:
        """Merge an export: measurements already present (same problem, GPU, schedule, time, timestamp)
        are skipped; a policy replaces the local one of its name only if it is newer, so each GPU's policy
        (and the one of unknown GPU) is merged on its own."""
        return self.merge_export(self.read_export(path))

    def merge_export(self, data: dict) -> dict:
        """`import_` of contents `read_export` checked."""
        have = {(r["problem"], r["gpu_name"], r["schedule"], r["created_at"], r["time_us"]) for r in self.rows()}
        added = 0
        with self.conn:
            for r in data["measurements"]:
                if (r["problem"], r["gpu_name"], r["schedule"], r["created_at"], r["time_us"]) in have:
                    continue
                self.conn.execute(f"INSERT INTO measurements ({', '.join(_COLUMNS)}) VALUES "
                                  f"({', '.join('?' * len(_COLUMNS))})", [r.get(c) for c in _COLUMNS])
                added += 1
            pols = 0
            for p in data.get("policies", []):
                gpu = p.get("gpu_name")         # absent from exports of schema 3 and older: unknown
                name = p["name"]
                cur = self.conn.execute("SELECT created_at FROM policies WHERE name = ?", (name,)).fetchone()
                if cur is None or p["created_at"] > cur[0]:
                    self.conn.execute(_INSERT_POLICY, (name, base64.b64decode(p["blob"]), p["feature_spec"],
                                                       p["trained_shapes"], p["gemmc_version"], p["created_at"],
                                                       gpu))
                    pols += 1
        return {"measurements": added, "policies": pols}
