"""Choosing things by name: the error message every registry in the project gives."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown_name(what: str, name: str, known: Iterable[str]) -> str:
    """'unknown <what> <name>; expected one of ...' with the closest match, for error messages."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what} {name!r}{hint}; expected one of {', '.join(names)}"
