"""Kernel cache: compiled artifacts on disk (`GEMMC_CACHE_DIR`, default ~/.cache/gemmc) plus an in-memory map.

Layout of one entry, `<root>/kernels/<key[:2]>/<key>/`:
    kernel.so, kernel.ptx, kernel.py (the emitted source), manifest.json (sha256 + size of every file, meta).
An entry is built in a private temp dir and published with one `os.replace` of the directory, under a
`filelock.FileLock` per key, so concurrent builders are safe and readers never see half an entry.
An entry whose manifest is missing, or whose files are missing or fail their hash, is treated as absent
(and rebuilt), never loaded.

This module must not import `cutlass`: a GPU host with only the runtime loads from the cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

MANIFEST = "manifest.json"
FORMAT_VERSION = 1          # bump when the entry layout changes


def _dist_version(name: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(name)
    except Exception:       # no metadata (vendored / runtime-only host): still a stable key part
        return "unknown"


def versions() -> dict[str, str]:
    """Versions that change what a compile produces. gemmc's comes from the module attribute because a
    GPU host may run gemmc from a checkout with no package metadata."""
    from . import __version__
    return {
        "gemmc": __version__,
        "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl"),
        "apache-tvm-ffi": _dist_version("apache-tvm-ffi"),
        "format": str(FORMAT_VERSION),
    }


def cache_key(key_material: str, arch: str, version_info: Optional[dict[str, str]] = None) -> str:
    """sha256 over the kernel's identity (lowered IR text or emitted source), the arch and the tool versions."""
    blob = json.dumps({"material": key_material, "arch": arch,
                       "versions": version_info if version_info is not None else versions()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def default_cache_dir() -> Path:
    env = os.environ.get("GEMMC_CACHE_DIR")
    return Path(env).expanduser() if env else Path("~/.cache/gemmc").expanduser()


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Artifact:
    """One built kernel in the cache. `meta` holds what the runtime needs without the compiler:
    the exported function name, the params (as JSON-able dicts), the arch and the runtime flavor."""
    key: str
    so_path: str
    ptx_path: Optional[str]
    source_path: Optional[str]
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    so_sha256: Optional[str] = None     # checked again right before the .so is loaded

    @property
    def directory(self) -> str:
        return os.path.dirname(self.so_path)

    @property
    def ptx(self) -> Optional[str]:
        if self.ptx_path is None:
            return None
        return Path(self.ptx_path).read_text()


class KernelCache:
    """Disk cache + in-memory map of `Artifact`s keyed by `cache_key(...)`."""

    def __init__(self, root: Optional[os.PathLike] = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self._memory: dict[str, Artifact] = {}
        self._mutex = threading.Lock()      # threads of one process; FileLock covers processes

    # -- paths -------------------------------------------------------------------------------------
    def entry_dir(self, key: str) -> Path:
        return self.root / "kernels" / key[:2] / key

    def _lock(self, key: str):
        from filelock import FileLock
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        return FileLock(str(locks / f"{key}.lock"))

    # -- reading -----------------------------------------------------------------------------------
    def _read_entry(self, key: str) -> Optional[Artifact]:
        """The entry if it is complete and every file matches its manifest hash; else None."""
        d = self.entry_dir(key)
        try:
            manifest = json.loads((d / MANIFEST).read_text())
            if manifest.get("key") != key:
                return None
            files = manifest["files"]
            for name, rec in files.items():
                p = d / name
                if p.stat().st_size != rec["size"] or sha256_file(p) != rec["sha256"]:
                    return None
            if "kernel.so" not in files:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return Artifact(
            key=key,
            so_path=str(d / "kernel.so"),
            ptx_path=str(d / "kernel.ptx") if "kernel.ptx" in files else None,
            source_path=str(d / "kernel.py") if "kernel.py" in files else None,
            meta=manifest.get("meta", {}),
            so_sha256=files["kernel.so"]["sha256"],
        )

    def lookup(self, key: str) -> Optional[Artifact]:
        """A verified artifact, from memory or disk; None on a miss or a corrupt entry."""
        art = self._memory.get(key)
        if art is not None:
            return art
        art = self._read_entry(key)
        if art is not None:
            with self._mutex:
                self._memory[key] = art
        return art

    def __contains__(self, key: str) -> bool:
        return self.lookup(key) is not None

    # -- writing -----------------------------------------------------------------------------------
    def invalidate(self, key: str) -> None:
        """Forget an entry (e.g. its .so failed to load) so the next get_or_build rebuilds it."""
        with self._mutex:
            self._memory.pop(key, None)
        with self._lock(key):
            shutil.rmtree(self.entry_dir(key), ignore_errors=True)

    def _publish(self, key: str, staging: Path, meta: dict) -> Artifact:
        """Write the manifest into `staging` and move it into place. Caller holds the key's lock."""
        files = {}
        for p in sorted(staging.iterdir()):
            if p.is_file() and p.name != MANIFEST:
                files[p.name] = {"sha256": sha256_file(p), "size": p.stat().st_size}
        if "kernel.so" not in files:
            raise RuntimeError(f"cache entry {key} has no kernel.so; the builder must write one")
        manifest = {"key": key, "files": files, "meta": meta}
        tmp = staging / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, staging / MANIFEST)
        dest = self.entry_dir(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():                       # a corrupt entry (a valid one was checked under the lock)
            graveyard = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-old-", dir=dest.parent))
            os.replace(dest, graveyard / "entry")
            shutil.rmtree(graveyard, ignore_errors=True)
        os.replace(staging, dest)
        art = self._read_entry(key)
        if art is None:
            raise RuntimeError(f"cache entry {dest} failed verification right after writing it")
        return art

    def get_or_build(self, key: str, builder: Callable[[Path], dict]) -> Artifact:
        """Return the verified entry for `key`, building it if absent or corrupt.

        `builder(staging_dir)` writes kernel.so (and optionally kernel.ptx, kernel.py) into the dir and
        returns the meta dict. It runs under the key's file lock, so a second process wanting the same
        kernel waits and then loads the first one's entry instead of compiling again.
        """
        art = self.lookup(key)
        if art is not None:
            return art
        with self._lock(key):
            art = self._read_entry(key)          # someone may have built it while we waited
            if art is None:
                tmp_root = self.root / "tmp"
                tmp_root.mkdir(parents=True, exist_ok=True)
                staging = Path(tempfile.mkdtemp(prefix=f"{key[:12]}-", dir=tmp_root))
                try:
                    meta = builder(staging)
                    art = self._publish(key, staging, dict(meta or {}))
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        with self._mutex:
            self._memory[key] = art
        return art


_DEFAULT: dict[str, KernelCache] = {}


def default_cache() -> KernelCache:
    """The process-wide cache for the current `GEMMC_CACHE_DIR` (re-read so tests can redirect it)."""
    root = str(default_cache_dir())
    c = _DEFAULT.get(root)
    if c is None:
        c = _DEFAULT[root] = KernelCache(root)
    return c
