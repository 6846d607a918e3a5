"""The stream-K work decomposition of the SM90 kernel, in plain Python.

The kernel (kernel/scheduler.py: stream_k_walk, stream_k_work; kernel/fixup.py: stream_k_fixup) computes these same
integers on the device; this copy lets tests check the arithmetic over many sizes without a GPU, and
lets a reader see which CTA cluster computes what.

A grid of G clusters first runs whole waves of cluster tiles data-parallel: cluster c takes tiles c, c + G,
... (the static scheduler's order, and its L2 locality). The tiles left, those of the last partial wave and
one full wave before it, are shared out as stream-K iterations: (tile, k-tile) pairs, tile-major, split into
G contiguous shares, the first (count % G) of them one iteration longer. A share cut inside a tile leaves
that tile split into pieces; each cluster has at most two (its share's first and last), so the workspace
holds 2 G partial tiles per CTA rank.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Cluster `cluster`'s k-tiles [k_begin, k_begin + k_count) of cluster tile `tile`."""
    cluster: int
    tile: int
    k_begin: int
    k_count: int
    unit: int           # its workspace slot (per CTA rank) when the tile is split: 2 * cluster + j


def grid_clusters(tiles: int, k_tiles: int, max_active_clusters: int) -> int:
    """The kernel's grid: one cluster per resident slot, at most one per iteration (at least one)."""
    return max(min(tiles * k_tiles, max_active_clusters), 1)


def dp_waves(tiles: int, grid: int) -> int:
    """Whole waves run data-parallel: all of them when the tiles fill whole waves, else all but the last
    full one, which joins the partial wave in the stream-K share-out."""
    return max(tiles // grid - min(tiles % grid, 1), 0)


def share(cluster: int, sk_iterations: int, grid: int) -> tuple[int, int]:
    """[begin, end) of the stream-K iterations cluster `cluster` of `grid` owns."""
    q, r = divmod(sk_iterations, grid)
    return cluster * q + min(cluster, r), (cluster + 1) * q + min(cluster + 1, r)


def owner(iteration: int, sk_iterations: int, grid: int) -> int:
    """The cluster whose share holds stream-K iteration `iteration` (the kernel's branch-free form)."""
    q, r = divmod(sk_iterations, grid)
    return min(iteration // (q + 1), r) + max(iteration - r * (q + 1), 0) // q


def pieces(cluster: int, tiles: int, k_tiles: int, grid: int) -> list[Piece]:
    """The pieces cluster `cluster` computes, in order, as its producer and consumers walk them."""
    waves = dp_waves(tiles, grid)
    out = [Piece(cluster, cluster + w * grid, 0, k_tiles, 2 * cluster) for w in range(waves)]
    sk_iterations = (tiles - waves * grid) * k_tiles
    begin, end = share(cluster, sk_iterations, grid)
    it = begin
    while it < end:
        k_begin = it % k_tiles
        k_count = min(k_tiles - k_begin, end - it)
        out.append(Piece(cluster, waves * grid + it // k_tiles, k_begin, k_count, 2 * cluster + min(it - begin, 1)))
        it += k_count
    return out


def contributors(tile: int, tiles: int, k_tiles: int, grid: int) -> list[tuple[int, int]]:
    """(cluster, unit) of every piece of stream-K tile `tile`, in the order the last to arrive sums them."""
    dp_tiles = dp_waves(tiles, grid) * grid
    sk_iterations = (tiles - dp_tiles) * k_tiles
    first = (tile - dp_tiles) * k_tiles
    lo = owner(first, sk_iterations, grid)
    hi = owner(first + k_tiles - 1, sk_iterations, grid)
    return [(c, 2 * c + min(max(first - share(c, sk_iterations, grid)[0], 0), 1)) for c in range(lo, hi + 1)]
