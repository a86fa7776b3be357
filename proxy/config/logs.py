"""The proxy's throttled log of faults: what a client can provoke is logged one line at a time."""

from __future__ import annotations

import logging
import time
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
