"""The origin client: one aiohttp session for the proxy's life, bodies passed through untouched.

It never decompresses (bodies go to clients byte for byte, with their Content-Encoding), never
follows redirects, and maps failures to what the client must get: an origin that cannot be
reached is a 502, one that does not answer in time a 504.
"""

from __future__ import annotations

import aiohttp

from proxy.config import UpstreamSection


class UpstreamError(Exception):
    """The origin failed before a response began; ``status`` is what the client gets."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Upstream:
    def __init__(self, config: UpstreamSection) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        c = self._config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=c.total_timeout, connect=c.connect_timeout, sock_read=c.read_timeout
            ),
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=c.max_connections, ttl_dns_cache=60),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: aiohttp.StreamReader | bytes | None = None,
    ) -> aiohttp.ClientResponse:
        """Send the request; the response's headers have arrived, its body is still to read."""
        assert self._session is not None, "Upstream.start() was not awaited"
        try:
            return await self._session.request(
                method, url, headers=headers, data=body, allow_redirects=False
            )
        except TimeoutError as exc:
            raise UpstreamError(504, f"origin timed out ({type(exc).__name__})") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(502, f"origin unreachable ({exc.os_error})") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(502, f"origin failed ({type(exc).__name__}: {exc})") from exc
