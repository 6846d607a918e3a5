"""A transformer layer's decode GEMMs back to back in one CUDA graph: gemmc against cuBLAS in the same run, with
and without the cross-kernel weight prefetch, and under each L2 eviction priority per operand.

    python bench/decode_chain.py                          # batch 1 and 16, every variant; JSON under $OUT
    python bench/decode_chain.py --batches 1 --variants rules,pf8 --repeats 10
    python bench/decode_chain.py --compile-only           # CPU: lower and compile every variant, check its PTX

The chain is Llama-3-8B's qkv (N 6144, K 4096), o (4096, 4096), gate+up (28672, 4096) and down (4096, 14336) at
M = the batch, for --layers layers (each its own weights: 436 MB a layer, so a weight is never in L2 when it is
used again). Each GEMM reads what the one before it wrote: o reads the first M x 4096 elements of qkv's output,
down the first M x 14336 of gate+up's, the next layer's qkv the down output: a real data dependency, so a
kernel's programmatic dependent launch overlaps the previous kernel's tail and only its weight prefetch may run
before the wait.

gemmc's schedules are `auto`'s picks at that M (the shipped table's), each GEMM's changed by the variant:
  rules        as picked (L2 fields auto: 2 k-tiles of A and B prefetched in the PDL bands' grids)
  pf0          no prefetch before the PDL wait
  pf4 pf8 pf16 that many k-tiles of the weights prefetched before the wait, in every grid
  b-first b-normal b-last   the weights' loads at that L2 eviction priority in every call
  a-last       the activations' loads evict-last
  a-last+out-last           and the TMA store evict-last (unswapped picks only: a swapped kernel's store has no hint)
A field a GEMM's pick cannot take (the predicate refuses it) leaves that GEMM as picked; the report notes it.

Correctness first: every side's chain runs once eagerly into NaN-filled outputs, and each GEMM's output is checked
against the fp32 product of its own inputs (gemmc.reference.checked_error: relative Frobenius error under 1e-2
and every element within its bound); a gemmc side that fails is not timed (cuBLAS, the baseline, is timed
whatever its check says, which the report keeps). Timing: each side's chain repeated in one
CUDA graph of at least --unit-us, all sides interleaved repeat by repeat, the median. The lower bound of a chain
is the bytes it must move (weights, activations read, outputs written) at HBM_BYTES_PER_S; a side's
`bound_fraction` = that bound / its time (1.0 would be the HBM peak, which no kernel reaches).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

FORMAT = "gemmc-decode-chain/1"
# H200 SXM's HBM3e peak (NVIDIA's spec sheet: 4.8 TB/s): the bandwidth of the chain's lower bound
HBM_BYTES_PER_S = 4.8e12
HIDDEN = 4096
GEMMS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
VARIANTS = {
    "rules": {},
    "pf0": {"l2_prefetch": 0}, "pf4": {"l2_prefetch": 4}, "pf8": {"l2_prefetch": 8}, "pf16": {"l2_prefetch": 16},
    "b-first": {"l2_b": "first"}, "b-normal": {"l2_b": "normal"}, "b-last": {"l2_b": "last"},
    "a-last": {"l2_a": "last"}, "a-last+out-last": {"l2_a": "last", "l2_out": "last"},
}
PREFETCH_VARIANTS = ("rules", "pf0", "pf4", "pf8", "pf16")
# the policy words a hinted TMA copy carries in the PTX (CUTLASS's CacheHintSm90)
POLICY_WORDS = {"first": 0x12F0000000000000, "normal": 0x1000000000000000, "last": 0x14F0000000000000}
CHECK_TOLERANCE = 1e-2


def gemm_spec(m: int, n: int, k: int):
    from gemmc.spec import GemmSpec
    return GemmSpec(m=m, n=n, k=k)


# a tuning DB that does not exist: `auto` picks from the shipped table, whatever the host has tuned
NO_TUNING_DB = Path(tempfile.gettempdir()) / "gemmc-decode-chain-no-db" / "tuning.sqlite"


@functools.lru_cache(maxsize=None)
def pick(m: int, n: int, k: int):
    """auto's schedule for the GEMM (the shipped table's pick), the kernel even where auto would run cuBLAS."""
    from gemmc.choose.auto import resolve_auto
    from gemmc.choose.heuristic import choose_schedule
    spec = gemm_spec(m, n, k)
    d = resolve_auto(spec, "sm_90a", db=NO_TUNING_DB, gpu_name="NVIDIA H200")
    return d.schedule if d.schedule is not None else choose_schedule(spec, "sm_90a")


def variant_schedules(m: int, fields: dict) -> tuple[dict, list]:
    """{gemm: schedule} of a variant at batch m, and notes naming the fields a GEMM's pick cannot take (the
    predicate refuses them: that GEMM keeps the pick's value)."""
    from gemmc.schedule import check_schedule
    out, notes = {}, []
    for name, n, k in GEMMS:
        s = pick(m, n, k)
        for field, value in fields.items():
            bad = check_schedule(s.with_(**{field: value}), gemm_spec(m, n, k))
            if bad:
                notes.append(f"{name}: no {field}={value} ({bad[0].limit})")
            else:
                s = s.with_(**{field: value})
        out[name] = s
    return out, notes


def hbm_bound_us(m: int, layers: int) -> float:
    """The chain's compulsory bytes (weights, activations in, outputs out; bf16) at HBM_BYTES_PER_S, in us."""
    per_layer = sum((n * k + m * k + m * n) * 2 for _, n, k in GEMMS)
    return layers * per_layer / HBM_BYTES_PER_S * 1e6


# ---- CPU: compile every variant and check the PTX ----------------------------------------------------------

def ptx_problems(s, ptx: str) -> list[str]:
    """What the PTX of `s` lacks: the policy words of its hinted copies, the prefetches it asks for."""
    errs = []
    for f in ("l2_a", "l2_b", "l2_out"):
        word = POLICY_WORDS.get(getattr(s, f))
        if word is not None and str(word) not in ptx:
            errs.append(f"{f}={getattr(s, f)}: no cache-policy word {word:#x} in the PTX")
    has_prefetch = "cp.async.bulk.prefetch.tensor" in ptx
    if s.l2_prefetch == 0 and has_prefetch:
        errs.append("l2_prefetch=0 but the PTX prefetches")
    if s.l2_prefetch not in (0, "auto") and not has_prefetch:
        errs.append(f"l2_prefetch={s.l2_prefetch} but the PTX has no cp.async.bulk.prefetch.tensor")
    return errs


def compile_only(args, log) -> dict:
    from gemmc.backends.sm90 import emit
    from gemmc.build import compile_with_ptx
    from gemmc.compiler import lower
    report = {"compiled": [], "errors": []}
    done = set()
    for m in args.batches:
        for v in args.variants:
            scheds, notes = variant_schedules(m, VARIANTS[v])
            for name, n, k in GEMMS:
                s = scheds[name]
                if name not in args.gemms or (m, n, k, s) in done:
                    continue
                done.add((m, n, k, s))
                t0 = time.time()
                try:
                    ptx = compile_with_ptx(emit(lower(gemm_spec(m, n, k), s)[1]))[1]
                    errs = ptx_problems(s, ptx)
                except Exception as e:  # noqa: BLE001  every variant is reported
                    errs = [f"{type(e).__name__}: {str(e)[:500]}"]
                report["compiled"].append({"m": m, "gemm": name, "variant": v, "schedule": s.short(),
                                           "errors": errs, "notes": notes})
                report["errors"] += [f"M={m} {name} {v}: {e}" for e in errs]
                log(f"M={m:<3} {name:8} {v:16} {s.short():52} {time.time() - t0:5.1f}s "
                    + ("; ".join(errs) if errs else "PTX ok"))
    return report


# ---- GPU ------------------------------------------------------------------------------------------------------

class Chain:
    """One side's buffers and calls: layers x GEMMS, each reading what the previous GEMM wrote."""

    def __init__(self, m: int, weights: list, fns: dict, x):
        import torch
        self.m, self.weights, self.fns, self.x = m, weights, fns, x
        self.outs = [{name: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for name, n, _ in GEMMS}
                     for _ in weights]

    def steps(self):
        """(layer, gemm, its input, its weight, its output) in launch order."""
        prev = self.x
        for layer, outs in enumerate(self.outs):
            for name, n, k in GEMMS:
                src = prev if name in ("qkv", "gate_up") else prev.reshape(-1)[: self.m * k].view(self.m, k)
                yield layer, name, src, self.weights[layer][name], outs[name]
                prev = outs[name]

    def __call__(self):
        for _, name, src, w, out in self.steps():
            self.fns[name](src, w, out=out)


def check_chain(chain: Chain) -> list[str]:
    """Run the chain once into NaN-filled outputs; the steps whose output fails its check."""
    import torch
    from gemmc.reference import checked_error
    for outs in chain.outs:
        for o in outs.values():
            o.fill_(float("nan"))
    chain()
    torch.cuda.synchronize()
    fails = []
    for layer, name, src, w, out in chain.steps():
        err = checked_error(gemm_spec(chain.m, w.shape[0], w.shape[1]), out, src, w)
        if not err < CHECK_TOLERANCE:
            fails.append(f"layer {layer} {name}: error {err:.3g}")
    return fails


def prebuild(jobs: list, workers: int, log) -> None:
    """Compile the (shape, schedule) kernels in parallel worker processes into the disk cache."""
    from gemmc.bench.compile_pool import CompilePool
    t0 = time.time()
    results = CompilePool(jobs, workers, dtype="bf16", arch="sm_90a").collect(time.perf_counter() + 900)
    bad = [r for r in results.values() if not r.get("ok")]
    log(f"prebuilt {len(jobs)} kernels in {time.time() - t0:.0f}s ({len(bad)} failed)")


def run_gpu(args, log) -> dict:
    import torch
    from gemmc.bench.report import collect_environment
    from gemmc.bench.timing import CudaClock, compile_gemmc, cublas_matmul, paired_ratio, spin_up, time_interleaved
    from gemmc.bench.suites import Shape

    plans = {m: {v: variant_schedules(m, VARIANTS[v]) for v in args.variants} for m in args.batches}
    jobs = {(m, n, k, s) for m, vs in plans.items() for scheds, _ in vs.values()
            for (name, n, k) in GEMMS for s in [scheds[name]]}
    prebuild([{"m": m, "n": n, "k": k, "policy": s.to_dict()} for m, n, k, s in sorted(jobs, key=str)],
             args.workers, log)
    report = {"format": FORMAT, "environment": collect_environment(), "hbm_bytes_per_s": HBM_BYTES_PER_S,
              "config": {k: v for k, v in vars(args).items() if k != "compile_only"}, "batches": {}}
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [{name: torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=gen) / math.sqrt(k)
                for name, n, k in GEMMS} for _ in range(args.layers)]
    clock = CudaClock(graphs=True)
    for m in args.batches:
        x = torch.randn(m, HIDDEN, dtype=torch.bfloat16, device="cuda", generator=gen)
        sides, entry = {"cublas": Chain(m, weights, {name: cublas_matmul for name, _, _ in GEMMS}, x)}, {}
        for v, (scheds, notes) in plans[m].items():
            try:
                fns = {name: compile_gemmc(Shape(m, n, k), scheds[name]) for name, n, k in GEMMS}
                sides[v] = Chain(m, weights, fns, x)
            except Exception as e:  # noqa: BLE001
                entry[v] = {"error": f"build: {type(e).__name__}: {str(e)[:500]}"}
            entry.setdefault(v, {}).update({"schedules": {g: s.short() for g, s in scheds.items()}, "notes": notes})
        for name in list(sides):
            fails = check_chain(sides[name])
            if fails and name == "cublas":      # the baseline stays timed; its figures say how far off it was
                log(f"M={m} cublas: outside gemmc's bound (still timed): {'; '.join(fails[:3])}")
                entry.setdefault(name, {})["check"] = "; ".join(fails)
            elif fails:
                log(f"M={m} {name}: FAILED its check: {'; '.join(fails[:3])}")
                entry.setdefault(name, {})["error"] = "check: " + "; ".join(fails)
                del sides[name]
        spin_up()
        probe = clock.prepare([sides["cublas"]])
        clock.time_ms(probe)
        est_us = 1000 * min(clock.time_ms(probe) for _ in range(3))
        reps = max(1, math.ceil(args.unit_us / est_us))
        units = {name: clock.prepare([chain] * reps) for name, chain in sides.items()}
        samples = time_interleaved(units, clock, args.repeats)
        bound = hbm_bound_us(m, args.layers)
        cub = samples["cublas"]
        for name in sides:
            us = statistics.median(samples[name]) * 1000 / reps
            row = entry.setdefault(name, {})
            row.update({"time_us": us, "bound_fraction": bound / us, "samples_ms": samples[name]})
            if name != "cublas":
                row["ratio_vs_cublas"] = paired_ratio(cub, samples[name])
        timed = [v for v in args.variants if "time_us" in entry.get(v, {})]
        best = {}
        for operand, prefix in (("weights (b)", "b-"), ("activations (a)", "a-")):
            cands = [v for v in timed if v.startswith(prefix)] + (["rules"] if "rules" in timed else [])
            if cands:
                best[operand] = min(cands, key=lambda v: entry[v]["time_us"])
        pf = [v for v in PREFETCH_VARIANTS if v in timed]
        report["batches"][str(m)] = {"bound_us": bound, "reps_per_unit": reps, "picks": {
            name: pick(m, n, k).short() for name, n, k in GEMMS}, "sides": entry, "best_eviction": best,
            "best_prefetch": min(pf, key=lambda v: entry[v]["time_us"]) if pf else None}
        del units, sides
        torch.cuda.empty_cache()
    return report


def print_table(report: dict) -> None:
    print("\n== decode chain: time per chain (layers x [qkv, o, gate+up, down]) ==")
    print(f"lower bound = compulsory bytes at {HBM_BYTES_PER_S / 1e12:.1f} TB/s (H200 HBM3e peak); "
          "bound = bound / time; ratio = cuBLAS time / this side's (paired per repeat)")
    for m, b in report["batches"].items():
        if "error" in b:
            print(f"M={m}: {b['error']}")
            continue
        print(f"M={m}: lower bound {b['bound_us']:.1f} us; best prefetch {b['best_prefetch']}; best eviction "
              + ", ".join(f"{k}: {v}" for k, v in b["best_eviction"].items()))
        print(f"  {'side':18} {'us':>9} {'bound':>6} {'ratio':>6}  notes")
        for name, row in b["sides"].items():
            if "time_us" not in row:
                print(f"  {name:18} {row.get('error', 'not timed')}")
                continue
            ratio = f"{row['ratio_vs_cublas']:6.3f}" if "ratio_vs_cublas" in row else f"{'-':>6}"
            print(f"  {name:18} {row['time_us']:9.1f} {row['bound_fraction']:6.3f} {ratio}  "
                  + "; ".join(row.get("notes", [])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,16", help="comma list of M (default 1,16)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--gemms", default=",".join(g for g, _, _ in GEMMS), help="--compile-only: the GEMMs to build")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20, help="timed units per side (default 20)")
    ap.add_argument("--unit-us", type=float, default=2000.0, help="a timed unit's length (default 2000 us)")
    ap.add_argument("--workers", type=int, default=8, help="compile processes (default 8)")
    ap.add_argument("--compile-only", action="store_true", help="CPU: compile every variant and check its PTX")
    ap.add_argument("--out", default=os.environ.get("OUT") or "decode_chain_out", help="folder of the JSON report")
    args = ap.parse_args(argv)
    args.batches = [int(x) for x in args.batches.split(",") if x.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.gemms = [g.strip() for g in args.gemms.split(",") if g.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant {unknown[0]!r}; use {', '.join(VARIANTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line):
        print(line, flush=True)
    if args.compile_only:
        report = compile_only(args, log)
        (out / "decode_chain_compile.json").write_text(json.dumps(report, indent=1))
        print(f"\n== compile-only: {len(report['compiled'])} kernels, {len(report['errors'])} problems ==")
        for e in report["errors"]:
            print("  " + e)
        return 1 if report["errors"] else 0
    report = run_gpu(args, log)
    (out / "decode_chain.json").write_text(json.dumps(report, indent=1))
    print_table(report)
    failed = any("error" in b or any("error" in r for r in b.get("sides", {}).values())
                 for b in report["batches"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
