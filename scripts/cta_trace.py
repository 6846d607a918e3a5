"""Where does a kernel's time go, CTA by CTA? Times each shape's SM90 kernel beside a traced copy of it,
and torch.matmul (cuBLAS), in back-to-back CUDA graphs, and prints per-launch timelines.

The traced copy (the same generated module over an edited copy of the kernel modules, scripts/kernel_edit.py)
writes globaltimer stamps per CTA into a device buffer whose address is baked into its source: launch (kernel
entry), go (griddepcontrol.wait returned: the previous grid is done), mma (the first consumer warpgroup's last
main loop drained), end (each consumer warpgroup's last store issued; a CTA ends with the later), and the SM
id. The buffer keeps the last TRACE_SLOTS launches. From consecutive launches it reports:
  period  first go to the next launch's first go (the time per call)
  gap     the previous launch's last end to this launch's first go (grid completion + release)
  span    first go to last end;  dur  each CTA's go to end (min / median / max, and their harmonic mean:
          what a perfectly balanced split of the same work would take)
  tail    last mma to last end (epilogue)
The stamps cost one load per CTA after the grid wait and a few stores; the TMA issuer and the k-loops are
untouched. globaltimer ticks in 32 ns steps on the H200 but updates about every 256 ns.

    python3 scripts/cta_trace.py plan.json                 # GPU: JSON under $OUT (or ./trace_out), table last
    python3 scripts/cta_trace.py plan.json --compile-only  # CPU: emit, edit and compile every traced kernel

plan.json: {"MxNxK": ["<schedule string>", ...]}. Each kernel is checked first against an fp32 reference
of the upcast inputs, output NaN-filled (the traced one too). Timing: bf16 randn inputs, CUDA graphs, input
sets rotated through >= 2x L2, median over repeats (gemmc.bench.timing).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemmc  # noqa: E402
from gemmc.bench.policy import parse_schedule  # noqa: E402
from gemmc.compiled import CompiledKernel  # noqa: E402
from kernel_edit import edited_kernel, expect, kernel_sources  # noqa: E402

TRACE_MAXCTA = 1024
TRACE_SLOTS = 8
FIELDS = ("launch", "go", "end", "smid", "mma", "end1")
TRACE_LEN = TRACE_MAXCTA * (1 + TRACE_SLOTS * len(FIELDS))

# anchors: gemm.py's kernel (its entry, the grid-dependency wait), consumer.py (the main loop drained, the
# consumer loop's start and its last store)
_HEAD = "        warp_group_idx = cute.arch.make_warp_uniform(tidx // 128)\n"
_WAIT = "            cute.arch.griddepcontrol_wait()\n"
_MMA_DONE = "        warpgroup.wait_group(0)\n"
_CONSUME = "        consumer_tidx, warp_idx, warp_group_idx, consumer_wg = thread\n"
_TAIL = "\n        store_pipeline.producer_tail()\n"


def _slot(field: str, n: str = "_n") -> str:
    return (f"_tr[TRACE_MAXCTA + (({n} % TRACE_SLOTS) * TRACE_MAXCTA + _bid) * {len(FIELDS)} + "
            f"{FIELDS.index(field)}]")


def _buffer(indent: str) -> str:
    """Lines binding _tr (the trace buffer) and _bid (this CTA's linear index)."""
    return "".join(indent + line + "\n" for line in (
        "_tr = cute.make_tensor(cute.make_ptr(cutlass.Int64, TRACE_ADDR, cute.AddressSpace.gmem, "
        "assumed_align=8), cute.make_layout(TRACE_LEN))",
        "_bx, _by, _bz = cute.arch.block_idx()",
        "_gx, _gy, _gz = cute.arch.grid_dim()",
        "_bid = _bx + _by * _gx + _bz * _gx * _gy"))


def _insert_after(text: str, anchor: str, lines: str, last: bool = False) -> str:
    i = (text.rindex(anchor) if last else text.index(anchor)) + len(anchor)
    return text[:i] + lines + text[i:]


def edit_modules(address: int, sources: Optional[dict] = None) -> dict:
    """The SM90 kernel modules' source (`sources`, default gemmc's) with the stamps (module docstring)
    written to `address`."""
    out = dict(sources or kernel_sources())
    gemm, consumer = out["gemm"], out["consumer"]
    for text, anchor, want, what in ((gemm, _HEAD, 1, "the warpgroup index"),
                                     (gemm, _WAIT, 1, "the grid-dependency wait"),
                                     (consumer, _MMA_DONE, 1, "the consumer's drained main loop"),
                                     (consumer, _CONSUME, 1, "the consumer loop's start"),
                                     (consumer, _TAIL, None, "the last store")):
        expect(text.count(anchor), want, what, "cta_trace.py")
    consts = (f"\n\n# scripts/cta_trace.py: the trace buffer\nTRACE_ADDR = {address}\nTRACE_MAXCTA = {TRACE_MAXCTA}\n"
              f"TRACE_SLOTS = {TRACE_SLOTS}\nTRACE_LEN = {TRACE_LEN}\n")
    gemm = _insert_after(gemm, _HEAD, _buffer(" " * 8) + "        _t_launch = cutlass.Int64(cute.arch.globaltimer())\n")
    # every thread reads the launch count after the grid wait (the previous grid has bumped it), before any
    # warpgroup can finish and bump it; the consumers take it from the kernel object (a trace-time value).
    # An idle producer warp stamps, so the TMA issuer never waits on it.
    gemm = _insert_after(gemm, _WAIT, (
        "            _n = _tr[_bid]\n"
        "            self._trace_n = _n\n"
        "            if tidx == 32:\n"
        f"                {_slot('launch')} = _t_launch\n"
        f"                {_slot('go')} = cutlass.Int64(cute.arch.globaltimer())\n"
        f"                {_slot('smid')} = cutlass.Int64(cute.arch.smid())\n"))
    consumer = _insert_after(consumer, _MMA_DONE, (
        "        if cute.arch.thread_idx()[0] == 128:\n" + _buffer(" " * 12) +
        f"            {_slot('mma', n='_tr[_bid]')} = cutlass.Int64(cute.arch.globaltimer())\n"))
    # the launch count is bumped at the very end, by the first consumer warpgroup
    consumer = _insert_after(consumer, _CONSUME, _buffer(" " * 8) + (
        "        _n = self._trace_n\n"
        "        _tidx = cute.arch.thread_idx()[0]\n"))
    # each consumer warpgroup stamps its own end: under ping-pong the second one may finish last
    consumer = _insert_after(consumer, _TAIL, (
        "        if _tidx == 128:\n"
        f"            {_slot('end')} = cutlass.Int64(cute.arch.globaltimer())\n"
        "            _tr[_bid] = _n + 1\n"
        "        if _tidx == 256:\n"
        f"            {_slot('end1')} = cutlass.Int64(cute.arch.globaltimer())\n"), last=True)
    out["gemm"], out["consumer"] = gemm + consts, consumer + consts
    return out


def traced(kernel, address: int) -> CompiledKernel:
    """`kernel` (SM90, pdl on) built over the stamped kernel modules."""
    if "\nPDL = True" not in kernel.emitted.source:
        raise ValueError("the stamps key launches on the grid-dependency wait: trace kernels with pdl on")
    return edited_kernel(kernel, edit_modules(address), "cta_trace.py")


def launches_of(buf) -> list:
    """The recorded launches, oldest first: per launch an array (CTAs, FIELDS) of int64 stamps."""
    import numpy as np
    t = buf.cpu().numpy()
    counts = t[:TRACE_MAXCTA]
    grid = int((counts > 0).sum())
    if grid == 0:
        return []
    last = int(counts[:grid].max()) - 1
    rec = t[TRACE_MAXCTA:].reshape(TRACE_SLOTS, TRACE_MAXCTA, len(FIELDS))[:, :grid]
    first = max(int(counts[:grid].min()) - TRACE_SLOTS, 0)
    return [np.asarray(rec[n % TRACE_SLOTS], dtype=np.float64) for n in range(first, last + 1)]


def timeline(launches: list) -> dict:
    """Medians over consecutive launch pairs of the quantities in the module docstring (microseconds)."""
    import numpy as np
    f = {name: i for i, name in enumerate(FIELDS)}
    end = lambda x: np.maximum(x[:, f["end"]], x[:, f["end1"]])     # noqa: E731  the CTA's last warpgroup
    pairs = []
    for prev, cur in zip(launches, launches[1:]):
        go0 = cur[:, f["go"]].min()
        dur = end(cur) - cur[:, f["go"]]
        pairs.append({"period": go0 - prev[:, f["go"]].min(), "gap": go0 - end(prev).max(),
                      "span": end(cur).max() - go0, "dur_min": dur.min(),
                      "dur_median": float(statistics.median(dur)), "dur_max": dur.max(),
                      "dur_harmonic": len(dur) / float((1.0 / dur).sum()),
                      "tail": end(cur).max() - cur[:, f["mma"]].max()})
    if not pairs:
        return {}
    return {k: round(statistics.median(p[k] for p in pairs) / 1000.0, 3) for k in pairs[0]} | {
        "ctas": int(launches[-1].shape[0]), "pairs": len(pairs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    plan = json.loads(Path(args.plan).read_text())
    jobs = [(shape, name) for shape, names in plan.items() for name in names]
    if args.compile_only:
        for shape, name in jobs:
            m, n, k = map(int, shape.split("x"))
            kk = gemmc.compile(gemmc.GemmSpec(m=m, n=n, k=k), schedule=parse_schedule(name))
            traced(kk, 1 << 40).build()
            print(f"built {shape} {name} traced", flush=True)
        return

    import torch
    from gemmc.bench.suites import Shape
    from gemmc.bench.timing import CudaClock, spin_up, time_side_by_side
    out_dir = Path(os.environ.get("OUT", "trace_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = CudaClock(graphs=True)
    spin_up(1.0)
    rows = []
    for shape, names in plan.items():
        m, n, k = map(int, shape.split("x"))
        kernels, bufs = {}, {}
        for name in names:
            kk = gemmc.compile(gemmc.GemmSpec(m=m, n=n, k=k), schedule=parse_schedule(name))
            bufs[name] = torch.zeros(TRACE_LEN, dtype=torch.int64, device="cuda")
            kernels[name], kernels[name + " traced"] = kk, traced(kk, bufs[name].data_ptr())
        try:
            res = time_side_by_side(Shape(m, n, k), kernels, clock, repeats=args.repeats)
        except ValueError as e:
            raise SystemExit(str(e))
        us = res["us"]
        for name, buf in bufs.items():
            clock.time_ms(res["units"][name + " traced"])      # the buffer holds this unit's last launches
            row = {"shape": shape, "schedule": name, "us": us[name], "traced_us": us[name + " traced"],
                   "cublas_us": us["cublas"], **timeline(launches_of(buf))}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del res
        torch.cuda.empty_cache()
        (out_dir / "cta_trace.json").write_text(json.dumps(rows, indent=1))
    keys = ("us", "traced_us", "period", "gap", "span", "dur_min", "dur_median", "dur_max", "dur_harmonic", "tail")
    print(f"\n{'shape':16s} {'schedule':40s} " + " ".join(f"{k:>12s}" for k in keys))
    for r in rows:
        print(f"{r['shape']:16s} {r['schedule']:40s} " + " ".join(
            f"{r.get(k, math.nan):12.2f}" for k in keys))


if __name__ == "__main__":
    main()
