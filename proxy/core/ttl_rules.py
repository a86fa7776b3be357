"""The operator's TTL rules (``[[ttl]]``), as nginx's ``proxy_cache_valid`` and Varnish's
``default_ttl`` and ``beresp.ttl`` give them: how long a response stays fresh, where the origin
says nothing or too much.

Rules this module keeps:

* A rule is for a host (a route's, or every host), a path prefix and a set of statuses; the
  first rule that matches a response's URL and status is its rule, and a response no rule
  matches is judged by RFC 9111 alone.
* The origin wins by default: ``default`` is the lifetime of a response that gives none
  (no ``s-maxage``, ``max-age`` or ``Expires``: the operator's default stands in for the
  Last-Modified heuristic, and makes a status storable that only explicit freshness would,
  such as a 302). ``min`` and ``max`` are a floor and a cap on the lifetime in force,
  whoever set it.
* Directives that forbid storing or serving stored are overridden only when named in
  ``override``: ``no-store``, ``no-cache`` (stored and served fresh for its lifetime, never
  revalidated on each use) and ``private``, which no rule overrides unless it names it. A
  response carrying one not named is judged as RFC 9111 says. The response's fields pass to
  clients as the origin sent them: a rule changes what the cache does, not what it says.
* A rule never makes storable what answers its own request (206, 304, 412, 416), a response
  that must be understood and is not, or one refused for the request's sake (a method, a
  request's ``no-store``, an ``Authorization`` or cookie, a ``Set-Cookie``, ``Vary: *``).
* Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.core import rfc9111
from proxy.core.keys import url_of
from proxy.core.rfc9110 import Headers

# The statuses a rule is for when it names none: nginx's ``proxy_cache_valid`` without codes.
DEFAULT_STATUSES = frozenset({200, 301, 302})
# The directives a rule may override, and the refusal reasons they stand behind.
OVERRIDABLE = ("no-store", "no-cache", "private")
# Statuses no rule may be for: each answers its own request (RFC 9111 section 3).
NEVER_RULED = rfc9111.ANSWERS_ITS_REQUEST | {206}


@dataclass(frozen=True)
class TtlRule:
    """One rule: for ``host`` ("" every host), URLs whose path begins with ``path``, and
    ``statuses`` (None: any status a rule may be for)."""

    host: str = ""
    path: str = "/"
    statuses: frozenset[int] | None = DEFAULT_STATUSES
    default: float | None = None
    min: float | None = None
    max: float | None = None
    override: frozenset[str] = frozenset()

    def matches(self, host: str, path: str, status: int) -> bool:
        return (
            (not self.host or self.host == host)
            and path.startswith(self.path)
            and (status in self.statuses if self.statuses is not None else True)
            and status not in NEVER_RULED
        )


@dataclass(frozen=True)
class Ruled:
    """A response as its rule leaves it: whether it may be stored and why not, its
    lifetime, the directives in force for the cache, and whether the rule changed any."""

    storable: bool
    reason: str
    lifetime: float
    directives: rfc9111.Directives
    by_rule: bool


def host_and_path(key: str) -> tuple[str, str]:
    """The host (without port) and path of a store key's URL."""
    rest = url_of(key).partition("://")[2]
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    host = host[: host.find("]") + 1] if host.startswith("[") else host.partition(":")[0]
    return host.lower(), (slash + path.partition("?")[0]) if slash else "/"


class TtlRules:
    """The rules in order; ``rule_for`` the first that matches."""

    def __init__(self, rules: Sequence[TtlRule] = ()) -> None:
        self.rules = tuple(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule_for(self, key: str, status: int) -> TtlRule | None:
        if not self.rules:
            return None
        host, path = host_and_path(key)
        for rule in self.rules:
            if rule.matches(host, path, status):
                return rule
        return None


def rule_response(
    rule: TtlRule,
    status: int,
    headers: Headers,
    storable: bool,
    reason: str,
    lifetime: float,
    directives: rfc9111.Directives,
) -> Ruled:
    """What ``rule`` makes of a response RFC 9111 judged ``storable`` (or not, for
    ``reason``), its overridden directives judged as if absent (``rfc9111.storable``'s
    ``overridden``), with ``lifetime`` and ``directives`` (see the module's rules)."""
    by_rule = False
    overridden = {name for name in rule.override if name in directives}
    if overridden:
        directives = {k: v for k, v in directives.items() if k not in overridden}
        by_rule = True
    explicit = rfc9111.explicit_freshness(headers, directives)
    if not storable:
        # A status storable only with explicit freshness, which the operator's default gives.
        if not (
            reason == "status"
            and rule.default is not None
            and not explicit
            and "must-understand" not in directives
        ):
            return Ruled(False, reason, lifetime, directives, False)
        storable, reason, by_rule = True, "", True
    if not explicit and rule.default is not None:
        lifetime, by_rule = rule.default, True
    if rule.min is not None and lifetime < rule.min:
        lifetime, by_rule = rule.min, True
    if rule.max is not None and lifetime > rule.max:
        lifetime, by_rule = rule.max, True
    return Ruled(storable, reason, lifetime, directives, by_rule)


def trace_lifetime(rule: TtlRule | None, ttl: float) -> float:
    """The lifetime of a trace's response under ``rule`` (its key's, ``TtlRules.rule_for``
    of a 200): the simulator's response is a 200 with ``max-age=ttl`` (an infinite ``ttl``:
    one that gives no freshness of its own, which a rule's ``default`` then sets, and which
    never expires without one, the simulator's model), judged as a live response is
    (``rule_response``)."""
    if rule is None:
        return ttl
    headers = (("Cache-Control", f"max-age={ttl:.0f}"),) if math.isfinite(ttl) else ()
    directives = rfc9111.response_directives(headers)
    return rule_response(rule, 200, headers, True, "", ttl, directives).lifetime
