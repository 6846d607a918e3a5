"""fp8 GEMMs on SM90: correctness on the GPU, then speed side by side with torch's fp8 GEMMs.

    python3 scripts/gpu_fp8.py                      # correctness + timing, JSON under $OUT (or ./fp8_out)
    python3 scripts/gpu_fp8.py --compile-only       # CPU: build every variant, check the PTX's fp8 WGMMA
    python3 scripts/gpu_fp8.py --only row_coop_128x256_c2x1_bias --no-timing   # one variant, e.g. under a sanitizer
    python3 scripts/gpu_fp8.py --modes block        # one scaling only

Variants: per tensor, per row and per block (DeepSeek-V3) scaling, e4m3 x e4m3 and e4m3 x e5m2, cooperative
and ping-pong, clusters with multicast, split-K (the in-kernel fix-up and the reduce kernel), stream-K and
swapped decode kernels, with and without an epilogue.

Correctness: the inputs are randn spread over rows and 128-blocks and quantized per scaling
(gemmc.reference.make_inputs); the reference is the fp32 product of the dequantized operands; the output is
NaN-filled first; relative Frobenius error < 1e-2 and every element within gemmc.reference's bound
(`checked_error`). torch._scaled_mm's error on the same inputs is recorded beside ours (per tensor and per row).

Timing: CUDA graphs of calls rotating over input sets of >= 2x L2, torch's and each of our kernels' graphs
replayed interleaved repeat by repeat, the median per side, in one process (gemmc.bench.graph_timing). Baselines: torch._scaled_mm
(use_fast_accum=True, the accumulation our kernels do) per tensor and per row; per block, which this torch's
_scaled_mm does not take, a torch implementation (both operands dequantized to bf16, then torch.matmul), and
for context the bf16 torch.matmul of the dequantized operands alone (no dequantization in the timed call).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemmc.backends.sm90 import emit  # noqa: E402
from gemmc.bench.graph_timing import time_sides  # noqa: E402
from gemmc.bench.watchdog import Watchdog  # noqa: E402
from gemmc.compiler import lower  # noqa: E402
from gemmc.reference import checked_error, make_inputs  # noqa: E402
from gemmc.schedule import Schedule  # noqa: E402
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref, Scaling  # noqa: E402

L2_BYTES = 60 * 2**20
S = Schedule
BIAS_GELU = dict(inputs=(EpilogueInput("bias", "row", "bf16"),),
                 epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))), EpilogueOp("gelu_tanh", (Ref.node(0),))))
RESIDUAL = dict(inputs=(EpilogueInput("res", "full", "bf16"),),
                epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("res"))),))

# name -> (scaling, B's dtype, extra spec fields, schedule)
VARIANTS = {
    "tensor_coop_128x128": ("tensor", "f8e4m3", {}, S((128, 128, 128))),
    "tensor_pp_64x256_c1x2": ("tensor", "f8e4m3", {}, S((64, 256, 64), (1, 2), mode="pingpong")),
    "tensor_e5m2_coop_128x256_c2x1": ("tensor", "f8e5m2", BIAS_GELU, S((128, 256, 128), (2, 1))),
    "tensor_swap_pp_64x16": ("tensor", "f8e4m3", {}, S((64, 16, 128), mode="pingpong", stages=10, swap_ab=True)),
    "row_coop_128x256_c2x1_bias": ("row", "f8e4m3", BIAS_GELU, S((128, 256, 128), (2, 1))),
    "row_pp_128x128_c1x2": ("row", "f8e4m3", {}, S((128, 128, 128), (1, 2), mode="pingpong")),
    "row_e5m2_coop_256x128": ("row", "f8e5m2", RESIDUAL, S((256, 128, 128))),
    "row_splitk2_fixup": ("row", "f8e4m3", BIAS_GELU, S((128, 128, 128), split_k=2)),
    "row_splitk4_serial": ("row", "f8e4m3", BIAS_GELU, S((128, 128, 128), (2, 1), split_k=4)),
    "row_streamk": ("row", "f8e4m3", {}, S((128, 128, 128), stream_k=True)),
    "row_swap_pp_64x16_c1x2": ("row", "f8e4m3", BIAS_GELU, S((64, 16, 128), (1, 2), mode="pingpong", swap_ab=True)),
    "row_swap_splitk2": ("row", "f8e4m3", {}, S((64, 8, 128), mode="pingpong", split_k=2, swap_ab=True)),
    "block_coop_128x128": ("block", "f8e4m3", {}, S((128, 128, 128))),
    "block_coop_128x128_c1x2_bias": ("block", "f8e4m3", BIAS_GELU, S((128, 128, 128), (1, 2))),
    "block_pp_64x128_c2x1": ("block", "f8e4m3", {}, S((64, 128, 128), (2, 1), mode="pingpong")),
    "block_e5m2_coop_256x64": ("block", "f8e5m2", {}, S((256, 64, 128))),
    "block_pp_128x32": ("block", "f8e4m3", RESIDUAL, S((128, 32, 128), mode="pingpong")),
    "block_splitk2_fixup": ("block", "f8e4m3", BIAS_GELU, S((128, 128, 128), split_k=2)),
    "block_splitk4_serial": ("block", "f8e4m3", {}, S((128, 64, 128), split_k=4)),
    "block_streamk": ("block", "f8e4m3", {}, S((128, 128, 128), stream_k=True)),
}
# schedules timed per scaling (one compile per (N, K) under block scaling: its scales' shape needs them)
SPEED = {
    "tensor": {"coop_128x256_c2x1": S((128, 256, 128), (2, 1)), "pp_128x128_c1x2": S((128, 128, 128), (1, 2),
                                                                                    mode="pingpong"),
               "decode_swap_64x16": S((64, 16, 128), mode="pingpong", stages=10, swap_ab=True)},
    "row": {"coop_128x256_c2x1": S((128, 256, 128), (2, 1)), "pp_128x128_c1x2": S((128, 128, 128), (1, 2),
                                                                                 mode="pingpong"),
            "decode_swap_64x16": S((64, 16, 128), mode="pingpong", stages=10, swap_ab=True)},
    "block": {"coop_128x128_c1x2": S((128, 128, 128), (1, 2)), "pp_64x128_c2x1": S((64, 128, 128), (2, 1),
                                                                                  mode="pingpong"),
              "coop_256x64": S((256, 64, 128))},
}
# Llama-3 8B/70B projections and DeepSeek-V3's (hidden 7168, MLA and MoE widths), prefill and decode
SPEED_SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336), (8192, 8192, 8192),
                (4096, 7168, 2048), (4096, 2112, 7168), (4096, 24576, 1536), (4096, 7168, 16384),
                (16, 4096, 4096), (16, 7168, 7168), (128, 7168, 2048), (128, 14336, 4096)]
# (M, N, K): ragged M, N and K (K = 1040: a partial last scale block; N = 392: a partial B scale block)
CHECK_SHAPES = [(1, 256, 256), (77, 392, 1040), (1000, 264, 2048), (256, 512, 4096), (2048, 2048, 512)]


def make_spec(name: str, n="N", k="K") -> GemmSpec:
    mode, b_dtype, extra, _ = VARIANTS[name]
    return GemmSpec(m="M", n=n, k=k, dtype="f8e4m3", b_dtype=b_dtype, scaling=Scaling(mode, "sa", "sb"),
                    name=name, **extra)


def static_nk(name: str) -> bool:
    """Block scaling compiles for a static N and K (its scales' shape counts their blocks)."""
    return VARIANTS[name][0] == "block"


def emitted_for(name: str, n="N", k="K"):
    spec = make_spec(name, n, k)
    return spec, emit(lower(spec, VARIANTS[name][3], "sm_90a")[1])


def check_ptx(name: str, ptx: str) -> list[str]:
    mode, b_dtype, _, sched = VARIANTS[name]
    kernel_a, kernel_b = ("e4m3", b_dtype[2:]) if not sched.swap_ab else (b_dtype[2:], "e4m3")
    want = f".f32.{kernel_a}.{kernel_b}"
    errs = []
    if not any(want in line for line in ptx.splitlines() if "wgmma.mma_async" in line):
        errs.append(f"{name}: PTX lacks wgmma.mma_async ... k32{want}")
    if "k32" not in ptx:
        errs.append(f"{name}: PTX's WGMMA is not the fp8 one (K 32)")
    mc = ".multicast::cluster" in ptx
    if mc != (sched.cluster[0] * sched.cluster[1] > 1):
        errs.append(f"{name}: multicast in PTX = {mc} for cluster {sched.cluster}")
    if mode == "block" and "wgmma.wait_group.sync.aligned" not in ptx:
        errs.append(f"{name}: a block-scaled kernel waits for each k-tile's WGMMA before promoting it")
    return errs


# ---- the GPU side ------------------------------------------------------------------------------------------

WATCHDOG = None


def scaled_mm_error(spec, a, b, extra) -> float | None:
    """torch._scaled_mm's checked error on the same inputs (per tensor and per row, no epilogue), else None."""
    import torch
    if spec.scaling.mode == "block" or spec.inputs:
        return None
    sa, sb = extra[:2]
    if spec.scaling.mode == "row":
        sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)
    else:
        sa, sb = sa.reshape(()), sb.reshape(())
    try:
        out = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    except RuntimeError:        # shapes torch's fp8 kernels refuse (M, N, K alignment)
        return None
    return checked_error(spec, out, a, b, extra)


def check(name, fn, spec, shapes, dev, log):
    import torch
    gen = torch.Generator(device=dev).manual_seed(0)
    results = []
    for (m, n, k) in shapes:
        if isinstance(spec.n, int) and (n, k) != (spec.n, spec.k):
            continue
        a, b, extra = make_inputs(spec, m, n, k, device=dev, generator=gen)
        out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
        t0 = time.time()
        if WATCHDOG:
            WATCHDOG.arm(f"{name} {m}x{n}x{k}", 60)
        fn(a, b, *extra, out=out)
        torch.cuda.synchronize()
        err = checked_error(spec, out, a, b, extra)
        torch_err = scaled_mm_error(spec, a, b, extra)
        ok = err < 1e-2
        results.append({"variant": name, "m": m, "n": n, "k": k, "rel_err": err, "scaled_mm_rel_err": torch_err,
                        "ok": ok})
        log(f"  {name:32s} {m}x{n}x{k}: rel_err={err:.2e}"
            + (f" (torch._scaled_mm {torch_err:.2e})" if torch_err is not None else "")
            + f" {'OK' if ok else 'FAIL'} ({time.time() - t0:.2f}s)")
    return results


def baseline_calls(mode, sets):
    """(torch's fp8 GEMM, and per block the bf16 GEMM of the dequantized operands) over the input sets."""
    import torch
    from gemmc.bench.fp8 import baseline
    from gemmc.quantize import Quantized
    base = baseline(mode)
    calls = [lambda a=a, b=b, o=o: base(Quantized(a, sa), Quantized(b, sb), out=o) for a, b, sa, sb, o, _ in sets]
    bf16 = None
    if mode == "block":
        bf16 = [lambda d=d, o=o: torch.matmul(d[0], d[1].t(), out=o) for *_, o, d in sets]
    return calls, bf16


def speed(mode: str, fns: dict, shapes, dev, log, rows=None, save=lambda: None):
    """Time each shape (module doc); rows are appended to `rows` as they come, `save` called after each."""
    import torch
    from gemmc.quantize import dequantize
    rows = [] if rows is None else rows
    for (m, n, k) in shapes:
        if WATCHDOG:
            WATCHDOG.arm(f"timing {mode} {m}x{n}x{k}", 180)
        set_bytes = m * k + n * k + m * n * 2
        nsets = max(2, math.ceil(2 * L2_BYTES / set_bytes))
        gen = torch.Generator(device=dev).manual_seed(1)
        spec = GemmSpec(m=m, n=n, k=k, dtype="f8e4m3", scaling=mode)
        sets = []
        for _ in range(nsets):
            a, b, (sa, sb) = make_inputs(spec, m, n, k, device=dev, generator=gen)
            deq = ((dequantize(a, sa).bfloat16(), dequantize(b, sb).bfloat16()) if mode == "block" else None)
            sets.append((a, b, sa, sb, torch.empty(m, n, device=dev, dtype=torch.bfloat16), deq))
        flops = 2.0 * m * n * k
        row = {"mode": mode, "m": m, "n": n, "k": k, "input_sets": nsets}
        base, bf16 = baseline_calls(mode, sets)
        sides = {"torch": base}
        for name, fn in fns.items():
            f = fn(n, k) if callable(fn) and getattr(fn, "per_nk", False) else fn
            sides[name] = [lambda a=a, b=b, sa=sa, sb=sb, o=o, f=f: f(a, b, sa, sb, out=o)
                           for a, b, sa, sb, o, _ in sets]
        if bf16 is not None:
            sides["bf16_matmul"] = bf16
        # every side in its own CUDA graph, the replays interleaved repeat by repeat (gemmc.bench.graph_timing)
        for side, seconds in time_sides(sides).items():
            row[side + "_s"] = seconds
        best = min(fns, key=lambda nm: row[nm + "_s"])
        row["best"] = best
        row["torch_tflops"] = flops / row["torch_s"] / 1e12
        row["best_tflops"] = flops / row[best + "_s"] / 1e12
        row["ratio_vs_torch"] = row["torch_s"] / row[best + "_s"]
        rows.append(row)
        save()
        log(f"  {mode} {m}x{n}x{k}: torch {row['torch_tflops']:.0f} TF/s, best {best} {row['best_tflops']:.0f} "
            f"TF/s, ratio {row['ratio_vs_torch']:.3f} | "
            + " ".join(f"{nm}={flops / row[nm + '_s'] / 1e12:.0f}" for nm in fns)
            + (f" | bf16 matmul {flops / row['bf16_matmul_s'] / 1e12:.0f}" if bf16 is not None else ""))
        del sets
        torch.cuda.empty_cache()
    return rows


class PerShape:
    """A block-scaled kernel compiled per (N, K), on first use (its scales' shape needs static N and K)."""
    per_nk = True

    def __init__(self, mode: str, sched: Schedule, auto: bool = False):
        self.mode, self.sched, self.auto, self.kernels = mode, sched, auto, {}

    def __call__(self, n: int, k: int):
        import gemmc
        if (n, k) not in self.kernels:
            spec = GemmSpec(m="M", n=n, k=k, dtype="f8e4m3", scaling=self.mode, name=f"speed_{self.mode}")
            self.kernels[(n, k)] = gemmc.compile(spec, schedule="auto" if self.auto else self.sched)
        return self.kernels[(n, k)]


def speed_kernels(mode: str) -> dict:
    """name -> a compiled kernel (a, b, sa, sb, out=) or a PerShape; plus `auto`'s choice."""
    import gemmc
    out = {}
    for name, sched in SPEED[mode].items():
        if mode == "block":
            out[name] = PerShape(mode, sched)
        else:
            spec = GemmSpec(m="M", n="N", k="K", dtype="f8e4m3", scaling=mode, name=f"speed_{mode}_{name}")
            out[name] = gemmc.compile(spec, schedule=sched)
    out["auto"] = PerShape(mode, None, auto=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--modes", default="tensor,row,block", help="comma-separated scalings")
    ap.add_argument("--shapes", default="", help="M,N,K;M,N,K ... for the correctness checks")
    ap.add_argument("--speed-shapes", default="", help="M,N,K;... for the timing")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "fp8_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    global WATCHDOG
    if not args.compile_only:
        WATCHDOG = Watchdog(log)
    from gemmc import build
    modes = [m for m in args.modes.split(",") if m]
    names = [n for n in args.only.split(",") if n] or [n for n in VARIANTS if VARIANTS[n][0] in modes]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; use: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    parse = lambda text: [tuple(int(x) for x in s.split(",")) for s in text.split(";")]  # noqa: E731
    shapes = parse(args.shapes) if args.shapes else CHECK_SHAPES
    report = {"variants": {}, "errors": [], "check": [], "speed": []}
    fns = {}
    from gemmc.schedule import is_valid
    for name in names:
        nks = [("N", "K")]
        if static_nk(name):     # the (N, K) of the check shapes the schedule takes (split-K needs enough k-tiles)
            nks = [nk for nk in sorted({(n, k) for _, n, k in shapes}) if is_valid(VARIANTS[name][3],
                                                                                   make_spec(name, *nk))]
            if not nks:
                log(f"skipped {name}: no check shape's N and K suits its schedule")
        for n, k in nks[-1:] if args.compile_only else nks:
            tag = name if (n, k) == ("N", "K") else f"{name}@{n}x{k}"
            try:
                spec, emitted = emitted_for(name, n, k)
                t0 = time.time()
                if args.compile_only:
                    _, ptx = build.compile_with_ptx(emitted)
                    errs = check_ptx(name, ptx)
                    report["errors"] += errs
                    log(f"compiled {tag} in {time.time() - t0:.1f}s ptx={len(ptx)} {'; '.join(errs) or 'PTX ok'}")
                else:
                    fns[tag] = (name, spec, build.jit_callable(emitted))
                    log(f"compiled {tag} in {time.time() - t0:.1f}s")
            except Exception as e:  # keep going: report every variant
                msg = f"{tag}: {type(e).__name__}: {str(e)[:2000]}"
                report["errors"].append(msg)
                log("ERROR " + msg)
    def save():     # after each phase: a run cut short by a time limit keeps what it measured
        (out_dir / "fp8_results.json").write_text(json.dumps(report, indent=1))
        (out_dir / "fp8_log.txt").write_text("\n".join(lines) + "\n")

    if not args.compile_only:
        import torch
        dev = torch.device("cuda")
        report["device"] = torch.cuda.get_device_name()
        save()
        if not args.no_check:
            for tag, (name, spec, fn) in fns.items():
                try:
                    report["check"] += check(name, fn, spec, shapes, dev, log)
                except Exception as e:
                    report["errors"].append(f"{tag} (run): {type(e).__name__}: {str(e)[:2000]}")
                    log(f"ERROR {tag} (run): {type(e).__name__}: {str(e)[:500]}")
            save()
        if not (args.no_timing or args.only):
            speed_shapes = parse(args.speed_shapes) if args.speed_shapes else SPEED_SHAPES
            for mode in modes:
                try:
                    speed(mode, speed_kernels(mode), speed_shapes, dev, log, report["speed"], save)
                except Exception as e:
                    report["errors"].append(f"speed {mode}: {type(e).__name__}: {str(e)[:2000]}")
                    log(f"ERROR speed {mode}: {type(e).__name__}: {str(e)[:500]}")
                save()
    save()
    # short table last
    print("\n== summary ==")
    fails = [c for c in report["check"] if not c["ok"]]
    print(f"checks: {len(report['check']) - len(fails)}/{len(report['check'])} ok; errors: {len(report['errors'])}")
    for f in fails:
        print(f"  FAIL {f['variant']} {f['m']}x{f['n']}x{f['k']} rel_err={f['rel_err']:.2e}")
    for e in report["errors"]:
        print("  ERR", e[:300])
    if report["speed"]:
        print(f"{'scaling':>7s} {'shape':>20s} {'torch TF/s':>10s} {'ours TF/s':>10s} {'ratio':>6s} best")
        for r in report["speed"]:
            print(f"{r['mode']:>7s} {r['m']:>6}x{r['n']}x{r['k']:<6} {r['torch_tflops']:10.1f} {r['best_tflops']:10.1f} "
                  f"{r['ratio_vs_torch']:6.3f} {r['best']}")
        for mode in modes:
            ratios = [r["ratio_vs_torch"] for r in report["speed"] if r["mode"] == mode]
            if ratios:
                geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                report[f"geomean_ratio_{mode}"] = geo
                base = "torch blockwise (dequantize + bf16 matmul)" if mode == "block" else "torch._scaled_mm"
                print(f"geomean ratio vs {base} ({mode}): {geo:.3f}")
        (out_dir / "fp8_results.json").write_text(json.dumps(report, indent=1))
    return 1 if (fails or report["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
