"""The GPU scripts of issue 37 in their CPU modes: bench/decode_chain.py --compile-only compiles the chain's variants
and finds their cache-policy words and prefetches in the PTX; scripts/l2_llm_table.py --compile-only resolves the
shipped picks and the ncu command; scripts/l2_search_gpu.py --compile-only runs both searches on the synthetic
model and writes a dataset that `gemmc-search simulate --reward time,time+l2` replays."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from script_support import load_script

ROOT = Path(__file__).resolve().parents[1]


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_decode_chain_compile_only_checks_the_variants_ptx(tmp_path, capsys):
    chain = load_bench("decode_chain")
    rc = chain.main(["--compile-only", "--batches", "1", "--variants", "rules,pf8,pf0,a-last,a-last+out-last",
                     "--gemms", "o", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "== compile-only: 4 kernels, 0 problems ==" in out     # a-last+out-last == a-last here
    report = json.loads((tmp_path / "decode_chain_compile.json").read_text())
    by = {r["variant"]: r for r in report["compiled"]}
    assert by["pf8"]["schedule"].endswith("_swap_pf8") and by["a-last"]["schedule"].endswith("_l2a-last")
    # decode picks are swapped: their store has no hint, and the variant says so
    notes = chain.variant_schedules(1, chain.VARIANTS["a-last+out-last"])[1]
    assert notes and all("no l2_out=last (l2_out with swap_ab)" in n for n in notes)


def test_decode_chain_lower_bound_and_ptx_checks():
    chain = load_bench("decode_chain")
    # one layer at M 16: weights 6144x4096 + 4096x4096 + 28672x4096 + 4096x14336, bf16, at 4.8 TB/s
    weights = (6144 * 4096 + 4096 * 4096 + 28672 * 4096 + 4096 * 14336) * 2
    acts = 16 * (4096 + 4096 + 4096 + 14336 + 6144 + 4096 + 28672 + 4096) * 2
    assert chain.hbm_bound_us(16, 1) == (weights + acts) / 4.8e12 * 1e6
    assert chain.hbm_bound_us(1, 2) > 180.0           # 2 layers of 436 MB
    from gemmc.schedule import Schedule
    s = Schedule((64, 8, 128), mode="pingpong", swap_ab=True, l2_b="last", l2_prefetch=8)
    assert chain.ptx_problems(s, f"... {0x14F0000000000000} ... cp.async.bulk.prefetch.tensor ...") == []
    errs = chain.ptx_problems(s.with_(l2_prefetch=0), "no words")
    assert any("no cache-policy word" in e for e in errs) and not any("prefetch" in e for e in errs)


def test_llm_table_compile_only_names_the_picks_and_the_ncu_command(tmp_path, capsys):
    table = load_script("l2_llm_table")
    assert table.main(["--compile-only", "--shapes", "1x4096x4096,4096x4096x4096", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "l2_llm_table_compile.json").read_text())
    assert [p["shape"] for p in report["picks"]] == ["1x4096x4096", "4096x4096x4096"]
    assert all(p["source"] == "pretuned" for p in report["picks"]) and report["jobs"] == 4
    assert "--clock-control none" in " ".join(report["ncu_command"])
    assert len(table.shapes_of(type("A", (), {"shapes": ""})())) == 64


def test_search_gpu_dry_run_writes_a_dataset_simulate_replays(tmp_path, capsys):
    search = load_script("l2_search_gpu")
    assert search.main(["--compile-only", "--shapes", "64x4096x4096", "--budgets", "4,8", "--out",
                        str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "best found within each budget" in out and "median over shapes: time @4" in out
    report = json.loads((tmp_path / "l2_search_gpu_dry.json").read_text())
    (row,) = report["rows"]
    assert row["measured"] >= 8 and set(row["rewards"]) == {"time", "time+l2"}
    assert all(0 < row["rewards"][r][b] <= 1 for r in ("time", "time+l2") for b in ("4", "8"))
    from gemmc.search import cli
    data = tmp_path / "l2_search_gpu_dry.jsonl.gz"
    assert cli.main(["simulate", "--data", str(data), "--strategy", "random", "--seeds", "1", "--budget", "4",
                     "--reward", "time,time+l2"]) == 0
    replay = capsys.readouterr().out
    assert f"ncu profiles on {row['measured']} of {row['measured']} recorded schedules" in replay
