"""Clock and power under the cap: is a kernel faster because it does its work in fewer cycles, or because it
draws less power and so runs at a higher clock? Runs each shape's SM90 kernel and torch.matmul (cuBLAS) back
to back in CUDA graphs for a few seconds each, alternating, while nvidia-smi samples the SM clock and the
board power, and reports per side:

  us      time per call over the window (CUDA events around whole graph units)
  mhz     median SM clock of the samples after the first second (the clock settles under the cap)
  watts   median board power of the same samples, beside the enforced power limit
  mcycles time x clock: the cycles one call takes at the clock it ran at
  mj      watts x time: the energy of one call (millijoules); at the cap, time follows it
  tflops  and tflops per kW

    python3 scripts/power_clock.py plan.json    # GPU: JSON under $OUT (or ./power_out), table last

plan.json: {"MxNxK": ["<schedule string>", ...]}; each schedule is compiled once for symbolic M, N, K and
serves every shape that names it. Each kernel is checked first against an fp32 reference of the
upcast inputs, its output NaN-filled; inputs are bf16 randn sets rotated through >= 2x L2
(gemmc.bench.timing.time_side_by_side, which also gives the short interleaved timing printed as `paired`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gemmc  # noqa: E402
from gemmc.bench.policy import parse_schedule  # noqa: E402

SMI_QUERY = "clocks.sm,power.draw,power.limit"
SETTLE_S = 1.0     # samples of a window's first second are dropped: the clock steps down under the cap


def parse_samples(text: str) -> list[tuple[float, float, float]]:
    """(sm MHz, watts, power limit W) per line of `nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,
    nounits`; lines that are not three numbers (a driver message, "[N/A]") are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            out.append(tuple(float(p) for p in parts))
        except ValueError:
            continue
    return out


def side_summary(samples: list[tuple[float, float, float]], us: float, flops: float) -> dict:
    """The figures of one side's window from its settled samples and its time per call."""
    if not samples:
        raise ValueError("no nvidia-smi samples in the window: is nvidia-smi on PATH, and the window long enough?")
    mhz = statistics.median(s[0] for s in samples)
    watts = statistics.median(s[1] for s in samples)
    tflops = flops / us / 1e6
    return {"us": us, "mhz": mhz, "watts": watts, "limit_w": samples[-1][2], "samples": len(samples),
            "mcycles": us * mhz / 1e6, "mj": watts * us / 1000, "tflops": tflops, "tflops_per_kw": tflops / watts * 1000}


def smi_device(props) -> str:
    """nvidia-smi's -i for torch's current device: its PCI bus id (CUDA_VISIBLE_DEVICES renumbers devices
    for torch, not for nvidia-smi)."""
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


def run_window(unit, clock, seconds: float, launches: int, gpu: str) -> tuple[float, list]:
    """Replay `unit` for SETTLE_S unsampled, then for the rest of `seconds` under an nvidia-smi sampler:
    (us per call over the sampled part, its samples)."""
    from gemmc.bench.timing import settle
    settle(unit, clock, SETTLE_S)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits",
                            "-lms", "50", "-i", gpu], stdout=subprocess.PIPE, text=True)
    ms, units = 0.0, 0
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < seconds - SETTLE_S:
        ms += clock.time_ms(unit)
        units += 1
    smi.terminate()
    text, _ = smi.communicate()
    return 1000 * ms / (units * launches), parse_samples(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--seconds", type=float, default=4.0, help="window per side and round (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="windows per side, alternating (default 2)")
    args = ap.parse_args()
    if args.seconds <= SETTLE_S:
        raise SystemExit(f"--seconds must exceed the {SETTLE_S:g} s the clock takes to settle")
    plan = json.loads(Path(args.plan).read_text())

    import torch
    from gemmc.bench.suites import Shape
    from gemmc.bench.timing import CudaClock, spin_up, time_side_by_side
    out_dir = Path(os.environ.get("OUT", "power_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    gpu = smi_device(props) if hasattr(props, "pci_bus_id") else str(torch.cuda.current_device())
    clock = CudaClock(graphs=True)
    spin_up(1.0)
    rows = []
    compiled = {}
    for shape, names in plan.items():
        m, n, k = map(int, shape.split("x"))
        kernels = {}
        for name in names:
            if name not in compiled:
                compiled[name] = gemmc.compile(gemmc.GemmSpec(m="M", n="N", k="K"), schedule=parse_schedule(name))
            kernels[name] = compiled[name]
        try:
            res = time_side_by_side(Shape(m, n, k), kernels, clock, repeats=5)
        except ValueError as e:
            raise SystemExit(str(e))
        sides = ["cublas", *names]
        row = {"shape": shape, "paired_us": res["us"], "rel_err": res["rel_err"], "sides": {}}
        windows = {side: [] for side in sides}
        for r in range(args.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                windows[side].append(run_window(res["units"][side], clock, args.seconds, res["launches"], gpu))
        for side, got in windows.items():
            us = statistics.median(u for u, _ in got)
            row["sides"][side] = side_summary([s for _, ss in got for s in ss], us, 2.0 * m * n * k)
            row["sides"][side]["speed"] = row["sides"]["cublas"]["us"] / us
            row["sides"][side]["energy"] = row["sides"][side]["mj"] / row["sides"]["cublas"]["mj"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del res
        torch.cuda.empty_cache()
        (out_dir / "power_clock.json").write_text(json.dumps(rows, indent=1))
    keys = ("us", "mhz", "watts", "mcycles", "mj", "tflops", "tflops_per_kw")
    print(f"\n{'shape':18s} {'side':40s} " + " ".join(f"{k:>13s}" for k in keys) + "  cuBLAS/side  energy/cuBLAS")
    for r in rows:
        for side, got in r["sides"].items():
            print(f"{r['shape']:18s} {side:40s} " + " ".join(f"{got[k]:13.3f}" for k in keys)
                  + f"  {got['speed']:11.3f}  {got['energy']:13.3f}")


if __name__ == "__main__":
    main()
