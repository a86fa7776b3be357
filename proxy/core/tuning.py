"""The tuner: the memory tier's eviction (family and knobs) and admission, chosen from ghosts
of every candidate fed the traffic the cache sees (``eviction = "auto"``).

Rules it keeps:

* Its candidates (``Choice``: an eviction's name and an admission policy; ``TuneSettings``)
  are each a ghost of the memory tier at its configured size, the compiled store and
  admission the proxy runs, fed a spatial sample (SHARDS) of ``sample`` of the keys through
  the simulator's own loop (``proxy.core.replay``), as the what-if's ghosts are.
* It judges every ``period`` sampled requests (by default about what a ghost holds: each
  period turns it over once), on each candidate's *recent* hits: those of the period just
  ended added to ``KEPT_EVIDENCE`` of those before, so the last twenty periods or so count
  and an old workload fades. None before ``warmup`` judgements: a ghost filling up says
  nothing of its policy.
* Hysteresis: the candidate with the most recent hits replaces the current choice only after
  it has led at ``patience`` judgements in a row, each time ahead of the current choice by
  more than ``margin`` of the recent sampled requests (its miss ratio lower by that much, as
  a fraction) and by more than the sample's noise (``NOISE`` standard errors). A candidate
  no better than the current one on the evidence is never chosen, and two within the margin
  never trade places.
* A ghost that holds fewer than ``MIN_SAMPLED_OBJECTS`` objects estimates nothing worth
  acting on: the tuner keeps its choice and says to sample more. A memory tier whose ghosts
  would hold that few at the largest sample ``MAX_GHOST_WORK`` allows is not tuned (``idle``):
  it keeps its first pair, recording next to nothing.
* A judgement is a function of the sampled requests alone, in order: the live proxy and the
  simulator, fed the same sampled requests, make the same choices at the same one. (The
  live proxy samples by a secret key, the simulator by the hash itself: at a rate below 1
  they sample other keys of the same traffic.)
* Bounded: each ghost holds ``sample`` of the keys the cache holds (27 to 54 bytes a key);
  ``len(choices)`` ghosts in all, and the last ``KEPT_DECISIONS`` decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from proxy.core.admission import AdmissionConfig, AdmissionPolicy, make_policy
from proxy.core.engine import CacheEngine
from proxy.core.evictions import eviction as parse_eviction
from proxy.core.replay import KeyArrays, build_engine, replay

# S3-FIFO with knobs S4-FIFO (OSDI'26) sets, 2Q at its defaults and with libCacheSim's tuned
# queues (Ain 10%, Aout 100%), W-TinyLFU with Caffeine's window and a larger one, as its
# climber moves it: those that were best at some size of CloudPhysics or Twitter52, of a
# grid twice as large (LRU, SIEVE and S3-FIFO's larger small queues never were).
EVICTIONS = (
    "s3fifo", "s3fifo:move=1", "s3fifo:small=0.01:move=1", "s3fifo:small=0.05",
    "s3fifo:small=0.2", "twoq", "twoq:small=0.1:ghost=1", "wtinylfu", "wtinylfu:small=0.2",
)  # fmt: skip
KEPT_DECISIONS = 32
# Objects a sampled cache must hold, at the sample's mean size, for its estimate to be taken:
# fewer, and a handful of keys decide its hit ratio (a 0.01 sample of 0.1% of Twitter52 is a
# 1.7 KiB cache, and was 5.5 points off, silently). The what-if's ghosts and the simulator's
# ``--sample`` say so too.
MIN_SAMPLED_OBJECTS = 100


def enough_rate(rate: float, held: float) -> float:
    """The sampling rate at which a sampled cache that holds ``held`` objects at ``rate``
    would hold twice ``MIN_SAMPLED_OBJECTS`` (a handful of sampled objects says little of the
    rest: from 25 held at 0.01, the rate for 100 came out at 0.053, which held 95), rounded
    up to two significant digits, 1 at most."""
    wanted = rate * 2 * MIN_SAMPLED_OBJECTS / max(held, 1e-9)
    scale = 10 ** (math.floor(math.log10(wanted)) - 1)
    return min(1.0, math.ceil(wanted / scale - 1e-9) * scale)


KEPT_EVIDENCE = 0.95  # of the hits before a period, the share the judgement after counts
NOISE = 2.0  # standard errors a lead must pass besides the margin
# ``sample = "auto"``: the requests whose sizes choose the rate, and the objects a ghost holds
# at it (a thousandth of the keys at least; every key for a cache of fewer objects).
SIZING = 2000
GHOST_OBJECTS = 2000
MIN_RATE = 0.001
# The ghosts' work a request may cost, in ghost lookups on average (the rate times the
# candidates): 32 ghosts fed every request cost a 1 KiB hit 13 us, more than the hit itself.
MAX_GHOST_WORK = 4.0
# ``period = "auto"``: sampled requests between two judgements, in what a ghost holds (each
# period turns a ghost over about that often), and the fewest.
TURNOVERS = 1
MIN_PERIOD = 500


@dataclass(frozen=True)
class Choice:
    """One candidate: how the memory tier evicts (an eviction's one name) and admits (a
    policy's name, ``second-hit`` as configured when that is the configured one)."""

    eviction: str
    admission: str

    @property
    def name(self) -> str:
        return f"{self.admission} / {self.eviction}"

    def as_json(self) -> dict[str, str]:
        return {"eviction": self.eviction, "admission": self.admission}


@dataclass(frozen=True)
class TuneSettings:
    """What the tuner chooses among and how cautiously: ``[tune]``."""

    evictions: tuple[str, ...] = EVICTIONS
    admissions: tuple[str, ...] = ()  # none: the configured one, second-hit and always
    sample: float | None = None  # None: chosen from the sizes seen (``SIZING``)
    period: int | None = None  # None: chosen from the sizes seen (``SIZING``)
    warmup: int = 1
    patience: int = 1
    margin: float = 0.005

    def __post_init__(self) -> None:
        if not self.evictions:
            raise ValueError("evictions: the tuner needs one to choose among")
        if self.sample is not None and not 0.0 < self.sample <= 1.0:
            raise ValueError(f"sample is in (0, 1], got {self.sample!r}")
        if self.period is not None and self.period < 100:
            raise ValueError(f"period is 100 sampled requests or more, got {self.period!r}")
        if self.warmup < 1:
            raise ValueError(f"warmup is 1 judgement or more, got {self.warmup!r}")
        if self.patience < 1:
            raise ValueError(f"patience is 1 judgement or more, got {self.patience!r}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin is in [0, 1), got {self.margin!r}")

    def choices(self, configured: str) -> tuple[Choice, ...]:
        """Every (eviction, admission) pair, each eviction by its one name, the admissions
        ``admissions``, or the ``configured`` one, second-hit and always; the first pair is
        the tuner's start."""
        names = dict.fromkeys(parse_eviction(e).name for e in self.evictions)
        admissions = self.admissions or (configured, "second-hit", "always")
        return tuple(Choice(e, a) for e in names for a in dict.fromkeys(admissions))


@dataclass(frozen=True)
class Decision:
    """A judgement that changed the choice: when (the judgement's number, the sampled
    requests so far and the last one's time), from what to what, and why."""

    judgement: int
    sampled: int
    at: float
    was: Choice
    chose: Choice
    reason: str

    def as_json(self) -> dict[str, object]:
        return {"judgement": self.judgement, "sampled": self.sampled, "at": self.at,
                "was": self.was.name, "chose": self.chose.name, "reason": self.reason}  # fmt: skip


class Tuner:
    """The judgement alone: each candidate's hits per period in, a ``Decision`` out when the
    evidence says so (the rules above)."""

    def __init__(self, choices: tuple[Choice, ...], settings: TuneSettings) -> None:
        self.choices = choices
        self.settings = settings
        self.current = 0
        self.judgements = 0
        self.recent_hits = np.zeros(len(choices))
        self.recent_requests = 0.0
        self.leader: int | None = None  # who led last, ahead by the margin, and how often
        self.led = 0
        self.said = "warming up"  # the last judgement, in words

    def judge(self, hits: np.ndarray, requests: int, held: np.ndarray | None) -> int | None:
        """One period's ``hits`` of each candidate over its ``requests`` (the same for all),
        and the objects each ghost holds (None: ghosts of every key, exact whatever they
        hold): the candidate to switch to, or None (``said`` tells why)."""
        self.recent_hits = self.recent_hits * KEPT_EVIDENCE + hits
        self.recent_requests = self.recent_requests * KEPT_EVIDENCE + requests
        self.judgements += 1
        s = self.settings
        if self.recent_requests <= 0:
            self.said = "no request sampled yet"
            return None
        if self.judgements <= s.warmup:
            self.said = f"warming up ({self.judgements} of {s.warmup} periods)"
            return None
        # Only a ghost that holds enough objects is a candidate: a handful of keys decide
        # the others' hits (one that cannot hold many, as size-below's, never is).
        enough = np.ones(len(self.choices), bool) if held is None else held >= MIN_SAMPLED_OBJECTS
        if not enough[self.current] or not enough.any():
            self.leader, self.led = None, 0
            few = self.choices[self.current if not enough[self.current] else 0].name
            self.said = (f"the ghost of {few} holds too few objects (under "
                         f"{MIN_SAMPLED_OBJECTS}) to judge by: raise [tune] sample")  # fmt: skip
            return None
        best = int(np.argmax(np.where(enough, self.recent_hits, -np.inf)))
        ahead = (self.recent_hits[best] - self.recent_hits[self.current]) / self.recent_requests
        # A lead within the noise of the sample is no evidence: ``NOISE`` standard errors
        # of a hit ratio over the recent sampled requests, or the margin, whichever is more.
        p = float(self.recent_hits[best] + self.recent_hits[self.current]) / (
            2 * self.recent_requests
        )  # the two pooled: a choice that hits nothing does not make the noise nothing
        noise = NOISE * math.sqrt(max(p * (1 - p), 1e-6) / self.recent_requests)
        if best == self.current or ahead <= max(s.margin, noise):
            self.leader, self.led = None, 0
            self.said = f"keeps {self.choices[self.current].name}: " + self._missing(best)
            if not enough.all():
                self.said += f"; {int((~enough).sum())} ghosts too small to judge"
            return None
        self.led = self.led + 1 if self.leader == best else 1
        self.leader = best
        if self.led < s.patience:
            self.said = (f"{self.choices[best].name} leads ({self.led} of {s.patience}): "
                         + self._missing(best))  # fmt: skip
            return None
        self.said = (f"chose {self.choices[best].name}: " + self._missing(best) +
                     f", ahead at {self.led} judgements in a row")  # fmt: skip
        self.leader, self.led, self.current = None, 0, best
        return best

    def miss_ratio(self, i: int) -> float | None:
        """Candidate ``i``'s recent miss ratio in the sample (None before any request)."""
        if not self.recent_requests:
            return None
        return 1.0 - float(self.recent_hits[i]) / self.recent_requests

    def _missing(self, best: int) -> str:
        now = self.miss_ratio(self.current)
        lead = self.miss_ratio(best)
        return (f"{self.choices[best].name} misses {lead:.4f}, "
                f"{self.choices[self.current].name} {now:.4f} of the recent sample")  # fmt: skip


class Tuning:
    """The candidates' ghosts and the tuner, fed sampled requests (``feed``) at ``rate``,
    for a memory tier of ``size`` bytes configured to admit by ``admission``. A driver sets
    ``apply``, called with the choice left and the new one as each is made, and may set
    ``make``, how it makes an admission policy (its shared window under ``--workers``)."""

    def __init__(
        self,
        size: int,
        admission: AdmissionConfig,
        settings: TuneSettings,
        max_object_bytes: int | None = None,
        entry_overhead: int = 0,
    ) -> None:
        self.size, self.admission, self.settings = size, admission, settings
        self.max_object_bytes, self.entry_overhead = max_object_bytes, entry_overhead
        self.apply: Callable[[Choice, Choice], None] | None = None
        self.make: Callable[[AdmissionConfig], AdmissionPolicy] | None = None
        self.choices = settings.choices(admission.policy)
        self.decisions: list[Decision] = []
        self.switches = 0
        self.failed: str | None = None  # why its driver stopped feeding it (it keeps its choice)
        self.idle: str | None = None  # why it does not judge: a memory tier too small to tune
        # ``sample`` or ``period`` "auto": chosen from the sizes of the first requests
        # (``SIZING``), every request sampled meanwhile unless the sample is given.
        self.sizes: dict[int, int] | None = None
        if settings.sample is None or settings.period is None:
            self.sizes = {}
        self.period: int | None = settings.period
        self._begin(1.0 if settings.sample is None else settings.sample)

    def _begin(self, rate: float, current: int = 0) -> None:
        """Ghosts at ``rate``, and a tuner of no judgement yet, at choice ``current``."""
        self.rate = rate
        self.tuner = Tuner(self.choices, self.settings)
        self.tuner.current = current
        self.ghosts = [
            build_engine(self.size, self.admission.as_policy(c.admission),
                         self.max_object_bytes, self.entry_overhead, c.eviction, rate=rate)
            for c in self.choices
        ]  # fmt: skip
        self.sampled = 0  # sampled requests fed at this rate
        self._judged_hits = np.zeros(len(self.choices), dtype=np.int64)
        self._judged_requests = 0

    @property
    def choice(self) -> Choice:
        return self.choices[self.tuner.current]

    def left(self) -> int:
        """Sampled requests until the next judgement (or, while sizes are learnt, until the
        rate is chosen): a driver's batch ends there at the latest."""
        if self.sizes is not None or self.period is None:
            return SIZING - self.sampled
        return self.period - self.sampled % self.period

    def feed(self, keys: KeyArrays, times: np.ndarray, sizes: np.ndarray) -> list[Decision]:
        """Sampled requests, in order, through every ghost, judged at each period's end; the
        decisions made. A batch ends where the learning of sizes does, if it does: the rest
        would be of the old rate's sample (``left`` says where)."""
        made = []
        start, total = 0, len(times)
        while start < total:
            stop = min(total, start + self.left())
            for ghost in self.ghosts:
                replay(ghost, keys, times, sizes, start, stop)
            self.sampled += stop - start
            if self.sizes is not None:
                self._learn(keys, sizes, start, stop)
                assert self.sizes is not None or stop == total, "a batch past the sizing"
            elif self.sampled % self.period == 0:  # type: ignore[operator]
                rate = self.rate
                decision = self._judge(float(times[stop - 1]))
                if decision is not None:
                    made.append(decision)
                assert self.rate == rate or stop == total, "a batch past a new sample"
            start = stop
        return made

    def _learn(self, keys: KeyArrays, sizes: np.ndarray, start: int, stop: int) -> None:
        """The sizes of requests ``start:stop``; at ``SIZING`` requests, the rate and period
        (``_resample``) for the objects the cache holds at the mean size seen (of distinct
        keys, of the bodies it keeps)."""
        assert self.sizes is not None
        ids = keys.ids[start:stop]
        names = keys.names[0][ids] if keys.names else ids
        self.sizes.update(zip(names.tolist(), sizes[start:stop].tolist(), strict=True))
        if self.sampled < SIZING:
            return
        # Bodies the cache would not keep say nothing of what it holds: left out, so that one
        # huge response cannot make every ghost the whole cache.
        largest = self.max_object_bytes or self.size
        kept = [size for size in self.sizes.values() if size <= largest]
        self.sizes = None
        self._resample(self.size / (sum(kept) / max(1, len(kept)) + self.entry_overhead + 1))

    def _resample(self, objects: float) -> None:
        """The rate and period for a cache of about ``objects`` objects: ghosts of
        ``GHOST_OBJECTS`` of them (every key, for a cache of fewer), judged every ``TURNOVERS``
        times what a ghost holds (``MIN_PERIOD`` at least); those set in ``[tune]`` stay.
        Ghosts of a new rate begin afresh, at the choice the tier runs; at the same, they go
        on. Two digits of rate: it reads plainly on /stats, and is the same on every replay."""
        s = self.settings
        most = self._most()
        rate = s.sample or min(most, max(MIN_RATE, float(f"{GHOST_OBJECTS / objects:.2g}")))
        self.idle = None
        if s.sample is None and rate < 1.0 and objects * rate < MIN_SAMPLED_OBJECTS:
            # Ghosts at the largest sample its work allows would hold too few objects to tell
            # candidates apart: recording for them would cost every hit and buy nothing.
            self.idle = (f"the memory tier holds about {round(objects):,} objects, too few "
                         f"for ghosts of a {most:g} sample to tell: it keeps its pair")  # fmt: skip
            rate = MIN_RATE
        # At most what a ghost is to hold: at a rate clamped to its least, ghosts hold more,
        # and the next judgement (and a sample chosen again) would wait that much longer.
        held = min(GHOST_OBJECTS, round(objects * rate))
        self.period = s.period or max(MIN_PERIOD, TURNOVERS * held)
        if rate != self.rate:
            self._begin(rate, self.tuner.current)

    def _most(self) -> float:
        """The largest rate ``sample = "auto"`` takes: ``MAX_GHOST_WORK`` over the candidates."""
        return min(1.0, float(f"{MAX_GHOST_WORK / len(self.choices):.2g}"))

    def _resampled(self) -> bool:
        """With ``sample = "auto"``: whether the rate was chosen again (``_resample``) from
        what the choice's ghost would hold, full, at the mean size it holds: when that is far
        from ``GHOST_OBJECTS`` (a quarter to four times), the first requests' sizes having
        misled or the traffic changed, or while the tuner is idle (a tier that grew tunable
        wakes it)."""
        if self.settings.sample is not None:
            return False
        fits = self.ghosts[self.tuner.current].store.estimated_capacity_objects()
        if not fits or (self.idle is None and GHOST_OBJECTS / 4 <= fits <= 4 * GHOST_OBJECTS):
            return False
        was = (self.rate, self.idle)
        self._resample(fits / self.rate)
        return (self.rate, self.idle) != was

    def _judge(self, at: float) -> Decision | None:
        if self._resampled():
            self.tuner.said = f"sampling {self.rate:g} of the keys: its ghosts begin again"
            return None
        if self.idle is not None:
            return None
        hits = np.array([g.counters.hits for g in self.ghosts], dtype=np.int64)
        requests = self.ghosts[0].counters.requests
        # A ghost of every key is the cache itself, whatever it holds: only a sample's is
        # asked how much it holds.
        held = None if self.rate >= 1.0 else np.array([len(g.store) for g in self.ghosts])
        was = self.choice
        best = self.tuner.judge(hits - self._judged_hits, requests - self._judged_requests, held)
        self._judged_hits, self._judged_requests = hits, requests
        if best is None:
            return None
        decision = Decision(self.tuner.judgements, self.sampled, at, was, self.choice,
                            self.tuner.said)  # fmt: skip
        self.decisions = [*self.decisions[-(KEPT_DECISIONS - 1) :], decision]
        self.switches += 1
        if self.apply is not None:
            self.apply(was, self.choice)
        return decision

    def state(self) -> dict[str, object]:
        """What /stats shows: the choice, why, the decisions kept, each candidate's recent
        miss ratio in the sample, the sample's rate and the period (None while the sizes
        that choose them are learnt)."""
        t = self.tuner
        sizing = self.sizes is not None
        return {
            "choice": self.choice.as_json(),
            "said": self.failed or self.idle
            or ("learning sizes to choose its sample" if sizing else t.said),
            "judgements": t.judgements, "sampled": self.sampled,
            "sample": None if (sizing and self.settings.sample is None) or self.idle else self.rate,
            "period": None if sizing or self.idle else self.period, "switches": self.switches,
            "decisions": [d.as_json() for d in self.decisions],
            "candidates": [{"eviction": c.eviction, "admission": c.admission,
                            "recent_miss_ratio": t.miss_ratio(i)}
                           for i, c in enumerate(self.choices)],
        }  # fmt: skip


def auto(value: float | int | str) -> float | int | None:
    """A ``[tune]`` setting as ``TuneSettings`` takes it: None for ``"auto"``."""
    return None if value == "auto" else value  # type: ignore[return-value]


def take(
    engine: CacheEngine,
    choice: Choice,
    configured: AdmissionConfig,
    make: Callable[[AdmissionConfig], AdmissionPolicy] | None = None,
    was: Choice | None = None,
) -> None:
    """``engine``, which ran ``was`` (None: not known), evicts and admits by ``choice`` from
    now on, every entry kept; of the two, only what changed is remade. A new admission
    (``make``'s, by default ``make_policy``'s on the store) starts afresh: its window and
    counts."""
    if was is None or choice.eviction != was.eviction:
        engine.store.reshape(choice.eviction)
    if was is None or choice.admission != was.admission:
        admission = configured.as_policy(choice.admission)
        engine.use_admission(make(admission) if make else make_policy(admission, engine.store))
