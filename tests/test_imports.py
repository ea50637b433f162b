"""No import circle anywhere in `src/ringlet` (issue 17): every `import` of every module, at the top, inside
functions and under `if TYPE_CHECKING:` alike, is an edge of the module graph, and the graph has no
strongly connected component of more than one module (nor a module that imports itself).

Type-only imports count too: a circle that only the type checker sees is still two modules that know each
other, and import-linter (which checks the layers) counts them the same way. Imports built at run time
(`importlib.import_module(name)`) are not statements and are not seen.

An edge goes to the module imported: `import ringlet.a.b` and `from ringlet.a.b import c` are edges to
`ringlet.a.b`, or to `ringlet.a.b.c` when that is a module of its own. Importing a submodule runs its
parent packages' `__init__` too, but those are not edges here: a package that re-exports its submodules
would otherwise be a circle with each of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import ringlet

ROOT = Path(ringlet.__file__).parent
PACKAGE = "ringlet"


def _modules() -> dict[str, Path]:
    """Every module under src/ringlet by dotted name (a package by its own name, for its `__init__.py`)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement may refer to (a module, or a module then a name in it)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:  # relative: from the module's own package, up `level - 1` packages
        package = module if is_package else module.rpartition(".")[0]
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    for alias in node.names:
        yield f"{base}.{alias.name}" if alias.name != "*" else base


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours `name` is or lies in (`ringlet.a.b.c` → `ringlet.a.b` when `c` is a name)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):  # every statement: top level, in functions, under TYPE_CHECKING
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, is_package):
                if name == PACKAGE or name.startswith(PACKAGE + "."):
                    target = _target(name, modules)
                    if target is not None:
                        graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, and modules importing themselves.
    Recursive: the depth is at most the number of modules (a few hundred)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"  {len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def test_the_finder_sees_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert circles(graph) == [["a", "b", "c"], ["e"]]


def test_imports_inside_functions_and_relative_ones_are_edges() -> None:
    modules = {"ringlet.x": Path("x.py"), "ringlet.x.y": Path("y.py"), "ringlet.z": Path("z.py")}
    relative = ast.parse("from . import y\nfrom .y import thing\nfrom .. import z").body
    names = [n for node in relative for n in _imported(node, "ringlet.x", True)]  # type: ignore[arg-type]
    assert [_target(n, modules) for n in names] == ["ringlet.x.y", "ringlet.x.y", "ringlet.z"]
    graph = import_graph()
    assert "ringlet.agent" in graph["ringlet.agent.config.build"]  # `from ringlet.agent import Agent` in build_agent


def test_no_import_circles() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles in src/ringlet:\n" + "\n".join(_describe(c, graph) for c in found)
