"""Build gemmc's shipped schedule table for one GPU from recorded sweeps (see gemmc/pretuned.py), and
optionally from tuning-DB exports of the same GPU, whose paired verdict wins where they have the shape.

    python3 scripts/build_pretuned.py bench/data/2026-11-30-h200-sweep*.jsonl.gz \
        --tuned bench/results/2026-12-01-h200-llm-tuning-db-session10.json \
        --gpu "NVIDIA H200" --out gemmc/pretuned_data/h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemmc.bench.dataset import load_dataset
from gemmc.pretuned import PretunedEntry, build_table, with_entries


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="+", help="sweep datasets (bench/data/*.jsonl.gz) of one GPU")
    p.add_argument("--gpu", required=True, help="the GPU name as torch reports it, e.g. 'NVIDIA H200'")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--out", required=True)
    p.add_argument("--tuned", nargs="*", default=[],
                   help="`gemmc-search export` files: each plain bf16 A [M, K] @ B [N, K].T problem's best on --gpu "
                        "(paired verdict, with a cuBLAS time) replaces the sweep's entry")
    args = p.parse_args(argv)
    records = []
    for path in args.data:
        header, recs = load_dataset(path)
        name = (header.get("device") or {}).get("name")
        if name and name != args.gpu:
            p.error(f"{path} was recorded on {name!r}, not {args.gpu!r}")
        # a table holds one problem class (gemmc/pretuned.py): bf16, A [M, K] and B [N, K], this arch
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
    obj = table.to_json()
    entries = obj.pop("entries")
    head = json.dumps(obj, indent=1)[:-2]       # one entry per line: a readable, diffable file
    body = ",\n".join("  " + json.dumps(e, separators=(",", ":")) for e in entries)
    Path(args.out).write_text(f'{head},\n "entries": [\n{body}\n ]\n}}\n')
    faster = sum(not e.cublas_faster for e in table.entries.values())
    print(f"{args.out}: {len(table.entries)} shapes; gemmc measured faster than cuBLAS on {faster}")
    return 0


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
