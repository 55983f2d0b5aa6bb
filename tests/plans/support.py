"""Shared builders for the plan-boundary tests: a policy, plans with correct digests, a
context, real Ed25519 keys, a real SQLite use store, and host objects that record calls."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.clock import ManualClock, parse_ms
from agentsafe.executor.grants import SigningKey
from agentsafe.executor.plans import (
    Ed25519Signer,
    StepRequest,
    StepResult,
    operation_digest,
)

NOW = "2026-07-10T20:00:00.000Z"
NOW_S = parse_ms(NOW)
OBSERVED = "2026-07-10T19:59:30.000Z"
FINGERPRINT = sha256_digest({"queryPlan": "incidents-by-status"})


def policy(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "allowedTools": ["query"],
        "allowedEffects": ["read"],
        "sources": {
            "incidents": {
                "fields": ["OBJECTID", "status", "severity"],
                "authorizationScope": ["incidents:read", "incidents:list"],
                "schemaVersions": ["schema-7"],
                "sourceVersions": ["snapshot-9"],
                "dataModes": ["live"],
                "maxProvenanceAgeMs": 60_000,
                "citationOrigins": ["https://data.example.test"],
                "citationResourcePrefixes": ["/incidents"],
            }
        },
        "maxSteps": 4,
        "maxRows": 500,
        "maxBytes": 2_000_000,
        "maxFieldsPerStep": 16,
        "maxAuthorizationScopesPerSource": 8,
        "maxCitationsPerSource": 4,
        "maxOperationParameterBytes": 16_384,
        "maxOperationParameterNodes": 256,
        "maxOperationParameterDepth": 8,
    }
    base.update(overrides)
    return base


def binding(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "incidents",
        "schemaVersion": "schema-7",
        "sourceVersion": "snapshot-9",
        "authorizationScope": ["incidents:read"],
        "dataMode": "live",
        "observedAt": OBSERVED,
        "attribution": "City incident feed",
        "citations": ["https://data.example.test/incidents/open"],
    }
    base.update(overrides)
    return base


def parameters(step_id: str) -> dict[str, Any]:
    return {"where": "status = 'open'", "limit": 50, "step": step_id}


def step(step_id: str = "query-incidents", **overrides: Any) -> dict[str, Any]:
    fields = overrides.pop("fields", ["OBJECTID", "status"])
    tool = overrides.pop("tool", "query")
    effect = overrides.pop("effect", "read")
    source = overrides.pop("source", binding())
    params = overrides.pop("parameters", parameters(step_id))
    fingerprint = overrides.pop("queryPlanFingerprint", FINGERPRINT)
    out = {
        "id": step_id,
        "tool": tool,
        "effect": effect,
        "fields": fields,
        "maxRows": 200,
        "maxBytes": 100_000,
        "queryPlanFingerprint": fingerprint,
        "parametersDigest": sha256_digest(params),
        "source": source,
    }
    out["operationDigest"] = operation_digest(
        tool=tool,
        effect=effect,
        source_id=source["id"],
        query_plan_fingerprint=fingerprint,
        fields=fields,
        parameters_digest=out["parametersDigest"],
    )
    out.update(overrides)
    return out


def plan(*steps: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "plan-1",
        "actor": "agent:triage",
        "provider": "example-provider",
        "model": "example-model",
        "steps": list(steps) or [step()],
    }
    base.update(overrides)
    return base


def operation(step_id: str = "query-incidents", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tool": "query",
        "effect": "read",
        "sourceId": "incidents",
        "fields": ["OBJECTID", "status"],
        "queryPlanFingerprint": FINGERPRINT,
        "parameters": parameters(step_id),
    }
    base.update(overrides)
    return base


def context(**overrides: Any) -> dict[str, Any]:
    return {"sources": {"incidents": binding(**overrides)}}


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "approval-42",
        "approver": "reviewer@example.test",
        "issuedAt": NOW,
        "expiresAt": "2026-07-10T20:05:00.000Z",
    }
    base.update(overrides)
    return base


def signer() -> Ed25519Signer:
    return Ed25519Signer(SigningKey.generate())


def deep(value: Any) -> Any:
    """A plain mutable copy (of a frozen snapshot too)."""
    from agentsafe.executor.plans import thaw

    return copy.deepcopy(thaw(value))


@dataclass
class MemoryAudit:
    """An audit sink that keeps events; it can be told to fail on the n-th append."""

    events: list[dict[str, Any]] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)

    async def append(self, event: Mapping[str, Any]) -> None:
        if event["event"] in self.fail_on:
            raise OSError("disk full")
        self.events.append(deep(event))

    def kinds(self) -> list[str]:
        return [e["event"] for e in self.events]


@dataclass
class RecordingExecutor:
    """A host executor bound to one tool/effect; counts its calls."""

    tool: str = "query"
    effect: str = "read"
    value: Any = field(default_factory=lambda: [{"OBJECTID": 1, "status": "open"}])
    rows: int | None = 1
    fail: bool = False
    calls: list[StepRequest] = field(default_factory=list)

    async def execute(self, request: StepRequest) -> StepResult:
        self.calls.append(request)
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("secret backend error text")
        return StepResult(value=self.value, rows=self.rows)  # type: ignore[arg-type]


def manual_clock() -> ManualClock:
    return ManualClock(NOW_S)
