"""The admission window shared through a real redis-server on 127.0.0.1 (no fakes of Redis)."""

import asyncio
import gc
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from conftest import REDIS, base, until
from redis.asyncio.cluster import RedisCluster

from loadgen.live.processes import redis_cluster_process
from proxy.__main__ import collect_for_serving
from proxy.core.window import WindowedBloomFilter
from proxy.fleet.shared import RedisWindow

pytestmark = pytest.mark.skipif(
    REDIS is None,
    reason="redis-server is not installed (apt-get install redis-server); CI installs it",
)


async def shared_proxy(start_proxy, url: str, budget: str, **settings):
    """A proxy deciding admission through the Redis at ``url`` within ``budget``, retrying a
    Redis it gave up on after 0.2 s; (the service, its shared filter)."""
    proxy = await start_proxy(admission__backend="redis", admission__redis_url=url,
                              admission__redis_budget=budget, **settings)  # fmt: skip
    proxy.proxy.shared.retry_after = 0.2
    return proxy, proxy.proxy.shared


async def test_same_decisions_as_the_in_process_filter(redis_server):
    client = aioredis.from_url(redis_server.url)
    remote = RedisWindow(client, 300, 0.01, window=50.0, generations=3, redis_time=False)
    local = WindowedBloomFilter(300, 0.01, window=50.0, generations=3)
    assert (remote.size_bits, remote.num_hashes) == (
        local.generations()[0].size_bits,
        local.generations()[0].num_hashes,
    )
    # 140 s over 60 keys (time rotations every 25 s), then a burst of new keys (forced ones).
    keys = [f"/k{(i * 7919) % 60}" for i in range(2000)] + [f"/n{i}" for i in range(1000)]
    decisions = []
    for i, key in enumerate(keys):
        now = i * 0.07
        decisions.append((await remote.seen_before(key, now), local.seen_before(key, now)))
    assert [r for r, _ in decisions] == [m for _, m in decisions]
    assert any(r for r, _ in decisions) and not all(r for r, _ in decisions)
    state = await remote.state()
    assert int(state["rotations"]) == local.rotations
    assert int(state["forced"]) == local.forced_rotations
    assert 0 < local.forced_rotations < local.rotations
    await client.aclose()


async def test_auto_share_rotates_the_fleet_after_the_local_sizers_choice(redis_server):
    client = aioredis.from_url(redis_server.url)
    local = WindowedBloomFilter(5, 0.01, window=3600.0, generations=2)
    remote = RedisWindow(client, 1000, 0.01, window=3600.0, generations=2,
                         auto_share=lambda: local.generation_share)  # fmt: skip
    for i in range(12):
        await remote.seen_before(f"/u{i}", 0.0)
    assert int((await remote.state())["forced"]) == 2  # after 5 and 10 first sightings
    await client.aclose()


async def test_generations_expire_in_redis(redis_server):
    client = aioredis.from_url(redis_server.url)
    remote = RedisWindow(client, 1000, 0.01, window=2.0, generations=2, prefix="t")
    await remote.seen_before("/a", 0.0)
    ttl = await client.pttl("{t}:g:0")
    assert 0 < ttl <= 4000  # window * g / (g - 1) = 4 s
    await client.aclose()


async def test_two_proxies_on_one_redis_share_what_they_have_seen(
    redis_server, origin, start_proxy, client
):
    shared = {"admission__backend": "redis", "admission__redis_url": redis_server.url,
              "admission__redis_budget": "200ms"}  # fmt: skip
    first, second = await start_proxy(**shared), await start_proxy(**shared)

    async def get(proxy):
        async with client.get(base(proxy) + "/u", headers={"Host": "cdn.example"}) as r:
            await r.read()
            return r.headers["Cache-Status"]

    assert await get(first) == "onehit; fwd=uri-miss; detail=first-sighting"
    assert await get(second) == "onehit; fwd=uri-miss; stored"  # seen through the first
    assert (await get(second)).startswith("onehit; hit")
    assert second.proxy.shared.remote_decisions == 1 and second.proxy.shared.fallbacks == 0


async def test_redis_down_falls_back_within_budget_and_returns(
    redis_server, origin, start_proxy, client
):
    proxy, shared = await shared_proxy(start_proxy, redis_server.url, "50ms")

    async def get(path):
        async with client.get(base(proxy) + path) as r:
            await r.read()
            return r.status

    assert await get("/before") == 200 and shared.remote_decisions == 1
    redis_server.stop()
    started = asyncio.get_running_loop().time()
    statuses = [await get(f"/down{i}") for i in range(5)]
    assert statuses == [200] * 5 and shared.fallbacks == 5 and not shared.healthy
    assert asyncio.get_running_loop().time() - started < 5 * 1.0
    await redis_server.start()
    # Back to Redis once it answers: the first miss after the retry delay may still fall back
    # while the pool reconnects and the script is loaded again, so allow a few.
    deadline = asyncio.get_running_loop().time() + 10
    after = 0
    while shared.remote_decisions == 1 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.25)
        assert await get(f"/after{after}") == 200
        after += 1
    assert shared.healthy and shared.remote_decisions == 2
    async with client.get(base(proxy).replace(str(proxy.proxy_address[1]),
                          str(proxy.admin_address[1])) + "/metrics") as r:  # fmt: skip
        assert f"onehit_filter_fallbacks_total {float(shared.fallbacks)}" in await r.text()


def size_class(size: int) -> int:
    """The allocation jemalloc (Redis's allocator) makes for ``size`` bytes: four size classes
    between consecutive powers of two."""
    step = max(16, (1 << (size - 1).bit_length()) // 8)
    return -(-size // step) * step


async def test_redis_memory_is_g_bitmaps_and_one_hash_after_200_forced_rotations(redis_server):
    client = aioredis.from_url(redis_server.url)
    remote = RedisWindow(client, 100_000, 0.01, window=3600.0, generations=2, prefix="mem",
                         auto_share=lambda: 10)  # fmt: skip
    for start in range(0, 2000, 50):
        await remote.seen_before_many([f"/k{i}" for i in range(start, start + 50)], 0.0)
    assert int((await remote.state())["forced"]) == 200
    keys = await client.keys("*")
    assert await client.dbsize() == remote.generations + 1
    used = sum([await client.memory_usage(k) for k in keys])
    # The README's formula: g bitmaps of size_bits / 8 bytes, each rounded up to the
    # allocator's size class with a string header (~56 B), plus the state hash (~140 B).
    bitmap = -(-remote.size_bits // 8)
    expected = remote.generations * (size_class(bitmap + 16) + 56) + 140
    assert abs(used - expected) <= 0.1 * expected, (used, expected)
    await client.aclose()


async def test_instances_whose_clocks_disagree_rotate_on_redis_time(redis_server):
    client = aioredis.from_url(redis_server.url)
    window = dict(capacity=1000, fp_rate=0.01, window=0.4, generations=2, prefix="clock")
    fast, slow = RedisWindow(client, **window), RedisWindow(client, **window)
    assert not await fast.seen_before("/a", 10_000.0)
    # Ten minutes behind: with its own clock this instance would start the window again.
    assert await slow.seen_before("/a", 10_000.0 - 600)
    assert int((await slow.state()).get("rotations", 0)) == 0
    await asyncio.sleep(0.5)  # one span of Redis's own time
    assert await fast.seen_before("/a", 10_000.0)  # still inside the window
    assert int((await fast.state())["rotations"]) == 1
    await asyncio.sleep(1.0)
    assert not await slow.seen_before("/a", 0.0)  # forgotten, whatever its clock says
    await client.aclose()


@pytest.fixture
async def redis_cluster():
    """Three real redis-server nodes joined into a cluster by redis-cli; one node's URL."""
    async with redis_cluster_process(3) as url:
        if url is None:
            pytest.skip("redis-cli is not installed (apt-get install redis-tools); CI installs it")
        yield url


@pytest.mark.slow
async def test_a_redis_cluster_decides_exactly_as_one_node_and_the_local_filter(
    redis_server, redis_cluster
):
    single = aioredis.from_url(redis_server.url)
    cluster = RedisCluster.from_url(redis_cluster)
    local = WindowedBloomFilter(300, 0.01, window=50.0, generations=3)
    windows = [
        RedisWindow(client, 300, 0.01, window=50.0, generations=3, redis_time=False)
        for client in (single, cluster)
    ]
    keys = [f"/k{(i * 7919) % 60}" for i in range(600)] + [f"/n{i}" for i in range(600)]
    decisions: list[tuple[bool, ...]] = []
    for start in range(0, len(keys), 40):
        now = start * 0.2
        batch = keys[start : start + 40]
        on_single, on_cluster = [await w.seen_before_many(batch, now) for w in windows]
        expected = [local.seen_before(key, now) for key in batch]
        decisions += zip(on_single, on_cluster, expected, strict=True)
    assert all(a == b == c for a, b, c in decisions)
    assert any(d[0] for d in decisions) and not all(d[0] for d in decisions)
    assert int((await windows[1].state())["forced"]) == local.forced_rotations > 0
    await single.aclose()
    await cluster.aclose()


@pytest.fixture
def collector_as_served() -> Iterator[None]:
    """The garbage collector tuned as ``onehit-proxy`` tunes it. Untuned, a full collection
    of the test process's heap (every test module loaded) can stall the loop past a 5 ms
    budget, which the served process does not see."""
    threshold = gc.get_threshold()
    collect_for_serving()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.slow
@pytest.mark.perf
async def test_16_clients_of_6000_first_sightings_fall_back_for_under_5_percent(
    redis_server, origin, start_proxy, client, collector_as_served
):
    # What a new user tries: the defaults (budget 5 ms), a 1 MiB cache, expected_urls = 500,
    # 16 concurrent clients each sending never-seen URLs; the client shares the proxy's event
    # loop here, which keeps it busier than a proxy of its own process would be.
    proxy = await start_proxy(
        admission__backend="redis",
        admission__redis_url=redis_server.url,
        admission__expected_urls=500,
        cache__size="1MiB",
    )
    shared = proxy.proxy.shared

    async def worker(n: int) -> None:
        for i in range(375):
            async with client.get(base(proxy) + f"/w{n}-{i}") as r:
                assert r.status == 200
                await r.read()

    await asyncio.gather(*(worker(n) for n in range(16)))
    decisions = shared.fallbacks + shared.remote_decisions
    print(f"{shared.fallbacks} fallbacks of {decisions} decisions in {shared.batches} calls;",
          shared.stats())  # fmt: skip
    assert decisions == 6000
    assert shared.fallbacks < 0.05 * decisions, shared.stats()
    assert shared.batches < decisions, "concurrent misses share round trips"
    assert shared.min_budget <= shared.budget <= shared.max_budget


async def test_one_late_reply_falls_back_once_and_leaves_redis_in_use(
    redis_server, origin, start_proxy, client
):
    proxy, shared = await shared_proxy(start_proxy, redis_server.url, "20ms")
    pauser = aioredis.from_url(redis_server.url)

    async def get(path: str) -> int:
        async with client.get(base(proxy) + path) as r:
            await r.read()
            return r.status

    assert await get("/warm") == 200 and shared.remote_decisions == 1
    await pauser.execute_command("CLIENT", "PAUSE", "150", "WRITE")  # scripts wait 150 ms
    assert await get("/late") == 200
    assert (shared.fallbacks, shared.late_replies, shared.healthy) == (1, 1, True)
    await until(lambda: shared.budget == shared.max_budget)  # the late reply is measured
    assert await get("/after") == 200
    assert (shared.remote_decisions, shared.fallbacks, shared.trips) == (2, 1, 0)
    # A round trip of 150 ms raised the budget to its bound, never past it.
    assert shared.budget == shared.max_budget == 0.05
    await pauser.aclose()


async def test_redis_slower_than_the_budget_falls_back_then_returns(
    redis_server, origin, start_proxy, client
):
    proxy, shared = await shared_proxy(start_proxy, redis_server.url, "50ms")
    pauser = aioredis.from_url(redis_server.url)
    await pauser.execute_command("CLIENT", "PAUSE", "600", "ALL")  # Redis stops answering
    statuses = []
    for i in range(3):
        async with client.get(base(proxy) + f"/slow{i}") as r:
            statuses.append(r.status)
    assert statuses == [200] * 3 and shared.fallbacks == 3 and not shared.healthy
    await pauser.ping()  # answered once Redis answers again
    for i in range(20):
        async with client.get(base(proxy) + f"/back{i}") as r:
            assert r.status == 200
        if shared.healthy and shared.remote_decisions:
            break
        await asyncio.sleep(0.1)
    assert shared.healthy and shared.remote_decisions >= 1
    await pauser.aclose()


@pytest.mark.slow
async def test_a_cluster_failover_keeps_every_request_served_and_the_filter_returns(
    origin, start_proxy, client
):
    async with redis_cluster_process(6, replicas=1) as url:
        if url is None:
            pytest.skip("redis-cli is not installed (apt-get install redis-tools); CI installs it")
        proxy, shared = await shared_proxy(start_proxy, url, "200ms", admission__redis_cluster=True)

        async def get(path: str) -> int:
            async with client.get(base(proxy) + path) as r:
                await r.read()
                return r.status

        # The first decision also connects to the cluster and learns its slots, which can
        # outlast the 200 ms budget on a busy machine: ask until one is decided there.
        for i in range(100):
            assert await get(f"/before{i}") == 200
            if shared.remote_decisions:
                break
            await asyncio.sleep(0.2)  # past the 0.2 s before a fallen-back Redis is retried
        assert shared.remote_decisions >= 1
        # Promote the replica of the master that holds the filter's hash slot.
        replica = await replica_of_slot(url, shared.remote.keys[0])
        loop = asyncio.get_running_loop()
        await replica.execute_command("CLUSTER", "FAILOVER")
        asked = loop.time()
        deadline = asked + 60
        statuses = []
        decided_before_takeover = None  # remote decisions when the replica was seen as master
        while loop.time() < deadline:
            statuses.append(await get(f"/during{len(statuses)}"))
            if decided_before_takeover is None:
                if (await replica.execute_command("ROLE"))[0] == b"master":
                    decided_before_takeover = shared.remote_decisions
                elif loop.time() - asked > FAILOVER_GIVES_UP:
                    # Redis abandons a manual failover the master has not joined in time (a
                    # busy machine): ask again.
                    await replica.execute_command("CLUSTER", "FAILOVER")
                    asked = loop.time()
            if (
                decided_before_takeover is not None
                and shared.healthy
                and shared.remote_decisions > decided_before_takeover
                and len(statuses) > 5
            ):
                break
            await asyncio.sleep(0.1)
        assert set(statuses) == {200}
        assert decided_before_takeover is not None, "the replica took over"
        # The filter answers again from the promoted master.
        assert shared.healthy and shared.remote_decisions > decided_before_takeover
        await replica.aclose()


# Redis drops a manual failover not done within this many seconds (CLUSTER_MF_TIMEOUT, 5 s),
# with a margin.
FAILOVER_GIVES_UP = 6.0


async def replica_of_slot(url: str, key: str) -> aioredis.Redis:
    """A client of a replica of the master serving ``key``'s hash slot, once that replica says
    its link to the master is up. Each node is asked about itself (``ROLE``): gossip may take
    a while to tell the node at ``url`` about the replicas on a slow machine."""
    node = aioredis.from_url(url)
    slot = await node.execute_command("CLUSTER", "KEYSLOT", key)
    owner = next(
        master
        for start, end, master, *_ in await node.execute_command("CLUSTER", "SLOTS")
        if start <= slot <= end
    )
    owner_port = int(owner[1])
    addresses = [
        line.split()[1].split("@")[0]
        for line in (await node.execute_command("CLUSTER", "NODES")).decode().splitlines()
    ]
    await node.aclose()
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        for address in addresses:
            candidate = aioredis.from_url(f"redis://{address}/0")
            role = await candidate.execute_command("ROLE")
            if role[0] == b"slave" and int(role[2]) == owner_port and role[3] == b"connected":
                return candidate
            await candidate.aclose()
        await asyncio.sleep(0.1)
    raise AssertionError("no replica of the slot's master came up within 60 s")
