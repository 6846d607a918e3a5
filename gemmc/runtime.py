"""Load built kernels and launch them on torch tensors.

`Launcher(params, ...)` validates arguments against the kernel's params before anything launches
(device, dtype, rank, static dims, named dims agreeing across tensors, stride-1 contiguous dim,
16-byte aligned strides and data pointers), allocates the output and the split-K workspace, and calls
the TVM-FFI function. The stream is not an argument: the kernels are compiled with
`make_fake_stream(use_tvm_ffi_env_stream=True)`, and TVM-FFI sets its env stream from torch's current
stream for the tensors' device on every call (the DLPack exchange API's `current_work_stream`), so a
launch follows `torch.cuda.stream(...)` and CUDA graph capture.

This module must not import `cutlass`: it runs on GPU hosts that only have the runtime libraries.
"""
from __future__ import annotations

import ctypes
import importlib.util
import operator
import os
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

from .backends import Param
from .errors import LaunchError, PerformanceWarning
from .file_hash import sha256_file
from .alignment import ALIGN_BYTES as _ALIGN_BYTES, alignment_elems
from .types import DType, torch_dtype


# -- loading .so files ------------------------------------------------------------------------------

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


# -- params <-> JSON (artifact meta) ----------------------------------------------------------------

def param_from_dict(d: dict) -> Param:
    return Param(name=d["name"], kind=d["kind"], dtype=DType(d["dtype"]),
                 shape=tuple(d.get("shape", ())), contiguous=d.get("contiguous", -1),
                 role=d.get("role", ""), workspace_elems=d.get("workspace_elems"),
                 limits=tuple(tuple(x) for x in d.get("limits", ())))


# -- validation plan (precomputed once per kernel) ---------------------------------------------------

def _unit_dims(shape) -> tuple[int, ...]:
    """The dims of `shape` declared as a static 1."""
    return tuple(d for d, v in enumerate(shape) if not isinstance(v, str) and v == 1)


def is_batched(params: Sequence[Param]) -> bool:
    """Does the kernel carry a batch dim (a rank-3 output), whatever the dim is called or however big?"""
    return any(p.kind == "tensor" and p.role == "out" and len(p.shape) == 3 for p in params)


class _TensorCheck:
    """Everything needed to check one tensor argument, computed once."""
    __slots__ = ("name", "index", "torch_dtype", "dtype", "rank", "contig", "static", "named",
                 "align_elems", "shape_text", "sym_dims", "vector", "is_out")

    def __init__(self, p: Param, index: int, batched: bool = False):
        import torch
        self.name = p.name
        self.index = index
        self.is_out = p.role == "out"
        self.dtype = p.dtype
        self.torch_dtype = {DType.bf16: torch.bfloat16, DType.f16: torch.float16,
                            DType.f32: torch.float32}.get(p.dtype)
        if self.torch_dtype is None:
            raise LaunchError(f"{p.name}: dtype {p.dtype} has no runtime support yet")
        self.rank = len(p.shape)
        self.contig = p.contiguous % self.rank if self.rank else 0
        self.static = tuple((i, int(d)) for i, d in enumerate(p.shape) if not isinstance(d, str))
        self.named = tuple((i, d) for i, d in enumerate(p.shape) if isinstance(d, str))
        self.sym_dims = tuple(i for i, _ in self.named)
        self.align_elems = alignment_elems(p.dtype)
        self.shape_text = "(" + ", ".join(str(d) for d in p.shape) + ")"
        # epilogue vectors ((N,), (M,); (L, N), (L, M) in a batched kernel, whatever its batch dim) are read
        # element-wise: their length need not be a multiple of 16 bytes
        self.vector = p.role == "input" and (self.rank == 1 or (batched and self.rank == 2))


_WORKSPACE_STREAMS_KEPT = 4
_WORKSPACE_VIEWS_KEPT = 256


class WorkspacePool:
    """Split-K scratch shared by every launcher: one buffer per (device, stream, dtype).

    Kernels overwrite the partials they read back, so one kernel's leftovers never matter to the next;
    calls on one stream are ordered, so sharing within a stream is safe, and two streams never share.
    One pool (not one buffer per launcher) keeps a sweep over hundreds of split-K kernels at the size of
    its largest workspace. A launch being captured into a CUDA graph gets scratch of its own from the
    graph's pool, never a pooled buffer: the graph keeps that pointer for its replays. A buffer outgrown
    is kept alive, not freed (growth at least doubles, so this costs at most the size of the newest).
    Only the newest `_WORKSPACE_STREAMS_KEPT` streams per device are kept, so a caller that makes a new
    stream per call does not pin memory forever.
    """

    def __init__(self):
        self.buffers: dict[tuple, Any] = {}       # (device, stream, dtype) -> newest buffer
        self.outgrown: dict[tuple, list] = {}     # same key -> smaller buffers a graph may still use
        self._views: dict[tuple, Any] = {}        # (key, elems) -> view of the newest buffer (slicing costs ~1 us)
        self._lock = threading.Lock()             # launchers on several threads (streams) grow it at once

    def get(self, dtype: DType, elems: int, device):
        if _capturing(device):
            # A graph keeps the pointer it was captured with: give it memory of its own (the graph's pool),
            # never a pooled buffer, which eager calls on this stream would share with the replays and
            # which dropping this stream (only the newest streams are kept) would free under the graph.
            # Uninitialised on purpose: kernels overwrite every partial they read, and zeroing would put a
            # memset of the whole workspace into every replay.
            return _empty(dtype, max(elems, 1), device)[:elems]
        key = (device, _current_raw_stream(device), dtype)
        view = self._views.get((key, elems))
        if view is not None:
            return view
        with self._lock:
            buf = self.buffers.get(key)
            if buf is not None and buf.numel() >= elems:
                if len(self._views) >= _WORKSPACE_VIEWS_KEPT:     # a serving loop sees a new M per call
                    self._views.clear()
                view = self._views[(key, elems)] = buf[:elems]
                return view
            return self._grow(key, dtype, elems, device, buf)

    def _grow(self, key, dtype: DType, elems: int, device, buf):
        size = max(elems, 1, 2 * buf.numel() if buf is not None else 0)
        new = _zeros(dtype, size, device)
        if buf is not None:
            self.outgrown.setdefault(key, []).append(buf)
        streams = list(dict.fromkeys(k[1] for k in self.buffers if k[0] == device and k[1] != key[1]))
        for old_stream in streams[:max(0, len(streams) + 1 - _WORKSPACE_STREAMS_KEPT)]:
            for k in [k for k in self.buffers if k[0] == device and k[1] == old_stream]:
                del self.buffers[k]
                self.outgrown.pop(k, None)
        self.buffers[key] = new
        self._views = {vk: v for vk, v in self._views.items() if vk[0] in self.buffers and vk[0] != key}
        view = self._views[(key, elems)] = new[:elems]
        return view

    def nbytes(self) -> int:
        bufs = list(self.buffers.values()) + [b for v in self.outgrown.values() for b in v]
        return sum(b.numel() * b.element_size() for b in bufs)


WORKSPACES = WorkspacePool()


_CAPTURES_KEPT = 64
_MAX_SCRATCH_ELEMS = 2 ** 31     # kernels index their scratch with 32-bit integers


class SemaphorePool:
    """The split-K fix-up's per-tile arrival counters (i32): zero when a kernel starts, and every kernel
    leaves the ones it used at zero again. One zeroed buffer per (device, stream), shared by the launchers
    on that stream (their calls are ordered); never shared between streams.

    A launch being captured into a CUDA graph gets counters of the graph's own (its pool), zeroed by a
    memset that is part of the graph: once per capture and stream, at the first split-K launch, when the
    capture's id can be read (the driver's cuStreamGetCaptureInfo), else at every split-K launch. A pooled
    buffer would be shared between the replays and whatever runs on other streams meanwhile. The buffers
    of the newest `_CAPTURES_KEPT` captures are held, so no later allocation of the capture reuses them.
    """

    def __init__(self):
        self.buffers: dict[tuple, Any] = {}       # (device, stream) -> buffer
        self.captured: dict[tuple, list] = {}     # (device, stream, capture id) -> its buffers, newest last
        self._lock = threading.Lock()

    def get(self, elems: int, device):
        if _capturing(device):
            return self._captured(elems, device)
        key = (device, _current_raw_stream(device))
        buf = self.buffers.get(key)
        if buf is not None and buf.numel() >= elems:
            return buf
        with self._lock:
            buf = self.buffers.get(key)
            if buf is None or buf.numel() < elems:
                # the old buffer may still be in use by a queued kernel on this stream; the caching
                # allocator frees it in stream order, so dropping it here is safe
                size = max(elems, 1024, 2 * buf.numel() if buf is not None else 0)
                buf = self.buffers[key] = _zeros(DType.i32, size, device)
            return buf

    def _captured(self, elems: int, device):
        stream = _current_raw_stream(device)
        capture = _capture_id(stream)
        if capture is None:
            return _zeros(DType.i32, max(elems, 1), device)
        key = (device, stream, capture)
        with self._lock:
            bufs = self.captured.get(key)
            if bufs and bufs[-1].numel() >= elems:
                return bufs[-1]
            if bufs is None:
                bufs = self.captured[key] = []
                for old in list(self.captured)[:max(0, len(self.captured) - _CAPTURES_KEPT)]:
                    del self.captured[old]
            bufs.append(_zeros(DType.i32, max(elems, 1024, 2 * bufs[-1].numel() if bufs else 0), device))
            return bufs[-1]

    def nbytes(self) -> int:
        held = list(self.buffers.values()) + [b for bufs in self.captured.values() for b in bufs]
        return sum(b.numel() * b.element_size() for b in held)


_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1
_cu_capture_info: Any = None


def _capture_id(stream: int) -> Optional[int]:
    """The id of the CUDA graph capture under way on `stream` (driver API, through ctypes), or None when it
    cannot be read."""
    global _cu_capture_info
    if _cu_capture_info is None:
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuStreamGetCaptureInfo   # the (stream, status*, id*) entry point
            fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64)]
            fn.restype = ctypes.c_int
            _cu_capture_info = fn
        except (OSError, AttributeError):
            _cu_capture_info = False
    if not _cu_capture_info:
        return None
    status, capture = ctypes.c_int(0), ctypes.c_uint64(0)
    if _cu_capture_info(ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(capture)) != 0:
        return None
    return capture.value if status.value == _CU_STREAM_CAPTURE_STATUS_ACTIVE else None


SEMAPHORES = SemaphorePool()


def _zeros(dtype: DType, elems: int, device):
    import torch
    return torch.zeros(elems, dtype=torch_dtype(dtype), device=device)


def _empty(dtype: DType, elems: int, device):
    import torch
    return torch.empty(elems, dtype=torch_dtype(dtype), device=device)


def _capturing(device) -> bool:
    """Is torch's current stream for `device` capturing a CUDA graph?"""
    if device.type != "cuda":
        return False
    import torch
    return torch.cuda.is_current_stream_capturing()


def _current_raw_stream(device) -> int:
    """torch's current CUDA stream handle for `device` (the cheap private accessor when it exists)."""
    import torch
    if device.type != "cuda":
        return 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def _dtype_name(torch_dtype) -> str:
    return str(torch_dtype).replace("torch.", "")


_MISSING = object()


class CallSignature:
    """The arguments a caller passes, in order and by name, and how they bind: too many, unknown, repeated
    or missing ones raise a LaunchError naming the parameters; trailing parameters with defaults may be left
    out. A Launcher built with one takes these arguments instead of the kernel's (a, b, *inputs): a
    @gemmc.kernel function's own (gemmc.dsl.Kernel.call_signature).

    `names`: the caller's parameter names, in call order. `operands`: (kernel param, caller's name) pairs for
    the params the caller names otherwise, e.g. (("a", "x"), ("b", "w")). `defaults`: (name, value) pairs.
    `declared`: (name, declared shape) of vectors declared with unit dims, e.g. ("c", ("M", 1)): the caller
    passes that shape and the kernel gets a view without the unit dims.
    """

    def __init__(self, name: str, names: Sequence[str], *, operands: Sequence[tuple[str, str]] = (),
                 defaults: Sequence[tuple[str, Any]] = (), declared: Sequence[tuple[str, tuple]] = ()):
        self.name = name
        self.names = tuple(names)
        self.operands = tuple(operands)
        self.defaults = dict(defaults)
        self.declared = tuple(declared)
        self.usage = ", ".join(self.names)
        self._position = {n: j for j, n in enumerate(self.names)}
        unknown = [n for n in (*self.defaults, *(d for d, _ in self.declared)) if n not in self._position]
        if unknown:
            raise LaunchError(f"{name}: defaults or declared shapes for {unknown}, which are not among its "
                              f"arguments ({self.usage})")

    def __repr__(self) -> str:
        return f"<gemmc.CallSignature {self.name}({self.usage})>"

    def position(self, name: str) -> int:
        return self._position[name]

    def bind(self, args: Sequence, named: dict) -> tuple:
        """The call's arguments in `names` order, defaults filled in; LaunchError if they do not bind."""
        n = len(self.names)
        if len(args) == n and not named:
            return tuple(args)
        if len(args) > n:
            raise LaunchError(f"{self.name} takes {n} arguments ({self.usage}), got {len(args)} positional")
        values = list(args) + [_MISSING] * (n - len(args))
        for key, v in named.items():
            j = self._position.get(key)
            if j is None:
                raise LaunchError(f"{self.name} has no argument {key!r}; its arguments are: {self.usage} "
                                  "(and out=)")
            if values[j] is not _MISSING:
                raise LaunchError(f"{self.name}: argument {key!r} given twice (positionally and by name)")
            values[j] = v
        for j, v in enumerate(values):
            if v is _MISSING:
                name = self.names[j]
                if name not in self.defaults:
                    raise LaunchError(f"{self.name}: missing argument {name!r}; call it as {self.name}({self.usage})")
                values[j] = self.defaults[name]
        return tuple(values)


def python_prologue(params: Sequence[Param], device_type: str = "cuda") -> Callable:
    """What a compiled function's TVM-FFI prologue checks before it launches (type, device, dtype, rank, static
    dims, one extent per named dim, the stride-1 dim, 16-byte strides and data pointer), in Python: for a
    function with no prologue of its own (the cuBLAS route, gemmc.compiler.CublasRoute). Call it with the
    values in param order; an output given as None (to be allocated) is skipped. It raises TypeError /
    ValueError as the prologue does, so the Launcher's validator can then say what to change; the rules are
    the validator's (Launcher._check_tensor), without building messages on the way. One difference, kept off the
    fast path: an empty tensor's strides are checked here and not by the validator, so the cuBLAS route sends
    what this rejects and the validator passes (an empty problem) on to torch.matmul."""
    import torch
    batched = is_batched(params)
    checks = []
    for i, p in enumerate(params):
        if p.kind != "tensor":
            continue
        c = _TensorCheck(p, i, batched)
        static_shape = tuple(p.shape) if not c.named else None     # all static: one comparison
        loose_extent = c.contig in c.sym_dims and not c.vector      # its extent must be 16-byte aligned
        checks.append((c, static_shape, loose_extent, tuple(d for d in range(c.rank) if d != c.contig)))
    checks = tuple(checks)
    tensor_type = torch.Tensor
    on_device = operator.attrgetter(f"is_{device_type}")       # t.device.type costs ~0.5 us

    def prologue(*values):
        device = None
        sizes: dict = {}
        for c, static_shape, loose_extent, strided in checks:
            t = values[c.index]
            if t is None and c.is_out:
                continue
            if not isinstance(t, tensor_type) or t.dtype is not c.torch_dtype or t.dim() != c.rank:
                raise TypeError(f"argument #{c.index} ({c.name}): expected a {c.dtype} tensor of shape "
                                f"{c.shape_text}")
            if device is None:
                device = t.device
                if not on_device(t):
                    raise ValueError(f"argument #{c.index} ({c.name}): expected a {device_type} tensor")
            elif t.device != device:
                raise ValueError(f"argument #{c.index} ({c.name}): on another device than the others")
            shape = t.shape
            if static_shape is not None:
                if shape != static_shape:
                    raise ValueError(f"argument #{c.index} ({c.name}): expected shape {c.shape_text}")
            else:
                for d, v in c.static:
                    if shape[d] != v:
                        raise ValueError(f"argument #{c.index} ({c.name}): shape[{d}] must be {v}")
                for d, dim in c.named:
                    if sizes.setdefault(dim, shape[d]) != shape[d]:
                        raise ValueError(f"argument #{c.index} ({c.name}): {dim} disagrees with the other "
                                         "arguments")
            stride = t.stride()
            k, a = c.contig, c.align_elems
            if (stride[k] != 1 and shape[k] != 1) or (loose_extent and shape[k] % a) or t.data_ptr() % _ALIGN_BYTES:
                raise ValueError(f"argument #{c.index} ({c.name}): strides {stride} or data pointer not aligned")
            for d in strided:
                if stride[d] % a:
                    raise ValueError(f"argument #{c.index} ({c.name}): stride({d}) = {stride[d]} is not "
                                     f"{_ALIGN_BYTES}-byte aligned")

    return prologue


class Launcher:
    """Call a compiled kernel with torch tensors: `launcher(*inputs, out=None, **named)`.

    Positional arguments fill, in order, the kernel's tensor params other than the output and the
    scalars; any of them may be passed by name instead. The output is allocated unless `out=` is given.
    With `signature` (a CallSignature), the arguments are the caller's own instead, in its order and by its
    names (a @gemmc.kernel function's parameters), and messages name them.
    `function` is the TVM-FFI callable; alternatively `so_path` + `function_name` load it lazily.
    `device_type` is "cuda"; the CPU tests pass "cpu" to exercise the other checks without a GPU.
    `always_validate` (or GEMMC_VALIDATE=1) runs the Python validator on every call instead of only
    when the compiled function's prologue rejects the arguments.
    An empty problem never launches: with M, N or the batch 0 the (empty) output is returned as it is; with
    K = 0, `zero_k(a, b, inputs, out)` writes the epilogue of a zero accumulator (a LaunchError without it).
    `strided=True` (with `always_validate`, for a torch function rather than a kernel) checks no strides or
    alignment.
    """

    def __init__(self, params: Sequence[Param], *, function: Optional[Callable] = None,
                 so_path: Optional[str] = None, function_name: Optional[str] = None,
                 runtime_flavor: str = "", so_sha256: Optional[str] = None,
                 name: str = "kernel", device_type: str = "cuda",
                 on_load_error: Optional[Callable[[Exception], Callable]] = None,
                 always_validate: Optional[bool] = None, signature: Optional[CallSignature] = None,
                 zero_k: Optional[Callable] = None, strided: bool = False):
        if function is None and so_path is None:
            raise ValueError("Launcher needs a function or a so_path")
        if signature is not None:       # messages name the caller's parameters: x and w, not a and b
            renamed = dict(signature.operands)
            params = [replace(p, name=renamed[p.name]) if p.name in renamed else p for p in params]
            name = signature.name
        self.params = tuple(params)
        self.name = name
        self.device_type = device_type
        self._function = function
        self._so_path = so_path
        self._function_name = function_name
        self._flavor = runtime_flavor
        self._so_sha256 = so_sha256
        self._on_load_error = on_load_error
        self._zero_k = zero_k
        self._strided = strided

        outs = [i for i, p in enumerate(self.params) if p.kind == "tensor" and p.role == "out"]
        if len(outs) != 1:
            raise LaunchError(f"{name}: expected exactly one tensor param with role 'out', found {len(outs)}")
        self._out_index = outs[0]
        user = [i for i, p in enumerate(self.params)
                if (p.kind == "tensor" and i != self._out_index) or p.kind == "scalar"]
        if signature is None:
            signature = CallSignature(name, [self.params[i].name for i in user])
        by_name = {self.params[i].name: i for i in user}
        if sorted(signature.names) != sorted(by_name):
            raise LaunchError(f"{name}: the call signature ({signature.usage}) does not name the kernel's "
                              f"arguments ({', '.join(by_name)})")
        self.signature = signature
        self._user = tuple(by_name[n] for n in signature.names)     # kernel param index per call position
        batched = is_batched(self.params)
        self._tensor_checks = tuple(_TensorCheck(p, i, batched) for i, p in enumerate(self.params)
                                    if p.kind == "tensor" and i != self._out_index)
        self._out_check = _TensorCheck(self.params[self._out_index], self._out_index, batched)
        self._scalars = tuple(i for i, p in enumerate(self.params) if p.kind == "scalar")
        self._operands = tuple(i for i, p in enumerate(self.params) if p.kind == "tensor" and p.role in ("a", "b"))
        self._epilogue_inputs = tuple(i for i, p in enumerate(self.params) if p.role in ("input", "scalar"))
        self._workspaces = tuple(
            (i, compile(p.workspace_elems or "0", f"<{p.name}.workspace_elems>", "eval"))
            for i, p in enumerate(self.params) if p.kind in ("workspace", "semaphore"))
        # fast path: where each named dim is read from (user arg position, dim), and a value template
        self._n_user = len(self._user)
        self._dim_sources = []
        seen = set()
        for j, i in enumerate(self._user):
            p = self.params[i]
            if p.kind != "tensor":
                continue
            for d, dim in enumerate(p.shape):
                if isinstance(dim, str) and dim not in seen:
                    seen.add(dim)
                    self._dim_sources.append((dim, j, d))
        self._dim_sources = tuple(self._dim_sources)
        # named dims a launch grid carries, with their largest extent: a larger call takes the checked path
        self._limit_dims = tuple((p.shape[d], most, f"{p.name}.shape[{d}]") for p in self.params
                                 if p.kind == "tensor" for d, most in p.limits if isinstance(p.shape[d], str))
        # Static extents of 1 are compiled as free symbols (gemmc.build._fake_extent), so the prologue cannot
        # check them: the fast path does, (call position, dim) and the output's dims.
        self._unit_dims = tuple((j, d) for j, i in enumerate(self._user) if self.params[i].kind == "tensor"
                                for d in _unit_dims(self.params[i].shape))
        self._out_unit_dims = _unit_dims(self.params[self._out_index].shape)
        firsts = [j for j, i in enumerate(self._user) if self.params[i].kind == "tensor"]
        self._first_tensor = firsts[0] if firsts else 0
        self._template = [None] * len(self.params)
        # Vectors declared with unit dims ((M, 1), (1, N)) reach the kernel as views without them.
        self._unit_vectors = tuple(
            (signature.position(n), _unit_dims(shape), len(shape), "(" + ", ".join(str(v) for v in shape) + ")")
            for n, shape in signature.declared)
        # Batched kernels take per-batch vectors (L, N) / (L, M), whatever the batch dim is called or however
        # big it is; a vector without it is shared by every batch, so it is passed as a stride-0 expansion
        # rather than copied.
        self._batch_vectors = tuple(j for j, i in enumerate(self._user)
                                    if batched and self.params[i].role == "input" and len(self.params[i].shape) == 2)
        self._reshapes = bool(self._unit_vectors or self._batch_vectors)
        if always_validate is None:
            always_validate = os.environ.get("GEMMC_VALIDATE", "") not in ("", "0")
        self.always_validate = always_validate

    @property
    def always_validate(self) -> bool:
        return self._always_validate

    @always_validate.setter
    def always_validate(self, value: bool) -> None:
        self._always_validate = bool(value)
        self._lean = None if value else self._lean_plan()

    def _lean_plan(self) -> Optional["_LeanCall"]:
        """What the lean call path needs, for a kernel whose calls need no more than their arguments and an
        output: no static extents of 1 to check, no grid limit, no scratch, no reshaped vectors, a row-major
        output. None for any other kernel (the general fast path in __call__ takes it)."""
        c = self._out_check
        if (self._unit_dims or self._out_unit_dims or self._limit_dims or self._workspaces or self._reshapes
                or c.contig != c.rank - 1 or len(self.params) != self._n_user + 1):
            return None
        position = {i: j for j, i in enumerate(self._user)}
        position[self._out_index] = self._n_user
        source = {name: (j, d) for name, j, d in self._dim_sources}
        out_shape = self.params[self._out_index].shape
        if any(isinstance(d, str) and d not in source for d in out_shape):
            return None         # an output dim no argument gives: the checked path says so
        return _LeanCall(
            kernel_order=operator.itemgetter(*(position[i] for i in range(len(self.params)))),
            nonzero=tuple((j, d) for _, j, d in self._dim_sources),
            out_dims=tuple(source[d] if isinstance(d, str) else int(d) for d in out_shape),
            out_dtype=c.torch_dtype)

    # -- the compiled function --
    @property
    def function(self) -> Callable:
        fn = self._function
        if fn is None:
            try:
                fn = load_function(self._so_path, self._function_name, self._flavor, self._so_sha256)
            except DamagedKernelError as e:
                # Only a damaged file is worth rebuilding; a host problem (KernelLoadError) is raised as it
                # is, and the cache entry, which other hosts can load, is left alone.
                if self._on_load_error is None:
                    raise
                fn = self._on_load_error(e)      # e.g. the cache rebuilds the entry
            self._function = fn
        return fn

    # -- argument binding --
    def _arguments(self, args: tuple, named: dict) -> tuple:
        """The call's arguments in call order: bound (LaunchError if they do not bind), vectors reshaped."""
        if named or len(args) != self._n_user:
            args = self.signature.bind(args, named)
        return self._reshaped(args) if self._reshapes else args

    def _reshaped(self, args: tuple) -> tuple:
        args = list(args)
        for j, dims, rank, declared in self._unit_vectors:
            t = args[j]
            if not hasattr(t, "dim"):
                continue                 # not a tensor: the validator says so
            if t.dim() != rank or any(t.shape[d] != 1 for d in dims):
                raise LaunchError(f"{self.signature.names[j]} must be {rank}-D with shape {declared} (as "
                                  f"{self.signature.name} declares it), got {t.dim()}-D shape {tuple(t.shape)}")
            args[j] = t.squeeze(dims)
        if self._batch_vectors:
            lead = next((a.shape[0] for a in args if hasattr(a, "dim") and a.dim() == 3), None)
            if lead is not None:
                for j in self._batch_vectors:
                    t = args[j]
                    if hasattr(t, "dim") and t.dim() == 1:
                        args[j] = t.expand(lead, t.shape[0])
        return tuple(args)

    # -- validation --
    def _check_tensor(self, c: _TensorCheck, t, sizes: dict, where: dict, device) -> Any:
        import torch
        # `out` is written in place: a converted copy would take the result instead of the caller's buffer
        remedy = ((lambda copy, alloc: f"allocate {c.name} {alloc} (a converted copy would receive the result, "
                   f"not your buffer)") if c.is_out else (lambda copy, alloc: f"pass {copy}"))
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"{c.name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != self.device_type:
            raise LaunchError(f"{c.name} must be on a {self.device_type} device, got {t.device}: "
                              + remedy(f"{c.name}.to('{self.device_type}')", f"on a {self.device_type} device"))
        if device is None:
            device = t.device
        elif t.device != device:
            raise LaunchError(f"{c.name} is on {t.device} but the other arguments are on {device}: "
                              + remedy(f"{c.name}.to('{device}')", f"on {device}"))
        if t.dtype is not c.torch_dtype:
            torch_name = f"torch.{_dtype_name(c.torch_dtype)}"
            raise LaunchError(f"{c.name} must be {c.dtype}, got {t.dtype}: "
                              + remedy(f"{c.name}.to({torch_name})", f"with dtype={torch_name}"))
        if t.dim() != c.rank:
            raise LaunchError(f"{c.name} must be {c.rank}-D with shape {c.shape_text}, "
                              f"got {t.dim()}-D shape {tuple(t.shape)}")
        shape = t.shape
        for i, v in c.static:
            if shape[i] != v:
                raise LaunchError(f"{c.name}.shape[{i}] must be {v} (the kernel was compiled for a static "
                                  f"{c.shape_text}), got shape {tuple(shape)}: compile a kernel for this "
                                  "size or make the dim symbolic")
        for i, d in c.named:
            v = shape[i]
            prev = sizes.get(d)
            if prev is None:
                sizes[d] = v
                where[d] = f"{c.name}.shape[{i}]"
            elif prev != v:
                raise LaunchError(f"{c.name}.shape[{i}] gives {d}={v} but {where[d]} gives {d}={prev}: "
                                  f"the arguments disagree on {d} (expected {c.name} of shape {c.shape_text})")
        if t.numel() == 0 or self._strided:     # an empty problem never launches; torch.matmul takes any strides
            return device
        stride = t.stride()
        if stride[c.contig] != 1 and shape[c.contig] != 1:
            raise LaunchError(f"{c.name}.stride({c.contig - c.rank}) must be 1 (dim {c.contig} is the "
                              f"contiguous one), got strides {stride}: "
                              + remedy(f"{c.name}.contiguous()", "contiguous (torch.empty)"))
        a = c.align_elems
        if shape[c.contig] % a and c.contig in c.sym_dims and not c.vector:
            raise LaunchError(f"{c.name}.shape[{c.contig}] = {shape[c.contig]} must be a multiple of {a} "
                              f"({_ALIGN_BYTES} bytes of {c.dtype}) because it is the contiguous dim: "
                              "pad it (e.g. torch.nn.functional.pad) and slice the result")
        for i in range(c.rank):
            if i != c.contig and stride[i] % a:
                raise LaunchError(f"{c.name}.stride({i}) = {stride[i]} is not a multiple of {a} elements "
                                  f"({_ALIGN_BYTES} bytes), needed for vector/TMA loads: pad dim {c.contig} "
                                  f"to a multiple of {a} or "
                                  + remedy(f"{c.name}.contiguous() if it is already a multiple of {a}",
                                           f"contiguous if it is already a multiple of {a}"))
        if t.data_ptr() % _ALIGN_BYTES:
            raise LaunchError(f"{c.name}.data_ptr() is not {_ALIGN_BYTES}-byte aligned (a view at an odd "
                              f"offset?): " + remedy(f"{c.name}.clone()", "as a tensor of its own (torch.empty)"))
        return device

    def validate(self, *args, out=None, **named):
        """Bind and check every argument; return (values, sizes, device) or raise LaunchError."""
        return self._validate(self._arguments(args, named), out)

    def _validate(self, args: tuple, out):
        values: list = [None] * len(self.params)
        for i, a in zip(self._user, args):
            values[i] = a
        sizes: dict[str, int] = {}
        where: dict[str, str] = {}
        device = None
        for c in self._tensor_checks:
            device = self._check_tensor(c, values[c.index], sizes, where, device)
        for i in self._scalars:
            v = values[i]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise LaunchError(f"{self.params[i].name} must be a Python number (float), "
                                  f"got {type(v).__name__}: pass float({self.params[i].name})")
        if out is not None:
            self._check_tensor(self._out_check, out, sizes, where, device)
        else:
            missing = [d for _, d in self._out_check.named if d not in sizes]
            if missing:
                raise LaunchError(f"{self.name}: cannot size the output: dims {missing} appear only in "
                                  f"{self._out_check.name}; pass out=")
        for d, most, where_d in self._limit_dims:
            if sizes.get(d, 0) > most:
                raise LaunchError(f"{self.name}: {where_d} ({d}) = {sizes[d]} is more than the {most} blocks this "
                                  "kernel's launch grid carries along that dim: split the call (e.g. the batch in "
                                  f"chunks of {most}), or use an SM90 schedule without serial split-K (its grid is "
                                  "persistent)")
        return values, sizes, device

    # -- allocation --
    def _allocate_out(self, sizes: dict, device):
        import torch
        c = self._out_check
        p = self.params[self._out_index]
        shape = [sizes[d] if isinstance(d, str) else int(d) for d in p.shape]
        if c.contig == c.rank - 1:
            return torch.empty(shape, dtype=c.torch_dtype, device=device)
        order = [i for i in range(c.rank) if i != c.contig] + [c.contig]
        t = torch.empty([shape[i] for i in order], dtype=c.torch_dtype, device=device)
        return t.permute([order.index(i) for i in range(c.rank)])

    def workspace(self, index: int, elems: int, device):
        """Scratch of at least `elems` elements from the process-wide pool (see `WorkspacePool`), or zeroed
        split-K semaphores (see `SemaphorePool`)."""
        if elems >= _MAX_SCRATCH_ELEMS:
            raise LaunchError(f"{self.name}: the split-K scratch {self.params[index].name!r} needs {elems} elements, "
                              f"past the kernels' 32-bit index ({_MAX_SCRATCH_ELEMS - 1}); use fewer splits "
                              "(split_k) or split the problem (batch or M) across calls")
        if self.params[index].kind == "semaphore":
            return SEMAPHORES.get(elems, device)
        return WORKSPACES.get(self.params[index].dtype, elems, device)

    def prepare(self, *args, out=None, **named) -> tuple[list, Any]:
        """Validated, allocated argument list in kernel order, and the output tensor. Nothing launches."""
        return self._prepare(self._arguments(args, named), out)

    def _prepare(self, args: tuple, out) -> tuple[list, Any]:
        values, sizes, device = self._validate(args, out)
        if out is None:
            out = self._allocate_out(sizes, device)
        values[self._out_index] = out
        if self._workspaces:
            env = {"L": 1, **sizes}
            for i, code in self._workspaces:
                try:
                    elems = int(eval(code, {"__builtins__": {}}, env))
                except NameError as e:
                    raise LaunchError(f"{self.name}: workspace size {self.params[i].workspace_elems!r} uses a "
                                      f"dim that no tensor argument names ({e}); the backend must write "
                                      "static dims as numbers") from None
                values[i] = self.workspace(i, elems, device)
        for i in self._scalars:
            values[i] = float(values[i])
        return values, out

    def __call__(self, *args, out=None, **named):
        """Launch. Fast path: the compiled function's own prologue (TVM-FFI, in C) checks device, dtype,
        rank, shapes, strides and alignment before it launches, so here we only check the static extents of
        1 it cannot, and size the output and the workspace. If the prologue rejects the arguments, the
        Python validator explains what to change."""
        lean = self._lean
        if lean is not None and not named and len(args) == self._n_user:
            run = self._lean_call(lean, args, out)
            if run is not None:
                return run
        return self._general_call(args, out, named)

    def _lean_call(self, lean: "_LeanCall", args: tuple, out):
        """The lean path (see _lean_plan): the output sized from the arguments' shapes, the function called
        with them in kernel order. None: the call needs the general path (an empty problem, or arguments too
        malformed to size the output from)."""
        given = out
        try:
            for j, d in lean.nonzero:
                if not args[j].shape[d]:
                    return None     # an empty problem never launches (see _empty_problem)
            if out is None:
                first = args[self._first_tensor]
                shape = [v if v.__class__ is int else args[v[0]].shape[v[1]] for v in lean.out_dims]
                # without dtype= when it is the input's: torch parses fewer arguments (host time per call)
                out = (first.new_empty(shape) if first.dtype is lean.out_dtype
                       else first.new_empty(shape, dtype=lean.out_dtype))
            values = lean.kernel_order(args + (out,))
        except Exception:          # malformed arguments: let the validator say what is wrong
            return None
        fn = self._function if self._function is not None else self.function
        try:
            fn(*values)
        except (ValueError, TypeError) as e:    # raised by the prologue, before any launch
            return self._call_checked(args, given, rejected=e)
        return out

    def _general_call(self, args: tuple, out, named: dict):
        if named or len(args) != self._n_user or self._reshapes:
            args = self._arguments(args, named)
        if self.always_validate:
            return self._call_checked(args, out)
        try:
            prepared = ((not self._unit_dims or all(args[j].shape[d] == 1 for j, d in self._unit_dims))
                        and (out is None or not self._out_unit_dims
                             or all(out.shape[d] == 1 for d in self._out_unit_dims)))
            if prepared:
                sizes = {name: args[j].shape[d] for name, j, d in self._dim_sources}
                # an empty problem, or one past a grid limit, takes the checked path
                prepared = 0 not in sizes.values() and not (
                    self._limit_dims and any(sizes.get(d, 0) > most for d, most, _ in self._limit_dims))
                device = args[self._first_tensor].device
                values = self._template.copy()
                for j, i in enumerate(self._user):
                    values[i] = args[j]
                values[self._out_index] = result = self._allocate_out(sizes, device) if out is None else out
                for i, code in self._workspaces:
                    values[i] = self.workspace(i, int(eval(code, {"__builtins__": {}}, {"L": 1, **sizes})), device)
        except Exception:          # malformed arguments: let the validator say what is wrong
            prepared = False
        if not prepared:
            return self._call_checked(args, out)
        try:
            self.function(*values)
        except (ValueError, TypeError) as e:    # raised by the prologue, before any launch
            return self._call_checked(args, out, rejected=e)
        return result

    def _call_checked(self, args: tuple, out, rejected: Optional[Exception] = None):
        values, result = self._prepare(args, out)
        if result.numel() == 0 or any(values[i].numel() == 0 for i in self._operands):
            return self._empty_problem(values, result)
        try:
            self.function(*values)
        except (ValueError, TypeError) as e:
            raise LaunchError(f"{self.name}: the kernel rejected its arguments: {e}") from (rejected or e)
        return result

    def _empty_problem(self, values: list, out):
        """M, N or a batch of 0: nothing to compute. K of 0: the accumulator is 0, so the output is the epilogue
        of 0, as torch gives it. Neither launches: the kernels' host code divides by the tile counts and
        would stop the process (SIGFPE), and a TMA descriptor cannot describe an empty dim."""
        if out.numel() == 0:
            return out
        if self._zero_k is None:
            raise LaunchError(f"{self.name}: K = 0 (empty A and B) and this launcher has no spec to evaluate the "
                              "epilogue of a zero accumulator; call it through gemmc.compile(...) or skip K = 0")
        a, b = (values[i] for i in self._operands)
        self._zero_k(a, b, [values[i] for i in self._epilogue_inputs], out)
        return out


class _LeanCall(NamedTuple):
    kernel_order: Callable          # (args..., out) -> the kernel's arguments in its param order
    nonzero: tuple                  # (call position, dim) of every named dim: 0 there is an empty problem
    out_dims: tuple                 # per output dim: a static int, or (call position, dim) it is read from
    out_dtype: Any


_GRID_CHECKED: set = set()


def check_persistent_grid(arch: str, device_index: Optional[int] = None) -> Optional[str]:
    """SM90 kernels size their persistent grid by the cluster occupancy measured on a 132-SM part (H100
    SXM, H200; `ArchLimits.max_active_clusters`). On another SM count part of the grid may wait for a
    second wave (~2x the time) or SMs may idle: warn once per device. Returns the warning, if any."""
    if arch != "sm_90a":
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if device_index is None else device_index
    if idx in _GRID_CHECKED:
        return None
    _GRID_CHECKED.add(idx)
    from .schedule import ARCH_LIMITS
    want = ARCH_LIMITS["sm_90a"].num_sms
    props = torch.cuda.get_device_properties(idx)
    if props.multi_processor_count == want:
        return None
    msg = (f"gemmc: SM90 kernels size their persistent grid for a {want}-SM H100 SXM / H200; {props.name} "
           f"(cuda:{idx}) has {props.multi_processor_count} SMs, so part of a grid may run as a second wave or "
           "SMs may idle: results stay correct, speed does not. Compare with torch.matmul (`gemmc bench`) "
           "before relying on these kernels here.")
    warnings.warn(msg, PerformanceWarning, stacklevel=3)
    return msg


def launcher_from_artifact(artifact, *, on_load_error=None, signature: Optional[CallSignature] = None,
                           zero_k: Optional[Callable] = None) -> Launcher:
    """A Launcher for a cached `Artifact` (needs only its meta, never the compiler). Loading an SM90
    kernel on a GPU whose SM count differs from the one its grid was sized for warns once per device.
    `signature`: the caller's own arguments (see `Launcher`), e.g. a @gemmc.kernel function's. `zero_k(a, b,
    inputs, out)` writes the output of a K = 0 call (see `Launcher`)."""
    meta = artifact.meta
    check_persistent_grid(meta.get("arch", ""))
    return Launcher([param_from_dict(d) for d in meta["params"]], so_path=artifact.so_path,
                    function_name=meta["function"], runtime_flavor=meta.get("runtime_flavor", ""),
                    so_sha256=artifact.so_sha256,
                    name=meta.get("entry", "kernel"), on_load_error=on_load_error, signature=signature,
                    zero_k=zero_k)


_ARCH_OF_MAJOR = {9: "sm_90a", 8: "sm_80"}      # compute capability major -> the arch gemmc builds for it


def visible_arch() -> Optional[str]:
    """The arch of torch's current CUDA device ("sm_90a" for compute capability 9.x, "sm_80" for 8.x), or
    None where no GPU is visible or gemmc builds for none of its kind."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        major, _ = torch.cuda.get_device_capability()
    except Exception:       # no torch CUDA runtime: nothing visible
        return None
    return _ARCH_OF_MAJOR.get(major)
