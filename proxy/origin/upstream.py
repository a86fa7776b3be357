"""The origin client: requests to plain-HTTP origins whose body, if any, is in hand go through
the proxy's own pool (``proxy.origin.pool``: aiohttp's response parser without its session), the
rest (a body still arriving, an HTTPS origin) through one aiohttp session; bodies pass through
untouched either way.

It never decompresses (bodies go to clients byte for byte, with their Content-Encoding), never
follows redirects, and maps failures to what the client must get: an origin that cannot be
reached is a 502, one that does not answer in time a 504. Every failure is logged with its cause.

Pooled connections are dropped after ``idle_timeout`` seconds unused, below the keep-alive
timeouts origins commonly use (Node's 5 s), so the proxy rarely sends on a connection the origin
has already closed. When it does, and the request failed before any byte of a response, it is
sent once more on a new connection, if it can be: it has no body, or its body is in hand
(bytes), not a stream already partly consumed. A route of several servers (``groups``) sends
each request to the server its group picks, and a GET or HEAD to the next while one fails
before any byte of its response (``proxy.origin.servers``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp.http import HttpProcessingError

from proxy.config.settings import UpstreamSection
from proxy.origin.health import OriginHealth, origin_of
from proxy.origin.pool import Interim, OriginPool, OriginResponse, Sent, Unreachable
from proxy.origin.servers import ServerGroup
from proxy.wire.trace import shown_origin, step, traced_now

log = logging.getLogger("onehit.upstream")

# What ``Upstream.request`` returns: the pool's response or the session's, read the same way.
UpstreamResponse = aiohttp.ClientResponse | OriginResponse

# Failures of a connection the origin closed or reset before answering.
_STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class UpstreamError(Exception):
    """The origin failed before a response began; ``status`` and ``public`` are what the
    client gets, ``detail`` (with the origin's address) is for the log only."""

    def __init__(self, status: int, public: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.public = public
        self.detail = detail


class Upstream:
    def __init__(self, config: UpstreamSection) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        # Each origin's recent outcomes (``proxy.origin.health``): the pool's answers taken
        # whole are recorded where they are taken, the rest here.
        self.health = OriginHealth()
        self._pool = OriginPool(config, self.health)
        # Routes of several servers (``proxy.origin.servers``), by the origin their URLs are
        # built with (``settings.servers_origin``): a request to it goes to the group's pick.
        # Set by ``use_groups``, which runs their probes.
        self.groups: dict[str, ServerGroup] = {}
        self._probes: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        c = self._config
        common = {
            "timeout": aiohttp.ClientTimeout(
                total=c.total_timeout, connect=c.connect_timeout, sock_read=c.read_timeout
            ),
            "auto_decompress": False,
            # A field the client did not send is not made up for it: aiohttp's client adds
            # these four otherwise (Content-Type only to a request with a body).
            "skip_auto_headers": ("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            "cookie_jar": aiohttp.DummyCookieJar(),
            "read_bufsize": c.read_buffer,
        }
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=c.max_connections, ttl_dns_cache=60, keepalive_timeout=c.idle_timeout
            ),
            **common,
        )
        # Retries go out on a connection of their own, never on another pooled one that may
        # have gone stale at the same moment.
        self._fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=c.max_connections, force_close=True), **common
        )

    def use_groups(self, groups: dict[str, ServerGroup]) -> None:
        """Send the requests of routes of several servers through ``groups`` from now on, and
        probe the servers of those that have a probe (the last groups' probes stop)."""
        for task in self._probes:
            task.cancel()
        self.groups = groups
        loop = asyncio.get_running_loop()
        self._probes = [loop.create_task(self._probe(group)) for group in groups.values()
                        if group.probe is not None]  # fmt: skip

    async def _probe(self, group: ServerGroup) -> None:
        """Ask each of ``group``'s servers its probe, every interval, each within the
        interval or the connect and read timeouts, whichever is shorter; what it answers (or
        a failure) is the group's to judge (``ServerGroup.probed``)."""
        probe = group.probe
        assert probe is not None
        c = self._config
        within = min(probe.interval, c.connect_timeout + c.read_timeout)
        timeout = aiohttp.ClientTimeout(total=within)
        async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(),
                                         auto_decompress=False) as session:  # fmt: skip

            async def ask(url: str) -> None:
                try:
                    async with session.get(url + probe.path, allow_redirects=False) as r:
                        await r.read()
                        answered = r.status == probe.expect
                except (aiohttp.ClientError, TimeoutError, OSError):
                    answered = False
                group.probed(url, answered)

            async def every_interval(url: str) -> None:  # a server that hangs delays no other
                while True:
                    await ask(url)
                    await asyncio.sleep(probe.interval)

            await asyncio.gather(*(every_interval(server.url) for server in group.servers))

    @property
    def unasked(self) -> int:
        """New origin connections closed unused: the origin spoke before it was asked."""
        return self._pool.unasked

    async def close(self) -> None:
        for task in self._probes:
            task.cancel()
        self._pool.close()
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()

    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | bytes | None = None,
        *,
        sent: Sent | None = None,
        interim: Interim | None = None,
    ) -> UpstreamResponse:
        """Send the request (``sent``: ``send_now`` already wrote it, and its answer did not
        come whole); the response's headers have arrived, its body is still to read.
        ``interim`` is given the interim (1xx) responses before it, from a plain-HTTP origin
        (aiohttp's session, for the others, reads them past)."""
        assert self._session is not None and self._fresh is not None, "start() was not awaited"
        group = self.groups.get(_origin(url)) if self.groups else None
        if group is not None:
            return await self._across(group, method, url, headers, body, interim)
        response = await self._request(method, url, headers, body, sent, interim)
        self.health.answered(origin_of(url), method, response.status)
        if traced_now():  # its arguments cost a miss something: only when traced
            step("origin", server=shown_origin(_origin(url)), status=response.status)
        return response

    async def _across(
        self,
        group: ServerGroup,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | bytes | None,
        interim: Interim | None,
    ) -> UpstreamResponse:
        """``request`` to a route's servers: to the one the group picks, and, for a GET or
        HEAD whose body is in hand, to the next one while a server fails before any byte of
        its response (nginx's ``proxy_next_upstream error timeout``), each once."""
        path = url[len(_origin(url)) :]
        again = method in ("GET", "HEAD") and (body is None or isinstance(body, bytes))
        tried: set[str] = set()
        while True:
            server = group.pick(tried)
            assert server is not None  # the first pick always finds one
            try:
                response = await self._request(method, server + path, headers, body, None,
                                               interim)  # fmt: skip
            except UpstreamError as exc:
                step("origin", server=shown_origin(server), failed=str(exc))
                group.failed(server)
                tried.add(server)
                if not again or len(tried) == len(group.servers):
                    raise
                log.warning("%s %s: trying the route's next server", method, path)
                continue
            group.succeeded(server)
            self.health.answered(origin_of(server), method, response.status)
            if traced_now():
                step("origin", server=shown_origin(server), status=response.status)
            return response

    async def _request(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | bytes | None,
        sent: Sent | None,
        interim: Interim | None,
    ) -> UpstreamResponse:
        assert self._session is not None and self._fresh is not None
        replayable = body is None or isinstance(body, bytes)
        try:
            if sent is not None:
                return await self._pool.resume(sent, interim)
            if (body is None or isinstance(body, bytes)) and self._pool.serves(url):
                return await self._pool.request(method, url, headers, body, interim)
            try:
                return await self._session.request(
                    method, url, headers=headers, data=body, allow_redirects=False
                )
            except _STALE_CONNECTION as exc:
                if isinstance(exc, aiohttp.ClientConnectorError) or not replayable:
                    raise
                log.info(
                    "%s %s: %r on a pooled connection; retrying on a new one", method, url, exc
                )
                return await self._fresh.request(
                    method, url, headers=headers, data=body, allow_redirects=False
                )
        except Exception as exc:
            error = _failure(method, url, exc)
            if error is None:
                raise
            self.health.failed(origin_of(url), method, streamed_body=not replayable)
        try:
            raise error
        finally:
            # The traceback holds this frame: without this, each error would be a reference
            # cycle, freed only by the cyclic collector, and with it the request's body.
            del error

    def send_now(self, method: str, url: str, headers: list[tuple[str, str]]) -> Sent | None:
        """``request`` for a bodiless request, written at once on an idle pooled connection;
        None, having done nothing, when it cannot be (then ``request`` it)."""
        if self.groups and _origin(url) in self.groups:  # the group picks in ``request``
            return None
        return self._pool.send_now(method, url, headers) if self._pool.serves(url) else None


def _origin(url: str) -> str:
    """The scheme and authority ``url`` begins with, as a route's origin is written."""
    end = url.find("/", url.find("//") + 2)
    return url if end < 0 else url[:end]


def _failure(method: str, url: str, exc: Exception) -> UpstreamError | None:
    """What the client gets for a failure of the origin, logged with its cause; None for any
    other exception."""
    if isinstance(exc, TimeoutError):
        error = UpstreamError(504, "origin timed out", f"timed out ({type(exc).__name__})")
    elif isinstance(exc, (aiohttp.ClientConnectorError, Unreachable)):
        error = UpstreamError(502, "origin unreachable", f"unreachable ({exc.os_error})")
    elif isinstance(exc, (aiohttp.ClientError, HttpProcessingError)):
        error = UpstreamError(502, "origin failed", f"failed ({type(exc).__name__}: {exc})")
    else:
        return None
    log.warning("%s %s: origin %s", method, url, error.detail)
    return error
