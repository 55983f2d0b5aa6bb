"""The shapes of the executor's answers on the wire.

One place builds every ``/v1/actions``-style answer so that an ALLOW, a BLOCK, a halt and a replay
all look the same to a caller's parser. Error bodies are ``{"error": {"code", "message"}}`` and
never echo request data.

Callers: ``lifecycle/pipeline.py``, ``lifecycle/attempt.py``, ``routes/app.py``,
``routes/refusals.py``, ``plane.py``.
Also imported by ``gateway/listener.py``, ``routes/approvals.py``, ``routes/listener.py``,
``routes/table.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..codes import Code

__all__ = ["Answer", "decision_answer", "error_body", "halted_answer", "reconciled_answer"]


@dataclass(frozen=True)
class Answer:
    """An HTTP status, a JSON body and extra headers."""

    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def decision_answer(
    *,
    mode: str,
    intent_id: str | None,
    intent_hash: str | None,
    verdict: str,
    decision_id: str | None,
    dossier_id: str | None,
    reason_codes: Sequence[str],
    fail_closed: bool,
    outcome: str,
    executed: bool | None,
    authorization: Mapping[str, Any] | None = None,
    finalization: str | None = None,
    result: Mapping[str, Any] | None = None,
    recovery: Mapping[str, Any] | None = None,
    escalation: Mapping[str, Any] | None = None,
    effect: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "mode": mode,
        "intent_id": intent_id,
        "intent_hash": intent_hash,
        "verdict": verdict,
        "decision_id": decision_id,
        "dossier_id": dossier_id,
        "reason_codes": list(reason_codes),
        "fail_closed": fail_closed,
        "outcome": outcome,
        "executed": executed,
        "authorization": dict(authorization) if authorization is not None else None,
        "finalization": finalization,
        "result": dict(result) if result is not None else None,
        "effect": dict(effect) if effect is not None else None,
        "recovery": dict(recovery) if recovery is not None else None,
        "replayed": False,
    }
    if escalation is not None:
        body["escalation"] = dict(escalation)
    return body


def halted_answer(mode: str, reason_code: str = Code.EXECUTOR_HALTED) -> Answer:
    """503 in the usual answer shape; nothing was asked of the authority."""
    body = decision_answer(
        mode=mode,
        intent_id=None,
        intent_hash=None,
        verdict="BLOCK",
        decision_id=None,
        dossier_id=None,
        reason_codes=[reason_code],
        fail_closed=True,
        outcome="BLOCKED",
        executed=False,
    )
    return Answer(503, body, {"Retry-After": "30"})


_RECONCILED = {
    "COMPLETED": ("COMPLETED", True, Code.RECONCILED_COMPLETED),
    "NOT_EXECUTED": ("DEFINITELY_NOT_EXECUTED", False, Code.RECONCILED_NOT_EXECUTED),
}


def reconciled_answer(
    *, mode: str, intent_id: str | None, intent_hash: str, status: str
) -> dict[str, Any] | None:
    """What a key's replay says once reconciliation learned the outcome (``None``: still
    unknown): ``status`` is the provider's COMPLETED or NOT_EXECUTED."""
    known = _RECONCILED.get(status)
    if known is None:
        return None
    outcome, executed, reason = known
    return decision_answer(
        mode=mode,
        intent_id=intent_id,
        intent_hash=intent_hash,
        verdict="ALLOW",
        decision_id=None,
        dossier_id=None,
        reason_codes=[reason],
        fail_closed=False,
        outcome=outcome,
        executed=executed,
        finalization="RECONCILED",
    )
