"""Grouped fp8 SM90 kernels with block scales, built on the CPU: the emitted facts and entry, and PTX that walks the
groups with warp shuffles, runs the fp8 WGMMA, waits for each k-tile and promotes it times its scales (read once
per distinct row and weight block), and stores each element from registers behind its row's predicate; ptxas
spills nothing. The GPU run is tests/test_gpu_grouped.py and scripts/gpu_grouped.py --dtypes fp8."""
import re

import pytest

import gemmc
from gemmc.schedule import Schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref, Scaling

from emit_support import compiled_ptx


def grouped(layout, fp8=True, b_dtype="f8e4m3", **kw) -> GemmSpec:
    scaled = dict(dtype="f8e4m3", b_dtype=b_dtype, scaling=Scaling("block", "sx", "sw")) if fp8 else {}
    return GemmSpec(m="M", n=2048, k=7168, groups="E", group_layout=layout, name=f"experts_{layout}", **scaled, **kw)


def emitted(spec, **sched):
    return gemmc.compile(spec, Schedule(**{"tile": (128, 128, 128), **sched})).emitted


def constants(source: str) -> dict:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^([A-Z_]+) = (.+?)\s+#", source, re.M)}


def global_loads(ptx: str) -> int:
    return len(re.findall(r"^\s*ld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.b32\s", ptx, re.M))


def test_the_source_is_grouped_and_block_scaled():
    for layout, groups in (("contiguous", "offsets"), ("masked", "counts")):
        src = emitted(grouped(layout)).source
        c = constants(src)
        assert (c["GROUPED"], c["GROUP_MASKED"], c["STORE_FROM_REGISTERS"]) == ("True", str(layout == "masked"),
                                                                                 "True")
        assert (c["SCALING"], c["PROMOTE_K"], c["MMA_INST_K"]) == ("'block'", "128", "32")
        assert f"KERNEL(a, b, out, (), None, None, {groups}, stream, block_scales=(sx, sw))" in src
        assert "EPILOGUE_INPUTS = ()" in src and "def epilogue_dag" not in src


SCHEDULES = [
    ("contiguous", "f8e4m3", dict(cluster=(2, 1))),
    ("contiguous", "f8e5m2", dict(tile=(256, 64, 128))),
    ("contiguous", "f8e4m3", dict(tile=(128, 64, 128), cluster=(1, 2), raster="n")),
    ("masked", "f8e4m3", dict(tile=(64, 128, 128), mode="pingpong")),
]


@pytest.mark.parametrize("layout, b_dtype, sched", SCHEDULES, ids=lambda x: str(x))
def test_ptx_walks_the_groups_promotes_each_k_tile_and_stores_rows_predicated(layout, b_dtype, sched):
    ptx = compiled_ptx(emitted(grouped(layout, b_dtype=b_dtype), **sched))
    bm, bn, _ = sched.get("tile", (128, 128, 128))
    b = "e5m2" if b_dtype == "f8e5m2" else "e4m3"
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.\w+\.\w+)", ptx)) == {
        f"m64n{bn}k32.f32.e4m3.{b}"}
    assert ptx.count("wgmma.mma_async") == 4 * (2 if bm == 256 else 1)     # one k-tile of 128: 4 k32 steps
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)        # each k-tile done before its promotion
    assert "shfl.sync.up.b32" in ptx and "vote.sync.ballot.b32" in ptx and "popc.b32" in ptx   # the group walk
    assert not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)      # no TMA store
    lines = ptx.splitlines()
    stores = [i for i, line in enumerate(lines) if "st.global.b16" in line]
    threads = 128 if sched.get("mode") == "pingpong" else 256
    assert len(stores) == bm * bn // threads
    assert all(any(re.search(r"@%p\d+ bra", lines[j]) for j in range(i - 6, i)) for i in stores)
    per_thread = bm * bn // threads
    first_mma = ptx.index("wgmma.mma_async")
    assert len(re.findall(r"fma\.rn\.f32", ptx[first_mma:])) >= per_thread      # acc += tile_acc * factor
    # the scales: A's of each row a thread holds (2 per 64 rows) and B's one block, each read once, read
    # before the k-tile's MMA; the rest are the group walk's, as in the bf16 grouped kernel of the same tile
    bf16 = compiled_ptx(emitted(grouped(layout, fp8=False), **sched))
    scale_loads = bm // (64 if threads == 256 else 32) + 1
    assert global_loads(ptx) - global_loads(bf16) == scale_loads
    assert global_loads(ptx[:first_mma]) - global_loads(bf16[:bf16.index("wgmma.mma_async")]) == scale_loads


def test_ptx_of_a_scalar_epilogue_with_an_f32_output():
    spec = grouped("contiguous", out_dtype="f32", inputs=(EpilogueInput("alpha", "scalar"),),
                   epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))),))
    ptx = compiled_ptx(emitted(spec))
    assert "st.global.f32" in ptx or "st.global.b32" in ptx
    assert "e4m3.e4m3" in ptx and "shfl.sync.up.b32" in ptx


@pytest.mark.parametrize("layout, sched", [("contiguous", dict(cluster=(2, 1))), ("masked", dict(tile=(256, 64, 128))),
                                           ("contiguous", dict(tile=(64, 128, 128), mode="pingpong"))])
def test_admitted_grouped_fp8_tiles_compile_without_spills(layout, sched):
    """The register model (two accumulators, the walk, the row-predicated store) holds: ptxas spills nothing."""
    from gemmc.build import ptxas_report
    reports = ptxas_report(emitted(grouped(layout), **sched))
    assert reports and not any(r.spills for r in reports)
