"""The distribution ships every package of the repository.

``pyproject.toml`` lists the packages explicitly (``executor/`` installs as ``agentsafe.executor``
through ``package-dir``). The editable install the tests use finds a package that is missing from
the list anyway, so only a non-editable install (the image) would lose it: this test keeps the
list equal to the folders.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOPS = {"executor": "agentsafe.executor", "operator": "agentsafe.operator"}


def _folders() -> set[str]:
    found: set[str] = set()
    for top, name in TOPS.items():
        for init in (REPO / top).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / top).parts
            found.add(".".join((name, *relative)))
    return found


def test_every_package_folder_is_in_the_distribution() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    data_only = set(setuptools["package-data"]) - _folders()  # e.g. executor/examples (YAML only)
    assert sorted(setuptools["packages"]) == sorted(_folders() | data_only)
    assert setuptools["package-dir"] == {name: top for top, name in TOPS.items()}


def test_the_folders_are_found() -> None:
    folders = _folders()
    assert {"agentsafe.executor.egress", "agentsafe.executor.plans"} <= folders
    assert "agentsafe.operator.render" in folders
