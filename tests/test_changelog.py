"""CHANGELOG.md is held to the public names that change (issue 31).

``tests/contract/released-names.json`` records the configuration variables, the codes (with
their HTTP status) and the routes as of the last release. Every name added or removed since,
and every code whose status changed, must be named in backticks in CHANGELOG.md's "Unreleased"
section, as docs/versioning.md requires. Cutting a release moves that section under its version
and records the names again: ``AGENTSAFE_WRITE_RELEASED_NAMES=1 .venv/bin/pytest
tests/test_changelog.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from agentsafe.executor.codes import Code
from agentsafe.executor.config import CONFIG_KEYS

from .routes.test_table import every_route

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "contract" / "released-names.json"
CHANGELOG = REPO / "CHANGELOG.md"


def public_names() -> dict[str, Any]:
    """The names this check holds the changelog to, as the code has them now."""
    return {
        "settings": sorted(CONFIG_KEYS),
        "codes": {code.value: code.status for code in sorted(Code, key=lambda c: c.value)},
        "routes": sorted({f"{route.method} {route.path}" for route in every_route()}),
    }


def unreleased() -> str:
    text = CHANGELOG.read_text(encoding="utf-8")
    match = re.search(r"^## Unreleased\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "CHANGELOG.md has no '## Unreleased' section"
    return match.group(1)


def changed_names(released: dict[str, Any], now: dict[str, Any]) -> dict[str, str]:
    """Each changed name, with what changed (added, removed, status a -> b)."""
    changes: dict[str, str] = {}
    for kind in ("settings", "routes"):
        before, after = set(released[kind]), set(now[kind])
        changes.update({name: "added" for name in after - before})
        changes.update({name: "removed" for name in before - after})
    before_codes, after_codes = released["codes"], now["codes"]
    for code in after_codes.keys() - before_codes.keys():
        changes[code] = "added"
    for code in before_codes.keys() - after_codes.keys():
        changes[code] = "removed"
    for code in after_codes.keys() & before_codes.keys():
        if after_codes[code] != before_codes[code]:
            changes[code] = f"status {before_codes[code]} -> {after_codes[code]}"
    return changes


def test_every_changed_public_name_is_in_the_changelog() -> None:
    now = public_names()
    if os.environ.get("AGENTSAFE_WRITE_RELEASED_NAMES") == "1":
        SNAPSHOT.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    released = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    section = unreleased()
    missing = {}
    for name, change in sorted(changed_names(released, now).items()):
        # a route is named by its path; a setting or a code by itself
        named = name.split(" ", 1)[-1]
        if f"`{named}`" not in section and f"`{name}`" not in section:
            missing[name] = change
    assert not missing, (
        "CHANGELOG.md's Unreleased section does not name these changed public names "
        f"(docs/versioning.md): {missing}"
    )


def test_the_check_sees_a_change() -> None:
    """The comparison itself: an added, a removed and a re-statused name are each reported."""
    released = {"settings": ["A", "B"], "routes": ["GET /x"], "codes": {"C": 409, "D": 400}}
    now = {"settings": ["B", "E"], "routes": ["GET /x", "POST /y"], "codes": {"C": None, "F": 1}}
    assert changed_names(released, now) == {
        "A": "removed",
        "E": "added",
        "POST /y": "added",
        "C": "status 409 -> None",
        "D": "removed",
        "F": "added",
    }
