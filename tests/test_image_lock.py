"""image-requirements.txt, the image's hashed lock (issue 22), follows pyproject.toml.

The image installs exactly the lock (pip ``--require-hashes --no-deps``), so a dependency added
to pyproject.toml but not to the lock would be missing from the image: every runtime and
operator dependency and every build requirement must be pinned there, with hashes, and nothing
development-only may be. ``make lock`` regenerates it; ``make image`` checks the image against it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "image-requirements.txt"


def _name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]).lower()


def _pins() -> dict[str, list[str]]:
    pins: dict[str, list[str]] = {}
    current = ""
    for line in LOCK.read_text().splitlines():
        if line and not line[0].isspace() and "==" in line:
            current = _name(line)
            pins[current] = []
        elif "--hash=sha256:" in line:
            pins[current].append(line.split("--hash=sha256:", 1)[1].split()[0])
    return pins


def test_every_runtime_dependency_is_pinned_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = {
        _name(spec)
        for spec in [
            *project["project"]["dependencies"],
            *project["project"]["optional-dependencies"]["operator"],
            *project["build-system"]["requires"],
        ]
    }
    pins = _pins()
    assert wanted <= set(pins), f"run make lock: {sorted(wanted - set(pins))}"
    assert all(len(h) == 64 for hashes in pins.values() for h in hashes)
    assert all(pins.values()), [name for name, hashes in pins.items() if not hashes]


def test_no_development_only_package_is_in_the_lock() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    dev = {_name(spec) for spec in project["project"]["optional-dependencies"]["dev"]}
    runtime = {_name(spec) for spec in project["project"]["dependencies"]}
    build = {_name(spec) for spec in project["build-system"]["requires"]}  # agentsafe's own build
    assert (dev - runtime - build) & set(_pins()) == set()
    assert "pydantic-settings" not in _pins()
