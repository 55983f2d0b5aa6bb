"""The example policy with its ESCALATE rule asking a verification level (issue 21)."""

from __future__ import annotations

from pathlib import Path

import yaml

from agentsafe.executor.tools.harness import EXAMPLE_POLICY


def approval_policy(path: Path, verification: str | None) -> Path:
    """Write the example policy to ``path``; with ``verification``, its ``medium`` rule (the one
    that escalates, to ``treasury-lead`` only) carries ``approval: {verification: ...}``."""
    document = yaml.safe_load(EXAMPLE_POLICY.read_text(encoding="utf-8"))
    if verification is not None:
        for action in document["actions"]:
            for rule in action["rules"]:
                if rule["verdict"] == "ESCALATE":
                    rule["approval"] = {"verification": verification}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path
