"""The recorded sweep dataset: gzipped JSON lines under bench/data/.

Line 1 is the header: {"format": "gemmc-dataset/1", "device": {...}, "date": ..., "method": {...},
"versions": {...}, ...}. Every other line is one measurement of one schedule on one shape:

    {"m": 4096, "n": 6144, "k": 4096, "schedule": Schedule.to_dict(),
     "time_us": 123.4 | null, "error": null | "compile: ..." | "check: ..." | "run: ...",
     "cublas_us": 130.2, "compile_s": 1.1, "rel_err": 0.003, "refined": false}

`time_us` is the per-call time of the short pass, or of the careful re-measurement when
`refined` is true (then `time_us_short` keeps the short one). A last line {"footer": {...}} says
whether the sweep finished; a file cut off mid-write (a killed run) still loads, marked truncated.
"""
from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional

from ..schedule import Schedule

FORMAT = "gemmc-dataset/1"
REQUIRED = ("m", "n", "k", "schedule")


class DatasetError(ValueError):
    pass


def _clean(x):
    if isinstance(x, float):
        return None if not math.isfinite(x) else float(f"{x:.5g}")  # 5 significant digits: compact
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _line(obj) -> bytes:
    return (json.dumps(_clean(obj), separators=(",", ":"), allow_nan=False) + "\n").encode()


def check_record(rec: dict) -> None:
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise DatasetError(f"record lacks {missing}: {rec}")
    if rec.get("time_us") is None and not rec.get("error"):
        raise DatasetError(f"record has neither time_us nor error: {rec}")


class DatasetWriter:
    """Appends records and flushes after each batch, so a run killed mid-way leaves a loadable file."""

    def __init__(self, path, header: dict):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._raw = open(self.path, "wb")
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=9, mtime=0)
        self.count = 0
        self._gz.write(_line({**header, "format": FORMAT}))
        self.flush()

    def write(self, rec: dict) -> None:
        check_record(rec)
        self._gz.write(_line(rec))
        self.count += 1

    def write_many(self, recs: Iterable[dict]) -> None:
        for r in recs:
            self.write(r)
        self.flush()

    def flush(self) -> None:
        self._gz.flush()   # Z_SYNC_FLUSH: everything so far decodes even without the gzip trailer
        self._raw.flush()

    def close(self, footer: Optional[dict] = None) -> None:
        if self._gz is None:
            return
        if footer is not None:
            self._gz.write(_line({"footer": {**footer, "records": self.count}}))
        self._gz.close()
        self._raw.close()
        self._gz = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close({"complete": exc[0] is None})


def write_dataset(path, header: dict, records: Iterable[dict], footer: Optional[dict] = None) -> Path:
    w = DatasetWriter(path, header)
    w.write_many(records)
    w.close(footer if footer is not None else {"complete": True})
    return w.path


def load_dataset(path) -> tuple[dict, list[dict]]:
    """(header, records). The footer, if any, is header["footer"]; a cut-off file loads what it
    holds and sets header["truncated"] = True."""
    lines: list[bytes] = []
    truncated = False
    with gzip.open(path, "rb") as f:
        try:
            for raw in f:
                lines.append(raw)
        except (EOFError, gzip.BadGzipFile, OSError):
            truncated = True
    if lines and not lines[-1].endswith(b"\n"):
        lines.pop()      # a half-written last line
        truncated = True
    if not lines:
        raise DatasetError(f"{path}: empty dataset (no header line)")
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise DatasetError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    records = []
    for raw in lines[1:]:
        obj = json.loads(raw)
        if "footer" in obj:
            header["footer"] = obj["footer"]
            continue
        records.append(obj)
    if truncated:
        header["truncated"] = True
    return header, records


# ---- helpers for the search simulation ------------------------------------------------------------

def record_schedule(rec: dict) -> Schedule:
    return Schedule.from_dict(rec["schedule"])


def shape_key(rec: dict) -> tuple[int, int, int]:
    return (rec["m"], rec["n"], rec["k"])


def by_shape(records: Iterable[dict]) -> dict:
    """{(m, n, k): [records]} in file order."""
    out = defaultdict(list)
    for r in records:
        out[shape_key(r)].append(r)
    return dict(out)


def best_record(records: Iterable[dict]) -> Optional[dict]:
    """The fastest successful record of one shape, or None. Among the carefully re-measured (`refined`) ones
    where any succeeded: their times come from graphs rotated through >= 2x L2, the others' from the short
    pass's few sets, which a small shape reads partly from L2 (faster), so the two do not compare; and the
    refined ones are the short pass's fastest."""
    ok = [r for r in records if r.get("time_us") is not None and not r.get("error")]
    pool = [r for r in ok if r.get("refined")] or ok
    return min(pool, key=lambda r: r["time_us"], default=None)


def best_per_shape(records: Iterable[dict]) -> dict:
    """{(m, n, k): the fastest successful record} (the exhaustive best; see best_record)."""
    return {key: best for key, recs in by_shape(records).items() if (best := best_record(recs)) is not None}


def short_time_us(rec: dict) -> Optional[float]:
    """The short-pass time of a record: the one every schedule of a shape has (refined ones keep it)."""
    if rec.get("error"):
        return None
    return rec.get("time_us_short") or rec.get("time_us")


def pick_fractions(records: Iterable[dict], pick) -> dict:
    """{(m, n, k): best time / time of `pick`'s schedule} over the recorded shapes, from short-pass times.

    `pick(shape, recorded)` gets the shape and the set of schedules measured on it, and returns one of
    them (so a picker is judged only where the data can judge it). A pick that failed counts as 0.
    """
    out = {}
    for key, recs in by_shape(records).items():
        times = {record_schedule(r): short_time_us(r) for r in recs}
        ok = [t for t in times.values() if t]
        if not ok:
            continue
        choice = pick(key, set(times))
        t = times.get(choice)
        out[key] = min(ok) / t if t else 0.0
    return out
