"""`schedule="auto"`: which schedule a problem runs with, and whether cuBLAS should run it instead.

The order (the first step that answers decides):
1. the tuning DB's best for this exact problem (gemmc.choose.db_steps);
2. the table shipped for this GPU (gemmc.choose.pretuned), at this exact shape;
3. a tuned neighbour (same dtypes, layouts, epilogue, N and K; M within 2x: gemmc.choose.neighbours), else the
   trained policy (the DB's policy for this GPU, else its policy of unknown GPU, never another GPU's:
   TuningDBReader.policy_for), else a farther tuned shape;
4. the shipped table's neighbour (same N and K, M within 2x);
5. the analytic heuristic (gemmc.choose.heuristic).
A pick this gemmc cannot run gives way to the next: at step 1 the DB's next best, where the pick is invalid
for the problem or its figure rests on an older gemmc's rows and this gemmc failed to build or run it; at
steps 3 and 4 the next neighbour, where the pick is invalid here, or (step 3) failed to build or run on the
neighbour or on this problem, or failed its check on this problem. `detail` names what was passed over.

A plain fp8 GEMM (per-tensor or per-row scales, no epilogue op: GemmSpec.plain_scaled) goes to torch._scaled_mm
where the DB measured it faster on this exact problem (the fp8 rows' "cuBLAS" time is torch._scaled_mm's); no
shipped table or neighbour holds fp8 measurements yet.
A plain GEMM goes to torch.matmul when cuBLAS was measured faster on this exact problem (the DB's or the
table's), or on the table's neighbour, or (at the heuristic step) at any of the 5 nearest shapes the table
measured (its checks of the heuristic's own picks where any lies near, else its tuned entries; for another
storage layout, where cuBLAS won the same (M, N, K) as A [M, K] @ B [N, K].T there); a fused
epilogue never does (cuBLAS would need extra passes to match it). "Measured faster" is the paired verdict:
cuBLAS and gemmc timed in the same runs (gemmc.choose.tuning_db_verdict); for the DB, the best schedule's
speed-up over cuBLAS is the geometric mean over its paired rows, or from three such rows on the median
row's (one slow cuBLAS run cannot carry it); torch.matmul runs exactly when that speed-up is below 1.

`resolve_auto` reads the DB and never writes it: it is a function of (spec, arch, GPU, db contents, shipped
tables); `pretuned=False` (or GEMMC_PRETUNED=0) leaves the tables out. The DB's rows and the tables count
only on the GPU they were measured on: the GPU the calls will run on (GEMMC_GPU, else the visible one); with
neither (an ahead-of-time build), any GPU's rows and the arch's table. A DB file that cannot be read
(damaged, not gemmc's, a folder) is skipped with a warning, once per file, as is a GEMMC_GPU that names no
shipped table: `auto` never fails a compile over either.
"""
from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import Optional

from ..spec import GemmSpec
from ..types import as_arch
from .db_steps import db_decision, db_exact, neighbour_step, open_db, skip_db, with_passed_neighbours
from .decision import BLOCKWISE_KEEPS_THE_KERNEL, Decision, concrete
from .gpu import target_gpu
from .grouped import grouped_decision
from .shipped_steps import heuristic_decision, pretuned_decision, shipped_table


def resolve_auto(spec: GemmSpec, arch: str = "sm_90a", m: Optional[int] = None, db=None,
                 gpu_name: Optional[str] = None, pretuned: bool = True) -> Decision:
    """The schedule for `spec` (M may be symbolic: pass the runtime `m`); see the module docstring.

    `db`: a TuningDB(Reader), a path, or None for the default location (a missing file means no tuning; one
    that cannot be read is skipped with a warning). `gpu_name`: the GPU the calls will run on (default
    GEMMC_GPU, else the visible GPU's); the DB's rows of other GPUs are left out, as the shipped tables
    of other GPUs are: a schedule and a cuBLAS verdict measured on one GPU do not carry to another. With
    no GPU named or visible (an ahead-of-time build), any GPU's rows count."""
    arch = as_arch(arch)
    if spec.grouped:        # keyed by rows per group, never by a plain problem's entries (choose/grouped.py)
        return grouped_decision(spec, arch, m, db=db, gpu_name=gpu_name)
    conc = concrete(spec, m)
    tdb, owned = open_db(db) if conc is not None else (None, False)
    gpu = target_gpu(gpu_name) if conc is not None else gpu_name
    try:
        return _resolve(spec, conc, arch, tdb, gpu, gpu_name is not None, pretuned)
    except sqlite3.DatabaseError as e:      # damaged past the pages the open read, or locked for a minute
        skip_db(tdb.path, f"reading {tdb.path} failed ({e}); check it with `sqlite3 FILE 'PRAGMA "
                          f"integrity_check'`, or point GEMMC_TUNING_DB at another")
        return _resolve(spec, conc, arch, None, gpu, gpu_name is not None, pretuned)
    finally:
        if owned and tdb is not None:
            tdb.close()


def _resolve(spec: GemmSpec, conc: Optional[GemmSpec], arch: str, tdb, gpu_name: Optional[str], named: bool,
             pretuned: bool) -> Decision:
    exact, passed_over = db_exact(tdb, conc, arch, gpu_name) if tdb is not None else (None, [])
    d = _decide(spec, conc, arch, tdb, exact, shipped_table(conc, arch, gpu_name, named, pretuned), gpu_name)
    if passed_over:     # the DB's own picks that this gemmc cannot run: say why they did not decide
        d = replace(d, detail="; ".join(x for x in (d.detail, "passed over the DB's " + ", ".join(passed_over)) if x))
    return d


def _decide(spec: GemmSpec, conc: Optional[GemmSpec], arch: str, tdb, exact, table,
            gpu_name: Optional[str]) -> Decision:
    """The documented order (module docstring), given the DB's usable exact entry and the shipped table."""
    if exact is not None:                                               # 1. the DB, this exact problem
        blockwise = conc.scaling is not None and conc.scaling.mode == "block" and not conc.epilogue
        return db_decision(exact, plain=not conc.has_epilogue or conc.plain_scaled,
                           **({"keeps": BLOCKWISE_KEEPS_THE_KERNEL} if blockwise else {}))
    shipped = pretuned_decision(table, conc)
    if shipped is not None and shipped[1]:                              # 2. the shipped table, this shape
        return shipped[0]
    passed: list = []       # the neighbours' picks this gemmc cannot run, nearest first
    if tdb is not None:                                                 # 3. a tuned neighbour, or the policy
        d = neighbour_step(tdb, conc, arch, gpu_name, passed)
        if d is not None:
            return with_passed_neighbours(d, passed)
    if shipped is not None:                                             # 4. the shipped table's neighbour
        return with_passed_neighbours(shipped[0], passed)
    return with_passed_neighbours(heuristic_decision(conc, spec, arch, table), passed)   # 5. the heuristic
