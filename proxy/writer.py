"""How the proxy's answers carry what they relay: the writer of every answer to a client, the
server that gives it to each request, and the responses that relay an origin's.

aiohttp's parsers decode a field value's bytes with ``surrogateescape``, so a byte that is not
UTF-8 comes through as a lone surrogate; aiohttp's header serializer drops lone surrogates,
and refuses (an error, so a 500) any control character but HTAB. An origin's
``X-Name: caf\\xe9`` would reach the client as ``caf``, and ``a\\x01b`` not at all. A proxy
passes what it relays as it came, so ``FieldWriter`` writes a head's fields back as the bytes
that were parsed. It still refuses a CR or LF in the status line or a field: those would
split the head (RFC 9110 section 5.5; a NUL never gets past aiohttp's parsers).

aiohttp, as an origin server, also gives a body sent without a Content-Type one of
``application/octet-stream`` (RFC 9110 section 8.3 lets a recipient assume that type). A
proxy that did so would decide for the client: without the field a client may look at the
body to tell its type, as a browser does to render a page the origin sent untyped, and with a
made-up octet-stream it would download it instead. It adds its own ``Server`` too, which
names the origin's software (RFC 9110 section 10.2.4; the proxy says what it is in ``Via``).
``Relayed`` and ``RelayedWhole`` answer with the fields they were given and those the proxy
sets (``Date`` where missing, section 6.6.1), neither of those two.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs, web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict

from proxy.core._native import field_lines


class FieldWriter(StreamWriter):
    """aiohttp's writer, whose heads carry their field values byte for byte."""

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        lines = field_lines(headers.items())
        if lines is None or "\r" in status_line or "\n" in status_line:
            raise ValueError(f"a line break in the head of {status_line!r}")
        # Held until the first body bytes or the end, as aiohttp's writer holds its head.
        self._headers_buf = f"{status_line}\r\n{lines}\r\n".encode("utf-8", "surrogateescape")
        self._headers_written = False


class ProxyServer(web.Server):
    """``web.Server`` whose requests answer through a ``FieldWriter``."""

    def _make_request(
        self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any
    ) -> web.BaseRequest:
        writer = FieldWriter(protocol, self._loop)  # in place of the plain one aiohttp made
        return web.BaseRequest(message, payload, protocol, writer, task, self._loop)


class Relayed(web.StreamResponse):
    """A response relaying another's head: aiohttp adds no Content-Type or Server to it."""

    async def _prepare_headers(self) -> None:
        headers = self.headers
        made_up = [name for name in (hdrs.CONTENT_TYPE, hdrs.SERVER) if name not in headers]
        await super()._prepare_headers()
        for name in made_up:
            headers.popall(name, None)


class RelayedWhole(Relayed, web.Response):
    """``Relayed`` with its body in hand, as ``web.Response``."""
