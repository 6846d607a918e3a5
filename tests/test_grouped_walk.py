"""The grouped kernel's tile -> group walk (gemmc/backends/sm90/kernel/groups.py) run as plain Python: its own code,
a whole warp at once with numpy arrays as the lanes (shuffles, ballot and popc over them), against a plain
enumeration of each group's cluster tiles. Every tile of every group goes to exactly one CTA, in the plan's
order inside a group, group after group; no CTA steps back; groups without rows cost no unit; rows past M are
never reached whatever the offsets hold; the host's grid bound covers every unit."""
import importlib.util
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gemmc.backends.sm90.kernel import groups as groups_module
from gemmc.backends.sm90.kernel.scheduler import Walk

LANE = np.arange(32)


def _shuffle(x, lane):
    return x[lane] if isinstance(x, np.ndarray) else x


def _shuffle_up(x, d):
    x = np.broadcast_to(x, (32,))
    return np.where(LANE >= d, np.roll(x, d), x)


def _ballot(pred) -> int:
    return int(sum(1 << i for i in range(32) if pred[i]))


def _size(t, mode=None):
    return np.shape(t)[mode[0]] if mode is not None else int(np.size(t))


def plain_walker(cta, grid, **facts):
    """The GroupScheduler methods over simulated cute/cutlass: a warp's registers are numpy arrays of 32 lanes."""
    spec = importlib.util.spec_from_file_location("gemmc.backends.sm90.kernel.plain_groups", groups_module.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    arch = types.SimpleNamespace(lane_idx=lambda: LANE, shuffle_sync=_shuffle, shuffle_sync_up=_shuffle_up,
                                 vote_ballot_sync=_ballot, popc=lambda mask: bin(mask).count("1"),
                                 block_idx=lambda: tuple(cta), grid_dim=lambda: tuple(grid),
                                 make_warp_uniform=lambda v: v)
    module.cute = types.SimpleNamespace(jit=lambda f: f, arch=arch, size=_size,
                                        make_rmem_tensor=lambda shape, dtype: [0] * shape[0])
    module.cutlass = types.SimpleNamespace(Int32=lambda v: v, min=np.minimum, max=np.maximum, select_=np.where,
                                           range_constexpr=range, const_expr=lambda v: v)
    methods = {n: getattr(f, "__wrapped__", f) for n, f in vars(module.GroupScheduler).items() if callable(f)}
    walker = type("PlainWalker", (), methods)()
    values = dict(TILE_MNK=(128, 128, 64), CLUSTER_MN=(1, 1), GROUP_MASKED=False, GROUP_ORDER_M=True,
                  MAX_ACTIVE_CLUSTERS=132)
    values.update(facts)
    for name, value in values.items():
        setattr(walker, name, value)
    return walker


def group_rows(index, rows_limit, masked):
    """(first row, rows) of every group, clamped into [0, M], as the kernel reads them."""
    out = []
    for g in range(len(index) - (0 if masked else 1)):
        if masked:
            out.append((0, min(max(int(index[g]), 0), rows_limit)))
        else:
            start = min(max(int(index[g]), 0), rows_limit)
            out.append((start, min(max(int(index[g + 1]), start), rows_limit) - start))
    return out


def reference_units(index, rows_limit, n, tile, cluster, masked, order_m):
    """Each unit's (group, cluster m, cluster n), group after group, in the order inside a group."""
    bm, bn, _ = tile
    cm, cn = cluster
    clusters_n = -(-n // (bn * cn))
    units = []
    for g, (_, rows) in enumerate(group_rows(index, rows_limit, masked)):
        clusters_m = -(-rows // (bm * cm))
        cells = [(m, c) for c in range(clusters_n) for m in range(clusters_m)] if order_m else \
            [(m, c) for m in range(clusters_m) for c in range(clusters_n)]
        units += [(g, m, c) for m, c in cells]
    return units


def walk_every_cta(index, rows_limit, n, tile, cluster, masked, order_m, grid_clusters, k_tiles=7):
    """{(cta m, cta n, cluster z): [Work, ...]}: each CTA's walk as the kernel takes it."""
    cta, grid = [0, 0, 0], [cluster[0], cluster[1], grid_clusters]
    w = plain_walker(cta, grid, TILE_MNK=tile, CLUSTER_MN=cluster, GROUP_MASKED=masked, GROUP_ORDER_M=order_m)
    walks = {}
    for z in range(grid_clusters):
        for i in range(cluster[0]):
            for j in range(cluster[1]):
                cta[:] = [i, j, z]
                walk = w.group_walk(index, rows_limit, n, k_tiles)
                assert isinstance(walk, Walk) and walk.k_tile_total == k_tiles
                got, position, cursors = [], walk.start, []
                while position < walk.limit:
                    got.append(w.group_work(position, walk))
                    cursors.append(tuple(walk.groups.cursor))
                    position += walk.step
                assert cursors == sorted(cursors), "the cursor moved back"
                walks[(i, j, z)] = (walk.limit, got)
    return w, walks


@st.composite
def problems(draw):
    masked = draw(st.booleans())
    groups = draw(st.integers(1, 140))
    tile = (draw(st.sampled_from([64, 128, 256])), draw(st.sampled_from([64, 128, 256])), 64)
    cluster = (draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])))
    n = draw(st.integers(1, 3)) * tile[1] - draw(st.sampled_from([0, 8]))
    # most groups empty or small (decode), a few large (prefill imbalance)
    rows = draw(st.lists(st.one_of(st.just(0), st.integers(1, 40), st.integers(100, 700)), min_size=groups,
                         max_size=groups))
    if masked:
        rows_limit = max(rows + [1])
        index = np.array(rows, dtype=np.int32)
    else:
        start = draw(st.integers(0, 50))
        index = np.array([start] + list(start + np.cumsum(rows)), dtype=np.int32)
        rows_limit = int(index[-1]) + draw(st.integers(0, 60))
    return dict(index=index, rows_limit=rows_limit, n=n, tile=tile, cluster=cluster, masked=masked,
                order_m=draw(st.booleans()), grid_clusters=draw(st.integers(1, 24)))


@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_every_tile_of_every_group_goes_to_one_cta_in_order(problem):
    p = problem
    w, walks = walk_every_cta(**p)
    want = reference_units(p["index"], p["rows_limit"], p["n"], p["tile"], p["cluster"], p["masked"], p["order_m"])
    cm, cn = p["cluster"]
    rows = group_rows(p["index"], p["rows_limit"], p["masked"])
    seen = []
    for (i, j, z), (limit, works) in walks.items():
        assert limit == len(want)       # the walk's limit is the units of every group
        for unit, work in zip(range(z, limit, p["grid_clusters"]), works):
            g, m, c = want[unit]
            assert (work.group, work.tile_m, work.tile_n) == (g, m * cm + i, c * cn + j)
            assert (work.row0, work.rows) == rows[g]
            assert work.tile_l == (g if p["masked"] else 0) and work.k_count == 7 and work.k_begin == 0
            seen.append((g, work.tile_m, work.tile_n))
    tiles = sorted(seen)
    assert len(tiles) == len(set(tiles))
    bm, bn, _ = p["tile"]
    expect = sorted((g, tm, tn) for g, (_, r) in enumerate(rows) for tm in range(-(-r // (bm * cm)) * cm)
                    for tn in range(-(-p["n"] // (bn * cn)) * cn))
    assert tiles == expect
    # the host's grid: at least one cluster, at most MAX_ACTIVE_CLUSTERS, and no fewer than the units need
    out = np.broadcast_to(np.int8(0), (p["rows_limit"], p["n"], 1))
    (gm, gn, gz), _ = w.group_grid(out, p["index"])
    assert (gm, gn) == p["cluster"] and 1 <= gz <= w.MAX_ACTIVE_CLUSTERS and gz >= min(len(want), 132)


@settings(max_examples=40, deadline=None)
@given(groups=st.integers(1, 80), garbage=st.lists(st.integers(-2 ** 31, 2 ** 31 - 1), min_size=81, max_size=81),
       rows_limit=st.integers(1, 900), masked=st.booleans())
def test_any_offsets_keep_every_stored_row_inside_m(groups, garbage, rows_limit, masked):
    """Unsorted, negative or huge offsets (or counts) are wrong input, but no tile reaches past A or the output:
    each row the store writes (row0 + a tile row, below its group's row count) is below M."""
    index = np.array(garbage[:groups + (0 if masked else 1)], dtype=np.int64)
    _, walks = walk_every_cta(index, rows_limit, 128, (128, 128, 64), (1, 1), masked, True, 5)
    for limit, works in walks.values():
        assert limit < 2 ** 31
        for work in works:
            assert 0 <= work.row0 and work.row0 + work.rows <= rows_limit and work.rows >= 1
            assert work.tile_m * 128 < work.rows


def test_empty_groups_cost_no_units_and_the_cursor_skips_windows():
    """256 experts, 64 routed rows in two of them: 2 units (the one tile of each), found past 7 empty windows."""
    rows = [0] * 256
    rows[3], rows[250] = 40, 24
    index = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    _, walks = walk_every_cta(index, 64, 128, (128, 128, 64), (1, 1), False, True, 2)
    (limit0, w0), (limit1, w1) = walks[(0, 0, 0)], walks[(0, 0, 1)]
    assert limit0 == limit1 == 2
    assert [(w.group, w.row0, w.rows) for w in w0 + w1] == [(3, 0, 40), (250, 40, 24)]


@pytest.mark.parametrize("masked", [False, True])
def test_the_kernel_module_reads_only_simulated_names(masked):
    """The walk's methods read no cutlass or cute name the simulation above does not give (so the test runs the
    kernel's code, not a copy): every attribute they read off cute, cute.arch and cutlass is listed."""
    import ast
    import inspect
    src = inspect.getsource(groups_module)
    used = {f"{n.value.id}.{n.attr}" for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id in ("cute", "cutlass")}
    used |= {f"cute.arch.{n.attr}" for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Attribute) and getattr(n.value.value, "id", "") == "cute"
             and n.value.attr == "arch"}
    simulated = {"cute.jit", "cute.arch", "cute.size", "cute.make_rmem_tensor", "cutlass.Int32", "cutlass.min",
                 "cutlass.max", "cutlass.select_", "cutlass.range_constexpr", "cutlass.const_expr",
                 "cute.arch.lane_idx", "cute.arch.shuffle_sync", "cute.arch.shuffle_sync_up",
                 "cute.arch.vote_ballot_sync", "cute.arch.popc", "cute.arch.block_idx", "cute.arch.grid_dim",
                 "cute.arch.make_warp_uniform"}
    assert used <= simulated, used - simulated
