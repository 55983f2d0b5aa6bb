"""The client's typed answers and its exceptions (no server imports).

:class:`Decision` is the executor's answer to a proposal, a reconciliation or a resumed
escalation, read field by field from the wire; anything the wire adds later stays in ``raw``.

Callers: ``client/_client.py``, and through the package, agent hosts.
Also imported by ``__init__.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "ActionInfo",
    "AgentSafeClientError",
    "Decision",
    "Outcome",
    "Refused",
    "Unavailable",
    "Verdict",
]


class Verdict(StrEnum):
    ALLOW = "ALLOW"
    BLOCK = "BLOCK"
    ESCALATE = "ESCALATE"


class Outcome(StrEnum):
    COMPLETED = "COMPLETED"
    BLOCKED = "BLOCKED"
    FAILED_BEFORE_DISPATCH = "FAILED_BEFORE_DISPATCH"
    UNKNOWN_AFTER_DISPATCH = "UNKNOWN_AFTER_DISPATCH"
    DEFINITELY_NOT_EXECUTED = "DEFINITELY_NOT_EXECUTED"
    ESCALATE_PENDING = "ESCALATE_PENDING"
    # shadow mode's observation statuses
    OBSERVED = "OBSERVED"
    UNAVAILABLE = "UNAVAILABLE"
    TIMED_OUT = "TIMED_OUT"
    INVALID = "INVALID"


def _enum(kind: type[StrEnum], value: Any) -> Any:
    try:
        return kind(value)
    except ValueError:
        return value  # a newer executor's value: kept as text, never guessed


@dataclass(frozen=True)
class Decision:
    """One answer: the verdict, what happened, and what to present back (recovery, escalation)."""

    status: int
    mode: str
    verdict: Verdict | str
    outcome: Outcome | str
    executed: bool | None
    reason_codes: tuple[str, ...]
    intent_id: str | None
    intent_hash: str | None
    decision_id: str | None
    dossier_id: str | None
    fail_closed: bool
    replayed: bool
    result: Mapping[str, Any] | None
    authorization: Mapping[str, Any] | None
    recovery: Mapping[str, Any] | None
    escalation: Mapping[str, Any] | None
    idempotency_key: str | None
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_wire(
        cls, status: int, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Decision:
        return cls(
            status=status,
            mode=str(body.get("mode")),
            verdict=_enum(Verdict, body.get("verdict")),
            outcome=_enum(Outcome, body.get("outcome")),
            executed=body.get("executed"),
            reason_codes=tuple(str(c) for c in body.get("reason_codes") or ()),
            intent_id=body.get("intent_id"),
            intent_hash=body.get("intent_hash"),
            decision_id=body.get("decision_id"),
            dossier_id=body.get("dossier_id"),
            fail_closed=bool(body.get("fail_closed")),
            replayed=bool(body.get("replayed")),
            result=body.get("result"),
            authorization=body.get("authorization"),
            recovery=body.get("recovery"),
            escalation=body.get("escalation"),
            idempotency_key=idempotency_key,
            raw=dict(body),
        )

    @property
    def completed(self) -> bool:
        return self.outcome == Outcome.COMPLETED

    @property
    def needs_reconciliation(self) -> bool:
        """The outcome is unknown after dispatch and the answer carries a recovery object."""
        return self.outcome == Outcome.UNKNOWN_AFTER_DISPATCH and self.recovery is not None

    def summary(self) -> str:
        """One line a model can read: the verdict, the outcome and the reasons."""
        reasons = f" ({', '.join(self.reason_codes)})" if self.reason_codes else ""
        return f"{self.verdict}: {self.outcome}{reasons}"


@dataclass(frozen=True)
class ActionInfo:
    """One action the caller may propose (``GET /v1/actions``)."""

    name: str
    parameters: Mapping[str, Any]
    destructive: bool
    description: str | None = None

    @classmethod
    def from_wire(cls, entry: Mapping[str, Any]) -> ActionInfo:
        return cls(
            name=str(entry["name"]),
            parameters=dict(entry.get("parameters") or {}),
            destructive=entry.get("destructive") is not False,
            description=entry.get("description"),
        )


class AgentSafeClientError(Exception):
    """The root of the client's exceptions (see the package docstring for the hierarchy)."""


class Refused(AgentSafeClientError):
    """The executor refused the request with a stable code (nothing was executed for it)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unavailable(AgentSafeClientError):
    """No final answer within ``max_wait``; retry later with ``idempotency_key``."""

    def __init__(
        self,
        reason: str,
        *,
        idempotency_key: str | None,
        last: Decision | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.idempotency_key = idempotency_key
        self.last = last
        self.retry_after = retry_after
