"""The live disk tier: the core's ``DiskTier`` over region files (``RegionLog``), behind the
memory tier, keeping what it took across restarts.

* A response reaches the disk only when the tier's own admission says so at its head
  (``wants``), and only once its body ended whole (``write``): a record of its key, its body
  and its meta (status, fields, store time, lifetime, age on arrival) appended at the end of the
  open region.
* On a memory miss, ``lookup`` reads the key's record back, verified (a torn, damaged or
  misplaced record is a miss, dropped from the index, never a wrong body), as an entry the
  engine judges by its own freshness rules.
* At start-up the region files are scanned oldest first (``RegionLog.recover``) and every
  whole record goes back into the index.
* Responses that vary (``Vary``) are not taken yet: a disk record is found by its URL alone.
"""

from __future__ import annotations

import json
import math

from proxy.config import DiskSection
from proxy.core import rfc9111
from proxy.core.admission import AdmissionConfig
from proxy.core.disk import RECORD_HEADER, DiskTier
from proxy.core.events import RequestMeta, ResponseMeta
from proxy.core.regions import Regions
from proxy.core.store import Entry
from proxy.region_log import Location, RegionLog


class DiskStore:
    """One disk tier under ``section.path``."""

    def __init__(self, section: DiskSection) -> None:
        regions = Regions(section.region_size, section.size // section.region_size)
        self.tier = DiskTier(regions, AdmissionConfig(policy=section.policy, window=section.window))
        self.log = RegionLog(section.path, regions)
        for key, location in self.log.recover():
            self.tier.restore(_text(key), location.region, location.offset, location.length)

    def wants(
        self,
        request: RequestMeta,
        response: ResponseMeta,
        length: int | None,
        whole: bool,
        now: float,
    ) -> bool:
        """Whether the tier takes ``response`` (of ``length`` body bytes, None when unknown),
        asked once at its head: a whole 200 GET that does not vary, and then the tier's
        admission, which counts the sighting."""
        if (
            not whole
            or request.method != "GET"
            or response.status != 200
            or response.vary
            or not response.cacheable
        ):
            return False
        size = length or 0
        key = request.key
        return self.tier.admit(key, size, RECORD_HEADER + len(_raw(key)) + 256 + size, now)

    def write(self, key: str, response: ResponseMeta, body: bytes, stored_at: float) -> None:
        """Append the record of a response ``wants`` took, now that its body is whole."""
        meta = json.dumps(
            [response.status, stored_at, _finite(response.lifetime), response.initial_age,
             list(response.headers)],
            separators=(",", ":"),
        ).encode()  # fmt: skip
        location = self.log.append(_raw(key), meta, body)
        if location is not None:
            self.tier.recorded(key, location.region, location.offset, location.length)

    def lookup(self, key: str, entry_type: type[Entry]) -> Entry | None:
        """The entry ``key``'s record holds, read back whole, or None (a record that is not
        whole is dropped). The caller counts whether it answered (``DiskTier.answered``)."""
        slot = self.tier.find(key)
        if slot is None:
            return None
        found = self.log.read(Location(slot.region, slot.offset, slot.length), _raw(key))
        if found is None:
            self.tier.drop(key)
            return None
        meta, body = found
        status, stored_at, lifetime, initial_age, fields = json.loads(meta)
        headers = tuple((name, value) for name, value in fields)
        return entry_type(
            key,
            len(body),
            stored_at,
            math.inf if lifetime is None else lifetime,
            initial_age,
            headers,
            rfc9111.response_directives(headers),
            body,
            status=status,
        )

    def stats(self) -> dict[str, int]:
        c = self.tier.counters
        regions = self.tier.regions
        return {
            "hits": c.hits,
            "misses": c.misses,
            "admissions": c.admissions,
            "rejected": c.rejected,
            "too_large": c.too_large,
            "bytes_written": c.bytes_written,
            "bytes_not_written": c.bytes_not_written,
            "evicted_objects": c.evicted_objects,
            "dropped": c.dropped,
            "objects": len(self.tier),
            "index_bytes": self.tier.index.memory_bytes,
            "regions": len(regions.live),
            "capacity_bytes": regions.capacity_bytes,
        }

    def close(self) -> None:
        self.log.close()


def _raw(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def _text(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


def _finite(lifetime: float) -> float | None:
    """JSON has no infinity: None stands for a response that never expires."""
    return None if math.isinf(lifetime) else lifetime
