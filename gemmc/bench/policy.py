"""The `--policy` argument: `heuristic`, `auto`, or one fixed schedule written compactly.

Fixed schedules use the same tokens as `Schedule.short()`, joined by `_`, in any order after the tile:
    128x256x64_c2x1_coop            tile, cluster, mode (the rest default)
    128x128x64_c1x1_pp_s4_rn_sw8_k2  + stages, raster, swizzle, split-K
    128x128x64_k2_nopdl             plain launches (no programmatic dependent launch)
Tokens: `BMxBN[xBK]` tile (BK defaults to 64), `cMxN` cluster, `coop|cooperative|pp|pingpong`,
`sN|sauto` stages, `rm|rn` raster, `swN` swizzle, `kN` split-K, `nopdl` (pdl off), `swap` (A and B
swapped: the kernel computes out^T = b @ a^T; tile and cluster then read N first), `streamk` (stream-K).
"""
from __future__ import annotations

import re
from typing import Union

from ..errors import GemmcError
from ..schedule import Schedule

POLICIES = ("heuristic", "auto")

Policy = Union[str, Schedule]


class PolicyError(GemmcError, ValueError):
    """A --policy string is neither a policy name nor a schedule."""


_TILE = re.compile(r"^(\d+)x(\d+)(?:x(\d+))?$")
_CLUSTER = re.compile(r"^c(\d+)x(\d+)$")
_MODES = {"coop": "cooperative", "cooperative": "cooperative", "pp": "pingpong", "pingpong": "pingpong"}


def parse_schedule(text: str, arch: str = "sm_90a") -> Schedule:
    tokens = [t for t in text.strip().lower().split("_") if t]
    if not tokens:
        raise PolicyError("empty schedule string; write e.g. 128x256x64_c2x1_coop")
    tile = _TILE.match(tokens[0])
    if not tile:
        raise PolicyError(f"schedule {text!r}: the first token must be the tile 'BMxBNxBK' (e.g. 128x256x64), "
                          f"got {tokens[0]!r}")
    fields: dict = {"tile": (int(tile[1]), int(tile[2]), int(tile[3] or 64)), "arch": arch}

    def put(key, value, token):
        if key in fields and key not in ("tile", "arch"):
            raise PolicyError(f"schedule {text!r}: {key} given twice (at {token!r})")
        fields[key] = value

    for tok in tokens[1:]:
        if m := _CLUSTER.match(tok):
            put("cluster", (int(m[1]), int(m[2])), tok)
        elif tok in _MODES:
            put("mode", _MODES[tok], tok)
        elif m := re.match(r"^sw(\d+)$", tok):
            put("swizzle", int(m[1]), tok)
        elif m := re.match(r"^s(\d+|auto)$", tok):
            put("stages", m[1] if m[1] == "auto" else int(m[1]), tok)
        elif m := re.match(r"^r([mn])$", tok):
            put("raster", m[1], tok)
        elif m := re.match(r"^k(\d+)$", tok):
            put("split_k", int(m[1]), tok)
        elif tok == "nopdl":
            put("pdl", False, tok)
        elif tok == "swap":
            put("swap_ab", True, tok)
        elif tok == "streamk":
            put("stream_k", True, tok)
        elif m := re.match(r"^l2([abo])-(\w+)$", tok):
            put({"a": "l2_a", "b": "l2_b", "o": "l2_out"}[m[1]], m[2], tok)
        elif m := re.match(r"^pf(\d+)$", tok):
            put("l2_prefetch", int(m[1]), tok)
        else:
            raise PolicyError(f"schedule {text!r}: unknown token {tok!r}; use cMxN (cluster), coop|pp (mode), "
                              "sN (stages), rm|rn (raster), swN (swizzle), kN (split-K), nopdl (plain launches), "
                              "swap (A and B swapped), streamk (stream-K), l2a-P|l2b-P|l2o-P (L2 eviction priority "
                              "P of a, b, the store: first, normal, last), pfN (N k-tiles prefetched under PDL)")
    return Schedule(**fields)


def parse_policy(text: str, arch: str = "sm_90a") -> Policy:
    """'heuristic' / 'auto' stay names (gemmc.compile resolves them per shape); anything else is
    parsed as one fixed schedule used for every shape."""
    name = text.strip().lower()
    if name in POLICIES:
        return name
    try:
        return parse_schedule(name, arch)
    except PolicyError as e:
        raise PolicyError(f"--policy {text!r}: not 'heuristic', 'auto' or a schedule. {e}") from None


def policy_name(policy: Policy) -> str:
    return policy.short() if isinstance(policy, Schedule) else str(policy)
