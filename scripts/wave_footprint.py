"""How many operand bytes does a persistent SM90 kernel pull per wave of work units? A model of its DRAM
traffic, for reading the power-capped clocks of scripts/power_clock.py.

The persistent grid holds `active_clusters` clusters (the arch's measured limit); they take work units in the
kernel's own order (raster, grouped by `swizzle`: the emitted `tile_coord`), so wave w is units
[w x G, (w + 1) x G). A wave reads the A rows and B columns of its tiles over all of K. When that footprint
exceeds L2 (it does for the shapes below, at K >= 4096), little survives into the next wave, so the model
counts each wave's distinct rows and columns once: an upper bound on DRAM bytes, which tracks how far a
raster keeps the concurrent tiles together. Split-K schedules are not modeled.

    python3 scripts/wave_footprint.py --shape 16384x57344x8192 128x128x64_c2x1_pp_sauto_rn_sw1_k1 ...
    python3 scripts/wave_footprint.py --power RESULTS.json   # power_clock rows: bytes per kFLOP vs clock

--power takes scripts/power_clock.py's JSON, or a session results file holding it under
experiments.power_clock_candidates.rows.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemmc.backends.common import grouped_raster_source  # noqa: E402
from gemmc.bench.policy import parse_schedule  # noqa: E402
from gemmc.bench.report import read_json  # noqa: E402
from gemmc.schedule import ARCH_LIMITS, Schedule  # noqa: E402


def tile_order(raster_m: bool, group: int):
    """The kernel's `tile_coord(idx, tiles_m, tiles_n)`, its emitted source run as plain Python."""
    ns = {"cute": types.SimpleNamespace(jit=lambda f: f), "RASTER_M": raster_m, "GROUP": group}
    exec(grouped_raster_source("RASTER_M", "GROUP"), ns)
    return ns["tile_coord"]


def wave_bytes(m: int, n: int, k: int, s: Schedule, elem_bytes: int = 2) -> tuple[int, int]:
    """(operand bytes summed over the waves, waves) of schedule `s` on the problem M x N x K."""
    if s.split_k != 1:
        raise ValueError(f"{s.short()}: split-K work units are not modeled")
    if s.swap_ab:                    # the kernel computes out^T: its M is the problem's N
        m, n = n, m
    (bm, bn, _), (cm, cn) = s.tile, s.cluster
    clusters_m, clusters_n = math.ceil(m / (bm * cm)), math.ceil(n / (bn * cn))
    units = clusters_m * clusters_n
    grid = ARCH_LIMITS[s.arch].active_clusters(cm * cn)
    coord = tile_order(s.raster == "m", s.swizzle)
    total = 0
    waves = math.ceil(units / grid)
    for w in range(waves):
        rows, cols = set(), set()
        for u in range(w * grid, min(units, (w + 1) * grid)):
            cl_m, cl_n = coord(u, clusters_m, clusters_n)
            rows.add(cl_m)
            cols.add(cl_n)
        total += (min(len(rows) * bm * cm, m) + min(len(cols) * bn * cn, n)) * k * elem_bytes
    return total, waves


def bytes_per_kflop(m: int, n: int, k: int, s: Schedule) -> float:
    return wave_bytes(m, n, k, s)[0] / (2.0 * m * n * k) * 1e3


def power_rows(obj) -> list:
    """power_clock.py's rows, from its own JSON or from a session results file."""
    if isinstance(obj, dict):
        obj = obj["experiments"]["power_clock_candidates"]["rows"]
    return obj


def footprint_vs_clock(rows) -> list[dict]:
    """Per gemmc side of each power_clock row: its modeled bytes per kFLOP, and its clock, cycles and speed
    relative to cuBLAS in the same row."""
    out = []
    for r in rows:
        m, n, k = map(int, r["shape"].split("x"))
        cub = r["sides"]["cublas"]
        for name, side in r["sides"].items():
            if name == "cublas":
                continue
            s = parse_schedule(name)
            out.append({"shape": r["shape"], "schedule": name, "cluster_ctas": s.cluster[0] * s.cluster[1],
                        "bytes_per_kflop": bytes_per_kflop(m, n, k, s), "clock": side["mhz"] / cub["mhz"],
                        "cycles": side["mcycles"] / cub["mcycles"], "speed": side["speed"]})
    return out


def pearson(x, y) -> float:
    mx, my = statistics.mean(x), statistics.mean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", metavar="MxNxK", help="print the footprint of the schedules given after it")
    ap.add_argument("schedules", nargs="*", help="schedule strings (with --shape)")
    ap.add_argument("--power", metavar="JSON", help="power_clock.py rows: footprint against clock")
    args = ap.parse_args(argv)
    if args.shape:
        m, n, k = map(int, args.shape.split("x"))
        for name in args.schedules:
            s = parse_schedule(name)
            total, waves = wave_bytes(m, n, k, s)
            print(f"{args.shape} {name}: {total / 1e9:.2f} GB over {waves} waves, "
                  f"{bytes_per_kflop(m, n, k, s):.3f} B/kFLOP")
    if args.power:
        pts = footprint_vs_clock(power_rows(read_json(args.power)))
        for p in sorted(pts, key=lambda p: p["bytes_per_kflop"]):
            print(f"{p['shape']:18s} {p['schedule']:40s} {p['bytes_per_kflop']:6.3f} B/kFLOP  clock x{p['clock']:.3f}"
                  f"  cycles x{p['cycles']:.3f}  speed {p['speed']:.3f}")
        two = [p for p in pts if p["cluster_ctas"] == 2]
        r = pearson([p["bytes_per_kflop"] for p in two], [p["clock"] for p in two])
        print(f"2-CTA clusters ({len(two)} sides): r(bytes per kFLOP, clock vs cuBLAS) = {r:.3f}")
    if not args.shape and not args.power:
        ap.error("give --shape with schedules, or --power")
    return 0


if __name__ == "__main__":
    sys.exit(main())
