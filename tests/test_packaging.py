"""The distribution ships every package of the repository.

``executor/`` installs as ``agentsafe.executor`` (and ``operator/``, ``executor/client/``) through
``package-dir``; ``setup.py`` finds the packages under that mapping, nothing is listed by hand.
The editable install the tests use finds a package that is missing anyway, so only a
non-editable install (the image) would lose it: the wheel is built here and must hold every file
of every package folder, and its build must not warn (issue 31: the hand-listed packages warned
about ``routes/page`` on every install).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

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


def test_the_mapping_is_the_one_setup_py_reads() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in setuptools, "setup.py finds the packages; list none by hand"
    assert setuptools["package-dir"] == {name: top for top, name in TOPS.items()}


def _shipped() -> set[str]:
    """Every file of the three roots the wheel must hold, by its path inside the wheel."""
    files: set[str] = set()
    for top, name in TOPS.items():
        for path in (REPO / top).rglob("*"):
            relative = path.relative_to(REPO)
            if not path.is_file() or "__pycache__" in relative.parts or path.suffix == ".pyc":
                continue
            folder = relative.parent.as_posix()
            owner = max((t for t in TOPS if folder == t or folder.startswith(t + "/")), key=len)
            if owner != top:
                continue
            inside = path.relative_to(REPO / top).as_posix()
            files.add(f"{name.replace('.', '/')}/{inside}")
    return files


@pytest.mark.slow
def test_the_wheel_holds_every_file_and_builds_without_a_warning(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for top in ("executor", "operator"):
        shutil.copytree(
            REPO / top, source / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--verbose",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    output = built.stdout + built.stderr
    assert "absent from the `packages` configuration" not in output, output[-4000:]
    (wheel,) = (tmp_path / "dist").glob("agentsafe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if ".dist-info/" not in n}
    expected = _shipped()
    assert {"agentsafe/executor/routes/page/approve.html", "agentsafe/client/py.typed"} & expected
    assert expected - names == set(), "the wheel lacks these files"
    assert names - expected == set(), "the wheel holds files of no package folder"


def test_the_folders_are_found() -> None:
    folders = _folders()
    assert {"agentsafe.executor.egress", "agentsafe.executor.plans"} <= folders
    assert "agentsafe.operator.render" in folders
    assert "agentsafe.client" in folders
    assert "agentsafe.executor.client" not in folders


def test_the_client_imports_in_an_installed_environment(tmp_path: Path) -> None:
    """``import agentsafe.client`` works from anywhere (not only from the source tree), and
    importing it loads nothing of the server."""
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
