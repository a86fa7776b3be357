"""Where a report came from, so that whoever it is handed to can run it again: the command
line, onehit's version and commit, each trace as it was named and its digest, when it ran and
for how long.

Rules this module keeps:

* No path of the machine it ran on: an argument naming a file is shown by its name alone, a
  trace by what was given (``real:twitter52``, ``zipf.csv``), never where it was fetched to.
* A trace's digest is SHA-256 of its file's bytes as stored (compressed, if it is), read in
  blocks: the file another user fetches or is handed is checked against it.
* What cannot be known is said so (``unknown``: an install outside a git checkout has no
  commit), never guessed.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen.traces.real_traces import REAL

BLOCK = 1 << 20
UNKNOWN = "unknown"


def provenance(
    traces: dict[str, Path | None],
    started: float,
    argv: Sequence[str] | None = None,
    configs: Sequence[Path] = (),
) -> dict[str, Any]:
    """The provenance of a run that began at ``started`` (``time.time()``), over ``traces``
    (each as it was named, and the file read for it, or None for a generated one) and the
    files that configured it (``configs``: an experiment's, a proxy's TTL rules); ``argv``
    is the command's own (``sys.argv`` by default)."""
    given = list(sys.argv if argv is None else argv)
    program = Path(given[0]).name if given else "onehit-loadgen"
    if program in ("__main__.py", "-m"):
        program = "onehit-loadgen"
    return {
        "command": " ".join([program, *(_shown(arg) for arg in given[1:])]),
        "onehit": _version(),
        "commit": _commit(),
        "traces": [
            {"trace": _named(name), "sha256": digest(path) if path is not None else None}
            for name, path in traces.items()
        ],
        "configs": [{"file": path.name, "sha256": digest(path)} for path in configs],
        "date": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "elapsed_s": round(time.time() - started, 1),
    }


def digest(path: Path) -> str:
    """SHA-256 of the file at ``path``, as stored."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            sha.update(block)
    return sha.hexdigest()


def lines(found: dict[str, Any]) -> list[tuple[str, str]]:
    """A provenance as (label, text) lines, as a report shows it."""
    shown = [("command", found["command"]),
             ("onehit", f"{found['onehit']} (commit {found['commit']})")]  # fmt: skip
    for trace in found.get("traces", []):
        sha = trace.get("sha256")
        shown.append(("trace", f"{trace['trace']}" + (f" (sha256 {sha})" if sha else "")))
    for config in found.get("configs", []):
        shown.append(("configuration", f"{config['file']} (sha256 {config['sha256']})"))
    shown += [("date", found["date"]), ("elapsed", f"{found['elapsed_s']:g} s")]
    return shown


def _shown(arg: str) -> str:
    """A command-line argument as a report shows it: a path by its name alone (anything
    holding a separator is taken for one), quoted for a shell."""
    return shlex.quote(_named(arg))


def _named(arg: str) -> str:
    """``arg`` with a path in it reduced to its name."""
    flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if os.sep in value and not value.startswith((REAL, "http:", "https:")):
        value = Path(value).name or value
    return flag + eq + value


def _version() -> str:
    try:
        return metadata.version("onehit")
    except metadata.PackageNotFoundError:
        return UNKNOWN


def _commit() -> str:
    """The commit of the checkout onehit runs from, with ``+`` when it has changes; else
    ``unknown``."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args],
                              capture_output=True, text=True, timeout=10)  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        top = git("rev-parse", "--show-toplevel")
        # An install inside another project's checkout is not that project's commit.
        if top is None or Path(top).resolve() != root:
            return UNKNOWN
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    if head is None:
        return UNKNOWN
    return head[:12] + ("+" if dirty else "")
