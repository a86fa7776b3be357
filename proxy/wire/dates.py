"""The Date field the proxy writes (RFC 9110 section 6.6.1), made once a second."""

from __future__ import annotations

import time
from email.utils import formatdate

_dated = [-1, ""]  # the second of the Date last written, and the Date


def http_date() -> str:
    """Now, as a Date field writes it (RFC 9110 section 5.6.7), formatted once a second."""
    now = int(time.time())
    if now != _dated[0]:
        _dated[0], _dated[1] = now, formatdate(now, usegmt=True)
    return _dated[1]
