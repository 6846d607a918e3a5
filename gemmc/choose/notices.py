"""The warnings `schedule="auto"` gives once per process: every compile (and every M bucket) resolves again, so a
skipped DB or a misspelled GEMMC_GPU would otherwise warn at each."""
from __future__ import annotations

import threading
import warnings

_warned: set = set()
_warn_lock = threading.Lock()


def warn_once(key, message: str) -> None:
    """Warn about `key` once per process."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, stacklevel=3)
