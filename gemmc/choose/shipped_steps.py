"""The steps of `schedule="auto"` (gemmc.choose.auto) that read what ships with gemmc: 2. the table shipped for this
GPU at this exact shape; 4. the table's neighbour (gemmc.choose.neighbours); 5. the analytic heuristic, with the
table's cuBLAS verdict at the nearest shapes it measured (for another storage layout, a cuBLAS win at the same
(M, N, K) measured as A [M, K] @ B [N, K].T).
"""
from __future__ import annotations

import difflib
import os
from dataclasses import replace
from typing import Optional

from ..schedule import Schedule, default_schedule, enumerate_schedules, is_valid
from ..spec import GemmSpec
from .decision import EPILOGUE_KEEPS_THE_KERNEL, FP8_HEURISTIC_NOTE, Decision, concrete
from .heuristic import choose_schedule
from .notices import warn_once
from .pretuned import VERDICT_MAX_LOG2, VERDICT_NEIGHBOURS, load_tables, table_for


def shipped_table(conc: Optional[GemmSpec], arch: str, gpu: Optional[str], named: bool, enabled: bool):
    """The table shipped for `gpu` (gemmc.choose.pretuned), once per resolve; None for a symbolic problem.
    `named`: the caller passed the GPU's name (then GEMMC_GPU played no part)."""
    if not enabled or conc is None:
        return None
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
    known = sorted({t.gpu for t in load_tables()})
    if name in known:
        return      # a known GPU, with no table for this arch: nothing was misspelled
    close = _closest_name(name, known)
    # a real name of another GPU resembles a known one too ('NVIDIA H100 ...', 'NVIDIA H800'): the message
    # must not send its user to another GPU's table
    warn_once(("GEMMC_GPU", name),
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


def pretuned_decision(table, spec: GemmSpec) -> Optional[tuple[Decision, bool]]:
    """Steps 2 and 4: (decision, exact) from the table's entry for this shape, else from its nearest neighbour
    whose schedule is valid for `spec`; None when neither is there.
    A neighbour passes on its cuBLAS verdict too: the table is coarse, and a shape between two measured
    cuBLAS wins is far likelier a cuBLAS win than not."""
    hit = table.lookup(spec, lambda e: is_valid(e.schedule, spec)) if table is not None else None
    if hit is None:
        return None
    e, exact = hit
    times = f"{e.time_us:.2f} us vs cuBLAS {e.cublas_us:.2f} us"
    detail = (f"{times} (shipped table, {table.gpu})" if exact
              else f"shipped table, {table.gpu}: measured {e.m}x{e.n}x{e.k}, {times}")
    if spec.has_epilogue:       # the table timed the plain GEMM
        detail += f"; {EPILOGUE_KEEPS_THE_KERNEL if e.cublas_faster else 'measured without the epilogue'}"
    return Decision(e.schedule, "pretuned", use_cublas=e.cublas_faster and not spec.has_epilogue,
                    detail=detail), exact


def heuristic_schedule(spec: GemmSpec, arch: str) -> Schedule:
    """The analytic heuristic's choice (gemmc.choose.heuristic), else the first feasible default."""
    s = choose_schedule(spec, arch=arch)
    if isinstance(s, Schedule) and (not concrete(spec, None) or is_valid(s, spec)):
        return s
    s = default_schedule(arch)
    if concrete(spec, None) is None or is_valid(s, spec):
        return s
    feasible = enumerate_schedules(spec, arch)
    return feasible[0] if feasible else s


# which of the table's measurements gave a cuBLAS verdict (PretunedTable.cublas_verdict's second value)
_READ = {"checks": "the heuristic's picks", "entries": "tuned schedules"}


def heuristic_decision(conc: Optional[GemmSpec], spec: GemmSpec, arch: str, table) -> Decision:
    """Step 5: the heuristic's schedule; for a plain GEMM on a GPU with a shipped table, torch.matmul when cuBLAS
    won at any of the nearest measured shapes (gemmc.choose.pretuned.PretunedTable.predicted_cublas_faster).
    The detail says which measurements were read, or why none applied."""
    schedule = heuristic_schedule(conc or spec, arch)
    why_none = _why_no_verdict(conc, spec, table)
    if why_none is not None:
        borrowed = _other_layout_cublas_win(conc, table)
        if borrowed is not None:
            return Decision(schedule, "heuristic", use_cublas=True, detail=borrowed)
        return Decision(schedule, "heuristic", detail=why_none)
    cublas_faster, read = table.cublas_verdict(conc)
    if cublas_faster is None:
        return Decision(schedule, "heuristic", detail=f"no shape measured on {table.gpu} within "
                                                      f"{2 ** VERDICT_MAX_LOG2:g}x")
    what = _READ[read]
    won = (f"cuBLAS won at one or more of the {VERDICT_NEIGHBOURS} nearest shapes measured" if cublas_faster
           else f"gemmc won at each of the nearest shapes measured (up to {VERDICT_NEIGHBOURS}, within "
                f"{2 ** VERDICT_MAX_LOG2:g}x)")
    return Decision(schedule, "heuristic", use_cublas=cublas_faster, detail=f"{won} on {table.gpu} ({what})")


def _why_no_verdict(conc: Optional[GemmSpec], spec: GemmSpec, table) -> Optional[str]:
    """Why the shipped table cannot give this problem a cuBLAS verdict; None when it can."""
    if conc is None:
        return _symbolic_note(spec)
    if conc.is_fp8:
        return FP8_HEURISTIC_NOTE
    if table is None:
        return ("no tuning of this problem, and no shipped table in use (none for this GPU and arch, or "
                "GEMMC_PRETUNED=0)")
    if not table.covers(conc):
        return (f"no tuning of this problem; the shipped table of the {table.gpu} holds plain bf16 A [M, K] @ "
                f"B [N, K].T, unbatched, only")
    if conc.has_epilogue:
        return "no tuning of this problem or shape; a fused epilogue keeps the kernel"
    return None


def _other_layout_cublas_win(conc: Optional[GemmSpec], table) -> Optional[str]:
    """For a plain GEMM of the table's class in another storage layout (e.g. a backward pass's dX or dW): where
    the table has cuBLAS winning the same (M, N, K) as A [M, K] @ B [N, K].T (at the shape, its neighbour, or the
    nearest shapes it measured), the detail of a torch.matmul route; else None. Only a cuBLAS win carries over,
    never a gemmc win: that direction cannot make a call slower than torch.matmul's."""
    if conc is None or table is None or conc.has_epilogue or (conc.a_layout, conc.b_layout) == ("mk", "nk"):
        return None
    counterpart = replace(conc, a_layout="mk", b_layout="nk", name=f"{conc.name}_as_mk_nk")
    if not table.covers(counterpart):
        return None
    hit = table.lookup(counterpart)
    if hit is not None:
        e, exact = hit
        if not e.cublas_faster:
            return None
        where = "this shape" if exact else f"{e.m}x{e.n}x{e.k}"
        return (f"no measurement in layouts {conc.a_layout}/{conc.b_layout}; the shipped table of the {table.gpu} "
                f"measured cuBLAS faster as A [M, K] @ B [N, K].T at {where} ({e.time_us:.2f} us vs cuBLAS "
                f"{e.cublas_us:.2f} us)")
    cublas_faster, read = table.cublas_verdict(counterpart)
    if not cublas_faster:
        return None
    what = _READ[read]
    return (f"no measurement in layouts {conc.a_layout}/{conc.b_layout}; cuBLAS won at one or more of the "
            f"{VERDICT_NEIGHBOURS} nearest shapes measured as A [M, K] @ B [N, K].T on {table.gpu} ({what})")


def _symbolic_note(spec: GemmSpec) -> str:
    dims = [name for name, d in (("M", spec.m), ("N", spec.n), ("K", spec.k), ("batch", spec.batch))
            if d is not None and not isinstance(d, int)]
    note = f"symbolic {' and '.join(dims)}: no measurement applies"
    if dims == ["M"]:
        note += " (a symbolic-M `auto` compile decides per runtime M: see k.for_m(M))"
    return note
