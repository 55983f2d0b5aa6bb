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
TOPS = {
    "executor/client": "agentsafe.client",
    "executor": "agentsafe.executor",
    "operator": "agentsafe.operator",
}


def _folders() -> set[str]:
    """Every package folder under its import name; a folder mapped on its own (executor/client
    is agentsafe.client) belongs to that name, never to its parent's."""
    found: set[str] = set()
    for top, name in TOPS.items():
        for init in (REPO / top).rglob("__init__.py"):
            folder = init.parent.relative_to(REPO).as_posix()
            owner = max((t for t in TOPS if folder == t or folder.startswith(t + "/")), key=len)
            if owner != top:
                continue
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
    assert "agentsafe.client" in folders
    assert "agentsafe.executor.client" not in folders


def test_the_client_imports_in_an_installed_environment(tmp_path: Path) -> None:
    """``import agentsafe.client`` works from anywhere (not only from the source tree), and
    importing it loads nothing of the server."""
    import subprocess
    import sys

    code = (
        "import sys, agentsafe.client as c; "
        "assert c.AgentSafeClient and c.Decision; "
        "assert not [m for m in sys.modules if m.startswith(('agentsafe.executor', "
        "'agentsafe.operator'))], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_the_server_reaches_the_client_only_by_its_own_name() -> None:
    """executor/client is also reachable as agentsafe.executor.client on disk; importing it by
    that name (``from ..client``) would load a second copy with distinct classes."""
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "executor").rglob("*.py")
        if "client" not in path.relative_to(REPO / "executor").parts[:1]
        and any(
            marker in path.read_text(encoding="utf-8")
            for marker in ("from ..client", "from .client", "agentsafe.executor.client")
        )
    ]
    assert offenders == []
