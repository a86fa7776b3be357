"""The disk record's meta has one layout (``proxy.disk.record_meta``), which the compiled reader
(``proxy/handler/hitpath/disk.c``) reads too: on random records, what the compiled reader hands the
proxy is what ``decode_meta`` reads, and the answer it writes is the Python answerer's."""

from __future__ import annotations

import asyncio
import math
import tempfile
from email.utils import formatdate

from aiohttp.http_parser import HttpRequestParser
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.settings import load
from proxy.core.events import RequestMeta
from proxy.core.responses import response_meta
from proxy.disk.record_meta import decode_meta
from proxy.disk.store import DiskStore
from proxy.handler.hits import HitAnswers
from proxy.handler.routing import hidden_fields
from proxy.handler.server import Proxy
from proxy.ops.service import build_engine
from proxy.origin.upstream import Upstream

HOST = "example.test"
NOW = 1_800_000_000.0
_NAME = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda s: "X-" + s)
# Field values as a client library sends them: visible ASCII and Latin-1, inner spaces.
_VALUE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0xFF), max_size=40)
_DIRECTIVES = st.lists(
    st.sampled_from(["public", "must-revalidate", "no-transform", "s-maxage=30",
                     'no-cache="Set-Cookie"', "stale-if-error=60", "immutable"]),
    max_size=3,
)  # fmt: skip


class _Protocol:
    _reading_paused = False

    def pause_reading(self) -> None:
        pass


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


@settings(max_examples=60, deadline=None)
@given(
    status=st.sampled_from([200, 203, 404, 410]),
    fields=st.lists(st.tuples(_NAME, _VALUE), max_size=6),
    directives=_DIRECTIVES,
    max_age=st.integers(1, 10**6),
    arrived_age=st.integers(0, 100),
    dated=st.booleans(),
    body=st.binary(max_size=3000),
)
def test_the_compiled_record_reader_reads_what_decode_meta_reads(
    status, fields, directives, max_age, arrived_age, dated, body
):
    async def check() -> None:
        with tempfile.TemporaryDirectory() as directory:
            overrides = {"upstream.origin": "http://127.0.0.1:9", "admission.policy": "always",
                         "disk.path": directory, "disk.policy": "always"}  # fmt: skip
            config = load(env={}, overrides=overrides)
            disk = DiskStore(config.disk, hidden_fields(config))
            seen = []
            kept = HitAnswers._promoted_record

            def recorded(self, key, body, meta):  # what the compiled reader hands the proxy
                seen.append(meta)
                kept(self, key, body, meta)

            HitAnswers._promoted_record = recorded
            try:
                proxy = Proxy(config, build_engine(config), Upstream(config.upstream),
                              clock=lambda: NOW, disk=disk)  # fmt: skip
            finally:
                HitAnswers._promoted_record = kept
            headers = [("Cache-Control", ", ".join([f"max-age={max_age}", *directives])),
                       ("Age", str(arrived_age)), *fields]  # fmt: skip
            if dated:
                headers.append(("Date", formatdate(NOW, usegmt=True)))
            key = f"http://{HOST}/p"
            meta = RequestMeta(key)
            rmeta = response_meta(meta, status, headers, NOW, NOW, payload=body)
            disk.write(key, rmeta, body, NOW)
            parser = HttpRequestParser(_Protocol(), asyncio.get_running_loop(), 2**16)
            [(message, _)], _, _ = parser.feed_data(request("/other"))
            # Planned (memory and the disk hold nothing for it) and the Host known.
            assert type(proxy.answer_hit(message, "127.0.0.1", "http")) is not tuple
            # Read in Python first: it opens the region's descriptor, which the compiled
            # reader reads through (it opens none itself).
            raw = disk.log.read(disk.tier.find(key), key.encode())
            assert raw is not None
            expected = decode_meta(raw[0], disk.stamp)
            compiled = proxy.plain_hits.answer_bytes(request("/p"), 0)
            if seen:  # read and answered by the compiled reader
                assert seen == [expected]
                assert compiled is not None and compiled[0] == len(request("/p"))
            else:  # declined: a record a plain hit may not be answered from, as parsed
                fresh = expected.initial_age < expected.lifetime < math.inf
                plain = expected.head is not None and "no-cache" not in expected.directives
                assert not (fresh and plain), expected
            disk.close()

    asyncio.run(check())
