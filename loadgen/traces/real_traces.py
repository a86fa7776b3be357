"""Real traces, fetched on first use into a cache directory, never shipped with onehit.

libCacheSim's source package (``libcachesim==0.3.5`` on PyPI, GPL-3.0) carries two real traces
under ``src/libCacheSim/data/``:

* ``cloudphysics``: a block I/O trace (``cloudPhysicsIO.oracleGeneral.bin``, 113,872 requests
  of 4,368,040,448 bytes), whose miss counts at eight cache sizes libCacheSim's own tests pin
  (``test/test_evictionAlgo.c``: ``CLOUDPHYSICS_TRUTH`` below);
* ``twitter52``: the first 10,000,000 requests of Twitter's cache cluster 52
  (``twitter_cluster52_10m.csv.zst``, CC-BY), a key-value cache trace.

``fetch`` downloads the source package once with pip (``pip download --no-deps --no-binary``),
takes the trace out of it into ``cache_dir()`` (``$ONEHIT_TRACE_CACHE``, else
``~/.cache/onehit/traces``) and returns an oracleGeneral file: the Twitter CSV (``time, object,
size, next access``) is converted once. A trace that cannot be fetched raises
``TraceUnavailable`` saying why and how to place the file by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from loadgen.traces.trace import Trace, read_trace, write_trace

PACKAGE = "libcachesim==0.3.5"
DATA = "src/libCacheSim/data/"
FETCH_TIMEOUT = 900.0  # seconds for pip to download the 81 MB source package


@dataclass(frozen=True)
class RealTrace:
    """One trace of the package: the file it ships as, what it is, and its licence."""

    name: str
    member: str
    about: str
    licence: str


TRACES = {
    "cloudphysics": RealTrace(
        "cloudphysics", "cloudPhysicsIO.oracleGeneral.bin",
        "CloudPhysics block I/O trace, 113,872 requests", "GPL-3.0 (libCacheSim)",
    ),
    "twitter52": RealTrace(
        "twitter52", "twitter_cluster52_10m.csv.zst",
        "Twitter cache cluster 52, first 10,000,000 requests", "CC-BY (Twitter)",
    ),
}  # fmt: skip

# libCacheSim's test truth on cloudphysics: misses at 128 MiB, 256 MiB, ... 1 GiB (no per-object
# overhead), from src/libCacheSim/test/test_evictionAlgo.c of libcachesim 0.3.5.
CLOUDPHYSICS_SIZES = [n * 128 << 20 for n in range(1, 9)]
CLOUDPHYSICS_TRUTH = {
    "lru": [93374, 89783, 83572, 81722, 72494, 72104, 71972, 71704],
    "s3fifo": [90117, 80915, 75060, 72191, 69815, 65542, 60799, 56045],
    "sieve": [91699, 86720, 78578, 76707, 69945, 66221, 64445, 64376],
}


class TraceUnavailable(RuntimeError):
    """A real trace that could not be fetched; the message says why and what to do."""


def cache_dir() -> Path:
    """Where fetched traces are kept: ``$ONEHIT_TRACE_CACHE``, else ``~/.cache/onehit/traces``."""
    configured = os.environ.get("ONEHIT_TRACE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "onehit" / "traces"


# How a real trace is named where a trace file may be: ``real:twitter52``.
REAL = "real:"


def fetch(name: str, directory: Path | None = None) -> Path:
    """The oracleGeneral file of the real trace ``name``, fetched and converted on first use."""
    if name not in TRACES:
        raise TraceUnavailable(f"no real trace {name!r}; the real traces are {sorted(TRACES)}")
    directory = directory or cache_dir()
    target = directory / f"{name}.oracleGeneral.bin"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    trace = TRACES[name]
    shipped = directory / trace.member
    if not shipped.exists():
        _extract(trace.member, _package(directory), shipped)
    if shipped.suffixes[-2:] == [".csv", ".zst"]:
        partial = target.with_suffix(".part")
        write_trace(_read_twitter(shipped), partial)
        partial.replace(target)
        shipped.unlink()
    else:
        shipped.replace(target)
    return target


def load(name: str, directory: Path | None = None) -> Trace:
    """The real trace ``name`` in memory (its file mapped), fetched on first use."""
    return read_trace(fetch(name, directory))


def _package(directory: Path) -> Path:
    """libCacheSim's source package in ``directory``, downloaded by pip when not there."""
    found = sorted(directory.glob("libcachesim-*.tar.gz"))
    if found:
        return found[-1]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", PACKAGE, "-d", str(directory)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TraceUnavailable(
            f"pip download {PACKAGE} failed: {exc}; {_by_hand(directory)}"
        ) from None
    found = sorted(directory.glob("libcachesim-*.tar.gz"))
    if done.returncode != 0 or not found:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no package file"]
        raise TraceUnavailable(f"pip download {PACKAGE} failed: {said[0]}; {_by_hand(directory)}")
    return found[-1]


def _by_hand(directory: Path) -> str:
    return (f"place libcachesim-0.3.5.tar.gz (the source package from PyPI) or the trace files "
            f"of its {DATA} in {directory}")  # fmt: skip


def _extract(member: str, package: Path, out: Path) -> None:
    """Copy ``member`` of the package's data directory to ``out``, whole or not at all."""
    with tarfile.open(package) as tar:
        names = [m for m in tar.getmembers() if m.name.endswith(DATA + member) and m.isfile()]
        if not names:
            raise TraceUnavailable(f"{package} holds no {DATA}{member}")
        source = tar.extractfile(names[0])
        assert source is not None
        with tempfile.NamedTemporaryFile(dir=out.parent, delete=False) as partial:
            while chunk := source.read(1 << 20):
                partial.write(chunk)
    Path(partial.name).replace(out)


def _read_twitter(path: Path) -> Trace:
    """The Twitter CSV (``# time, object, size, next_access_vtime`` then four integers a line)
    as a trace of numeric object ids, parsed in one pass of numpy's text reader."""
    with path.open("rb") as f:
        text = zstandard.ZstdDecompressor().stream_reader(f).read()
    body = text[text.index(b"\n") + 1 :] if text.startswith(b"#") else text
    # The last column, the next access, is -1 for none: the only negative number, unused here.
    body = (body if body.endswith(b"\n") else body + b"\n").replace(b"-1\n", b"0\n")
    values = np.fromstring(body.replace(b",", b" "), dtype=np.uint64, sep=" ")
    if len(values) % 4:
        raise TraceUnavailable(f"{path}: expected four numbers a line, got {len(values)} in all")
    rows = values.reshape(-1, 4)
    return Trace(rows[:, 0].astype(np.float64), rows[:, 1].copy(), rows[:, 2].astype(np.int64))
