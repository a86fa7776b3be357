"""Evictions by name, with their knobs: what ``[cache] eviction``, the simulator's
``--eviction`` and the tuner's candidates name.

A name is a family (``EVICTIONS``), alone for its defaults (libCacheSim's), or with knobs
after colons: ``s3fifo:small=0.05:move=1`` (a colon, not a comma: a list of
names is comma-separated). The knobs (``KNOBS``, the ones a family has):

* ``small``: the entry queue's share of the bytes: S3-FIFO's small queue (0.1),
  W-TinyLFU's window (0.01), 2Q's Ain (0.25); from 0.001 to 0.99 (S3-FIFO and 2Q keep
  nothing larger than it).
* ``ghost``: the ghost queue's share of the bytes, keys only: S3-FIFO's (0.9), 2Q's Aout
  (0.5); from 0 to 4.
* ``move``: the hits that move an entry from S3-FIFO's small queue to main (2); 1 to 3.

A knob set to its family's default is the family's default: ``s3fifo:small=0.1`` is named
``s3fifo`` (``Eviction.name``), so one policy has one name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.core.names import unknown_name

EVICTIONS = ("lru", "s3fifo", "sieve", "wtinylfu", "twoq")
KNOBS: dict[str, dict[str, float]] = {
    "lru": {},
    "sieve": {},
    "s3fifo": {"small": 0.1, "ghost": 0.9, "move": 2},
    "wtinylfu": {"small": 0.01},
    "twoq": {"small": 0.25, "ghost": 0.5},
}
# Each knob's range: its test (NaN fails each), and the words an error says it in.
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "small": (lambda v: 0.001 <= v <= 0.99, "from 0.001 to 0.99"),
    "ghost": (lambda v: 0 <= v <= 4, "from 0 to 4"),
    "move": (lambda v: 1 <= v <= 3, "1, 2 or 3"),
}


@dataclass(frozen=True)
class Eviction:
    """An eviction family and the knobs set away from its defaults (None: the default)."""

    family: str
    small: float | None = None
    ghost: float | None = None
    move: int | None = None

    @property
    def name(self) -> str:
        """The one name of this policy: its family, and the knobs set, in ``KNOBS`` order."""
        # Twelve digits: two knobs that differ are two names (``:g`` merged past six).
        knobs = [f"{k}={getattr(self, k):.12g}" for k in KNOBS[self.family]
                 if getattr(self, k) is not None]  # fmt: skip
        return ":".join((self.family, *knobs))

    def arguments(self) -> dict[str, float]:
        """The knobs set, as ``StoreIndex`` and its ``reshape`` take them."""
        return {k: getattr(self, k) for k in KNOBS[self.family] if getattr(self, k) is not None}


def eviction(text: str) -> Eviction:
    """The eviction ``text`` names; ValueError naming what is wrong and what is expected."""
    if not isinstance(text, str):
        raise ValueError(f"an eviction is named by a string, got {text!r}")
    family, _, rest = text.partition(":")
    family = family.strip()
    if family not in EVICTIONS:
        raise ValueError(unknown_name("eviction", family, EVICTIONS))
    knobs = KNOBS[family]
    if rest and not knobs:
        raise ValueError(f"eviction {family!r} has no knobs: name it {family!r}")
    set_: dict[str, float | int | None] = {}
    if text.endswith(":"):
        raise ValueError(
            f"eviction {text!r}: a knob after each colon, as {family}:small=0.05"
            if knobs
            else f"eviction {family!r} has no knobs: name it {family!r}"
        )
    for part in rest.split(":") if rest else ():
        part = part.strip()
        knob, eq, value = part.partition("=")
        knob = knob.strip()
        if not eq or knob not in knobs:
            raise ValueError(
                f"eviction {family!r} takes knobs {', '.join(f'{k}=' for k in knobs)}"
                f" (as {family}:{next(iter(knobs))}={next(iter(knobs.values())):g}), got {part!r}"
            )
        if knob in set_:
            raise ValueError(f"eviction {text!r} sets {knob} twice")
        set_[knob] = _knob(family, knob, value.strip())
    for knob, value in list(set_.items()):
        if value == knobs[knob]:
            set_[knob] = None  # the default: one policy, one name
    return Eviction(family, **set_)  # type: ignore[arg-type]


def _knob(family: str, knob: str, text: str) -> float | int:
    try:
        value: float | int = int(text) if knob == "move" else float(text) + 0.0  # -0 is 0
    except ValueError:
        value = float("nan")
    within, said = _RANGES[knob]
    if not within(value):
        raise ValueError(f"{family}'s {knob} is {said}, got {text!r}")
    return value
