"""Build gemmc's shipped schedule table for one GPU from recorded sweeps (see gemmc/choose/pretuned.py), and
optionally from tuning-DB exports of the same GPU, whose paired verdict wins where they have the shape,
and from `gemmc bench --policy heuristic` reports (the table's checks: the heuristic's picks, measured).

    python3 scripts/build_pretuned.py bench/data/2026-11-30-h200-sweep*.jsonl.gz \
        --tuned bench/results/2026-12-01-h200-llm-tuning-db-session10.json \
                bench/results/2026-12-01-h200-tuning-db-session15.json \
                bench/results/2026-12-01-h200-tuning-db-session17.json \
                bench/results/2026-12-01-h200-tuning-db-session18.json \
                bench/results/2026-12-01-h200-tuning-db-session19.json \
        --checks bench/results/2026-12-01-h200-heuristic-checks-session11*.json* \
                 bench/results/2026-12-01-h200-heuristic-checks-session12-*.json* \
                 bench/results/2026-12-01-h200-heuristic-checks-session13-a.json \
                 bench/results/2026-12-01-h200-heuristic-checks-session15-a.json \
        --sustained bench/results/2026-12-01-h200-llm-auto-sustained-session16.json.gz \
        --gpu "NVIDIA H200" --out gemmc/choose/pretuned_data/h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemmc.bench.dataset import load_dataset
from gemmc.bench.report import read_json
from gemmc.choose.pretuned import PretunedEntry, build_table, with_checks, with_entries
from gemmc.schedule import Schedule


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="+", help="sweep datasets (bench/data/*.jsonl.gz) of one GPU")
    p.add_argument("--gpu", required=True, help="the GPU name as torch reports it, e.g. 'NVIDIA H200'")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--out", required=True)
    p.add_argument("--tuned", nargs="*", default=[],
                   help="`gemmc-search export` files: each plain bf16 A [M, K] @ B [N, K].T problem's best on --gpu "
                        "(paired verdict, with a cuBLAS time) replaces the sweep's entry")
    p.add_argument("--checks", nargs="*", default=[],
                   help="`gemmc bench --policy heuristic` reports (JSON) on --gpu: each shape outside the table "
                        "becomes a check, which gives the cuBLAS verdict to unmeasured shapes near it")
    p.add_argument("--sustained", nargs="*", default=[],
                   help="`gemmc bench --sustained-s` reports on --gpu: where a row was timed sustained (a call of "
                        ">= 100 us, each side at the power-capped clock its own load sets) and ran the entry's "
                        "own schedule, its times replace the entry's: a long job runs at that clock, so where "
                        "they read cuBLAS faster `auto` dispatches to it")
    args = p.parse_args(argv)
    records = []
    for path in args.data:
        header, recs = load_dataset(path)
        name = (header.get("device") or {}).get("name")
        if name and name != args.gpu:
            p.error(f"{path} was recorded on {name!r}, not {args.gpu!r}")
        # a table holds one problem class (gemmc/choose/pretuned.py): bf16, A [M, K] and B [N, K], this arch
        if header.get("dtype", "bf16") != "bf16" or header.get("arch", args.arch) != args.arch:
            p.error(f"{path} holds dtype {header.get('dtype')!r} / arch {header.get('arch')!r}; a table is "
                    f"bf16 on {args.arch}")
        if "B [N,K]" not in header.get("layout", "B [N,K]"):
            p.error(f"{path} layout {header.get('layout')!r}: a table is A [M, K] @ B [N, K].T")
        records += recs
    source = ", ".join(sorted(Path(x).name for x in args.data))
    table = build_table(records, args.gpu, args.arch, source)
    if args.tuned:
        entries = tuned_entries(args.tuned, args.gpu, args.arch)
        table = with_entries(table, entries, ", ".join(sorted(Path(x).name for x in args.tuned)))
        print(f"{len(entries)} shapes from the tuning DB export(s)")
    if args.sustained:
        try:
            entries = sustained_entries(args.sustained, args.gpu, args.arch, table)
        except ValueError as e:
            p.error(str(e))
        table = with_entries(table, entries, ", ".join(sorted(Path(x).name for x in args.sustained)))
        print(f"{len(entries)} shapes timed sustained; cuBLAS faster on {sum(e.cublas_faster for e in entries)}")
    if args.checks:
        try:
            checks = heuristic_checks(args.checks, args.gpu, args.arch)
        except ValueError as e:
            p.error(str(e))
        table = with_checks(table, checks, ", ".join(sorted(Path(x).name for x in args.checks)))
        print(f"{len(table.checks)} checks of the heuristic's picks")
    obj = table.to_json()
    lists = {key: obj.pop(key) for key in ("entries", "checks") if key in obj}
    head = json.dumps(obj, indent=1)[:-2]       # one row per line: a readable, diffable file
    body = ",\n".join(f' "{key}": [\n' + ",\n".join("  " + json.dumps(e, separators=(",", ":")) for e in rows)
                      + "\n ]" for key, rows in lists.items())
    Path(args.out).write_text(f'{head},\n{body}\n}}\n')
    faster = sum(not e.cublas_faster for e in table.entries.values())
    print(f"{args.out}: {len(table.entries)} shapes; gemmc measured faster than cuBLAS on {faster}")
    return 0


def heuristic_checks(paths, gpu: str, arch: str) -> list:
    """The heuristic's measured picks out of bench reports: ValueError unless each report ran
    `--policy heuristic` on `gpu` and `arch` with bf16 inputs (the table's problem class)."""
    out = []
    for path in paths:
        report = read_json(path)
        name = report.get("environment", {}).get("gpu", {}).get("name")
        if (report.get("policy"), name, report.get("arch"), report.get("dtype")) != ("heuristic", gpu, arch, "bf16"):
            raise ValueError(f"{path}: policy {report.get('policy')!r} on {name!r} ({report.get('arch')}, "
                             f"{report.get('dtype')}); checks come from `gemmc bench --policy heuristic` "
                             f"on {gpu!r} ({arch}, bf16)")
        out += [PretunedEntry(r["m"], r["n"], r["k"], Schedule.from_dict(r["schedule_dict"]),
                              float(r["gemmc_us"]["median"]), float(r["cublas_us"]["median"]))
                for r in report["results"] if r.get("status") == "ok"]
    return out


def sustained_entries(paths, gpu: str, arch: str, table) -> list:
    """Sustained times of the table's own entries out of bench reports: rows with `sustained` true whose
    kernel ran the entry's schedule (not a cuBLAS dispatch); gemmc's median, and cuBLAS's as the row's paired
    ratio puts it. ValueError unless each report ran on `gpu` and
    `arch` with bf16 inputs and was timed with --sustained-s."""
    out = []
    for path in paths:
        report = read_json(path)
        name = report.get("environment", {}).get("gpu", {}).get("name")
        seconds = report.get("method", {}).get("config", {}).get("sustained_s", 0)
        if (name, report.get("arch"), report.get("dtype")) != (gpu, arch, "bf16") or not seconds:
            raise ValueError(f"{path}: {name!r} ({report.get('arch')}, {report.get('dtype')}, sustained_s "
                             f"{seconds}); sustained times come from `gemmc bench --sustained-s S` on {gpu!r} "
                             f"({arch}, bf16)")
        for r in report["results"]:
            entry = table.entries.get((r["m"], r["n"], r["k"]))
            sched = r.get("schedule_dict") or {}
            if (r.get("status") != "ok" or not r.get("sustained") or entry is None or "dispatch" in sched
                    or Schedule.from_dict(sched) != entry.schedule):
                continue
            # the cuBLAS time the paired ratio gives (the bench's verdict), beside gemmc's median
            gemmc_us = float(r["gemmc_us"]["median"])
            out.append(PretunedEntry(entry.m, entry.n, entry.k, entry.schedule, gemmc_us, gemmc_us * float(r["ratio"])))
    return out


def tuned_entries(paths, gpu: str, arch: str) -> list:
    """The table's problem class out of tuning-DB exports: each problem's best on `gpu` by the paired verdict."""
    import tempfile

    from gemmc.search.db import TuningDB
    from gemmc.types import as_arch
    want = {"batch": None, "dtype": "bf16", "out_dtype": "bf16", "acc_dtype": "f32", "a_layout": "mk",
            "b_layout": "nk", "epilogue_class": "plain", "arch": as_arch(arch)}
    with tempfile.TemporaryDirectory() as tmp:
        db = TuningDB(Path(tmp) / "t.sqlite")
        for path in paths:
            db.import_(path)
        out = [PretunedEntry(e.fields["m"], e.fields["n"], e.fields["k"], e.schedule, e.time_us, e.cublas_us)
               for e in db.best_all(arch)
               if e.gpu_name == gpu and e.cublas_us and all(e.fields[k] == v for k, v in want.items())]
        db.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
