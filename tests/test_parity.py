"""One implementation, two drivers: a trace through the live proxy at concurrency 1 and
through the simulator gives the same counters."""

import math
from collections.abc import Callable

import numpy as np
import pytest
from conftest import admin, base, serve_trace

from loadgen.sim.simulate import simulate
from loadgen.sim.tiers import DiskSpec, model_tiers, simulate_tiers
from loadgen.traces.trace import Trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig
from proxy.core.events import RequestMeta
from proxy.origin.body import fields_of

COUNTERS = ("requests", "hits", "misses", "admissions", "rejected_first_sighting", "evictions")
DISK_COUNTERS = ("hits", "misses", "admissions", "rejected", "objects")


async def live_record_length(proxy) -> Callable[[str, int], int]:
    """The length of the record ``proxy``'s disk tier writes for an object of the trace's
    origin (``serve_trace``) of a given key and size: its own encoder, on the fields the
    origin sends, as the proxy reads them."""
    sample = next(iter(proxy.proxy.router.routes.values())) + "/obj/sample"
    upstream = await proxy.proxy.upstream.request("GET", sample, [])
    async with upstream:
        fields = [(k, v) for k, v in fields_of(upstream) if k.lower() != "content-length"]
    fetcher, disk = proxy.proxy.fetcher, proxy.proxy.disk

    def length(key: str, size: int) -> int:
        headers = [*fields, ("Content-Length", str(size))]
        rmeta = fetcher.response_meta(RequestMeta(key), 200, headers, 0.0)
        return disk.record_length(key, rmeta, size)

    return length


def two_tiers(capacity: int, directory) -> dict[str, str]:
    """A memory tier of ``capacity`` bytes in front of a small disk tier that evicts."""
    return {"cache__size": str(capacity), "cache__max_object_size": str(capacity),
            "disk__path": str(directory), "disk__size": "256KiB",
            "disk__region_size": "64KiB"}  # fmt: skip


def simulated_like(proxy, trace: Trace, capacity: int, prefix: str, record_length,
                   ttl: float = math.inf, ruled: bool = False) -> dict:  # fmt: skip
    """``simulate_tiers``' stats for ``trace`` with ``proxy``'s two tiers, as configured: the
    compiled loop's, which are the Python model's (``model_tiers``) too; ``ruled``: under the
    proxy's TTL rules, which the model does not take."""
    section = proxy.config.disk
    spec = DiskSpec(section.size, section.region_size,
                    AdmissionConfig(policy=section.policy, window=section.window),
                    record_length=record_length)  # fmt: skip
    args = (trace, capacity, proxy.config.admission_config(), spec)
    if ruled:
        return simulate_tiers(*args, key_prefix=prefix, ttl=ttl,
                              ttl_rules=proxy.proxy.engine.ttl_rules).stats  # fmt: skip
    compiled = simulate_tiers(*args, key_prefix=prefix, ttl=ttl).stats
    assert compiled == model_tiers(*args, key_prefix=prefix, ttl=ttl).stats
    return compiled


async def replay(client, proxy, trace: Trace, clock: list[float] | None = None) -> str:
    """Request every key of ``trace`` through ``proxy`` in order (setting ``clock`` to each
    request's time when given); the URL prefix its keys were requested under."""
    prefix = base(proxy) + "/obj/"
    for at, key in zip(trace.times.tolist(), trace.key_strings(), strict=True):
        if clock is not None:
            clock[0] = at
        async with client.get(prefix + key) as r:
            assert r.status == 200
            await r.read()
    return prefix


@pytest.mark.parametrize("eviction", ["lru", "s3fifo", "sieve", "wtinylfu", "twoq"])
@pytest.mark.parametrize(
    "admission",
    ["always", "second-hit", "nth-hit:3", "tinylfu", "probabilistic:0.5", "size-below:4KiB"],
)
async def test_live_and_simulated_counters_agree_exactly(
    origin, start_proxy, client, admission, eviction
):
    sizes = SizeSpec.parse("lognormal:median=2KiB,sigma=1,max=64KiB")
    trace = generate(WorkloadSpec(objects=200, requests=1000, one_hit_share=0.3, sizes=sizes))
    trace = Trace(np.zeros(len(trace)), trace.ids, trace.sizes)
    serve_trace(origin, trace)
    capacity = round(trace.distinct_bytes() * 0.05)
    proxy = await start_proxy(
        cache__size=str(capacity),
        cache__max_object_size=str(capacity),
        cache__eviction=eviction,
        admission__policy=admission,
    )
    prefix = await replay(client, proxy, trace)
    live = proxy.proxy.engine.stats()
    config = proxy.config.admission_config()
    sim = simulate(trace, capacity, config, key_prefix=prefix, eviction=eviction).stats
    assert {k: live[k] for k in COUNTERS} == {k: sim[k] for k in COUNTERS}
    assert live["hits"] > 0 and live["evictions"] > 0
    assert (live["rejected_first_sighting"] > 0) == (admission != "always")


@pytest.mark.parametrize("eviction", ["lru", "s3fifo"])
@pytest.mark.parametrize("admission", ["always", "second-hit"])
async def test_live_and_simulated_counters_agree_with_ttls(
    origin, start_proxy, client, admission, eviction
):
    """Responses that expire: the live proxy, on the trace's clock, revalidates what the
    simulator counts as a miss, and stores it again as the simulator does."""
    ttl = 2.0
    sizes = SizeSpec.parse("lognormal:median=2KiB,sigma=1,max=64KiB")
    spec = WorkloadSpec(objects=100, requests=1000, one_hit_share=0.3, sizes=sizes, rate=50.0)
    trace = generate(spec)  # 20 s of requests: each object outlives its ttl many times
    serve_trace(origin, trace, max_age=ttl)
    now = [0.0]
    capacity = round(trace.distinct_bytes() * 0.2)
    proxy = await start_proxy(
        clock=lambda: now[0],
        cache__size=str(capacity),
        cache__max_object_size=str(capacity),
        cache__eviction=eviction,
        admission__policy=admission,
    )
    prefix = await replay(client, proxy, trace, clock=now)
    live = proxy.proxy.engine.stats()
    config = proxy.config.admission_config()
    sim = simulate(trace, capacity, config, key_prefix=prefix, eviction=eviction, ttl=ttl)
    assert {k: live[k] for k in COUNTERS} == {k: sim.stats[k] for k in COUNTERS}
    forever = simulate(trace, capacity, config, key_prefix=prefix, eviction=eviction).stats
    assert 0 < live["hits"] < forever["hits"], "responses expired, and cost hits"


@pytest.mark.parametrize("admission", ["always", "second-hit"])
async def test_live_and_simulated_counters_agree_under_the_operators_ttl_rules(
    origin, start_proxy, client, admission
):
    """TTL rules give keys lifetimes of their own (a cap for some paths, a floor for the
    rest, over the origin's max-age): the simulator, given the same rules, counts what the
    live proxy counts on the trace's clock."""
    ttl = 2.0
    sizes = SizeSpec.parse("lognormal:median=2KiB,sigma=1,max=64KiB")
    spec = WorkloadSpec(objects=100, requests=1000, one_hit_share=0.3, sizes=sizes, rate=50.0)
    trace = generate(spec)
    serve_trace(origin, trace, max_age=ttl)
    now = [0.0]
    capacity = round(trace.distinct_bytes() * 0.2)
    rules = [{"path": "/obj/1", "max": "1s"}, {"path": "/obj/", "min": "5s"}]
    proxy = await start_proxy(clock=lambda: now[0], cache__size=str(capacity),
                              cache__max_object_size=str(capacity), admission__policy=admission,
                              ttl=rules)  # fmt: skip
    prefix = await replay(client, proxy, trace, clock=now)
    live = proxy.proxy.engine.stats()
    config = proxy.config.admission_config()
    sim = simulate(trace, capacity, config, key_prefix=prefix, ttl=ttl,
                   ttl_rules=proxy.proxy.engine.ttl_rules).stats  # fmt: skip
    assert {k: live[k] for k in COUNTERS} == {k: sim[k] for k in COUNTERS}
    unruled = simulate(trace, capacity, config, key_prefix=prefix, ttl=ttl).stats
    assert live["hits"] != unruled["hits"], "the rules changed what was fresh"


@pytest.mark.parametrize(
    ("admission", "disk_admission"),
    [("always", "second-hit"), ("second-hit", "second-hit"), ("second-hit", "always"),
     ("always", "auto")],
)  # fmt: skip
async def test_live_and_simulated_two_tiers_agree_exactly(
    origin, start_proxy, client, tmp_path, admission, disk_admission
):
    """The memory tier in front of a disk tier that evicts whole regions: the live proxy's
    counters of both tiers are the ones ``simulate --disk-size`` predicts, given the length
    the live encoder gives each record (which decides where regions end)."""
    sizes = SizeSpec.parse("lognormal:median=2KiB,sigma=1,max=32KiB")
    spec = WorkloadSpec(objects=300, requests=1500, one_hit_share=0.3, sizes=sizes, seed=5)
    trace = generate(spec)
    trace = Trace(np.zeros(len(trace)), trace.ids, trace.sizes)
    serve_trace(origin, trace)
    capacity = max(64 << 10, round(trace.distinct_bytes() * 0.05))
    proxy = await start_proxy(
        **two_tiers(capacity, tmp_path), admission__policy=admission, disk__policy=disk_admission
    )
    record_length = await live_record_length(proxy)
    prefix = await replay(client, proxy, trace)
    live, disk = proxy.proxy.engine.stats(), proxy.proxy.disk.stats()
    sim = simulated_like(proxy, trace, capacity, prefix, record_length)
    assert {k: live[k] for k in COUNTERS} == {k: sim[k] for k in COUNTERS}
    assert {k: disk[k] for k in DISK_COUNTERS} == {k: sim[f"disk_{k}"] for k in DISK_COUNTERS}
    assert disk["hits"] > 0 and live["evictions"] > 0 and disk["evicted_objects"] > 0
    assert disk["evicted_objects"] == sim["disk_evicted_objects"]


@pytest.mark.parametrize(("admission", "ruled"), [("always", False), ("second-hit", False),
                                                 ("second-hit", True)])  # fmt: skip
async def test_live_and_simulated_two_tiers_agree_with_ttls(
    origin, start_proxy, client, tmp_path, admission, ruled
):
    """Responses that expire, in memory and on disk: what the live proxy does with a stale
    copy in either tier (fetched again, both tiers replaced) is what ``simulate_tiers``
    counts, with the disk evicting regions as it goes."""
    ttl = 2.0
    sizes = SizeSpec.parse("lognormal:median=2KiB,sigma=1,max=32KiB")
    spec = WorkloadSpec(objects=200, requests=1500, one_hit_share=0.3, sizes=sizes, rate=60.0,
                        seed=7)  # fmt: skip
    trace = generate(spec)  # 25 s of requests: each object outlives its ttl many times
    serve_trace(origin, trace, max_age=ttl)
    now = [0.0]
    capacity = max(64 << 10, round(trace.distinct_bytes() * 0.05))
    rules = [{"path": "/obj/1", "max": "1s"}, {"path": "/obj/", "min": "5s"}] if ruled else []
    proxy = await start_proxy(
        clock=lambda: now[0], **two_tiers(capacity, tmp_path), admission__policy=admission,
        disk__policy="second-hit", ttl=rules,
    )  # fmt: skip
    record_length = await live_record_length(proxy)
    prefix = await replay(client, proxy, trace, clock=now)
    live, disk = proxy.proxy.engine.stats(), proxy.proxy.disk.stats()
    sim = simulated_like(proxy, trace, capacity, prefix, record_length, ttl=ttl, ruled=ruled)
    assert {k: live[k] for k in COUNTERS} == {k: sim[k] for k in COUNTERS}
    assert {k: disk[k] for k in DISK_COUNTERS} == {k: sim[f"disk_{k}"] for k in DISK_COUNTERS}
    assert disk["hits"] > 0 and disk["dropped"] > 0  # records answered, and replaced once stale
    forever = simulated_like(proxy, trace, capacity, prefix, record_length)
    assert live["hits"] < forever["hits"], "responses expired, and cost hits"
    if ruled:
        unruled = simulated_like(proxy, trace, capacity, prefix, record_length, ttl=ttl)
        assert live["hits"] != unruled["hits"], "the rules changed what was fresh"


async def test_the_tuner_chooses_live_as_in_the_simulator_and_the_counters_agree(
    origin, start_proxy, client
):
    """``[cache] eviction = "auto"``: the live proxy's tuner, fed the same requests, makes
    the simulator's choices at the same sampled requests, and takes each before the next
    request as the simulator does: every counter agrees."""
    objects, gap = 600, 20
    ids = np.concatenate([np.tile(np.arange(s, s + gap), 2) for s in range(0, objects, gap)])
    sizes = np.full(len(ids), 1000, dtype=np.int64)
    trace = Trace(np.arange(len(ids)) / 1000, ids, sizes)  # each object twice, close together
    serve_trace(origin, trace)
    now = [0.0]
    capacity = 512 * 1024
    tune = {"evictions": "lru,s3fifo", "admissions": "second-hit,always", "sample": 1.0,
            "period": 100, "warmup": 1, "patience": 2}  # fmt: skip
    proxy = await start_proxy(
        clock=lambda: now[0], cache__size=str(capacity), cache__max_object_size=str(capacity),
        cache__eviction="auto", admission__policy="second-hit",
        **{f"tune__{k}": v for k, v in tune.items()},
    )  # fmt: skip
    prefix = await replay(client, proxy, trace, clock=now)
    async with client.get(admin(proxy) + "/stats") as r:
        live = (await r.json())["tune"]
    sim = simulate(trace, capacity, proxy.config.admission_config(), key_prefix=prefix,
                   eviction="auto", tune=proxy.config.tune_settings())  # fmt: skip
    assert live["decisions"] == sim.tuning["decisions"] and live["decisions"]
    assert live["running"] == live["choice"] == sim.tuning["choice"]
    assert live["choice"]["admission"] == "always"  # the known best on this trace
    counters = proxy.proxy.engine.stats()
    assert {k: counters[k] for k in COUNTERS} == {k: sim.stats[k] for k in COUNTERS}
