"""The kopf contract in ``pyproject.toml`` names every operator module but the kopf boundary.

import-linter's forbidden contract takes a list of modules: one added to ``operator/`` and
forgotten there could import kopf unseen. This test keeps the list equal to the folder.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KOPF_BOUNDARY = {"handlers", "cli"}


def test_every_operator_step_is_forbidden_kopf() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [kopf] = [
        c
        for c in contracts["contracts"]
        if c["type"] == "forbidden" and c["forbidden_modules"] == ["kopf"]
    ]
    tops = {
        path.stem if path.is_file() else path.name
        for path in (REPO / "operator").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    expected = {f"agentsafe.operator.{name}" for name in tops - KOPF_BOUNDARY}
    assert set(kopf["source_modules"]) == expected
