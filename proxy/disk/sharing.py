"""What the workers of one machine share of a disk tier, beside what the tier does: how a
process takes part (``Sharing``), the shared memory it takes (``shared_bytes``), the machine's
one ``stats`` (``combine_stats``), and the index the compiled reader of a worker asks
(``FollowingIndex``). ``proxy.disk.store.DiskStore`` is the tier, and ``proxy.ops.shared_tier``
the parent that opens it for its workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.config.settings import DiskSection
from proxy.core._native import SharedIndex, shared_index_bytes
from proxy.core.admission import AdmissionConfig, shared_window_size

if TYPE_CHECKING:
    from proxy.core.window import SharedMemory


@dataclass(frozen=True)
class Sharing:
    """How one process of a machine takes part in the tier every worker shares: ``index``,
    memory of ``shared_bytes(section)[0]`` bytes (``SharedIndex``), and ``window``, of
    ``shared_bytes(section)[1]`` (the disk admission's window; None when it keeps none).
    ``worker``: the worker's place (its journal's name), None for the parent, which loads the
    tier and writes its checkpoints. ``follows_memory``: the tier takes what the memory tier
    keeps, and nothing else (the tier in shared memory that stands for the memory tier when
    there is no ``[disk] path``). ``workers``: how many share it."""

    index: SharedMemory
    window: SharedMemory | None
    worker: int | None
    follows_memory: bool = False
    workers: int = 1


def shared_bytes(section: DiskSection) -> tuple[int, int]:
    """The bytes of shared memory a tier of ``section`` takes: its index and ring, and its
    admission window (0: a policy that keeps none)."""
    regions = section.size // section.region_size
    window = shared_window_size(AdmissionConfig(policy=section.policy, window=section.window))
    return shared_index_bytes(regions, section.region_size), window


# What ``stats`` says of a tier the workers share, the same from each: counted once.
MACHINE_WIDE = frozenset({"objects", "index_bytes", "pushed_out", "regions", "capacity_bytes",
                          "bans"})  # fmt: skip
# What the tier's loading found: the loader's (a worker's are 0).
LOADED = ("restored_from_checkpoint", "restored_by_scan", "dropped_again")


def combine_stats(workers: list[dict[str, int | float | None]]) -> dict[str, int | float | None]:
    """One ``stats`` for the workers of a shared tier: their own counts summed, what the tier
    holds once (``MACHINE_WIDE``); a rate or count some worker cannot give is None."""
    out: dict[str, int | float | None] = {}
    for name in workers[0] if workers else ():
        values = [w.get(name) for w in workers]
        if any(v is None for v in values):
            out[name] = None
        elif name in MACHINE_WIDE:
            out[name] = max(v for v in values if v is not None)
        else:
            out[name] = sum(v for v in values if v is not None)
    return out


class FollowingIndex:
    """A shared index whose ``get`` first brings in the bans the other workers saved."""

    __slots__ = ("_follow", "_get")

    def __init__(self, index: SharedIndex, follow: Callable[[], None]) -> None:
        self._get = index.get
        self._follow = follow

    def get(self, key: int) -> tuple[int, int, int] | None:
        self._follow()
        return self._get(key)
