"""proxy.core does no I/O and reads no clock: importing it loads no network or time module."""

import ast
import subprocess
import sys
from pathlib import Path

import proxy.core

FORBIDDEN = {"aiohttp", "asyncio", "socket", "time", "loadgen", "selectors", "ssl"}
CORE = Path(proxy.core.__file__).parent


def test_core_loads_no_io_modules_in_a_fresh_interpreter():
    # `time` is loaded by the interpreter itself at start-up, so only what importing the core
    # adds counts.
    code = (
        "import sys, importlib, pkgutil\n"
        "before = set(sys.modules)\n"
        "import proxy.core\n"
        "for m in pkgutil.iter_modules(proxy.core.__path__):\n"
        "    importlib.import_module('proxy.core.' + m.name)\n"
        "print(','.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = {name.split(".")[0] for name in out.stdout.strip().split(",")}
    assert "proxy" in loaded, "the probe did not import the core"
    assert not loaded & FORBIDDEN, f"proxy.core loaded {sorted(loaded & FORBIDDEN)}"


def test_core_source_imports_nothing_that_does_io():
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
