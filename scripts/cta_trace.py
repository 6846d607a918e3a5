"""Where does a kernel's time go, CTA by CTA? Times each shape's SM90 kernel beside a traced copy of its
emitted source, and torch.matmul (cuBLAS), in back-to-back CUDA graphs, and prints per-launch timelines.

The traced copy writes globaltimer stamps per CTA into a device buffer whose address is baked into its
source: launch (kernel entry), go (griddepcontrol.wait returned: the previous grid is done), mma (the
first consumer warpgroup's last main loop drained), end (each consumer warpgroup's last store issued; a CTA
ends with the later), and the SM id. The buffer keeps
the last TRACE_SLOTS launches. From consecutive launches it reports:
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
import dataclasses
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gemmc  # noqa: E402
from gemmc.bench.policy import parse_schedule  # noqa: E402
from gemmc.compiled import CompiledKernel  # noqa: E402

TRACE_MAXCTA = 1024
TRACE_SLOTS = 8
FIELDS = ("launch", "go", "end", "smid", "mma", "end1")
TRACE_LEN = TRACE_MAXCTA * (1 + TRACE_SLOTS * len(FIELDS))

_HEAD = "    warp_group_idx = cute.arch.make_warp_uniform(tidx // 128)\n"
_WAIT = "        cute.arch.griddepcontrol_wait()\n"
_MMA_DONE = "            warpgroup.wait_group(0)\n"
_TAIL = "        store_pipeline.producer_tail()\n"


def _slot(field: str) -> str:
    return (f"_tr[TRACE_MAXCTA + ((_n % TRACE_SLOTS) * TRACE_MAXCTA + _bid) * {len(FIELDS)} + "
            f"{FIELDS.index(field)}]")


def edit_source(source: str, address: int) -> str:
    """The emitted SM90 kernel source with the stamps (module docstring) written to `address`."""
    for anchor, want, what in ((_HEAD, 1, "the warpgroup index"), (_WAIT, 1, "the grid-dependency wait"),
                               (_MMA_DONE, 1, "the consumer's drained main loop"), (_TAIL, None, "the last store")):
        found = source.count(anchor)
        if (want is None and found == 0) or (want is not None and found != want):
            raise ValueError(f"{what}: found {found} in the emitted source, expected {want or 'some'} "
                             "(the SM90 kernel template changed; update scripts/cta_trace.py)")
    if "PDL = True" not in source:
        raise ValueError("the stamps key launches on the grid-dependency wait: trace kernels with pdl on")
    consts = (f"TRACE_ADDR = {address}\nTRACE_MAXCTA = {TRACE_MAXCTA}\nTRACE_SLOTS = {TRACE_SLOTS}\n"
              f"TRACE_LEN = {TRACE_LEN}\n")
    out = source.replace("\nEPI_STAGES = ", "\n" + consts + "EPI_STAGES = ", 1)
    out = out.replace(_HEAD, _HEAD + (
        "    _tr = cute.make_tensor(cute.make_ptr(cutlass.Int64, TRACE_ADDR, cute.AddressSpace.gmem, "
        "assumed_align=8), cute.make_layout(TRACE_LEN))\n"
        "    _bx, _by, _bz = cute.arch.block_idx()\n"
        "    _gx, _gy, _gz = cute.arch.grid_dim()\n"
        "    _bid = _bx + _by * _gx + _bz * _gx * _gy\n"
        "    _t_launch = cutlass.Int64(cute.arch.globaltimer())\n"
        "    _n = cutlass.Int64(0)\n"), 1)
    # the launch count is read after the wait (the previous grid has bumped it) and bumped at the very end;
    # an idle producer warp stamps, so the TMA issuer never waits on the load
    out = out.replace(_WAIT, _WAIT + (
        "        _n = _tr[_bid]\n"
        "        if tidx == 32:\n"
        f"            {_slot('launch')} = _t_launch\n"
        f"            {_slot('go')} = cutlass.Int64(cute.arch.globaltimer())\n"
        f"            {_slot('smid')} = cutlass.Int64(cute.arch.smid())\n"), 1)
    out = out.replace(_MMA_DONE, _MMA_DONE + (
        "            if tidx == 128:\n"
        f"                {_slot('mma')} = cutlass.Int64(cute.arch.globaltimer())\n"), 1)
    i = out.rindex(_TAIL) + len(_TAIL)
    # each consumer warpgroup stamps its own end: under ping-pong the second one may finish last
    return out[:i] + (
        "        if tidx == 128:\n"
        f"            {_slot('end')} = cutlass.Int64(cute.arch.globaltimer())\n"
        "            _tr[_bid] = _n + 1\n"
        "        if tidx == 256:\n"
        f"            {_slot('end1')} = cutlass.Int64(cute.arch.globaltimer())\n") + out[i:]


def traced(kernel, address: int) -> CompiledKernel:
    return CompiledKernel(dataclasses.replace(kernel.emitted, source=edit_source(kernel.emitted.source, address)))


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
