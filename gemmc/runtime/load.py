"""Load a built kernel .so through TVM-FFI, once per process: find the CuTe DSL runtime library it links,
check the file against its cache manifest, and tell a damaged file (worth rebuilding) from a host that cannot
load it (DamagedKernelError, KernelLoadError)."""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from pathlib import Path
from typing import Callable, Optional

from ..errors import LaunchError
from ..file_hash import sha256_file


_PRELOADED: dict[str, ctypes.CDLL] = {}
_FUNCTIONS: dict[tuple[str, str], Callable] = {}
_LOAD_LOCK = threading.Lock()


class KernelLoadError(LaunchError):
    """A built kernel .so could not be loaded on this host (a missing or unloadable runtime library,
    apache-tvm-ffi not installed, a file this account cannot read): the cache entry itself is intact."""


class DamagedKernelError(KernelLoadError):
    """The .so is not the file its cache entry recorded (missing, truncated, modified): rebuild the entry."""


# dlopen's words for a file that is not a whole shared object (checked only where no hash says so first)
_DAMAGED_MARKERS = ("file too short", "invalid ELF header", "cannot read file data", "ELF load command")


def cute_runtime_library_candidates(flavor: str = "") -> list[tuple[str, str]]:
    """(path, where it came from) of each libcute_dsl_runtime.so this host could load, in the order
    `find_cute_runtime_library` tries them. $GEMMC_CUTE_RUNTIME_LIB is listed even where it does not exist:
    an explicit setting is never skipped silently."""
    explicit = os.environ.get("GEMMC_CUTE_RUNTIME_LIB")
    if explicit:
        return [(explicit, "GEMMC_CUTE_RUNTIME_LIB")]
    found = []
    for entry in os.environ.get("CUTE_DSL_LIBS", "").split(os.pathsep):
        if entry.endswith("libcute_dsl_runtime.so") and os.path.exists(entry):
            found.append((entry, "CUTE_DSL_LIBS"))
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    flavors = list(dict.fromkeys(f for f in (flavor, "cu13", "cu12") if f))
    for root in roots:
        for f in flavors:
            cand = Path(root) / f / "lib" / "libcute_dsl_runtime.so"
            if cand.exists():
                found.append((str(cand), f"the nvidia_cutlass_dsl package ({f})"))
    return found


def find_cute_runtime_library(flavor: str = "") -> str:
    """Path of libcute_dsl_runtime.so, without importing cutlass.

    Order: $GEMMC_CUTE_RUNTIME_LIB, then $CUTE_DSL_LIBS, then the installed nvidia_cutlass_dsl package
    (the `flavor` the kernel was linked with first, e.g. "cu13", then the others).
    """
    found = cute_runtime_library_candidates(flavor)
    if found:
        return found[0][0]
    raise LaunchError("libcute_dsl_runtime.so not found: install nvidia-cutlass-dsl-libs (the runtime part of "
                      "nvidia-cutlass-dsl) or set GEMMC_CUTE_RUNTIME_LIB to its path")


def _origin(lib: str) -> str:
    for path, origin in cute_runtime_library_candidates():
        if path == lib:
            return origin
    return "the nvidia_cutlass_dsl package"


def _verify(so_path: str, sha256: str) -> None:
    try:
        ok = sha256_file(so_path) == sha256
    except FileNotFoundError as e:
        raise DamagedKernelError(f"{so_path} is missing from its cache entry; rebuild the entry") from e
    except OSError as e:
        raise KernelLoadError(f"cannot read {so_path}: {e.strerror or e}. The cache belongs to another account or is "
                              f"not readable here: ask its owner to `chmod -R a+rX` the cache folder, or build "
                              f"the kernel into a cache of your own (GEMMC_CACHE_DIR)") from e
    if not ok:
        raise DamagedKernelError(f"{so_path} does not match its cache manifest (corrupt or modified); "
                                 "delete its cache entry to rebuild it")


def _load_runtime_library(so_path: str, flavor: str) -> None:
    try:
        lib = find_cute_runtime_library(flavor)
    except LaunchError as e:
        raise KernelLoadError(f"loading {so_path}: {e}") from e
    if lib in _PRELOADED:
        return
    if not os.path.exists(lib):         # only an explicit setting names a path that is not there
        raise KernelLoadError(f"loading {so_path} needs libcute_dsl_runtime.so, but GEMMC_CUTE_RUNTIME_LIB={lib} "
                              f"does not exist: set GEMMC_CUTE_RUNTIME_LIB to the path of libcute_dsl_runtime.so"
                              f"{' (the ' + flavor + ' build)' if flavor else ''}, or unset it to use the "
                              "installed nvidia-cutlass-dsl-libs")
    origin = _origin(lib)
    try:
        # The .so names libcute_dsl_runtime.so as a dependency with no path; loading it globally
        # first lets the dynamic loader resolve it wherever the package is installed.
        _PRELOADED[lib] = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise KernelLoadError(f"loading {so_path} needs the CuTe DSL runtime library, and {lib} (from {origin}) "
                              f"does not load: {e}. Point GEMMC_CUTE_RUNTIME_LIB at a working "
                              f"libcute_dsl_runtime.so{' (' + flavor + ')' if flavor else ''}") from e


def load_function(so_path: str, function_name: str, flavor: str = "",
                  sha256: Optional[str] = None) -> Callable:
    """The TVM-FFI function `function_name` of a kernel .so; loaded once per process.
    With `sha256`, the file is checked first: a corrupt .so is never loaded.
    Raises DamagedKernelError where the file itself is at fault (worth rebuilding), KernelLoadError where
    this host is (the runtime library, apache-tvm-ffi, permissions: rebuilding would not help)."""
    key = (so_path, function_name)
    fn = _FUNCTIONS.get(key)
    if fn is not None:
        return fn
    with _LOAD_LOCK:
        fn = _FUNCTIONS.get(key)
        if fn is not None:
            return fn
        if sha256 is not None:
            _verify(so_path, sha256)
        _load_runtime_library(so_path, flavor)
        try:
            import tvm_ffi
        except ImportError as e:
            raise KernelLoadError(f"loading {so_path} needs apache-tvm-ffi, which does not import here ({e}): "
                                  "install it (pip install apache-tvm-ffi, the version the cache was built "
                                  "with)") from e
        try:
            module = tvm_ffi.load_module(so_path)
        except Exception as e:
            # A .so that matched its hash is the file the build wrote: then this host is at fault.
            damaged = sha256 is None and any(m in str(e) for m in _DAMAGED_MARKERS)
            if damaged or (sha256 is None and not os.path.exists(so_path)):
                raise DamagedKernelError(f"{so_path} is not a loadable shared object ({e}); rebuild it") from e
            raise KernelLoadError(f"{so_path} does not load on this host: {type(e).__name__}: {e}. Its runtime "
                                  f"libraries must match the build's (libcute_dsl_runtime.so"
                                  f"{' ' + flavor if flavor else ''}, apache-tvm-ffi): set GEMMC_CUTE_RUNTIME_LIB, "
                                  "or install the versions the cache was built with") from e
        try:
            fn = module[function_name]
        except Exception as e:
            raise DamagedKernelError(f"{so_path} has no function {function_name!r}, which its cache entry "
                                     "names; rebuild the entry") from e
        _FUNCTIONS[key] = fn
        return fn
