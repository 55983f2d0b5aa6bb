"""Module docstrings' "Callers:" lines stay true.

Every module docstring says its role and its callers. A caller that is a module of this
repository is named by its path in double backticks (````serve.py````, ````routes/app.py````,
````tests/integration/test_demo.py````), and this test checks that the named module really
imports the one whose docstring names it (a lazy import inside a function counts; ``from pkg
import module`` counts). A path is read relative to the module's own folder first, then to its
package root (``executor/`` or ``operator/``), then to the repository root. Prose callers ("the
operator", "tests", "providers") are not checked.

``executor/`` and ``operator/`` are scanned. It parses source (``ast``); nothing is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"executor": "agentsafe.executor", "operator": "agentsafe.operator"}
_CALLERS = re.compile(r"Callers?:(.*?)(?:\n\s*\n|\Z)", re.S)
_PATH = re.compile(r"``([\w./-]+\.py)``")


def _dotted(path: Path) -> str:
    """``agentsafe.executor.routes.app`` for ``executor/routes/app.py`` (packages without
    ``__init__``)."""
    relative = path.relative_to(REPO)
    top, *rest = relative.with_suffix("").parts
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    if top in PACKAGES:
        return ".".join([PACKAGES[top], *rest])
    return ".".join([top, *rest])


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, resolved to absolute dotted names."""
    package = _dotted(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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


def _resolve(token: str, module: Path) -> Path | None:
    top = module.relative_to(REPO).parts[0]
    for base in (module.parent, REPO / top, REPO):
        candidate = base / token
        if candidate.is_file():
            return candidate
    return None


def claims() -> list[tuple[str, str]]:
    """(module, caller token) for every caller path in a "Callers:" paragraph."""
    out: list[tuple[str, str]] = []
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            for paragraph in _CALLERS.findall(doc):
                for token in _PATH.findall(paragraph):
                    out.append((path.relative_to(REPO).as_posix(), token))
    return out


@pytest.mark.parametrize(("module", "caller"), claims())
def test_a_named_caller_imports_the_module(module: str, caller: str) -> None:
    path = REPO / module
    found = _resolve(caller, path)
    assert found is not None, f"{module}: its docstring names {caller}, which does not exist"
    assert _dotted(path) in _imports(found), (
        f"{module}: its docstring names {caller} as a caller, but {caller} does not import it"
    )


def test_the_claims_are_found() -> None:
    found = claims()
    assert ("executor/assembly.py", "serve.py") in found
    assert ("operator/reconcile.py", "handlers.py") in found
    assert len(found) > 40


def test_the_checker_reads_imports() -> None:
    imports = _imports(REPO / "executor" / "routes" / "door.py")
    assert "agentsafe.executor.door.door" in imports  # from ..door.door import Door
    assert _dotted(REPO / "executor" / "plans" / "__init__.py") == "agentsafe.executor.plans"
    assert _resolve("app.py", REPO / "executor" / "routes" / "door.py") == (
        REPO / "executor" / "routes" / "app.py"
    )


# ---------------------------------------------------------------------- completeness

MAIN_CALLERS = "main callers"
"""A "Callers:" paragraph that says this names only its main callers: a module imported nearly
everywhere (``codes.py``, ``errors.py``) is exempt from naming every importer."""


def modules() -> list[Path]:
    return [
        path
        for top in PACKAGES
        for path in sorted((REPO / top).rglob("*.py"))
        if path.name != "__init__.py"
    ]


def importers() -> dict[Path, set[Path]]:
    """For every module of ``executor/`` and ``operator/``, the modules there that import it."""
    by_name = {_dotted(path): path for top in PACKAGES for path in (REPO / top).rglob("*.py")}
    found: dict[Path, set[Path]] = {path: set() for path in by_name.values()}
    for path in by_name.values():
        for name in _imports(path):
            target = by_name.get(name)
            if target is not None and target != path:
                found[target].add(path)
    return found


def _named(path: Path) -> tuple[set[Path], bool]:
    """The modules ``path``'s "Callers:" paragraphs name, and whether one says main callers."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    named: set[Path] = set()
    main = False
    for paragraph in _CALLERS.findall(doc):
        main = main or MAIN_CALLERS in " ".join(paragraph.split())
        for token in _PATH.findall(paragraph):
            found = _resolve(token, path)
            if found is not None:
                named.add(found)
    return named, main


def omissions() -> dict[str, list[str]]:
    """module -> the importers its "Callers:" line omits (modules that say main callers and
    modules no other module imports are complete)."""
    out: dict[str, list[str]] = {}
    every = importers()
    for path in modules():
        callers = every.get(path, set())
        if not callers:
            continue
        named, main = _named(path)
        if main:
            continue
        missing = sorted(p.relative_to(REPO).as_posix() for p in callers - named)
        if missing:
            out[path.relative_to(REPO).as_posix()] = missing
    return out


def test_every_importer_is_named_or_the_line_says_main_callers() -> None:
    missing = omissions()
    assert missing == {}, (
        f"{len(missing)} modules' Callers: lines omit importers (name them, or say "
        f'"{MAIN_CALLERS}"): {missing}'
    )


def test_the_importers_are_found() -> None:
    every = importers()
    assert REPO / "executor" / "serve.py" in every[REPO / "executor" / "assembly.py"]
    assert REPO / "operator" / "handlers.py" in every[REPO / "operator" / "reconcile.py"]
