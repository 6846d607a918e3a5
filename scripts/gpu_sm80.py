"""SM80 backend on the H200: correctness of every variant, then speed next to torch.matmul (cuBLAS).

    python3 scripts/gpu_sm80.py                  # all phases; JSON + log under $OUT (or ./sm80_out)
    python3 scripts/gpu_sm80.py --compile-only   # CPU: emit + compile every variant (sm_90a; one also sm_80), check PTX
    python3 scripts/gpu_sm80.py --phases check --only tn_bf16 --shapes 129,136,72    # one variant
    python3 scripts/gpu_sm80.py --phases speed --speed-shapes 4096,4096,4096

The SM80 kernels are compiled for sm_90a (same mma.sync / cp.async / ldmatrix instructions) so they run
on Hopper. Each phase runs in its own child process (check: one per variant, in parallel), so a kernel
that faults cannot take the others down; a child that hangs is killed at its timeout.

Phases:
  check     every CHECK_VARIANT at shapes on and off the tile grid; fp32 torch reference of the upcast
            inputs, output NaN-filled first, relative Frobenius error < 1e-2.
  speed     TN bf16, the SPEED schedules and torch.matmul interleaved in one process: CUDA graphs, randn
            inputs, input sets rotated through >= 2x L2, median (and spread) of repeats
            (gemmc.bench.timing). Square and Llama-3 prefill shapes.
  sanitize  compute-sanitizer memcheck + racecheck on two small runs (skipped when it is not installed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmc.backends.sm80.gpucheck import CHECK_VARIANTS  # noqa: E402
from gemmc.schedule import Schedule  # noqa: E402
from gemmc.spec import GemmSpec  # noqa: E402

S = lambda tile, **kw: Schedule(tile=tile, arch="sm_80", **kw)  # noqa: E731
# TN bf16 schedules timed on every speed shape (one compile each: M, N, K are symbolic)
SPEED = {
    "128x128x32_s5": S((128, 128, 32)),
    "128x256x32_s4": S((128, 256, 32), stages=4),
    "256x128x32_s4": S((256, 128, 32), stages=4),
    "128x256x32_s4_sw8": S((128, 256, 32), stages=4, swizzle=8),
    "128x128x64_s4_sw8": S((128, 128, 64), stages=4, swizzle=8),
}
SQUARE = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384)]
LLAMA3 = [(4096, n, k) for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                                    (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]]
CHECK_SHAPES = [(1, 8, 8), (77, 392, 136), (129, 136, 72), (1000, 264, 1032), (256, 512, 4096), (2048, 2048, 512)]
SANITIZE = [("tn_bf16", "129,136,72"), ("tt_splitk2_epi_batched", "129,136,200")]


def parse_shapes(text: str):
    return [tuple(int(x) for x in s.split(",")) for s in text.split(";") if s]


def spec_of(name: str) -> GemmSpec:
    return GemmSpec(**CHECK_VARIANTS[name][0]) if name in CHECK_VARIANTS else GemmSpec()


def schedule_of(name: str) -> Schedule:
    return CHECK_VARIANTS[name][1] if name in CHECK_VARIANTS else SPEED[name]


# ---- CPU: compile and PTX ---------------------------------------------------------------------------

def ptx_problems(ptx: str) -> list[str]:
    errs = [f"PTX lacks {w}" for w in ("mma.sync.aligned.m16n8k16", "cp.async.cg.shared.global",
                                       "cp.async.commit_group", "cp.async.wait_group", "ldmatrix") if w not in ptx]
    errs += [f"PTX has {w}" for w in ("wgmma", "setmaxnreg", "cp.async.bulk.tensor") if w in ptx]
    return errs


def compile_only(names, log) -> dict:
    from gemmc.backends.sm80 import emit
    from gemmc.build import compile_with_ptx
    from gemmc.compiler import lower
    report = {"compiled": {}, "errors": []}
    for i, name in enumerate(names):
        for arch in (("sm_90a", "sm_80") if i == 0 else ("sm_90a",)):
            t0 = time.time()
            try:
                _, plan = lower(spec_of(name), schedule_of(name))
                _, ptx = compile_with_ptx(emit(plan, compile_arch=arch))
                errs = ptx_problems(ptx)
                report["compiled"][f"{name}@{arch}"] = {"seconds": round(time.time() - t0, 1), "ptx_errors": errs}
                report["errors"] += [f"{name}@{arch}: {e}" for e in errs]
                log(f"compiled {name:24s} {arch:7s} {time.time() - t0:5.1f}s  {'; '.join(errs) or 'PTX ok'}")
            except Exception as e:
                report["errors"].append(f"{name}@{arch}: {type(e).__name__}: {str(e)[:2000]}")
                log(f"ERROR {name}@{arch}: {type(e).__name__}: {str(e)[:2000]}")
    return report


# ---- child phases (GPU) ---------------------------------------------------------------------------

def child_check(names, shapes, log, device="cuda", make_launcher=None) -> dict:
    """Check each variant at each shape. `make_launcher(spec, schedule)` and `device` are seams for CPU tests."""
    import torch
    from gemmc.backends.sm80.gpucheck import hopper_launcher, run_checked
    dev = torch.device(device)
    make_launcher = make_launcher or (lambda spec, sched: hopper_launcher(spec, sched)[2])
    rows, errors = [], []
    for name in names:
        spec = spec_of(name)
        try:
            t0 = time.time()
            launcher = make_launcher(spec, schedule_of(name))
            log(f"compiled {name} in {time.time() - t0:.1f}s")
        except Exception as e:
            errors.append(f"{name}: compile: {type(e).__name__}: {str(e)[:2000]}")
            log("ERROR " + errors[-1])
            continue
        for (m, n, k) in shapes:
            if spec.a_layout == "km":
                m = max(8, (m + 7) // 8 * 8)       # M is A's contiguous dim there: 16-byte aligned
            batch = 3 if spec.batch is not None else 1
            try:
                t0 = time.time()
                err = run_checked(spec, launcher, m, n, k, batch, dev, seed=m + n + k)
                ok = err < 1e-2
                rows.append({"variant": name, "m": m, "n": n, "k": k, "batch": batch, "rel_err": err, "ok": ok})
                log(f"  {name:24s} {m}x{n}x{k}x{batch}: rel_err={err:.2e} {'OK' if ok else 'FAIL'} ({time.time() - t0:.2f}s)")
            except Exception as e:
                rows.append({"variant": name, "m": m, "n": n, "k": k, "batch": batch, "rel_err": None, "ok": False,
                             "error": f"{type(e).__name__}: {str(e)[:500]}"})
                log(f"  {name:24s} {m}x{n}x{k}: ERROR {type(e).__name__}: {str(e)[:500]}")
                if "CUDA" in str(e) or "illegal" in str(e).lower():
                    errors.append(f"{name}: CUDA error, stopping this child: {str(e)[:500]}")
                    break
    return {"check": rows, "errors": errors}


def child_speed(names, shapes, repeats, log, device="cuda", clock=None, make_launcher=None, l2=None) -> dict:
    """Time TN bf16 kernels against torch.matmul. device/clock/make_launcher/l2 are seams for CPU tests."""
    import torch
    from gemmc.backends.sm80.gpucheck import hopper_launcher
    from gemmc.bench.stats import summarize, tflops
    from gemmc.bench.suites import Shape
    from gemmc.bench.timing import (CudaClock, TimingConfig, check_output, cublas_matmul, input_set_count,
                                    l2_bytes_of, launch_count, make_input_sets, reference, time_interleaved,
                                    unit_calls)
    cfg = TimingConfig(repeats=repeats)
    kernels, errors = {}, []
    for name in names:
        try:
            t0 = time.time()
            kernels[name] = (make_launcher or (lambda spec, sched: hopper_launcher(spec, sched)[2]))(GemmSpec(), SPEED[name])
            log(f"compiled {name} in {time.time() - t0:.1f}s")
        except Exception as e:
            errors.append(f"{name}: compile: {type(e).__name__}: {str(e)[:2000]}")
            log("ERROR " + errors[-1])
    clock, l2 = clock or CudaClock(graphs=True), l2 or l2_bytes_of()
    rows = []
    for (m, n, k) in shapes:
        shape = Shape(m, n, k)
        row = {"m": m, "n": n, "k": k, "flops": shape.flops}
        sets = None
        try:
            sets = make_input_sets(shape, torch.bfloat16, device, input_set_count(shape, 2, l2, cfg.l2_factor), cfg.seed)
            row["input_sets"], row["rotated_bytes"] = sets.n, sets.rotated_bytes
            ref = reference(sets.a[0], sets.b[0])
            fns = {"torch": cublas_matmul}
            for name, fn in kernels.items():
                err = check_output(fn, sets.a[0], sets.b[0], sets.out_gemmc[0], ref)
                row[f"{name}_rel_err"] = err
                if err < cfg.tolerance:
                    fns[name] = fn
                else:
                    log(f"  {m}x{n}x{k} {name}: rel_err {err:.3g}: not timed")
            del ref
            est_us = 1000 * clock.time_ms(clock.prepare([lambda: cublas_matmul(sets.a[0], sets.b[0], out=sets.out_cublas[0])]))
            launches = launch_count(est_us, sets.n, cfg)
            units = {nm: clock.prepare(unit_calls(fn, sets, sets.out_cublas if nm == "torch" else sets.out_gemmc,
                                                  launches, False)) for nm, fn in fns.items()}
            ms = time_interleaved(units, clock, cfg.repeats, cfg.warmup)
            row["launches"] = launches
            for nm in fns:
                us = [1000 * t / launches for t in ms[nm]]
                row[f"{nm}_us"] = summarize(us).as_dict()
                row[f"{nm}_tflops"] = tflops(shape.flops, row[f"{nm}_us"]["median"])
            ours = [nm for nm in fns if nm != "torch"]
            if ours:
                best = max(ours, key=lambda nm: row[f"{nm}_tflops"])
                row["best"], row["best_tflops"] = best, row[f"{best}_tflops"]
                row["ratio_vs_torch"] = row[f"{best}_tflops"] / row["torch_tflops"]
            log(f"  {m}x{n}x{k}: torch {row['torch_tflops']:.0f} TF/s | "
                + " ".join(f"{nm}={row[f'{nm}_tflops']:.0f}" for nm in ours)
                + (f" | best/torch {row['ratio_vs_torch']:.3f}" if ours else ""))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            log(f"  {m}x{n}x{k}: ERROR {row['error']}")
        finally:
            del sets
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(row)
    return {"speed": rows, "errors": errors}


# ---- parent -------------------------------------------------------------------------------------

def run_child(args: list[str], json_path: Path, timeout: int, log, prefix: str = "") -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), *args, "--json", str(json_path)]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out, rc = out + f"\nTIMEOUT after {timeout}s (killed)", "timeout"
    for line in out.splitlines():
        if line.strip():
            log(prefix + line)
    result = {}
    if json_path.exists():
        result = json.loads(json_path.read_text())
    if rc != 0:
        result.setdefault("errors", []).append(f"child {' '.join(args)} exited {rc} after {time.time() - t0:.0f}s; "
                                               f"tail: {out[-1500:]}")
    return result


def sanitize(out_dir: Path, log) -> list[dict]:
    tool = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    if tool is None:
        log("sanitize: compute-sanitizer not found; skipped")
        return [{"skipped": "compute-sanitizer not found"}]
    rows = []
    for name, shapes in SANITIZE:
        for check in ("memcheck", "racecheck"):
            cmd = [tool, "--tool", check, "--error-exitcode", "9", "--report-api-errors", "no",
                   sys.executable, str(Path(__file__).resolve()), "--child", "check", "--only", name,
                   "--shapes", shapes, "--json", str(out_dir / f"sanitize_{name}_{check}.json")]
            t0 = time.time()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
                text, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired:
                text, rc = "TIMEOUT", "timeout"
            summary = [ln for ln in text.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
            clean = rc == 0 and all((" 0 error" in ln) or (" 0 hazard" in ln) for ln in summary)
            rows.append({"variant": name, "tool": check, "rc": rc, "clean": clean, "summary": summary,
                         "seconds": round(time.time() - t0, 1), "tail": text[-1500:] if not clean else ""})
            log(f"sanitize {check:9s} {name:24s} rc={rc} {'CLEAN' if clean else 'NOT CLEAN'} {' | '.join(summary)}")
    return rows


def print_tables(report, log):
    log("\n== SM80 (mma.sync, compiled for sm_90a) correctness ==")
    bad = [r for r in report.get("check", []) if not r.get("ok")]
    log(f"{len(report.get('check', [])) - len(bad)} / {len(report.get('check', []))} checks passed")
    for r in bad:
        log(f"  FAIL {r['variant']} {r['m']}x{r['n']}x{r['k']}x{r['batch']}: {r.get('rel_err')} {r.get('error', '')}")
    rows = report.get("speed", [])
    if rows:
        names = list(SPEED)
        log("\n== SM80 speed, TN bf16, TFLOP/s (median), H200 ==")
        log(f"{'M x N x K':>22s} {'torch':>7s} " + " ".join(f"{n:>18s}" for n in names) + f" {'best/torch':>10s}")
        for r in rows:
            cells = " ".join(f"{r.get(f'{n}_tflops', float('nan')):18.1f}" for n in names)
            log(f"{r['m']:>6d}x{r['n']:>6d}x{r['k']:>6d}  {r.get('torch_tflops', float('nan')):6.1f} {cells} "
                f"{r.get('ratio_vs_torch', float('nan')):10.3f}" + (f"  ERROR {r['error']}" if "error" in r else ""))
    if report.get("errors"):
        log("\n== errors ==")
        for e in report["errors"]:
            log("  " + e[:3000])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--phases", default="check,speed", help="check,speed,sanitize (sanitize is slow: run it alone)")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--shapes", default="", help="check shapes 'M,N,K;M,N,K'")
    ap.add_argument("--speed-shapes", default="", help="speed shapes 'M,N,K;...' (default: square + Llama-3)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=4, help="check children in parallel")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    lines: list[str] = []

    def log(s=""):
        print(s, flush=True)
        lines.append(s)

    only = [n for n in args.only.split(",") if n]
    if args.child:                                   # one phase, in this process
        try:
            if args.child == "check":
                res = child_check(only or list(CHECK_VARIANTS), parse_shapes(args.shapes) or CHECK_SHAPES, log)
            else:
                res = child_speed(only or list(SPEED), parse_shapes(args.speed_shapes) or SQUARE + LLAMA3,
                                  args.repeats, log)
        except Exception as e:
            res = {"errors": [f"child {args.child}: {type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"]}
            log(res["errors"][0])
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        return

    out_dir = Path(os.environ.get("OUT", "sm80_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"check": [], "speed": [], "sanitize": [], "errors": [], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.compile_only:
        report.update(compile_only(only or list(CHECK_VARIANTS) + list(SPEED), log))
    else:
        try:
            import torch
            report["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
        except Exception as e:
            report["device"] = f"unknown ({e})"
        log(f"device: {report['device']}")
        phases = [p for p in args.phases.split(",") if p]
        if "check" in phases:
            names = only or list(CHECK_VARIANTS)
            extra = ["--shapes", args.shapes] if args.shapes else []

            def one(name):
                return name, run_child(["--child", "check", "--only", name, *extra], out_dir / f"check_{name}.json",
                                       420, log, prefix=f"[{name}] ")
            with ThreadPoolExecutor(max(1, args.jobs)) as pool:
                for name, res in pool.map(one, names):
                    report["check"] += res.get("check", [])
                    report["errors"] += res.get("errors", [])
        if "speed" in phases:
            extra = ["--speed-shapes", args.speed_shapes] if args.speed_shapes else []
            res = run_child(["--child", "speed", "--repeats", str(args.repeats), *extra,
                             *(["--only", ",".join(n for n in only if n in SPEED)] if any(n in SPEED for n in only) else [])],
                            out_dir / "speed.json", 540, log, prefix="[speed] ")
            report["speed"] = res.get("speed", [])
            report["errors"] += res.get("errors", [])
        if "sanitize" in phases:
            report["sanitize"] = sanitize(out_dir, log)
    report["method"] = ("SM80 kernels (cp.async + ldmatrix + mma.sync) compiled for sm_90a; correctness: fp32 torch "
                        "reference of upcast inputs, NaN-prefilled output, rel. Frobenius < 1e-2; speed: TN bf16 randn, "
                        "CUDA graphs, input sets rotated >= 2x L2, interleaved with torch.matmul, median of repeats")
    print_tables(report, log)
    (out_dir / "sm80_results.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "sm80_log.txt").write_text("\n".join(lines) + "\n")
    log(f"wrote {out_dir / 'sm80_results.json'}")


if __name__ == "__main__":
    main()
