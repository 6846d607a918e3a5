"""The split-K scratch shared by every launcher: the workspace pool (WORKSPACES) and the fix-up's zeroed
semaphores (SEMAPHORES), per device and stream, with buffers of their own for a launch under CUDA graph
capture."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional

from ..types import DType, torch_dtype


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
