"""Stream-K on the CPU: the work decomposition covers every (tile, k-tile) iteration once and the fix-up
finds every piece of a split tile; the emitted kernel computes the same integers; the schedule refuses what
stream-K does not support; and an sm_90a compile has one counted arrival and one partial per fragment."""
from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from gemmc.backends.sm90 import emit
from gemmc.backends.sm90 import stream_k as sk
from gemmc.bench.policy import parse_schedule
from gemmc.compiler import lower
from gemmc.ir.attrs import ScheduleAttr
from gemmc.schedule import Schedule, check_schedule, split_k_mode
from gemmc.spec import GemmSpec

from emit_support import compiled_ptx
from sm90_kernel_support import plain_kernel


def plan_of(spec=GemmSpec("M", "N", "K"), **kw):
    return lower(spec, Schedule(**{"tile": (128, 128, 64), "stream_k": True, **kw}))[1]


@given(tiles=st.integers(1, 700), k_tiles=st.integers(1, 200), slots=st.integers(1, 132))
def test_waves_and_shares_cover_each_iteration_once_and_the_fixup_finds_every_piece(tiles, k_tiles, slots):
    grid = sk.grid_clusters(tiles, k_tiles, slots)
    assert 1 <= grid <= min(tiles * k_tiles, slots)
    waves = sk.dp_waves(tiles, grid)
    # data-parallel whole waves, then between one and two waves' worth of tiles shared out (or none)
    left = tiles - waves * grid
    assert left == 0 or (tiles < grid and left == tiles) or grid < left < 2 * grid
    sk_iterations = left * k_tiles
    by_tile: dict[int, list] = {}
    for c in range(grid):
        ps = sk.pieces(c, tiles, k_tiles, grid)
        assert [p.tile for p in ps[:waves]] == [c + w * grid for w in range(waves)]
        split = [p for p in ps if p.k_count < k_tiles]
        assert len(split) <= 2 and len({p.unit for p in split}) == len(split)
        assert all(2 * c <= p.unit < 2 * c + 2 for p in ps)
        if sk_iterations:
            begin, end = sk.share(c, sk_iterations, grid)
            assert end - begin in (sk_iterations // grid, sk_iterations // grid + 1)
            assert all(sk.owner(i, sk_iterations, grid) == c for i in {begin, end - 1, (begin + end) // 2} if i < end)
        for p in ps:
            by_tile.setdefault(p.tile, []).append(p)
    assert sorted(by_tile) == list(range(tiles))
    for t, ps in by_tile.items():
        # contiguous, in cluster order, from k-tile 0 to the last
        assert [p.k_begin for p in ps] == [sum(q.k_count for q in ps[:i]) for i in range(len(ps))]
        assert sum(p.k_count for p in ps) == k_tiles
        if t >= waves * grid:
            assert sk.contributors(t, tiles, k_tiles, grid) == [(p.cluster, p.unit) for p in ps]
        else:
            assert len(ps) == 1


def _walk(cluster: int, tiles: int, k_tiles: int, grid: int) -> list[tuple]:
    """The kernel's own loop over this cluster's pieces (scheduler.py's stream-K walk, and the fix-up's owners
    of a split tile), run on Python ints: (tile, k_begin, k_count). One-row tiles of a tiles x 1 output."""
    with pytest.MonkeyPatch.context() as mp:
        kernel, cta, grid_dim = plain_kernel(mp, SPLIT_K_MODE="stream", TILE_MNK=(1, 1, 64))
        cta[2], grid_dim[2] = cluster, grid
        walk = kernel.stream_k_walk(tiles, 1, 1, k_tiles)
        out, sk_v = [], 0
        while sk_v < walk.length:
            work = kernel.stream_k_work(sk_v, walk, (0, 0), k_tiles)
            if work.k_count < k_tiles:
                owners = kernel.owners((work.sk_tile - walk.dp_tiles) * k_tiles, walk, k_tiles)
                contributors = sk.contributors(work.sk_tile, tiles, k_tiles, grid)
                assert owners == (contributors[0][0], contributors[-1][0])
            out.append((work.sk_tile, work.k_begin, work.k_count))
            sk_v = kernel.next_position(sk_v, None, work)
    return out


@given(tiles=st.integers(1, 300), k_tiles=st.integers(1, 90), slots=st.sampled_from([1, 7, 66, 132]))
def test_the_kernel_walks_the_models_pieces(tiles, k_tiles, slots):
    grid = sk.grid_clusters(tiles, k_tiles, slots)
    for c in {0, grid // 2, grid - 1}:
        assert _walk(c, tiles, k_tiles, grid) == [(p.tile, p.k_begin, p.k_count)
                                                  for p in sk.pieces(c, tiles, k_tiles, grid)]


def test_kernel_walks_its_share_instead_of_the_static_scheduler():
    src = emit(plan_of(cluster=(1, 2))).source
    assert "SPLIT_K_MODE = 'stream' " in src and re.search(r"^SPLIT_K = 1 ", src, re.M)
    from gemmc.backends.sm90.kernel import KernelFacts, scheduler
    facts = KernelFacts.from_namespace(_constants_of(src))
    assert facts.STREAM_K and facts.SUMS_PARTIALS and not facts.FIXUP
    # the stream-K grid: one cluster per resident slot (the plan's), at most one per iteration
    grid = ast.get_source_segment(text := Path(scheduler.__file__).read_text(), next(
        n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == "stream_k_grid"))
    assert "cutlass.max(cutlass.min(iterations, self.MAX_ACTIVE_CLUSTERS), 1)" in grid


def _constants_of(src: str) -> dict:
    """The generated module's facts, with the DSL names stubbed: what KernelFacts is built from."""
    stub = types.SimpleNamespace
    names = {"cutlass": stub(BFloat16="bf16", Float16="f16", Float32="f32"),
             "cute": stub(nvgpu=stub(OperandMajorMode=stub(K="K", MN="MN"))),
             "warpgroup": stub(SmemLayoutAtomKind=_AnyName()), "EpilogueInput": lambda *a: a}
    tree = ast.parse(src)
    body = [n for n in tree.body if isinstance(n, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id.isupper() and t.id != "KERNEL" for t in n.targets)]
    exec(compile(ast.Module(body=body, type_ignores=[]), "<facts>", "exec"), names)
    return names


class _AnyName:
    """Any attribute is its own name (the smem layout atom kinds)."""
    def __getattr__(self, name):
        return name


@pytest.mark.parametrize("tile, cluster", [((128, 128, 64), (1, 1)), ((128, 64, 64), (1, 2)), ((256, 128, 64), (2, 1))])
def test_workspace_holds_two_partial_tiles_per_cta_slot(tile, cluster):
    """The largest float4 the kernel writes (unit 2G - 1 of the last CTA rank) ends the workspace."""
    k = emit(plan_of(tile=tile, cluster=cluster))
    ws, sem = [p for p in k.params if p.kind in ("workspace", "semaphore")]
    slots = int(re.search(r"^MAX_ACTIVE_CLUSTERS = (\d+)", k.source, re.M).group(1))
    ranks = cluster[0] * cluster[1]
    threads, chunks = 256, tile[0] * tile[1] // 256 // 4
    last_unit = (2 * slots - 1) * ranks + ranks - 1
    assert int(ws.workspace_elems) == ((last_unit * chunks + chunks - 1) * threads + threads - 1) * 4 + 4
    env = {"M": 1000, "N": 3000, "L": 1}
    cm, cn = cluster
    assert eval(sem.workspace_elems, {}, env) == (-(-1000 // (tile[0] * cm)) * cm) * (-(-3000 // (tile[1] * cn)) * cn)


def test_stream_k_refuses_what_it_does_not_support():
    def limits(**kw):
        return {v.limit for v in check_schedule(Schedule(**{"tile": (128, 128, 64), "stream_k": True, **kw}),
                                                GemmSpec())}
    assert limits() == set()
    assert limits(swap_ab=True, tile=(128, 32, 64)) == set()
    assert "stream_k with split_k" in limits(split_k=2)
    assert "stream_k mode" in limits(mode="pingpong")
    assert limits(swizzle=8) == set() and limits(raster="n") == set()
    assert "stream_k" in limits(arch="sm_80", tile=(128, 128, 32), stages=3, mode="multistage")
    assert "tile M 192" in limits(tile=(192, 128, 64))
    assert "stream_k" in {v.limit for v in check_schedule(Schedule(stream_k=1), GemmSpec())}


def test_stream_k_round_trips_through_strings_dicts_and_ir():
    s = Schedule((128, 64, 64), (1, 2), stream_k=True)
    assert s.short().endswith("_streamk") and parse_schedule(s.short()) == s
    assert Schedule.from_dict(s.to_dict()) == s and "stream_k" not in Schedule().to_dict()
    assert ScheduleAttr.from_schedule(s).to_schedule() == s
    assert split_k_mode(s) == "stream" and split_k_mode(Schedule()) == "none"
    ir = lower(GemmSpec(), s)[0]
    text = next(iter(ir.values()))
    assert "stream_k = true" in text
    assert "split_k_mode stream" in list(ir.values())[-1]


def test_stream_k_ptx_counts_one_arrival_and_one_partial_per_fragment():
    plan = plan_of(cluster=(1, 2))
    ptx = compiled_ptx(emit(plan))
    frag = 128 * 128 // 256
    assert ptx.count("atom.global.acq_rel.add.u32") == 1
    assert ptx.count("st.global.v4.b32") == frag // 4
    # the sum reads one partial per fragment float4 inside its loop over the tile's pieces
    assert ptx.count("ld.global.v4.b32") == frag // 4
    assert ".multicast::cluster" in ptx


def test_the_policy_learns_only_from_schedules_its_features_describe(tmp_path):
    """A stream-K schedule encodes as its static twin, and a 192-row tile has no tile-M feature: rows of
    either (measured through `gemmc-search tune --also`) stay out of the policy's training examples."""
    from gemmc.search.db import TuningDB
    from gemmc.choose.features import describes
    from gemmc.search.rl import examples_from_db
    from gemmc.search.strategy import Measurement
    static = Schedule((128, 256, 64), (2, 1))
    stream, tall = static.with_(stream_k=True), Schedule((192, 192, 64), (1, 2))
    assert describes(static) and not describes(stream) and not describes(tall)
    db = TuningDB(tmp_path / "t.sqlite")
    spec = GemmSpec(1024, 4096, 4096)
    for s, t in ((static, 45.0), (stream, 58.0), (tall, 47.0), (Schedule((128, 128, 64)), 50.0)):
        db.record(spec, "sm_90a", Measurement(s, t, None, 45.0), "NVIDIA H200")
    (ex,) = examples_from_db(db)
    assert set(ex.schedules) == {static, Schedule((128, 128, 64))}


def test_compile_cli_takes_stream_k_and_refuses_it_with_split_k(capsys, shipped_only):
    from gemmc import cli
    rc = cli.main(["compile", "--m", "1024", "--n", "4096", "--k", "4096", "--tile", "128x256x64", "--cluster", "2x1",
                   "--stream-k"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.startswith("// schedule: 128x256x64_c2x1_coop_sauto_rm_sw1_k1_streamk (sm_90a)\n")
    assert "stream_k = true" in out and "split_k 1 split_k_mode stream" in out
    rc = cli.main(["compile", "--m", "1024", "--n", "4096", "--k", "4096", "--split-k", "2", "--stream-k"])
    _, err = capsys.readouterr()
    assert rc != 0 and "stream_k with split_k" in err and "use split_k=1" in err
