"""The L2 fields and ncu on the GPU (`-m gpu`, H200): kernels hinted per operand and the store, and with a deep or
no PDL prefetch, against the fp32 reference (NaN-filled output, every element within its bound); two prefetching
kernels back to back, the second reading what the first wrote; `gemmc profile` under ncu (skipped where the host
has none) giving figures a GEMM can have; `gemmc-search tune --profile l2 --reward time+l2` storing a profile per
searched schedule."""
from __future__ import annotations

import json
import shutil

import pytest

import gemmc
from gemmc.reference import checked_error
from gemmc.schedule import Schedule
from gemmc.spec import GemmSpec

pytestmark = pytest.mark.gpu

SWAPPED = Schedule((128, 16, 64), mode="pingpong", swap_ab=True)
PLAIN = Schedule((128, 128, 64), (2, 1))
CASES = [
    (GemmSpec(m=16, n=4096, k=4096), SWAPPED.with_(l2_a="last", l2_b="normal", l2_prefetch=8)),
    (GemmSpec(m=16, n=4096, k=4096), SWAPPED.with_(l2_b="last", l2_prefetch=0)),
    (GemmSpec(m=1, n=6144, k=4096), Schedule((64, 8, 128), mode="pingpong", stages=10, swap_ab=True,
                                             l2_a="first", l2_prefetch=16)),
    (GemmSpec(m=777, n=1024, k=1000), PLAIN.with_(l2_a="normal", l2_b="first", l2_out="last", l2_prefetch=4)),
    (GemmSpec(m=4096, n=4096, k=4096), PLAIN.with_(l2_out="first", l2_prefetch=32)),
]


def _inputs(spec, seed=0):
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(spec.m, spec.k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(spec.n, spec.k, device="cuda", dtype=torch.bfloat16, generator=gen)
    return a, b


@pytest.mark.parametrize("spec,schedule", CASES, ids=[s.short() for _, s in CASES])
def test_hinted_kernels_match_the_fp32_reference(spec, schedule):
    import torch
    k = gemmc.compile(spec, schedule=schedule)
    a, b = _inputs(spec)
    out = torch.full((spec.m, spec.n), float("nan"), device="cuda", dtype=torch.bfloat16)
    k(a, b, out=out)
    torch.cuda.synchronize()
    assert checked_error(spec, out, a, b) < 1e-2


def test_two_prefetching_kernels_back_to_back_read_what_the_first_wrote():
    """Under PDL the second kernel prefetches its weights before waiting for the first; its activations are the
    first kernel's output, read only after the wait."""
    import torch
    first_spec, second_spec = GemmSpec(m=16, n=4096, k=4096), GemmSpec(m=16, n=6144, k=4096)
    first = gemmc.compile(first_spec, schedule=SWAPPED.with_(l2_prefetch=16))
    second = gemmc.compile(second_spec, schedule=SWAPPED.with_(l2_prefetch=16, l2_a="last"))
    x, w1 = _inputs(first_spec, 1)
    _, w2 = _inputs(second_spec, 2)
    h = torch.full((16, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = torch.full((16, 6144), float("nan"), device="cuda", dtype=torch.bfloat16)
    for _ in range(3):          # eager, then inside a CUDA graph (the edges PDL relaxes)
        first(x, w1, out=h)
        second(h, w2, out=y)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        first(x, w1, out=h)
        second(h, w2, out=y)
    h.fill_(float("nan"))
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert checked_error(first_spec, h, x, w1) < 1e-2
    assert checked_error(second_spec, y, h, w2) < 1e-2


needs_ncu = pytest.mark.skipif(shutil.which("ncu") is None, reason="no ncu (Nsight Compute) on this host")


@needs_ncu
def test_gemmc_profile_measures_what_a_gemm_can_have(tmp_path, capsys):
    from gemmc import cli
    from gemmc.choose.measurement import ideal_dram_bytes
    from gemmc.search.db import TuningDB
    db = tmp_path / "t.sqlite"
    rc = cli.main(["profile", "--m", "4096", "--n", "4096", "--k", "4096", "--tile", "128x256x64", "--cluster",
                   "2x1", "--mode", "cooperative", "--cublas", "--record", "--db", str(db), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["side"] for r in rows] == ["gemmc", "cublas"] and all(r["error"] is None for r in rows)
    spec = GemmSpec(m=4096, n=4096, k=4096)
    read = (2 * 4096 * 4096) * 2
    for r in rows:
        p = r["profile"]
        assert 0.0 < p["l2_hit_rate"] < 1.0
        assert 0.9 * read <= p["dram_read_bytes"] <= 8 * read          # L2 flushed: every operand comes from DRAM
        assert 0.9 * 4096 * 4096 * 2 <= p["dram_write_bytes"] <= 4 * ideal_dram_bytes(spec)
        assert 500 <= p["sm_clock_mhz"] <= 2100 and p["duration_us"] > 50
    assert rows[0]["profile"]["tensor_pipe_pct"] is None or 10 <= rows[0]["profile"]["tensor_pipe_pct"] <= 100
    with TuningDB(db, create=False) as r:
        assert len(r.profiles_of(spec, "sm_90a")) == 2


@needs_ncu
def test_tune_profile_l2_stores_a_profile_per_searched_schedule(tmp_path, capsys):
    from gemmc.search import cli as search_cli
    from gemmc.search.db import TuningDB
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("16 4096 4096\n")
    db = tmp_path / "t.sqlite"
    rc = search_cli.main(["--db", str(db), "tune", "--shapes", str(shapes), "--strategy", "random", "--budget", "3",
                          "--batch", "3", "--confirm", "0", "--no-train-policy", "--profile", "l2",
                          "--reward", "time+l2"])
    assert rc == 0
    spec = GemmSpec(m=16, n=4096, k=4096)
    with TuningDB(db, create=False) as r:
        ok = {m.schedule for m in r.prior(spec, "sm_90a") if m.ok}
        assert ok and set(r.profiles_of(spec, "sm_90a")) == ok
    assert search_cli.main(["--db", str(db), "report"]) == 0
    assert "L2 hit DRAM/id SM MHz tens%" in capsys.readouterr().out
