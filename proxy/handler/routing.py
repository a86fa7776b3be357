"""Which origin a request goes to, the limits it must keep, and the fields the origin gets.

* Only configured origins are ever contacted. CONNECT and TRACE are refused (405); an
  absolute-form target must name a routed host, and a Host no route names is refused (421)
  unless a default origin is set. Versions other than HTTP/1.0 and 1.1 get a 505; a target
  past ``[server] max_url_length`` a 414, fields past ``max_header_size`` a 431, a transfer
  coding other than chunked a 501.
* The cache key is ``http://`` + host (lower-cased, default port dropped) + path and query as
  received, or the query's parameters that ``[cache] key_query`` keeps (``KeyQuery``); the
  origin gets the target as received either way.
* Transparent: every end-to-end request field reaches the origin, except, on a GET or HEAD,
  the fields of ``[server] deny_headers`` (those that rewrite the target, method or host: cache
  poisoning), or only ``[server] forward_headers`` when that is an allow-list. Hop-by-hop fields
  are stripped; ``Via`` and ``X-Forwarded-For/-Proto/-Host`` replace what the client sent.
"""

from __future__ import annotations

import functools
import re
from itertools import chain
from urllib.parse import urlsplit

from aiohttp import HttpVersion10, HttpVersion11, web
from multidict import CIMultiDictProxy

from proxy.config.settings import Config
from proxy.core import rfc9110
from proxy.core.cached import VIA
from proxy.core.cachekey import KeyQuery
from proxy.core.events import CLIENT_ASKS, RequestMeta
from proxy.core.tags import TAG_FIELDS
from proxy.handler.answers import plain, refuse_version
from proxy.origin.servers import ServerGroup
from proxy.wire import trace

# Fields the proxy writes itself; what a client sends of them is replaced, never trusted (a
# client cannot pose as another hop).
FORWARDING = frozenset({"via", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"})
# And the proxy's own request field, which may hold its trace token (``proxy.wire.trace``).
_CLIENT_DROPS = rfc9110.HOP_BY_HOP | FORWARDING | {trace.FIELD.lower()}
# Client fields never passed on: the origin's Host is its own (from its URL), and a body the
# proxy has in hand needs no 100 Continue from the origin.
_NEVER_SENT = frozenset({"host", "expect"})
_VERSIONS = frozenset({HttpVersion10, HttpVersion11})
# What a whole-object fetch (or a revalidation) never sends of the client's fields.
_NOT_SENT_WHOLE = _NEVER_SENT | CLIENT_ASKS


class Router:
    """The routes and limits of one configuration: what a request becomes on its way to the
    origin."""

    def __init__(self, config: Config) -> None:
        self.take(config)

    def take(self, config: Config) -> None:
        """Read the routes and limits of ``config``: at the start, and again at a reload (the
        same object, so every part holding it routes by the new ones)."""
        self.routes = config.route_table()
        cache = config.cache
        self.hidden = hidden_fields(config)
        self.key_query = _key_query(cache.key_query, cache.key_query_sort)
        # A route's own key_query, where it sets one (or its sort).
        self.key_queries = {
            route.host: _key_query(
                route.key_query or cache.key_query,
                cache.key_query_sort if route.key_query_sort is None else route.key_query_sort,
            )
            for route in config.routes
            if route.key_query is not None or route.key_query_sort is not None
        }
        self.max_url = config.server.max_url_length
        self.max_headers = config.server.max_header_size
        forward = config.server.forward_headers
        self.allowed = None if forward == ("*",) else frozenset(forward)
        self.denied = frozenset(config.server.deny_headers)
        # What ``upstream_headers`` leaves out of a GET or HEAD when every field may pass
        # but the denied ones and no stored response's Vary names a field: names alone, by
        # whether the fetch is whole.
        denied = self.denied - FORWARDING
        self._left_out = {
            True: rfc9110.HOP_BY_HOP | _NOT_SENT_WHOLE | denied,
            False: rfc9110.HOP_BY_HOP | _NEVER_SENT | denied,
        }

    def route_label(self, host: str | None) -> str:
        """The route a request naming ``host`` took, for a metric's label: its route's host,
        ``default`` for the default origin, ``none`` when it had none."""
        pair = None if host is None else hosts(host)
        if pair is not None and pair[0] in self.routes and pair[0]:
            return pair[0]
        return "default" if "" in self.routes else "none"

    def route(self, request: web.BaseRequest) -> tuple[RequestMeta, str] | web.StreamResponse:
        """The request as the engine sees it and the origin URL it goes to; or the answer
        refusing it."""
        if request.version not in _VERSIONS:
            return refuse_version(request)
        if len(request.raw_path) > self.max_url:
            return plain(414, f"request target longer than {self.max_url} bytes")
        if fields_size(request.raw_headers) > self.max_headers:
            return plain(431, f"request header fields larger than {self.max_headers} bytes")
        if request.method in ("CONNECT", "TRACE"):
            return plain(405, f"{request.method} is refused: this is a reverse proxy")
        coding = request.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            return plain(501, "only the chunked transfer coding is implemented", close=True)
        absolute = not request.raw_path.startswith("/")
        target = urlsplit(request.raw_path) if absolute else None
        host_pair = hosts(target.netloc if target is not None else request.host)
        if host_pair is None:
            return plain(400, "invalid Host")
        origin = self.origin(host_pair[0], absolute=absolute)
        if origin is None:
            return plain(421, f"no route for host {host_pair[0]!r}")
        path = request.rel_url.raw_path_qs if absolute else request.raw_path
        meta = self.meta(request.method, host_pair, path, request.headers, request.remote or "",
                         request.scheme)  # fmt: skip
        return meta, origin + path

    def origin(self, route_host: str, *, absolute: bool = False) -> str | None:
        """The origin a request naming ``route_host`` goes to: its route's, else (for an
        origin-form target) the default origin's; None when it has none."""
        origin = self.routes.get(route_host)
        if origin is None and not absolute:
            return self.routes.get("")
        return origin

    @property
    def queries_as_sent(self) -> bool:
        """Whether every route keys a target's query as received."""
        return self.key_query.identity and all(k.identity for k in self.key_queries.values())

    def meta(
        self,
        method: str,
        host_pair: tuple[str, str],
        path: str,
        fields: CIMultiDictProxy[str],
        remote: str,
        scheme: str,
    ) -> RequestMeta:
        """The engine's view of a request: its key, method and the fields the origin gets."""
        # What the origin receives of Via and X-Forwarded-*, in place of anything the client
        # sent: Vary selects variants on these values too.
        forwarding = (
            ("Via", VIA),
            ("X-Forwarded-For", remote),
            ("X-Forwarded-Proto", scheme),
            ("X-Forwarded-Host", host_pair[1]),
        )
        # Indexed once: the cache's rules read these fields about a dozen times per miss. The
        # client's hop-by-hop fields go first, so its Connection can name only its own fields
        # away, never the ones the proxy adds.
        fields_sent = rfc9110.end_to_end_fields(fields.items(), _CLIENT_DROPS, forwarding)
        return RequestMeta(self.key(host_pair, path), method, fields_sent)

    def key(self, host_pair: tuple[str, str], target: str) -> str:
        """The cache key of ``target`` (path and query as received) on a host (``hosts``):
        its route's ``key_query``, else ``[cache]``'s."""
        route_host, key_host = host_pair
        key_query = self.key_queries.get(route_host, self.key_query)
        return key_origin(key_host) + key_query.key(target)

    def url_key(self, url: str) -> str:
        """The cache key of an absolute ``http://host[:port]/path?query`` URL, as a request
        for it is keyed (ValueError for a host the proxy would refuse)."""
        return self.key(*_host_and_target(url))

    def upstream_headers(
        self,
        meta: RequestMeta,
        *,
        whole: bool,
        extra: tuple[tuple[str, str], ...] = (),
        keep: frozenset[str] = frozenset(),
    ) -> list[tuple[str, str]]:
        """The fields sent to the origin: the client's end-to-end ones (for a GET/HEAD, less
        the denied ones, or only the allowed ones), without what a whole-object fetch answers
        itself, plus ``extra``, and the forwarding fields ``meta`` carries. ``keep``: fields
        that pass whatever the lists say (those a stored response's Vary names)."""
        filtered = meta.method in ("GET", "HEAD")
        if filtered and not extra and not keep and self.allowed is None:
            # The rules below only leave names out then: all of them in the hop-by-hop pass.
            return rfc9110.end_to_end(meta.headers, self._left_out[whole])
        drop = _NOT_SENT_WHOLE if whole or extra else _NEVER_SENT
        if extra:
            drop = drop | {k.lower() for k, _ in extra}
        denied, allowed = self.denied, self.allowed
        headers = []
        for k, v in rfc9110.end_to_end(meta.headers):
            low = k.lower()
            if low in drop:
                continue
            if (
                filtered
                and low not in keep
                and low not in FORWARDING
                and (low in denied or (allowed is not None and low not in allowed))
            ):
                continue
            headers.append((k, v))
        headers.extend(extra)
        return headers


def key_origin(key_host: str) -> str:
    """What every cache key of a host (``hosts``' second item) begins with; the key is this
    and the keyed target (``Router.key``). The compiled hit path joins the same two parts."""
    return f"http://{key_host}"


def cache_key(url: str) -> str:
    """A key prefix given as an absolute ``http://host[:port]/path`` URL (a purge by prefix),
    keyed as a request's key begins: its host as ``Router.key`` keys it, its path as given
    (no ``key_query``: a prefix is not a target to narrow). ValueError for a host the proxy
    would refuse."""
    host_pair, target = _host_and_target(url)
    return key_origin(host_pair[1]) + target


def _host_and_target(url: str) -> tuple[tuple[str, str], str]:
    """(``hosts`` of the host, path and query) of an absolute URL; ValueError for a host the
    proxy would refuse."""
    _, _, rest = url.partition("://")
    host, slash, target = rest.partition("/")
    host_pair = hosts(host)
    if host_pair is None:
        raise ValueError(f"not a valid host: {host!r}")
    return host_pair, slash + target


_HOST = re.compile(
    r"(?P<name>\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+)"
    r"(?::(?P<port>[0-9]{0,5}))?",
    re.ASCII,
)


# A DNS name (253 characters at most) and a port: anything longer is no host.
_HOST_MAX = 253 + len(":65535")


def hosts(host: str) -> tuple[str, str] | None:
    """(route host, key host) of a Host value (RFC 3986 3.2.2: a reg-name or an IP literal,
    ASCII only), lower-cased by ASCII rules; the key keeps a non-default port. None when it is
    not a valid host: ``/`` or ``@`` in it, a non-ASCII letter that would fold onto another
    host's name (the Kelvin sign onto ``k``), an unbracketed IPv6 address, too long a name."""
    return None if len(host) > _HOST_MAX else _parsed_host(host)


@functools.lru_cache(maxsize=1024)  # few distinct Hosts, each on every request; short ones only
def _parsed_host(host: str) -> tuple[str, str] | None:
    match = _HOST.fullmatch(host.strip())
    if match is None:
        return None
    name = match["name"].lower()
    port = match["port"] or ""
    key = name if port in ("", "80") else f"{name}:{port}"
    return name.strip("[]"), key


def hidden_fields(config: Config) -> frozenset[str]:
    """Stored fields clients are not given: the purge tags' ([cache] strip_surrogate_keys)."""
    return TAG_FIELDS if config.cache.strip_surrogate_keys else frozenset()


def _key_query(setting: tuple[str, tuple[str, ...]], sort: bool) -> KeyQuery:
    mode, names = setting
    return KeyQuery(mode, frozenset(names), sort)


def fields_size(raw: tuple[tuple[bytes, bytes], ...]) -> int:
    """Bytes of a request's header fields as sent: names, values, ": " and CRLF."""
    return sum(map(len, chain.from_iterable(raw))) + 4 * len(raw)


def server_groups(config: Config) -> dict[str, ServerGroup]:
    """The server groups of ``config``'s routes of several servers, by the origin their URLs
    are built with (``Upstream.groups``)."""
    return {
        route.origin: ServerGroup(
            route.servers, route.max_fails, route.fail_timeout, probe=route.probe
        )
        for route in config.routes
        if route.servers
    }
