"""The access log as tools ingest it: one line per answer, nothing before or after it.

* ``json``: one JSON object a line (``jq``, Loki, Vector, an ELK pipeline): ``time`` (when the
  request began, RFC 3339 in UTC with microseconds), ``client``, ``method``, ``target``,
  ``host``, ``protocol``, ``status``, ``bytes`` (every byte written for the answer, its head
  included, as Apache's ``%O``), ``duration_us`` (from the request's arrival to its last
  byte handed to the socket), ``origin_us`` (the time it waited on the origin: from each
  request sent for it to that response's head, summed over them, as nginx's
  ``$upstream_header_time``; ``null`` when the origin was not asked, a hit or a request that
  followed another's fetch, or for an upload the client streams, whose wait is its own as
  much as the origin's), ``cache_status`` (``Cache-Status``), ``user_agent``,
  ``referer`` and ``request_id``. An absent field is ``null``.
* ``combined``: Apache's combined format (GoAccess, AWStats, any log parser's
  ``COMBINEDAPACHELOG``): ``%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i"``, with
  ``-`` for what is absent and Apache's escapes in the quoted parts (``\\"``, ``\\\\``, a
  byte outside printable ASCII as ``\\xhh``), so a hostile target or User-Agent cannot break
  a line or forge a field. Its bytes are those of ``json`` (head included: Apache's ``%O``
  where its ``%b`` counts the body alone).

``request_id`` is the client's ``X-Request-ID`` where it sent one of at most 128 plain
characters, else one made here, unique in the process's run (as nginx's ``$request_id``); it
is logged, never added to what passes through. A byte a client sent that is not UTF-8 is
logged as U+FFFD in ``json`` (strict readers refuse lone surrogates), as ``\\xhh`` in
``combined``.

Lines are formatted by the compiled ``LogLines`` (the hits the front answers as they come
never reach the interpreter) and written as nginx's ``buffer=``/``flush=`` write them: in
batches, when ``[server] access_log_buffer`` bytes are held (0: each line as it is made) and
every ``access_log_flush``; on SIGUSR1's reopen and at a clean stop, everything held is
written first, so no line is lost but to a crash (at most one interval's) or to a log that
cannot take them (counted, and said in the error log). They go to stderr
or to ``[server] access_log_file``; ``AccessLogFile.reopen`` (SIGUSR1, as nginx's
``-s reopen``) starts writing to a file of that name again, for logrotate.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from proxy.config.logs import stderr_descriptor
from proxy.handler._hits import LogLines

# The fields of a JSON line, in order (docs/operations.md and config/proxy.toml name them;
# tests/test_access_log.py holds both to this).
FIELDS = ("time", "client", "method", "target", "host", "protocol", "status", "bytes",
          "duration_us", "origin_us", "cache_status", "user_agent", "referer",
          "request_id")  # fmt: skip

_ERRORS = logging.getLogger("onehit.proxy")


def _protocol(request: Any) -> str:
    version = request.version
    return f"HTTP/{version.major}.{version.minor}"


def _microseconds(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e6)


def _bytes(response: Any) -> int:
    try:
        return int(response.body_length)
    except (AttributeError, AssertionError, TypeError):
        return 0  # an answer that wrote nothing


class AccessLog:
    """One line per answer of aiohttp's handler or the front's lane, made by ``lines``; the
    hits the front answers as they come are logged by ``lines.hit`` itself."""

    __slots__ = ("lines",)

    def __init__(self, lines: LogLines) -> None:
        self.lines = lines

    def log(self, request: Any, response: Any, time_taken: float) -> None:
        try:
            headers = request.headers
            # An answer written whole carries its head: the line reads Cache-Status from it.
            head = getattr(response, "head_bytes", None)
            self.lines.entry(
                round(time_taken * 1e6), request.remote, request.method, request.raw_path,
                request.host, _protocol(request), response.status, _bytes(response),
                head if head is not None else response.headers.get("Cache-Status"),
                headers.get("User-Agent"), headers.get("Referer"), headers.get("X-Request-ID"),
                None, _microseconds(getattr(request, "origin_wait", None)),
            )  # fmt: skip
        except Exception:
            _ERRORS.exception("an access log line failed")


def _append(path: str) -> int:
    """A descriptor of ``path`` opened for appending, created as ``open(path, "a")`` would."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)


class AccessLogFile:
    """The access log's lines (``lines``, in ``log_format``) written to ``path``, appended
    (stderr when empty), in batches of ``buffer`` bytes and every ``flush`` seconds once
    ``start`` has run; ``reopen`` writes what is held, then opens the path again (after
    logrotate moved the file); ``close`` writes what is held and closes it. OSError when the
    file cannot be opened."""

    def __init__(self, path: str, log_format: str, buffer: int, flush: float) -> None:
        self.path = path
        self.interval = flush
        fd, self._own = (_append(path), True) if path else stderr_descriptor()
        self.lines = LogLines(fd, log_format == "json", buffer)
        self._timer: asyncio.TimerHandle | None = None
        self._lost = 0  # the lines lost that were said

    def start(self) -> None:
        """Write what is held every ``flush`` seconds, on the running loop."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def _tick(self) -> None:
        self.flush()
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def flush(self) -> None:
        """Write what is held; a write that failed, or lines dropped since the last flush
        (the log did not take them: past what the buffer holds), are logged, with the lines
        lost so far."""
        where = self.path or "stderr"
        try:
            self.lines.flush()
        except OSError as exc:
            _ERRORS.error("writing the access log to %s failed (%s): %d lines lost so far",
                          where, exc, self.lines.lost)  # fmt: skip
        else:
            if self.lines.lost > self._lost:
                why = "was closed" if self.closed else "did not take its lines in time"
                _ERRORS.error("the access log (%s) %s: %d lines lost so far",
                              where, why, self.lines.lost)  # fmt: skip
        self._lost = self.lines.lost

    def reopen(self) -> None:
        """Write what is held, then open the path again; a path that cannot be opened is said
        in one line, and the lines go on to the file open until now."""
        self.flush()
        if not self.path or self.closed:  # a SIGUSR1 while the service stops: nothing to open
            return
        try:
            fd = _append(self.path)
        except OSError as exc:
            _ERRORS.error("reopening the access log %s failed (%s): it goes on to the file "
                          "open before", self.path, exc.strerror or exc)  # fmt: skip
            return
        os.close(self.lines.swap(fd))

    @property
    def closed(self) -> bool:
        return self.lines.fd < 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        old = self.lines.swap(-1)
        if self._own and old >= 0:
            os.close(old)
