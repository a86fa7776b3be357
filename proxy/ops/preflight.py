"""What a configuration needs of the machine, checked before anything starts and by
``--check-config``, changing nothing: the files and directories it names can be used (the disk
tier's directory, the access log, the TLS certificate and key). Each
problem is one line naming its key (``ConfigError``)."""

from __future__ import annotations

from pathlib import Path

from proxy.config.settings import Config, ConfigError
from proxy.disk.directory import DiskDirectoryError, usable
from proxy.ops import tls


def check(config: Config) -> None:
    """``ConfigError`` for the first path of ``config`` that cannot be used."""
    log = config.server.access_log_file
    if config.server.access_log and log:
        _appendable(Path(log))
    tls.server_context(config.server)  # the certificate and key load
    if config.disk.path:
        try:
            usable(Path(config.disk.path))
        except DiskDirectoryError as exc:
            raise ConfigError(str(exc)) from None


def _appendable(path: Path) -> None:
    """Whether ``path`` can be opened for appending, tried (a file it had to create is removed
    again: permission bits do not tell, for root or on a read-only or virtual file system)."""
    where = f"[server] access_log_file {str(path)!r}"
    if path.is_dir():
        raise ConfigError(f"{where} is a directory: name a file in it")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise ConfigError(f"{where} cannot be appended to ({exc.strerror}): create its "
                          "directory, or let the proxy's user write there") from None  # fmt: skip
    if not existed:
        path.unlink()
