"""The tuning database, written: every measurement ever made, and the trained policies (one per GPU).

SQLite in WAL mode; each measurement is its own transaction, so a run killed at any moment loses
at most the measurement in flight, and `TuningDB.prior` lets the next run skip what is stored.
`TuningDB` is gemmc.choose.tuning_db's reader with the writes: creating the file and bringing its schema up to
date, recording measurements, saving policies, and moving results between machines (export, import). What
`auto` reads, and how the verdict ranks schedules, is gemmc.choose's.
"""
from __future__ import annotations

import base64
import gzip
import json
import sqlite3
import time
from pathlib import Path
from typing import Optional

from .. import __version__
from ..choose.measurement import L2Profile, Measurement, schedule_key
from ..choose.tuning_db import TuningDBReader, policy_gpu
from ..choose.tuning_db_schema import (COLUMNS, CUBLAS_SCHEDULE, HINT, POLICY_COLUMNS, PROFILE_COLUMNS, SCHEMA,
                                       SCHEMA_VERSION, TuningDBError, default_path, policy_name, problem_fields,
                                       problem_key)
from ..output_file import check_output_file, make_parent
from ..schedule import Schedule
from ..spec import GemmSpec

INSERT_POLICY = (f"INSERT OR REPLACE INTO policies ({', '.join(POLICY_COLUMNS)}) VALUES "
                 f"({', '.join('?' * len(POLICY_COLUMNS))})")


class TuningDB(TuningDBReader):
    def __init__(self, path=None, create: bool = True):
        """create=True: open for writing, making the file (and its folder) when missing and bringing its
        schema up to date. create=False: open an existing DB read-only, as TuningDBReader does (for lookups,
        reports and exports). Either way a file that is not a gemmc tuning DB raises TuningDBError, naming
        it, and is left as it was."""
        if not create:
            super().__init__(path)
            return
        self.path = Path(path) if path is not None else default_path()
        if self.path.is_dir():
            raise TuningDBError(f"{self.path} is a folder, not a tuning DB file; {HINT}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TuningDBError(f"cannot create the folder of the tuning DB {self.path}: {e.strerror or e}; "
                                f"{HINT}") from None
        self.conn = self._connect(str(self.path))
        self._check_is_gemmc_db(empty_ok=True)     # before anything is written: a foreign file stays untouched
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")   # WAL + NORMAL: a killed process loses nothing committed
            with self.conn:
                self.conn.executescript(SCHEMA)
                self._migrate()
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise TuningDBError(f"cannot write the tuning DB {self.path}: {e}") from None

    @classmethod
    def open_existing(cls, path=None) -> Optional["TuningDB"]:
        """TuningDBReader.open_existing's DB as a TuningDB, still read-only (it can export, not record)."""
        p = Path(path) if path is not None else default_path()
        return cls(p, create=False) if p.exists() else None

    def _migrate(self) -> None:
        """Bring a schema-1 to -4 file up to date (its rows are kept as they are, interleaved; its policy
        keeps an unknown GPU, and its name "default"; the profiles table, empty, came with SCHEMA); a newer file
        is left alone."""
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
            cur = self.conn.execute(f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES "
                                    f"({', '.join('?' * len(COLUMNS))})", [row[c] for c in COLUMNS])
        return cur.lastrowid

    def record_profile(self, spec: GemmSpec, arch: str, gpu_name: str, schedule: Optional[Schedule],
                       profile: L2Profile, tool: str, created_at: Optional[float] = None) -> int:
        """Store ncu's profile of `schedule` (None: cuBLAS) on the problem, in its own transaction."""
        row = {"problem": problem_key(spec, arch), "gpu_name": gpu_name,
               "schedule": CUBLAS_SCHEDULE if schedule is None else schedule_key(schedule), **profile.to_dict(),
               "tool": tool, "gemmc_version": __version__,
               "created_at": created_at if created_at is not None else time.time()}
        with self.conn:
            cur = self.conn.execute(f"INSERT INTO profiles ({', '.join(PROFILE_COLUMNS)}) VALUES "
                                    f"({', '.join('?' * len(PROFILE_COLUMNS))})", [row[c] for c in PROFILE_COLUMNS])
        return cur.lastrowid

    # ---- policy weights: one per GPU (gemmc.choose.tuning_db) ------------------------------------
    def save_policy(self, policy, name: Optional[str] = None) -> None:
        """Store `policy` with the GPU it was trained for (its `gpu_name`; None: unknown), under `name`; by
        default the GPU's name ("default" when unknown: `policy_name`), replacing only that GPU's policy."""
        gpu = getattr(policy, "gpu_name", None)
        with self.conn:
            self.conn.execute(INSERT_POLICY, (name if name is not None else policy_name(gpu), policy.to_bytes(),
                                              json.dumps(policy.feature_spec.to_dict()), policy.trained_shapes,
                                              __version__, time.time(), gpu))

    # ---- moving results between machines ----------------------------------------------------------
    def export(self, path) -> dict:
        """Every measurement and policy to a gzipped JSON file (never over this DB's own file)."""
        dest = check_output_file(path, str(path), "tuned.json.gz", error=TuningDBError)
        if dest.exists() and dest.samefile(self.path):
            raise TuningDBError(f"{dest} is the tuning DB being exported; name another file, e.g. tuned.json.gz")
        pols = [{"name": r["name"], "blob": base64.b64encode(bytes(r["blob"])).decode(),
                 "feature_spec": r["feature_spec"], "trained_shapes": r["trained_shapes"],
                 "gemmc_version": r["gemmc_version"], "created_at": r["created_at"], "gpu_name": policy_gpu(r)}
                for r in self.conn.execute("SELECT * FROM policies")]
        # .get: a file of an older schema opened read-only may lack a column (timing) or the profiles table
        rows = [{c: r.get(c) for c in COLUMNS} for r in self.rows()]
        profiles = [{c: r.get(c) for c in PROFILE_COLUMNS} for r in self.profile_rows()]
        make_parent(dest, str(path), error=TuningDBError)
        try:
            with gzip.open(dest, "wt") as f:
                json.dump({"format": "gemmc-tuning", "schema_version": SCHEMA_VERSION, "measurements": rows,
                           "policies": pols, "profiles": profiles}, f)
        except OSError as e:
            raise TuningDBError(f"cannot write {dest}: {e.strerror or e}") from None
        return {"measurements": len(rows), "policies": len(pols), "profiles": len(profiles)}

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
        rows, pols, profs = data.get("measurements"), data.get("policies", []), data.get("profiles", [])
        if not isinstance(rows, list) or not isinstance(pols, list) or not isinstance(profs, list):
            raise TuningDBError(f"{src}: a gemmc-search export holds lists of 'measurements' and 'policies'; this "
                                f"one does not (a damaged file?); export it again")
        # the columns a row cannot be stored without, and time_us (it identifies a row already merged)
        need = ("problem", "m", "n", "k", "dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout",
                "epilogue_class", "arch", "gpu_name", "schedule", "time_us", "gemmc_version", "created_at")
        need_pol = ("name", "blob", "feature_spec", "trained_shapes", "gemmc_version", "created_at")
        need_prof = ("problem", "gpu_name", "schedule", "tool", "gemmc_version", "created_at")
        for what_row, items, keys in (("measurement", rows, need), ("policy", pols, need_pol),
                                      ("profile", profs, need_prof)):
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
        are skipped, and profiles likewise (same problem, GPU, schedule, timestamp); a policy replaces the local
        one of its name only if it is newer, so each GPU's policy (and the one of unknown GPU) is merged on its
        own."""
        return self.merge_export(self.read_export(path))

    def merge_export(self, data: dict) -> dict:
        """`import_` of contents `read_export` checked."""
        have = {(r["problem"], r["gpu_name"], r["schedule"], r["created_at"], r["time_us"]) for r in self.rows()}
        added = 0
        with self.conn:
            for r in data["measurements"]:
                if (r["problem"], r["gpu_name"], r["schedule"], r["created_at"], r["time_us"]) in have:
                    continue
                self.conn.execute(f"INSERT INTO measurements ({', '.join(COLUMNS)}) VALUES "
                                  f"({', '.join('?' * len(COLUMNS))})", [r.get(c) for c in COLUMNS])
                added += 1
            pols = 0
            for p in data.get("policies", []):
                gpu = p.get("gpu_name")         # absent from exports of schema 3 and older: unknown
                name = p["name"]
                cur = self.conn.execute("SELECT created_at FROM policies WHERE name = ?", (name,)).fetchone()
                if cur is None or p["created_at"] > cur[0]:
                    self.conn.execute(INSERT_POLICY, (name, base64.b64decode(p["blob"]), p["feature_spec"],
                                                      p["trained_shapes"], p["gemmc_version"], p["created_at"],
                                                      gpu))
                    pols += 1
            have = {(r["problem"], r["gpu_name"], r["schedule"], r["created_at"]) for r in self.profile_rows()}
            profs = 0
            for r in data.get("profiles", []):      # absent from exports of schema 4 and older
                if (r["problem"], r["gpu_name"], r["schedule"], r["created_at"]) in have:
                    continue
                self.conn.execute(f"INSERT INTO profiles ({', '.join(PROFILE_COLUMNS)}) VALUES "
                                  f"({', '.join('?' * len(PROFILE_COLUMNS))})", [r.get(c) for c in PROFILE_COLUMNS])
                profs += 1
        return {"measurements": added, "policies": pols, "profiles": profs}
