"""Nsight Compute (`ncu`) on gemmc's kernels: the command, its CSV read back, and per call an L2Profile.

One ncu run profiles a list of jobs (a schedule of a problem, or cuBLAS on it) in one target process
(gemmc/bench/profile_target.py): ncu starts collecting at the target's profiler start and stops at its stop,
and the target launches a marker kernel (torch's spin kernel) before each job's calls, so the CSV's kernels
split back into jobs in launch order, each job's calls into its kernels. The metrics (`METRICS`):

  L2 hit rate        lts__t_sector_hit_rate.pct, over the call's L2 sectors (lts__t_sectors.sum)
  DRAM bytes         dram__bytes_read.sum, dram__bytes_write.sum
  SM clock           sm__cycles_elapsed.avg.per_second, the clock the kernels ran at (--clock-control none:
                     the GPU's own, as in the bench, not ncu's base clock)
  tensor pipe        the WGMMA pipe's busy share of the active cycles (TENSOR_METRICS: the first this ncu knows)
  duration           gpu__time_duration.sum

`--cache-control all` flushes L2 before each kernel (and each replay pass), so a profile measures a cold L2,
as the bench's input sets rotated through 2x L2 do; kernels run one at a time under the profiler (no PDL
overlap), so its duration is not the bench's time.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ..choose.measurement import L2Profile
from ..errors import GemmcError
from ..schedule import Schedule
from ..spec import GemmSpec

# the tensor pipe's metric differs between GPUs and ncu versions: the WGMMA pipe (Hopper), else the MMA pipe
TENSOR_METRICS = ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                  "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")
METRICS = {
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "l2_sectors": "lts__t_sectors.sum",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "sm_hz": "sm__cycles_elapsed.avg.per_second",
    "duration": "gpu__time_duration.sum",
}
TOOL = "ncu --clock-control none --cache-control all"      # profiles.tool: what measured a profile row
MARKER = re.compile(r"spin_kernel")          # torch.cuda._sleep's kernel: the target's job separator
NCU_HINT = ("install Nsight Compute (the CUDA toolkit's ncu), put it on PATH or point GEMMC_NCU at it; "
            "`gemmc bench` and `gemmc-search tune` time kernels without it")

# a unit's factor to the base unit (bytes, seconds, Hz, percent), as ncu prints them without --print-units base
_UNITS = {"": 1.0, "%": 1.0, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "kibyte": 2.0 ** 10, "mibyte": 2.0 ** 20, "gibyte": 2.0 ** 30,
          "second": 1.0, "msecond": 1e-3, "usecond": 1e-6, "nsecond": 1e-9,
          "cycle/second": 1.0, "cycle/msecond": 1e3, "cycle/usecond": 1e6, "cycle/nsecond": 1e9,
          "hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "sector": 1.0, "ksector": 1e3, "msector": 1e6,
          "gsector": 1e9}


class ProfileError(GemmcError):
    """ncu is missing, refused to profile, or its output does not read as the jobs' kernels."""


@dataclass(frozen=True)
class KernelRecord:
    """One profiled kernel launch: ncu's ID (launch order), the kernel's name, its metrics in base units."""
    index: int
    name: str
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileJob:
    """A call to profile: `schedule` on `spec` (a concrete plain GEMM), or cuBLAS on it (schedule None)."""
    spec: GemmSpec
    schedule: Optional[Schedule] = None

    @property
    def side(self) -> str:
        return "cublas" if self.schedule is None else "gemmc"

    def to_dict(self) -> dict:
        s = self.spec
        return {"m": s.m, "n": s.n, "k": s.k, "dtype": str(s.dtype),
                "schedule": None if self.schedule is None else self.schedule.to_dict()}


@dataclass(frozen=True)
class ProfileResult:
    job: ProfileJob
    profile: Optional[L2Profile] = None
    error: Optional[str] = None


# ---- finding ncu ---------------------------------------------------------------------------------------

def find_ncu(explicit: Optional[str] = None) -> str:
    """The ncu to run: `explicit`, else $GEMMC_NCU, else ncu on PATH, else the CUDA toolkit's. ProfileError
    (one line, what to do) when there is none."""
    for cand in (explicit, os.environ.get("GEMMC_NCU")):
        if cand:
            if shutil.which(cand) or (Path(cand).is_file() and os.access(cand, os.X_OK)):
                return shutil.which(cand) or cand
            raise ProfileError(f"ncu {cand!r} (from {'--ncu' if cand == explicit else 'GEMMC_NCU'}) is not an "
                               f"executable; {NCU_HINT}")
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "ncu").is_file():
            return str(Path(root) / "bin" / "ncu")
    raise ProfileError(f"ncu (Nsight Compute) is not on this host: not on PATH, not in $CUDA_HOME/bin or "
                       f"/usr/local/cuda/bin; {NCU_HINT}")


def ncu_command(ncu: str, target: Sequence[str], log_file: str, tensor_metric: Optional[str]) -> list[str]:
    metrics = list(METRICS.values()) + ([tensor_metric] if tensor_metric else [])
    return [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "--cache-control", "all",
            "--profile-from-start", "off", "--target-processes", "all", "--metrics", ",".join(metrics),
            "--log-file", log_file, *target]


# ---- reading its CSV -----------------------------------------------------------------------------------

def _number(text: str, unit: str) -> float:
    t = text.strip().replace(",", "")
    if t in ("", "n/a", "N/A", "nan"):
        return math.nan
    factor = _UNITS.get(unit.strip().lower())
    if factor is None:
        raise ProfileError(f"ncu printed a value in a unit gemmc does not read ({unit!r}); run it with "
                           f"--print-units base")
    return float(t) * factor


def parse_ncu_csv(text: str) -> list[KernelRecord]:
    """The kernels of `ncu --csv` output, in launch order. Reads the details page (one row per kernel and
    metric: ID, Kernel Name, Metric Name, Metric Unit, Metric Value) and the raw page (one row per kernel, a
    column per metric, the units in the row under the header); lines ncu or the target printed around the
    table (==PROF== ..., the target's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"') and '"Kernel Name"' in ln), None)
    if start is None:
        return []
    table = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(table))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    if "ID" not in col or "Kernel Name" not in col:
        raise ProfileError(f"ncu's CSV has no ID and Kernel Name columns (header {header[:6]}); is this `ncu --csv` "
                           f"output?")
    kernels: dict[int, KernelRecord] = {}
    if "Metric Name" in col:                    # details page
        for r in body:
            if len(r) < len(header) or not r[col["ID"]].strip().isdigit():
                continue
            idx = int(r[col["ID"]])
            rec = kernels.setdefault(idx, KernelRecord(idx, r[col["Kernel Name"]], {}))
            unit = r[col["Metric Unit"]] if "Metric Unit" in col else ""
            rec.metrics[r[col["Metric Name"]]] = _number(r[col["Metric Value"]], unit)
    else:                                       # raw page: a units row under the header
        units = body[0] if body and not body[0][col["ID"]].strip().isdigit() else [""] * len(header)
        metric_cols = [c for c in header if "__" in c]
        for r in body:
            if len(r) < len(header) or not r[col["ID"]].strip().isdigit():
                continue
            idx = int(r[col["ID"]])
            kernels[idx] = KernelRecord(idx, r[col["Kernel Name"]],
                                        {c: _number(r[col[c]], units[col[c]]) for c in metric_cols})
    return [kernels[i] for i in sorted(kernels)]


def ncu_error(text: str) -> Optional[str]:
    """ncu's first ==ERROR== line (with a hint for the permission error), or None."""
    for ln in text.splitlines():
        if "==ERROR==" in ln:
            msg = ln.split("==ERROR==", 1)[1].strip()
            if "ERR_NVGPUCTRPERM" in msg:
                msg += (" (this user may not read the GPU's performance counters: run as root, or set the "
                        "driver's NVreg_RestrictProfilingToAdminUsers=0)")
            return msg
    return None


def split_markers(kernels: Sequence[KernelRecord]) -> list[list[KernelRecord]]:
    """The kernels after each marker kernel, up to the next: one list per job that launched its marker."""
    jobs: list[list[KernelRecord]] = []
    for k in kernels:
        if MARKER.search(k.name):
            jobs.append([])
        elif jobs:
            jobs[-1].append(k)
    return jobs


def split_calls(kernels: Sequence[KernelRecord], calls: int, what: str) -> list[list[KernelRecord]]:
    """A job's kernels as `calls` calls of the same kernels each; ProfileError when they do not divide."""
    if not kernels or len(kernels) % calls:
        raise ProfileError(f"{what}: {len(kernels)} kernels profiled for {calls} calls; each call should launch "
                           f"the same kernels")
    per = len(kernels) // calls
    return [list(kernels[c * per:(c + 1) * per]) for c in range(calls)]


def call_profile(kernels: Sequence[KernelRecord], tensor_metric: Optional[str]) -> L2Profile:
    """One call's profile from its kernels: bytes and time summed, the hit rate over all their L2 sectors,
    the clock and the tensor pipe's share weighted by each kernel's duration."""
    m = METRICS
    dur = [k.metrics.get(m["duration"], math.nan) for k in kernels]
    total = sum(dur)
    sectors = [k.metrics.get(m["l2_sectors"], math.nan) for k in kernels]
    hits = sum(s * k.metrics.get(m["l2_hit_pct"], math.nan) / 100.0 for s, k in zip(sectors, kernels))

    def weighted(name):
        vals = [k.metrics.get(name) for k in kernels]
        if any(v is None or math.isnan(v) for v in vals) or not total:
            return None
        return sum(v * d for v, d in zip(vals, dur)) / total

    clock = weighted(m["sm_hz"])
    tensor = weighted(tensor_metric) if tensor_metric else None
    return L2Profile(l2_hit_rate=hits / sum(sectors) if sum(sectors) else math.nan,
                     dram_read_bytes=sum(k.metrics.get(m["dram_read"], math.nan) for k in kernels),
                     dram_write_bytes=sum(k.metrics.get(m["dram_write"], math.nan) for k in kernels),
                     sm_clock_mhz=clock / 1e6 if clock is not None else math.nan, duration_us=total * 1e6,
                     tensor_pipe_pct=tensor, kernels=len(kernels))


def median_profile(profiles: Sequence[L2Profile]) -> L2Profile:
    """Per metric, the median over the calls (an odd count of calls gives one call's values)."""
    import statistics

    def med(name):
        vals = [getattr(p, name) for p in profiles]
        return None if any(v is None for v in vals) else statistics.median(vals)
    return L2Profile(l2_hit_rate=med("l2_hit_rate"), dram_read_bytes=med("dram_read_bytes"),
                     dram_write_bytes=med("dram_write_bytes"), sm_clock_mhz=med("sm_clock_mhz"),
                     duration_us=med("duration_us"), tensor_pipe_pct=med("tensor_pipe_pct"),
                     kernels=profiles[0].kernels)


# ---- running it ----------------------------------------------------------------------------------------

def profile(jobs: Sequence[ProfileJob], *, calls: int = 3, ncu: Optional[str] = None, timeout_s: float = 900.0,
            python: Optional[str] = None, check: bool = True) -> list[ProfileResult]:
    """Profile every job under one ncu run; a job the target could not run (a build error, a failed check)
    comes back with its error. ProfileError when ncu is missing or the run as a whole fails."""
    exe = find_ncu(ncu)
    if not jobs:
        return []
    with tempfile.TemporaryDirectory(prefix="gemmc-ncu-") as d:
        job_file, manifest, log = (os.path.join(d, f) for f in ("jobs.json", "manifest.json", "ncu.csv"))
        with open(job_file, "w") as f:
            json.dump({"jobs": [j.to_dict() for j in jobs], "calls": calls, "check": check}, f)
        target = [python or sys.executable, "-m", "gemmc.bench.profile_target", job_file, manifest]
        last_error = None
        for tensor_metric in (*TENSOR_METRICS, None):
            proc = subprocess.run(ncu_command(exe, target, log, tensor_metric), capture_output=True, text=True,
                                  timeout=timeout_s, env={**os.environ, "PYTHONPATH": _pythonpath()})
            text = Path(log).read_text() if os.path.exists(log) else ""
            last_error = ncu_error(text + "\n" + proc.stdout + "\n" + proc.stderr)
            if last_error and tensor_metric and "metric" in last_error.lower():
                continue        # this ncu does not know the tensor-pipe metric: try the next
            break
        if not os.path.exists(manifest):
            raise ProfileError(f"the profiled process did not finish (exit {proc.returncode}): "
                               f"{last_error or _tail(proc.stderr)}")
        ran = json.loads(Path(manifest).read_text())
        if last_error and not any(r.get("ok") for r in ran):
            raise ProfileError(f"ncu failed: {last_error}")
        # the table is in the log (--log-file takes all of ncu's output); read stdout where it is not
        table = text if '"Kernel Name"' in text else proc.stdout
        return results_of(jobs, ran, parse_ncu_csv(table), calls, tensor_metric)


def results_of(jobs: Sequence[ProfileJob], ran: list, kernels: Sequence[KernelRecord], calls: int,
               tensor_metric: Optional[str]) -> list[ProfileResult]:
    """Each job's result from the target's manifest (`ran`: per job, whether it launched its marker, and ok or
    its error) and the kernels ncu profiled, in launch order."""
    marked = [i for i, r in enumerate(ran) if r.get("marker")]
    groups = split_markers(kernels)
    if len(groups) != len(marked):
        raise ProfileError(f"ncu's output holds {len(groups)} job markers where the target launched {len(marked)}: "
                           f"ncu missed kernels (see its log)")
    out = [ProfileResult(j, error=ran[i].get("error") or "not run") if i < len(ran) else
           ProfileResult(j, error="not run: the profiled process stopped before it") for i, j in enumerate(jobs)]
    for i, ks in zip(marked, groups):
        if ran[i].get("ok"):
            per_call = split_calls(ks, calls, f"job {i + 1} ({jobs[i].side})")
            out[i] = ProfileResult(jobs[i], median_profile([call_profile(c, tensor_metric) for c in per_call]))
    return out


def _pythonpath() -> str:
    """The target imports this gemmc: its checkout first on the path, then whatever the caller had."""
    root = str(Path(__file__).resolve().parents[2])
    rest = os.environ.get("PYTHONPATH", "")
    return root + (os.pathsep + rest if rest else "")


def _tail(text: str, n: int = 400) -> str:
    text = (text or "").strip()
    return text[-n:] if text else "(no output)"
