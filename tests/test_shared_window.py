"""One admission window for the processes of a machine: generations in shared memory, recorded
and tested by every process, rotated once, with no lock a killed process could leave held."""

from __future__ import annotations

import mmap
import os
import signal
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionConfig, make_policy, shared_window_size
from proxy.core.store import CacheStore
from proxy.core.window import WindowedBloomFilter, shared_window_bytes
from proxy.ops import machine


def shared(capacity: int = 1000, g: int = 2) -> mmap.mmap:
    return mmap.mmap(-1, shared_window_bytes(capacity, 0.01, g))


def test_a_key_seen_once_through_each_of_two_handles_is_a_second_sighting():
    memory = shared()
    a = WindowedBloomFilter(1000, 0.01, 60.0, 2, shared=memory)
    b = WindowedBloomFilter(1000, 0.01, 60.0, 2, shared=memory)
    assert not a.seen_before("http://x/1", 1.0)
    assert b.seen_before("http://x/1", 2.0)
    assert not b.contains("http://x/2", 2.0) and not a.contains("http://x/2", 2.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.floats(0, 50), st.booleans()), min_size=1, max_size=80
    ),
    st.integers(2, 4),
)
def test_shared_handles_answer_as_one_window_of_this_process_would(steps, g):
    """Without forced rotations (capacity to spare), handles over one memory, used in any
    order, answer every call as a process's own window does: the same grid of rotations."""
    memory = shared(capacity=10_000, g=g)
    handles = [WindowedBloomFilter(10_000, 0.01, 60.0, g, shared=memory) for _ in range(2)]
    own = WindowedBloomFilter(10_000, 0.01, 60.0, g)
    now = 1_000.0
    for key, step, which in steps:
        now += step
        url = f"http://x/{key}"
        assert handles[which].seen_before(url, now) == own.seen_before(url, now), (url, now)
    assert handles[0].rotations == handles[1].rotations == own.rotations


def test_a_flood_rotates_early_once_for_every_process_as_one_window_would():
    memory = shared(capacity=100)
    a = WindowedBloomFilter(100, 0.01, 60.0, 2, shared=memory)
    b = WindowedBloomFilter(100, 0.01, 60.0, 2, shared=memory)
    own = WindowedBloomFilter(100, 0.01, 60.0, 2)
    for i in range(1_000):
        assert (a if i % 2 else b).seen_before(f"k{i}", 1.0) == own.seen_before(f"k{i}", 1.0)
    assert a.forced_rotations == b.forced_rotations == a.rotations == own.forced_rotations >= 9
    assert a.stats().generations[0].keys < 100 and a.generation_share == 100


def test_memory_laid_out_for_other_settings_is_refused():
    memory = shared(capacity=1000, g=3)
    WindowedBloomFilter(1000, 0.01, 60.0, 3, shared=memory)
    with pytest.raises(ValueError, match="laid out with other settings"):
        WindowedBloomFilter(1000, 0.01, 30.0, 3, shared=memory)
    with pytest.raises(ValueError, match=r"needs \d+ bytes"):
        WindowedBloomFilter(1000, 0.01, 60.0, 3, shared=mmap.mmap(-1, 4096))


def test_second_hit_shares_its_window_and_other_policies_need_no_memory():
    config = AdmissionConfig(policy="second-hit", capacity=1000)
    memory = mmap.mmap(-1, shared_window_size(config))
    policies = [make_policy(config, CacheStore(1 << 20), shared=memory) for _ in range(2)]
    assert not policies[0].admit("http://x/", 1, 1.0) and policies[1].admit("http://x/", 1, 2.0)
    assert shared_window_size(AdmissionConfig(policy="always")) == 0


def test_a_process_killed_at_any_moment_leaves_a_window_the_others_use():
    """Children record keys as fast as they can, rotating every 50 (so most kills land in a
    rotation or an add), and are killed at random moments; after each kill this process
    still records a key and finds it at once."""
    config = AdmissionConfig(policy="second-hit", capacity=50, window=3600)
    memory = machine.attach(machine.create(shared_window_size(config)))
    mine = WindowedBloomFilter(50, 0.01, 3600.0, 2, shared=memory)
    for round_ in range(20):
        pid = os.fork()
        if pid == 0:  # the child: records until killed
            theirs = WindowedBloomFilter(50, 0.01, 3600.0, 2, shared=memory)
            i = 0
            while True:
                theirs.seen_before(f"child{round_}-{i}", 1.0 + i * 1e-6)
                i += 1
        time.sleep(0.005 + (round_ % 7) * 0.003)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        started = time.monotonic()
        key = f"mine{round_}"
        mine.seen_before(key, 2.0)
        assert mine.contains(key, 2.0) and mine.seen_before(key, 2.0)
        assert time.monotonic() - started < 1.0  # nothing held by the dead process
    assert mine.rotations > 20  # the children rotated it, and it went on rotating


def test_with_a_sizer_each_rotation_sets_the_share_for_every_process_within_the_layout():
    memory = shared(capacity=1000)
    asked = [50]
    a = WindowedBloomFilter(1000, 0.01, 60.0, 2, sizer=lambda: asked[0], shared=memory)
    b = WindowedBloomFilter(1000, 0.01, 60.0, 2, shared=memory)
    assert a.generation_share == b.generation_share == 50  # as a window of its own starts
    asked[0] = 70
    a.seen_before("x", 1.0)
    a.seen_before("x", 62.0)  # a span later: rotated, and the sizer asked
    assert a.generation_share == b.generation_share == 70
    asked[0] = 10**9
    a.seen_before("x", 123.0)
    assert b.generation_share == 1000  # never past the bits laid out


def test_processes_rotating_at_once_never_lose_a_key_recorded_inside_the_window():
    """Three processes record keys as fast as they can, rotating the window every 200 new
    keys between them, and each tests every key right after recording it: it is found unless
    seven rotations (with 8 generations, what a key outlives) came between the two calls. A
    key not found otherwise is one a rotation cleared while its generation was in use."""
    g, share = 8, 200
    memory = shared(capacity=share * (g - 1), g=g)
    children = []
    for n in range(3):
        pid = os.fork()
        if pid == 0:
            window = WindowedBloomFilter(share * (g - 1), 0.01, 3600.0, g, shared=memory)
            lost = 0
            for i in range(20_000):
                key, before = f"{n}-{i}", window.rotations
                if not (window.seen_before(key, 1.0) or window.contains(key, 1.0)):
                    lost += window.rotations - before < g - 1
            os._exit(min(lost, 255))
        children.append(pid)
    lost = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    window = WindowedBloomFilter(share * (g - 1), 0.01, 3600.0, g, shared=memory)
    assert window.rotations > 100  # they did rotate it, concurrently, many times
    assert lost == [0, 0, 0]
