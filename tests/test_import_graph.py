"""No import circle between the modules of middlebox/.

A circle (`runner -> report -> runner`, as there was) means neither side can be read, tested
or replaced alone, and which module "wins" depends on who is imported first. The graph is
built from the source with `ast` (every import, lazy ones inside functions included, since a
lazy import only hides a circle), over the modules of the middlebox package; an edge
`a -> b` is "a imports b, or a name from b". The check is shown failing on a small synthetic
package first, then passing on the real tree.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_of(path: str) -> str:
    """`middlebox/run/suite.py` -> `middlebox.run.suite`; a package is its `__init__`."""
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: str, source: str) -> set[str]:
    """Every dotted name the module imports: `from a.b import c` gives `a.b` and `a.b.c`
    (c may be a module or a name in a.b); relative imports resolve against the package."""
    package = module_of(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports (itself and outside modules left out).

    Importing `a.b.c` runs `a/__init__` and `a/b/__init__` too, but a package's own
    `__init__` importing its children is how packages are built, not a circle, so an edge
    goes to the named module only."""
    modules = {module_of(path): path for path in sources}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {name for name in imports_of(path, sources[path]) if name in modules}
        graph[module] = targets - {module}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan's
    algorithm, iterative), each shown as a path that returns to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [circle_through(graph, component) for component in components]


def circle_through(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    return component  # unreachable for a strongly connected component


def middlebox_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "middlebox").rglob("*.py"))
    }


# -- the check, failing on small examples ---------------------------------------------------


def test_a_two_module_circle_is_found_and_shown_as_a_path() -> None:
    sources = {
        "pkg/__init__.py": "",
        "pkg/runner.py": "from pkg.report import scorecard\n",
        "pkg/report.py": "def scorecard():\n    from pkg.runner import run_suite\n",
    }
    assert cycles(import_graph(sources)) == [["pkg.report", "pkg.runner", "pkg.report"]]


def test_a_longer_circle_through_a_relative_import_is_found() -> None:
    sources = {
        "pkg/__init__.py": "",
        "pkg/run/__init__.py": "",
        "pkg/run/suite.py": "from ..report import html\n",
        "pkg/report/__init__.py": "",
        "pkg/report/html.py": "from . import layout\n",
        "pkg/report/layout.py": "import pkg.run.suite\n",
    }
    assert cycles(import_graph(sources)) == [
        ["pkg.report.html", "pkg.report.layout", "pkg.run.suite", "pkg.report.html"]
    ]


def test_a_chain_without_a_way_back_is_no_circle_until_its_end_imports_the_start() -> None:
    sources = {
        "pkg/__init__.py": "from pkg import a\n",
        "pkg/a.py": "from pkg.b import thing\nimport json\n",
        "pkg/b.py": "from pkg.c import other\n",
        "pkg/c.py": "other = 1\n",
    }
    graph = import_graph(sources)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}  # json is not ours
    assert cycles(graph) == []
    sources["pkg/c.py"] = "import pkg\n"  # the package, whose __init__ imports a
    assert cycles(import_graph(sources)) == [["pkg", "pkg.a", "pkg.b", "pkg.c", "pkg"]]


# -- the real tree ----------------------------------------------------------------------------


def test_the_graph_of_middlebox_sees_the_modules_and_their_imports() -> None:
    graph = import_graph(middlebox_sources())
    assert "middlebox.run.suite" in graph and "middlebox.report.scorecard" in graph
    assert "middlebox.report.scorecard" in graph["middlebox.run.suite"]


def test_there_is_no_import_circle_between_the_modules_of_middlebox() -> None:
    found = cycles(import_graph(middlebox_sources()))
    assert found == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in found)
