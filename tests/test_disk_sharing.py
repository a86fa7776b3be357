"""A disk tier the workers of one machine share (``DiskStore`` with ``Sharing``), driven in one
process as the parent and its workers drive it: what one worker writes, forgets or purges,
every other finds so; what they journaled, whatever opens the directory next takes up."""

from __future__ import annotations

import mmap

import pytest

from proxy.config.settings import DiskSection
from proxy.core._native import hash64
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.core.store import Entry
from proxy.disk.directory import release
from proxy.disk.sharing import Sharing, combine_stats, shared_bytes
from proxy.disk.store import DiskStore

pytestmark = pytest.mark.unit

STORED = ResponseMeta(cacheable=True, lifetime=3600.0, headers=(("Cache-Control", "max-age=3600"),))


class Machine:
    """A parent (the loader) and its workers on one directory, sharing memory as
    ``proxy.ops.shared_tier`` lays it out."""

    def __init__(self, path: str, *, follows_memory: bool = False) -> None:
        self.section = DiskSection(path=path, size=4 << 20, region_size=256 << 10,
                                   policy="always")  # fmt: skip
        index_bytes, window_bytes = shared_bytes(self.section)
        assert window_bytes == 0
        self.memory = mmap.mmap(-1, index_bytes)
        self.follows_memory = follows_memory
        self.parent = DiskStore(self.section, sharing=self.sharing(None))
        self.workers: list[DiskStore] = []

    def sharing(self, worker: int | None) -> Sharing:
        return Sharing(self.memory, None, worker, follows_memory=self.follows_memory, workers=2)

    def worker(self, place: int) -> DiskStore:
        store = DiskStore(self.section, sharing=self.sharing(place))
        self.workers.append(store)
        return store

    def close(self) -> None:
        for store in self.workers:
            store.close()
        self.parent.close()

    def crash(self) -> None:
        """Every process killed at once: files left as they are, the claim given up."""
        for store in (*self.workers, self.parent):
            store.log.close()
            store.journal.close()
        claim = self.parent.keeping.claim
        assert claim is not None
        release(claim)


def write(store: DiskStore, key: str, body: bytes = b"body") -> None:
    assert store.takes(RequestMeta(key), STORED, len(body), True, 0.0)
    store.write(key, STORED, body, 0.0)


def test_what_one_worker_writes_the_other_reads_and_what_it_forgets_the_other_misses(tmp_path):
    machine = Machine(str(tmp_path))
    one, two = machine.worker(0), machine.worker(1)
    write(one, "http://a/x", b"from one")
    found = two.reads.lookup("http://a/x", Entry)
    assert found is not None and found.payload == b"from one"
    assert one.forget("http://a/x", "unsafe")
    assert two.reads.lookup("http://a/x", Entry) is None
    assert machine.parent.stats()["objects"] == 0
    machine.close()


def test_a_purge_by_prefix_one_worker_took_reaches_a_worker_that_started_before_it(tmp_path):
    """The fan-out of a purge may miss a worker being started: it learns the ban at its
    next read, in Python and in the compiled reader's index alike."""
    machine = Machine(str(tmp_path))
    one = machine.worker(0)
    write(one, "http://a/old")
    late = machine.worker(1)  # started, and not yet in the parent's list of workers
    one.ban("http://a/", by_tag=False)
    slot = late.reads.index.get(hash64("http://a/old")[0])
    assert slot is not None, "the index still holds the record: the ban drops it at a read"
    assert late.tier.bans, "the compiled reader's get brought the ban in"
    assert late.reads.lookup("http://a/old", Entry) is None
    write(late, "http://a/new")
    assert one.reads.lookup("http://a/new", Entry) is not None, "a record after the ban stays"
    machine.close()


def test_a_record_read_torn_is_dropped_only_where_the_reader_found_it(tmp_path):
    machine = Machine(str(tmp_path))
    one, two = machine.worker(0), machine.worker(1)
    write(one, "http://a/x", b"first")
    old = two.tier.find("http://a/x")
    write(one, "http://a/y")
    one.forget("http://a/x", "unsafe")
    write(one, "http://a/x", b"second")
    assert old is not None and two.tier.drop("http://a/x", at=old) is None
    found = two.reads.lookup("http://a/x", Entry)
    assert found is not None and found.payload == b"second"
    machine.close()


def test_what_workers_journaled_a_single_process_takes_up_after_them(tmp_path):
    """A purge made under --workers stays made when one process opens the directory next,
    after a clean stop and after a crash alike."""
    for clean in (True, False):
        directory = tmp_path / ("clean" if clean else "crash")
        machine = Machine(str(directory))
        one = machine.worker(1)
        write(one, "http://a/x")
        write(one, "http://b/y")
        machine.parent.checkpoint()
        one.ban("http://a/", by_tag=False)
        assert one.forget("http://b/y", "unsafe")
        assert one.durable()
        if clean:
            machine.close()
            assert not list(directory.glob("drops-*.log")), "the parent took them over"
        else:
            machine.crash()
        alone = DiskStore(machine.section)
        assert alone.reads.lookup("http://a/x", Entry) is None, "purged by prefix"
        assert alone.reads.lookup("http://b/y", Entry) is None, "forgotten"
        alone.close()
        assert not list(directory.glob("drops-*.log")) and not list(directory.glob("bans-*"))


def test_a_tier_in_shared_memory_journals_no_drops_and_keeps_its_bans(tmp_path):
    machine = Machine(str(tmp_path), follows_memory=True)
    one = machine.worker(0)
    for n in range(50):
        write(one, f"http://a/{n}")
        one.forget(f"http://a/{n}", "unsafe")
    one.ban("http://b/", by_tag=False)
    assert one.durable()
    assert not list(tmp_path.glob("drops*.log")), "gone with the processes: nothing to replay"
    assert (tmp_path / "bans-0.json").exists(), "a worker started later must know the ban"
    machine.close()


def test_the_machine_counts_each_worker_and_what_the_tier_holds_once():
    one = {"hits": 3, "objects": 10, "bytes_written": 100, "process_write_bytes": None}
    two = {"hits": 4, "objects": 10, "bytes_written": 50, "process_write_bytes": 7}
    assert combine_stats([one, two]) == {
        "hits": 7, "objects": 10, "bytes_written": 150, "process_write_bytes": None,
    }  # fmt: skip


def test_a_replacement_keeps_the_drops_of_the_worker_it_replaces_until_a_checkpoint_holds_them(
    tmp_path,
):
    """A worker killed after a purge by URL, replaced in its place, then the parent killed:
    the replacement's drain must not empty the journal it took up."""
    machine = Machine(str(tmp_path))
    one = machine.worker(0)
    write(one, "http://a/x", b"old body")
    assert machine.parent.checkpoint()
    assert one.forget("http://a/x", "purge") and one.durable()
    one.journal.close()  # killed: its file stays, with the drop
    machine.workers.remove(one)
    again = machine.worker(0)
    again.close()  # drains as the parent dies: its checkpoint is its bans, and its journal
    machine.workers.remove(again)
    assert (tmp_path / "drops-0.log").stat().st_size > 0, "no checkpoint holds the drop yet"
    machine.crash()
    alone = DiskStore(machine.section)
    assert alone.reads.lookup("http://a/x", Entry) is None
    alone.close()


def test_after_a_crash_each_purge_is_kept_once_whatever_number_of_workers_kept_it(tmp_path):
    """Every worker saves its own copy of a purge by prefix, at its own place in the ring:
    taken up together they are one ban each, well within the bound that would purge all."""
    machine = Machine(str(tmp_path))
    one, two = machine.worker(0), machine.worker(1)
    for n in range(600):
        write(one, f"http://p{n}/x")
        one.ban(f"http://p{n}/", by_tag=False)
        write(two, f"http://q{n}/x")
        two.ban(f"http://p{n}/", by_tag=False)
    write(one, "http://kept/after")
    machine.crash()
    alone = DiskStore(machine.section)
    assert len(alone.tier.bans) == 600
    assert alone.reads.lookup("http://kept/after", Entry) is not None, "not purged with everything"
    assert alone.reads.lookup("http://p7/x", Entry) is None
    alone.close()
