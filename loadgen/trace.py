"""Traces: a sequence of requests ``(time seconds, key, size bytes)``, in memory and on disk.

Two on-disk forms, both read and written:

* CSV with the header ``time,key,size`` (``.csv``): any key string.
* libCacheSim's oracleGeneral binary (any other suffix, conventionally ``.oracleGeneral.bin``):
  24-byte little-endian records ``uint32 time, uint64 object id, uint32 size, int64 next access``,
  where next access is the index of the object's next request, -1 if none. Keys are the decimal
  object id; times are whole seconds.

Malformed input raises ``TraceError`` naming the file and the line (CSV) or byte offset (binary).
In memory a trace is three numpy arrays: ``times``, ``ids`` (index into ``names`` when the keys
came as strings, else the numeric object id) and ``sizes``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ORACLE_DTYPE = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
CSV_HEADER = ["time", "key", "size"]


class TraceError(ValueError):
    """A trace file that cannot be read; the message names where."""


@dataclass(frozen=True, slots=True)
class Request:
    time: float
    key: str
    size: int


@dataclass(frozen=True)
class Trace:
    """Requests in time order. ``names`` is None when ``ids`` are numeric object ids."""

    times: np.ndarray
    ids: np.ndarray
    sizes: np.ndarray
    names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.times)

    def key_strings(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The key strings of requests ``start:stop``."""
        ids = self.ids[start:stop].tolist()
        if self.names is None:
            return [str(i) for i in ids]
        names = self.names
        return [names[i] for i in ids]

    def __iter__(self) -> Iterator[Request]:
        chunk = 1 << 16
        for start in range(0, len(self), chunk):
            stop = start + chunk
            times = self.times[start:stop].tolist()
            sizes = self.sizes[start:stop].tolist()
            for t, k, s in zip(times, self.key_strings(start, stop), sizes, strict=True):
                yield Request(t, k, s)

    def distinct_objects(self) -> int:
        return len(np.unique(self.ids))

    def distinct_bytes(self) -> int:
        """Bytes of every distinct object at its largest requested size: the footprint to cache."""
        order = np.lexsort((self.sizes, self.ids))
        ids = self.ids[order]
        last = np.r_[ids[1:] != ids[:-1], True]
        return int(self.sizes[order][last].sum())

    def duration(self) -> float:
        return float(self.times[-1] - self.times[0]) if len(self) else 0.0


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    if path.suffix == ".csv":
        return _read_csv(path)
    return _read_oracle(path)


def write_trace(trace: Trace, path: str | Path) -> None:
    path = Path(path)
    if path.suffix == ".csv":
        _write_csv(trace, path)
    else:
        _write_oracle(trace, path)


def _read_csv(path: Path) -> Trace:
    times: list[float] = []
    sizes: list[int] = []
    ids: list[int] = []
    index: dict[str, int] = {}
    with path.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or [h.strip() for h in header] != CSV_HEADER:
            raise TraceError(f"{path}:1: expected the header 'time,key,size', got {header!r}")
        for line, row in enumerate(rows, start=2):
            if len(row) != 3:
                raise TraceError(f"{path}:{line}: expected 3 fields (time,key,size), got {row!r}")
            t, key, size = row
            try:
                tf = float(t)
            except ValueError:
                raise TraceError(f"{path}:{line}: time {t!r} is not a number") from None
            if not math.isfinite(tf):
                raise TraceError(f"{path}:{line}: time {t!r} is not a finite number")
            try:
                si = int(size)
            except ValueError:
                raise TraceError(f"{path}:{line}: size {size!r} is not an integer") from None
            if si < 0:
                raise TraceError(f"{path}:{line}: size {si} is negative")
            if not key:
                raise TraceError(f"{path}:{line}: empty key")
            times.append(tf)
            sizes.append(si)
            ids.append(index.setdefault(key, len(index)))
    return Trace(
        np.asarray(times, dtype=np.float64),
        np.asarray(ids, dtype=np.int64),
        np.asarray(sizes, dtype=np.int64),
        list(index),
    )


def _write_csv(trace: Trace, path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(CSV_HEADER)
        out.writerows((_fmt_time(r.time), r.key, r.size) for r in trace)


def _fmt_time(t: float) -> str:
    return str(int(t)) if t == int(t) else repr(t)


def _read_oracle(path: Path) -> Trace:
    data = path.read_bytes()
    whole, rest = divmod(len(data), ORACLE_DTYPE.itemsize)
    if rest:
        raise TraceError(
            f"{path}: truncated record at byte offset {whole * ORACLE_DTYPE.itemsize} "
            f"({rest} of {ORACLE_DTYPE.itemsize} bytes); is this an oracleGeneral trace?"
        )
    records = np.frombuffer(data, dtype=ORACLE_DTYPE)
    return Trace(
        records["time"].astype(np.float64),
        records["id"].copy(),
        records["size"].astype(np.int64),
        None,
    )


def _write_oracle(trace: Trace, path: Path) -> None:
    if trace.names is not None and not all(n.isdecimal() for n in trace.names):
        raise TraceError(
            f"{path}: oracleGeneral keys are numeric object ids; this trace has string keys "
            "(write it as .csv instead)"
        )
    ids = trace.ids if trace.names is None else np.asarray([int(n) for n in trace.names])[trace.ids]
    if len(trace) and (trace.sizes.max() >= 1 << 32 or trace.times.max() >= 1 << 32):
        raise TraceError(f"{path}: a size or time does not fit oracleGeneral's uint32 fields")
    records = np.empty(len(trace), dtype=ORACLE_DTYPE)
    records["time"] = trace.times
    records["id"] = ids
    records["size"] = trace.sizes
    records["next"] = next_access(np.asarray(ids))
    records.tofile(path)


def next_access(ids: np.ndarray) -> np.ndarray:
    """For each request, the index of the next request of the same object, -1 if none."""
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    following = np.full(n, -1, dtype=np.int64)
    same = ids[order][1:] == ids[order][:-1]
    following[order[:-1][same]] = order[1:][same]
    return following
