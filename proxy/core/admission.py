"""Admission policies: which cacheable responses for missed keys get stored.

Rules this module keeps:

* A policy is asked once per cacheable response of a missed key (``admit``). Only a policy
  that ``observes`` (TinyLFU) also counts every request, hits included.
* The policies, each compiled (``proxy.core._native.Admission``, where its guarantees are
  stated), and the memory each keeps per key:
  - ``always`` admits everything: plain LRU, the baseline every report compares against.
  - ``second-hit`` admits a key only if it was already seen within the window: the first miss
    records it and says no. Concurrent misses of one key are separate sightings. About 10
    bits per key remembered (two generations, 1% false positives). ``second-hit:xN`` has a
    window N times as long (the auto window's keys, or the duration): what the tuner and the
    what-if compare a longer or shorter memory by.
  - ``nth-hit:N`` admits a key on its Nth sighting, counted in a count-min sketch that halves
    its counts every sketch-width of sightings ("nginx ``proxy_cache_min_uses N``" in 4 bytes
    per column, without a zone of 128 bytes per key).
  - ``tinylfu`` admits a candidate only when it has been requested more often than the entry
    it would evict (a doorkeeper Bloom filter, then a 4-row sketch; 4 bytes per column and
    about 1.2 bytes per key of doorkeeper).
  - ``probabilistic:P`` admits each miss with probability P; ``size-below:BYTES`` admits
    responses smaller than BYTES. No memory per key: the baselines papers compare with.
  - ``adaptive`` lets ``always``, ``second-hit`` and ``tinylfu`` decide side by side and
    follows the one whose sampled shadow cache hits most (``AdaptivePolicy``).
  - ``auto`` is a disk tier's (``proxy.core.disk``): the disk family side by side, each with
    a sampled ghost tier, following the one that hits within a margin of the best while
    writing least. A memory tier refuses it (its ``adaptive`` is the memory's).
* A policy is named by ``parse_policy``: the one definition of names and parameters that
  the proxy's config, the simulator's flags and experiment files all use. An unknown name is
  an error that lists the known ones and the closest match.
* ``window="auto"`` sizes each filter generation for the number of objects the cache holds when
  full (read from the store at every rotation, smoothed, clamped to ``[min_keys, max_keys]``, times
  ``auto_scale``), so what is remembered follows the cache's turnover. ``max_window`` seconds still
  bound how long anything is remembered.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from proxy.core._native import Admission
from proxy.core.names import unknown_name
from proxy.core.store import CacheStore
from proxy.core.units import parse_size
from proxy.core.window import FilterStats, WindowedBloomFilter, shared_window_bytes

if TYPE_CHECKING:
    from proxy.core.window import SharedMemory


class AdmissionPolicy(Protocol):
    name: str
    observes: bool

    def admit(self, key: str, size: int, now: float) -> bool:
        """True if a cacheable response of ``size`` bytes for missed ``key`` should be stored."""
        ...

    def observe(self, key: str, size: int, now: float) -> None:
        """One request of ``key`` (hit or miss) of ``size`` bytes, once its size is known;
        called only when ``observes``."""
        ...

    def filter_stats(self) -> FilterStats | None:
        """Health of the policy's filter, if it has one."""
        ...

    def policy_stats(self) -> dict[str, int]:
        """The policy's own state: its sketch's bytes and halvings, its decisions."""
        ...

    def reset(self, now: float) -> None:
        """Forget what the policy has learnt."""
        ...


def key_sample(policy: AdmissionPolicy, key: int) -> None:
    """Have ``policy`` choose the keys it samples (``adaptive``'s shadows, ``auto``'s ghost
    tiers) by the secret ``key`` (``proxy.core.native.sample.h``: 0 leaves them unkeyed, as
    the simulator samples), so that no client can choose what they see. A policy that samples
    nothing takes no key."""
    if isinstance(policy, CompiledPolicy):
        policy.native.sample_key = key


class CompiledPolicy:
    """A policy of the compiled core (``proxy.core._native.Admission``), which the simulator's
    loop drives directly; ``window`` is second hit's filter."""

    def __init__(
        self, name: str, native: Admission, window: WindowedBloomFilter | None = None
    ) -> None:
        self.name = name
        self.native = native
        self.window = window
        self.observes = native.kind in ("tinylfu", "adaptive", "auto")
        self.admit = native.admit
        self.observe = native.observe

    def filter_stats(self) -> FilterStats | None:
        return self.window.stats() if self.window is not None else None

    def policy_stats(self) -> dict[str, int]:
        n = self.native
        return {
            "sketch_bytes": n.sketch_bytes,
            "sketch_halvings": n.halvings,
            "policy_admitted": n.admitted,
            "policy_rejected": n.rejected,
        }

    def reset(self, now: float) -> None:
        if self.window is not None:
            self.window.clear(now)
        self.native.reset()


def compiled_admission(policy: AdmissionPolicy) -> Admission:
    """The compiled policy a loop drives (the simulator's, a disk tier's ``auto``): the
    policy's own."""
    if not isinstance(policy, CompiledPolicy):
        raise ValueError(f"the simulator has no compiled loop for admission {policy.name!r}")
    return policy.native


class AdaptivePolicy(CompiledPolicy):
    """``adaptive``: the candidates of ``ADAPTIVE_CANDIDATES`` decide side by side; the one
    whose shadow cache (``ADAPTIVE_RATE`` of the keys, in as much of the bytes) hits most
    decides for the store (the rules are in ``proxy.core._native``). Memory: each candidate's
    own, plus shadows of a sixteenth of the store's entries, keys only."""

    def __init__(
        self, native: Admission, candidates: list[CompiledPolicy], name: str = "adaptive"
    ) -> None:
        window = next((c.window for c in candidates if c.window is not None), None)
        super().__init__(name, native, window)
        self.candidates = candidates

    @property
    def choice(self) -> str:
        """The candidate deciding now."""
        return self.candidates[self.native.choice].name

    def policy_stats(self) -> dict[str, int]:
        n = self.native
        sketch = sum(c.native.sketch_bytes for c in self.candidates)
        return {
            "sketch_bytes": sketch,
            "sketch_halvings": sum(c.native.halvings for c in self.candidates),
            "policy_admitted": n.admitted,
            "policy_rejected": n.rejected,
            "adaptive_choice": n.choice,
            "adaptive_switches": n.switches,
        }

    def reset(self, now: float) -> None:
        for candidate in self.candidates:
            candidate.reset(now)


class TurnoverSizer:
    """Keys per generation for ``window="auto"``: the objects the cache holds, smoothed and clamped.

    ``objects`` is read at each rotation; an exponentially weighted mean (weight ``smoothing`` on
    the new reading) keeps one odd reading from swinging the window.
    """

    def __init__(
        self,
        objects: Callable[[], int],
        scale: float = 1.0,
        min_keys: int = 1024,
        max_keys: int = 50_000_000,
        smoothing: float = 0.5,
    ) -> None:
        if not scale > 0:
            raise ValueError(f"auto_scale must be positive, got {scale!r}")
        if not 1 <= min_keys <= max_keys:
            raise ValueError(f"need 1 <= min_keys <= max_keys, got {min_keys!r}, {max_keys!r}")
        self._objects = objects
        self.scale = scale
        self.min_keys = min_keys
        self.max_keys = max_keys
        self._smoothing = smoothing
        self._mean: float | None = None
        self._empty = min_keys  # keys asked for while the store holds nothing

    def initial(self) -> int:
        return self.min_keys

    def __call__(self) -> int:
        reading = self._objects()
        if reading > 0:
            if self._mean is None:
                self._mean = float(reading)
            else:
                self._mean += self._smoothing * (reading - self._mean)
        if self._mean is None:
            # Nothing held yet, so nothing to size by: remember twice as long each time, or a
            # policy that needs several sightings (nth-hit:4 in front of an empty disk) may
            # forget every key before its Nth and never hold one.
            self._empty = min(self.max_keys, self._empty * 2)
            return self._empty
        return min(self.max_keys, max(self.min_keys, round(self.scale * self._mean)))


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Parameters of the admission policy; ``window`` is seconds or ``"auto"``."""

    policy: str = "second-hit"
    window: float | str = "auto"
    capacity: int = 1_000_000
    fp_rate: float = 0.01
    generations: int = 2
    max_window: float = 3600.0
    auto_scale: float = 1.0
    min_keys: int = 1024
    max_keys: int = 50_000_000

    def __post_init__(self) -> None:
        """Every setting checked where it is made, whoever makes it (the proxy's config, the
        simulator's flags, an experiment file): ValueError names the setting."""
        parse_policy(self.policy)
        if self.window != "auto" and not _positive(self.window):
            raise ValueError(f"window = {self.window!r}: expected 'auto' or a positive duration")
        for name in ("capacity", "min_keys", "max_keys"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} = {value!r}: expected a whole number >= 1")
        if not isinstance(self.generations, int) or self.generations < 2:
            raise ValueError(f"generations = {self.generations!r}: expected a whole number >= 2")
        if not _number(self.fp_rate) or not 0 < self.fp_rate < 1:
            raise ValueError(f"fp_rate = {self.fp_rate!r}: expected a number between 0 and 1")
        for name in ("max_window", "auto_scale"):
            if not _positive(getattr(self, name)):
                raise ValueError(f"{name} = {getattr(self, name)!r}: expected a positive number")
        if self.min_keys > self.max_keys:
            raise ValueError(f"min_keys = {self.min_keys} is above max_keys = {self.max_keys}")

    def as_policy(self, policy: str) -> AdmissionConfig:
        """``policy`` as a cache that compares it with this one admits by it: this one's
        settings (its window and the rest) when it is this policy or a multiple of its window
        (``second-hit:x4`` beside ``second-hit``), else its defaults."""
        if parse_policy(policy)[0] == parse_policy(self.policy)[0]:
            return replace(self, policy=policy)
        return AdmissionConfig(policy=policy)

    def resolved(self) -> AdmissionConfig:
        """These settings with ``second-hit:xN`` spelled out: plain second hit whose window
        remembers N times as long, its keys (``auto_scale``; ``capacity``, the keys a fixed
        window or a shared one holds) and its time (``window``, ``max_window``) alike."""
        name, times = parse_policy(self.policy)
        if name != "second-hit" or times is None:
            return self
        return replace(
            self, policy=name, auto_scale=self.auto_scale * times,
            capacity=math.ceil(self.capacity * times), max_window=self.max_window * times,
            window=self.window if self.window == "auto" else float(self.window) * times,
        )  # fmt: skip

    def scaled(self, rate: float) -> AdmissionConfig:
        """These settings for a cache ``rate`` times as large, fed ``rate`` of the keys: key
        counts scale, times do not (a key's reuse interval is the same in a sample)."""
        return replace(
            self,
            capacity=max(1, round(self.capacity * rate)),
            min_keys=max(1, round(self.min_keys * rate)),
            max_keys=max(1, round(self.max_keys * rate)),
        )

    def label(self) -> str:
        """A short name for reports: ``always``, ``second-hit(auto)``, ``second-hit(auto x2)``,
        ``nth-hit:3``..."""
        c = self.resolved()
        if c.policy != "second-hit":
            return c.policy
        if c.window != "auto":
            return f"{c.policy}({_seconds_label(float(c.window))})"
        return f"{c.policy}(auto)" if c.auto_scale == 1.0 else f"{c.policy}(auto x{c.auto_scale:g})"


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return _number(value) and 0 < value < math.inf  # type: ignore[operator]


def _seconds_label(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _always(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    return CompiledPolicy("always", Admission("always"))


def _second_hit(
    config: AdmissionConfig,
    store: CacheStore,
    shared: SharedMemory | None = None,
    objects: Callable[[], int] | None = None,
) -> AdmissionPolicy:
    name, config = config.policy, config.resolved()
    g = config.generations
    if config.window == "auto":
        sizer = _turnover(config, objects or store.estimated_capacity_objects)
        # Shared, the memory is laid out once: ``capacity`` keys' bits, the share within it.
        keys = config.capacity if shared is not None else sizer.initial() * (g - 1)
        window = WindowedBloomFilter(
            keys, config.fp_rate, config.max_window, g, sizer=sizer, shared=shared
        )
    else:
        window = WindowedBloomFilter(
            config.capacity, config.fp_rate, _seconds(config), g, shared=shared
        )
    return CompiledPolicy(name, Admission("second-hit", window=window), window)


# The fewest sightings a promotion filter remembers per generation: a memory tier of a few
# objects still tells a record hit again at once from one hit once.
PROMOTION_MIN_KEYS = 64


def promotion_filter(admission: AdmissionPolicy, store: CacheStore) -> AdmissionPolicy | None:
    """What a hit from a tier behind ``store`` must pass, beside ``admission``, to be kept in
    the store too: None when the store admits everything (``always``); else a second hit
    within about the store's turnover, a filter whose generations are sized, at each rotation,
    by the objects the store holds (at least ``PROMOTION_MIN_KEYS``). A record whose hits are
    further apart than the store could keep it is then not copied up on every hit: copying
    it would only evict another."""
    if admission.name == "always":
        return None
    config = AdmissionConfig(window="auto", min_keys=PROMOTION_MIN_KEYS)
    return _second_hit(config, store)


def _seconds(config: AdmissionConfig) -> float:
    seconds = float(config.window)
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"window must be 'auto' or a positive duration, got {config.window!r}")
    return seconds


def shared_window_size(config: AdmissionConfig) -> int:
    """The bytes of shared memory the policy's window takes when processes share it (see
    ``make_policy``); 0 for a policy with no window to share."""
    config = config.resolved()
    if parse_policy(config.policy)[0] != "second-hit":
        return 0
    return shared_window_bytes(config.capacity, config.fp_rate, config.generations)


def _turnover(config: AdmissionConfig, objects: Callable[[], int]) -> TurnoverSizer:
    return TurnoverSizer(
        objects,
        scale=config.auto_scale,
        min_keys=config.min_keys,
        max_keys=config.max_keys,
    )


def _sketch_keys(config: AdmissionConfig, store: CacheStore) -> tuple[int, TurnoverSizer | None]:
    """Columns of a sketch, and what re-sizes it: the cache's objects when the window is
    ``auto``, else the configured key capacity."""
    if config.window == "auto":
        sizer = _turnover(config, store.estimated_capacity_objects)
        return sizer.initial(), sizer
    return config.capacity, None


def _nth_hit(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    _, n = parse_policy(config.policy)
    keys, sizer = _sketch_keys(config, store)
    native = Admission("nth-hit", keys=keys, threshold=int(n), sizer=sizer)
    return CompiledPolicy(config.policy, native)


def _tinylfu(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    keys, sizer = _sketch_keys(config, store)
    native = Admission("tinylfu", index=store.index, keys=keys, sizer=sizer)
    return CompiledPolicy("tinylfu", native)


def _probabilistic(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    _, p = parse_policy(config.policy)
    return CompiledPolicy(config.policy, Admission("probabilistic", probability=float(p)))


def _size_below(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    _, limit = parse_policy(config.policy)
    return CompiledPolicy(config.policy, Admission("size-below", limit=int(limit)))


def _whole_number(text: str) -> int:
    if not text.isdecimal() or not 1 <= int(text) <= 255:
        raise ValueError("N is a whole number from 1 to 255, as in nth-hit:3")
    return int(text)


def _times(text: str) -> float:
    digits = text[1:]
    times = float(digits) if text.startswith("x") and digits.replace(".", "", 1).isdecimal() else 0
    if not 1 / 16 <= times <= 16:
        raise ValueError("xN is the window's multiple, from 1/16 to 16, as in second-hit:x4")
    return times


def _probability(text: str) -> float:
    try:
        p = float(text)
    except ValueError:
        p = -1.0
    if not 0.0 < p <= 1.0:
        raise ValueError("P is a probability above 0 and at most 1, as in probabilistic:0.1")
    return p


def _bytes(text: str) -> int:
    size = parse_size(text)
    if size < 1:
        raise ValueError("BYTES is a size of at least one byte, as in size-below:64KiB")
    return size


ADAPTIVE_CANDIDATES = ("always", "second-hit", "tinylfu")
ADAPTIVE_RATE = 1 / 16
ADAPTIVE_PERIOD = 256  # sampled requests between two comparisons of the shadows
ADAPTIVE_MARGIN = 0.002  # of a period's requests: the lead a candidate needs to take over


def _adaptive(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    candidates, shadows, shadow_policies = [], [], []
    for name in ADAPTIVE_CANDIDATES:
        candidate = make_policy(replace(config, policy=name), store)
        capacity = max(1, round(store.capacity_bytes * ADAPTIVE_RATE))
        shadow = CacheStore(capacity, eviction=store.eviction)
        shadow_policy = make_policy(replace(config, policy=name).scaled(ADAPTIVE_RATE), shadow)
        assert isinstance(candidate, CompiledPolicy) and isinstance(shadow_policy, CompiledPolicy)
        candidates.append(candidate)
        shadows.append(shadow.index)
        shadow_policies.append(shadow_policy.native)
    native = Admission(
        "adaptive",
        candidates=tuple(c.native for c in candidates),
        shadows=tuple(shadows),
        shadow_policies=tuple(shadow_policies),
        rate=ADAPTIVE_RATE,
        overhead=store.entry_overhead,
        period=ADAPTIVE_PERIOD,
        margin=ADAPTIVE_MARGIN,
        choice=ADAPTIVE_CANDIDATES.index("second-hit"),
    )
    return AdaptivePolicy(native, candidates)


def _disk_only(config: AdmissionConfig, store: CacheStore) -> AdmissionPolicy:
    raise ValueError(
        "admission 'auto' is a disk tier's ([disk] policy): for the memory tier, 'adaptive' "
        "follows the best of always, second-hit and tinylfu"
    )


# name -> (factory, parameter parser or None, the name written with its parameter)
POLICIES: dict[str, tuple[Callable[[AdmissionConfig, CacheStore], AdmissionPolicy],
                          Callable[[str], float] | None, str]] = {
    "always": (_always, None, "always"),
    "second-hit": (_second_hit, _times, "second-hit"),
    "nth-hit": (_nth_hit, _whole_number, "nth-hit:N"),
    "tinylfu": (_tinylfu, None, "tinylfu"),
    "probabilistic": (_probabilistic, _probability, "probabilistic:P"),
    "size-below": (_size_below, _bytes, "size-below:BYTES"),
    "adaptive": (_adaptive, None, "adaptive"),
    "auto": (_disk_only, None, "auto"),
}  # fmt: skip
# Policies whose parameter may be left out: second-hit is second-hit:x1.
OPTIONAL_PARAMETER = frozenset({"second-hit"})


def parse_policy(text: object) -> tuple[str, float | None]:
    """(name, parameter) of a policy written ``name`` or ``name:parameter``; ValueError says
    what is wrong, listing the known policies for an unknown name."""
    if not isinstance(text, str):
        raise ValueError(f"a policy is a name like 'second-hit' or 'nth-hit:3', got {text!r}")
    name, _, arg = text.partition(":")
    if name not in POLICIES:
        forms = [form for _, _, form in POLICIES.values()]
        raise ValueError(unknown_name("admission policy", text, forms))
    _, parse, form = POLICIES[name]
    if parse is None:
        if arg:
            raise ValueError(f"admission policy {name!r} takes no parameter, got {text!r}")
        return name, None
    if name in OPTIONAL_PARAMETER and ":" not in text:
        return name, None
    if not arg and name not in OPTIONAL_PARAMETER:
        raise ValueError(f"admission policy {name!r} needs its parameter: {form}")
    try:
        return name, parse(arg)
    except ValueError as exc:
        raise ValueError(f"admission policy {text!r}: {exc}") from None


def make_policy(
    config: AdmissionConfig,
    store: CacheStore,
    *,
    shared: SharedMemory | None = None,
    objects: Callable[[], int] | None = None,
) -> AdmissionPolicy:
    """The policy ``config.policy`` names, wired to ``store``; ValueError names the known ones.
    ``shared``: memory (``shared_window_size`` of it) that the processes of one machine share:
    second hit's window is theirs together (other policies keep their own state), sized by
    ``window = "auto"`` for ``objects``, the objects the machine's cache holds (default: the
    store's)."""
    name, _ = parse_policy(config.policy)
    if shared is not None and name == "second-hit":
        return _second_hit(config, store, shared, objects)
    return POLICIES[name][0](config, store)
