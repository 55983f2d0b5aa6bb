"""Conditions following the Kubernetes API conventions, built through the status models.

:func:`set_condition` returns a new list with one :class:`~.models.Condition` set (its type a
:class:`~.models.ConditionType`, its reason a :class:`~.models.ConditionReason`):
``lastTransitionTime`` moves only when the status changes, ``observedGeneration`` is the
generation acted on. :func:`stored_conditions` reads a stored object's conditions back through
the model. :func:`spec_invalid_status` is the status of any of the three resources whose stored
``spec`` does not validate: ``Ready=False``, reason ``SpecInvalid``.

Callers: ``reconcile.py``, ``halt.py``, ``readiness.py``, ``handlers.py``, the tests.
Also imported by ``lostwrites.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from .models import Condition, ConditionReason, ConditionStatus, ConditionType, ResourceStatus

__all__ = ["now_rfc3339", "set_condition", "spec_invalid_status", "stored_conditions"]

StatusT = TypeVar("StatusT", bound=ResourceStatus)

MAX_MESSAGE = 32768
"""``message`` is cut to the length the Condition schema allows."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stored_conditions(body: Mapping[str, Any]) -> list[Condition]:
    """The conditions of a stored object's status; one that does not validate is dropped (the
    API server would refuse it in the next status write)."""
    out: list[Condition] = []
    for item in (body.get("status") or {}).get("conditions") or []:
        try:
            out.append(Condition.model_validate(item))
        except ValidationError:
            continue
    return out


def set_condition(
    conditions: Sequence[Condition],
    *,
    type: ConditionType,
    status: bool | None,
    reason: ConditionReason,
    message: str,
    generation: int | None,
    now: str | None = None,
) -> list[Condition]:
    text = (
        ConditionStatus.UNKNOWN
        if status is None
        else (ConditionStatus.TRUE if status else ConditionStatus.FALSE)
    )
    previous = next((c for c in conditions if c.type == type), None)
    stamp = now or now_rfc3339()
    if previous is not None and previous.status == text:
        stamp = previous.last_transition_time or stamp
    fields: dict[str, Any] = {
        "type": str(type),
        "status": text,
        "reason": str(reason),
        "message": message[:MAX_MESSAGE],
        "last_transition_time": stamp,
    }
    if generation is not None:
        fields["observed_generation"] = generation
    out = [c for c in conditions if c.type != type]
    out.append(Condition(**fields))
    return sorted(out, key=lambda c: c.type)


def spec_invalid_status(model: type[StatusT], body: Mapping[str, Any], message: str) -> StatusT:
    """The ``model`` status of an object whose stored ``spec`` does not validate (``message``
    says where and why, never the value)."""
    generation = int((body.get("metadata") or {}).get("generation") or 1)
    return model(
        observed_generation=generation,
        conditions=set_condition(
            stored_conditions(body),
            type=ConditionType.READY,
            status=False,
            reason=ConditionReason.SPEC_INVALID,
            message=message,
            generation=generation,
        ),
    )
