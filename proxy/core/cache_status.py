"""The ``Cache-Status`` values this cache writes (RFC 9211): every one built here, so that what a
response says the cache did has one spelling, whichever path answered it.

* ``hit``: answered from a stored response, with its ``ttl`` (seconds of freshness left,
  negative when served stale) where known, and a ``detail`` naming the tier or the rule
  (``disk``, ``slices``, ``stale-if-error``, ``grace``).
* ``forwarded``: the request went to the origin, ``fwd`` saying why (the engine's reasons,
  ``proxy.core.events.FWD_*``: ``uri-miss``, ``stale``, ``bypass``, ``method``,
  ``request``...); then ``fwd-status`` (the origin's status, when it differs from the one
  sent), ``collapsed`` (answered from another request's fetch), and ``stored`` (with
  ``detail=ttl-rule`` when an operator's TTL rule set its lifetime) or a ``detail`` saying
  why the response was not.
* ``refused``: not forwarded at all (``detail``: ``client-left``).

The compiled hit path writes the bytes of ``hit(ttl)`` and ``hit(ttl, DISK)`` itself; the tests
of the plain hits hold its answers equal to the Python paths', which build them here.
"""

from __future__ import annotations

from proxy.core.events import Keep, NotStored

CACHE = "onehit"
HIT = f"{CACHE}; hit"  # what every hit begins with
HIT_TTL = f"{HIT}; ttl="  # what a hit with a ttl begins with (the compiled path's too)
DISK = "disk"
SLICES = "slices"
STALE_IF_ERROR = "stale-if-error"
GRACE = "grace"  # [cache] grace: stale past what the response allows, every origin failing
ORIGIN_ERROR = "origin-error"
ERROR = "error"  # the proxy failed: an internal error answered 500
SLICE_MEMORY = "slice-memory"  # [cache] slice_memory stayed full: the slice was not fetched
CLIENT_LEFT = "client-left"  # the client went before its request was forwarded
TTL_RULE = "ttl-rule"  # an operator's TTL rule set how long it is fresh, or that it is stored


def ttl_of(lifetime: float, age: float) -> int:
    """A hit's ``ttl``: the seconds of freshness it has left, truncated toward zero (0 in the
    first second past its freshness, negative after), as the compiled hit path's ``render``
    writes it too."""
    return int(lifetime - age)


def hit(ttl: int | None = None, detail: str | None = None) -> str:
    """A response answered from a stored one."""
    value = HIT if ttl is None else f"{HIT_TTL}{ttl}"
    return value if detail is None else f"{value}; detail={detail}"


def forwarded(
    fwd: str,
    *,
    outcome: object = None,
    detail: str | None = None,
    fwd_status: int | None = None,
    collapsed: bool = False,
) -> str:
    """A response the origin was asked for (``fwd``: why); ``outcome``, the engine's decision
    on it: ``stored``, or (a ``NotStored``) its reason as the detail."""
    value = f"{CACHE}; fwd={fwd}"
    if fwd_status is not None:
        value += f"; fwd-status={fwd_status}"
    if collapsed:
        value += "; collapsed"
    if type(outcome) is NotStored:
        detail = outcome.reason
    elif outcome is not None:
        value += "; stored"
        if type(outcome) is Keep and outcome.response.by_rule and detail is None:
            detail = TTL_RULE
    return value if detail is None else f"{value}; detail={detail}"


def refused(detail: str) -> str:
    """A request answered without a stored response or the origin."""
    return f"{CACHE}; detail={detail}"
