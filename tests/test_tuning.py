"""The tuner: its hysteresis (a pure judgement of hits per period), and its choices on
synthetic traces whose best configuration the test measures first, through the simulator."""

import asyncio
import logging
import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import admin, base, serve_trace

from loadgen.sim.simulate import simulate
from loadgen.traces.trace import Trace
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig
from proxy.core.tuning import MIN_SAMPLED_OBJECTS, SIZING, Choice, Tuner, TuneSettings, Tuning

CHOICES = (Choice("lru", "second-hit"), Choice("s3fifo", "second-hit"), Choice("sieve", "always"))
HELD = np.full(3, 10 * MIN_SAMPLED_OBJECTS)


def judged(tuner: Tuner, periods: list[list[int]], requests: int = 10_000) -> list[int | None]:
    return [tuner.judge(np.array(hits), requests, HELD) for hits in periods]


def test_no_choice_is_made_while_the_ghosts_warm_up():
    tuner = Tuner(CHOICES, TuneSettings(warmup=3, patience=1))
    assert judged(tuner, [[0, 9000, 0]] * 3) == [None] * 3
    assert "warming up" in tuner.said
    assert judged(tuner, [[0, 9000, 0]]) == [1]


def test_a_leader_is_chosen_after_leading_by_the_margin_patience_times_in_a_row():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=3, margin=0.01))
    assert judged(tuner, [[5000, 5000, 5000]]) == [None]  # warm-up
    assert judged(tuner, [[5000, 5300, 5000]] * 3) == [None, None, 1]
    assert tuner.current == 1 and "chose second-hit / s3fifo" in tuner.said
    # Now the current choice: it stays while it leads, whatever the others do.
    assert judged(tuner, [[5000, 5300, 5000]] * 5) == [None] * 5


def test_a_candidate_within_the_margin_is_never_chosen():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=1, margin=0.01))
    # 0.9 points ahead of the current choice, period after period: within the margin.
    assert judged(tuner, [[5000, 5090, 5000]] * 20) == [None] * 20
    assert tuner.current == 0 and "keeps second-hit / lru" in tuner.said


def test_two_leaders_that_trade_places_never_make_it_switch():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=2, margin=0.001))
    # Both well ahead of the current choice, equal on average, each leading in turn.
    trading = [[5000, 9000, 5500], [5000, 5500, 9000]] * 10
    assert judged(tuner, trading) == [None] * 20  # each leads once in a row, never twice
    assert "leads (1 of 2)" in tuner.said
    assert tuner.current == 0


def test_it_never_switches_to_a_candidate_worse_than_its_choice_on_the_evidence():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=1, margin=0.0))
    assert judged(tuner, [[6000, 5999, 4000]] * 10) == [None] * 10
    assert tuner.current == 0


def test_old_evidence_fades_so_a_changed_workload_changes_the_choice():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=2, margin=0.01))
    assert judged(tuner, [[5000, 6000, 5000]] * 3) == [None, None, 1]
    # The workload turns: the third candidate wins every period from now on.
    made = judged(tuner, [[5000, 5000, 7000]] * 4)
    assert made[0] is None and 2 in made and tuner.current == 2


def test_a_ghost_too_small_to_tell_holds_the_choice_and_says_to_sample_more():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=1))
    held = np.array([MIN_SAMPLED_OBJECTS - 1, 5000, 5000])  # the current choice's
    assert tuner.judge(np.array([0, 0, 0]), 1000, held) is None
    assert tuner.judge(np.array([0, 900, 0]), 1000, held) is None
    assert "raise [tune] sample" in tuner.said and tuner.current == 0


def test_a_candidate_whose_ghost_holds_too_few_objects_is_left_out_not_the_others():
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=1))
    held = np.array([5000, 5000, MIN_SAMPLED_OBJECTS - 1])  # the third's: out of the running
    assert tuner.judge(np.array([0, 0, 0]), 10_000, held) is None
    assert tuner.judge(np.array([5000, 6000, 9000]), 10_000, held) == 1
    assert "chose second-hit / s3fifo" in tuner.said


@pytest.mark.parametrize(
    ("bad", "said"),
    [({"sample": 0}, "sample is in"), ({"sample": 1.5}, "sample is in"),
     ({"period": 10}, "period is 100"), ({"warmup": 0}, "warmup is 1"),
     ({"patience": 0}, "patience is 1"), ({"margin": 1}, "margin is in"),
     ({"evictions": ()}, "evictions: the tuner needs one"),
     ({"evictions": ("fifo",)}, "unknown eviction 'fifo'")],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_setting(bad, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        TuneSettings(**bad).choices("second-hit")


def test_settings_name_each_eviction_once_and_start_with_the_first_pair():
    settings = TuneSettings(evictions=("s3fifo:small=0.1", "s3fifo", "lru"),
                            admissions=("always", "second-hit", "always"))  # fmt: skip
    assert settings.choices("tinylfu") == (
        Choice("s3fifo", "always"), Choice("s3fifo", "second-hit"),
        Choice("lru", "always"), Choice("lru", "second-hit"),
    )  # fmt: skip
    unset = TuneSettings(evictions=("lru",))  # the configured admission first
    assert [c.admission for c in unset.choices("tinylfu")] == ["tinylfu", "second-hit", "always"]


# Traces whose best configuration is measured first, fixed, through the simulator.

SECOND_HIT = AdmissionConfig(policy="second-hit", window=3600.0)


def twice_each(objects: int = 40_000, gap: int = 50) -> Trace:
    """Every object requested twice, ``gap`` requests apart, and never again: admitting on
    the second request is too late; storing the first is a hit each."""
    ids = np.empty(2 * objects, dtype=np.int64)
    order = np.arange(objects)
    for start in range(0, objects, gap):
        block = order[start : start + gap]
        ids[2 * start : 2 * start + len(block)] = block
        ids[2 * start + len(block) : 2 * start + 2 * len(block)] = block
    return Trace(np.arange(len(ids), dtype=np.float64) / 1000, ids,
                 np.full(len(ids), 1000, dtype=np.int64))  # fmt: skip


def test_on_a_trace_where_admitting_everything_is_best_it_leaves_second_hit_for_always():
    trace = twice_each()
    tune = TuneSettings(evictions=("lru",), admissions=("second-hit", "always"), sample=0.5,
                        period=2000, warmup=1, patience=2)  # fmt: skip
    fixed = {a: simulate(trace, 2_000_000, AdmissionConfig(policy=a) if a == "always"
                         else SECOND_HIT, entry_overhead=0).stats["hit_ratio"]
             for a in ("always", "second-hit")}  # fmt: skip
    assert fixed["always"] > fixed["second-hit"] + 0.3  # the known best, measured
    tuned = simulate(trace, 2_000_000, SECOND_HIT, entry_overhead=0, eviction="auto", tune=tune)
    assert tuned.tuning["choice"] == {"eviction": "lru", "admission": "always"}
    [decision] = tuned.tuning["decisions"]
    # Chosen at the first judgement past warm-up and patience, and never again.
    assert decision["judgement"] == tune.warmup + tune.patience
    assert decision["sampled"] == tune.period * (tune.warmup + tune.patience)
    assert tuned.stats["hit_ratio"] > fixed["second-hit"] + 0.2


def scan_polluted() -> Trace:
    return generate(WorkloadSpec(objects=20_000, requests=300_000, alpha=1.0, one_hit_share=0.5,
                                 sizes=SizeSpec.parse("fixed:1KiB")))  # fmt: skip


def test_on_a_trace_where_s3fifo_beats_lru_it_chooses_s3fifo_and_stays():
    trace = scan_polluted()
    size = round(trace.distinct_bytes() * 0.02)
    always = AdmissionConfig(policy="always")
    fixed = {e: 1 - simulate(trace, size, always, entry_overhead=0, eviction=e).stats[
        "hit_ratio"] for e in ("lru", "s3fifo")}  # fmt: skip
    assert fixed["s3fifo"] < fixed["lru"] * 0.95  # the known best, measured
    tune = TuneSettings(evictions=("lru", "s3fifo"), admissions=("always",), sample=1.0,
                        period=5000)  # fmt: skip
    tuned = simulate(trace, size, always, entry_overhead=0, eviction="auto", tune=tune)
    assert tuned.tuning["choice"]["eviction"] == "s3fifo"
    assert tuned.tuning["switches"] == 1  # a stationary trace: one move, no flapping
    assert 1 - tuned.stats["hit_ratio"] < fixed["lru"]


def reused_past_the_window(cycles: int = 30, seed: int = 3) -> Trace:
    """500 keys each asked once a cycle, each followed by two of 550 hot keys and three keys
    asked once: a key comes back after about 2,500 others, past what a window sized by the
    1,100 objects a cache holds remembers (two generations of 1,100 keys), within four
    times that."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    once = 100_000
    for _ in range(cycles):
        for key in range(1000, 1500):
            ids += [key, *(int(k) for k in rng.integers(0, 550, 2)), once, once + 1, once + 2]
            once += 3
    return Trace(np.arange(len(ids), dtype=np.float64), np.array(ids, dtype=np.uint64),
                 np.full(len(ids), 1000, dtype=np.int64))  # fmt: skip


def test_on_a_trace_reused_past_the_window_it_chooses_a_longer_window():
    """The admission's window among the tuner's candidates (second-hit:x4, four times as
    long): it chooses the one that measures best here."""
    trace = reused_past_the_window()
    admissions = ("second-hit", "second-hit:x4", "always")
    fixed = {a: simulate(trace, 1_100_000, AdmissionConfig(policy=a), entry_overhead=0,
                         eviction="s3fifo").stats["hit_ratio"] for a in admissions}  # fmt: skip
    assert max(fixed, key=fixed.__getitem__) == "second-hit:x4"  # the known best, measured
    assert fixed["second-hit:x4"] > fixed["second-hit"] + 0.01
    tune = TuneSettings(evictions=("s3fifo",), admissions=admissions, sample=1.0)
    start = AdmissionConfig(policy="second-hit")  # its window the auto one, as fixed above
    tuned = simulate(trace, 1_100_000, start, entry_overhead=0, eviction="auto", tune=tune)
    assert tuned.tuning["choice"] == {"eviction": "s3fifo", "admission": "second-hit:x4"}


def test_the_tuner_refuses_a_sampled_trace():
    from loadgen.sim.simulate import sample_trace

    with pytest.raises(ValueError, match="samples the trace itself"):
        simulate(sample_trace(scan_polluted(), 0.1), 10_000, SECOND_HIT, eviction="auto")


# The live proxy: what it says of its choices.


async def test_the_live_tuner_says_what_it_chose_and_why_on_stats_metrics_and_the_log(
    origin, start_proxy, client, caplog
):
    trace = twice_each(objects=400, gap=20)
    serve_trace(origin, trace)
    proxy = await start_proxy(
        cache__size="512KiB", cache__eviction="auto", admission__policy="second-hit",
        tune__evictions=["lru"], tune__sample=1.0, tune__period=100, tune__warmup=1,
        tune__patience=1,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="onehit.proxy"):
        for key in trace.key_strings():
            async with client.get(base(proxy) + "/obj/" + key) as r:
                assert r.status == 200
                await r.read()
    async with client.get(admin(proxy) + "/stats") as r:
        tune = (await r.json())["tune"]
    assert tune["choice"] == tune["running"] == {"eviction": "lru", "admission": "always"}
    assert tune["switches"] == 1 and tune["judgements"] == len(trace) // 100
    [decision] = tune["decisions"]
    assert decision["was"] == "second-hit / lru" and decision["chose"] == "always / lru"
    assert "misses" in decision["reason"] and "keeps always / lru" in tune["said"]
    assert {c["admission"] for c in tune["candidates"]} == {"second-hit", "always"}
    assert proxy.proxy.engine.store.eviction == "lru"
    assert "tuner: the memory tier now always / lru (was second-hit / lru)" in caplog.text
    async with client.get(admin(proxy) + "/metrics") as r:
        text = await r.text()
    assert 'onehit_tune_choice{eviction="lru",admission="always"} 1' in text
    assert "onehit_tune_switches_total 1" in text
    assert re.search(r'onehit_tune_recent_miss_ratio\{eviction="lru",admission="second-hit"\} '
                     r"1\.0\b", text)  # fmt: skip


async def test_the_live_tuner_takes_an_eviction_with_every_entry_kept(origin, start_proxy, client):
    trace = scan_polluted()
    trace = Trace(trace.times[:20_000], trace.ids[:20_000], trace.sizes[:20_000])
    serve_trace(origin, trace)
    proxy = await start_proxy(
        cache__size="2MiB", cache__eviction="auto", admission__policy="always",
        tune__evictions="lru,s3fifo", tune__admissions="always", tune__sample=1.0,
        tune__period=500, tune__warmup=1, tune__patience=1, tune__margin=0.0,
    )  # fmt: skip
    store = proxy.proxy.engine.store
    changed = None
    for key in trace.key_strings():
        before = {k: store.peek(k) for k in store} if store.eviction == "lru" else None
        async with client.get(base(proxy) + "/obj/" + key) as r:
            assert r.status == 200
            await r.read()
        await asyncio.sleep(0)  # the tuner's choice is taken on the loop's next turn
        if before is not None and store.eviction != "lru":
            changed = before
            break
    assert changed is not None, "the tuner chose s3fifo within the trace"
    assert store.eviction == "s3fifo"
    kept = {k: store.peek(k) for k in store}
    # Every entry held before the request that decided it is still held, the same object,
    # but what that request itself made room for.
    assert len(set(changed) - set(kept)) <= 1
    assert all(kept[k] is changed[k] for k in set(changed) & set(kept))


def test_a_bad_tune_setting_names_its_key_and_the_fix(tmp_path):
    from proxy.config.settings import ConfigError, load

    path = tmp_path / "bad.toml"
    for body, said in [
        ('[cache]\neviction = "auto"\n[tune]\nevictions = ["s3fifo:small=3"]\n',
         "[tune] evictions = ['s3fifo:small=3']: s3fifo's small is from 0.001 to 0.99"),
        ("[tune]\nsample = 0\n", "[tune] sample = 0: expected 'auto', or a sampling rate"),
        ("[tune]\nsample = true\n", "[tune] sample = True: expected 'auto', or a sampling"),
        ("[tune]\nperiod = 10\n", "[tune] period = 10: expected 'auto', or from 100 to"),
        ("[tune]\nperiod = 1e23\n", "[tune] period = 1e+23: expected 'auto', or from 100"),
        ('[tune]\nadmissions = ["auto"]\n', "auto is a disk tier's"),
    ]:  # fmt: skip
        path.write_text('[upstream]\norigin = "http://127.0.0.1:1"\n' + body)
        with pytest.raises(ConfigError) as err:
            load(path)
        assert said in str(err.value)


def test_a_shared_admission_has_the_tuner_choose_the_eviction_alone(tmp_path):
    from proxy.config.settings import ConfigError, load

    path = tmp_path / "fleet.toml"
    head = ('[upstream]\norigin = "http://127.0.0.1:1"\n[cache]\neviction = "auto"\n'
            '[admission]\nbackend = "redis"\n')  # fmt: skip
    path.write_text(head)
    assert load(path).tune_settings().admissions == ("second-hit",)
    path.write_text(head + '[tune]\nadmissions = ["second-hit", "always"]\n')
    with pytest.raises(ConfigError, match="cannot trade away"):
        load(path)
    machine = ('[upstream]\norigin = "http://127.0.0.1:1"\n[cache]\neviction = "auto"\n'
               '[server]\nworkers = 2\n')  # fmt: skip
    path.write_text(machine)
    assert load(path).tune_settings().admissions == ("second-hit",)


def _fed(tuning, trace: Trace, start: int, stop: int) -> None:
    from loadgen.sim.simulate import key_arrays

    keys = key_arrays(trace, "")
    picked = np.arange(start, stop)
    tuning.feed(replace(keys, ids=keys.ids[picked]),
                trace.times[picked], trace.sizes[picked].astype(np.int64))  # fmt: skip


@pytest.mark.parametrize(("cache", "rate", "period"),
                         [(10_250_000, 0.2, 2000), (1_000_000, 1.0, 976)])  # fmt: skip
def test_an_auto_sample_is_chosen_from_the_sizes_of_the_first_requests(cache, rate, period):
    trace = scan_polluted()  # every object 1 KiB
    tuning = Tuning(cache, SECOND_HIT, TuneSettings(evictions=("lru", "s3fifo")))
    assert tuning.rate == 1.0 and tuning.left() == SIZING
    assert tuning.state()["sample"] is None and tuning.state()["period"] is None
    _fed(tuning, trace, 0, SIZING - 1)
    assert tuning.rate == 1.0 and tuning.left() == 1
    _fed(tuning, trace, SIZING - 1, SIZING)
    # 10,250,000 bytes hold 10,000 objects of 1 KiB (and a byte): ghosts of 2,000 are a 0.2
    # sample, judged every 2,000 sampled requests. A cache of fewer objects than that (976)
    # is modelled whole, its ghosts going on, judged as often as it holds objects.
    assert tuning.rate == rate == tuning.state()["sample"]
    assert tuning.period == tuning.state()["period"] == period
    assert tuning.sampled == (0 if rate < 1 else SIZING)
    assert tuning.ghosts[0].counters.requests == (0 if rate < 1 else SIZING)


async def test_the_live_tuner_chooses_its_sample_and_the_compiled_path_follows(
    origin, start_proxy, client
):
    trace = scan_polluted()
    trace = Trace(trace.times[:3000], trace.ids[:3000], trace.sizes[:3000])
    serve_trace(origin, trace)
    proxy = await start_proxy(cache__size="16MiB", cache__eviction="auto",
                              tune__evictions="lru,s3fifo")  # fmt: skip
    whatif = proxy.proxy.engine.whatif
    assert proxy.proxy.plain_hits.sample_below == whatif.below == 2**64 - 1  # every request
    for key in trace.key_strings():
        async with client.get(base(proxy) + "/obj/" + key) as r:
            assert r.status == 200
            await r.read()
    await asyncio.sleep(0)
    assert whatif.tuning.rate < 1.0 and whatif.below < 2**64 - 1
    assert proxy.proxy.plain_hits.sample_below == whatif.below


async def test_a_reload_of_tune_starts_the_tuner_afresh_and_one_of_whatif_alone_keeps_it(
    origin, tmp_path, client
):
    from proxy.config.settings import load
    from proxy.ops.service import Service

    trace = twice_each(objects=300, gap=20)
    serve_trace(origin, trace)
    path = tmp_path / "proxy.toml"
    head = ('[cache]\nsize = "512KiB"\neviction = "auto"\n[tune]\nevictions = ["lru", "sieve"]\n'
            'sample = 1.0\nperiod = 100\n')  # fmt: skip
    path.write_text(head)
    flags = {"upstream.origin": origin.url, "server.listen": "127.0.0.1:0",
             "admin.listen": "127.0.0.1:0", "server.access_log": False}  # fmt: skip
    service = await Service.start(
        load(path, env={}, overrides=flags), read_config=lambda: load(path, env={}, overrides=flags)
    )
    try:
        for key in trace.key_strings():
            async with client.get(base(service) + "/obj/" + key) as r:
                await r.read()
        await asyncio.sleep(0)
        engine = service.proxy.engine
        tuning = engine.whatif.tuning
        assert tuning.choice.admission == "always" == engine.admission.name
        path.write_text(head + "[whatif]\nsample = 0.5\n")  # the what-if's alone
        async with client.post(admin(service) + "/reload", json={}) as r:
            assert r.status == 200 and (await r.json())["changed"] == ["whatif.sample"]
        assert engine.whatif.tuning is tuning and engine.admission.name == "always"
        assert engine.whatif.rate == 0.5
        path.write_text(head.replace("period = 100", "period = 200") + "[whatif]\nsample = 0.5\n")
        async with client.post(admin(service) + "/reload", json={}) as r:
            assert r.status == 200 and (await r.json())["changed"] == ["tune.period"]
        fresh = engine.whatif.tuning
        assert fresh is not tuning and fresh.tuner.judgements == 0
        # The memory tier takes the new tuner's first pair at once, every entry kept.
        assert (engine.store.eviction, engine.admission.name) == ("lru", "second-hit")
        assert service.proxy.running == fresh.choice and len(engine.store) > 0
    finally:
        await service.stop()


async def test_with_the_whatif_off_the_tuner_records_alone_and_stats_say_so(
    origin, start_proxy, client
):
    trace = twice_each(objects=300, gap=20)
    serve_trace(origin, trace)
    proxy = await start_proxy(
        cache__size="512KiB", cache__eviction="auto", whatif__sample=0, tune__evictions="lru",
        tune__sample=1.0, tune__period=100,
    )  # fmt: skip
    for key in trace.key_strings():
        async with client.get(base(proxy) + "/obj/" + key) as r:
            await r.read()
    async with client.get(admin(proxy) + "/stats") as r:
        stats = await r.json()
    assert stats["whatif"] is None  # no ghost of the what-if's, nothing it reports
    assert stats["tune"]["judgements"] == len(trace) // 100 and stats["tune"]["switches"] == 1


async def test_a_memory_eviction_that_keeps_small_bodies_never_caps_what_the_disk_keeps(
    origin, start_proxy, client, tmp_path
):
    """S3-FIFO keeps nothing larger than its small queue in memory (here 1% of 8 MiB): a
    larger body goes to the disk behind it, as it would under LRU, and is answered there."""
    body = b"d" * (1 << 20)
    origin.set("/large", body=body)
    proxy = await start_proxy(
        cache__size="8MiB", cache__eviction="s3fifo:small=0.01", admission__policy="always",
        disk__path=str(tmp_path / "disk"), disk__size="64MiB", disk__region_size="4MiB",
        disk__policy="always",
    )  # fmt: skip
    engine = proxy.proxy.engine
    assert engine.store.max_object_bytes < len(body) < engine.max_object_bytes
    for _ in range(3):
        async with client.get(base(proxy) + "/large") as r:
            assert await r.read() == body
    assert origin.hits["/large"] == 1  # the disk answered the others
    assert engine.counters.beyond_memory == 1


def test_one_huge_body_among_the_first_requests_does_not_choose_the_sample():
    trace = scan_polluted()  # every object 1 KiB
    sizes = trace.sizes.copy()
    sizes[5] = 8 << 30  # one body the cache would never keep
    lied = Trace(trace.times, trace.ids, sizes)
    chosen = []
    for t in (trace, lied):
        tuning = Tuning(10_250_000, SECOND_HIT, TuneSettings(evictions=("lru",)), 1 << 20)
        _fed(tuning, t, 0, SIZING)
        chosen.append(tuning.rate)
    assert chosen[0] == chosen[1] == 0.2


def test_a_sample_the_first_requests_misled_is_chosen_again_from_what_the_ghosts_hold():
    """2,000 empty bodies first, then 1 KiB ones: the first sizes make each ghost a
    thousandth of the keys, a handful of objects; once a ghost is full that far from 2,000
    objects, the rate is chosen again from what it holds."""
    spec = WorkloadSpec(objects=20_000, requests=900_000, alpha=1.0, one_hit_share=0.5,
                        sizes=SizeSpec.parse("fixed:1KiB"))  # fmt: skip
    trace = generate(spec)
    sizes = trace.sizes.copy()
    sizes[:SIZING] = 0
    misled = Trace(trace.times, trace.ids, sizes)
    tune = TuneSettings(evictions=("lru", "s3fifo"), period=500)  # 500,000 requests at 0.001
    head = Trace(misled.times[:SIZING], misled.ids[:SIZING], misled.sizes[:SIZING])
    first = simulate(head, 10_250_000, SECOND_HIT, entry_overhead=0, eviction="auto", tune=tune)
    assert first.tuning["sample"] == 0.001  # the least: 10 MB of empty bodies is millions
    whole = simulate(misled, 10_250_000, SECOND_HIT, entry_overhead=0, eviction="auto", tune=tune)
    assert 0.1 <= whole.tuning["sample"] <= 0.4  # about 0.2: 10,000 objects of 1 KiB
    assert whole.tuning["judgements"] > 0


def test_a_memory_tier_too_small_for_its_ghosts_to_tell_is_not_tuned_and_says_so():
    """256 objects of 1 MiB: at the largest sample 18 candidates' work allows (0.22), a ghost
    would hold 56 of them: the tuner records next to nothing and keeps its first pair."""
    sizes = np.full(SIZING, 1 << 20, dtype=np.int64)
    trace = Trace(np.arange(SIZING, dtype=np.float64), np.arange(SIZING) % 1000, sizes)
    tuning = Tuning(256 << 20, SECOND_HIT, TuneSettings(), 16 << 20)
    _fed(tuning, trace, 0, SIZING)
    assert tuning.rate == 0.001 and tuning.idle is not None
    assert "too few for ghosts of a 0.22 sample to tell" in tuning.state()["said"]
    _fed(tuning, trace, 0, SIZING)  # past a period: never judged
    assert tuning.state()["judgements"] == 0 and tuning.switches == 0


def test_a_lead_within_the_samples_noise_is_no_evidence():
    """With no margin, a lead of 0.8 points over 10,000 sampled requests (two standard errors
    of a hit ratio near a half are 1 point) is not taken; one of 2.4 points is."""
    tuner = Tuner(CHOICES, TuneSettings(warmup=1, patience=1, margin=0.0))
    assert tuner.judge(np.zeros(3), 0, HELD) is None  # the warm-up, of no request
    assert tuner.judge(np.array([5000, 5080, 5000]), 10_000, HELD) is None
    assert "keeps" in tuner.said
    assert tuner.judge(np.array([5000, 5400, 5000]), 10_000, HELD) == 1


def test_an_idle_tuner_wakes_when_the_tier_grows_tunable():
    """The first requests' bodies of 1 MiB make a 256 MiB tier too small to tune; 1 KiB
    bodies after them make it a tier of about 260,000 objects: the tuner, idle, sampling a
    thousandth of the keys, samples again once it has judged what its ghost holds."""
    sizes = np.concatenate([np.full(SIZING, 1 << 20), np.full(600_000, 1024)]).astype(np.int64)
    rng = np.random.default_rng(3)
    ids = np.concatenate([np.arange(SIZING) % 1000, 1000 + rng.integers(0, 300_000, 600_000)])
    trace = Trace(np.arange(len(ids), dtype=np.float64), ids, sizes)
    first = simulate(Trace(trace.times[:SIZING], ids[:SIZING], sizes[:SIZING]), 256 << 20,
                     SECOND_HIT, entry_overhead=0, eviction="auto")  # fmt: skip
    assert first.tuning["sample"] is None and "too few" in first.tuning["said"]  # idle
    woken = simulate(trace, 256 << 20, SECOND_HIT, entry_overhead=0, eviction="auto")
    assert woken.tuning["sample"] == 0.0076 and "begin again" in woken.tuning["said"]
