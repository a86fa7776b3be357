"""Traces: a sequence of requests ``(time seconds, key, size bytes)``, in memory and on disk.

Two on-disk forms, both read and written:

* CSV with the header ``time,key,size`` (``.csv``): any key string. Traces from other tools
  are read with ``columns``: three header names, or three 1-based positions, for time, key and
  size (``timestamp,obj_id,obj_size`` or ``1,2,4``); with positions a first row whose time is
  not a number is a header and skipped.
* Text whose fields are separated by spaces or tabs (``.txt``, ``.tr``), as LRB's and
  webcachesim's traces are: time, key and size the first three fields unless ``columns``
  names three positions (LRB's feature columns after them are left); no header. A blank
  line is skipped.
* libCacheSim's oracleGeneral binary (any other suffix, conventionally ``.oracleGeneral.bin``):
  24-byte little-endian records ``uint32 time, uint64 object id, uint32 size, int64 next access``,
  where next access is the index of the object's next request, -1 if none. Keys are the decimal
  object id; times are whole seconds. The file is mapped, not read into Python objects.

Either form may be zstd-compressed (``.zst`` after the suffix, as the public traces ship); it
is decompressed as it is read.

Malformed input raises ``TraceError`` naming the file and the line (text) or byte offset
(binary); a text file under any other suffix is refused with the fix (it would be read as
binary records, silently wrong).
In memory a trace is three numpy arrays: ``times``, ``ids`` (index into ``names`` when the keys
came as strings, else the numeric object id) and ``sizes``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import zstandard

from proxy.core._native import footprint, hash64
from proxy.core.cachekey import KeyQuery

ORACLE_DTYPE = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
CSV_HEADER = ["time", "key", "size"]
SPACED_SUFFIXES = (".txt", ".tr")
SPACED_COLUMNS = ("1", "2", "3")


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

    def head(self, n: int) -> Trace:
        """Its first ``n`` requests (all of them when it has fewer)."""
        return Trace(self.times[:n], self.ids[:n], self.sizes[:n], self.names)

    def key_strings(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The key strings of requests ``start:stop``."""
        ids = self.ids[start:stop].tolist()
        if self.names is None:
            return [str(i) for i in ids]
        names = self.names
        return [names[i] for i in ids]

    def keyed(self, key_query: KeyQuery) -> Trace:
        """This trace with its keys as the proxy keys them under ``key_query`` (names that
        key alike become one object); a trace of numeric ids is left as it is."""
        if self.names is None or key_query.identity:
            return self
        index: dict[str, int] = {}
        mapping = np.fromiter(
            (index.setdefault(key_query.key(name), len(index)) for name in self.names),
            dtype=self.ids.dtype,
            count=len(self.names),
        )
        return Trace(self.times, mapping[self.ids], self.sizes, list(index))

    def __iter__(self) -> Iterator[Request]:
        chunk = 1 << 16
        for start in range(0, len(self), chunk):
            stop = start + chunk
            times = self.times[start:stop].tolist()
            sizes = self.sizes[start:stop].tolist()
            for t, k, s in zip(times, self.key_strings(start, stop), sizes, strict=True):
                yield Request(t, k, s)

    @cached_property
    def _footprint(self) -> tuple[int, int]:
        ids = np.ascontiguousarray(self.ids).astype(np.uint64, copy=False)
        return footprint(ids, np.ascontiguousarray(self.sizes, dtype=np.int64))

    def distinct_objects(self) -> int:
        return self._footprint[0]

    def distinct_bytes(self) -> int:
        """Bytes of every distinct object at its largest requested size: the footprint to cache."""
        return self._footprint[1]

    def name_hashes(self, prefix: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each of ``names``: the (h1, h2) hash of ``prefix + name`` and its length in
        characters, as the store keys it. Computed once per prefix: every simulated cell of
        a sweep reads them."""
        assert self.names is not None, "numeric ids are hashed by the compiled loop itself"
        cache = self.__dict__.setdefault("_name_hashes", {})
        if prefix not in cache:
            hashes = [hash64(prefix + name) for name in self.names]
            cache[prefix] = (
                np.fromiter((h for h, _ in hashes), dtype=np.uint64, count=len(hashes)),
                np.fromiter((h for _, h in hashes), dtype=np.uint64, count=len(hashes)),
                np.fromiter((len(prefix) + len(n) for n in self.names), dtype=np.int64),
            )
        return cache[prefix]

    def duration(self) -> float:
        return float(self.times[-1] - self.times[0]) if len(self) else 0.0


Columns = Sequence[str]


def read_trace(path: str | Path, columns: Columns | None = None) -> Trace:
    """The trace at ``path`` (see the module's rules); ``columns`` picks a CSV's time, key and
    size columns by header name or 1-based position. TraceError says what and where."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    inner = path.with_suffix("") if path.suffix == ".zst" else path
    if inner.suffix == ".csv":
        with _open_text(path) as f:
            return _read_csv(f, path, columns)
    if inner.suffix in SPACED_SUFFIXES:
        if columns is not None and not all(c.strip().isdecimal() for c in columns):
            raise TraceError(f"{path}: a trace separated by spaces has no header: give "
                             "--csv-columns as three positions, like 1,2,4")  # fmt: skip
        with _open_text(path) as f:
            try:
                return _read_csv(f, path, columns or SPACED_COLUMNS, spaced=True)
            except UnicodeDecodeError as exc:
                raise TraceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start} "
                                 "of a block): is it a binary trace?") from None  # fmt: skip
    if columns is not None:
        raise TraceError(f"{path}: CSV columns apply to .csv and .txt traces only")
    _refuse_text(path)
    return _read_oracle(path)


def _refuse_text(path: Path) -> None:
    """TraceError when ``path``, read as oracleGeneral records, is text: its first bytes are
    printable ASCII lines (a binary record's 8-byte id all but always holds a zero byte)."""
    if path.suffix == ".zst":
        head = next(iter(_zstd_chunks(path)), b"")[:4096]
    else:
        with path.open("rb") as f:
            head = f.read(4096)
    if head and _is_text(head):
        spaced = b"," not in head.partition(b"\n")[0]
        name = path.name.split(".")[0] or "trace"
        raise TraceError(
            f"{path}: this is text, not an oracleGeneral binary trace: name it "
            + (f"{name}.txt (fields separated by spaces, as LRB's and webcachesim's)" if spaced
               else f"{name}.csv, and give --csv-columns (time,key,size: names or positions)")
        )  # fmt: skip


def write_trace(trace: Trace, path: str | Path) -> None:
    """``trace`` at ``path`` in the form its suffix names (the reader's)."""
    path = Path(path)
    if path.suffix == ".csv":
        _write_csv(trace, path)
    elif path.suffix in SPACED_SUFFIXES:
        _write_spaced(trace, path)
    else:
        _write_oracle(trace, path)


def _write_spaced(trace: Trace, path: Path) -> None:
    keys = trace.key_strings()
    if any(len(key.split()) != 1 for key in set(keys)):
        raise TraceError(f"{path}: a key holds a space, which a trace separated by spaces "
                         "cannot: write it as .csv")  # fmt: skip
    with path.open("w", encoding="utf-8") as f:
        rows = zip(trace.times.tolist(), keys, trace.sizes.tolist(), strict=True)
        f.writelines(f"{_fmt_time(t)} {key} {size}\n" for t, key, size in rows)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix != ".zst":
        return path.open(newline="", encoding="utf-8")
    return io.TextIOWrapper(io.BufferedReader(_Chunks(_zstd_chunks(path))), newline="",
                            encoding="utf-8")  # fmt: skip


def _zstd_chunks(path: Path) -> Iterator[bytes]:
    """The decompressed bytes of a zstd file, frame after frame; TraceError when the data is
    corrupt or the last frame ends early, naming how many bytes came out before."""
    done = 0
    in_frame = False
    with path.open("rb") as f:
        decoder = zstandard.ZstdDecompressor().decompressobj()
        while chunk := f.read(1 << 20):
            while chunk:
                in_frame = True
                try:
                    out = decoder.decompress(chunk)
                except zstandard.ZstdError as exc:
                    raise TraceError(
                        f"{path}: corrupt zstd data after {done} decompressed bytes: {exc}"
                    ) from None
                done += len(out)
                if out:
                    yield out
                chunk = b""
                if decoder.eof:
                    chunk, in_frame = decoder.unused_data, False
                    decoder = zstandard.ZstdDecompressor().decompressobj()
    if in_frame:
        raise TraceError(
            f"{path}: truncated zstd data: the stream ends early, after {done} decompressed bytes"
        )


class _Chunks(io.RawIOBase):
    """A readable stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._left = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._left:
            self._left = next(self._chunks, b"")
            if not self._left:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def _column_picker(header: list[str], columns: Columns, path: Path) -> tuple[list[int], bool]:
    """Indexes of the time, key and size columns, and whether the first row is a header."""
    if len(columns) != 3:
        raise TraceError(f"{path}: columns are time,key,size: three names or positions")
    if all(c.strip().isdecimal() for c in columns):
        picks = [int(c) - 1 for c in columns]
        if min(picks) < 0:
            raise TraceError(f"{path}: column positions count from 1, got {','.join(columns)}")
        try:
            float(header[picks[0]]) if picks[0] < len(header) else None
            is_header = False
        except ValueError:
            is_header = True
        return picks, is_header
    names = [h.strip() for h in header]
    missing = [c for c in columns if c.strip() not in names]
    if missing:
        raise TraceError(f"{path}:1: no column named {missing[0]!r}; the header has {names}")
    return [names.index(c.strip()) for c in columns], True


def _is_text(head: bytes) -> bool:
    """Whether the first bytes of a file are text: UTF-8 with no NUL byte (every binary
    record's id and size carry one but for absurd values). A character cut at the end of the
    block is no reason to doubt."""
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"
    return True


def _read_csv(f: io.TextIOBase, path: Path, columns: Columns | None, spaced: bool = False) -> Trace:
    times: list[float] = []
    sizes: list[int] = []
    ids: list[int] = []
    index: dict[str, int] = {}
    # A blank line of a spaced trace is skipped, and still counted: errors name its line.
    rows: Iterator[list[str]] = (line.split() for line in f) if spaced else csv.reader(f)
    header = next(rows, None)
    if columns is None:
        if header is None or [h.strip() for h in header] != CSV_HEADER:
            raise TraceError(f"{path}:1: expected the header 'time,key,size', got {header!r}")
        picks, first = [0, 1, 2], 2
    elif header is None:
        raise TraceError(f"{path}:1: the file is empty")
    else:
        picks, is_header = _column_picker(header, columns, path)
        if spaced and is_header:
            raise TraceError(f"{path}:1: time {header[picks[0]]!r} is not a number (a trace "
                             "separated by spaces has no header)")  # fmt: skip
        if not is_header:
            rows = _chain_first(header, rows)
        first = 2 if is_header else 1
    width = max(picks) + 1
    ti, ki, zi = picks
    for line, row in enumerate(rows, start=first):
        if spaced and not row:
            continue
        if len(row) < width or (columns is None and len(row) != 3):
            raise TraceError(
                f"{path}:{line}: expected {3 if columns is None else f'at least {width}'} "
                f"fields (time,key,size), got {row!r}"
            )
        t, key, size = row[ti], row[ki], row[zi]
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
        if si >= 1 << 63:
            raise TraceError(f"{path}:{line}: size {si} is past 2**63 - 1 bytes")
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


def _chain_first(first: list[str], rows: Iterator[list[str]]) -> Iterator[list[str]]:
    yield first
    yield from rows


def _write_csv(trace: Trace, path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(CSV_HEADER)
        out.writerows((_fmt_time(r.time), r.key, r.size) for r in trace)


def _fmt_time(t: float) -> str:
    return str(int(t)) if t == int(t) else repr(t)


def _read_oracle(path: Path) -> Trace:
    if path.suffix == ".zst":
        data = b"".join(_zstd_chunks(path))
        records = _records(np.frombuffer(data, dtype=np.uint8), path)
    else:
        empty = path.stat().st_size == 0  # mmap refuses an empty file
        data = np.zeros(0, np.uint8) if empty else np.memmap(path, dtype=np.uint8, mode="r")
        records = _records(data, path)
    return Trace(
        records["time"].astype(np.float64),
        records["id"].astype(np.uint64),
        records["size"].astype(np.int64),
        None,
    )


def _records(data: np.ndarray, path: Path) -> np.ndarray:
    whole, rest = divmod(len(data), ORACLE_DTYPE.itemsize)
    if rest:
        raise TraceError(
            f"{path}: truncated record at byte offset {whole * ORACLE_DTYPE.itemsize} "
            f"({rest} of {ORACLE_DTYPE.itemsize} bytes); is this an oracleGeneral trace?"
        )
    return data[: whole * ORACLE_DTYPE.itemsize].view(ORACLE_DTYPE)


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
