"""Conditions following the Kubernetes API conventions.

:func:`set_condition` returns a new list with one condition set: ``lastTransitionTime`` moves
only when the status changes, ``observedGeneration`` is the generation acted on.
:func:`spec_invalid_status` is the status of any of the three resources whose stored ``spec``
does not validate: ``Ready=False``, reason ``SpecInvalid``.

Callers: ``reconcile.py``, ``halt.py``, ``readiness.py``, ``handlers.py``, the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

__all__ = ["now_rfc3339", "set_condition", "spec_invalid_status"]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[dict[str, Any]],
    *,
    type: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    text = "Unknown" if status is None else ("True" if status else "False")
    previous = next((c for c in conditions if c.get("type") == type), None)
    stamp = now or now_rfc3339()
    if previous is not None and previous.get("status") == text:
        stamp = str(previous.get("lastTransitionTime") or stamp)
    condition: dict[str, Any] = {
        "type": type,
        "status": text,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": stamp,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    out = [dict(c) for c in conditions if c.get("type") != type]
    out.append(condition)
    return sorted(out, key=lambda c: str(c.get("type")))


def spec_invalid_status(body: Mapping[str, Any], message: str) -> dict[str, Any]:
    """The status of an object whose stored ``spec`` does not validate (``message`` says where
    and why, never the value)."""
    generation = int((body.get("metadata") or {}).get("generation") or 1)
    previous = list((body.get("status") or {}).get("conditions") or [])
    return {
        "observedGeneration": generation,
        "conditions": set_condition(
            previous,
            type="Ready",
            status=False,
            reason="SpecInvalid",
            message=message,
            generation=generation,
        ),
    }
