"""The admin listener: /stats, /metrics, /healthz, purge by prefix, filter reset, the token."""

import json
import re

import pytest
from conftest import admin, base

from proxy.core.stats import METRICS


async def test_stats_report_every_metric_filter_health_and_config(start_proxy, client):
    proxy = await start_proxy()
    for _ in range(3):
        async with client.get(base(proxy) + "/s") as r:
            await r.read()
    async with client.get(admin(proxy) + "/stats") as r:
        stats = await r.json()
    assert set(METRICS) <= set(stats["metrics"])
    m = stats["metrics"]
    assert (m["requests"], m["hits"], m["admissions"], m["rejected_first_sighting"]) == (3, 1, 1, 1)
    assert len(stats["filter"]["generations"]) == 2 and stats["filter"]["memory_bytes"] > 0
    assert stats["store"]["entries"] == 1 and stats["uptime_s"] >= 0
    assert stats["config"]["admission"] == "second-hit(auto)"


async def test_metrics_are_prometheus_text_with_onehit_prefix(start_proxy, client):
    proxy = await start_proxy()
    async with client.get(base(proxy) + "/m") as r:
        await r.read()
    async with client.get(admin(proxy) + "/metrics") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        text = await r.text()
    sample = re.compile(r'^(onehit|process)_[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.e+-]+$')
    for line in text.strip().splitlines():
        assert line.startswith(("# HELP ", "# TYPE ")) or sample.match(line), line
    assert "onehit_requests_total 1.0" in text
    assert "# TYPE onehit_hit_ratio gauge" in text
    assert "# TYPE onehit_forced_rotations_total counter" in text


async def test_purge_by_prefix_and_filter_reset(start_proxy, client, origin):
    proxy = await start_proxy()
    for path in ("/img/1", "/img/2", "/css/1"):
        for _ in range(2):
            async with client.get(base(proxy) + path) as r:
                await r.read()
    async with client.post(admin(proxy) + "/purge", json={"prefix": base(proxy) + "/img/"}) as r:
        assert (await r.json()) == {"removed": 2, "prefix": base(proxy) + "/img/"}
    async with client.post(admin(proxy) + "/purge", json={}) as r:
        assert r.status == 400
    async with client.post(admin(proxy) + "/filter/reset", json={}) as r:
        assert r.status == 200
    async with client.get(base(proxy) + "/img/1") as r:
        assert r.headers["Cache-Status"] == "onehit; fwd=uri-miss; detail=first-sighting"


async def test_token_is_required_when_configured(start_proxy, client):
    proxy = await start_proxy(admin__token="s3cret")
    async with client.get(admin(proxy) + "/healthz") as r:
        assert r.status == 200 and await r.text() == "ok\n"
    async with client.get(admin(proxy) + "/stats") as r:
        assert r.status == 401
    async with client.post(admin(proxy) + "/purge", json={"prefix": "http://x/"}) as r:
        assert r.status == 401
    headers = {"Authorization": "Bearer s3cret"}
    async with client.get(admin(proxy) + "/stats", headers=headers) as r:
        assert r.status == 200


@pytest.mark.parametrize("field", ["url", "prefix", "tags"])
async def test_a_purge_of_text_no_key_can_hold_is_a_400_not_a_500(start_proxy, client, field):
    proxy = await start_proxy()
    value = "http://example.test/\ud800"  # JSON may carry a lone surrogate; a key may not
    body = json.dumps({field: [value] if field == "tags" else value})
    async with client.post(admin(proxy) + "/purge", data=body,
                           headers={"Content-Type": "application/json"}) as r:  # fmt: skip
        assert r.status == 400 and "not text a cache key can hold" in (await r.json())["error"]


async def test_a_tag_named_twice_in_one_purge_is_banned_once(start_proxy, client, tmp_path):
    proxy = await start_proxy(disk__path=str(tmp_path), disk__size="8MiB",
                              disk__region_size="1MiB", disk__policy="always")  # fmt: skip
    async with client.get(base(proxy) + "/x") as r:  # a record for the ban to reach
        await r.read()
    assert len(proxy.proxy.disk.tier) == 1
    async with client.post(admin(proxy) + "/purge", json={"tags": ["a"] * 5000}) as r:
        assert r.status == 200
    assert len(proxy.proxy.disk.tier.bans) == 1


async def test_a_purge_body_nested_past_the_parsers_depth_is_a_400_not_a_500(start_proxy, client):
    proxy = await start_proxy()
    nested = "[" * 100_000 + "]" * 100_000
    async with client.post(admin(proxy) + "/purge", data=nested,
                           headers={"Content-Type": "application/json"}) as r:  # fmt: skip
        assert r.status == 400 and (await r.json())["error"] == "body must be JSON"
