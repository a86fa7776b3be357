"""The admission family: each policy's stated guarantee, pinned directly on the compiled core."""

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core._native import Admission, DiskIndex, StoreIndex, hash64
from proxy.core.admission import (
    PROMOTION_MIN_KEYS,
    AdmissionConfig,
    key_sample,
    make_policy,
    parse_policy,
    promotion_filter,
    shared_window_size,
)
from proxy.core.disk import DiskTier
from proxy.core.regions import Regions
from proxy.core.store import CacheStore
from proxy.ops.service import say_auto_choices


@settings(max_examples=100)
@given(st.integers(1, 6), st.lists(st.integers(0, 40), max_size=200))
def test_nth_hit_admits_exactly_on_the_nth_sighting_while_nothing_ages(n, keys):
    policy = Admission("nth-hit", keys=1 << 16, threshold=n)  # far more columns than sightings
    seen: dict[int, int] = {}
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
        assert policy.admit(f"/k{key}", 100, 0.0) == (seen[key] >= n)
    assert policy.halvings == 0


def test_nth_hit_forgets_by_halving_after_a_sketch_width_of_sightings():
    policy = Admission("nth-hit", keys=64, threshold=3)
    assert [policy.admit("/a", 1, 0.0) for _ in range(2)] == [False, False]
    for i in range(64):  # a sketch-width of other sightings: the counts halve
        policy.admit(f"/other{i}", 1, 0.0)
    assert policy.halvings == 1
    assert policy.estimate("/a") == 1
    assert policy.admit("/a", 1, 0.0) is False  # 1 + 1: its third sighting came too late


def test_tinylfu_admits_while_there_is_room_then_only_what_beats_the_victim():
    index = StoreIndex(300)
    policy = Admission("tinylfu", index=index, keys=1024)
    for key in ("/a", "/b", "/c"):
        policy.observe(key, 100, 0.0)
        assert policy.admit(key, 100, 0.0)
        index.put(hash64(key)[0], 100, 100, 0)
    for _ in range(3):
        policy.observe("/hot", 100, 0.0)
    policy.observe("/cold", 100, 0.0)
    assert policy.estimate("/hot") > policy.estimate("/a") >= policy.estimate("/cold")
    assert policy.admit("/hot", 100, 0.0), "more frequent than the LRU victim /a"
    assert not policy.admit("/cold", 100, 0.0), "no more frequent than the victim"


def test_tinylfu_ages_its_sketch_after_ten_widths_of_requests():
    policy = Admission("tinylfu", index=StoreIndex(1000), keys=64)
    for _ in range(5):
        policy.observe("/hot", 100, 0.0)
    for i in range(640):
        policy.observe(f"/scan{i}", 100, 0.0)
    assert policy.halvings == 1
    assert 1 <= policy.estimate("/hot") <= 2  # 4 in the sketch, halved; the doorkeeper cleared


def test_probabilistic_admits_its_share_and_repeats_itself():
    first, second = (
        Admission("probabilistic", probability=0.25),
        Admission("probabilistic", probability=0.25),
    )
    a = [first.admit(f"/k{i}", 1, 0.0) for i in range(20_000)]
    b = [second.admit(f"/k{i}", 1, 0.0) for i in range(20_000)]
    assert a == b, "a fixed seed: the proxy and the simulator decide alike"
    assert 0.23 < sum(a) / len(a) < 0.27


def test_second_hit_xn_remembers_n_times_as_long_and_is_labelled_so():
    """Its keys and its time alike: a fixed window of 4 x 10 minutes holds 4 times the keys,
    or it would rotate as fast as 10 minutes' under the traffic ``capacity`` describes."""
    store = CacheStore(10_000)
    fixed = AdmissionConfig(window=600.0, capacity=10_000)
    window = make_policy(fixed.as_policy("second-hit:x4"), store).window
    plain = make_policy(fixed, store).window
    assert window.window == 4 * plain.window and window.capacity >= 4 * plain.capacity
    assert shared_window_size(fixed.as_policy("second-hit:x4")) > 3 * shared_window_size(fixed)
    assert AdmissionConfig(policy="second-hit:x4", window=600.0).label() == "second-hit(40m)"
    assert AdmissionConfig(policy="second-hit:x4", auto_scale=0.5).label() == "second-hit(auto x2)"
    assert AdmissionConfig(policy="second-hit:x1").label() == "second-hit(auto)"
    # Beside the configured second hit, a multiple keeps its settings (the tuner, the what-if).
    configured = AdmissionConfig(window=600.0, fp_rate=0.001, capacity=5_000)
    assert configured.as_policy("second-hit:x4").label() == "second-hit(40m)"
    assert configured.as_policy("second-hit:x4").fp_rate == 0.001
    assert configured.as_policy("always") == AdmissionConfig(policy="always")


def test_size_below_admits_only_smaller_responses():
    policy = Admission("size-below", limit=1000)
    assert policy.admit("/small", 999, 0.0) and not policy.admit("/big", 1000, 0.0)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("always", ("always", None)),
        ("nth-hit:3", ("nth-hit", 3)),
        ("probabilistic:0.1", ("probabilistic", 0.1)),
        ("size-below:64KiB", ("size-below", 65536)),
        ("second-hit:x4", ("second-hit", 4.0)),
        ("second-hit:x0.5", ("second-hit", 0.5)),
    ],
)
def test_policy_names_carry_their_parameter(text, parsed):
    assert parse_policy(text) == parsed
    assert make_policy(AdmissionConfig(policy=text), CacheStore(10_000)).name == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nth-hit", "needs its parameter: nth-hit:N"),
        ("nth-hit:0", "N is a whole number from 1 to 255"),
        ("probabilistic:2", "P is a probability above 0 and at most 1"),
        ("size-below:lots", "size 'lots' is not a size"),
        ("always:1", "takes no parameter"),
        ("second-hit:4", "xN is the window's multiple"),
        ("second-hit:x0", "xN is the window's multiple, from 1/16 to 16"),
        ("second-hit:x64", "from 1/16 to 16"),
        ("second-hit:x1e-300", "from 1/16 to 16"),
        ("second-hit:x 4", "from 1/16 to 16"),
        ("second-hit:", "from 1/16 to 16"),
        ("tiny-lfu", "did you mean 'tinylfu'"),
    ],
)
def test_bad_policy_names_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_policy(text)


def test_adaptive_follows_the_candidate_whose_shadow_hits_more():
    """A candidate that stores nothing (size-below:1) against always, on a small working set
    every request of which is sampled: always's shadow hits, the other's never, so the
    choice moves to always after one period and stays."""
    adaptive = Admission(
        "adaptive",
        candidates=(Admission("size-below", limit=1), Admission("always")),
        shadows=(StoreIndex(10_000), StoreIndex(10_000)),
        shadow_policies=(Admission("size-below", limit=1), Admission("always")),
        rate=1.0,
        period=100,
        choice=0,
    )
    assert adaptive.admit("/k0", 100, 0.0) is False  # the starting choice decides
    for i in range(1000):
        adaptive.observe(f"/k{i % 20}", 100, float(i))
    assert adaptive.choice == 1 and adaptive.switches == 1 and adaptive.sampled == 1000
    assert adaptive.admit("/new", 100, 0.0) is True
    scores = adaptive.scores()
    assert scores[1] > scores[0] == 0.0


def test_adaptive_on_a_store_reports_its_choice_and_keeps_second_hit_s_filter():
    store = CacheStore(1 << 20)
    policy = make_policy(AdmissionConfig(policy="adaptive"), store)
    assert policy.observes and policy.choice == "second-hit"
    assert policy.filter_stats() is not None
    stats = policy.policy_stats()
    assert stats["adaptive_choice"] == 1 and stats["adaptive_switches"] == 0
    assert stats["sketch_bytes"] > 0  # tinylfu's, a candidate


def test_auto_and_adaptive_sample_keys_chosen_by_a_secret_not_by_their_hash():
    """``auto`` (a disk tier's) and ``adaptive`` feed their ghosts a sample of the keys: keyed
    by the proxy's secret, URLs a client chose for a low hash are sampled at the sample's rate,
    not all of them (unkeyed, as the simulator runs them, they would be)."""
    chosen = [k for k in (f"/x{i}" for i in range(40_000)) if hash64(k)[0] < 2**64 // 16][:1000]
    sampled = {}
    for key in (0, 0x5EC2E7 | 1):
        tier = DiskTier(Regions(1 << 20, 64), AdmissionConfig(policy="auto"))
        key_sample(tier.admission, key)
        for n, url in enumerate(chosen):
            tier.admit(url, 100, 200, float(n))
        sampled[key] = tier.admission.native.sampled
    assert sampled[0] == len(chosen)
    assert 20 < sampled[0x5EC2E7 | 1] < 110  # about 1/16 of them, as of any 1,000 URLs


def _auto_choice(share: float, regions: int) -> str:
    """``auto`` between always and size-below:2000 (every key sampled, a ghost of ``regions``
    regions of 10 kB), fed 100 small keys in turn, each followed by a new large key asked
    three times in a row: always hits twice in four lookups, size-below once (the small keys,
    once its ghost holds them); what it chose."""
    kinds = (("always", {}), ("size-below", {"limit": 2000}))
    auto = Admission(
        "auto",
        candidates=tuple(Admission(k, **o) for k, o in kinds),
        shadows=(DiskIndex(regions), DiskIndex(regions)),
        shadow_policies=tuple(Admission(k, **o) for k, o in kinds),
        rate=1.0, period=400, margin=0.005, choice=1, region_size=10_000, regions=regions,
        share=share,
    )  # fmt: skip
    for n in range(4_000):
        auto.observe(f"/small{n % 100}", 1000, float(n))
        for _ in range(3):
            auto.observe(f"/large{n}", 5000, float(n))
    return ("always", "size-below")[auto.choice]


def _ghost_hits(keys: int, size: int) -> float:
    """An auto admission whose one candidate admits all, its ghost (every key sampled) a ring
    of 64 regions of 64 KiB for a tier of 1 MiB regions, fed ``keys`` keys of ``size`` bytes
    in turn, five rounds: its ghost's hits."""
    auto = Admission(
        "auto", candidates=(Admission("always"),), shadows=(DiskIndex(64),),
        shadow_policies=(Admission("always"),), rate=1.0, period=1 << 20, choice=0,
        region_size=64 << 10, regions=64, overhead=100, longest=1 << 20,
    )  # fmt: skip
    for n in range(5 * keys):
        auto.observe(f"/k{n % keys}", size, float(n))
    return auto.scores()[0]


def test_a_ghost_packs_records_as_its_tier_packs_them():
    """A ghost's region is a sixteenth of its tier's, each of which holds many records: a
    ghost's record is written on from where the last one ended, across its regions. Its 4 MiB
    hold 59 records of 68 KiB (55 asked in turn hit from the second round on), and 123 of 33
    KiB, as its tier would; a record per region (each 33 KiB one opening a region, each 68
    KiB one two) held half as many, or none. One longer than the tier's region is refused."""
    assert _ghost_hits(55, 68 << 10) == 4 * 55
    assert _ghost_hits(70, 68 << 10) == 0  # past what it holds: cycled out, in turn
    assert _ghost_hits(110, 33 << 10) == 4 * 110
    assert _ghost_hits(1, 2 << 20) == 0  # longer than the tier's region (1 MiB)


def test_auto_leaves_out_a_rule_writing_past_its_share_while_admitting_all_evicts():
    """Admitting all hits more here, and writes every large key: its 16 regions turn over
    every few hundred lookups, pushing the small keys out. With a share of 0.15 it is left
    out for the rule that writes a sliver of it; with none, or on a ring that holds all it
    writes (nothing evicted, nothing lost by writing), it decides."""
    assert _auto_choice(share=0.15, regions=16) == "size-below"
    assert _auto_choice(share=0.0, regions=16) == "always"
    assert _auto_choice(share=0.15, regions=4_000) == "always"


async def test_the_disk_admission_auto_logs_each_change_of_its_choice_and_why(caplog):
    """Keys asked again between one-hit wonders: auto's ghosts move it off its start (second
    hit) as they fill; a line says what decides after the switches, how many there were, and
    each ghost's recent hit ratio and share of the most written."""
    tier = DiskTier(Regions(1 << 20, 16), AdmissionConfig(policy="auto"))
    auto = tier.admission
    watching = asyncio.get_running_loop().create_task(say_auto_choices(auto, interval=0.01))
    await asyncio.sleep(0)  # it starts from no switch
    try:
        with caplog.at_level(logging.INFO, logger="onehit"):
            for n in range(100_000):
                key = f"/again{n % 500}" if n % 2 else f"/once{n}"
                if tier.find(key) is None:
                    tier.offer(key, 1000, 1100, float(n))
                else:
                    tier.served(key, 1000, float(n))
            await asyncio.sleep(0.05)
    finally:
        watching.cancel()
    assert auto.native.switches >= 1
    [said, *_] = [r.getMessage() for r in caplog.records if "disk admission auto" in r.message]
    switches = auto.native.switches
    assert said.startswith(f"disk admission auto: {auto.choice} decides (switch {switches})")
    assert said.endswith(f"({switches} since the last line)")
    assert "always 0." in said and "writing 100%" in said  # admit-all wrote the most


def test_the_promotion_filter_is_none_under_always_and_else_a_second_hit_of_memorys_turnover():
    store = CacheStore(1 << 20)
    assert promotion_filter(make_policy(AdmissionConfig(policy="always"), store), store) is None
    for policy in ("second-hit", "tinylfu", "nth-hit:3"):
        promotion = promotion_filter(make_policy(AdmissionConfig(policy=policy), store), store)
        assert promotion is not None and promotion.name == "second-hit"
        # Sized by the objects memory holds: none yet, so its smallest share.
        assert promotion.window.generation_share == PROMOTION_MIN_KEYS
        assert not promotion.admit("http://a/x", 100, 1.0)
        assert promotion.admit("http://a/x", 100, 2.0)  # the second disk hit
