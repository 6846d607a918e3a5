"""The tuning DB's file: its tables and columns, where it lives, and how a problem is keyed in it.

Both sides share this: gemmc.search.db creates and writes the file, gemmc.choose.tuning_db reads it (and checks
that a file is gemmc's before reading it). Location: $GEMMC_TUNING_DB, else
<$GEMMC_CACHE_DIR or ~/.cache/gemmc>/tuning.sqlite.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from dataclasses import replace

from ..errors import GemmcError
from ..spec import GemmSpec
from ..types import as_arch
from .group_keys import rows_bucket, rows_per_group

SCHEMA_VERSION = 5      # 2: the min-time view best_per_problem is gone (the verdict is paired, in Python);
                        # 3: a measurement's `timing` (own-clock rows of long calls outrank interleaved ones);
                        # 4: the GPU a policy was trained for (policies.gpu_name; NULL: unknown, as in older files);
                        # 5: the profiles table (ncu's L2 hit rate, DRAM bytes, SM clock, tensor pipe per schedule)
CONFIRM = "confirm"     # the strategy of the rows `gemmc-search tune` re-measures after a search
ALSO = "also"           # the strategy of the rows `gemmc-search tune --also` measures besides the search

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS profiles (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem TEXT NOT NULL, gpu_name TEXT NOT NULL,
    schedule TEXT NOT NULL,           -- canonical JSON of the Schedule; '' for cuBLAS (torch.matmul)
    l2_hit_rate REAL, dram_read_bytes REAL, dram_write_bytes REAL, sm_clock_mhz REAL, duration_us REAL,
    tensor_pipe_pct REAL, kernels INTEGER,
    tool TEXT NOT NULL,               -- what measured it: ncu and its settings
    gemmc_version TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS profiles_problem ON profiles (problem, gpu_name);
CREATE TABLE IF NOT EXISTS policies (
    name TEXT PRIMARY KEY, blob BLOB NOT NULL, feature_spec TEXT NOT NULL,
    trained_shapes INTEGER, gemmc_version TEXT NOT NULL, created_at REAL NOT NULL,
    gpu_name TEXT                     -- the GPU whose rows trained it; NULL: unknown (several GPUs', or an older gemmc)
);
"""
COLUMNS = ("problem", "m", "n", "k", "batch", "dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout",
           "epilogue_class", "arch", "gpu_name", "schedule", "time_us", "cublas_us", "compile_s", "error",
           "strategy", "gemmc_version", "created_at", "timing")
PROFILE_COLUMNS = ("problem", "gpu_name", "schedule", "l2_hit_rate", "dram_read_bytes", "dram_write_bytes",
                   "sm_clock_mhz", "duration_us", "tensor_pipe_pct", "kernels", "tool", "gemmc_version", "created_at")
CUBLAS_SCHEDULE = ""        # profiles.schedule of a cuBLAS (torch.matmul) row
DEFAULT_POLICY = "default"  # the name of a policy of unknown GPU; a GPU's policy is stored under the GPU's name
POLICY_COLUMNS = ("name", "blob", "feature_spec", "trained_shapes", "gemmc_version", "created_at", "gpu_name")

# a file is gemmc's tuning DB when it holds these tables, and the measurements table these columns
TABLES = {"measurements", "policies"}
KEY_COLUMNS = {"problem", "gpu_name", "schedule", "time_us", "cublas_us", "gemmc_version"}
HINT = "point gemmc-search --db or GEMMC_TUNING_DB at a gemmc tuning DB (`gemmc-search tune` writes one)"

# the columns that name the problem of a row (BestEntry.fields)
FIELDS = ("m", "n", "k", "batch", "dtype", "out_dtype", "acc_dtype", "a_layout", "b_layout", "epilogue_class",
          "arch")


class TuningDBError(GemmcError):
    """A tuning DB (or an export of one) is missing, unreadable, or not gemmc's."""


def default_path() -> Path:
    if os.environ.get("GEMMC_TUNING_DB"):
        return Path(os.environ["GEMMC_TUNING_DB"]).expanduser()
    cache = os.environ.get("GEMMC_CACHE_DIR") or os.path.join("~", ".cache", "gemmc")
    return Path(cache).expanduser() / "tuning.sqlite"


def epilogue_class(spec: GemmSpec) -> str:
    """'plain' for a bare GEMM (cuBLAS computes the same thing), else the ops plus a digest of the DAG. A grouped
    GEMM's is "grouped_<layout>/" and that, so no lookup of a plain problem's ever meets it. An fp8 GEMM's names
    its scaling and, where it differs from A's, B's dtype ('scaled_row_f8e5m2+...'): its problem differs from a
    bf16 one's, and from another scaling's (a bf16 problem's class is as it always was)."""
    if spec.grouped:
        return f"grouped_{spec.group_layout}/" + epilogue_class(replace(spec, groups=None, group_layout=None))
    if not spec.has_epilogue:
        return "plain"
    scaled = []
    if spec.scaling is not None:
        scaled = [f"scaled_{spec.scaling.mode}" + (f"_{spec.b_dtype}" if spec.b_dtype != spec.dtype else "")]
    ops = "+".join(([f"gate_{spec.gate}"] if spec.gate else []) + scaled + [op.op for op in spec.epilogue]) or "cast"
    body = repr((spec.inputs, spec.epilogue, str(spec.out_dtype)) + ((spec.gate,) if spec.gate else ())
                + ((spec.scaling.mode, str(spec.b_dtype)) if spec.scaling is not None else ()))
    return f"{ops}:{hashlib.blake2b(body.encode(), digest_size=4).hexdigest()}"


def class_scaling(cls: str) -> tuple[str, str | None] | None:
    """(mode, B's dtype where it differs from A's, else None) of an fp8 problem's epilogue class (as
    epilogue_class writes it: 'scaled_<mode>[_<B's dtype>]' among its ops); None for any other class."""
    scaled = [op for op in cls.split(":")[0].split("+") if op.startswith("scaled_")]
    if not scaled:
        return None
    mode, _, b_dtype = scaled[0][len("scaled_"):].partition("_")
    return mode, b_dtype or None


def problem_fields(spec: GemmSpec, arch: str) -> dict:
    """The columns of a problem's rows. A grouped GEMM's (gemmc.choose.group_keys): m is its rows-per-group
    bucket and batch its group count E, so every M of a bucket shares the entry."""
    if not all(isinstance(d, int) for d in (spec.m, spec.n, spec.k)):
        raise ValueError(f"the tuning DB stores concrete problems; got m={spec.m!r} n={spec.n!r} k={spec.k!r}")
    if spec.grouped:
        if not isinstance(spec.groups, int):
            raise ValueError(f"the tuning DB stores grouped problems of a known group count; got {spec.groups!r}")
        plain = replace(spec, m=rows_bucket(rows_per_group(spec)), groups=None, group_layout=None)
        return {**problem_fields(plain, arch), "batch": spec.groups, "epilogue_class": epilogue_class(spec)}
    return {"m": spec.m, "n": spec.n, "k": spec.k, "batch": spec.batch if isinstance(spec.batch, int) else None,
            "dtype": str(spec.dtype), "out_dtype": str(spec.out_dtype), "acc_dtype": str(spec.acc_dtype),
            "a_layout": spec.a_layout, "b_layout": spec.b_layout, "epilogue_class": epilogue_class(spec),
            "arch": as_arch(arch)}


def problem_key(spec: GemmSpec, arch: str) -> str:
    return json.dumps(problem_fields(spec, arch), sort_keys=True, separators=(",", ":"))


def policy_name(gpu_name: Optional[str]) -> str:
    """The name a policy trained for `gpu_name` is stored under: the GPU's name, or "default" when unknown."""
    return gpu_name if gpu_name is not None else DEFAULT_POLICY

