"""One request's decisions, recorded on demand: what ``GET /trace?url=`` on the admin port
returns (``proxy.ops.tracing``).

Rules this module keeps:

* A request is traced only when its ``Onehit-Trace`` field holds the process's token
  (``trace_token``), which only its admin (or, under ``--workers``, their parent's) knows. The
  field is the proxy's own: it is never sent to the origin, whatever it holds.
* The steps are recorded where each decision is taken, in order: the route and key, the
  engine's plan (and the tier behind memory's answer), each origin server asked, and the
  decision at the response's head (storable, lifetime, what memory and the tiers behind it
  keep), by the request's own task: a task it starts (a background refresh, a removal sent
  to the other workers) inherits the context, not the trace. An untraced request pays one
  context variable read at each step.
* They go back to that request alone, as JSON in its response's own ``Onehit-Trace`` field,
  written with the head: what is decided after the head went out is not in it. An origin's
  URL is shown without the credentials it may carry.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from contextvars import ContextVar, Token
from typing import Any

from proxy.core.events import Behind, Fetch, FromCache, Refuse, Revalidate

FIELD = "Onehit-Trace"
# The request being answered, when it is traced: its task, and its steps.
STEPS: ContextVar[tuple[object, list[dict[str, Any]]] | None] = ContextVar(
    "onehit_trace", default=None
)


def trace_token(secret: str) -> str:
    """The token a traced request shows, from a process's (or its machine's) ``secret``."""
    return hashlib.sha256(b"onehit-trace " + secret.encode()).hexdigest()


def tracing(steps: list[dict[str, Any]]) -> Token[Any]:
    """Record the steps of the request this task answers in ``steps`` from now on (until
    ``STEPS.reset`` of what this returns)."""
    return STEPS.set((asyncio.current_task(), steps))


def step(name: str, **facts: Any) -> None:
    """Record ``facts`` about the step ``name`` of the request being traced, if one is."""
    traced = STEPS.get()
    if traced is not None and traced[0] is asyncio.current_task():
        traced[1].append({"step": name, **facts})


def traced_now() -> bool:
    """Whether this task answers a traced request."""
    traced = STEPS.get()
    return traced is not None and traced[0] is asyncio.current_task()


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


def field_value(steps: list[dict[str, Any]], status: int, origin_wait: float | None) -> str:
    """``steps`` as the response's ``Onehit-Trace`` field carries them, the answer's own last
    (its ``status``, and its ``origin_wait`` in seconds, if it asked): one line of JSON."""
    wait = None if origin_wait is None else round(origin_wait * 1000, 3)
    steps.append({"step": "answer", "status": status, "origin_ms": wait})
    return json.dumps(steps, separators=(",", ":"), default=str)


def shown_origin(url: str) -> str:
    """An origin URL as a trace shows it: without the credentials it may carry."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"


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
