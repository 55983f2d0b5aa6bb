"""Principals files for integration tests: real bearer tokens, their digests in the file."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentsafe.executor.tools.harness import DEMO_TENANT

OPERATOR_ID = "ops-oncall"
APPROVERS_OPERATOR_ID = "approvals-admin"
"""An OPERATOR with only the ``approvers`` scope (issue 21): enrolment tokens, cancellations."""

LEGACY_KEYS = (
    "EXECUTOR_TENANT_ID",
    "EXECUTOR_ACTOR_ID",
    "EXECUTOR_ACTOR_TYPE",
    "EXECUTOR_ACTOR_RUNTIME",
    "EXECUTOR_CALLER_TOKEN",
)


@dataclass
class BearerPrincipals:
    """A proposer, two approvers and an operator, each with a bearer token; with
    ``approvers_operator``, also :data:`APPROVERS_OPERATOR_ID`."""

    tokens: dict[str, str] = field(default_factory=dict)
    approvers_operator: bool = False

    def token(self, principal_id: str) -> str:
        return self.tokens.setdefault(principal_id, secrets.token_urlsafe(24))

    def document(self) -> dict[str, Any]:
        def bearer(pid: str) -> dict[str, str]:
            digest = hashlib.sha256(self.token(pid).encode()).hexdigest()
            return {"kind": "BEARER", "token_sha256": digest}

        extra: list[dict[str, Any]] = []
        if self.approvers_operator:
            extra.append(
                {
                    "id": APPROVERS_OPERATOR_ID,
                    "role": "OPERATOR",
                    "actor": {"id": "dave@bank.example", "type": "HUMAN"},
                    "scopes": ["approvers"],
                    "credential": bearer(APPROVERS_OPERATOR_ID),
                }
            )
        return {
            "version": "agent-safe.principals/1",
            "principals": [
                *extra,
                {
                    "id": "treasury-workflow",
                    "role": "PROPOSER",
                    "tenant_id": DEMO_TENANT,
                    "actor": {"id": "synthetic-payout-agent", "type": "AI_AGENT"},
                    "allowed_actions": ["create_payout"],
                    "credential": bearer("treasury-workflow"),
                },
                {
                    "id": "treasury-lead",
                    "role": "APPROVER",
                    "actor": {"id": "alice@bank.example", "type": "HUMAN"},
                    "credential": bearer("treasury-lead"),
                },
                {
                    "id": "risk-officer",
                    "role": "APPROVER",
                    "actor": {"id": "bob@bank.example", "type": "HUMAN"},
                    "credential": bearer("risk-officer"),
                },
                {
                    "id": "ops-oncall",
                    "role": "OPERATOR",
                    "actor": {"id": "carol@bank.example", "type": "HUMAN"},
                    "scopes": ["halt", "resume", "status", "metrics", "secrets.reload", "evidence"],
                    "credential": bearer("ops-oncall"),
                },
            ],
        }

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.document()))
        os.chmod(path, 0o600)
        return path


def principals_env(env: dict[str, str], principals_file: Path, **extra: str) -> dict[str, str]:
    out = {k: v for k, v in env.items() if k not in LEGACY_KEYS}
    out["EXECUTOR_PRINCIPALS_FILE"] = str(principals_file)
    out.update(extra)
    return out
