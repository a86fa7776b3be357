"""``--workers``: the one cache tier every worker of a machine shares, opened by the parent.

What it guarantees:

* With ``[disk] path``, the disk tier is the machine's: the parent claims the directory (a
  second onehit on it is refused with one line), loads it (checkpoint, scan, every worker's
  journal and bans), and maps its index and ring into memory (``machine.create``) that every
  worker maps too. Each worker keeps a private memory tier of ``[cache] size / N``, so the
  machine holds ``[cache] size`` of memory tiers, as one process does.
* Without one, the shared tier stands in for the memory tier: region files of ``[cache]
  size`` in a scratch directory on the machine's shared memory file system (``/dev/shm``,
  which is RAM), taking exactly what the memory admission keeps. Each worker keeps a private
  memory tier of hot entries, ``[cache] size / (4 N)``: the machine holds at most 1.25 x
  ``[cache] size``. The scratch directory goes when the parent stops, unless it handed its
  listeners over (``proxy.ops.handover``): then the next parent serves what it holds
  (``adopt``), or removes it. One left by a parent that was killed is removed by the next
  start or stop after its workers drained (its lock is no longer held).
* The parent writes the checkpoints of a tier on disk (every ``[disk] checkpoint_interval``
  and once every worker has drained); the workers never do.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from proxy.config.settings import MAX_REGION, Config, ConfigError, check_config
from proxy.disk.directory import LOCK, claimed
from proxy.disk.sharing import Sharing, shared_bytes
from proxy.disk.store import DiskStore
from proxy.handler.routing import hidden_fields
from proxy.ops import machine
from proxy.ops.reload import key_rules

log = logging.getLogger("onehit.workers")
SCRATCH_PREFIX = "onehit-tier-"
# The shared memory tier's regions: small enough that evicting one costs little of the cache.
MEMORY_REGIONS = 16
MIN_REGION = 64 << 10


@dataclass
class SharedTier:
    """The machine's shared tier as the parent holds it: the store (the loader and keeper),
    the descriptors every worker inherits, the flags that tell a worker its part, and the
    settings of its share (handed to it with the configuration, ``proxy.ops.handoff``)."""

    store: DiskStore
    fds: tuple[int, ...]
    argv: list[str]
    scratch: Path | None = None
    # The settings each worker runs with in place of the configuration's (``worker_view``).
    overrides: dict[str, object] = field(default_factory=dict)
    left: bool = False  # the scratch tier handed to the next parent: kept at close

    def close(self) -> None:
        """Once every worker has stopped: the last checkpoint, and the scratch tier removed
        (unless ``left``), with any a killed parent left whose workers have drained since this
        one started."""
        self.store.close()
        for fd in self.fds:
            os.close(fd)
        if self.scratch is not None:
            if not self.left:
                shutil.rmtree(self.scratch, ignore_errors=True)
            _sweep(self.scratch.parent, keep=self.scratch)


def worker_overrides(config: Config, workers: int, scratch: str) -> dict[str, object]:
    """The settings each of ``workers`` workers of ``config`` runs with in place of the
    configuration's (see the module's rules): its share of memory, and without a disk tier,
    the tier in ``scratch`` that stands for memory. The one place they are derived: the
    start (``open_shared_tier``) and ``--check-config`` (``check_workers``) both read them."""
    if config.disk.path:
        return {"cache.size": config.cache.size // workers}
    region = min(MAX_REGION, max(MIN_REGION, config.cache.size // MEMORY_REGIONS))
    return {
        "cache.size": max(MIN_REGION, config.cache.size // (4 * workers)),
        "disk.path": scratch,
        "disk.size": max(2 * region, config.cache.size // region * region),
        "disk.region_size": region,
        "disk.policy": "always",
        "disk.max_write_rate": 0,
    }


def check_workers(config: Config, workers: int) -> None:
    """``ConfigError`` naming the key and a value that works, when ``workers`` workers of
    ``config`` would not start: each worker's configuration (``worker_view``) judged as the
    configuration itself is, and, without a disk tier, room on the file system the tier that
    stands for memory is made on (a container's ``/dev/shm`` is 64 MiB by default)."""
    overrides = worker_overrides(config, workers, str(_scratch_root()))
    view = worker_view(config, overrides)
    # A worker keeps in memory up to its share and in the tier behind up to a region's
    # record (``behind_largest``); its configuration is judged with that largest.
    largest = max(min(view.cache.max_object_size, view.cache.size), view.behind_largest())
    if view.cache.slice_size > largest:
        raise ConfigError(
            f"[cache] slice_size = {view.cache.slice_size}: with {workers} workers, each keeps "
            f"bodies up to {largest} bytes: set it to at most that, or give the tier the "
            "workers share larger regions ([disk] region_size, or a larger [cache] size)"
        )
    # Slices judged above; memory's own rules with the largest body memory holds.
    memory = replace(view.cache, max_object_size=min(largest, view.cache.size), slice_size=0)
    try:
        check_config(replace(view, cache=memory))
    except ConfigError as exc:
        raise ConfigError(
            f"with {workers} workers, each keeps {view.cache.size} bytes of memory and bodies "
            f"up to {largest} bytes: {exc}"
        ) from None
    if config.disk.path:
        return
    needed = int(overrides["disk.size"])  # type: ignore[call-overload]
    room = shutil.disk_usage(_scratch_root()).free
    if room < needed:
        raise ConfigError(
            f"[cache] size = {config.cache.size}: with {workers} workers and no [disk] path, "
            f"the tier standing for memory takes {needed} bytes of {_scratch_root()}, which has "
            f"{room} free: set [cache] size to at most {room // 2} bytes, give the file system "
            "more room (docker run --shm-size), or set [disk] path"
        )


def open_shared_tier(config: Config, workers: int, adopt: str = "") -> SharedTier:
    """Load the tier ``workers`` workers of ``config`` share (see the module's rules);
    without a disk tier, in the scratch directory a parent before this one left (``adopt``)
    where it opens, else in a new one."""
    left = left_scratch(adopt)
    if not config.disk.path and left is not None:
        try:
            return _open(config, workers, left, made=False)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("the memory tier the last parent left could not be opened (%s): "
                        "starting an empty one", exc)  # fmt: skip
    discard_scratch(adopt)
    return _open(config, workers, None if config.disk.path else _scratch_directory())


def _open(config: Config, workers: int, scratch: Path | None, made: bool = True) -> SharedTier:
    """The tier, in ``scratch`` (a directory standing for memory; None: the disk tier); a
    failure removes ``scratch`` only when this start ``made`` it (one adopted may be held by
    a live onehit: its lock refused it)."""
    overrides = worker_overrides(config, workers, str(scratch))
    section = worker_view(config, overrides).disk  # the parent's tier is the workers' own
    index_bytes, window_bytes = shared_bytes(section)
    fds = [machine.create(index_bytes, "onehit-tier-index")]
    try:
        if window_bytes:
            fds.append(machine.create(window_bytes, "onehit-tier-window"))
        sharing = Sharing(
            machine.attach(os.dup(fds[0])),
            machine.attach(os.dup(fds[1])) if window_bytes else None,
            worker=None,
            follows_memory=scratch is not None,
            workers=workers,
        )
        store = DiskStore(section, hidden_fields(config), sharing)
        # What a start with other key rules finds is never served (a new scratch tier holds
        # nothing).
        store.key_rules(key_rules(config), purge=True)
    except BaseException:
        for fd in fds:
            os.close(fd)
        if scratch is not None and made:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    kind = "memory" if scratch is not None else "disk"
    argv = ["--shared-tier", f"{kind}:{workers}:{','.join(map(str, fds))}"]
    return SharedTier(store, tuple(fds), argv, scratch, overrides)


def worker_view(config: Config, overrides: dict[str, object]) -> Config:
    """``config`` as a worker runs it: with the ``overrides`` its tier gave it (``section.key``
    to a value as the configuration holds it)."""
    for key, value in overrides.items():
        section, name = key.split(".")
        config = replace(config, **{section: replace(getattr(config, section), **{name: value})})
    return config


def worker_sharing(given: str, worker: int) -> Sharing:
    """What the worker in place ``worker`` is given (``--shared-tier KIND:WORKERS:FDS``: the
    tier on disk or standing for memory, how many workers share it, its memory's
    descriptors): that memory, mapped."""
    kind, workers, fds = given.split(":")
    numbers = [int(n) for n in fds.split(",")]
    return Sharing(
        machine.attach(numbers[0]),
        machine.attach(numbers[1]) if len(numbers) > 1 else None,
        worker=worker,
        follows_memory=kind == "memory",
        workers=int(workers),
    )


def _scratch_root() -> Path:
    """Where the shared memory tier is made: ``/dev/shm`` where there is one."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(base or tempfile.gettempdir())


def _scratch_directory() -> Path:
    """A new directory for the shared memory tier (``_scratch_root``); the ones a killed
    parent left behind removed first."""
    root = _scratch_root()
    _sweep(root)
    return Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=root))


def left_scratch(path: str) -> Path | None:
    """``path`` as a scratch tier a parent of this user left (``SharedTier.left``), or None
    when it is not one: a handover's word is never enough to open or remove a directory."""
    if not path:
        return None
    directory = Path(path)
    named = directory.parent == _scratch_root() and directory.name.startswith(SCRATCH_PREFIX)
    return directory if named and _ours(directory) else None


def _ours(directory: Path) -> bool:
    """Whether ``directory`` is this user's own, and not a link to elsewhere."""
    try:
        return not directory.is_symlink() and directory.stat().st_uid == os.geteuid()
    except OSError:
        return False


def discard_scratch(path: str) -> None:
    """Remove the scratch tier a parent left at ``path`` (a process that does not serve it:
    one with a disk tier, or a single process); anything else there is left alone."""
    directory = left_scratch(path)
    if directory is not None and not claimed(directory):
        shutil.rmtree(directory, ignore_errors=True)


def _sweep(root: Path, keep: Path | None = None) -> None:
    """Remove the scratch tiers under ``root`` of this user whose parent and workers are gone
    (none holds the claim), but ``keep``."""
    for directory in root.glob(f"{SCRATCH_PREFIX}*"):
        if directory == keep or not _ours(directory):
            continue
        if (directory / LOCK).exists() and not claimed(directory):
            shutil.rmtree(directory, ignore_errors=True)
