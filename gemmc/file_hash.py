"""sha256 of a file, read in chunks: the cache's manifests record it and the runtime checks a .so against it.

A module of its own so that the cache and the runtime, which both need it, need not import each other.
"""
from __future__ import annotations

import hashlib


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
