"""/metrics as a real Prometheus reads it: `promtool check metrics` finds nothing to fix, a
Prometheus server scrapes it and answers queries over its HTTP API, the alert rules load, and
every series the dashboard draws exists. Needs Debian's `prometheus` (`.ci/run` installs it)."""

import asyncio
import json
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import aiohttp
import pytest
from conftest import admin, base

from loadgen.live.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (.ci/run)")


async def _traffic(client, service) -> str:
    """Misses, hits (the fast path's too), a 404 and a HEAD; then the metrics text."""
    for path in ("/a", "/a", "/a", "/a", "/b"):
        async with client.get(base(service) + path, headers={"Host": "example.test"}) as r:
            await r.read()
    async with client.head(base(service) + "/a", headers={"Host": "example.test"}) as r:
        await r.read()
    async with client.get(admin(service) + "/metrics") as r:
        return await r.text()


def _sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name + (f"{{{want}}}" if want else "")) + r" (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    assert found, f"{name}{labels} not in /metrics"
    return float(found[1])


async def test_answers_are_counted_by_class_route_and_time_hits_apart(origin, start_proxy, client):
    origin.set("/b", status=404, headers={"Cache-Control": "max-age=60"})
    service = await start_proxy()
    text = await _traffic(client, service)
    assert _sample(text, "onehit_responses_total", **{"class": "2xx"}) == 5
    assert _sample(text, "onehit_responses_total", **{"class": "4xx"}) == 1
    hits = _sample(text, "onehit_response_seconds_count", cache="hit")
    misses = _sample(text, "onehit_response_seconds_count", cache="miss")
    assert (hits, misses) == (3, 3)  # /a twice (the second stores it), and /b: misses
    assert _sample(text, "onehit_route_responses_total", route="default", **{"class": "4xx"}) == 1
    assert _sample(text, "onehit_build_info", version=metadata.version("onehit"),
                   python=__import__("platform").python_version(),
                   aiohttp=aiohttp.__version__) == 1  # fmt: skip
    assert _sample(text, "process_resident_memory_bytes") > 10 << 20
    assert _sample(text, "process_start_time_seconds") > 1.7e9


@needs_promtool
async def test_promtool_finds_nothing_to_fix_in_the_metrics(origin, start_proxy, client):
    service = await start_proxy()
    text = await _traffic(client, service)
    out = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
        out.stdout + out.stderr
    )


@needs_promtool
def test_the_alert_rules_load():
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(ROOT / "deploy/prometheus/onehit-rules.yml")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0 and "SUCCESS: 6 rules found" in out.stdout, out.stdout + out.stderr


async def test_every_series_the_dashboard_draws_exists(origin, start_proxy, client):
    service = await start_proxy()
    text = await _traffic(client, service)
    exposed = set(re.findall(r"^([a-z_]+?)(?:_bucket|_sum|_count)?(?:\{| )", text, re.MULTILINE))
    exposed |= {m + "_bucket" for m in exposed}
    dashboard = json.loads((ROOT / "deploy/grafana/onehit.json").read_text())
    drawn = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:onehit|process)_[a-z_]+)", target["expr"])
    }
    # Per-worker series come from a --workers parent; the rest from any process.
    missing = {n for n in drawn - exposed if not n.startswith("onehit_worker_")}
    assert drawn and not missing, missing


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (.ci/run)")
async def test_a_real_prometheus_scrapes_the_admin_port_and_answers_queries(
    origin, start_proxy, client, tmp_path
):
    service = await start_proxy()
    await _traffic(client, service)
    host, port = service.admin_address
    listen = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 200ms\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {ROOT / 'deploy/prometheus/onehit-rules.yml'}\n"
        "scrape_configs:\n  - job_name: onehit\n"
        f"    static_configs:\n      - targets: ['{host}:{port}']\n"
    )
    process = await asyncio.create_subprocess_exec(
        PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{listen}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    api = f"http://127.0.0.1:{listen}/api/v1"
    up = 'onehit_requests_total{job="onehit"}'
    prom = aiohttp.ClientSession()  # one that decompresses, as Prometheus's API answers gzip
    try:
        deadline = asyncio.get_running_loop().time() + 30
        value = None
        while value is None and asyncio.get_running_loop().time() < deadline:
            try:
                async with prom.get(api + "/query", params={"query": up}) as r:
                    result = (await r.json())["data"]["result"]
                    value = float(result[0]["value"][1]) if result else None
            except (aiohttp.ClientError, KeyError):
                pass
            if value is None:
                await asyncio.sleep(0.2)  # polling a server that starts and scrapes on its own
        assert value == 6  # five GETs and a HEAD
        async with prom.get(api + "/rules") as r:
            groups = (await r.json())["data"]["groups"]
        assert [g["name"] for g in groups] == ["onehit"] and len(groups[0]["rules"]) == 6
        query = 'sum by (cache) (onehit_response_seconds_count{job="onehit"})'
        async with prom.get(api + "/query", params={"query": query}) as r:
            by_cache = {s["metric"]["cache"]: float(s["value"][1])
                        for s in (await r.json())["data"]["result"]}  # fmt: skip
        assert by_cache == {"hit": 3, "miss": 3}
    finally:
        await prom.close()
        process.terminate()
        await asyncio.wait_for(process.wait(), 15)
