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
    "wire": 1,
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
    """core <- config, wire <- front, origin, disk, fleet (side by side, none importing
    another) <- handler <- ops: each layer can be read and tested over those below it."""
    assert not _layer_violations(_graph())


def test_a_planted_back_edge_is_caught():
    graph = _graph()
    for planted in (("proxy.core.store", "proxy.config.settings"),
                    ("proxy.disk.store", "proxy.fleet.shared"),
                    ("proxy.handler.server", "proxy.ops.admin")):  # fmt: skip
        graph[planted[0]] = graph[planted[0]] | {planted[1]}
        assert _layer_violations(graph) == [" -> ".join(planted)]
        graph[planted[0]] = graph[planted[0]] - {planted[1]}


# The load generator's layers, bottom up, one package each: workloads and traces; the offline
# simulation over them; the reports of either's cells; live load and the experiments that use
# all three; the command line.
LOADGEN_LAYERS = {"traces": 0, "sim": 1, "reports": 2, "live": 3, "__main__": 4}


def _loadgen_violations(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` that go up the load generator's layers."""
    return [
        f"{module} -> {dep}"
        for module, deps in graph.items()
        if module.startswith("loadgen.")
        for dep in deps
        if dep.startswith("loadgen.")
        and LOADGEN_LAYERS[dep.split(".")[1]] > LOADGEN_LAYERS[module.split(".")[1]]
    ]


def test_the_load_generator_imports_down_its_layers_only():
    """traces <- sim <- reports <- live <- the command line."""
    graph = _graph()
    assert {m.split(".")[1] for m in graph if m.startswith("loadgen.")} == set(LOADGEN_LAYERS)
    assert not _loadgen_violations(graph)
    graph["loadgen.sim.tiers"] = graph["loadgen.sim.tiers"] | {"loadgen.reports.report"}
    assert _loadgen_violations(graph) == ["loadgen.sim.tiers -> loadgen.reports.report"]


def test_every_module_of_the_proxy_is_in_a_layer():
    modules = [m for m in _graph() if m.startswith("proxy.")]
    assert all(m.split(".")[1] in LAYERS for m in modules), modules
    assert {m.split(".")[1] for m in modules} == set(LAYERS)
