"""Kernel cache: compiled artifacts on disk (`GEMMC_CACHE_DIR`, default ~/.cache/gemmc) plus an in-memory map.

Layout of one entry, `<root>/kernels/<key[:2]>/<key>/`:
    kernel.so, kernel.ptx, kernel.py (the emitted source), manifest.json (sha256 + size of every file, meta).
An entry is built in a private temp dir and published with one `os.replace` of the directory, under a
`filelock.FileLock` per key, so concurrent builders are safe and readers never see half an entry.
Published entries are as readable as the umask allows (a cache built by CI is read by other accounts), and
reading one takes no lock and no write access.
An entry whose manifest is missing, or whose kernel.so is missing or fails its hash, is treated as absent
(and rebuilt, with a warning naming it), never loaded. kernel.ptx and kernel.py are not needed to run: an
entry missing one of them still runs, and is rebuilt (with that warning) where a compiler is at hand.

`<root>/runtime-libs/<sha256 of libcute_dsl_runtime.so>/<nvidia-cutlass-dsl version>` records, per build,
which compiler version shipped each runtime library: a runtime-only host (the library without package
metadata) looks its library up there to compute the same keys as the build host.

This module must not import `cutlass`: a GPU host with only the runtime loads from the cache.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .errors import BuildError
from .file_hash import sha256_file

MANIFEST = "manifest.json"
FORMAT_VERSION = 1          # bump when the entry layout changes
RUNTIME_LIBS = "runtime-libs"
STALE_S = 3600              # a staging dir this old whose key no builder holds was left by a killed build
NO_ENTRY = "no such entry"  # KernelCache.inspect's reason for a key never built here

DSL = "nvidia-cutlass-dsl"
# A pip install of the runtime part alone has these, at the meta-distribution's version (which holds no files).
_DSL_PART_DISTS = ("nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13",
                   "nvidia-cutlass-dsl-libs-cu12")


def _dist_version(name: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(name)
    except Exception:       # no metadata (vendored / runtime-only host): still a stable key part
        return "unknown"


def dsl_version_from_metadata() -> Optional[str]:
    """nvidia-cutlass-dsl's version from package metadata, or None (e.g. the runtime bundle has none)."""
    for name in (DSL, *_DSL_PART_DISTS):
        v = _dist_version(name)
        if v != "unknown":
            return v
    return None


_FINGERPRINTS: dict[tuple, str] = {}


def runtime_library_fingerprints() -> list[tuple[str, str]]:
    """(path, sha256) of each libcute_dsl_runtime.so this host could load. Hashed once per process (~70 ms)."""
    from .runtime import cute_runtime_library_candidates
    out = []
    for path, _ in cute_runtime_library_candidates():
        try:
            st = os.stat(path)
            stamp = (path, st.st_size, st.st_mtime_ns, st.st_ino)
            if stamp not in _FINGERPRINTS:
                _FINGERPRINTS[stamp] = sha256_file(path)
        except OSError:
            continue
        out.append((path, _FINGERPRINTS[stamp]))
    return out


def recorded_dsl_version(root: os.PathLike) -> Optional[str]:
    """The nvidia-cutlass-dsl version a build recorded in `root` for this host's runtime library, or None.
    Where builds of several versions shipped the same library, the latest recorded wins."""
    records = Path(root) / RUNTIME_LIBS
    if not records.is_dir():
        return None
    for _, fp in runtime_library_fingerprints():
        try:
            found = [(e.stat().st_mtime, e.name) for e in os.scandir(records / fp)
                     if not e.name.startswith(".")]        # not a record still being written
        except OSError:
            continue
        if found:
            return max(found)[1]
    return None


def dsl_version(root: Optional[os.PathLike] = None) -> str:
    """nvidia-cutlass-dsl's version: the package metadata's; on a runtime-only host, the one the cache at
    `root` (default: GEMMC_CACHE_DIR) recorded for this host's runtime library; else "unknown"."""
    v = dsl_version_from_metadata()
    if v is None:
        v = recorded_dsl_version(root if root is not None else default_cache_dir())
    return v or "unknown"


def versions(root: Optional[os.PathLike] = None) -> dict[str, str]:
    """Versions that change what a compile produces. gemmc's comes from the module attribute because a
    GPU host may run gemmc from a checkout with no package metadata. `root`: the cache whose runtime-library
    records a host without nvidia-cutlass-dsl metadata reads (see `dsl_version`)."""
    from . import __version__
    return {
        "gemmc": __version__,
        "nvidia-cutlass-dsl": dsl_version(root),
        "apache-tvm-ffi": _dist_version("apache-tvm-ffi"),
        "format": str(FORMAT_VERSION),
    }


def cache_key(key_material: str, arch: str, version_info: Optional[dict[str, str]] = None) -> str:
    """sha256 over the kernel's identity (lowered IR text or emitted source), the arch and the tool versions."""
    blob = json.dumps({"material": key_material, "arch": arch,
                       "versions": version_info if version_info is not None else versions()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


_RELATIVE_ROOTS: dict[str, Path] = {}


def _absolute(path) -> Path:
    return Path(os.path.abspath(os.path.expanduser(path)))


def default_cache_dir() -> Path:
    """GEMMC_CACHE_DIR, absolute. A relative value is resolved against the working directory the first time
    it is read, so a later os.chdir does not move the cache."""
    env = os.environ.get("GEMMC_CACHE_DIR") or "~/.cache/gemmc"
    if os.path.isabs(os.path.expanduser(env)):
        return _absolute(env)
    if env not in _RELATIVE_ROOTS:
        _RELATIVE_ROOTS[env] = _absolute(env)
    return _RELATIVE_ROOTS[env]


def umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask sets it, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share(path: os.PathLike) -> None:
    """Give `path` (a file, or a dir and everything in it) the mode a plain create would have: mkdtemp and
    mkstemp make them private (0700 / 0600), and a cache one account builds, others read."""
    mask = umask()

    def chmod(p: str, executable: bool) -> None:
        os.chmod(p, (0o777 if executable else 0o666) & ~mask)

    if not os.path.isdir(path):
        chmod(path, bool(os.stat(path).st_mode & 0o100))
        return
    chmod(path, True)
    for dirpath, dirnames, filenames in os.walk(path):
        for d in dirnames:
            chmod(os.path.join(dirpath, d), True)
        for f in filenames:
            p = os.path.join(dirpath, f)
            chmod(p, bool(os.stat(p).st_mode & 0o100))


def unwritable_cache_error(root: os.PathLike, error: OSError, needed_for: str = "") -> BuildError:
    """The error for a cache folder this process cannot create or write (`needed_for`: what the write was for)."""
    where = f" ({error.filename})" if error.filename else ""
    blocker = next((p for p in (Path(root), *Path(root).parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        why = f"{blocker} is a file, not a folder"
    else:
        why = f"{error.strerror or error}{where}"
    needed = f" (needed {needed_for})" if needed_for else ""
    return BuildError(f"cannot write the kernel cache {root}{needed}: {why}. Set GEMMC_CACHE_DIR (or `gemmc build "
                      "--cache-dir DIR`) to a folder you can write, or make this one writable")


@dataclass(frozen=True)
class Artifact:
    """One built kernel in the cache. `meta` holds what the runtime needs without the compiler:
    the exported function name, the params (as JSON-able dicts), the arch and the runtime flavor.
    `defects`: what is wrong with files not needed to run (kernel.ptx, kernel.py), whose paths are then None."""
    key: str
    so_path: str
    ptx_path: Optional[str]
    source_path: Optional[str]
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    so_sha256: Optional[str] = None     # checked again right before the .so is loaded
    defects: tuple = field(default=(), compare=False, hash=False)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.so_path)

    @property
    def ptx(self) -> Optional[str]:
        if self.ptx_path is None:
            return None
        return Path(self.ptx_path).read_text()


def _check_file(d: Path, name: str, rec) -> str:
    """Why `d/name` does not match its manifest record, or ""."""
    p = d / name
    try:
        if p.stat().st_size != rec["size"] or sha256_file(p) != rec["sha256"]:
            return f"{name} fails its sha256 (damaged or modified since it was built)"
    except FileNotFoundError:
        return f"{name} is missing"
    except PermissionError:
        return f"cannot read {name}: permission denied (ask the cache's owner to `chmod -R a+rX` it)"
    except OSError as e:
        return f"cannot read {name}: {e.strerror or e}"
    except (KeyError, TypeError):
        return f"the manifest's record of {name} is malformed"
    return ""


class KernelCache:
    """Disk cache + in-memory map of `Artifact`s keyed by `cache_key(...)`."""

    def __init__(self, root: Optional[os.PathLike] = None):
        self.root = _absolute(root) if root is not None else default_cache_dir()
        self._memory: dict[str, Artifact] = {}
        self._mutex = threading.Lock()      # threads of one process; FileLock covers processes
        self._recorded: set[str] = set()

    # -- paths -------------------------------------------------------------------------------------
    def entry_dir(self, key: str) -> Path:
        return self.root / "kernels" / key[:2] / key

    def _lock(self, key: str, timeout: float = -1):
        from filelock import FileLock
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        return FileLock(str(locks / f"{key}.lock"), timeout=timeout)

    @contextlib.contextmanager
    def _locked(self, key: str, needed_for: Callable[[], str] = str):
        """The key's file lock; a cache folder that cannot hold it is a BuildError that says what to do."""
        try:
            lock = self._lock(key)
            lock.acquire()
        except OSError as e:
            raise unwritable_cache_error(self.root, e, needed_for()) from e
        try:
            yield
        finally:
            lock.release()

    def versions(self) -> dict[str, str]:
        return versions(self.root)

    # -- reading -----------------------------------------------------------------------------------
    def inspect(self, key: str) -> tuple[Optional[Artifact], str]:
        """(the entry if its manifest is sound and its kernel.so matches it, else None; why not, about the
        entry dir). Reads only."""
        d = self.entry_dir(key)
        try:
            manifest = json.loads((d / MANIFEST).read_text())
            files = manifest["files"]
            so = files["kernel.so"]
        except (FileNotFoundError, NotADirectoryError):
            return None, (NO_ENTRY if not d.exists() else
                          f"{MANIFEST} is missing (an unfinished or damaged entry)")
        except PermissionError:
            return None, ("cannot read it: permission denied (another account built it: ask its owner to "
                          f"`chmod -R a+rX {self.root}`, or use a cache of your own)")
        except OSError as e:
            return None, f"cannot read {MANIFEST}: {e.strerror or e}"
        except (ValueError, KeyError, TypeError):
            return None, f"{MANIFEST} is damaged (not a manifest that lists kernel.so)"
        if manifest.get("key") != key or not isinstance(files, dict):
            return None, f"{MANIFEST} is for another key (moved or damaged)"
        problem = _check_file(d, "kernel.so", so)
        if problem:
            return None, problem
        bad = {name: why for name, why in ((n, _check_file(d, n, rec)) for n, rec in sorted(files.items())
                                           if n != "kernel.so") if why}

        def optional(name: str) -> Optional[str]:
            return str(d / name) if name in files and name not in bad else None

        return Artifact(
            key=key,
            so_path=str(d / "kernel.so"),
            ptx_path=optional("kernel.ptx"),
            source_path=optional("kernel.py"),
            meta=manifest.get("meta", {}),
            so_sha256=so["sha256"],
            defects=tuple(bad.values()),
        ), ""

    def _read_entry(self, key: str) -> Optional[Artifact]:
        return self.inspect(key)[0]

    def lookup(self, key: str) -> Optional[Artifact]:
        """A verified, runnable artifact, from memory or disk; None on a miss or a damaged entry.
        Takes no lock and writes nothing: a read-only cache of another account serves hits."""
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

    def entries(self):
        """(entry dir, manifest dict) of every readable entry (for diagnostics: it reads every manifest)."""
        for path in sorted(glob.glob(str(self.root / "kernels" / "*" / "*" / MANIFEST))):
            try:
                yield Path(path).parent, json.loads(Path(path).read_text())
            except (OSError, ValueError):
                continue

    # -- writing -----------------------------------------------------------------------------------
    def invalidate(self, key: str) -> None:
        """Forget an entry (e.g. its .so failed its hash) so the next get_or_build rebuilds it."""
        with self._mutex:
            self._memory.pop(key, None)
        with self._locked(key):
            shutil.rmtree(self.entry_dir(key), ignore_errors=True)

    def record_runtime_libraries(self, dsl: str) -> None:
        """Record that nvidia-cutlass-dsl `dsl` ships this host's runtime libraries (see the module doc).
        Once per cache and version; best effort: a cache this account cannot write is left as it is."""
        if dsl in self._recorded:
            return
        self._recorded.add(dsl)
        records = self.root / RUNTIME_LIBS
        if glob.glob(str(records / "*" / glob.escape(dsl))):
            return
        from . import __version__
        try:
            for path, fp in runtime_library_fingerprints():
                (records / fp).mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".", dir=records / fp)
                with os.fdopen(fd, "w") as f:
                    json.dump({"library": path, "recorded_by": f"gemmc {__version__}"}, f)
                share(tmp)
                os.replace(tmp, records / fp / dsl)
        except OSError:
            pass

    def _sweep_stale(self) -> None:
        """Remove what killed builds left in tmp/: staging dirs older than STALE_S whose key nobody holds."""
        from filelock import Timeout
        now = time.time()
        try:
            leftovers = list(os.scandir(self.root / "tmp"))
        except OSError:
            return
        for e in leftovers:
            try:
                if now - e.stat(follow_symlinks=False).st_mtime < STALE_S:
                    continue
                key = e.name.split("-", 1)[0]
                if len(key) == 64:          # named after its key: skip it while a builder holds that key
                    with self._lock(key, timeout=0):
                        pass
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
            except (Timeout, OSError):
                continue

    def _publish(self, key: str, staging: Path, meta: dict) -> Artifact:
        """Write the manifest into `staging` and move it into place. Caller holds the key's lock."""
        files = {}
        for p in sorted(staging.iterdir()):
            if p.is_file() and p.name != MANIFEST:
                files[p.name] = {"sha256": sha256_file(p), "size": p.stat().st_size}
        if "kernel.so" not in files:
            raise BuildError(f"cache entry {key} has no kernel.so; the builder must write one")
        manifest = {"key": key, "files": files, "meta": meta}
        tmp = staging / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, staging / MANIFEST)
        share(staging)
        dest = self.entry_dir(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():                       # a damaged or incomplete entry (checked under the lock)
            graveyard = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-old-", dir=dest.parent))
            os.replace(dest, graveyard / "entry")
            shutil.rmtree(graveyard, ignore_errors=True)
        os.replace(staging, dest)
        art, why = self.inspect(key)
        if art is None:
            raise BuildError(f"cache entry {dest} failed verification right after writing it: {why}")
        return art

    def _build(self, key: str, builder: Callable[[Path], dict]) -> Artifact:
        self._sweep_stale()
        try:
            tmp_root = self.root / "tmp"
            tmp_root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=tmp_root))
        except OSError as e:
            raise unwritable_cache_error(self.root, e) from e
        try:
            meta = builder(staging)
            return self._publish(key, staging, dict(meta or {}))
        except OSError as e:
            # e.g. the disk filled up: the raw error would name a staging path that is about to be deleted
            name = os.path.basename(e.filename) if e.filename else "the entry"
            raise BuildError(f"writing the kernel cache {self.root} failed while writing {name}: "
                             f"{e.strerror or e}. Free space there, or set GEMMC_CACHE_DIR (`gemmc build "
                             "--cache-dir DIR`) to another folder") from e
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def get_or_build(self, key: str, builder: Callable[[Path], dict]) -> Artifact:
        """Return the verified, complete entry for `key`, building it if absent, damaged or incomplete.

        `builder(staging_dir)` writes kernel.so (and optionally kernel.ptx, kernel.py) into the dir and
        returns the meta dict. It runs under the key's file lock, so a second process wanting the same
        kernel waits and then loads the first one's entry instead of compiling again. A hit takes no lock.
        """
        art = self.lookup(key)
        if art is not None and not art.defects:
            return art
        def needed_for() -> str:
            return f"to build {key}: " + (self.inspect(key)[1] or "; ".join(art.defects if art else ()))

        with self._locked(key, needed_for):
            art, why = self.inspect(key)          # someone may have built it while we waited
            if art is None or art.defects:
                if art is not None or why != NO_ENTRY:      # there, but damaged or incomplete: say so
                    warnings.warn(f"gemmc: the cache entry {self.entry_dir(key)} is damaged "
                                  f"({why or '; '.join(art.defects)}); rebuilding it", stacklevel=3)
                art = self._build(key, builder)
        with self._mutex:
            self._memory[key] = art
        return art


_DEFAULT: dict[str, KernelCache] = {}


def cache_at(root: os.PathLike) -> KernelCache:
    """The process-wide cache at `root` (one per folder, so compiles into it share its in-memory hits)."""
    root = str(root)
    c = _DEFAULT.get(root)
    return c if c is not None else _DEFAULT.setdefault(root, KernelCache(root))


def default_cache() -> KernelCache:
    """The process-wide cache for the current `GEMMC_CACHE_DIR` (re-read so tests can redirect it)."""
    return cache_at(default_cache_dir())
