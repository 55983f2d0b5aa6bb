"""The package list, found from pyproject.toml's ``package-dir`` mapping (issue 31).

``executor/`` installs as ``agentsafe.executor``, ``executor/client/`` as ``agentsafe.client`` and
``operator/`` as ``agentsafe.operator``: a mapping setuptools' own ``find:`` cannot follow (it
names packages after their folder). Every folder under a mapped root is a package of that name
(``find_namespace_packages``, so a data-only folder such as ``routes/page`` is one too), except a
folder mapped on its own. ``tests/test_packaging.py`` builds the wheel and compares.

Callers: setuptools (``pip install .``, ``pip wheel``), ``tests/test_packaging.py``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent


def packages() -> list[str]:
    config = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    found = []
    for name, folder in mapping.items():
        own = [
            Path(other).relative_to(folder).as_posix().replace("/", ".")
            for other in mapping.values()
            if other != folder and other.startswith(folder + "/")
        ]
        exclude = ["*__pycache__*", *own, *(f"{o}.*" for o in own)]
        below = find_namespace_packages(str(HERE / folder), exclude=exclude)
        found += [name, *(f"{name}.{package}" for package in below)]
    return sorted(found)


if __name__ == "__main__":
    setup(packages=packages())
