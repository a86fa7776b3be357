"""A model of what may be served, held against a live proxy with a memory tier and a disk tier
that both evict, through random sequences of origin changes, requests, unsafe methods,
purges, clock steps and restarts (clean, and as after kill -9).

The origin puts the version of the representation it serves, and the variant, in each ETag,
and logs what it told the proxy and when. The model needs no second proxy: from that log it
knows, at every moment, which stored responses the rules still allow a cache to answer with.
A response the proxy answers from a cache (its ``Cache-Status`` says ``hit``) must be

* one the origin sent or confirmed (a 200 or a 304 to a GET) for that URL and variant,
* fresh: its last confirmation less than its ``max-age`` ago (no response here allows stale),
* the most recent the origin sent for that variant (RFC 9111 section 4): no other version
  sent since its confirmation,
* not removed since that confirmation: no unsafe method on the URL, no purge reaching it (a
  soft purge too: nothing here may be served stale), no response of the origin since that
  made it uncacheable (``private``, ``no-store``, a full response or a 304), and
* the variant the request selects when it varies.

Any other answer is the origin's current version, relayed. And every response memory stores
the disk (which admits all here) holds too, as soon as memory does.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from email.utils import formatdate

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from proxy.config.settings import load
from proxy.core.keys import url_of
from proxy.core.store import Entry
from proxy.disk.directory import release
from proxy.ops.service import Service

URLS = ("/a/1", "/a/2")
TAGS = {"/a/1": "t0", "/a/2": "t1"}
HOST = "example.test"
LANGS = (None, "en", "fr")
CONFIG = {
    "cache.size": "20KiB",
    "cache.max_object_size": "10KiB",
    "admission.policy": "always",
    "cache.hit_for_miss": "1s",  # shorter than any max-age here: the disk copy is still fresh
    "disk.size": "64KiB",
    "disk.region_size": "16KiB",
    "disk.policy": "always",
    "disk.checkpoint_interval": "1h",
    "server.access_log": False,
    "server.listen": "127.0.0.1:0",
    "admin.listen": "127.0.0.1:0",
    "upstream.connect_timeout": "2s",
    "upstream.read_timeout": "2s",
}


@dataclass
class Behaviour:
    """What the origin answers for one URL now."""

    version: int = 1
    directive: str = "public"  # or "private", "no-store"
    max_age: int = 3
    vary: bool = False
    answers_304: bool = True
    size: int = 200  # repeats of the body's line: a few KiB

    def cache_control(self) -> str:
        if self.directive == "public":
            return f"public, max-age={self.max_age}"
        return self.directive


@dataclass(frozen=True)
class Confirmed:
    """The origin sent or confirmed a stored response: in what order, when, for how long."""

    seq: int
    at: float
    max_age: int


class TwoTiers(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.now = float(int(time.time()))
        self.seq = 0
        self.behaviour = {url: Behaviour() for url in URLS}
        # (url, version, variant) -> its last confirmation, while the origin allowed storing it
        self.confirmed: dict[tuple[str, int, str], Confirmed] = {}
        self.removed = dict.fromkeys(URLS, 0)  # url -> seq of its last removal
        # (url, variant) -> (seq, version) of the last whole response the origin sent for it
        self.newest: dict[tuple[str, str], tuple[int, int]] = {}
        self.directory = tempfile.mkdtemp(prefix="onehit-model-")
        self.origin_runner = self.run(self._start_origin())
        self.service = self.run(self._start_proxy())
        self.session = aiohttp.ClientSession(loop=self.loop, auto_decompress=False)

    def run(self, work):
        return self.loop.run_until_complete(work)

    def teardown(self) -> None:
        self.run(self.session.close())
        self.run(self.service.stop())
        self.run(self.origin_runner.cleanup())
        self.loop.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _event(self) -> int:
        self.seq += 1
        return self.seq

    # The origin

    async def _start_origin(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._origin)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        self.origin_url = f"http://{host}:{port}"
        return runner

    async def _origin(self, request: web.Request) -> web.StreamResponse:
        url = request.path
        b = self.behaviour[url]
        if request.method not in ("GET", "HEAD"):
            self.removed[url] = self._event()  # a successful unsafe method: RFC 9111 4.4
            return web.Response(status=204)
        variant = (request.headers.get("Accept-Language") or "-") if b.vary else "-"
        etag = f'"{b.version}-{variant}"'
        headers = {
            "Cache-Control": b.cache_control(),
            "ETag": etag,
            "Date": formatdate(self.now, usegmt=True),
            "Surrogate-Key": TAGS[url],
        }
        if b.vary:
            headers["Vary"] = "Accept-Language"
        matched = b.answers_304 and request.headers.get("If-None-Match") == etag
        if request.method == "GET":
            key = (url, b.version, variant)
            if b.directive == "public":
                self.confirmed[key] = Confirmed(self._event(), self.now, b.max_age)
            else:  # it supersedes what was stored, and may not be stored itself
                self.removed[url] = self._event()
        if matched:
            return web.Response(status=304, headers=headers)
        if request.method == "GET":
            self.newest[(url, variant)] = (self._event(), b.version)
        body = f"{url} version {b.version} variant {variant}\n".encode() * b.size
        return web.Response(body=body, headers=headers)

    # The proxy

    async def _start_proxy(self) -> Service:
        config = load(env={}, overrides={**CONFIG, "upstream.origin": self.origin_url,
                                         "disk.path": self.directory})  # fmt: skip
        return await Service.start(config, clock=lambda: self.now)

    async def _crash(self) -> None:
        """What kill -9 leaves of the proxy: what it wrote, no checkpoint, no lock."""
        service = self.service
        if service.checkpoints is not None:
            service.checkpoints.cancel()
        await service.proxy_runner.cleanup()
        await service.admin_runner.cleanup()
        await service.proxy.close()
        await service.proxy.upstream.close()
        disk = service.proxy.disk
        disk.log.close()
        disk.journal.close()
        release(disk.keeping.claim)

    # Rules

    @rule(
        url=st.sampled_from(URLS),
        directive=st.sampled_from(["public", "public", "private", "no-store"]),
        max_age=st.integers(0, 5),
        vary=st.booleans(),
        answers_304=st.booleans(),
        new_version=st.booleans(),
        size=st.integers(1, 180),
    )
    def origin_changes(self, url, directive, max_age, vary, answers_304, new_version, size):
        b = self.behaviour[url]
        b.directive, b.max_age, b.vary, b.answers_304 = directive, max_age, vary, answers_304
        if new_version:
            b.version += 1
            b.size = size

    @rule(
        url=st.sampled_from(URLS),
        method=st.sampled_from(["GET", "GET", "HEAD"]),
        lang=st.sampled_from(LANGS),
        kind=st.sampled_from(["plain", "plain", "range", "no-cache", "if-none-match"]),
    )
    def request(self, url, method, lang, kind):
        headers = {"Host": HOST}
        if lang is not None:
            headers["Accept-Language"] = lang
        if kind == "range":
            headers["Range"] = "bytes=0-9"
        elif kind == "no-cache":
            headers["Cache-Control"] = "no-cache"
        elif kind == "if-none-match":
            b = self.behaviour[url]
            headers["If-None-Match"] = f'"{b.version}-{lang or "-"}"'
        status, answer = self.run(self._send(method, url, headers))
        self._check(url, lang, status, answer)
        stored = "; stored" in answer.get("Cache-Status", "")
        if method == "GET" and stored and "fwd=bypass" not in answer["Cache-Status"]:
            self._on_disk_as_in_memory(url, answer["ETag"])

    def _on_disk_as_in_memory(self, url: str, etag: str) -> None:
        """Every response memory stores from a fetch made for the cache (not a hit-for-miss
        pass), the disk takes (its admission here takes all): the memory entries of ``url``
        this answer stored have a record of their key on disk, of the same response. (One
        memory no longer holds was not stored by this answer's end, or was evicted since:
        nothing to compare.)"""
        proxy = self.service.proxy
        store = proxy.engine.store
        stored = [key for key in store if url_of(key) == f"http://{HOST}{url}"
                  and dict(store.peek(key).headers).get("ETag") == etag]  # fmt: skip
        for key in stored:
            record = proxy.disk.reads.lookup(key, Entry)
            assert record is not None, f"{key!r}: stored in memory, not on disk"
            assert dict(record.headers).get("ETag") == etag, (key, record.headers)

    async def _send(self, method: str, url: str, headers: dict[str, str]):
        host, port = self.service.proxy_address
        async with self.session.request(method, f"http://{host}:{port}{url}",
                                        headers=headers) as r:  # fmt: skip
            await r.read()
            return r.status, r.headers

    def _check(self, url: str, lang: str | None, status: int, answer) -> None:
        cache_status = answer.get("Cache-Status", "")
        etag = answer.get("ETag")
        assert status in (200, 206, 304), (status, cache_status)
        assert etag is not None, (status, cache_status)
        version, _, variant = etag.strip('"').partition("-")
        version = int(version)
        if "vary" in answer:
            assert variant == (lang or "-"), f"{url}: variant {variant} served for {lang}"
        if "; hit" not in cache_status:
            assert version == self.behaviour[url].version, (url, version, cache_status)
            return
        found = self.confirmed.get((url, version, variant))
        assert found is not None, (
            f"{url} v{version}/{variant}: never stored, served ({cache_status})"
        )
        assert found.seq > self.removed[url], (
            f"{url} v{version}/{variant}: removed after it was confirmed, served ({cache_status})"
        )
        seq, newest = self.newest.get((url, variant), (0, version))
        assert newest == version or seq < found.seq, (
            f"{url} v{version}/{variant}: v{newest} was sent since, served ({cache_status})"
        )
        assert self.now - found.at < found.max_age, (
            f"{url} v{version}/{variant}: stale ({self.now - found.at}s of {found.max_age}), "
            f"served as {cache_status}"
        )

    @rule(url=st.sampled_from(URLS))
    def unsafe_method(self, url):
        status, _ = self.run(self._send("POST", url, {"Host": HOST}))
        assert status == 204

    @rule(
        kind=st.sampled_from(["url", "prefix", "tags"]),
        url=st.sampled_from(URLS),
        soft=st.booleans(),
    )
    def purge(self, kind, url, soft):
        value = {"url": f"http://{HOST}{url}", "prefix": f"http://{HOST}/a/",
                 "tags": [TAGS[url]]}[kind]  # fmt: skip
        reached = {"url": [url], "prefix": ["/a/1", "/a/2"],
                   "tags": [u for u in URLS if TAGS[u] == TAGS[url]]}[kind]  # fmt: skip
        host, port = self.service.admin_address
        body = {kind: value, "soft": soft}
        answer = self.run(self._purge(f"http://{host}:{port}/purge", body))
        assert answer.get("durable", True) is True
        seq = self._event()
        for target in reached:
            self.removed[target] = seq

    async def _purge(self, url: str, body: dict) -> dict:
        async with self.session.post(url, json=body) as r:
            assert r.status == 200
            return await r.json()

    @rule(seconds=st.integers(0, 6))
    def clock_steps(self, seconds):
        self.now += seconds

    @rule(crash=st.booleans())
    def restart(self, crash):
        self.run(self._crash() if crash else self.service.stop())
        self.service = self.run(self._start_proxy())

    @invariant()
    def the_tiers_stay_within_their_sizes(self):
        engine = self.service.proxy.engine
        disk = self.service.proxy.disk
        assert engine.store.bytes_used <= engine.store.capacity_bytes
        assert disk.tier.bytes_held <= disk.tier.regions.capacity_bytes


def drive(steps: list[tuple[str, dict]]) -> None:
    """Run ``steps`` (a rule's name and its arguments) on a fresh machine: a sequence the
    random search may take long to meet, pinned."""
    machine = TwoTiers()
    try:
        for name, arguments in steps:
            if name == "held":
                held(machine, **arguments)
                continue
            getattr(machine, name)(**{"url": "/a/1", **arguments} if name in _ON_URL else arguments)
    finally:
        machine.teardown()


def held(machine: TwoTiers, *, memory: bool, disk: bool, url: str = "/a/1") -> None:
    """A scenario's setup step did what it is there for: ``url`` is held by memory or not,
    by the disk or not (the test would prove nothing otherwise)."""
    proxy = machine.service.proxy
    key = proxy.router.url_key(f"http://{HOST}{url}")
    assert (proxy.engine.store.peek(key) is not None) is memory, f"{url} in memory: {not memory}"
    assert (proxy.disk.tier.find(key) is not None) is disk, f"{url} on disk: {not disk}"


_ON_URL = {"request", "origin_changes", "unsafe_method"}
GET = {"method": "GET", "lang": None, "kind": "plain"}
CHANGE = {"max_age": 3, "vary": False, "new_version": False, "size": 5}
# Three variants of /a/2, 7 KiB each: memory (20 KiB) evicts /a/1.
FILL_MEMORY = [
    ("origin_changes", {**CHANGE, "url": "/a/2", "directive": "public", "vary": True,
                        "answers_304": True}),
    *[("request", {**GET, "url": "/a/2", "lang": lang}) for lang in LANGS],
]  # fmt: skip


@pytest.mark.parametrize("directive", ["private", "no-store"])
def test_rfc9111_4_3_4_a_response_made_uncacheable_is_not_served_from_the_disk_copy(directive):
    drive([
        ("request", GET),  # stored in memory and on disk
        ("held", {"memory": True, "disk": True}),
        ("origin_changes", {**CHANGE, "directive": directive, "answers_304": False}),
        ("request", {**GET, "kind": "no-cache"}),  # the origin's new answer: not storable
        ("clock_steps", {"seconds": 2}),  # past hit_for_miss, the disk's copy still fresh
        ("request", GET),
    ])  # fmt: skip


@pytest.mark.parametrize("directive", ["private", "no-store"])
def test_rfc9111_4_3_4_a_304_that_makes_it_uncacheable_reaches_the_disk_copy(directive):
    drive([
        ("request", GET),
        ("origin_changes", {**CHANGE, "directive": directive, "answers_304": True}),
        ("request", {**GET, "kind": "no-cache"}),  # a 304 with the new directive
        *FILL_MEMORY,  # memory evicts the refreshed entry
        ("held", {"memory": False, "disk": False}),
        ("request", GET),
    ])  # fmt: skip


def test_rfc9111_4_3_4_a_304_to_a_clients_own_conditional_updates_what_it_validates():
    """A hit-for-miss pass sends the client's If-None-Match to the origin as it came; the 304
    it gets makes the URL private: the variant stored meanwhile is not served after (before:
    the 304 passed through and the stored variant answered the next request)."""
    drive([
        ("origin_changes", {**CHANGE, "directive": "private", "max_age": 0,
                            "answers_304": False}),
        ("request", GET),  # private: the URL passes for a while (hit-for-miss)
        ("origin_changes", {**CHANGE, "directive": "public", "max_age": 1, "vary": True,
                            "answers_304": False}),
        ("request", {**GET, "lang": "en"}),  # passed, and stored
        ("origin_changes", {**CHANGE, "directive": "private", "answers_304": True}),
        ("request", {**GET, "kind": "if-none-match"}),  # a private 304, passed through
        ("request", {**GET, "lang": "en"}),
    ])  # fmt: skip


def test_rfc9111_4_3_4_a_304_that_shortens_the_lifetime_reaches_the_disk_copy():
    drive([
        ("request", GET),  # max-age=3 on disk
        ("origin_changes", {**CHANGE, "directive": "public", "max_age": 0, "answers_304": True}),
        ("request", {**GET, "kind": "no-cache"}),  # a 304: max-age=0 from now
        *FILL_MEMORY,
        ("held", {"memory": False, "disk": True}),  # rewritten with the 304's times
        ("clock_steps", {"seconds": 1}),
        ("request", GET),
    ])  # fmt: skip


def test_rfc9111_4_a_newer_response_is_never_answered_with_an_older_copy_from_disk():
    drive([
        ("request", GET),  # version 1, max-age=3, in memory and on disk
        ("origin_changes", {**CHANGE, "directive": "public", "answers_304": True,
                            "new_version": True}),
        ("request", {**GET, "kind": "no-cache"}),  # version 2 now, in memory
        *FILL_MEMORY,
        ("held", {"memory": False, "disk": True}),  # version 1 forgotten, 2 written
        ("request", GET),  # the disk's version 1 would be fresh by its own times, and older
    ])  # fmt: skip


@pytest.mark.parametrize("crash", [False, True], ids=["clean restart", "kill -9"])
@pytest.mark.parametrize("kind", ["url", "prefix", "tags"])
def test_a_purge_holds_across_a_restart(kind, crash):
    drive([
        ("request", GET),
        ("held", {"memory": True, "disk": True}),
        ("purge", {"kind": kind, "url": "/a/1", "soft": False}),
        ("restart", {"crash": crash}),
        ("request", GET),
    ])  # fmt: skip


TwoTiers.TestCase.settings = settings(
    max_examples=int(os.environ.get("ONEHIT_MODEL_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_a_proxy_with_a_disk_never_serves_what_the_rules_forbid = pytest.mark.slow(TwoTiers.TestCase)
