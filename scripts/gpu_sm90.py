"""SM90 backend: correctness on the GPU, then speed side by side with torch.matmul (cuBLAS).

    python3 scripts/gpu_sm90.py                 # correctness + timing, JSON under $OUT (or ./sm90_out)
    python3 scripts/gpu_sm90.py --compile-only  # CPU: emit + compile every variant, check the PTX
    python3 scripts/gpu_sm90.py --only coop_tn_c1x1 --shapes 64,64,64 --no-timing   # e.g. under compute-sanitizer

Correctness: fp32 torch reference of the upcast inputs, output pre-filled with NaN, relative Frobenius
error < 1e-2 and every element within gemmc.reference's elementwise bound (`checked_error`). Timing: bf16 randn inputs, CUDA graphs, rotating input sets >= 2x L2 (L2 = 60 MB),
median of repeats; ours and torch.matmul interleaved in one process.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemmc.backends.sm90 import emit  # noqa: E402
from gemmc.bench.watchdog import Watchdog  # noqa: E402
from gemmc.compiler import lower  # noqa: E402
from gemmc.reference import checked_error, make_inputs  # noqa: E402
from gemmc.schedule import Schedule  # noqa: E402
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref  # noqa: E402

L2_BYTES = 60 * 2**20

A, I, C, N = Ref.acc, Ref.input, Ref.const, Ref.node

EPI_BIAS_GELU = dict(
    inputs=(EpilogueInput("bias", "row", "bf16"), EpilogueInput("res", "full", "bf16"),
            EpilogueInput("alpha", "scalar")),
    epilogue=(EpilogueOp("mul", (A(), I("alpha"))), EpilogueOp("add", (N(0), I("bias"))),
              EpilogueOp("gelu_tanh", (N(1),)), EpilogueOp("add", (N(2), I("res")))),
)
EPI_COL_SILU = dict(
    inputs=(EpilogueInput("colscale", "col", "f32"),),
    epilogue=(EpilogueOp("mul", (A(), I("colscale"))), EpilogueOp("silu", (N(0),)),
              EpilogueOp("clamp", (N(1),), (("min", -2.0), ("max", 3.0)))),
)
EPI_ACTS = dict(
    inputs=(EpilogueInput("bias", "row", "f32"),),
    epilogue=(EpilogueOp("sub", (A(), I("bias"))), EpilogueOp("relu", (N(0),)), EpilogueOp("sigmoid", (A(),)),
              EpilogueOp("add", (N(1), N(2))), EpilogueOp("tanh", (A(),)), EpilogueOp("gelu_erf", (N(4),)),
              EpilogueOp("div", (N(3), C(2.0))), EpilogueOp("add", (N(6), N(5))),
              EpilogueOp("cast", (N(7),), (("dtype", "f16"),))),
)

EPI_BIAS_RELU_RES = dict(
    inputs=(EpilogueInput("bias", "row", "bf16"), EpilogueInput("res", "full", "bf16")),
    epilogue=(EpilogueOp("add", (A(), I("bias"))), EpilogueOp("relu", (N(0),)), EpilogueOp("add", (N(1), I("res")))),
)

S = Schedule
# name -> (spec kwargs, schedule)
VARIANTS = {
    "coop_tn_c1x1": ({}, S((128, 256, 64))),
    "coop_tn_c2x1": ({}, S((128, 256, 64), (2, 1))),
    "coop_tn_c1x2": ({}, S((128, 256, 64), (1, 2))),
    "coop_tn_c2x2_sw8n": ({}, S((128, 128, 64), (2, 2), raster="n", swizzle=8)),
    # swizzle groups wider than what is left of the grid: the last group is narrower, not padded
    "pp_tn_c2x1_sw4m_batched": (dict(batch="L"), S((128, 128, 64), (2, 1), mode="pingpong", swizzle=4)),
    "splitk2_c1x2_sw8m": ({}, S((128, 128, 64), (1, 2), swizzle=8, split_k=2)),
    "coop_nn_256x128": (dict(a_layout="km", b_layout="kn"), S((256, 128, 64), (2, 1))),
    "coop_tt": (dict(b_layout="kn"), S((128, 128, 64))),
    "coop_nt": (dict(a_layout="km"), S((128, 128, 64), (1, 2))),
    "coop_f16_batched": (dict(dtype="f16", batch="L"), S((128, 128, 64), (2, 1))),
    "coop_f16acc": (dict(dtype="f16", acc_dtype="f16"), S((128, 256, 64))),
    "coop_out_f32": (dict(out_dtype="f32"), S((128, 128, 64))),
    "coop_epi_bias_gelu": (EPI_BIAS_GELU, S((128, 256, 64), (2, 1))),
    "coop_epi_col_silu": (EPI_COL_SILU, S((128, 128, 64))),
    "coop_epi_acts": (EPI_ACTS, S((128, 128, 64))),
    "pp_tn_128x128": ({}, S((128, 128, 64), mode="pingpong")),
    "pp_tn_c2x1": ({}, S((128, 128, 64), (2, 1), mode="pingpong")),
    "pp_nn_64x256": (dict(a_layout="km", b_layout="kn"), S((64, 256, 64), mode="pingpong")),
    "pp_epi_batched": (dict(batch="L", **EPI_COL_SILU), S((128, 128, 64), mode="pingpong")),
    "pp_epi_res_c1x2": (EPI_BIAS_GELU, S((128, 128, 64), (1, 2), mode="pingpong")),
    "splitk2_tn": ({}, S((128, 128, 64), split_k=2)),
    "splitk4_epi": (EPI_BIAS_GELU, S((128, 128, 64), (2, 1), split_k=4)),
    "splitk3_pp_batched": (dict(batch="L"), S((128, 128, 64), mode="pingpong", split_k=3)),
    # wave-balancing N tiles (96, 160, 224): not powers of two, so the edges and swizzle atoms differ
    "pp_tn_64x224_c1x2": ({}, S((64, 224, 64), (1, 2), mode="pingpong")),
    "coop_nn_128x160_c2x1": (dict(a_layout="km", b_layout="kn"), S((128, 160, 64), (2, 1))),
    "coop_tt_128x224_c2x1": (dict(b_layout="kn"), S((128, 224, 64), (2, 1))),
    "pp_epi_64x96_c2x1": (EPI_BIAS_GELU, S((64, 96, 64), (2, 1), mode="pingpong")),
    "splitk2_pp_64x160": ({}, S((64, 160, 64), mode="pingpong", split_k=2)),
    # 192-row cooperative tiles: the two consumer warpgroups split the columns (three 64-row WGMMAs each)
    "coop_tn_192x192_c1x2_sw8m": ({}, S((192, 192, 64), (1, 2), swizzle=8)),
    "coop_epi_192x128_c1x2_sw8m": (EPI_BIAS_RELU_RES, S((192, 128, 64), (1, 2), swizzle=8)),
    # N tiles that 32 does not divide: 16-column epilogue sub-tiles (with a TMA-loaded residual)
    "pp_tn_64x48x128": ({}, S((64, 48, 128), mode="pingpong")),
    "coop_epi_128x80x128": (EPI_BIAS_RELU_RES, S((128, 80, 128))),
    "pp_tn_64x112x128_c1x2": ({}, S((64, 112, 128), (1, 2), mode="pingpong")),
    # stream-K: whole waves data-parallel, the last ones' (tile, k-tile) iterations shared out; split tiles fixed up
    "streamk_tn_128x128": ({}, S((128, 128, 64), stream_k=True)),
    "streamk_tn_128x64_c1x2": ({}, S((128, 64, 64), (1, 2), stream_k=True)),
    "streamk_tn_128x256_c2x1_sw8n": ({}, S((128, 256, 64), (2, 1), raster="n", swizzle=8, stream_k=True)),
    "streamk_swap_128x32_c2x1": ({}, S((128, 32, 64), (2, 1), swap_ab=True, stream_k=True)),
    # swapped split-K (the in-kernel fix-up), with the row and full epilogue inputs read from global memory
    "splitk2_swap_pp_64x8x128": ({}, S((64, 8, 128), mode="pingpong", stages=10, split_k=2, swap_ab=True)),
    "splitk3_swap_epi_128x16_c1x2": (EPI_BIAS_RELU_RES, S((128, 16, 64), (1, 2), split_k=3, swap_ab=True)),
    "streamk_epi_256x128_c1x2_batched": (dict(EPI_BIAS_RELU_RES, batch="L"), S((256, 128, 64), (1, 2), stream_k=True)),
}
# hand-picked schedules for the speed comparison (one compiled kernel serves every shape)
SPEED = {
    "coop_128x256_c2x1": S((128, 256, 64), (2, 1)),
    "coop_128x256_c2x1_sw8": S((128, 256, 64), (2, 1), swizzle=8),
    "coop_128x256_c1x2": S((128, 256, 64), (1, 2)),
    "coop_256x128_c1x2": S((256, 128, 64), (1, 2)),
    "pp_128x128_c2x1": S((128, 128, 64), (2, 1), mode="pingpong"),
    "pp_128x128_c2x1_sw8": S((128, 128, 64), (2, 1), mode="pingpong", swizzle=8),
}
# issue 3's shapes: 2048^3 .. 16384^3 and the Llama-3 prefill shapes (M=4096)
SPEED_SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384),
                (4096, 6144, 4096), (4096, 4096, 4096), (4096, 28672, 4096), (4096, 4096, 14336),
                (4096, 10240, 8192), (4096, 8192, 8192), (4096, 57344, 8192), (4096, 8192, 28672)]
CHECK_SHAPES = [(1, 64, 64), (77, 392, 136), (1000, 264, 1032), (256, 512, 4096), (2048, 2048, 512)]


def make_spec(kw: dict) -> GemmSpec:
    return GemmSpec(**kw)


def emitted_for(name: str):
    kw, sched = VARIANTS[name] if name in VARIANTS else ({}, SPEED[name])
    spec = make_spec(kw)
    return spec, emit(lower(spec, sched, "sm_90a")[1])


def check_ptx(name: str, ptx: str, sched: Schedule) -> list[str]:
    errs = []
    for w in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        if w not in ptx:
            errs.append(f"{name}: PTX lacks {w}")
    mc = ".multicast::cluster" in ptx
    if mc != (sched.cluster[0] * sched.cluster[1] > 1):
        errs.append(f"{name}: multicast in PTX = {mc} for cluster {sched.cluster}")
    return errs


# ---- torch side (inputs, fp32 reference and error: gemmc.reference) ---------------------------------

WATCHDOG = None


def check(name, fn, spec, shapes, dev, log):
    import torch
    from gemmc.types import torch_dtype
    gen = torch.Generator(device=dev).manual_seed(0)
    results = []
    for (m, n, k) in shapes:
        if spec.a_layout == "km" or any(i.kind == "col" for i in spec.inputs):
            m = -(-m // 8) * 8      # M is a contiguous dim here: 16-byte alignment
        batch = 3 if spec.batch is not None else 1
        a, b, extra = make_inputs(spec, m, n, k, batch, device=dev, generator=gen)
        lead = (batch,) if spec.batch is not None else ()
        out = torch.full(lead + (m, n), float("nan"), device=dev, dtype=torch_dtype(spec.out_dtype))
        t0 = time.time()
        if WATCHDOG:
            WATCHDOG.arm(f"{name} {m}x{n}x{k}", 60)
        fn(a, b, *extra, out=out)
        torch.cuda.synchronize()
        err = checked_error(spec, out, a, b, extra)
        ok = err < 1e-2
        results.append({"variant": name, "m": m, "n": n, "k": k, "batch": batch, "rel_err": err, "ok": ok})
        log(f"  {name:24s} {m}x{n}x{k}{'x' + str(batch) if lead else ''}: rel_err={err:.2e} {'OK' if ok else 'FAIL'}"
            f" ({time.time() - t0:.2f}s)")
    return results


def time_graph(calls, reps=10) -> float:
    """Median seconds per call of `calls` (a list of zero-arg launches over rotating inputs) in a CUDA graph."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:   # warm up (and allocate) outside the graph
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    inner = max(1, math.ceil(20 / len(calls)))
    with torch.cuda.graph(g):
        for _ in range(inner):
            for c in calls:
                c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / (inner * len(calls)))
    return statistics.median(times)


def speed(fns: dict, shapes, dev, log):
    import torch
    rows = []
    for (m, n, k) in shapes:
        if WATCHDOG:
            WATCHDOG.arm(f"timing {m}x{n}x{k}", 90)
        set_bytes = (m * k + n * k + m * n) * 2
        nsets = max(2, math.ceil(2 * L2_BYTES / set_bytes))
        gen = torch.Generator(device=dev).manual_seed(1)
        sets = [(torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen),
                 torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen),
                 torch.empty(m, n, device=dev, dtype=torch.bfloat16)) for _ in range(nsets)]
        flops = 2.0 * m * n * k
        row = {"m": m, "n": n, "k": k, "input_sets": nsets}
        # torch, then every schedule of ours, then torch again (keep torch's better median)
        row["torch_s"] = time_graph([lambda a=a, b=b, o=o: torch.matmul(a, b.t(), out=o) for a, b, o in sets])
        for name, fn in fns.items():
            row[name + "_s"] = time_graph([lambda a=a, b=b, o=o, fn=fn: fn(a, b, out=o) for a, b, o in sets])
        row["torch_s"] = min(row["torch_s"], time_graph(
            [lambda a=a, b=b, o=o: torch.matmul(a, b.t(), out=o) for a, b, o in sets]))
        best = min(fns, key=lambda nm: row[nm + "_s"])
        row["best"] = best
        row["torch_tflops"] = flops / row["torch_s"] / 1e12
        row["best_tflops"] = flops / row[best + "_s"] / 1e12
        row["ratio_vs_torch"] = row["torch_s"] / row[best + "_s"]
        rows.append(row)
        log(f"  {m}x{n}x{k}: torch {row['torch_tflops']:.0f} TF/s, best {best} {row['best_tflops']:.0f} TF/s, "
            f"ratio {row['ratio_vs_torch']:.3f} | " + " ".join(f"{nm}={flops / row[nm + '_s'] / 1e12:.0f}"
                                                                for nm in fns))
        del sets
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "sm90_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    global WATCHDOG
    if not args.compile_only:
        WATCHDOG = Watchdog(log)
    from gemmc import build
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    speed_names = [] if (args.only or args.no_timing) else list(SPEED)
    shapes = ([tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")] if args.shapes
              else CHECK_SHAPES)
    report = {"variants": {}, "errors": [], "check": [], "speed": []}
    fns = {}
    for name in names + speed_names:
        sched = VARIANTS[name][1] if name in VARIANTS else SPEED[name]
        try:
            spec, k = emitted_for(name)
            t0 = time.time()
            if args.compile_only:
                _, ptx = build.compile_with_ptx(k)
                errs = check_ptx(name, ptx, sched)
                report["errors"] += errs
                log(f"compiled {name} in {time.time() - t0:.1f}s ptx={len(ptx)} {'; '.join(errs) or 'PTX ok'}")
            else:
                fns[name] = (spec, build.jit_callable(k))
                log(f"compiled {name} in {time.time() - t0:.1f}s")
        except Exception as e:  # keep going: report every variant
            msg = f"{name}: {type(e).__name__}: {str(e)[:2000]}"
            report["errors"].append(msg)
            log("ERROR " + msg)
    if not args.compile_only:
        import torch
        dev = torch.device("cuda")
        report["device"] = torch.cuda.get_device_name()
        if not args.no_check:
            for name in names:
                if name in fns:
                    spec, fn = fns[name]
                    try:
                        report["check"] += check(name, fn, spec, shapes, dev, log)
                    except Exception as e:
                        report["errors"].append(f"{name} (run): {type(e).__name__}: {str(e)[:2000]}")
                        log(f"ERROR {name} (run): {type(e).__name__}: {str(e)[:500]}")
        if speed_names:
            # only schedules whose correctness holds on a sample shape are timed
            sp = {}
            for nm in speed_names:
                if nm in fns:
                    r = check(nm, fns[nm][1], fns[nm][0], [(2048, 2048, 2048), (333, 4096, 1024)], dev, log)
                    report["check"] += r
                    if all(x["ok"] for x in r):
                        sp[nm] = fns[nm][1]
            if sp:
                report["speed"] = speed(sp, list(dict.fromkeys(SPEED_SHAPES)), dev, log)
                ratios = [r["ratio_vs_torch"] for r in report["speed"]]
                report["geomean_ratio_vs_torch"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    (out_dir / "sm90_results.json").write_text(json.dumps(report, indent=1))
    # short table last
    print("\n== summary ==")
    fails = [c for c in report["check"] if not c["ok"]]
    print(f"checks: {len(report['check']) - len(fails)}/{len(report['check'])} ok; errors: {len(report['errors'])}")
    for f in fails:
        print(f"  FAIL {f['variant']} {f['m']}x{f['n']}x{f['k']} rel_err={f['rel_err']:.2e}")
    for e in report["errors"]:
        print("  ERR", e[:300])
    if report["speed"]:
        print(f"{'shape':>20s} {'torch TF/s':>10s} {'ours TF/s':>10s} {'ratio':>6s} best")
        for r in report["speed"]:
            print(f"{r['m']}x{r['n']}x{r['k']:>6} {r['torch_tflops']:10.1f} {r['best_tflops']:10.1f} "
                  f"{r['ratio_vs_torch']:6.3f} {r['best']}")
        print(f"geomean ratio vs torch.matmul: {report['geomean_ratio_vs_torch']:.3f}")
    return 1 if (fails or report["errors"]) else 0


if __name__ == "__main__":
    sys.exit(main())
