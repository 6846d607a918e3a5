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
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .backends import Param
from .errors import LaunchError, PerformanceWarning
from .types import DType, torch_dtype

_ALIGN_BYTES = 16


# -- loading .so files ------------------------------------------------------------------------------

_PRELOADED: dict[str, ctypes.CDLL] = {}
_FUNCTIONS: dict[tuple[str, str], Callable] = {}
_LOAD_LOCK = threading.Lock()


def find_cute_runtime_library(flavor: str = "") -> str:
    """Path of libcute_dsl_runtime.so, without importing cutlass.

    Order: $GEMMC_CUTE_RUNTIME_LIB, then $CUTE_DSL_LIBS, then the installed nvidia_cutlass_dsl package
    (the `flavor` the kernel was linked with first, e.g. "cu13", then the others).
    """
    explicit = os.environ.get("GEMMC_CUTE_RUNTIME_LIB")
    if explicit:
        return explicit
    for entry in os.environ.get("CUTE_DSL_LIBS", "").split(os.pathsep):
        if entry.endswith("libcute_dsl_runtime.so") and os.path.exists(entry):
            return entry
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    flavors = [f for f in (flavor, "cu13", "cu12") if f]
    for root in roots:
        for f in flavors:
            cand = Path(root) / f / "lib" / "libcute_dsl_runtime.so"
            if cand.exists():
                return str(cand)
    raise LaunchError("libcute_dsl_runtime.so not found: install nvidia-cutlass-dsl-libs (the runtime part of "
                      "nvidia-cutlass-dsl) or set GEMMC_CUTE_RUNTIME_LIB to its path")


def load_function(so_path: str, function_name: str, flavor: str = "",
                  sha256: Optional[str] = None) -> Callable:
    """The TVM-FFI function `function_name` of a kernel .so; loaded once per process.
    With `sha256`, the file is checked first: a corrupt .so is never loaded."""
    key = (so_path, function_name)
    fn = _FUNCTIONS.get(key)
    if fn is not None:
        return fn
    with _LOAD_LOCK:
        fn = _FUNCTIONS.get(key)
        if fn is not None:
            return fn
        if sha256 is not None:
            from .cache import sha256_file
            if sha256_file(so_path) != sha256:
                raise LaunchError(f"{so_path} does not match its cache manifest (corrupt or modified); "
                                  "delete its cache entry to rebuild it")
        lib = find_cute_runtime_library(flavor)
        if lib not in _PRELOADED:
            # The .so names libcute_dsl_runtime.so as a dependency with no path; loading it globally
            # first lets the dynamic loader resolve it wherever the package is installed.
            _PRELOADED[lib] = ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        import tvm_ffi
        module = tvm_ffi.load_module(so_path)
        fn = module[function_name]
        _FUNCTIONS[key] = fn
        return fn


# -- params <-> JSON (artifact meta) ----------------------------------------------------------------

def param_from_dict(d: dict) -> Param:
    return Param(name=d["name"], kind=d["kind"], dtype=DType(d["dtype"]),
                 shape=tuple(d.get("shape", ())), contiguous=d.get("contiguous", -1),
                 role=d.get("role", ""), workspace_elems=d.get("workspace_elems"))


# -- validation plan (precomputed once per kernel) ---------------------------------------------------

class _TensorCheck:
    """Everything needed to check one tensor argument, computed once."""
    __slots__ = ("name", "index", "torch_dtype", "dtype", "rank", "contig", "static", "named",
                 "align_elems", "shape_text", "sym_dims", "vector")

    def __init__(self, p: Param, index: int):
        import torch
        self.name = p.name
        self.index = index
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
        self.align_elems = max(1, _ALIGN_BYTES // p.dtype.bytes)
        self.shape_text = "(" + ", ".join(str(d) for d in p.shape) + ")"
        # epilogue vectors are read element-wise: their length need not be a multiple of 16 bytes
        self.vector = p.role == "input" and (self.rank == 1 or (self.rank == 2 and p.shape[0] == "L"))


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


class Launcher:
    """Call a compiled kernel with torch tensors: `launcher(*inputs, out=None, **named)`.

    Positional arguments fill, in order, the kernel's tensor params other than the output and the
    scalars; any of them may be passed by name instead. The output is allocated unless `out=` is given.
    `function` is the TVM-FFI callable; alternatively `so_path` + `function_name` load it lazily.
    `device_type` is "cuda"; the CPU tests pass "cpu" to exercise the other checks without a GPU.
    `always_validate` (or GEMMC_VALIDATE=1) runs the Python validator on every call instead of only
    when the compiled function's prologue rejects the arguments.
    """

    def __init__(self, params: Sequence[Param], *, function: Optional[Callable] = None,
                 so_path: Optional[str] = None, function_name: Optional[str] = None,
                 runtime_flavor: str = "", so_sha256: Optional[str] = None,
                 name: str = "kernel", device_type: str = "cuda",
                 on_load_error: Optional[Callable[[Exception], Callable]] = None,
                 always_validate: Optional[bool] = None):
        if function is None and so_path is None:
            raise ValueError("Launcher needs a function or a so_path")
        self.params = tuple(params)
        self.name = name
        self.device_type = device_type
        self._function = function
        self._so_path = so_path
        self._function_name = function_name
        self._flavor = runtime_flavor
        self._so_sha256 = so_sha256
        self._on_load_error = on_load_error

        outs = [i for i, p in enumerate(self.params) if p.kind == "tensor" and p.role == "out"]
        if len(outs) != 1:
            raise LaunchError(f"{name}: expected exactly one tensor param with role 'out', found {len(outs)}")
        self._out_index = outs[0]
        self._user = tuple(i for i, p in enumerate(self.params)
                           if (p.kind == "tensor" and i != self._out_index) or p.kind == "scalar")
        self._by_name = {self.params[i].name: i for i in self._user}
        self._tensor_checks = tuple(_TensorCheck(p, i) for i, p in enumerate(self.params)
                                    if p.kind == "tensor" and i != self._out_index)
        self._out_check = _TensorCheck(self.params[self._out_index], self._out_index)
        self._scalars = tuple(i for i, p in enumerate(self.params) if p.kind == "scalar")
        self._workspaces = tuple(
            (i, compile(p.workspace_elems or "0", f"<{p.name}.workspace_elems>", "eval"))
            for i, p in enumerate(self.params) if p.kind in ("workspace", "semaphore"))
        self._usage = ", ".join(self.params[i].name for i in self._user)
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
        firsts = [j for j, i in enumerate(self._user) if self.params[i].kind == "tensor"]
        self._first_tensor = firsts[0] if firsts else 0
        self._template = [None] * len(self.params)
        # Batched kernels take per-batch vectors (L, N) / (L, M); a vector without L is shared by every
        # batch, so it is passed as a stride-0 expansion rather than copied.
        self._batch_vectors = tuple(j for j, i in enumerate(self._user)
                                    if self.params[i].role == "input" and len(self.params[i].shape) == 2
                                    and self.params[i].shape[0] == "L")
        if always_validate is None:
            always_validate = os.environ.get("GEMMC_VALIDATE", "") not in ("", "0")
        self.always_validate = always_validate

    # -- the compiled function --
    @property
    def function(self) -> Callable:
        fn = self._function
        if fn is None:
            try:
                fn = load_function(self._so_path, self._function_name, self._flavor, self._so_sha256)
            except Exception as e:
                if self._on_load_error is None:
                    raise
                fn = self._on_load_error(e)      # e.g. the cache rebuilds a corrupt entry
            self._function = fn
        return fn

    # -- argument binding --
    def _bind(self, args: tuple, named: dict) -> list:
        values: list = [None] * len(self.params)
        if len(args) > len(self._user):
            raise LaunchError(f"{self.name} takes {len(self._user)} arguments ({self._usage}), "
                              f"got {len(args)} positional")
        for i, a in zip(self._user, args):
            values[i] = a
        for key, a in named.items():
            i = self._by_name.get(key)
            if i is None:
                raise LaunchError(f"{self.name} has no argument {key!r}; its arguments are: {self._usage} "
                                  "(and out=)")
            if values[i] is not None:
                raise LaunchError(f"{self.name}: argument {key!r} given twice (positionally and by name)")
            values[i] = a
        for i in self._user:
            if values[i] is None:
                raise LaunchError(f"{self.name}: missing argument {self.params[i].name!r}; "
                                  f"call it as {self.name}({self._usage})")
        return values

    # -- validation --
    def _check_tensor(self, c: _TensorCheck, t, sizes: dict, where: dict, device) -> Any:
        import torch
        if not isinstance(t, torch.Tensor):
            raise LaunchError(f"{c.name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != self.device_type:
            raise LaunchError(f"{c.name} must be on a {self.device_type} device, got {t.device}: "
                              f"pass {c.name}.to('{self.device_type}')")
        if device is None:
            device = t.device
        elif t.device != device:
            raise LaunchError(f"{c.name} is on {t.device} but the other arguments are on {device}: "
                              f"pass {c.name}.to('{device}')")
        if t.dtype is not c.torch_dtype:
            raise LaunchError(f"{c.name} must be {c.dtype}, got {t.dtype}: "
                              f"pass {c.name}.to(torch.{_dtype_name(c.torch_dtype)})")
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
        stride = t.stride()
        if stride[c.contig] != 1 and shape[c.contig] != 1:
            raise LaunchError(f"{c.name}.stride({c.contig - c.rank}) must be 1 (dim {c.contig} is the "
                              f"contiguous one), got strides {stride}: pass {c.name}.contiguous()")
        a = c.align_elems
        if shape[c.contig] % a and c.contig in c.sym_dims and not c.vector:
            raise LaunchError(f"{c.name}.shape[{c.contig}] = {shape[c.contig]} must be a multiple of {a} "
                              f"({_ALIGN_BYTES} bytes of {c.dtype}) because it is the contiguous dim: "
                              "pad it (e.g. torch.nn.functional.pad) and slice the result")
        for i in range(c.rank):
            if i != c.contig and stride[i] % a:
                raise LaunchError(f"{c.name}.stride({i}) = {stride[i]} is not a multiple of {a} elements "
                                  f"({_ALIGN_BYTES} bytes), needed for vector/TMA loads: pad dim {c.contig} "
                                  f"to a multiple of {a} or pass {c.name}.contiguous() "
                                  f"if it is already a multiple of {a}")
        if t.data_ptr() % _ALIGN_BYTES:
            raise LaunchError(f"{c.name}.data_ptr() is not {_ALIGN_BYTES}-byte aligned (a view at an odd "
                              f"offset?): pass {c.name}.clone()")
        return device

    def validate(self, *args, out=None, **named):
        """Bind and check every argument; return (values, sizes, device) or raise LaunchError."""
        values = self._bind(args, named)
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
        values, sizes, device = self.validate(*args, out=out, **named)
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
        rank, shapes, strides and alignment before it launches, so here we only size the output and the
        workspace. If the prologue rejects the arguments, the Python validator explains what to change."""
        if self._batch_vectors:
            args = self._expand_batch_vectors(args)
        if self.always_validate or named or len(args) != self._n_user:
            return self._call_checked(args, out, named)
        try:
            sizes = {name: args[j].shape[d] for name, j, d in self._dim_sources}
            device = args[self._first_tensor].device
            values = self._template.copy()
            for j, i in enumerate(self._user):
                values[i] = args[j]
            values[self._out_index] = result = self._allocate_out(sizes, device) if out is None else out
            for i, code in self._workspaces:
                values[i] = self.workspace(i, int(eval(code, {"__builtins__": {}}, {"L": 1, **sizes})), device)
        except Exception:          # malformed arguments: let the validator say what is wrong
            return self._call_checked(args, out, named)
        try:
            self.function(*values)
        except (ValueError, TypeError) as e:    # raised by the prologue, before any launch
            return self._call_checked(args, out, named, rejected=e)
        return result

    def _expand_batch_vectors(self, args: tuple) -> tuple:
        lead = next((a.shape[0] for a in args if getattr(a, "dim", None) and a.dim() == 3), None)
        if lead is None:
            return args
        args = list(args)
        for j in self._batch_vectors:
            if j < len(args) and getattr(args[j], "dim", None) and args[j].dim() == 1:
                args[j] = args[j].expand(lead, args[j].shape[0])
        return tuple(args)

    def _call_checked(self, args, out, named, rejected: Optional[Exception] = None):
        values, result = self.prepare(*args, out=out, **named)
        try:
            self.function(*values)
        except (ValueError, TypeError) as e:
            raise LaunchError(f"{self.name}: the kernel rejected its arguments: {e}") from (rejected or e)
        return result


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


def launcher_from_artifact(artifact, *, on_load_error=None) -> Launcher:
    """A Launcher for a cached `Artifact` (needs only its meta, never the compiler). Loading an SM90
    kernel on a GPU whose SM count differs from the one its grid was sized for warns once per device."""
    meta = artifact.meta
    check_persistent_grid(meta.get("arch", ""))
    return Launcher([param_from_dict(d) for d in meta["params"]], so_path=artifact.so_path,
                    function_name=meta["function"], runtime_flavor=meta.get("runtime_flavor", ""),
                    so_sha256=artifact.so_sha256,
                    name=meta.get("entry", "kernel"), on_load_error=on_load_error)
