"""No module imports a higher floor at run time (issue 32).

``lint-imports`` sees every import, but a layer contract is about what a module may know; an
import inside a function is still a run-time dependency on what it names, and hiding an upward
one there defeats the layering. This test parses every executor module (``ast``; nothing is
imported) and refuses an import made below module level (in a function or a class body, outside
``if TYPE_CHECKING:``) of a module on a higher floor. The floors are read from pyproject's
contracts: the ground floor, then the wings bottom to top, then the process modules, then
``tools/``, then ``cli.py`` (it dispatches to every subcommand).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXECUTOR = REPO / "executor"
PACKAGE = "agentsafe.executor"
PROCESS = ("assembly", "plane", "serve", "proxy", "supervisor")


def floors() -> dict[str, int]:
    """Each ground-floor module, wing and process module, with its floor (0 is the lowest)."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    out: dict[str, int] = {}
    for contract in contracts:
        if contract["name"].startswith("the ground floor"):
            out.update(dict.fromkeys(contract["source_modules"], 0))
    layers = next(c["layers"] for c in contracts if c.get("type") == "layers")
    for floor, layer in enumerate(reversed(layers), start=1):
        out.update(dict.fromkeys((m.strip() for m in layer.split("|")), floor))
    top = len(layers) + 1
    out.update({f"{PACKAGE}.{name}": top for name in PROCESS})
    out[f"{PACKAGE}.tools"] = top + 1
    out[f"{PACKAGE}.cli"] = top + 2  # the command line dispatches to every subcommand
    return out


def floor_of(module: str, table: dict[str, int]) -> int | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        floor = table.get(".".join(parts[:end]))
        if floor is not None:
            return floor
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(EXECUTOR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        anchor = module.split(".")
        if not is_package:
            anchor = anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    names = [f"{base}.{alias.name}" for alias in node.names] if not node.module else [base]
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def deferred_imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every import below module level that runs (not under ``if TYPE_CHECKING:``)."""
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for orelse in child.orelse:
                    walk(orelse, nested)
                continue
            inner = nested or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda
            )
            if nested and isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif nested and isinstance(child, ast.ImportFrom):
                found.extend((child.lineno, n) for n in _resolve(child, module, is_package))
            walk(child, inner)

    walk(tree, False)
    return found


def upward_imports() -> list[str]:
    table = floors()
    out = []
    for path in sorted(EXECUTOR.rglob("*.py")):
        if "client" in path.relative_to(EXECUTOR).parts:
            continue
        module = _module_name(path)
        own = floor_of(module, table)
        if own is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, target in deferred_imports(tree, module, path.name == "__init__.py"):
            floor = floor_of(target, table)
            if floor is not None and floor > own:
                out.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    return out


def test_no_module_imports_a_higher_floor_at_run_time() -> None:
    assert upward_imports() == []


def test_the_check_sees_an_import_inside_a_function() -> None:
    """The check itself: an upward import in a function is found, one under TYPE_CHECKING or at
    module level is not its business."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..plane import Executor\n"
        "def f():\n"
        "    from ..plane import Executor\n"
        "    from . import workgate\n"
    )
    tree = ast.parse(source)
    found = deferred_imports(tree, f"{PACKAGE}.host.halt", False)
    assert found == [(5, f"{PACKAGE}.plane"), (6, f"{PACKAGE}.host.workgate")]
    table = floors()
    assert floor_of(f"{PACKAGE}.plane", table) > floor_of(f"{PACKAGE}.host.halt", table)  # type: ignore[operator]
