"""Where in the user's code a traced construct stands, and the TraceErrors that point there (`file:line: msg`
with the source line): errors name the innermost frame outside gemmc and torch."""
from __future__ import annotations

import functools
import linecache
import os
import re
import sys

from ..errors import TraceError

# gemmc/, not gemmc/dsl/: every gemmc frame is the library's
_GEMMC_DIR = os.path.dirname(os.path.dirname(os.path.normcase(os.path.abspath(__file__)))) + os.sep


@functools.lru_cache(maxsize=1024)
def is_library_file(filename: str) -> bool:
    """Is `filename` gemmc's or torch's (which calls __torch_function__ from torch/overrides.py), not the
    user's code? Errors point at the innermost frame that is not."""
    path = os.path.normcase(os.path.abspath(filename))
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    return path.startswith(_GEMMC_DIR) or (
        torch_file is not None and path.startswith(os.path.normcase(os.path.dirname(torch_file)) + os.sep))


def _user_frame():
    """The innermost frame outside gemmc and torch: the user's expression being traced."""
    f = sys._getframe(1)
    while f is not None and is_library_file(f.f_code.co_filename):
        f = f.f_back
    return f


def file_line(filename: str, lineno: int) -> str:
    return f"{filename}:{lineno}"


def user_line() -> str:
    f = _user_frame()
    return file_line(f.f_code.co_filename, f.f_lineno) if f is not None else "<unknown>"


def trace_error(where: str, msg: str) -> TraceError:
    """`file:line: msg` followed by the source line, when it can be read."""
    text = ""
    m = re.match(r"^(.*):(\d+)$", where)
    if m:
        src = linecache.getline(m.group(1), int(m.group(2))).strip()
        if src:
            text = f"\n    {src}"
    return TraceError(f"{where}: {msg}{text}")
