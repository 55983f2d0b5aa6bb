"""The models of the answers that are not refusals: what each route's row declares it returns.

The rows of the route table (``answers=``) name these models; ``routes/openapi.py`` writes their
JSON Schemas into the OpenAPI document, and schemathesis checks every answer of a real
``agentsafe serve`` against them (``tests/routes/test_schemathesis.py``). They describe what the
handlers build (``lifecycle/answers.py``, ``plane.py``, ``routes/approvals.py``): the fields a
client may rely on are listed and typed; an answer may carry more (``extra="allow"``), so a new
field is additive and never breaks a client. The one exception is :class:`Readiness`, anonymous
``/ready``: closed, so that nothing is added to what anyone on the probe port learns.

A refusal is not here: its one shape (``{"error": {"code", "message"}}``) is written by
``routes/openapi.py`` per route and status from ``routes/contract.py``.

Callers: the route modules (their rows), ``routes/openapi.py``.
Also imported by ``app.py``, ``approvals.py``, ``catalog.py``, ``control.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..codes import Code

__all__ = [
    "ActionCatalog",
    "ApprovalList",
    "ApprovalView",
    "AttemptDecided",
    "Decision",
    "Escalation",
    "EvidenceManifest",
    "HaltStatus",
    "Health",
    "Jwks",
    "OpenApiDocument",
    "OpenAttempts",
    "Readiness",
    "ReadinessDetails",
    "SecretsReload",
    "Status",
    "WorkerEntry",
]

_Open = ConfigDict(extra="allow")


class Health(BaseModel):
    """``GET /health``: the process answers."""

    model_config = _Open
    status: Literal["ok"]


ReadyCode = Literal[
    Code.READY,
    Code.RECONCILING,
    Code.EXECUTOR_HALTED,
    Code.STORE_UNAVAILABLE,
    Code.UNKNOWN_ATTEMPTS_OPEN,
]
"""Why the executor is ready or not: the one code ``/ready`` and ``readiness`` carry."""


class Readiness(BaseModel):
    """``GET /ready``: 200 when ready, 503 (same shape) when not. Anyone who reaches the probe
    port may call it, so it says ready or not and one stable code, and nothing else: closed,
    unlike the other answers (a field added here would tell an anonymous peer more); the
    details are ``readiness`` in ``GET /v1/control/status`` (issue 22)."""

    model_config = ConfigDict(extra="forbid")
    ready: bool
    code: ReadyCode


class ReadinessDetails(BaseModel):
    """``readiness`` in ``GET /v1/control/status``: what ``/ready`` decided, and from what."""

    model_config = _Open
    ready: bool
    code: ReadyCode
    mode: str
    actions: list[str]
    unknown_attempts: int = Field(ge=0)
    reconciling: bool
    halted: bool
    store: Literal["sqlite", "postgresql"]
    store_available: bool
    store_lost_writes: int | None = Field(default=None, ge=0)
    """With a shared store: how many acknowledged grant claims the database lost."""


class CatalogAction(BaseModel):
    model_config = _Open
    name: str
    description: str | None
    parameters: dict[str, Any]
    """The action's strict parameter schema (JSON Schema)."""
    destructive: bool


class ActionCatalog(BaseModel):
    """``GET /v1/actions``: the actions the calling proposer may propose, in name order."""

    model_config = _Open
    actions: list[CatalogAction]


class Jwks(BaseModel):
    """The authority's public grant keys (RFC 7517)."""

    model_config = _Open
    keys: list[dict[str, Any]]


class Escalation(BaseModel):
    """A pending approval request (``EXECUTOR_ESCALATION=APPROVAL``): the signed object the
    proposer presents back to ``/v1/escalations`` as it is, once an APPROVER decided it at
    ``approval_url`` (or withdraws with ``/v1/escalations/cancel``)."""

    model_config = _Open
    mode: Literal["APPROVAL"]
    intent: dict[str, Any]
    request_id: str
    approval_url: str
    expires_at: str
    token: str


class Decision(BaseModel):
    """The answer of ``/v1/actions``, ``/v1/reconciliations`` and ``/v1/escalations``: a verdict
    and what happened. 503 has the same shape while the executor is halted, degraded or its
    authority is unavailable (``verdict`` BLOCK, ``fail_closed`` true, ``executed`` false)."""

    model_config = _Open
    mode: str
    intent_id: str | None
    intent_hash: str | None
    verdict: Literal["ALLOW", "BLOCK", "ESCALATE"]
    decision_id: str | None
    dossier_id: str | None
    reason_codes: list[str]
    fail_closed: bool
    outcome: str
    executed: bool | None
    """``None``: the outcome is not known yet (reconciliation settles it)."""
    authorization: dict[str, Any] | None
    finalization: str | None
    result: dict[str, Any] | None
    recovery: dict[str, Any] | None
    replayed: bool
    escalation: Escalation | None = None
    """An ESCALATE verdict's approval request; absent (or null) otherwise."""


class HaltStatus(BaseModel):
    """The halt after ``halt`` or ``resume``."""

    model_config = _Open
    halted: bool
    causes: list[dict[str, Any]]
    halt_file_present: bool
    posture_drift: list[str]


class OpenAttempt(BaseModel):
    model_config = _Open
    attempt_id: str
    intent_id: str
    intent_hash: str
    action: str
    principal: str
    grant_claimed: bool
    grant_id: str | None
    state: Literal["UNKNOWN", "UNCLAIMED"]


class OpenAttempts(BaseModel):
    """Attempts the journal holds open (started, never finished)."""

    model_config = _Open
    open_attempts: list[OpenAttempt]


class AttemptDecided(BaseModel):
    """An operator's decision, recorded: the attempt is RECONCILED by OPERATOR."""

    model_config = _Open
    attempt_id: str
    status: Literal["COMPLETED", "NOT_EXECUTED"]
    by: Literal["OPERATOR"]


class WorkerEntry(BaseModel):
    """One worker of an ``EXECUTOR_WORKERS`` group, as ``GET /v1/control/status`` names it:
    the supervisor's view (pid, state, restarts) and, once the worker with that pid published,
    its own (ready, halted, reconciling, open attempts)."""

    model_config = _Open
    index: int = Field(ge=0)
    pid: int | None
    state: str
    restarts: int = Field(ge=0)
    this_worker: bool
    published: bool
    ready: bool | None = None
    halted: bool | None = None
    reconciling: bool | None = None
    open_attempts: int | None = None


class LostClaim(BaseModel):
    """A grant claim this replica acknowledged that the shared database lost (a failover):
    reasserted so it is never sent again; the replica halted (``STORE_LOST_WRITES``)."""

    model_config = _Open
    attempt_id: str
    grant_id: str
    tenant: str | None
    principal: str | None
    idempotency_key: str | None
    claimed_at: str
    rerun_elsewhere: bool
    """A retry on another replica had taken the key before the check: it may have run twice."""


class Status(BaseModel):
    """``GET /v1/control/status``: the executor at a glance; under ``EXECUTOR_WORKERS`` above 1
    also ``worker`` (the one that answered) and ``workers`` (every worker of the group)."""

    model_config = _Open
    mode: str
    actions: list[str]
    halt: HaltStatus
    unknown_attempts: int = Field(ge=0)
    readiness: ReadinessDetails
    open_attempts: list[OpenAttempt]
    policy_digest: str
    store_lost_writes: list[LostClaim] | None = None
    """With a shared store: the claims it lost (docs/playbooks/store-lost-writes.md)."""
    worker: int | None = None
    workers: list[WorkerEntry] | None = None


class SecretsReload(BaseModel):
    """What a secret reload re-read (secrets, and the principals, JWKS and TLS files if set)."""

    model_config = _Open
    secrets: dict[str, Any]


class EvidenceManifest(BaseModel):
    """The manifest of the evidence bundle just written (``docs/evidence.md``)."""

    model_config = _Open


class ApprovalView(BaseModel):
    """One approval request as an approver sees it before deciding."""

    model_config = _Open
    request_id: str
    state: Literal["PENDING", "APPROVED", "DENIED", "EXPIRED", "CANCELLED"]
    expires_at: str
    proposer: dict[str, Any]
    intent: dict[str, Any]
    approvers: list[str]
    decided_by: str | None
    decision_reason: str | None


class ApprovalList(BaseModel):
    """The approval requests this approver may decide, in one state."""

    model_config = _Open
    approvals: list[ApprovalView]


class OpenApiDocument(BaseModel):
    """``GET /v1/control/openapi.json``: this document (OpenAPI 3.1)."""

    model_config = _Open
    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]
