"""Real traces from libCacheSim's source package: fetched into a cache directory, converted
once, and simulated exactly as libCacheSim's own tests pin."""

from __future__ import annotations

import io
import tarfile

import pytest
import zstandard

from loadgen.sim.simulate import simulate
from loadgen.traces.real_traces import (
    CLOUDPHYSICS_SIZES,
    CLOUDPHYSICS_TRUTH,
    DATA,
    TraceUnavailable,
    fetch,
    load,
)
from loadgen.traces.trace import read_trace
from proxy.core.admission import AdmissionConfig

TWITTER_LINES = (
    b"# time, object, size, next_access_vtime\n"
    b"0, 18446744073709551615, 737, 2\n0, 7, 248, -1\n1, 18446744073709551615, 737, -1\n"
)


def package(tmp_path, members: dict[str, bytes]):
    """A source package like libCacheSim's, holding ``members`` in its data directory."""
    path = tmp_path / "libcachesim-0.3.5.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"libcachesim-0.3.5/{DATA}{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_twitter_csv_is_converted_once_to_an_oracle_general_trace(tmp_path):
    package(tmp_path, {"twitter_cluster52_10m.csv.zst": zstandard.compress(TWITTER_LINES)})
    path = fetch("twitter52", tmp_path)
    assert path.name == "twitter52.oracleGeneral.bin"
    trace = read_trace(path)
    assert trace.ids.tolist() == [2**64 - 1, 7, 2**64 - 1]
    assert trace.sizes.tolist() == [737, 248, 737] and trace.times.tolist() == [0, 0, 1]
    assert not (tmp_path / "twitter_cluster52_10m.csv.zst").exists()
    (tmp_path / "libcachesim-0.3.5.tar.gz").unlink()
    assert fetch("twitter52", tmp_path) == path  # from the cache, the package no longer needed


def test_a_package_without_the_trace_or_an_unknown_name_says_what_to_do(tmp_path):
    package(tmp_path, {"other.bin": b"x"})
    with pytest.raises(TraceUnavailable, match="holds no src/libCacheSim/data/cloudPhysicsIO"):
        fetch("cloudphysics", tmp_path)
    with pytest.raises(TraceUnavailable, match="the real traces are"):
        fetch("wikipedia", tmp_path)


@pytest.fixture(scope="module")
def cloudphysics():
    try:
        return load("cloudphysics")
    except TraceUnavailable as exc:
        pytest.skip(f"libCacheSim's source package could not be fetched: {exc}")


@pytest.mark.parametrize("eviction", sorted(CLOUDPHYSICS_TRUTH))
def test_cloudphysics_misses_are_libcachesims_test_truth_at_every_size(cloudphysics, eviction):
    assert len(cloudphysics) == 113_872 and int(cloudphysics.sizes.sum()) == 4_368_040_448
    always = AdmissionConfig(policy="always")
    misses = [
        simulate(cloudphysics, size, always, entry_overhead=0, eviction=eviction).stats["misses"]
        for size in CLOUDPHYSICS_SIZES
    ]
    assert misses == CLOUDPHYSICS_TRUTH[eviction]
