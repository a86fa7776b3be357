"""Which parameters of a request's query make up its cache key (``[cache] key_query``).

Rules this module keeps:

* ``"all"`` (the default): the target as received, query and all, untouched.
* ``"none"``: the path alone; ``{include = [...]}``: only the parameters named;
  ``{exclude = [...]}``: every parameter but those named. A parameter's name is what comes
  before its first ``=``, compared as an origin reads it (percent-decoded, ``+`` a space): a
  name that is sent encoded (``%69d``) is the parameter the origin reads (``id``), so it can
  neither slip past an include list into an object keyed without it nor stay keyed while
  excluded. The names of the setting are read the same way (``"size%5B%5D"`` is ``size[]``).
  A parameter that holds a ``;``, which some origins read as a separator (so
  ``utm_source=x;id=evil`` is two parameters to them), is always keyed, whole.
* An include list keeps, besides its names, every parameter that some origin reads as one of
  them: names that differ only in case (``ID``), that are encoded twice (``%2569d``), and
  those PHP reads as another: ``.``, a space or ``[`` as ``_`` (``i.d`` for ``i_d``), leading
  spaces skipped (``+id``), cut at a NUL (``id%00x``), an array (``id[]``, ``id[0]``). Kept,
  they only make more keys; left out, one of them would be the answer every client of
  ``?id=1`` gets. An
  exclude list drops only the names it gives, read once: dropping every reading of them
  would take parameters out of the key that an origin may read as others, which is the
  poisoning this guards against.
* What the key leaves out, the origin still reads: a parameter excluded from the key that the
  origin reflects into its answer poisons that answer for everyone, as an unkeyed header
  does. Exclude only what the origin ignores.
* ``key_query_sort``: the kept parameters in the order of their names (a stable sort: the
  values of one name keep their order, which an origin may read), so ``?b=1&a=2`` and
  ``?a=2&b=1`` are one object.
* Empty parameters (``&&``) and an empty query (``?`` alone) key as nothing once the query is
  rewritten; each kept parameter stays byte for byte as sent.
* Only the key changes: the origin is sent the target as the client sent it, unkeyed
  parameters included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote_plus

MODES = ("all", "none", "include", "exclude")


@dataclass(frozen=True, slots=True)
class KeyQuery:
    """One ``key_query`` setting: ``mode`` (of ``MODES``), the ``names`` include or exclude
    lists, and whether kept parameters are sorted."""

    mode: str = "all"
    names: frozenset[str] = frozenset()
    sort: bool = False
    _loose_names: frozenset[str] = field(default=frozenset(), init=False, repr=False,
                                         compare=False)  # fmt: skip

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"key_query {self.mode!r}: expected one of {', '.join(MODES)}")
        # A name compares as the origin reads it, in the setting as in the request: "size%5B%5D"
        # and "size[]" are one parameter, which no spelling may drop from (or add to) the key.
        object.__setattr__(self, "names", frozenset(unquote_plus(n) for n in self.names))
        loose = frozenset(reading for n in self.names for reading in _readings(n))
        object.__setattr__(self, "_loose_names", loose)

    @property
    def identity(self) -> bool:
        """Whether every target keys as received."""
        return self.mode == "all" and not self.sort

    def key(self, target: str) -> str:
        """What the cache key holds of ``target`` (a path and query as received)."""
        if self.identity:
            return target
        path, mark, query = target.partition("?")
        if not mark:
            return target
        if self.mode == "none":
            return path
        params = [p for p in query.split("&") if p]
        if self.mode == "include":
            loose = self._loose_names
            params = [p for p in params if ";" in p or not loose.isdisjoint(_readings(_name(p)))]
        elif self.mode == "exclude":
            params = [p for p in params if ";" in p or _read_name(p) not in self.names]
        if self.sort:
            params.sort(key=_name)
        return f"{path}?{'&'.join(params)}" if params else path


def _name(param: str) -> str:
    return param.partition("=")[0]


def _read_name(param: str) -> str:
    """The name of ``param`` as an origin reads it: percent-decoded, ``+`` a space."""
    return unquote_plus(_name(param))


# PHP reads these in a parameter's name as "_" (``i.d=1`` is ``$_GET["i_d"]``).
_AS_UNDERSCORE = str.maketrans(". [", "___")


def _readings(name: str) -> frozenset[str]:
    """The names an origin may read ``name`` as: percent-decoded until nothing changes, ``+``
    a space, case folded, and then as PHP reads it: leading spaces skipped, cut at a NUL,
    ``_`` for ``.``, space and ``[``, or the array ``i_d`` that ``i.d[...]`` names. Four rounds
    of decoding at most: a name encoded deeper is kept apart (more keys, never fewer), and no
    hostile name makes the key cost more than that."""
    for _ in range(4):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    name = name.casefold().lstrip(" ").partition("\0")[0]
    # PHP turns ``.`` and spaces into ``_`` before the first ``[`` as well: ``i.d[]`` is i_d.
    return frozenset((name.translate(_AS_UNDERSCORE),
                      name.partition("[")[0].translate(_AS_UNDERSCORE)))  # fmt: skip
