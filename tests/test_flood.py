"""A scanner flooding never-repeated URLs: the filter rotates early instead of saturating, its
false-positive rate and memory stay put, the flood is not stored, popular objects keep hitting."""

from loadgen.sim.simulate import build_engine
from loadgen.traces.workload import SizeSpec, WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig
from proxy.core.events import Hit, RequestMeta, ResponseMeta

CAPACITY = 20_000
FP = 0.01


def run(flood: bool) -> dict:
    popular = generate(WorkloadSpec(objects=5_000, requests=100_000, alpha=0.9, one_hit_share=0.0,
                                    sizes=SizeSpec.parse("fixed:1KiB")))  # fmt: skip
    keys = popular.key_strings()
    if flood:  # 10x the filter's capacity of unique URLs, two for every popular request
        scan = iter(f"/scan/{i}" for i in range(10 * CAPACITY))
        keys = [k for key in keys for k in (key, next(scan), next(scan))]
    window = AdmissionConfig(window=3600.0, capacity=CAPACITY, fp_rate=FP)
    engine = build_engine(2 << 20, window)
    memory_before = engine.admission.filter_stats().memory_bytes
    ok = ResponseMeta()
    popular_hits = popular_requests = 0
    for now, key in enumerate(keys):
        request = RequestMeta(key)
        decision = engine.lookup(request, float(now) / 1000)
        if not key.startswith("/scan/"):
            popular_requests += 1
            popular_hits += isinstance(decision, Hit)
        if not isinstance(decision, Hit):
            engine.on_response(request, ok, 1024, float(now) / 1000)
    health = engine.admission.filter_stats()
    return {
        "popular_hit_ratio": popular_hits / popular_requests,
        "flood_stored": sum(k.startswith("/scan/") for k in engine.store),
        "forced_rotations": health.forced_rotations,
        "fp_estimate": health.estimated_fp_rate,
        "memory_grew": health.memory_bytes - memory_before,
    }


def test_unique_url_flood_is_absorbed_by_forced_rotations():
    calm, flooded = run(False), run(True)
    assert flooded["forced_rotations"] >= 9 > calm["forced_rotations"]
    assert flooded["fp_estimate"] <= FP
    assert flooded["memory_grew"] == 0
    # Only false positives of a filter held at <= 1% can let a scan URL in.
    assert flooded["flood_stored"] <= 0.01 * 10 * CAPACITY
    assert flooded["popular_hit_ratio"] >= calm["popular_hit_ratio"] - 0.03
