"""The lowest version each range of an extra allows is one agentsafe runs with (issue 31).

``plans = ["mcp>=1.0,<3"]`` let pip install mcp 1.x, with which ``agentsafe mcp`` died with
``ModuleNotFoundError: mcp_types`` while ``pip check`` saw nothing wrong. For each extra, a
throwaway venv gets the extra's requirements at their lowest versions (``uv pip install
--resolution lowest-direct``, the ranges read from pyproject.toml, so the test follows them) and
sees agentsafe and its base dependencies from this environment (a ``.pth``, as
``tests/integration/test_handler_package.py`` does); then what needs the extra runs for real:

- ``plans``: ``agentsafe mcp`` over stdio answers an MCP ``initialize``;
- ``signing``: ``tests/egress/test_httpsig.py`` cross-checks our RFC 9421 builder against
  ``http-message-signatures``;
- ``operator``: ``agentsafe operator --help`` and the modules that import kopf and
  kubernetes_asyncio.

Needs the package registry (PyPI through this machine's proxy, as in CI); slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).parent / "uv"
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
CLI = "import sys; from agentsafe.executor.cli import main; sys.exit(main())"


def _venv(root: Path, extra: str) -> Path:
    """A venv holding ``extra``'s requirements at their lowest versions; agentsafe and the
    rest come from this environment, after them on sys.path. Returns its python."""
    env = {**os.environ, "UV_NO_CONFIG": "1"}
    subprocess.run(
        [str(UV), "venv", "--quiet", "--python", sys.executable, str(root / "venv")],
        check=True,
        env=env,
    )
    python = root / "venv" / "bin" / "python"
    installed = subprocess.run(
        [
            str(UV),
            "pip",
            "install",
            "--python",
            str(python),
            "--resolution",
            "lowest-direct",
            *EXTRAS[extra],
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "agentsafe-base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def _seen(python: Path, name: str) -> str:
    code = f"from importlib.metadata import version; print(version({name!r}))"
    seen = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return seen.stdout.strip()


@pytest.mark.parametrize("extra", ["plans", "signing", "operator"])
def test_the_lowest_versions_of_each_extra_run(tmp_path: Path, extra: str) -> None:
    python = _venv(tmp_path, extra)
    for line in EXTRAS[extra]:
        requirement = Requirement(line)
        got = Version(_seen(python, requirement.name))
        bound = min(Version(s.version) for s in requirement.specifier if s.operator == ">=")
        # the lowest release within the range (kubernetes_asyncio has no 31.0.0: 31.1.0)
        assert got in requirement.specifier, (line, str(got))
        assert got.major == bound.major, (line, str(got))
    RUN[extra](python, tmp_path)


def _plans(python: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t" * 40)
    process = subprocess.Popen(
        [str(python), "-c", CLI, "mcp", "--url", "http://127.0.0.1:9", "--token-file", str(token)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        text=True,
    )
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "extras-test", "version": "1"},
        },
    }
    try:
        out, err = process.communicate(json.dumps(initialize) + "\n", timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines, err[-4000:]
    assert lines[0]["id"] == 1, (lines, err[-4000:])
    assert "serverInfo" in lines[0]["result"], (lines, err[-4000:])


def _signing(python: Path, tmp_path: Path) -> None:
    ran = subprocess.run(
        [
            str(python),
            "-P",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(REPO / "tests" / "egress" / "test_httpsig.py"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]


def _operator(python: Path, tmp_path: Path) -> None:
    helped = subprocess.run(
        [str(python), "-c", CLI, "operator", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert helped.returncode == 0, helped.stderr[-4000:]
    code = "import agentsafe.operator.handlers, agentsafe.operator.kubeapi"
    imported = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert imported.returncode == 0, imported.stderr[-4000:]


RUN = {"plans": _plans, "signing": _signing, "operator": _operator}
