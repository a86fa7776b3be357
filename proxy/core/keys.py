"""The store's keys, one scheme for every tier and both drivers.

* A URL's own entry is stored under the URL (its key, ``proxy.core.cachekey``).
* Every part stored of a URL (a variant, a slice, the anchors a tier finds them after) is
  stored under the URL, ``PART`` and the part's name, and so is named the URL's own record
  alone, without its parts (``tiers.own_record``, a name for ``forget``). ``PART`` is
  NUL, which no URL holds (a request target or Host with one is refused), so the URL a key
  is of, and whether it names a whole URL, are read from the key alone.
"""

from __future__ import annotations

PART = "\0"


def part_key(url: str, *names: str) -> str:
    """The key of the part of ``url`` named ``names`` (joined by ``PART``)."""
    return url + PART + PART.join(names)


def url_of(key: str) -> str:
    """The URL a store key is of."""
    return key.partition(PART)[0]


def whole_url(key: str) -> bool:
    """Whether ``key`` names a URL (with everything stored of it), not one stored part."""
    return PART not in key


def shown_key(key: str) -> str:
    """A store key as an operator reads it: a part's separator (NUL) as `` | ``."""
    return key.replace(PART, " | ")
