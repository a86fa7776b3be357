"""The import graph of the proxy and the load generator goes one way: no module imports, at any
depth, a module that imports it, so each can be read, tested and replaced from the bottom up.
(That the core does no I/O is ``test_core_purity``'s.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "loadgen")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _graph() -> dict[str, set[str]]:
    """Each module of the packages and the modules of the packages it imports, anywhere in it
    (function-level imports too)."""
    modules = {_module(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports, if there is one."""
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_no_module_imports_one_that_imports_it():
    graph = _graph()
    assert len(graph) > 40  # the tree was read
    assert _cycle(graph) is None


def test_a_cycle_is_found_where_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# The proxy's layers, bottom up: a module imports from its own layer and those below it.
LAYERS = {
    "core": 0,
    "config": 1,
    "front": 2,
    "origin": 2,
    "disk": 2,
    "fleet": 2,
    "handler": 3,
    "ops": 4,
    "__main__": 5,
}


def _layer(module: str) -> tuple[str, int]:
    part = module.split(".")[1]
    return part, LAYERS[part]


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that go up the proxy's layers, or across its side-by-side
    ones."""
    wrong = []
    for module, deps in graph.items():
        if not module.startswith("proxy."):
            continue
        part, level = _layer(module)
        for dep in deps:
            if not dep.startswith("proxy."):
                continue
            dep_part, dep_level = _layer(dep)
            if dep_level > level or (dep_level == level == 2 and dep_part != part):
                wrong.append(f"{module} -> {dep}")
    return wrong


def test_the_proxy_imports_down_its_layers_only():
    """core <- config <- front, origin, disk, fleet (side by side, none importing another) <-
    handler <- ops: each layer can be read and tested over those below it."""
    assert not _layer_violations(_graph())


def test_a_planted_back_edge_is_caught():
    graph = _graph()
    for planted in (("proxy.core.store", "proxy.config.settings"),
                    ("proxy.disk.store", "proxy.fleet.shared"),
                    ("proxy.handler.server", "proxy.ops.admin")):  # fmt: skip
        graph[planted[0]] = graph[planted[0]] | {planted[1]}
        assert _layer_violations(graph) == [" -> ".join(planted)]
        graph[planted[0]] = graph[planted[0]] - {planted[1]}


def test_every_module_of_the_proxy_is_in_a_layer():
    modules = [m for m in _graph() if m.startswith("proxy.")]
    assert all(m.split(".")[1] in LAYERS for m in modules), modules
    assert {m.split(".")[1] for m in modules} == set(LAYERS)


# aiohttp's public API: what any layer may import from it (``aiohttp.http`` exports its parsers
# and writer by name).
AIOHTTP_PUBLIC = {"aiohttp", "aiohttp.web", "aiohttp.abc", "aiohttp.http"}
# Where the proxy reaches past it: the connection front and the origin client.
AIOHTTP_SEAM = ("proxy.front.", "proxy.origin.")


def _aiohttp_imports() -> dict[str, set[tuple[str, str]]]:
    """Each proxy module's imports from aiohttp: (module, name)."""
    found: dict[str, set[tuple[str, str]]] = {}
    for path in (ROOT / "proxy").rglob("*.py"):
        uses = found.setdefault(_module(path), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
                uses.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                uses.update((a.name, "") for a in node.names if a.name.startswith("aiohttp"))
    return found


def test_only_the_front_and_the_origin_client_reach_past_aiohttps_public_api():
    wrong = {
        module: sorted(m for m, _ in uses if m not in AIOHTTP_PUBLIC)
        for module, uses in _aiohttp_imports().items()
        if not module.startswith(AIOHTTP_SEAM)
    }
    assert not {m: u for m, u in wrong.items() if u}, wrong


def test_every_aiohttp_internal_the_seam_uses_is_in_the_installed_aiohttp():
    """pyproject pins aiohttp to one minor version for these: an upgrade that moves one fails
    here, naming it, rather than somewhere in a request."""
    import importlib

    from aiohttp import web
    from aiohttp.http import StreamWriter

    missing = [
        f"{module}.{name}"
        for module, uses in _aiohttp_imports().items()
        if module.startswith(AIOHTTP_SEAM)
        for module_name, name in uses
        if module_name not in AIOHTTP_PUBLIC
        and not hasattr(importlib.import_module(module_name), name)
    ]
    # The private attributes the front overrides or reads (proxy/front/writer.py).
    attributes = [
        (StreamWriter, "_headers_buf"),
        (web.Server, "_make_request"),
        (web.Server, "_kwargs"),
        (web.StreamResponse, "_prepare_headers"),
        (web.RequestHandler, "_loop"),
    ]
    missing += [
        f"{cls.__name__}.{name}"
        for cls, name in attributes
        if not hasattr(cls, name)
        and name not in getattr(cls, "__slots__", ())
        and name not in _instance_attributes(cls)
    ]
    assert not missing, missing


def _instance_attributes(cls: type) -> set[str]:
    """The attributes ``cls.__init__`` (or its bases') sets on an instance."""
    import inspect

    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            tree = ast.parse(inspect.getsource(init).strip())
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names
