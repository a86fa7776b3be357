"""Human units for sizes (``512MiB``) and durations (``10m``), as config and flags write them."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: a whole number or a number with B, KB, KiB, MB, MiB, GB, GiB, TB, TiB."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text!r} is negative")
        return text
    match = _NUMBER_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"size {text!r} is not a size like 4096, 64KiB, 512MiB or 2GB")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(text: str | float) -> float:
    """Seconds in ``text``: a number of seconds or a number with ms, s, m, h or d."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _NUMBER_UNIT.match(str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _DURATION_UNITS:
            raise ValueError(f"duration {text!r} is not a duration like 30, 250ms, 10m or 1h")
        seconds = float(match.group(1)) * _DURATION_UNITS[unit]
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"duration {text!r} must be a finite number of seconds >= 0")
    return seconds


def format_size(n: float) -> str:
    """``n`` bytes the way a person reads them: 1.5MiB, 640KiB, 12B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            value = n / size
            # Three significant digits, but never an exponent: 1010MiB, not 1.01e+03MiB.
            return f"{value:.0f}{unit}" if abs(value) >= 999.5 else f"{value:.3g}{unit}"
    return f"{int(n)}B"
