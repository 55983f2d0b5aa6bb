"""No import cycle among the modules of ``executor/`` and ``operator/``.

A module-level import (``if TYPE_CHECKING:`` blocks included: a cycle there still ties two
modules to each other's shape) is an edge; a lazy import inside a function is not. The last
cycle, ``routes/app.py`` <-> ``routes/contract.py`` through :class:`Route`, ended when the row
moved to ``routes/route.py``. Parses source (``ast``); nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_callers import PACKAGES, REPO, _dotted


def _module_level_imports(path: Path) -> set[str]:
    package = _dotted(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    nodes: list[ast.stmt] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            nodes.append(node)
        elif isinstance(node, ast.If):
            nodes += [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports at module level. ``from pkg import sub`` is an edge to
    ``pkg.sub`` only (every submodule runs its package's ``__init__`` first anyway)."""
    paths = {_dotted(p): p for top in PACKAGES for p in (REPO / top).rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in paths.items():
        found = {m for m in _module_level_imports(path) if m in paths and m != name}
        out[name] = {m for m in found if not any(o.startswith(m + ".") for o in found)}
    return out


KNOWN: list[list[str]] = []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_level_import_cycle() -> None:
    assert [c for c in cycles(graph()) if c not in KNOWN] == []


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
