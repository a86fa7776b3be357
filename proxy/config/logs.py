"""The proxy's logs, one line per record (``OneLine``), and its throttled log of faults: what
a client can provoke is logged one line at a time (``OneLineEvery``). What goes to stderr
never waits on its reader (``stderr_descriptor``, ``ErrorLog``): a reader that stopped costs
lines, never the event loop."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import time
import traceback
from collections.abc import Callable


class OneLineEvery(logging.Filter):
    """Faults a client can provoke (a malformed request refused with 400 by aiohttp's parser,
    a request that made the proxy fail with 500) as one line each, at most one per
    ``interval`` seconds, with a count of those left out: a client that sends garbage cannot
    fill the log with tracebacks. The line names the exception and where it was raised."""

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._last = -float("inf")
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self._last < self.interval:
            self.suppressed += 1
            return False
        self._last = now
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            message = f"{message}: {exc!r}{_raised_at(exc)}"
        if self.suppressed:
            message += f" ({self.suppressed} more since the last line)"
            self.suppressed = 0
        record.msg, record.args, record.exc_info, record.exc_text = message, (), None, None
        return True


HTTP_ERRORS = logging.getLogger("onehit.http")
HTTP_ERRORS.addFilter(OneLineEvery())


def _raised_at(exc: BaseException) -> str:
    """`` at file:line`` of the frame that raised ``exc``, or "" without a traceback."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


class OneLine(logging.Formatter):
    """A record as one line, as log shippers and ``grep`` take it: the time (RFC 3339, UTC,
    milliseconds), the logger, the level and the message; an exception on the same line, with
    the frames it passed through, from where it was raised outwards (joined by ``<-``); a
    line break inside a message written as ``\\n``."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.gmtime(record.created)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", when) + f".{int(record.msecs):03d}Z"
        message = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            frames = traceback.extract_tb(exc.__traceback__)
            where = " <- ".join(f"{f.filename}:{f.lineno} {f.name}" for f in reversed(frames))
            message = f"{message}: {exc!r}" + (f" at {where}" if where else "")
        line = f"{stamp} {record.name} {record.levelname} {message}"
        return line.replace("\r", "\\r").replace("\n", "\\n")


def stderr_descriptor() -> tuple[int, bool]:
    """A descriptor of stderr whose writes never wait, and whether it is the caller's own to
    close. A pipe or a terminal is opened again, non-blocking: a description of its own,
    since making the inherited one non-blocking would change it for the processes that share
    it (the shell, a supervisor). A socket (journald's stream) is taken as it is, to be sent
    to with ``MSG_DONTWAIT``; so is a file, whose writes wait on no reader."""
    try:
        mode = os.fstat(2).st_mode
    except OSError:
        return 2, False  # closed (2>&-): its writes fail, and are counted as lost
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            return os.open("/proc/self/fd/2", flags), True
        except OSError as exc:  # no /proc, another user's pipe, or the pipe's reader gone
            logging.getLogger("onehit").warning(
                "stderr (a pipe or terminal) could not be opened again (%s): lines written "
                "to it wait while its reader does not read",
                exc.strerror or exc,
            )
    return 2, False


class ErrorLog(logging.Handler):
    """The error log's lines written to stderr (``stderr_descriptor``) without waiting: a line
    its reader has no room for is dropped, counted in ``dropped`` and said on the next line
    written."""

    def __init__(self) -> None:
        super().__init__()
        self.fd, _ = stderr_descriptor()
        self.dropped = 0
        self._socket = None
        with contextlib.suppress(OSError):  # closed: each line's write fails, dropped
            if stat.S_ISSOCK(os.fstat(self.fd).st_mode):
                self._socket = socket.socket(fileno=os.dup(self.fd))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if self.dropped:
                line += f" ({self.dropped} error log lines dropped before it: stderr was full)"
            data = memoryview((line + "\n").encode("utf-8", "backslashreplace"))
            while data:
                sent = (os.write(self.fd, data) if self._socket is None
                        else self._socket.send(data, socket.MSG_DONTWAIT))  # fmt: skip
                data = data[sent:]
            self.dropped = 0
        except BlockingIOError:
            self.dropped += 1
        except Exception:
            self.handleError(record)
