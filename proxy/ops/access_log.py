"""The access log as tools ingest it: one line per answer, nothing before or after it.

* ``json``: one JSON object a line (``jq``, Loki, Vector, an ELK pipeline): ``time`` (when the
  request began, RFC 3339 in UTC with microseconds), ``client``, ``method``, ``target``,
  ``host``, ``protocol``, ``status``, ``bytes`` (every byte written for the answer, its head
  included, as Apache's ``%O``), ``duration_us`` (from the request's arrival to its last
  byte handed to the socket), ``cache_status`` (``Cache-Status``), ``user_agent``,
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
``combined``. Lines go to stderr or to ``[server] access_log_file``; ``AccessLogFile.reopen``
(SIGUSR1, as nginx's ``-s reopen``) starts writing to a file of that name again, for
logrotate.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp.abc import AbstractAccessLogger

# What Apache escapes in a quoted field: the quote, the backslash, and any byte that is not
# printable ASCII.
_UNSAFE = re.compile(rb'["\\\x00-\x1f\x7f-\xff]')
_ESCAPES = {ord('"'): b'\\"', ord("\\"): b"\\\\"}
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _escaped(text: str) -> str:
    raw = text.encode("utf-8", "surrogateescape")
    return _UNSAFE.sub(lambda m: _ESCAPES.get(m[0][0], b"\\x%02x" % m[0][0]), raw).decode("ascii")


# The fields of a JSON line, in order (docs/operations.md and config/proxy.toml name them;
# tests/test_access_log.py holds both to this).
FIELDS = ("time", "client", "method", "target", "host", "protocol", "status", "bytes",
          "duration_us", "cache_status", "user_agent", "referer", "request_id")  # fmt: skip


class _Ids:
    """Request ids unique in this process's run: a random prefix and a count."""

    def __init__(self) -> None:
        self.prefix = os.urandom(6).hex()
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count:010x}"


_ids = _Ids()


# A client's own request id is logged when it is one: short, of characters that need no
# escaping anywhere (else one is made, as when it sent none).
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def _request_id(given: str | None) -> str:
    return given if given is not None and _CLIENT_ID.fullmatch(given) else _ids.next()


def _text(value: str | None) -> str | None:
    """``value`` as valid Unicode: a byte that was not UTF-8 (parsed with surrogateescape)
    becomes U+FFFD, so a strict JSON reader takes the line."""
    if value is None or value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _protocol(request: Any) -> str:
    version = request.version
    return f"HTTP/{version.major}.{version.minor}"


def _bytes(response: Any) -> int:
    try:
        return int(response.body_length)
    except (AttributeError, AssertionError, TypeError):
        return 0  # an answer that wrote nothing


class AccessLog(AbstractAccessLogger):
    """One line per answer, in the format ``log_format`` names (``json`` or ``combined``),
    to ``logger``; the front and aiohttp's handler both log through it."""

    __slots__ = ("_line",)

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)
        self._line = self._json if log_format == "json" else self._combined

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: Any, response: Any, time_taken: float) -> None:
        try:
            self.logger.info(self._line(request, response, time_taken, time.time() - time_taken))
        except Exception:
            logging.getLogger("onehit.proxy").exception("an access log line failed")

    @staticmethod
    def _json(request: Any, response: Any, taken: float, began: float) -> str:
        headers = request.headers
        return json.dumps(
            {
                "time": datetime.fromtimestamp(began, UTC)
                .isoformat(timespec="microseconds")
                .replace("+00:00", "Z"),
                "client": request.remote,
                "method": request.method,
                "target": _text(request.raw_path),
                "host": _text(request.host),
                "protocol": _protocol(request),
                "status": response.status,
                "bytes": _bytes(response),
                "duration_us": round(taken * 1e6),
                "cache_status": response.headers.get("Cache-Status"),
                "user_agent": _text(headers.get("User-Agent")),
                "referer": _text(headers.get("Referer")),
                "request_id": _request_id(headers.get("X-Request-ID")),
            },
            ensure_ascii=True,
            separators=(",", ":"),
        )

    @staticmethod
    def _combined(request: Any, response: Any, taken: float, began: float) -> str:
        headers = request.headers
        t = time.gmtime(began)
        stamp = (f"{t.tm_mday:02d}/{_MONTHS[t.tm_mon - 1]}/{t.tm_year}:"
                 f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000")  # fmt: skip
        line = _escaped(f"{request.method} {request.raw_path} {_protocol(request)}")
        referer = headers.get("Referer")
        agent = headers.get("User-Agent")
        size = _bytes(response)
        return (
            f'{request.remote or "-"} - - [{stamp}] "{line}" {response.status} '
            f'{size or "-"} "{_escaped(referer) if referer is not None else "-"}" '
            f'"{_escaped(agent) if agent is not None else "-"}"'
        )


def _append(path: str) -> Any:
    """``path`` opened for appending lines, each written as it ends; the handler holding it
    closes it (no ``with``: it stays open for the handler's life)."""
    return open(path, "a", encoding="ascii", buffering=1)


class AccessLogFile(logging.StreamHandler):  # type: ignore[type-arg]
    """The access log's lines, bare, to a file opened for appending (``path``) or to stderr
    (``path`` empty); ``reopen`` opens the path again (after logrotate moved the file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(_append(path) if path else sys.stderr)
        self.setFormatter(logging.Formatter("%(message)s"))

    def reopen(self) -> None:
        if not self.path:
            return
        fresh = _append(self.path)
        self.acquire()
        try:
            old = self.setStream(fresh)
        finally:
            self.release()
        if old is not None:
            old.close()

    def close(self) -> None:
        self.acquire()
        try:
            if self.path and self.stream is not None:
                self.stream.close()
        finally:
            self.release()
        super().close()


def access_logger(path: str) -> tuple[logging.Logger, AccessLogFile]:
    """A logger of its own (not in ``logging``'s tree: each service in a process has one)
    whose lines, bare, go to ``path`` (stderr when empty), and its handler, to reopen and
    close. OSError when the file cannot be opened."""
    handler = AccessLogFile(path)
    logger = logging.Logger("onehit.access", logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    return logger, handler
