"""``POST /v1/reconciliations``: the stateless, read-only question to the provider about an
attempt whose answer the caller lost.

The recovery object's reference must verify (this executor signed it for exactly that intent) and
the caller must own the intent; the handler that runs its action is asked, once. A provider's
"not executed" is accepted only at or after the grant's expiry plus the dispatch deadline
(docs/architecture.md, "When not executed may be concluded"); before, the answer stays unknown
(RECONCILE_TOO_EARLY). A known answer is journaled (RECONCILED by CALLER), lowers the live count of
unknown attempts, and settles the key, so a replay says what the provider did.

Callers: ``plane.py`` (builds it over the pipeline), ``routes/app.py`` (the route).
Also imported by ``routes/table.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import telemetry
from ..clock import format_ms
from ..codes import Code
from ..dispatch.seam import Outcome, ReconcileResult, ReconcileStatus
from ..errors import AgentSafeError, RequestRejected
from ..intent import check_intent_owner, intent_from_binding
from ..policy.authority import RECOVERY_TYP
from ..principals import Principal
from .answers import Answer, reconciled_answer

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = ["Reconciliations"]


class Reconciliations:
    """The reconciliation route's work, with the pipeline's checks and handlers."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def reconcile(self, principal: Principal, recovery: Mapping[str, Any]) -> Answer:
        """Read-only: ask the provider what it did with an attempt whose answer was lost; one
        span ``agentsafe.reconcile`` (its status the outcome, a refusal its code)."""
        with telemetry.span("agentsafe.reconcile") as current:
            try:
                answer = await self._reconcile(principal, recovery)
            except AgentSafeError as exc:
                if current is not None:
                    current.set_attributes(telemetry.safe_attributes({"agentsafe.code": exc.code}))
                raise
            if current is not None:
                status = answer.body.get("status")
                current.set_attributes(telemetry.safe_attributes({"agentsafe.outcome": status}))
            return answer

    async def _reconcile(self, principal: Principal, recovery: Mapping[str, Any]) -> Answer:
        intent = intent_from_binding(recovery.get("intent"))
        reference = recovery.get("reference")
        if not isinstance(reference, str):
            raise RequestRejected(Code.REQUEST_INVALID, "the recovery object has no reference")
        try:
            claims = self.pipeline.signer.verify_token(reference, typ=RECOVERY_TYP)
        except AgentSafeError:
            raise RequestRejected(
                Code.RECOVERY_BINDING_MISMATCH, "the recovery reference does not verify"
            ) from None
        if claims.get("intent_hash") != intent.intent_hash:
            raise RequestRejected(
                Code.RECOVERY_BINDING_MISMATCH,
                "the presented intent does not match its recovery reference",
            )
        self.pipeline.check(principal, lambda: check_intent_owner(principal, intent))
        handler = self.pipeline.handler(intent.action)
        result = await self.pipeline.registry.reconcile(
            handler, intent.idempotency_key, intent_hash=intent.intent_hash
        )
        grant_exp = claims.get("grant_exp")
        if (
            result.status is ReconcileStatus.NOT_EXECUTED
            and isinstance(grant_exp, int | float)
            and self.pipeline.clock.now() < float(grant_exp) + self.pipeline.settle_margin
        ):
            # The dispatch could still land (a provider whose lookup lags its commit): the
            # rule in docs/architecture.md, "When not executed may be concluded".
            result = ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.RECONCILE_TOO_EARLY)
        status = result.status.value
        outcome, executed = _RECONCILED[result.status]
        attempt_id = str(claims.get("attempt_id", ""))
        known = result.status is not ReconcileStatus.UNKNOWN
        if self.pipeline.journal is not None and known and attempt_id:
            await self.pipeline.journal.reconciled(
                attempt_id=attempt_id, status=status, by="CALLER"
            )
            self.pipeline.unknown.discard(attempt_id)
        settled = reconciled_answer(
            mode=self.pipeline.mode.value,
            intent_id=intent.intent_id,
            intent_hash=intent.intent_hash,
            status=status,
        )
        if settled is not None:
            # A replay of the key now says what the provider did, not "unknown".
            await self.pipeline.store.idempotency_settle(
                tenant=intent.tenant_id,
                principal=principal.id,
                key=intent.idempotency_key,
                response={"status": 200, "body": settled},
                now=self.pipeline.clock.now(),
            )
        self.pipeline.streams.evidence.emit(
            "RECONCILIATION",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "attempt_id": attempt_id,
                "status": status,
                "by": "CALLER",
                "caller": principal.id,
                "reason_codes": [result.reason_code] if result.reason_code else [],
            },
        )
        body: dict[str, Any] = {
            "intent_id": intent.intent_id,
            "intent_hash": intent.intent_hash,
            "status": status,
            "outcome": outcome.value,
            "executed": executed,
            "result": (
                {"provider_reference": result.provider_reference}
                if result.provider_reference is not None
                else None
            ),
            "reason_codes": [result.reason_code] if result.reason_code else [],
            "reconciled_at": format_ms(self.pipeline.clock.now()),
        }
        return Answer(200, body)


_RECONCILED: dict[ReconcileStatus, tuple[Outcome, bool | None]] = {
    ReconcileStatus.COMPLETED: (Outcome.COMPLETED, True),
    ReconcileStatus.NOT_EXECUTED: (Outcome.DEFINITELY_NOT_EXECUTED, False),
    ReconcileStatus.UNKNOWN: (Outcome.UNKNOWN_AFTER_DISPATCH, None),
}
