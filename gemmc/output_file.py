"""Files a command writes where the user said (`--out`, `--plot`, `--ptx`, `gemmc-search export FILE`).

One rule for all of them, checked before the work starts so a long run never fails at its last step: the
path names a file (not a folder), and its nearest existing folder is one this process can create files in.
Missing folders below that are made when the file is written (`make_parent`)."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import GemmcError


def _nearest_existing(path: Path) -> Path:
    p = path.parent
    while not p.exists():
        p = p.parent
    return p


def check_output_file(path, what: str, example: str, error=GemmcError) -> Path:
    """`path` (`~` expanded) as an absolute Path that can be created or replaced as a file; else `error`
    (default GemmcError), whose message starts with `what` (e.g. "--out x/") and says what to do. `example`:
    a file name to suggest inside a folder given in its place."""
    dest = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if dest.is_dir():
        raise error(f"{what}: is a folder; name the file to write, e.g. {dest / example}")
    base = _nearest_existing(dest)
    if not base.is_dir():
        raise error(f"{what}: {base} is a file, not a folder; choose another path")
    if dest.exists() and not os.access(dest, os.W_OK):
        raise error(f"{what}: {dest} exists and cannot be replaced (permission denied); choose another path")
    if not os.access(base, os.W_OK | os.X_OK):
        raise error(f"{what}: cannot create files in {base} (permission denied); choose another path")
    return dest


def make_parent(dest: Path, what: str, error=GemmcError) -> None:
    """Create the folders above `dest` that `check_output_file` allowed to be missing."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"{what}: cannot create the folder {dest.parent}: {e.strerror or e}") from None
