"""A configuration read again while serving (SIGHUP, ``POST /reload``): taken by the requests
that start after it, with no connection dropped and nothing cached lost but what a smaller
memory tier evicts and what the new rules key or fetch otherwise (purged: ``KEYED``).

What a reload may change (``LIVE``, and for one process ``LIVE_ADMISSION``): the routes and
the default origin, the TTL rules (for the responses stored from then on), the fields passed
to origins, ``purge_from``, the memory tier's size
(shrunk by evicting, as its policy evicts) and largest object, ``hit_for_miss``, ``grace``,
``client_revalidation``, ``max_variants``, ``ignore_cookies`` and the cache key's query, the
listener's TLS certificate and key (read again on every reload, so that one renewed in place
is taken by the next handshakes; TLS turned on or off takes a restart), and the admission
policy of one process (its window starts afresh: every URL is a first sighting
again). A process of its own also moves its listeners to new addresses (``LISTENERS``): the
new ones open first, then the old ones close, the connections they accepted going on.
Anything else (the request limits, which aiohttp's parser takes at the start, the disk tier,
the workers, a shared admission filter, the origin client's limits, the logs; under
``--workers``, the listeners) takes a restart (under ``--workers``, what ``ROLLING`` names is
taken by replacing the workers one at a time): a reload that changes it is refused, naming
the keys, and so is one whose configuration does not load, or whose new address cannot be
had; either way the running configuration stays, whole.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, is_dataclass, replace

from proxy.config.settings import Config, ConfigError, Route, TuneSection
from proxy.handler.routing import key_origin
from proxy.handler.server import Proxy
from proxy.ops import preflight

log = logging.getLogger("onehit")

# section.key names a reload takes on; "routes" is the whole route table, "ttl" every rule.
LIVE = frozenset(
    {
        "routes",
        "ttl",
        "upstream.origin",
        "server.forward_headers",
        "server.deny_headers",
        "server.purge_from",
        "cache.size",
        "cache.max_object_size",
        "cache.hit_for_miss",
        "cache.grace",
        "cache.client_revalidation",
        "whatif.sample",
        "whatif.policies",
        "whatif.disk_policies",
        # The tuner begins afresh at its first choice (its memory tier reshaped to it).
        # Every key of it: one added to [tune] is live too, never a restart by omission.
        *(f"tune.{f.name}" for f in fields(TuneSection)),
        "cache.max_variants",
        "cache.ignore_cookies",
        "cache.key_query",
        "cache.key_query_sort",
        # A certificate renewed (certbot), or moved: loaded for the next handshakes. TLS
        # turned on or off takes a restart (``judge``).
        "server.tls_cert",
        "server.tls_key",
    }
)
# What a cache key is made of, or a stored answer was fetched with: a reload that changes one
# purges what the old rules stored (``keys_built_otherwise``). Every one is in ``LIVE``.
KEYED = frozenset(
    {
        "routes",
        "upstream.origin",
        "server.forward_headers",
        "server.deny_headers",
        "cache.key_query",
        "cache.key_query_sort",
        # Which cookies leave a request shared: a response stored for a user is not.
        "cache.ignore_cookies",
    }
)
# What a worker takes only as it starts, and a --workers parent gives by replacing its workers
# one at a time, each drained first (``Workers.roll``): the request and origin limits, the
# access log, the memory tier's eviction; its size and largest object with a disk tier
# (without one, the tier in /dev/shm is sized by them).
ROLLING = frozenset(
    {f"server.{key}" for key in ("max_url_length", "max_header_size", "access_log",
                                 "access_log_format", "access_log_file", "access_log_buffer",
                                 "access_log_flush", "idle_timeout", "send_timeout",
                                 "fast_hits", "body_buffer_size", "body_timeout",
                                 "max_streamed_uploads")}
    | {f"upstream.{key}" for key in ("connect_timeout", "read_timeout", "total_timeout",
                                     "single_flight_wait", "max_connections", "idle_timeout",
                                     "read_buffer")}
    | {"cache.eviction"}
)  # fmt: skip
# The listeners' addresses: moved by a process of its own (a worker's port is the machine's).
LISTENERS = frozenset({"server.listen", "admin.listen"})
# What each worker of a --workers parent is given by the parent (its share of the memory
# tier): they take a restart there.
SIZES = frozenset({"cache.size", "cache.max_object_size"})
# The admission policy of one process, whose window is its own.
LIVE_ADMISSION = frozenset(
    f"admission.{key}"
    for key in ("policy", "window", "expected_urls", "fp_rate", "generations", "max_window",
                "auto_scale")
)  # fmt: skip


# Why a process started from a configuration in hand (a test's, an embedding program's) cannot
# reload: it has nothing to read again.
NO_SOURCE = "this process was given its configuration, and has none to read again"
STOPPING = "the proxy is stopping: it drains what it has, and takes no new configuration"


@dataclass(frozen=True)
class Reloaded:
    """What a reload did: the keys it changed, or why it changed nothing (``refused``)."""

    changed: tuple[str, ...] = ()
    refused: str = ""
    # Key prefixes purged from every tier: what is stored under them was keyed or fetched by
    # rules the reload changed ("": every key).
    purged: tuple[str, ...] = ()
    # Under --workers, the workers replaced one at a time to take what they take only as
    # they start (``ROLLING``): how many.
    replacing: int = 0

    def as_json(self) -> dict[str, object]:
        if self.refused:
            return {"reloaded": False, "error": self.refused}
        answer: dict[str, object] = {"reloaded": True, "changed": list(self.changed),
                                     "purged": list(self.purged)}  # fmt: skip
        if self.replacing:
            answer["replacing"] = self.replacing
        return answer


def changed_keys(old: Config, new: Config) -> list[str]:
    """The section.key names whose values differ ("routes" for the route table), secrets
    compared too."""
    keys = []
    for section in fields(Config):
        a, b = getattr(old, section.name), getattr(new, section.name)
        if not is_dataclass(a):
            keys += [section.name] if a != b else []
            continue
        keys += [f"{section.name}.{f.name}" for f in fields(a)
                 if getattr(a, f.name) != getattr(b, f.name)]  # fmt: skip
    return keys


async def reload(
    proxy: Proxy,
    read: Callable[[], Config],
    *,
    shares_admission: bool,
    rebind: Callable[[Config], Awaitable[None]] | None = None,
) -> Reloaded:
    """Read the configuration again (``read``) and give ``proxy`` what changed, or nothing:
    ``shares_admission``, the admission window is shared with other processes (then it takes
    a restart too); ``rebind`` moves the listeners to the new configuration's addresses
    (OSError when one cannot listen there: then nothing changes), or, None, they take a
    restart."""
    live = LIVE if shares_admission else LIVE | LIVE_ADMISSION
    if rebind is not None:
        live |= LISTENERS
    new, done = judge(proxy.config, read, live)
    if new is None:
        return done
    if LISTENERS & set(done.changed):
        assert rebind is not None
        try:
            await rebind(new)
        except OSError as exc:
            return _refused(f"cannot listen where the configuration says: {exc}")
    purged = keys_built_otherwise(proxy.config, new)
    proxy.reconfigure(new)
    for prefix in purged:
        proxy.engine.removals.purge("prefix", prefix, proxy.clock())
    disk = proxy.disk
    if purged and disk is not None and disk.sharing is None:  # a machine's parent keeps them
        disk.key_rules(key_rules(new), purge=False)
    log.info("reloaded: %s", ", ".join(done.changed) if done.changed else "nothing changed")
    if purged:
        log.info("reloaded: purged what is stored under %s, keyed or fetched by other rules",
                 ", ".join(repr(p) for p in purged))  # fmt: skip
    return replace(done, purged=purged)


def key_rules(config: Config) -> str:
    """A fingerprint of what ``config`` keys and fetches by (``KEYED``), as a disk tier keeps
    it (``DiskStore.key_rules``): the same for two configurations only when no stored answer
    of one may be wrong under the other."""
    values = [(section, getattr(getattr(config, section), key)) for section, _, key in
              (name.partition(".") for name in sorted(KEYED - {"routes"}))]  # fmt: skip
    routes = [_keyed(route) for route in sorted(config.routes, key=lambda route: route.host)]
    text = repr((values, routes))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def keys_built_otherwise(old: Config, new: Config) -> tuple[str, ...]:
    """The key prefixes whose stored answers ``new`` keys or fetches otherwise than ``old``
    did (``KEYED``): every key ("") when anything but the routes changed there (the default
    origin, the default key rules and the fields sent to origins reach every host without a
    route of its own); else, for each route added, removed, or given another origin or key
    rules, its host's keys. What is stored under them was keyed or fetched by rules no longer
    in force, and must not answer."""
    changed = KEYED.intersection(changed_keys(old, new))
    if changed - {"routes"}:
        return ("",)
    if not changed:
        return ()
    before = {route.host: _keyed(route) for route in old.routes}
    after = {route.host: _keyed(route) for route in new.routes}
    hosts = sorted(h for h in before.keys() | after.keys() if before.get(h) != after.get(h))
    # A key's host carries its port when not the default one.
    return tuple(p for h in hosts for p in (key_origin(h) + "/", key_origin(h) + ":"))


def judge(
    old: Config, read: Callable[[], Config], live: frozenset[str]
) -> tuple[Config | None, Reloaded]:
    """The configuration ``read`` gives, when it loads and changes only ``live`` keys of
    ``old`` (with what changed); else None, and why (logged)."""
    try:
        new = read()
        preflight.check(new)
    except ConfigError as exc:
        return None, _refused(str(exc))
    if new.admission.backend != "memory":
        live -= LIVE_ADMISSION
    keys = changed_keys(old, new)
    restart = [k for k in keys if k not in live]
    if bool(old.server.tls_cert) != bool(new.server.tls_cert):  # the listener's kind changes
        restart += [k for k in ("server.tls_cert", "server.tls_key") if k in keys]
    if restart:
        return None, _refused(f"{', '.join(restart)} changed, which takes a restart")
    return new, Reloaded(tuple(keys))


def _keyed(route: Route) -> str:
    """What of ``route`` its keys are made of or its answers fetched with (its servers' list,
    weights and health settings are not), written as a route was before it had servers, so
    that a disk tier's fingerprint (``key_rules``) of a route without them is unchanged."""
    return (f"Route(host={route.host!r}, origin={route.origin!r}, "
            f"key_query={route.key_query!r}, key_query_sort={route.key_query_sort!r})")  # fmt: skip


def _refused(why: str) -> Reloaded:
    log.error("reload refused, the running configuration stays: %s", why)
    return Reloaded(refused=why)
