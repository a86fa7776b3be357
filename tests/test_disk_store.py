"""The disk tier's store across stops and crashes: a checkpoint of its index read back, only what
was written after it scanned, and never a torn or wrong body after a kill at any moment."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import stat
import subprocess
import sys
import time

import pytest

from proxy.config.settings import DiskSection
from proxy.core import slices
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.core.store import Entry
from proxy.core.tiers import PURGE
from proxy.disk.checkpoint import CHECKPOINT
from proxy.disk.directory import DiskDirectoryError, release
from proxy.disk.journal import DROPS
from proxy.disk.reads import READ_INLINE, ColdRecord
from proxy.disk.store import DiskStore

STORED = ResponseMeta(cacheable=True, lifetime=600.0, headers=(("Cache-Control", "max-age=600"),))


def section(path, **kw) -> DiskSection:
    settings = {"size": 8 << 20, "region_size": 1 << 20, "policy": "always"} | kw
    return DiskSection(path=str(path), **settings)


def body_of(key: str) -> bytes:
    """Each key's own body, so a body served for another key or cut short shows."""
    return hashlib.sha256(key.encode()).digest() * (1 + len(key) % 50)


def write(store: DiskStore, keys: list[str]) -> None:
    for key in keys:
        request = RequestMeta(key)
        assert store.takes(request, STORED, len(body_of(key)), True, 0.0)
        store.write(key, STORED, body_of(key), time.time())


def crash(store: DiskStore) -> None:
    """What a kill leaves: no checkpoint at the end, the files closed and the directory's lock
    given up (the kernel's part in a real crash)."""
    store.log.close()
    release(store.keeping.claim)


def test_a_clean_stop_checkpoints_and_the_next_start_scans_nothing(tmp_path):
    store = DiskStore(section(tmp_path))
    keys = [f"http://a/{i}" for i in range(200)]
    write(store, keys)
    store.close()
    assert (tmp_path / CHECKPOINT).exists()
    again = DiskStore(section(tmp_path))
    assert (again.keeping.from_checkpoint, again.keeping.scanned) == (200, 0)
    for key in keys:
        entry = again.reads.lookup(key, Entry)
        assert entry is not None and entry.payload == body_of(key) and entry.status == 200
    again.close()


def test_a_record_invalidated_before_a_crash_stays_gone_and_one_written_after_stays(tmp_path):
    store = DiskStore(section(tmp_path))
    write(store, ["http://a/x", "http://a/y"])
    store.checkpoint()
    write(store, ["http://a/z"])  # after the checkpoint: found again by the scan
    for key in ("http://a/x", "http://a/y", "http://a/z"):
        assert store.invalidate(key)
    assert store.durable()
    write(store, ["http://a/y"])  # stored anew after its purge, elsewhere in the ring
    crash(store)
    again = DiskStore(section(tmp_path))
    assert again.reads.lookup("http://a/x", Entry) is None
    assert again.reads.lookup("http://a/z", Entry) is None
    entry = again.reads.lookup("http://a/y", Entry)
    assert entry is not None and entry.payload == body_of("http://a/y")
    assert again.stats()["dropped_again"] == 2  # x and z: y's new record is not the one dropped
    again.close()  # its checkpoint holds the drops: the journal starts again
    assert not (tmp_path / DROPS).exists() or (tmp_path / DROPS).stat().st_size == 0
    last = DiskStore(section(tmp_path))
    assert last.reads.lookup("http://a/x", Entry) is None and last.stats()["dropped_again"] == 0
    last.close()


def test_after_a_crash_only_the_records_written_since_the_checkpoint_are_scanned(tmp_path):
    store = DiskStore(section(tmp_path))
    write(store, [f"k{i}" for i in range(50)])
    store.checkpoint()
    write(store, [f"later{i}" for i in range(30)])
    crash(store)
    again = DiskStore(section(tmp_path))
    assert (again.keeping.from_checkpoint, again.keeping.scanned) == (50, 30)
    assert all(again.reads.lookup(f"k{i}", Entry) is not None for i in range(50))
    assert all(again.reads.lookup(f"later{i}", Entry) is not None for i in range(30))
    # Appends go on after the last whole record, and a checkpoint then holds all.
    write(again, ["newest"])
    again.close()
    last = DiskStore(section(tmp_path))
    assert (last.keeping.from_checkpoint, last.keeping.scanned) == (81, 0)
    last.close()


def test_a_damaged_checkpoint_means_every_region_is_scanned(tmp_path):
    store = DiskStore(section(tmp_path))
    write(store, [f"k{i}" for i in range(40)])
    store.close()
    path = tmp_path / CHECKPOINT
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    again = DiskStore(section(tmp_path))
    assert (again.keeping.from_checkpoint, again.keeping.scanned) == (0, 40)
    assert all(again.reads.lookup(f"k{i}", Entry) is not None for i in range(40))
    again.close()


def test_a_checkpoint_leaves_out_the_regions_evicted_since(tmp_path):
    store = DiskStore(section(tmp_path, size=3 << 20))
    write(store, [f"old{i}" for i in range(100)])
    store.checkpoint()
    write(store, [f"new{i}" for i in range(15000)])  # 4.5 MB: turns the ring of 3 over
    crash(store)
    again = DiskStore(section(tmp_path, size=3 << 20))
    assert all(again.reads.lookup(f"old{i}", Entry) is None for i in range(100))
    assert again.reads.lookup("new14999", Entry) is not None
    assert again.tier.regions.capacity_bytes >= again.tier.bytes_held
    again.close()


WRITER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from test_disk_store import STORED, body_of, section
from proxy.core.events import RequestMeta
from proxy.disk.store import DiskStore
store = DiskStore(section(sys.argv[1], checkpoint_interval=0.05))
i = 0
last = time.monotonic()
print("ready", flush=True)
while True:
    key = f"http://a/{i}"
    if store.takes(RequestMeta(key), STORED, len(body_of(key)), True, 0.0):
        store.write(key, STORED, body_of(key), time.time())
    if time.monotonic() - last > 0.05:
        store.checkpoint()
        last = time.monotonic()
    i += 1
"""


@pytest.mark.slow
def test_a_kill_at_any_moment_never_leaves_a_torn_or_wrong_body(tmp_path):
    rng = random.Random(7)
    here = os.path.dirname(__file__)
    for round_ in range(5):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), here],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.05, 0.4))
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        store = DiskStore(section(tmp_path))
        found = 0
        for i in range(200_000):  # past any key a writer reached
            entry = store.reads.lookup(f"http://a/{i}", Entry)
            if entry is not None:
                assert entry.payload == body_of(f"http://a/{i}"), (round_, i)
                found += 1
        assert found > 0 and found == len(store.tier), round_
        crash(store)


def test_the_write_budget_of_the_config_tightens_what_the_disk_takes(tmp_path):
    store = DiskStore(section(tmp_path, max_write_rate=10_000))
    assert store.tier.budget.rate == 10_000
    taken = 0
    for i in range(2000):  # 20 s of 100 offers a second of 1 KB: ten times the budget
        key = f"k{i}"
        if store.takes(RequestMeta(key), STORED, 1000, True, i / 100):
            store.write(key, STORED, b"x" * 1000, i / 100)
            taken += 1
    assert 100 < taken < 500 and store.stats()["throttled"] == 2000 - taken
    store.close()


async def test_a_large_record_is_read_off_the_loop_and_a_purge_during_the_read_wins(tmp_path):
    store = DiskStore(section(tmp_path, size=16 << 20, region_size=4 << 20))
    large, small = "http://h/large", "http://h/small"
    bodies = {large: b"L" * (READ_INLINE + 1), small: b"s" * 100}
    for key, body in bodies.items():
        assert store.takes(RequestMeta(key), STORED, len(body), True, 0.0)
        store.write(key, STORED, body, time.time())
    # Read on the loop only up to READ_INLINE: a longer one is left for a read off it.
    assert store.reads.lookup_warm(small, Entry).payload == bodies[small]
    assert type(store.reads.lookup_warm(large, Entry)) is ColdRecord
    for key, body in bodies.items():
        entry = await store.reads.lookup_off_loop(key, Entry)
        assert entry is not None and entry.payload == body
    reading = asyncio.ensure_future(store.reads.lookup_off_loop(large, Entry))
    await asyncio.sleep(0)  # the read is now on a worker thread
    assert store.invalidate(large)
    assert await reading is None  # purged while it was read: never served
    store.close()


def slice_meta(n: int, version: str) -> ResponseMeta:
    span = ("Content-Range", f"bytes {n * 100}-{n * 100 + 99}/400")
    return STORED._replace(status=206, headers=(*STORED.headers, span, ("ETag", version)))


async def test_only_slices_written_after_their_objects_anchor_are_found(tmp_path):
    """A slice is found when it lies after its object's anchor: a new version's first slice
    writes a new anchor, past the old slices; a purge of the URL drops it, and a restart
    keeps both."""
    store = DiskStore(section(tmp_path))
    url = "http://a/video"
    keys = [slices.slice_key(url, n) for n in range(3)]
    for n in (0, 1):
        store.anchors.write_slice(keys[n], slice_meta(n, '"v1"'), b"x" * 100, 0.0)
    assert store.anchors.anchored(url, keys[0]) and store.anchors.anchored(url, keys[1])
    store.anchors.write_slice(keys[2], slice_meta(2, '"v2"'), b"y" * 100, 0.0)
    assert [store.anchors.anchored(url, key) for key in keys] == [False, False, True]
    store.close()
    again = DiskStore(section(tmp_path))
    assert [again.anchors.anchored(url, key) for key in keys] == [False, False, True]
    assert again.forget(url, PURGE) is False  # no record of the URL itself; its anchor went
    assert not again.anchors.anchored(url, keys[2])
    again.close()
    third = DiskStore(section(tmp_path))
    assert not third.anchors.anchored(url, keys[2])
    third.close()


async def test_only_variants_written_after_their_urls_anchor_are_found(tmp_path):
    """A variant is found for the request that selects it; once the URL varies on other
    fields, the variants selected on the old ones are not; a purge of the URL drops all."""
    store = DiskStore(section(tmp_path))
    url = "http://a/page"
    by_encoding = STORED._replace(vary=("accept-encoding",))
    gzip, plain = (("Accept-Encoding", "gzip"),), (("Accept-Encoding", "identity"),)
    store.anchors.write_variant(url, by_encoding, gzip, b"zipped", 0.0)
    store.anchors.write_variant(url, by_encoding, plain, b"plain", 0.0)
    for asked, body in ((gzip, b"zipped"), (plain, b"plain")):
        found = await store.anchors.lookup_request(RequestMeta(url, headers=asked), Entry)
        assert found is not None and (found[0].payload, found[1]) == (body, ("accept-encoding",))
    by_language = STORED._replace(vary=("accept-language",))
    store.anchors.write_variant(url, by_language, (("Accept-Language", "fr"),), b"fr", 0.0)
    assert await store.anchors.lookup_request(RequestMeta(url, headers=gzip), Entry) is None
    french = RequestMeta(url, headers=(("Accept-Language", "fr"),))
    assert (await store.anchors.lookup_request(french, Entry))[0].payload == b"fr"
    store.forget(url, PURGE)
    assert await store.anchors.lookup_request(french, Entry) is None
    store.close()


def test_a_second_process_on_one_disk_directory_is_refused_with_one_line(tmp_path):
    first = DiskStore(section(tmp_path))
    with pytest.raises(DiskDirectoryError) as refused:
        DiskStore(section(tmp_path))
    message = str(refused.value)
    assert "[disk] path" in message and f"pid {os.getpid()}" in message and "\n" not in message
    first.close()  # a clean stop gives the directory up
    DiskStore(section(tmp_path)).close()


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o777, "every user"), (0o1777, "every user"), (0o757, "every user"), (0o770, "group 1")],
)
def test_a_directory_other_users_may_write_to_is_refused(tmp_path, mode, who):
    shared = tmp_path / "cache"
    shared.mkdir()
    shared.chmod(mode)
    try:
        os.chown(shared, -1, 1)  # a group of others: root may give the directory to it
    except PermissionError:
        pytest.skip("giving a directory to another group needs root")
    with pytest.raises(DiskDirectoryError, match=f"{who} may write to it"):
        DiskStore(section(shared))
    assert list(shared.iterdir()) == []  # refused before anything was written


def test_a_directory_its_own_group_may_write_to_is_used(tmp_path):
    """A umask of 002 gives directories the user's own group may write to: as safe as 0755."""
    own = tmp_path / "cache"
    own.mkdir()
    own.chmod(0o775)
    os.chown(own, -1, os.getegid())
    DiskStore(section(own)).close()


def test_the_tier_creates_its_directory_and_files_for_its_own_user_only(tmp_path):
    directory = tmp_path / "new" / "cache"
    store = DiskStore(section(directory))
    write(store, ["http://a/x"])
    store.forget("http://a/x", PURGE)
    store.ban("http://a/", by_tag=False)
    assert store.durable()
    store.close()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert {f.name for f in files} >= {CHECKPOINT, "bans.json", DROPS, "lock"}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)


def test_a_link_planted_as_the_next_region_file_is_never_written_through(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (directory / "region-0000000000.log").symlink_to(victim)
    store = DiskStore(section(directory))  # found at start: removed, not followed
    write(store, ["http://a/x"])
    assert store.reads.lookup("http://a/x", Entry) is not None
    store.close()
    directory = tmp_path / "other"
    store = DiskStore(section(directory))
    (directory / "region-0000000000.log").symlink_to(victim)  # planted while it runs
    write(store, ["http://a/y"])  # refused: the device is the proxy's own
    assert store.reads.lookup("http://a/y", Entry) is None
    store.close()
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("bans", ["[" * 100_000 + "]" * 100_000, '[["", Infinity, 0, false]]'])
def test_bans_nested_past_the_parsers_depth_purge_everything_and_the_tier_starts(tmp_path, bans):
    store = DiskStore(section(tmp_path))
    write(store, ["http://a/x"])
    store.close()
    (tmp_path / "bans.json").write_text(bans)
    again = DiskStore(section(tmp_path))
    assert again.reads.lookup("http://a/x", Entry) is None  # unreadable bans may hide a purge
    again.close()


def test_a_drop_journaled_after_a_torn_one_is_read_back_whole(tmp_path):
    """A crash that tears a journal entry must not shift the drops written after the restart:
    each is read back at its own record, so a purge made then stays purged."""
    store = DiskStore(section(tmp_path))
    write(store, ["http://a/x", "http://a/y"])
    store.checkpoint()
    assert store.invalidate("http://a/x")
    crash(store)
    with open(tmp_path / DROPS, "ab") as journal:
        journal.write(b"\x01\x02\x03")  # the start of an entry the crash cut
    again = DiskStore(section(tmp_path))
    assert again.reads.lookup("http://a/x", Entry) is None
    assert again.invalidate("http://a/y") and again.durable()
    crash(again)
    last = DiskStore(section(tmp_path))
    assert last.reads.lookup("http://a/y", Entry) is None
    assert last.reads.lookup("http://a/x", Entry) is None
    assert last.stats()["dropped_again"] == 2
    last.close()


def test_a_journal_that_cannot_be_read_purges_what_it_may_have_dropped(tmp_path):
    store = DiskStore(section(tmp_path))
    write(store, ["http://a/x", "http://a/y"])
    store.checkpoint()
    assert store.invalidate("http://a/x")
    crash(store)
    (tmp_path / DROPS).rename(tmp_path / "elsewhere")
    (tmp_path / DROPS).symlink_to(tmp_path / "elsewhere")  # never followed: unreadable
    again = DiskStore(section(tmp_path))
    assert again.reads.lookup("http://a/x", Entry) is None
    assert again.reads.lookup("http://a/y", Entry) is None
    write(again, ["http://a/z"])  # written after the purge: kept
    assert again.reads.lookup("http://a/z", Entry) is not None
    again.close()
