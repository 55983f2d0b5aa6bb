"""The one outcome reporter of a pipeline and its attempts: counts, evidence and the live set
of unknown attempts, in one object instead of callbacks into the pipeline.

:class:`Outcomes` implements :class:`~agentsafe.executor.lifecycle.attempt.OutcomeReporter`:
an outcome is counted (enforcement only), an UNKNOWN_AFTER_DISPATCH joins the live set
``/ready`` counts, an effect mismatch is counted and handed on (the halt under
``EXECUTOR_ON_EFFECT_MISMATCH=HALT``), a ceiling refusal is one CEILING_REFUSED evidence line and
one count.

Callers: ``pipeline.py`` (builds it and hands it to its attempts).
Also imported by ``assembly.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import ExecutorMode
from ..dispatch.seam import Outcome
from ..events import Streams
from ..host.metrics import ExecutorMetrics
from ..intent import CapturedIntent
from ..principals import Principal
from .attempt import UnknownAttempts

__all__ = ["Outcomes", "ignore_mismatch"]


def ignore_mismatch(grant_id: str) -> None:
    """``EXECUTOR_ON_EFFECT_MISMATCH=ALERT``: the line and the count, no halt."""


@dataclass(frozen=True)
class Outcomes:
    """What the pipeline and its attempts report, in one place."""

    mode: ExecutorMode
    streams: Streams
    metrics: ExecutorMetrics | None
    unknown_attempts: UnknownAttempts
    on_effect_mismatch: Callable[[str], None] = ignore_mismatch

    def outcome(self, outcome: Outcome) -> None:
        if self.metrics is not None and self.mode is ExecutorMode.ENFORCEMENT:
            self.metrics.executions.inc(outcome=outcome.value)

    def unknown(self, attempt_id: str) -> None:
        self.unknown_attempts.add(attempt_id)

    def effect_mismatch(self, grant_id: str) -> None:
        if self.metrics is not None:
            self.metrics.effect_mismatches.inc()
        self.on_effect_mismatch(grant_id)

    def ceiling_refused(
        self, intent: CapturedIntent, principal: Principal, code: str, stage: str
    ) -> None:
        """Every ceiling refusal is one evidence line and one count."""
        self.streams.evidence.emit(
            "CEILING_REFUSED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "caller": principal.id,
                "code": code,
                "stage": stage,
            },
        )
        if self.metrics is not None:
            self.metrics.ceiling_refusals.inc(code=code)
