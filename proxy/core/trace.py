"""One request's decisions, recorded on demand: what ``GET /trace?url=`` on the admin port
returns (``proxy.ops.tracing``).

Rules this module keeps:

* A request is traced only when its ``Onehit-Trace`` field holds the process's token
  (``trace_token``), which only its admin (or, under ``--workers``, their parent's) knows. The
  field is the proxy's own: it is never sent to the origin, whatever it holds.
* The steps are recorded where each decision is taken, in order: the route and key, the
  engine's plan (and the tier behind memory's answer), each origin server asked, and the
  decision at the response's head (storable, lifetime, what memory and the tiers behind it
  keep). An untraced request pays one context variable read at each step.
* They go back to that request alone, as JSON in its response's own ``Onehit-Trace`` field,
  written with the head: what is decided after the head went out is not in it.
"""

from __future__ import annotations

import hashlib
import json
import math
from contextvars import ContextVar
from typing import Any

from proxy.core.events import Behind, Fetch, FromCache, Refuse, Revalidate

FIELD = "Onehit-Trace"
# The steps of the request being answered in this task, when it is traced.
STEPS: ContextVar[list[dict[str, Any]] | None] = ContextVar("onehit_trace", default=None)


def trace_token(secret: str) -> str:
    """The token a traced request shows, from a process's (or its machine's) ``secret``."""
    return hashlib.sha256(b"onehit-trace " + secret.encode()).hexdigest()


def step(name: str, **facts: Any) -> None:
    """Record ``facts`` about the step ``name`` of the request being traced, if one is."""
    steps = STEPS.get()
    if steps is not None:
        steps.append({"step": name, **facts})


def action_view(action: object) -> dict[str, Any]:
    """The engine's plan for a request, as an operator reads it."""
    match action:
        case FromCache():
            return {
                "action": "hit" if action.fresh else "stale",
                "tier": "disk" if action.behind else "memory",
                "age": round(action.age, 3),
                "lifetime": seconds(action.entry.lifetime),
                "refresh": action.refresh,
            }
        case Revalidate():
            return {"action": "revalidate", "age": round(action.age, 3),
                    "validators": [name for name, _ in action.conditions],
                    "on_error": action.on_error or None}  # fmt: skip
        case Fetch():
            return {"action": "fetch", "reason": action.reason, "whole": action.whole,
                    "collapse": action.collapse}  # fmt: skip
        case Refuse():
            return {"action": "refuse", "status": action.status, "reason": action.reason}
        case Behind():
            return {"action": "ask the disk tier", "else": action_view(action.then)}
    return {"action": type(action).__name__}


def field_value(steps: list[dict[str, Any]]) -> str:
    """``steps`` as the response's ``Onehit-Trace`` field carries them: one line of JSON."""
    return json.dumps(steps, separators=(",", ":"), default=str)


def steps_of(value: str) -> list[dict[str, Any]] | None:
    """The steps an ``Onehit-Trace`` field carries (``field_value``); None for anything else."""
    try:
        steps = json.loads(value)
    except ValueError:
        return None
    return steps if isinstance(steps, list) else None


def seconds(value: float) -> float | None:
    """A lifetime in seconds, None for one that never ends (JSON has no infinity)."""
    return round(value, 3) if math.isfinite(value) else None
