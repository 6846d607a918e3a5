"""scripts/wave_footprint.py: the wave model follows the kernel's own tile order, and on the session-16
power_clock rows its footprint tracks the power-capped clock."""
import math
from pathlib import Path

import pytest
from script_support import load_script

from gemmc.bench.policy import parse_schedule
from gemmc.schedule import ARCH_LIMITS

wf = load_script("wave_footprint")
RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "2026-12-01-h200-session16.json.gz"


def test_one_wave_of_a_small_grid_reads_each_operand_once():
    # 2x2 tiles of 128x128 on 1x1 clusters: 4 units, one wave; every row and column of A and B once
    total, waves = wf.wave_bytes(256, 256, 64, parse_schedule("128x128x64_c1x1_coop_sauto_rm_sw1_k1"))
    assert waves == 1 and total == (256 + 256) * 64 * 2


def test_a_plain_raster_reads_all_of_a_every_wave_and_grouping_fixes_it():
    # 16384x57344x8192 on 128x128 c2x1 with M walked fastest: a wave of 66 clusters spans every A row;
    # groups of 8 N columns keep a wave near-square
    m, n, k = 16384, 57344, 8192
    grid = ARCH_LIMITS["sm_90a"].active_clusters(2)
    rm1 = wf.wave_bytes(m, n, k, parse_schedule("128x128x64_c2x1_pp_sauto_rm_sw1_k1"))
    waves = math.ceil((m // 256) * (n // 128) / grid)
    assert rm1[1] == waves
    # M-major: 64 cluster rows per N column, so a wave of 66 holds all of A (16384 rows) and 2 N columns
    assert rm1[0] == pytest.approx(waves * (m + 2 * 128) * k * 2, rel=0.02)
    sw8 = wf.wave_bytes(m, n, k, parse_schedule("128x128x64_c2x1_pp_sauto_rm_sw8_k1"))[0]
    assert sw8 < rm1[0] / 2.5
    # swap_ab: the kernel's M is the problem's N
    swapped = wf.wave_bytes(64, 4096, 4096, parse_schedule("64x32x128_c1x2_pp_s9_rm_sw1_k1_swap"))
    assert swapped[1] == 1 and swapped[0] == (4096 + 64) * 4096 * 2
    with pytest.raises(ValueError, match="split-K"):
        wf.wave_bytes(128, 4096, 14336, parse_schedule("64x128x64_c2x1_pp_sauto_rm_sw1_k2"))


def test_on_the_h200_the_footprint_tracks_the_power_capped_clock():
    """Session 16, scripts/power_clock.py: 38 gemmc sides on 2-CTA clusters, each timed alone at the 700 W cap
    beside cuBLAS. The more bytes per FLOP a wave pulls, the lower the clock it sustains."""
    pts = wf.footprint_vs_clock(wf.power_rows(wf.read_json(RESULTS)))
    two = [p for p in pts if p["cluster_ctas"] == 2]
    assert len(two) == 38
    assert wf.pearson([p["bytes_per_kflop"] for p in two], [p["clock"] for p in two]) < -0.6
    # at M = 16384 the cycles match cuBLAS's within 3%, and the unswizzled rasters lose on the clock alone
    big = [p for p in two if p["shape"].startswith("16384x") and p["bytes_per_kflop"] > 3.0]
    assert len(big) >= 10 and all(abs(p["cycles"] - 1) < 0.03 and p["clock"] < 0.96 for p in big)
