"""One attempt on an ALLOW: claim the grant, journal, dispatch once, finalize, answer.

:meth:`Attempt.run` is step 7 of the pipeline (``pipeline.py``), taken out so it can be tested
on its own with every collaborator passed in:

1. commit the host ceilings (a reservation released if nothing was sent);
2. journal ATTEMPT_OPENED (a journal that refuses is FAILED_BEFORE_DISPATCH, fail closed);
3. claim the single-use grant with the authority (a refused claim closes the attempt NOT_CLAIMED).
   With a shared store the claim is fenced (issue 29): the journal hands over the attempt's
   fencing token (the value of ``AttemptJournal.opened``: owner, epoch, local lease deadline)
   and the claim is made only while the attempt is still this replica's under a live lease, in
   one statement. A fenced-out claim sent nothing: ATTEMPT_FENCED evidence, the attempt closed
   FENCED in the journal, and the caller refused 409 ATTEMPT_FENCED (never an answer saying "not
   executed": another replica may have run the key since);
4. the registry prepares the execution (its checks; a refusal runs nothing), the attempt
   journals GRANT_CLAIMED (a journal that refuses it is FAILED_BEFORE_DISPATCH with
   JOURNAL_UNAVAILABLE), and only then does the registry run the handler once, in its own task.
   With a fence the handler runs only if the lease, on the local monotonic clock, outlives the
   dispatch deadline: otherwise nothing is sent and the answer is FAILED_BEFORE_DISPATCH with
   ATTEMPT_LEASE_LAPSED (true: the grant is claimed, so nobody else can send it; a replica that
   takes the attempt over asks the provider). A send already started when the lease lapses is
   never sent again: whoever takes the attempt over resolves it read-only (``reconcile.py``);
5. take the effect record the handler registered for the grant (``dispatch/effects.py``: an
   adapter's record, ``effects/adapter.py``, or an ordinary handler's observation), a refusal's
   included, and finalize with the authority, handing it the record's evidence and the
   provider's receipt verbatim; the authority's ``effect_report`` goes into the OUTCOME line.
   A finalization that fails is NOT_RECORDED and changes nothing else;
6. one EFFECT_OBSERVED evidence line for the record; an adapter's effect (or receipt) that is
   not the authorised one adds EFFECT_MISMATCH to the reason codes, an EFFECT_MISMATCH /
   EFFECT_RECEIPT_MISMATCH security event and ``on_effect_mismatch`` (the halt, or only the
   count);
7. journal ATTEMPT_CLOSED unless the outcome is unknown, in which case the answer carries a
   signed recovery object for ``POST /v1/reconciliations``;
8. one OUTCOME evidence line, one count, one answer (with the ``effect`` block when COMPLETED).

The caller learns that the attempt started through the :class:`Progress` it passes in (set
before anything durable is written): from then on its idempotency key is never freed.

Callers: ``pipeline.py``; tests (``tests/lifecycle/test_attempt.py``).
Also imported by ``escalations.py``, ``outcomes.py``, ``recovery.py``.
Also imported by ``approval_requests.py``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..clock import Clock
from ..codes import Code
from ..dispatch.effects import EffectEvidence, EffectRegister
from ..dispatch.seam import Authorization, ExecutionContext, ExecutionReport, Outcome, Registry
from ..effects.adapter import Comparison, EffectRecord
from ..effects.receipts import ReceiptComparison
from ..errors import AgentSafeError, JournalError, RequestRejected, StoreError
from ..events import Streams
from ..ids import uuid4_text
from ..intent import CapturedIntent
from ..policy.authority import RECOVERY_TYP, Authority, Decision, GrantRefused
from ..principals import Principal
from ..state.journal import AttemptJournal
from .answers import Answer, decision_answer
from .ceilings import HostCeilings, Reservation

__all__ = ["Attempt", "Progress", "TokenSigner", "UnknownAttempts"]

log = logging.getLogger(__name__)


class TokenSigner(Protocol):
    def sign_token(self, payload: Mapping[str, Any], *, typ: str) -> str: ...

    def verify_token(self, token: str, *, typ: str) -> dict[str, Any]: ...


class UnknownAttempts:
    """The attempts whose outcome nobody knows right now: ``/ready``'s live count.

    Filled at start (STILL_UNKNOWN, BINDING_MISMATCH) and by every runtime
    UNKNOWN_AFTER_DISPATCH; an attempt leaves when a reconciliation (the caller's, a re-ask,
    an operator's decision) settles it."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def add(self, attempt_id: str) -> None:
        self._ids.add(attempt_id)

    def discard(self, attempt_id: str) -> None:
        self._ids.discard(attempt_id)

    def __contains__(self, attempt_id: object) -> bool:
        return attempt_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self) -> frozenset[str]:
        return frozenset(self._ids)


class OutcomeReporter(Protocol):
    """Where an attempt reports what happened: one object (the pipeline's
    :class:`~agentsafe.executor.lifecycle.outcomes.Outcomes`), never a call back into the
    pipeline."""

    def outcome(self, outcome: Outcome) -> None:
        """An answer with this outcome was given (the executions count)."""
        ...

    def unknown(self, attempt_id: str) -> None:
        """An UNKNOWN_AFTER_DISPATCH: ``/ready``'s live count of unknown attempts rises."""
        ...

    def effect_mismatch(self, grant_id: str) -> None:
        """The observed effect is not the authorised one (EXECUTOR_ON_EFFECT_MISMATCH)."""
        ...

    def ceiling_refused(
        self, intent: CapturedIntent, principal: Principal, code: str, stage: str
    ) -> None:
        """A host ceiling refused the attempt at ``stage`` (CHECK or COMMIT)."""
        ...


class Unreported:
    """The reporter that keeps nothing (an attempt built without one)."""

    def outcome(self, outcome: Outcome) -> None:
        return None

    def unknown(self, attempt_id: str) -> None:
        return None

    def effect_mismatch(self, grant_id: str) -> None:
        return None

    def ceiling_refused(
        self, intent: CapturedIntent, principal: Principal, code: str, stage: str
    ) -> None:
        return None


@dataclass
class Progress:
    """Whether an attempt has started: from then on its idempotency key is never freed.

    ``attempt_id`` is chosen before the key is claimed, so the idempotency record names the
    attempt it will journal (a crash on either side of the journal is settled from it)."""

    started: bool = False
    attempt_id: str = field(default_factory=uuid4_text)


@dataclass(frozen=True)
class Attempt:
    """What an attempt needs, passed in; :meth:`run` is one attempt."""

    authority: Authority
    signer: TokenSigner
    registry: Registry
    journal: AttemptJournal | None
    ceilings: HostCeilings | None
    streams: Streams
    clock: Clock
    report: OutcomeReporter = field(default_factory=lambda: Unreported())
    """Told every outcome, every UNKNOWN_AFTER_DISPATCH, effect mismatch and ceiling refusal."""
    effects: EffectRegister | None = None

    async def run(
        self,
        *,
        intent: CapturedIntent,
        principal: Principal,
        decision: Decision,
        handler: str,
        common: Mapping[str, Any],
        progress: Progress,
    ) -> Answer:
        """Run ``decision`` (an ALLOW with its grant) for ``intent`` through ``handler`` once.

        ``common`` is the answer's mode, intent and decision fields; ``progress.started`` is set
        before the journal is written. Once the GRANT_CLAIMED record is durable (the point of no
        return) nothing that fails afterwards (the journal, the evidence chain, the use store,
        the authority's finalization) turns the answer into "not executed": the outcome is the
        one the seam classified, or UNKNOWN_AFTER_DISPATCH with a recovery object."""
        if decision.grant is None:
            raise ValueError("only an ALLOW with a grant starts an attempt")
        reservation = None
        if self.ceilings is not None:
            try:
                reservation = await self.ceilings.commit(
                    self.registry.ceiling_view(handler, intent.parameters)
                )
            except RequestRejected as exc:
                self.report.ceiling_refused(intent, principal, exc.code, "COMMIT")
                raise
        attempt_id = progress.attempt_id
        journal = self.journal
        progress.started = True
        fence = None
        try:
            if journal is not None:
                fence = await journal.opened(
                    attempt_id=attempt_id,
                    intent_id=intent.intent_id,
                    intent_hash=intent.intent_hash,
                    decision_id=decision.decision_id,
                    dossier_id=decision.dossier_id,
                    caller=principal.id,
                    action=intent.action,
                    binding=intent.binding,
                    grant_id=decision.grant_id,
                    grant_expires_at=decision.grant_expires_at,
                )
        except AgentSafeError as exc:
            if reservation is not None:
                await reservation.release()
            if exc.code == Code.IDEMPOTENCY_TAKEN_OVER:
                # This request's key lease lapsed before its attempt opened, and a later request
                # with the key took it over (and may have run it): never "not executed" here.
                await self._fenced(intent, principal, attempt_id, None, Code.IDEMPOTENCY_TAKEN_OVER)
                raise RequestRejected(
                    Code.IDEMPOTENCY_TAKEN_OVER,
                    "a later request with this idempotency key took it over before this one"
                    " opened its attempt; nothing was sent: retry with the same key for its answer",
                ) from None
            log.exception("the journal refused ATTEMPT_OPENED")
            return self._failed_before_dispatch(common, [Code.JOURNAL_UNAVAILABLE])
        try:
            claim = await self.authority.claim(decision.grant, intent=intent, fence=fence)
        except StoreError as exc:
            if exc.code != Code.ATTEMPT_FENCED:
                return await self._not_claimed(attempt_id, reservation, common, exc.code)
            await self._fenced(intent, principal, attempt_id, reservation)
            raise RequestRejected(
                Code.ATTEMPT_FENCED,
                "this replica lost the attempt before claiming its grant; nothing was sent:"
                " retry with the same idempotency key",
            ) from None
        except GrantRefused as exc:
            return await self._not_claimed(attempt_id, reservation, common, exc.code)
        authorization = Authorization(
            decision_id=claim.decision_id,
            dossier_id=claim.dossier_id,
            grant_id=claim.grant_id,
            expires_at=claim.expires_at,
        )
        try:
            self.streams.evidence.emit(
                "GRANT_CLAIMED",
                {
                    "intent_id": intent.intent_id,
                    "decision_id": claim.decision_id,
                    "grant_id": claim.grant_id,
                    "payload_digest": claim.execution_payload_digest,
                    "caller": principal.id,
                },
            )
        except AgentSafeError as exc:  # no evidence, no dispatch: nothing was sent
            log.warning("the evidence stream refused GRANT_CLAIMED (%s)", exc.code)
            await self._close_quietly(
                attempt_id,
                outcome=Outcome.FAILED_BEFORE_DISPATCH.value,
                executed=False,
                finalization="NOT_DISPATCHED",
            )
            if reservation is not None:
                await reservation.release()
            return self._failed_before_dispatch(common, [exc.code])
        remaining = claim.expires_at - self.clock.now()
        ctx = ExecutionContext(
            intent=intent,
            parameters=intent.parameters,
            authorization=authorization,
            deadline_monotonic=self.clock.monotonic() + max(0.0, remaining),
            clock=self.clock,
            attestation=claim.attestation,
        )
        wire = authorization.as_wire()  # the answer's authorization, made once, before the dispatch
        claimed = False
        lapsed = False
        try:
            prepared = self.registry.prepare(handler, ctx)
            if isinstance(prepared, ExecutionReport):  # refused: nothing journaled or sent
                report = prepared
            else:
                try:
                    if journal is not None:
                        await journal.grant_claimed(
                            attempt_id=attempt_id,
                            grant_id=claim.grant_id,
                            expires_at=claim.expires_at,
                            payload_digest=claim.execution_payload_digest,
                        )
                    # Send only under a live lease: this one may lapse before the send ends.
                    lapsed = fence is not None and not fence.can_dispatch()
                    if not lapsed:
                        self.streams.evidence.emit(
                            "DISPATCH", {"intent_id": intent.intent_id, "grant_id": claim.grant_id}
                        )
                except Exception:  # the claim (or its DISPATCH line) not written: nothing runs
                    report = _not_dispatched(Code.JOURNAL_UNAVAILABLE)
                else:
                    if lapsed:
                        report = _not_dispatched(Code.ATTEMPT_LEASE_LAPSED)
                    else:
                        claimed = True
                        report = await self.registry.run(prepared)
        except Exception:
            log.exception("the seam failed")
            report = ExecutionReport(
                outcome=Outcome.UNKNOWN_AFTER_DISPATCH
                if claimed
                else Outcome.FAILED_BEFORE_DISPATCH,
                executed=None if claimed else False,
                reason_codes=(Code.INTERNAL_ERROR,),
                dispatched=claimed,
            )
        if lapsed:
            self.streams.security.emit(
                "DISPATCH_WITHHELD",
                {
                    "attempt_id": attempt_id,
                    "grant_id": claim.grant_id,
                    "code": Code.ATTEMPT_LEASE_LAPSED,
                },
            )
        outcome = Outcome(report.outcome)
        # -- after the point of no return: nothing below may change the outcome --------------
        if outcome is not Outcome.COMPLETED and not report.dispatched and reservation is not None:
            try:
                await reservation.release()
            except AgentSafeError as exc:
                log.warning("the ceiling reservation was not released (%s)", exc.code)
        # The effect record the handler registered (a refusal's too) goes to the finalization
        # with the provider's receipt verbatim; nothing in either can make the finalization
        # fail or change the outcome.
        entry = self.effects.take(claim.grant_id) if self.effects is not None else None
        # The provider's signed effect receipt as the seam screened it, verbatim, whatever the
        # outcome: a refusal's (``report.effect_receipt``), else the result's.
        receipt = report.effect_receipt
        if receipt is None:
            found = (report.result or {}).get("effect_receipt")
            receipt = found if isinstance(found, str) else None
        effect_report: Mapping[str, Any] | None = None
        try:
            finalized = await self.authority.finalize(
                claim,
                outcome=outcome.value,
                executed=report.executed,
                effect=entry.evidence() if entry is not None else None,
                effect_receipt=receipt,
            )
            finalization, effect_report = finalized.status, finalized.effect_report
        except AgentSafeError as exc:
            log.warning("the authority did not record the finalization (%s)", exc.code)
            finalization = "NOT_RECORDED"
        except Exception:  # past the point of no return: the outcome stands
            log.exception("the finalization failed")
            finalization = "NOT_RECORDED"
        recovery = None
        if outcome is Outcome.UNKNOWN_AFTER_DISPATCH:
            recovery = self._recovery_object(intent, attempt_id, claim.grant_id, claim.expires_at)
        reason_codes = list(report.reason_codes)
        record = entry if isinstance(entry, EffectRecord) else None
        try:
            if entry is not None:
                reason_codes = self._effect(intent, principal, entry, reason_codes)
        except AgentSafeError as exc:  # past the point of no return: the outcome stands
            log.warning("the effect record was not fully reported (%s)", exc.code)
        body = decision_answer(
            **common,
            reason_codes=[*decision.reason_codes, *reason_codes],
            fail_closed=outcome is Outcome.FAILED_BEFORE_DISPATCH,
            outcome=outcome.value,
            executed=report.executed,
            authorization=wire,
            finalization=finalization,
            result=report.result if outcome is Outcome.COMPLETED else None,
            recovery=recovery,
            # A refusal raised out of the handler returned no result to read one from: its
            # observation is in the evidence (EFFECT_OBSERVED), not in the answer.
            effect=record.block() if record is not None and outcome is Outcome.COMPLETED else None,
        )
        if outcome is Outcome.UNKNOWN_AFTER_DISPATCH:
            self.report.unknown(attempt_id)
        else:
            await self._close_quietly(
                attempt_id,
                outcome=outcome.value,
                executed=report.executed,
                finalization=finalization,
                answer=body,
            )
        self.report.outcome(outcome)
        try:
            self.streams.evidence.emit(
                "OUTCOME",
                {
                    "intent_id": intent.intent_id,
                    "decision_id": claim.decision_id,
                    "grant_id": claim.grant_id,
                    "outcome": outcome.value,
                    "executed": report.executed,
                    "reason_codes": reason_codes,
                    "finalization": finalization,
                    "caller": principal.id,
                    **({"effect_receipt": receipt} if receipt is not None else {}),
                    **({"effect_report": dict(effect_report)} if effect_report else {}),
                },
            )
        except AgentSafeError as exc:
            log.warning("the evidence stream refused OUTCOME (%s)", exc.code)
        return Answer(200, body)

    async def _not_claimed(
        self, attempt_id: str, reservation: Reservation | None, common: Mapping[str, Any], code: str
    ) -> Answer:
        """A refused claim (or a store that failed: it claimed nothing we use): closed
        NOT_CLAIMED, FAILED_BEFORE_DISPATCH."""
        await self._close_quietly(
            attempt_id,
            outcome=Outcome.FAILED_BEFORE_DISPATCH.value,
            executed=False,
            finalization="NOT_CLAIMED",
        )
        if reservation is not None:
            await reservation.release()
        return self._failed_before_dispatch(common, [code])

    async def _fenced(
        self,
        intent: CapturedIntent,
        principal: Principal,
        attempt_id: str,
        reservation: Reservation | None,
        code: Code = Code.ATTEMPT_FENCED,
    ) -> None:
        """The claim was fenced out (``ATTEMPT_FENCED``), or the key was taken over before the
        attempt opened (``IDEMPOTENCY_TAKEN_OVER``): nothing was claimed or sent. The evidence
        says so, the journal closes the attempt FENCED (the shared store's row is the new
        owner's, or was never written: the close changes nothing there), the ceiling
        reservation is released."""
        with contextlib.suppress(AgentSafeError):
            self.streams.evidence.emit(
                "ATTEMPT_FENCED",
                {
                    "intent_id": intent.intent_id,
                    "attempt_id": attempt_id,
                    "caller": principal.id,
                    "code": code,
                },
            )
        await self._close_quietly(
            attempt_id,
            outcome=Outcome.FAILED_BEFORE_DISPATCH.value,
            executed=False,
            finalization="FENCED",
        )
        if reservation is not None:
            with contextlib.suppress(AgentSafeError):
                await reservation.release()

    async def _close_quietly(
        self,
        attempt_id: str,
        *,
        outcome: str,
        executed: bool | None,
        finalization: str | None,
        answer: Mapping[str, Any] | None = None,
    ) -> None:
        """ATTEMPT_CLOSED, with the answer when it fits: the body of the 200 the caller is
        given, which the shared store's close records as the key's answer
        (``state/records.py`` ``closing_response``). A journal that cannot take it leaves the
        attempt open: the next start asks the provider, and the answer given stands."""
        if self.journal is None:
            return
        try:
            try:
                await self.journal.closed(
                    attempt_id=attempt_id,
                    outcome=outcome,
                    executed=executed,
                    finalization=finalization,
                    answer=answer,
                )
            except JournalError as exc:
                if answer is None or exc.code != Code.JOURNAL_RECORD_TOO_LARGE:
                    raise
                await self.journal.closed(
                    attempt_id=attempt_id,
                    outcome=outcome,
                    executed=executed,
                    finalization=finalization,
                )
        except AgentSafeError as exc:
            log.warning("ATTEMPT_CLOSED was not recorded (%s)", exc.code)
            with contextlib.suppress(AgentSafeError):
                self.streams.security.emit(
                    "ATTEMPT_CLOSE_NOT_RECORDED",
                    {"attempt_id": attempt_id, "outcome": outcome, "code": exc.code},
                )

    def _effect(
        self,
        intent: CapturedIntent,
        principal: Principal,
        entry: EffectEvidence,
        reason_codes: list[str],
    ) -> list[str]:
        """One EFFECT_OBSERVED evidence line (an adapter's record names its observer); an
        adapter's mismatch adds EFFECT_MISMATCH, its security events, and the configured
        behaviour."""
        self.streams.evidence.emit(
            "EFFECT_OBSERVED",
            {"intent_id": intent.intent_id, "caller": principal.id, **entry.evidence()},
        )
        if not isinstance(entry, EffectRecord) or not entry.mismatch:
            return reason_codes
        record = entry
        fields = {
            "intent_id": intent.intent_id,
            "grant_id": record.grant_id,
            "record_digest": record.digest,
            "differing_fields": list(record.differing_fields),
        }
        if record.comparison is Comparison.MISMATCH:
            self.streams.security.emit("EFFECT_MISMATCH", fields)
        if record.receipt.comparison is ReceiptComparison.MISMATCH:
            self.streams.security.emit(
                "EFFECT_RECEIPT_MISMATCH", {**fields, "reason": record.receipt.reason}
            )
        self.report.effect_mismatch(record.grant_id)
        return [*reason_codes, Code.EFFECT_MISMATCH]

    def _failed_before_dispatch(self, common: Mapping[str, Any], reasons: list[str]) -> Answer:
        self.report.outcome(Outcome.FAILED_BEFORE_DISPATCH)
        body = decision_answer(
            **common,
            reason_codes=reasons,
            fail_closed=True,
            outcome=Outcome.FAILED_BEFORE_DISPATCH.value,
            executed=False,
            authorization=None,
        )
        return Answer(200, body)

    def _recovery_object(
        self, intent: CapturedIntent, attempt_id: str, grant_id: str, grant_expires_at: float
    ) -> dict[str, Any]:
        reference = self.signer.sign_token(
            {
                "attempt_id": attempt_id,
                "intent_hash": intent.intent_hash,
                "grant_id": grant_id,
                "grant_exp": grant_expires_at,
                "iat": int(self.clock.now()),
            },
            typ=RECOVERY_TYP,
        )
        return {"intent": dict(intent.binding), "reference": reference}


def _not_dispatched(code: str) -> ExecutionReport:
    """The handler was not run after a successful claim (its GRANT_CLAIMED not durable, or the
    lease too short to send under): FAILED_BEFORE_DISPATCH, nothing sent."""
    return ExecutionReport(
        outcome=Outcome.FAILED_BEFORE_DISPATCH,
        executed=False,
        reason_codes=(code,),
        dispatched=False,
    )
