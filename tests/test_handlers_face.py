"""The adopters' face (``agentsafe.executor.handlers``) is the only agentsafe path that
docs/handlers.md and the example handler package import, and it re-exports the private homes'
own objects.

Parses source (``ast``) and the page's Python blocks; the face itself is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentsafe.executor import handlers
from agentsafe.executor.dispatch import registration, seam
from agentsafe.executor.plans import execute

REPO = Path(__file__).resolve().parent.parent
FACE = "agentsafe.executor.handlers"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _sources() -> list[tuple[str, str]]:
    out = [
        (path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"))
        for path in sorted((REPO / "examples" / "handlers").rglob("*.py"))
    ]
    page = (REPO / "docs" / "handlers.md").read_text(encoding="utf-8")
    out += [(f"docs/handlers.md#{i}", block) for i, block in enumerate(_BLOCK.findall(page))]
    return out


def agentsafe_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) of every import of agentsafe in ``source``; name is None for ``import``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "agentsafe"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "agentsafe":
            found += [(node.module or "", a.name) for a in node.names]
    return found


@pytest.mark.parametrize(("where", "source"), _sources())
def test_docs_and_examples_import_only_the_face(where: str, source: str) -> None:
    for module, name in agentsafe_imports(source):
        assert module == FACE, f"{where} imports {module}, not the public face {FACE}"
        assert name in handlers.__all__, f"{where} imports {name}, which the face does not export"


def test_the_sources_are_found_and_import_the_face() -> None:
    sources = _sources()
    assert any(where.startswith("examples/handlers/") for where, _ in sources)
    assert any(where.startswith("docs/handlers.md") for where, _ in sources)
    assert any(agentsafe_imports(source) for _, source in sources)


def test_the_checker_sees_a_private_path() -> None:
    imports = agentsafe_imports("from agentsafe.executor.dispatch.seam import Dispatch\n")
    assert imports == [("agentsafe.executor.dispatch.seam", "Dispatch")]


def test_the_face_re_exports_the_private_homes_objects() -> None:
    assert set(handlers.__all__) >= {
        "Seam",
        "Handler",
        "ExecutionContext",
        "Dispatch",
        "Outcome",
        "ReconcileResult",
    }
    assert handlers.Seam is registration.Seam
    assert handlers.Dispatch is seam.Dispatch
    assert handlers.ExecutionContext is seam.ExecutionContext
    assert handlers.Handler is seam.Handler
    assert handlers.Outcome is seam.Outcome
    assert handlers.ReconcileResult is seam.ReconcileResult
    assert handlers.StepRequest is execute.StepRequest
    for name in handlers.__all__:
        assert getattr(handlers, name) is not None
