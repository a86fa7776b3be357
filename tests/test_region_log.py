"""The disk tier's region files: sequential appends, whole-region eviction, records read back
only when whole and of the key asked for, and a scan that recovers them after a crash."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys

import pytest

from proxy.config.logs import OneLineEvery
from proxy.core.disk import RECORD_HEADER, Slot
from proxy.core.regions import Regions
from proxy.disk.region_log import DISK_ERRORS, HEADER, MAX_KEY, RegionLog, decode, encode


@pytest.fixture(autouse=True)
def fresh_throttle(monkeypatch):
    """Each test starts with the disk log's one-line-a-second throttle unspent."""
    monkeypatch.setattr(DISK_ERRORS, "filters", [OneLineEvery()])


def test_a_record_round_trips_and_its_checksum_covers_every_byte():
    record = encode(b"http://a/x", b'{"status": 200}', b"body bytes")
    assert decode(record) == (b"http://a/x", b'{"status": 200}', b"body bytes")
    for at in range(4, len(record)):  # every byte after the magic
        damaged = bytearray(record)
        damaged[at] ^= 0x01
        assert decode(bytes(damaged)) is None, at
    assert decode(record[:-1]) is None and decode(record + b"x") is None


def test_regions_fill_one_after_another_and_the_oldest_goes_whole():
    regions = Regions(100, 3)
    placed = [regions.place(40) for _ in range(9)]
    # Two records a region: the third of each would pass its end.
    assert [(p.region, p.offset) for p in placed] == [
        (0, 0), (0, 40), (1, 0), (1, 40), (2, 0), (2, 40), (3, 0), (3, 40), (4, 0)
    ]  # fmt: skip
    assert [r for p in placed for r in p.evicted] == [0, 1]
    assert list(regions.live) == [2, 3, 4] and regions.evictions == 2
    assert regions.bytes_written == 9 * 40
    assert not regions.holds(1) and regions.holds(2) and regions.holds(4)
    assert regions.place(101) is None and regions.bytes_written == 9 * 40


def test_a_disk_tier_needs_two_regions():
    with pytest.raises(ValueError, match="at least 2 regions"):
        Regions(1 << 20, 1)


def test_appends_are_sequential_and_an_evicted_region_is_removed_whole(tmp_path):
    log = RegionLog(tmp_path, Regions(4096, 2))
    written = []
    for i in range(40):
        key = f"k{i}".encode()
        location = log.append(key, b"meta", bytes([i]) * 300)
        assert location is not None
        written.append((key, location))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2  # the ring holds two regions; the others were removed whole
    live = [(k, loc) for k, loc in written if log.regions.holds(loc.region)]
    for earlier, later in itertools.pairwise(live):
        if earlier[1].region == later[1].region:  # each record right after the one before
            assert later[1].offset == earlier[1].offset + earlier[1].length
    for key, location in written:
        got = log.read(location, key)
        if log.regions.holds(location.region):
            assert got == (b"meta", bytes([int(key[1:])]) * 300)
        else:
            assert got is None
    assert log.regions.bytes_written == sum(loc.length for _, loc in written)
    log.close()


def test_a_key_longer_than_its_length_field_is_not_written(tmp_path):
    """A variant's key holds request fields, whose limit an operator may raise past 64 KiB:
    such a record is left unwritten, the log unchanged, not cut nor raised."""
    log = RegionLog(tmp_path, Regions(1 << 20, 2))
    assert log.append(b"k" * (MAX_KEY + 1), b"meta", b"body") is None
    assert log.regions.bytes_written == 0
    location = log.append(b"k" * MAX_KEY, b"meta", b"body")
    assert location is not None and log.read(location, b"k" * MAX_KEY) == (b"meta", b"body")
    log.close()


def test_a_record_is_never_read_for_another_key_or_when_damaged_on_disk(tmp_path, caplog):
    log = RegionLog(tmp_path, Regions(1 << 20, 2))
    location = log.append(b"http://a/x", b"m", b"the body")
    assert location is not None
    assert log.read(location, b"http://a/y") is None
    path = log.path(location.region)
    data = bytearray(path.read_bytes())
    data[location.offset + location.length - 1] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="onehit.disk"):
        assert log.read(location, b"http://a/x") is None
    assert "not a whole record" in caplog.text
    wrong_place = Slot(location.region, location.offset + 1, location.length)
    assert log.read(wrong_place, b"http://a/x") is None
    log.close()


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="no RWF_NOWAIT on this platform")
def test_a_warm_only_read_leaves_a_record_the_page_cache_does_not_hold_unread(tmp_path):
    log = RegionLog(tmp_path, Regions(1 << 20, 2))
    location = log.append(b"http://a/x", b"m", b"b" * 50_000)
    assert location is not None
    assert log.read(location, b"http://a/x", warm_only=True) == (b"m", b"b" * 50_000)
    log.sync([location.region])
    fd = os.open(log.path(location.region), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            os.preadv(fd, [bytearray(1)], location.offset + location.length - 1, os.RWF_NOWAIT)
            pytest.skip("this file system keeps the region in memory: it is never cold")
        except BlockingIOError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with pytest.raises(BlockingIOError):
        log.read(location, b"http://a/x", warm_only=True)
    assert log.read(location, b"http://a/x") == (b"m", b"b" * 50_000)
    log.close()


def test_a_region_removed_by_hand_is_a_miss_with_one_log_line(tmp_path, caplog):
    log = RegionLog(tmp_path, Regions(1 << 20, 2))
    location = log.append(b"k", b"m", b"body")
    assert location is not None
    log.close()
    log.path(location.region).unlink()
    with caplog.at_level(logging.WARNING, logger="onehit.disk"):
        assert log.read(location, b"k") is None
        assert log.read(location, b"k") is None
    assert caplog.text.count("reading region") == 1  # one line a second at most


def test_after_a_crash_the_whole_records_are_recovered_and_a_torn_one_is_cut_off(tmp_path):
    log = RegionLog(tmp_path, Regions(1000, 3))
    written = {}
    for i in range(12):
        key = f"http://a/{i}".encode()
        location = log.append(key, b"m", b"x" * 150)
        assert location is not None
        written[key] = location
    last = max(written.values(), key=lambda loc: (loc.region, loc.offset))
    log.close()
    # A crash in the middle of the next write: half a record at the end of the open region.
    torn = encode(b"http://a/torn", b"m", b"y" * 150)
    with open(log.path(last.region), "ab") as f:
        f.write(torn[: len(torn) // 2])
    reopened = RegionLog(tmp_path, Regions(1000, 3))
    recovered = dict(reopened.recover())
    live = {k: loc for k, loc in written.items() if loc.region >= last.region - 2}
    assert recovered == live
    for key, location in recovered.items():
        assert reopened.read(location, key) == (b"m", b"x" * 150)
    assert os.path.getsize(reopened.path(last.region)) == last.offset + last.length
    # Appends go on where the whole records end.
    after = reopened.append(b"http://a/after", b"m", b"z" * 10)
    assert after is not None and after.region == last.region
    assert after.offset == last.offset + last.length
    assert reopened.read(after, b"http://a/after") == (b"m", b"z" * 10)
    reopened.close()


def test_recovery_keeps_only_as_many_regions_as_the_ring_holds(tmp_path):
    log = RegionLog(tmp_path, Regions(500, 4))
    for i in range(20):
        assert log.append(f"k{i}".encode(), b"", b"x" * 200) is not None
    log.close()
    smaller = RegionLog(tmp_path, Regions(500, 2))
    recovered = smaller.recover()
    assert {loc.region for _, loc in recovered} == set(smaller.regions.live)
    assert len(list(tmp_path.iterdir())) == 2
    smaller.close()


def test_a_region_file_that_cannot_be_opened_costs_that_record_only(tmp_path, caplog):
    log = RegionLog(tmp_path, Regions(100, 3))
    first = log.append(b"a", b"m", b"x" * 50)
    assert first is not None and first.region == 0
    log.path(1).mkdir()  # where the next region's file goes: nothing can be written there
    with caplog.at_level(logging.WARNING, logger="onehit.disk"):
        assert log.append(b"b", b"m", b"x" * 50) is None
    assert "writing region 1 failed" in caplog.text
    second = log.append(b"c", b"m", b"x" * 50)  # the next region opens
    assert second is not None and second.region == 2
    assert log.read(second, b"c") == (b"m", b"x" * 50)
    assert log.read(first, b"a") == (b"m", b"x" * 50)
    log.close()


FULL_DEVICE = """
import resource, signal, sys
from proxy.core.disk import RECORD_HEADER
from proxy.core.regions import Regions
from proxy.disk.region_log import RegionLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
log = RegionLog(sys.argv[1], Regions(1 << 20, 2))
kept = [log.append(b"k%d" % i, b"m", b"x" * 300) for i in range(5)]
print(["-" if loc is None else loc.offset for loc in kept])
print([log.read(loc, b"k%d" % i) == (b"m", b"x" * 300) for i, loc in enumerate(kept) if loc])
"""


def test_a_full_device_costs_the_records_it_refuses_never_a_torn_read(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", FULL_DEVICE, str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    offsets, reads = out.stdout.splitlines()
    # Three records of 321 bytes fit in 1,000; the fourth is written in part and refused, and
    # the fifth opens the next region.
    assert offsets == "[0, 321, 642, '-', 0]"
    assert reads == "[True, True, True, True]"
    recovered = RegionLog(tmp_path, Regions(1 << 20, 2)).recover()
    assert [key for key, _ in recovered] == [b"k0", b"k1", b"k2", b"k4"]


def test_the_record_header_is_the_one_the_disk_tiers_bookkeeping_counts():
    assert HEADER.size == RECORD_HEADER
    assert len(encode(b"key", b"meta", b"body")) == RECORD_HEADER + 3 + 4 + 4
