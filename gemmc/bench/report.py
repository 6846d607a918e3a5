"""Bench output: the JSON report (every number + device, versions, method), the terminal table,
the summary line and the ratio plot (matplotlib, imported only when plotting)."""
from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from .stats import RatioSummary, ratio_summary

FORMAT = "gemmc-bench/1"

NVIDIA_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
                     "power.limit", "temperature.gpu", "pstate")


# ---- environment -------------------------------------------------------------------------------

def versions() -> dict:
    """torch, CUDA, gemmc (its module attribute: on a GPU host it may not be pip-installed) and the
    compiler stack, where present."""
    from importlib import metadata

    import gemmc
    out = {"gemmc": gemmc.__version__, "python": platform.python_version()}
    try:
        import torch
        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    except ImportError:
        pass
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "xdsl"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def nvidia_smi(index: int = 0) -> Optional[dict]:
    """Clocks, driver and power state read by nvidia-smi, or None where it is missing."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, f"--id={index}", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0 or not res.stdout.strip():
        return None
    values = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(NVIDIA_SMI_FIELDS, values))


def gpu_info(device_index: int = 0) -> Optional[dict]:
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(device_index)
    except Exception:
        return None
    info = {"name": p.name, "capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count,
            "total_memory": p.total_memory, "l2_bytes": getattr(p, "L2_cache_size", None)}
    for attr in ("clock_rate", "memory_clock_rate"):  # kHz, where this torch exposes them
        if hasattr(p, attr):
            info[attr + "_khz"] = getattr(p, attr)
    info["nvidia_smi"] = nvidia_smi(device_index)
    return info


def collect_environment() -> dict:
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "gpu": gpu_info(), "versions": versions()}


def method_of(cfg) -> dict:
    if cfg.host_timing:
        how = ("host timing: CUDA events around a loop of eager user calls k(a, b) and torch.matmul(a, b.T) "
               "(output allocated per call), so launch and host overhead count")
        # the timed calls allocate their outputs: only the check before timing reads gemmc's results
        timed_check = "The timed calls' own outputs are not read back."
    else:
        how = ("CUDA graphs: each timed unit is one graph of `launches` calls (out= preallocated), timed by CUDA "
               "events; launch gaps do not count")
        timed_check = ("The timed graph launches are checked the same way after timing (their outputs NaN-filled "
                       "before the first replay).")
    text = (f"{how}. gemmc and cuBLAS (torch.matmul) in one process, interleaved repeat by repeat (order "
            f"alternating); input sets rotated through >= {cfg.l2_factor:g}x L2 (capped at {cfg.max_sets} sets: a "
            "shape too small to reach it that way has `below_l2_factor` true and its `rotated_l2_factor`); "
            f"randn inputs (seed {cfg.seed}); {cfg.warmup} warm-up + {cfg.repeats} timed units per side; median "
            f"and IQR/min/max per call. Every gemmc result is checked before timing: output NaN-filled, relative "
            f"Frobenius error vs an fp32 product of the upcast inputs < {cfg.tolerance:g} (for plain GEMMs with "
            "16-bit outputs also <= 2x cuBLAS's own + 1e-4), and every element within its error bound (`elem_err` "
            f"<= 1: accumulation and output rounding); a failing shape is reported, not timed. {timed_check} "
            "ratio = median over the repeats of cuBLAS time / gemmc time, the two of a repeat "
            "timed back to back (> 1: gemmc faster); `ratio_of_medians` and each side's `drift` (max/min - 1 of "
            "its samples: a clock step shows there) are kept too.")
    if getattr(cfg, "settle_s", 0) > 0:
        from .timing import SETTLE_MIN_CALL_US
        text += (f" Settled: before timing a shape whose call takes >= {SETTLE_MIN_CALL_US:g} us, cuBLAS runs back "
                 f"to back for {cfg.settle_s:g} s, so both sides are timed at the sustained, power-capped clock.")
    if getattr(cfg, "sustained_s", 0) > 0:
        from .timing import SETTLE_MIN_CALL_US
        text += (f" Sustained: for a shape whose call takes >= {SETTLE_MIN_CALL_US:g} us, each side runs back to "
                 f"back for {cfg.sustained_s:g} s before each of its timed units (no interleaving within a unit), "
                 "so each is timed at the power-capped clock its own load sets (`sustained` true in the record); "
                 "those shapes run no warm-up units, the back-to-back runs warm each side instead.")
    if getattr(cfg, "aa_check", False):
        text += (" A/A check: a third side runs the same cuBLAS call into gemmc's output slots; aa_ratio = "
                 "cuBLAS time / that time (paired the same way), which differs from 1 by noise alone.")
    return {"timing": "host" if cfg.host_timing else "cuda-graphs", "config": cfg.as_dict(), "text": text}


# ---- the report ----------------------------------------------------------------------------------

def summarize_results(results: Sequence[dict]) -> RatioSummary:
    ratios = [r["ratio"] for r in results if r.get("status") == "ok" and r.get("ratio") is not None]
    failed = sum(1 for r in results if r.get("status") != "ok")
    return ratio_summary(ratios, failed)


def aa_summary(results: Sequence[dict]) -> Optional[RatioSummary]:
    """cuBLAS against itself over the shapes timed with `--aa-check`: how far from 1.0 noise alone reads."""
    ratios = [r["aa_ratio"] for r in results if r.get("status") == "ok" and r.get("aa_ratio") is not None]
    return ratio_summary(ratios) if ratios else None


def make_report(results: Sequence[dict], *, suite: str, policy: str, dtype: str, arch: str, cfg,
                environment: Optional[dict] = None) -> dict:
    summary = summarize_results(results)
    line = summary.line()
    report = {"format": FORMAT, "suite": suite, "policy": policy, "dtype": dtype, "arch": arch,
              "method": method_of(cfg), "environment": environment or collect_environment(),
              "summary": summary.as_dict(), "summary_line": line, "results": list(results)}
    aa = aa_summary(results)
    if aa is not None:
        report["aa_summary"] = aa.as_dict()
        report["summary_line"] = (f"{line}; A/A (cuBLAS vs itself, the noise floor): geomean {aa.geomean:.3f}x, "
                                  f"range {aa.min:.3f}x-{aa.max:.3f}x")
    return report


def _json_safe(x):
    """NaN/inf are not JSON: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_json(report: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_json_safe(report), indent=1, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def read_json(path):
    """A JSON file's contents, gzipped or not (the larger reports under bench/results are kept as .json.gz)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode())


def load_json(path) -> dict:
    """A report written by write_json (or gzipped since); ValueError naming the file where it is not one."""
    try:
        report = read_json(path)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError):
        raise ValueError(f"{path}: not a gemmc bench report (not text)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a gemmc bench report (not JSON: {e})") from None
    found = report.get("format") if isinstance(report, dict) else type(report).__name__
    if found != FORMAT:
        raise ValueError(f"{path}: not a gemmc bench report (format {found!r}, expected {FORMAT!r})")
    return report


def default_output_path(suite: str, gpu_name: Optional[str], host_timing: bool = False, root="bench/results",
                        date: Optional[str] = None) -> Path:
    """bench/results/<date>-<gpu>-<suite>[-host].json, <date> as YYYY-MM-DD (the day the report is written)."""
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    gpu = (gpu_name or "cpu").lower().replace("nvidia", "")
    tag = re.sub(r"[^a-z0-9]+", "-", gpu).strip("-") or "gpu"
    tag = re.sub(r"-(sxm|pcie|nvl)[a-z0-9-]*$", "", tag)  # 'h200-sxm-141gb' -> 'h200'
    return Path(root) / f"{date}-{tag}-{suite}{'-host' if host_timing else ''}.json"


def unused_path(path) -> Path:
    """`path`, or where a report (or its plot) is already there, the first free `<stem>-2`, `-3`, ...: a second
    run on the same day (another policy, say) must not overwrite the first one's default report."""
    path = Path(path)

    def taken(p: Path) -> bool:
        return p.exists() or p.with_suffix(".png").exists()

    n, candidate = 2, path
    while taken(candidate):
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return candidate


# ---- terminal table ------------------------------------------------------------------------------

def _fmt(x, spec=".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _row_notes(r: dict) -> str:
    notes = ""
    if r.get("sustained"):   # own clock (--sustained-s): each side timed alone at the power-capped clock it sets
        notes += "  [own clock]"
    if r.get("below_l2_factor"):   # too small to rotate through --l2-factor x L2 within the cap on input sets
        notes += f"  [inputs {r['rotated_l2_factor']:.2g}x L2: partly warm]"
    return notes


def format_table(results: Sequence[dict]) -> str:
    head = ("shape", "gemmc TFLOP/s", "cuBLAS TFLOP/s", "ratio", "spread", "schedule / status")
    rows = []
    for r in results:
        if r.get("status") == "ok":
            g = r["gemmc_us"]
            spread = f"±{100 * (g['q3'] - g['q1']) / (2 * g['median']):.1f}%" if g["median"] else "-"
            rows.append((r["shape"], _fmt(r["gemmc_tflops"]), _fmt(r["cublas_tflops"]), _fmt(r["ratio"], ".3f"),
                         spread, (r.get("schedule") or "-") + _row_notes(r)))
        else:
            err = (r.get("error") or "").splitlines()[0] if r.get("error") else ""
            rows.append((r["shape"], "-", _fmt(r.get("cublas_tflops")), "-", "-",
                         f"{r['status'].upper()}: {err[:90]}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    right = (False, True, True, True, True, False)

    def line(cells):
        return "  ".join(c.rjust(w) if rj else c.ljust(w) for c, w, rj in zip(cells, widths, right)).rstrip()

    out = [line(head), line(tuple("-" * w for w in widths))]
    out += [line(row) for row in rows]
    return "\n".join(out)


# ---- plot ------------------------------------------------------------------------------------------

def plot_ratios(report: dict, path) -> Path:
    """Ratio to cuBLAS against the problem's FLOPs (log x), a line at 1.0, failed shapes marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    ok = [r for r in results if r.get("status") == "ok"]
    bad = [r for r in results if r.get("status") != "ok"]
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    if ok:
        ax.scatter([r["flops"] for r in ok], [r["ratio"] for r in ok], s=22, c="tab:blue", alpha=0.8,
                   label=f"gemmc ({len(ok)} shapes)", zorder=3)
    ymin = min([r["ratio"] for r in ok] + [1.0])
    ymax = max([r["ratio"] for r in ok] + [1.0])
    if bad:
        ax.scatter([r["flops"] for r in bad], [ymin * 0.9] * len(bad), marker="x", c="tab:red",
                   label=f"failed ({len(bad)})", zorder=3)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="cuBLAS (1.0)")
    ax.set_xscale("log")
    ax.set_ylim(ymin * 0.85, ymax * 1.08)
    ax.set_xlabel("problem size (FLOPs = 2·M·N·K, log scale)")
    ax.set_ylabel("speed vs cuBLAS (cuBLAS time / gemmc time)")
    gpu = ((report.get("environment") or {}).get("gpu") or {}).get("name", "no GPU")
    ax.set_title(f"gemmc vs cuBLAS · {gpu} · suite {report.get('suite')} · policy {report.get('policy')} · "
                 f"{report.get('dtype')}\n{report.get('summary_line', '')}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
