"""The live what-if (proxy/core/whatif.py): ghost caches of the configured policy and its
alternatives at 0.25x to 4x the size, fed a sample of the requests, shown on /stats and
/metrics; each curve is what the simulator says of the same requests."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
from aiohttp import web
from conftest import admin, base, serve_trace

from loadgen.sim.simulate import sample_trace, simulate
from loadgen.sim.tiers import DiskSpec, simulate_tiers
from loadgen.traces.trace import Trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.config.settings import ConfigError, load
from proxy.core._native import hash64, sample_point
from proxy.core.admission import AdmissionConfig
from proxy.core.store import ENTRY_OVERHEAD
from proxy.core.whatif import (
    DiskGhosts,
    DiskShape,
    MemoryShape,
    Sample,
    Samples,
    WhatIf,
    merged_curves,
)
from proxy.ops.machine_admin import MachineGhosts
from proxy.ops.workers import SAMPLE_BATCHES, MachineSamples

SIZES = SizeSpec.parse("lognormal:median=2KiB,sigma=1,max=32KiB")


@pytest.fixture(scope="module")
def trace() -> Trace:
    spec = WorkloadSpec(objects=3_000, requests=20_000, one_hit_share=0.3, sizes=SIZES, seed=4)
    return generate(spec)


async def replayed(client, proxy, trace: Trace) -> str:
    """Ask ``proxy`` for each request of ``trace`` in turn; the prefix of its keys."""
    prefix = base(proxy) + "/obj/"
    for key in trace.key_strings():
        async with client.get(prefix + key) as r:
            assert r.status == 200
            await r.read()
    return prefix


def test_a_sampled_what_if_is_the_simulator_on_the_same_sample(trace):
    """Fed the requests one by one, each ghost gives exactly what ``simulate --sample`` gives
    for that size and policy: the same keys sampled, the same loop, the same correction."""
    size = round(trace.distinct_bytes() * 0.05)
    second_hit = AdmissionConfig(policy="second-hit")
    whatif = WhatIf(MemoryShape(size, second_hit, entry_overhead=ENTRY_OVERHEAD), rate=0.2)
    for key, body, now in zip(trace.key_strings(), trace.sizes.tolist(), trace.times.tolist(),
                              strict=True):  # fmt: skip
        whatif.record(key, body, now, missed=True)
    sample = sample_trace(trace, 0.2)
    for curve in whatif.curves(hits=0):
        config = second_hit if curve["policy"] == "second-hit" else (
            AdmissionConfig(policy=curve["policy"]))  # fmt: skip
        offline = simulate(sample, curve["size"], config)
        assert curve["miss_ratio"] == pytest.approx(1 - offline.stats["hit_ratio"])
        assert curve["bytes_written"] == pytest.approx(offline.stats["bytes_written"], rel=1e-3)
    assert {c["scale"] for c in whatif.curves(hits=0)} == {0.25, 0.5, 1.0, 2.0, 4.0}


def test_a_ghost_whose_sampled_cache_holds_a_handful_of_objects_says_so(trace):
    """At 1% of a 30% cache a ghost holds a few objects, and its estimate is noise: its
    curve says so (it did not), with the sample that would hold enough, which then does; at
    half of it the ghosts hold enough, and say nothing."""
    from proxy.core.tuning import MIN_SAMPLED_OBJECTS

    def curves_at(rate: float, share: float) -> list[dict]:
        size = round(trace.distinct_bytes() * share)
        whatif = WhatIf(MemoryShape(size, AdmissionConfig(policy="always"),
                                    entry_overhead=ENTRY_OVERHEAD), rate=rate)  # fmt: skip
        for key, body, now in zip(trace.key_strings(), trace.sizes.tolist(),
                                  trace.times.tolist(), strict=True):  # fmt: skip
            whatif.record(key, body, now, missed=True)
        return [c for c in whatif.curves(hits=0) if c["scale"] == 1.0]

    for rate, share, warned in ((0.01, 0.3, True), (0.5, 0.3, False)):
        curves = curves_at(rate, share)
        assert all(("warning" in c) == warned for c in curves), (rate, curves)
    said = [c["warning"] for c in curves_at(0.01, 0.3)]
    assert all(f"fewer than {MIN_SAMPLED_OBJECTS}" in w for w in said)
    enough = max(float(w.split("raise [whatif] sample to ")[1].split(" ")[0]) for w in said)
    assert 0.01 < enough < 1
    assert not any("warning" in c for c in curves_at(enough, 0.3))


async def test_a_proxy_shows_each_ghosts_curve_as_the_simulator_predicts_it(
    origin, start_proxy, client, trace
):
    """A trace replayed live (hits answered by the compiled path too), every key sampled: every
    memory curve on /stats is an offline simulate of the same requests, at its size and
    policy, exactly; /metrics names each."""
    short = Trace(np.zeros(6_000), trace.ids[:6_000], trace.sizes[:6_000])
    serve_trace(origin, short)
    capacity = round(short.distinct_bytes() * 0.1)
    proxy = await start_proxy(cache__size=str(capacity), cache__max_object_size=str(capacity),
                              admission__policy="second-hit", whatif__sample="1")  # fmt: skip
    prefix = await replayed(client, proxy, short)
    assert proxy.proxy.fast_hits > 0, "the compiled hit path fed the what-if too"
    async with client.get(admin(proxy) + "/stats") as r:
        whatif = (await r.json())["whatif"]
    assert whatif["sample"] == 1.0
    config = proxy.config.admission_config()
    for curve in whatif["curves"]:
        admission = config if curve["policy"] == "second-hit" else (
            AdmissionConfig(policy=curve["policy"]))  # fmt: skip
        offline = simulate(short, curve["size"], admission, key_prefix=prefix)
        assert curve["miss_ratio"] == pytest.approx(1 - offline.stats["hit_ratio"], abs=1e-9), curve
    live = proxy.proxy.engine.stats()
    [own] = [c for c in whatif["curves"] if c["policy"] == "second-hit" and c["scale"] == 1.0]
    assert own["miss_ratio"] == pytest.approx(1 - live["hit_ratio"], abs=0.01)
    async with client.get(admin(proxy) + "/metrics") as r:
        text = await r.text()
    assert 'onehit_whatif_miss_ratio{tier="memory",policy="tinylfu",scale="0.25"}' in text


async def test_a_proxys_disk_curves_are_the_two_tier_simulator_on_the_same_requests(
    origin, start_proxy, client, trace, tmp_path
):
    """With a disk tier, every key sampled: each disk curve on /stats (the configured memory
    tier in front of each disk rule at each scale) is what the two-tier simulator gives for
    the same requests, the same sizes and records, exactly."""
    short = Trace(np.zeros(6_000), trace.ids[:6_000], trace.sizes[:6_000])
    serve_trace(origin, short)
    memory, region = round(short.distinct_bytes() * 0.01), 64 << 10
    proxy = await start_proxy(cache__size=str(memory), disk__path=str(tmp_path / "disk"),
                              disk__size=str(32 * region), disk__region_size=str(region),
                              admission__policy="always", whatif__sample="1")  # fmt: skip
    prefix = await replayed(client, proxy, short)
    async with client.get(admin(proxy) + "/stats") as r:
        curves = [c for c in (await r.json())["whatif"]["curves"] if c["tier"] == "disk"]
    disk = proxy.config.disk
    assert {c["policy"] for c in curves} == {disk.policy, "always", "nth-hit:3",
                                             "probabilistic:0.1"}  # fmt: skip
    for curve in curves:
        admission = AdmissionConfig(policy=curve["policy"], **(
            {"window": disk.window} if curve["policy"] == disk.policy else {}))  # fmt: skip
        offline = simulate_tiers(short, memory, AdmissionConfig(policy="always"),
                                 DiskSpec(curve["size"], region, admission),
                                 key_prefix=prefix)  # fmt: skip
        assert curve["miss_ratio"] == pytest.approx(1 - offline.stats["hit_ratio"], abs=1e-9), curve
        assert curve["bytes_written"] == offline.stats["disk_bytes_written"], curve


async def test_no_what_if_when_its_sample_is_zero(start_proxy, client):
    proxy = await start_proxy(whatif__sample="0")
    async with client.get(admin(proxy) + "/stats") as r:
        assert (await r.json())["whatif"] is None


@pytest.mark.parametrize(("key", "value", "message"), [
    ("whatif.sample", "2", r"\[whatif\] sample = '2': expected a sampling rate"),
    ("whatif.policies", "lfu", r"\[whatif\] policies .*'lfu'"),
    ("whatif.policies", "probabilistic:\n0.1", "is not a policy name"),
    ("disk.region_size", "8GiB", r"\[disk\] region_size = 8589934592: at most"),
])  # fmt: skip
def test_a_bad_what_if_setting_names_its_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        load(env={}, overrides={"upstream.origin": "http://127.0.0.1:9", key: value})


def test_ghosts_begun_after_a_reload_count_only_the_hits_since(trace):
    """The cache's hits before the ghosts began are not theirs: a what-if started at 1,000
    hits reads as one that began with the cache."""
    size = round(trace.distinct_bytes() * 0.05)
    fresh, later = (
        WhatIf(MemoryShape(size, AdmissionConfig(policy="always")), rate=0.5) for _ in range(2)
    )
    later.start(hits=1_000)
    for key, body, now in zip(trace.key_strings()[:3_000], trace.sizes.tolist(),
                              trace.times.tolist(), strict=False):  # fmt: skip
        fresh.record(key, body, now, missed=True)
        later.record(key, body, now, missed=True)
    assert later.curves(hits=1_000) == fresh.curves(hits=0)


def test_workers_memory_curves_merge_into_the_machines_and_their_disk_curves_do_not():
    """Under --workers each keeps a private memory tier and its own ghosts: the machine's curve
    at a policy and scale is their miss ratios weighted by what each sampled, the sizes and
    bytes written summed; a worker that sampled nothing adds its size only; disk curves are
    not summed into anything (the machine's are the parent's own ``DiskGhosts``)."""

    def curve(tier, policy, ratio, sampled, size=100, written=10):
        return {"tier": tier, "policy": policy, "scale": 1.0, "size": size,
                "miss_ratio": ratio, "bytes_written": written, "sampled": sampled}  # fmt: skip

    first = [curve("memory", "always", 0.5, 300), curve("disk", "always", 0.1, 300)]
    second = [curve("memory", "always", 0.2, 100), curve("memory", "lru", None, 0)]
    third = [curve("memory", "always", None, 0)]
    merged = {c["policy"]: c for c in merged_curves([first, second, third])}
    assert merged["always"] == curve("memory", "always", (0.5 * 300 + 0.2 * 100) / 400, 400,
                                     size=300, written=30)  # fmt: skip
    assert merged["lru"] == curve("memory", "lru", None, 0)
    assert all(c["tier"] == "memory" for c in merged.values())


def test_a_ghost_that_has_seen_no_request_has_no_miss_ratio():
    whatif = WhatIf(MemoryShape(1 << 20, AdmissionConfig(policy="always")), rate=1e-9)
    for i in range(30):
        whatif.record(f"/k{i}", 100, float(i), missed=True)
    assert {c["miss_ratio"] for c in whatif.curves(hits=0)} == {None}


def test_a_disk_ghost_takes_the_large_objects_the_disk_takes():
    """A 1% sample of a disk in 16 MiB regions: its ghosts' regions hold a 400 KB record, as
    the disk's do, instead of refusing every one as too large."""
    disk = DiskShape(8 << 30, 16 << 20, AdmissionConfig(policy="always"))
    whatif = WhatIf(MemoryShape(64 << 20, AdmissionConfig(policy="always")), rate=0.01, disk=disk)
    for i in range(20_000):
        whatif.record(f"/big{i % 5_000}", 400_000, float(i), missed=True)
    whatif.curves(hits=0)  # replays what is buffered
    assert whatif.disk is not None
    ghosts = whatif.disk.ghosts
    assert ghosts and all(g.disk.counters.too_large == 0 for g in ghosts)
    assert all(g.disk.counters.bytes_written > 0 for g in ghosts if g.policy == "always")


async def test_a_reload_that_changes_the_ghosts_starts_them_afresh(origin, tmp_path, client):
    """A reload naming other alternatives: the ghosts are the new ones, fed from then on (the
    hits before are not theirs), and the compiled hit path feeds the new ones."""
    from proxy.ops.service import Service

    path = tmp_path / "proxy.toml"
    path.write_text('[whatif]\nsample = 1\npolicies = ["always"]\n')
    flags = {"upstream.origin": origin.url, "server.listen": "127.0.0.1:0",
             "admin.listen": "127.0.0.1:0", "server.access_log": False}  # fmt: skip

    def read():
        return load(path, env={}, overrides=flags)

    service = await Service.start(read(), read_config=read)
    try:
        for _ in range(3):
            for i in range(20):
                async with client.get(base(service) + f"/k{i}", headers={"Host": "a"}) as r:
                    await r.read()
        path.write_text('[whatif]\nsample = 1\npolicies = ["tinylfu"]\n')
        assert (await service.reload()).changed == ("whatif.policies",)
        for i in range(20):  # hits of what the cache holds, now
            async with client.get(base(service) + f"/k{i}", headers={"Host": "a"}) as r:
                await r.read()
        async with client.get(admin(service) + "/stats") as r:
            curves = (await r.json())["whatif"]["curves"]
    finally:
        await service.stop()
    assert {c["policy"] for c in curves} == {"second-hit", "tinylfu"}
    fed = service.proxy.engine.whatif.ghosts[0].engine.counters.requests
    assert fed == 20  # the 20 requests since the reload, hits of the compiled path among them


def sampled(keys: list[str], start: float) -> Sample:
    """The requests for ``keys``, a second apart from ``start``, of 1,000-byte bodies."""
    hashes = [hash64(key) for key in keys]
    return Sample(np.arange(start, start + len(keys), dtype=np.float64),
                  np.array([h[0] for h in hashes], np.uint64),
                  np.array([h[1] for h in hashes], np.uint64),
                  np.array([len(k) for k in keys], np.int64),
                  np.full(len(keys), 1_000, np.int64))  # fmt: skip


def test_a_machines_disk_ghosts_keep_each_workers_memory_tier_and_share_the_disk():
    """Under --workers one disk is behind every worker's private memory tier: what one worker
    wrote is a disk hit through the other, which holds it in its own memory once that
    memory's admission and promotion filter take it (its second disk hit there); a worker's
    memory ghost never answers for another's. A batch that arrives late is replayed at the
    latest time seen, never earlier."""
    memory = MemoryShape(1 << 20, AdmissionConfig(policy="second-hit"))
    disk = DiskShape(64 << 20, 1 << 20, AdmissionConfig(policy="always"))
    ghosts = DiskGhosts(disk, memory, rate=1.0, scales=(1.0,), alternatives=())
    ghosts.feed(0, sampled(["/a", "/b"], 10.0), requests=2)
    ghosts.feed(1, sampled(["/a", "/b"], 5.0), requests=2)
    ghosts.feed(1, sampled(["/a"], 20.0), requests=1)
    [curve] = ghosts.curves()
    assert (curve["tier"], curve["sampled"], curve["miss_ratio"]) == ("disk", 5, 2 / 5)
    first, second = (ghosts.ghosts[0].fronts[place].counters for place in (0, 1))
    assert (first.requests, first.hits) == (2, 0)
    assert (second.requests, second.hits, second.hits_from_disk, second.promoted) == (3, 3, 3, 1)
    assert ghosts.latest == 20.0


def test_a_replaced_workers_memory_ghost_begins_afresh_and_other_rates_are_left_out(tmp_path):
    """The parent's ghosts of the shared disk: a batch from another process in a worker's
    place (the worker replaced) meets an empty memory ghost, what the old one counted kept;
    a batch sampled at another rate (a worker not reloaded yet) is left out, count and all."""
    settings = {"upstream.origin": "http://127.0.0.1:9", "disk.path": str(tmp_path),
                "disk.size": "64MiB", "disk.region_size": "1MiB", "whatif.sample": "1",
                "disk.policy": "always"}  # fmt: skip
    config = load(env={}, overrides=settings)
    machine = MachineGhosts(lambda: config, {})
    assert machine.feed(Samples(0, 100, 1.0, sampled(["/a"], 1.0), 1)) == 1
    assert machine.feed(Samples(0, 100, 1.0, sampled(["/a"], 2.0), 1)) == 1
    assert machine.feed(Samples(0, 101, 1.0, sampled(["/a"], 3.0), 1)) == 1
    assert machine.feed(Samples(1, 102, 0.5, sampled(["/a"], 4.0), 1)) == 0
    ghosts = machine.current()
    assert ghosts is not None
    [always] = [g for g in ghosts.ghosts if g.policy == "always" and g.scale == 1.0]
    assert always.fronts[0].counters.hits_from_disk == 1  # the new process's memory was empty
    assert always.counted() == (2, 3) and ghosts.requests == 3


async def test_a_worker_waits_a_bounded_time_for_a_parent_that_does_not_answer():
    """A worker's /stats waits for its samples to reach the parent, but a stalled parent
    (here one that never answers) must not stall it: ``sent(within=...)`` returns on time,
    and the sending goes on (a later answer still delivers the batch)."""
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.json_response({"fed": 1})

    app = web.Application()
    app.router.add_post("/whatif", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    samples = MachineSamples(f"http://127.0.0.1:{port}", 0, "", "s3cret")
    try:
        samples(sampled(["/a"], 1.0), 1, 1.0)
        await asyncio.wait_for(arrived.wait(), 5)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await samples.sent(within=0.2)
        assert loop.time() - began < 2 and samples.sending is not None
        assert not samples.sending.done()
        release.set()
        await samples.sent(within=5)
        assert samples.sending.done() and not samples.pending
    finally:
        release.set()
        await samples.close()
        await runner.cleanup()


def test_the_parents_disk_ghosts_follow_a_reload_and_count_what_they_leave_out(tmp_path):
    """A reload that changes what the ghosts are built of builds them afresh; a batch at
    another rate is left out and counted; a machine whose shared tier stands for memory (no
    disk) has no disk ghosts at all."""
    settings = {"upstream.origin": "http://127.0.0.1:9", "disk.path": str(tmp_path),
                "disk.size": "64MiB", "disk.region_size": "1MiB", "whatif.sample": "1"}  # fmt: skip
    held = {"config": load(env={}, overrides=settings)}
    machine = MachineGhosts(lambda: held["config"], {})
    assert machine.feed(Samples(0, 100, 1.0, sampled(["/a", "/b"], 1.0), 2)) == 2
    first = machine.current()
    assert first is not None and first.requests == 2
    held["config"] = load(env={}, overrides={**settings, "whatif.disk_policies": "always"})
    assert machine.current() is not first and machine.current().requests == 0
    assert machine.feed(Samples(0, 100, 0.5, sampled(["/a"], 2.0), 1)) == 0
    assert machine.left_out == 1
    diskless = load(
        env={}, overrides={"upstream.origin": "http://127.0.0.1:9", "whatif.sample": "1"}
    )
    none = MachineGhosts(lambda: diskless, {})
    assert none.current() is None and none.feed(Samples(0, 1, 1.0, sampled(["/a"], 1.0), 1)) == 0


def test_a_batch_replayed_late_never_runs_time_backwards():
    """Batches of several workers arrive each whole: one whose times began before the latest
    replayed, or that goes back within itself, is replayed from that latest time on."""
    memory = MemoryShape(1 << 20, AdmissionConfig(policy="always"))
    disk = DiskShape(64 << 20, 1 << 20, AdmissionConfig(policy="always"))
    ghosts = DiskGhosts(disk, memory, rate=1.0, scales=(1.0,), alternatives=())
    batch = sampled(["/a", "/b"], 10.0)
    ghosts.feed(0, batch._replace(times=np.array([10.0, 5.0])), requests=2)
    assert ghosts.latest == 10.0
    ghosts.feed(1, sampled(["/c"], 3.0), requests=1)
    assert ghosts.latest == 10.0


async def test_a_worker_drops_batches_its_parent_does_not_take_and_counts_them():
    """At most ``SAMPLE_BATCHES`` wait for the parent; past that each is dropped and counted,
    and so is each the parent refuses."""
    app = web.Application()

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({}, status=400)

    app.router.add_post("/whatif", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    samples = MachineSamples(f"http://127.0.0.1:{runner.addresses[0][1]}", 0, "", "s3cret")
    try:
        for i in range(SAMPLE_BATCHES + 4):
            samples(sampled([f"/k{i}"], float(i)), 1, 1.0)
        assert samples.dropped == 4
        await samples.sent(within=10)
        assert samples.dropped == SAMPLE_BATCHES + 4 and not samples.pending
    finally:
        await samples.close()
        await runner.cleanup()


def test_the_sample_is_keyed_so_urls_chosen_by_their_hash_are_not_all_in_it():
    """Unkeyed (the offline simulator's), a key is sampled when its hash is below the bound:
    URLs chosen for a low hash would all be in the sample. Keyed with a secret, the same URLs
    are in it at the sample's rate, as any others."""
    below = 2**64 // 10
    chosen = [k for k in (f"/x{i}" for i in range(20_000)) if hash64(k)[0] < below][:1000]
    assert all(sample_point(hash64(k)[0], 0) < below for k in chosen)
    sampled = sum(sample_point(hash64(k)[0], 0x5EC2E7 | 1) < below for k in chosen)
    assert 50 < sampled < 160  # about 10% of them, as of any 1,000 URLs


async def test_the_compiled_hit_path_samples_the_keys_the_python_rule_samples(
    origin, start_proxy, client
):
    """Hits answered by the compiled path and by Python are recorded for the same keys: those
    the what-if's keyed rule (``sample_point``) puts in the sample, and no others."""
    proxy = await start_proxy(admission__policy="always", whatif__sample="0.5")
    whatif = proxy.proxy.engine.whatif
    assert whatif.sample_key == proxy.proxy.sample_key != 0
    assert proxy.proxy.engine.admission.native.sample_key == proxy.proxy.sample_key
    keys = [f"/k{i}" for i in range(60)]
    for _ in range(3):  # a miss, then hits (on the compiled path)
        for key in keys:
            async with client.get(base(proxy) + key, headers={"Host": "example.test"}) as r:
                await r.read()
    assert proxy.proxy.fast_hits > 0
    recorded = Counter(h1 for _, h1, *_ in whatif._buffer)
    wanted = {h1 for h1 in (hash64(f"http://example.test{key}")[0] for key in keys)
              if sample_point(h1, whatif.sample_key) < whatif.below}  # fmt: skip
    assert recorded == dict.fromkeys(wanted, 3) and 10 < len(wanted) < 50  # a miss, two hits
