"""The synthetic generator: determinism, one-hit wonders, Zipf shape, sizes, churn, arrivals."""

import numpy as np
import pytest

from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate


def counts(trace) -> np.ndarray:
    return np.unique(trace.ids, return_counts=True)[1]


def test_same_seed_same_trace_byte_for_byte():
    spec = WorkloadSpec(objects=1000, requests=20_000, churn=0.1, churn_period=5000, seed=3)
    a, b = generate(spec), generate(spec)
    for name in ("times", "ids", "sizes"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes()
    assert generate(WorkloadSpec(objects=1000, requests=20_000, seed=4)).ids.tobytes() != (
        a.ids.tobytes()
    )


def test_one_hit_share_of_requests_go_to_objects_requested_once():
    spec = WorkloadSpec(objects=100, requests=50_000, one_hit_share=0.4, alpha=0.5)
    trace = generate(spec)
    once = int((counts(trace) == 1).sum())
    # 100 popular objects over 30,000 requests are all requested many times.
    assert once == 20_000


def test_zipf_popularity_follows_alpha():
    trace = generate(WorkloadSpec(objects=10_000, requests=400_000, alpha=1.0, one_hit_share=0))
    c = np.sort(counts(trace))[::-1].astype(float)
    # Rank 1 vs rank 10 of a Zipf(1) law is 10x.
    assert c[0] / c[9] == pytest.approx(10, rel=0.2)


def test_sizes_fixed_and_lognormal_per_object():
    fixed = generate(WorkloadSpec(objects=100, requests=2000, sizes=SizeSpec.parse("fixed:4KiB")))
    assert set(fixed.sizes.tolist()) == {4096}
    spec = SizeSpec.parse("lognormal:median=10KiB,sigma=1,max=100KiB")
    trace = generate(WorkloadSpec(objects=5000, requests=50_000, sizes=spec))
    assert trace.sizes.max() <= 100 * 1024 and trace.sizes.min() >= 1
    per_object = {}
    for i, s in zip(trace.ids.tolist(), trace.sizes.tolist(), strict=True):
        assert per_object.setdefault(i, s) == s
    assert np.median(list(per_object.values())) == pytest.approx(10 * 1024, rel=0.1)


def test_churn_brings_new_objects_in():
    base = WorkloadSpec(objects=1000, requests=100_000, one_hit_share=0, churn_period=10_000)
    still = generate(base)
    churned = generate(WorkloadSpec(**{**_fields(base), "churn": 0.2}))
    assert churned.distinct_objects() > still.distinct_objects() + 1000


def test_arrivals_are_poisson_at_the_rate():
    trace = generate(WorkloadSpec(objects=100, requests=100_000, rate=500.0))
    assert np.all(np.diff(trace.times) >= 0) and trace.times[0] == 0
    assert trace.duration() == pytest.approx(100_000 / 500.0, rel=0.02)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pareto", "unknown"),
        ("fixed", "needs a size"),
        ("fixed:0", "at least 1 byte"),
        ("lognormal:median=huge", "not a size"),
        ("lognormal:mean=4", "median=SIZE"),
    ],
)
def test_bad_size_spec_says_what_is_expected(text, message):
    with pytest.raises(ValueError, match=message):
        SizeSpec.parse(text)


def test_bad_workload_is_refused():
    with pytest.raises(ValueError, match="one_hit_share"):
        WorkloadSpec(one_hit_share=1.0)


def _fields(spec: WorkloadSpec) -> dict:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


def test_a_workload_describes_itself_in_words():
    text = WorkloadSpec(objects=2000, requests=30_000, churn=0.05).describe()
    assert text.startswith("30,000 requests, Zipf alpha 0.8 over 2,000 popular objects")
    assert "25% of requests for one-hit wonders" in text and "median 16KiB" in text
    assert "5% of popularity ranks handed to new objects every 100,000 requests" in text


def test_a_crawler_sweeps_the_catalogues_tail_in_order_each_url_once_a_sweep():
    """Popularity so steep that the popular requests go to the first few ranks, never to the
    tail: the tail's objects are the crawler's (each asked 4 or 5 times in 4,000 requests),
    and it visits all 900 in one order, each once per sweep, again and again."""
    spec = WorkloadSpec(objects=1000, requests=20_000, alpha=8.0, one_hit_share=0.0,
                        crawler_share=0.2, crawler_tail=0.9, seed=5)  # fmt: skip
    trace = generate(spec)
    objects, asked = np.unique(trace.ids, return_counts=True)
    tail = set(objects[(asked == 4) | (asked == 5)].tolist())
    crawled = [i for i in trace.ids.tolist() if i in tail]
    assert len(tail) == 900 and len(crawled) == 4_000
    sweep = crawled[:900]
    assert len(set(sweep)) == 900
    assert crawled[900:1800] == sweep and crawled[1800:2700] == sweep


def test_crawler_requests_mostly_miss_and_second_hit_keeps_them_out():
    """Half the requests a sweep: LRU stores every crawled URL and evicts what would have hit;
    second hit, whose window is shorter than a sweep, stores none of them."""
    from loadgen.sim.simulate import simulate
    from proxy.core.admission import AdmissionConfig

    spec = WorkloadSpec(objects=20_000, requests=100_000, one_hit_share=0.0, crawler_share=0.5,
                        sizes=SizeSpec(kind="fixed", fixed=1024))  # fmt: skip
    trace = generate(spec)
    size = round(trace.distinct_bytes() * 0.02)
    lru = simulate(trace, size, AdmissionConfig(policy="always"), entry_overhead=0).stats
    second = simulate(trace, size, AdmissionConfig(policy="second-hit"), entry_overhead=0).stats
    assert second["hit_ratio"] > lru["hit_ratio"]
    assert second["bytes_written"] < 0.2 * lru["bytes_written"]
