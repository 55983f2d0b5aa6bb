"""The lifecycle of one proposal, from an authenticated caller to a journaled outcome.

``Pipeline.propose`` is the heart of the executor:

1. refuse while halted or degraded (nothing asked of the authority);
2. refuse an action this principal may not propose, or that no handler runs;
3. idempotency: replay a finished answer, refuse a conflicting or in-flight key;
4. capture the intent (tenant, actor and target from configuration) and hash it;
5. a handler that derives its target (the effect plane's adapters) admits the proposal or refuses
   a disagreement (``Registry.admit``); check the host ceilings on what it projects (each refusal
   one CEILING_REFUSED evidence line and one count), then ask the authority (skew measured);
6. in shadow, record and stop; on BLOCK or ESCALATE, answer;
7. on ALLOW: the attempt (``attempt.py``): commit the ceilings, journal ATTEMPT_OPENED, claim
   the single-use grant, run the handler once (the registry journals GRANT_CLAIMED before its
   body), finalize with the authority, journal ATTEMPT_CLOSED unless the outcome is unknown;
   read the effect record the adapter registered (EFFECT_MISMATCH halts or alerts through
   ``on_effect_mismatch``); then record the answer.

Which handler runs an action is asked once per request (``_handler``); the owner and action
checks are the door's and the intent's own (``check_action``, ``check_intent_owner``).

``Pipeline.reconcile`` is the stateless, read-only ``POST /v1/reconciliations``.

Escalations (``EXECUTOR_ESCALATION=APPROVAL``): an ESCALATE stores a durable approval request
(the intent, the rule and reason that escalated it, the verification the rule asks) and answers
with an escalation object carrying ``approval_url``; ``on_approval_requested`` is told (the
optional webhook, ``egress/webhook.py``). ``resume_escalation`` (``POST /v1/escalations``) makes
one lookup: pending stays ESCALATE_PENDING; denied, cancelled or expired is a BLOCK whose reason
codes say which (APPROVAL_DENIED, APPROVAL_CANCELLED, APPROVAL_EXPIRED, with INTENT_EXPIRED once
the intent itself is past its TTL: an approval never revives it); approved goes back to the
authority with the decision, its approver and its verification as evidence.
``cancel_escalation`` (``POST /v1/escalations/cancel``) lets the proposer withdraw its own.

Callers: ``routes/app.py`` (HTTP), ``assembly.py`` (construction), ``plane.py`` (holds it),
tests.
Also imported by ``gateway/listener.py``, ``routes/approval_page.py``, ``routes/approvals.py``,
``routes/table.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..canonical import sha256_digest
from ..clock import Clock, format_ms
from ..codes import Code
from ..config import EscalationMode, ExecutorMode
from ..dispatch.effects import EffectRegister
from ..dispatch.seam import Outcome, ReconcileResult, ReconcileStatus, Registry
from ..door.door import check_action
from ..errors import AgentSafeError, RequestRejected, StoreError
from ..events import Streams
from ..host.metrics import ExecutorMetrics
from ..ids import uuid4_text
from ..intent import (
    CapturedIntent,
    DownstreamTarget,
    capture_intent,
    check_intent_owner,
    intent_from_binding,
)
from ..policy.authority import ESCALATION_TYP, RECOVERY_TYP, Authority, Decision, Verdict
from ..principals import Principal, Verification
from ..state.journal import AttemptJournal
from ..state.protocol import UseStore
from ..state.records import (
    ApprovalError,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalState,
    IdempotencyKind,
)
from .answers import Answer, decision_answer, halted_answer, reconciled_answer
from .attempt import Attempt, Progress, TokenSigner, UnknownAttempts
from .ceilings import HostCeilings
from .shadow import RECORDED_STATUSES, ShadowReport

__all__ = ["APPROVAL_PAGE_PATH", "ActionCatalog", "Pipeline", "Proposal", "approval_url"]

log = logging.getLogger(__name__)


class ActionCatalog(Protocol):
    """Which registered handler runs a policy action (``None``: none does)."""

    def handler_for(self, action: str) -> str | None: ...


@dataclass(frozen=True)
class Proposal:
    """The agent's part of ``POST /v1/actions``, already schema-checked."""

    action: str
    target: str
    parameters: Mapping[str, Any]
    idempotency_key: str
    correlation_id: str | None = None

    def payload_digest(self) -> str:
        return sha256_digest(
            {"action": self.action, "target": self.target, "parameters": dict(self.parameters)}
        )


class Pipeline:
    def __init__(
        self,
        *,
        mode: ExecutorMode,
        authority: Authority,
        signer: TokenSigner,
        catalog: ActionCatalog,
        registry: Registry,
        store: UseStore,
        journal: AttemptJournal | None,
        ceilings: HostCeilings | None,
        streams: Streams,
        clock: Clock,
        target: DownstreamTarget,
        intent_ttl_seconds: int,
        max_clock_skew_ms: int,
        shadow: ShadowReport | None = None,
        refusal: Callable[[], str | None] = lambda: None,
        on_clock_skew: Callable[[float], None] = lambda skew: None,
        metrics: ExecutorMetrics | None = None,
        escalation: EscalationMode = EscalationMode.NONE,
        on_forbidden: Callable[[Principal, Code], None] = lambda principal, code: None,
        unknown: UnknownAttempts | None = None,
        settle_margin_s: float = 0.0,
        approval_origin: str | None = None,
        on_approval_requested: Callable[[ApprovalRequest, str], None] = lambda request, url: None,
        effects: EffectRegister | None = None,
        on_effect_mismatch: Callable[[str], None] = lambda grant_id: None,
    ) -> None:
        self.mode = mode
        self._authority = authority
        self._signer = signer
        self._catalog = catalog
        self._registry = registry
        self._store = store
        self._journal = journal
        self._ceilings = ceilings
        self._streams = streams
        self._clock = clock
        self._target = target
        self._ttl = intent_ttl_seconds
        self._max_skew = max_clock_skew_ms / 1000.0
        self.shadow = shadow or ShadowReport()
        self._refusal = refusal
        self._on_clock_skew = on_clock_skew
        self._metrics = metrics
        self.escalation = escalation
        self._on_forbidden = on_forbidden
        self.unknown = unknown if unknown is not None else UnknownAttempts()
        self._unrecorded: dict[tuple[str, str, str], dict[str, Any]] = {}
        """Final answers given after the point of no return that the use store did not take
        (a full disk): replayed from here, and recorded once the store takes them."""
        self._settle_margin = settle_margin_s
        self._owner = journal.identity if journal is not None else ""
        self._approval_origin = approval_origin
        self._on_approval_requested = on_approval_requested
        self._on_effect_mismatch = on_effect_mismatch
        self._attempt = Attempt(
            authority=authority,
            signer=signer,
            registry=registry,
            journal=journal,
            ceilings=ceilings,
            streams=streams,
            clock=clock,
            count_outcome=self._count_outcome,
            on_unknown=self.unknown.add,
            effects=effects,
            on_effect_mismatch=self._effect_mismatch,
            on_ceiling_refused=self._ceiling_refused,
        )

    def _ceiling_refused(
        self, intent: CapturedIntent, principal: Principal, code: str, stage: str
    ) -> None:
        """Every ceiling refusal is one evidence line and one count."""
        self._streams.evidence.emit(
            "CEILING_REFUSED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "caller": principal.id,
                "code": code,
                "stage": stage,
            },
        )
        if self._metrics is not None:
            self._metrics.ceiling_refusals.inc(code=code)

    def _effect_mismatch(self, grant_id: str) -> None:
        if self._metrics is not None:
            self._metrics.effect_mismatches.inc()
        self._on_effect_mismatch(grant_id)

    def _count_outcome(self, outcome: Outcome) -> None:
        if self._metrics is not None and self.mode is ExecutorMode.ENFORCEMENT:
            self._metrics.executions.inc(outcome=outcome.value)

    def _handler(self, action: str) -> str:
        """The registered handler that runs ``action``, or 422 ACTION_NOT_REGISTERED."""
        handler = self._catalog.handler_for(action)
        if handler is None:
            raise RequestRejected(Code.ACTION_NOT_REGISTERED, "no handler runs this action")
        return handler

    def _check(self, principal: Principal, check: Callable[[], None]) -> None:
        """Run one of the door's checks; a refusal counts toward the principal's window."""
        try:
            check()
        except RequestRejected as exc:
            self._on_forbidden(principal, exc.code)
            raise

    def _halted(self, principal: Principal) -> Answer | None:
        """While halted or degraded, the 503 answer (nothing asked of the authority)."""
        refusal = self._refusal()
        if refusal is None:
            return None
        try:
            self._streams.evidence.emit(
                "EXECUTION_BLOCKED", {"caller": principal.id, "reason_codes": [refusal]}
            )
        except AgentSafeError as exc:  # a halt for a failing chain (CHAIN_HEADS): still coded
            log.warning("EXECUTION_BLOCKED was not recorded (%s)", exc.code)
        self._count_outcome(Outcome.BLOCKED)
        return halted_answer(self.mode.value, refusal)

    # ------------------------------------------------------------------ proposals

    async def propose(self, principal: Principal, proposal: Proposal) -> Answer:
        halted = self._halted(principal)
        if halted is not None:
            return halted
        self._check(principal, lambda: check_action(principal, proposal.action))
        handler = self._handler(proposal.action)
        assert principal.tenant_id is not None
        return await self._once(
            tenant=principal.tenant_id,
            principal=principal,
            key=proposal.idempotency_key,
            payload_digest=proposal.payload_digest(),
            conflict="this idempotency key was used with a different proposal",
            run=lambda progress: self._propose_new(principal, proposal, handler, progress),
        )

    async def _once(
        self,
        *,
        tenant: str,
        principal: Principal,
        key: str,
        payload_digest: str,
        conflict: str,
        run: Callable[[Progress], Awaitable[Answer]],
    ) -> Answer:
        """Run ``run`` at most once per (tenant, principal, key), as payment APIs define it.

        A finished answer is recorded and replayed; a key whose attempt never started (a refusal,
        an authority that could not answer) is freed so it may be retried. Once an attempt has
        started (``run`` sets the :class:`Progress` it is given), the key is never freed: a retry
        must not run it again, and an outcome nobody knows stays in flight until reconciliation
        settles it.
        """
        scope = {"tenant": tenant, "principal": principal.id, "key": key}
        progress = Progress()
        state = await self._store.idempotency_begin(
            **scope,
            payload_digest=payload_digest,
            now=self._clock.now(),
            attempt_id=progress.attempt_id,
            owner=self._owner,
        )
        if state.kind is IdempotencyKind.REPLAY:
            assert state.response is not None
            body = dict(state.response["body"])
            body["replayed"] = True
            self._streams.evidence.emit(
                "PROPOSAL_REPLAYED", {"caller": principal.id, "intent_id": body.get("intent_id")}
            )
            return Answer(int(state.response["status"]), body)
        if state.kind is IdempotencyKind.CONFLICT:
            raise RequestRejected(Code.IDEMPOTENCY_KEY_CONFLICT, conflict)
        if state.kind is IdempotencyKind.IN_PROGRESS:
            given = self._unrecorded.get((tenant, principal.id, key))
            if given is None:
                raise RequestRejected(
                    Code.IDEMPOTENCY_IN_PROGRESS,
                    "a request with this idempotency key is still in flight",
                )
            # The attempt finished and its answer was given, but the store did not take it:
            # the retry gets exactly that answer, and the store is asked to keep it again.
            await self.record_unrecorded()
            body = dict(given["body"])
            body["replayed"] = True
            self._streams.evidence.emit(
                "PROPOSAL_REPLAYED", {"caller": principal.id, "intent_id": body.get("intent_id")}
            )
            return Answer(int(given["status"]), body)
        try:
            answer = await run(progress)
        except BaseException:
            if not progress.started:
                await asyncio.shield(self._store.idempotency_release(**scope))
            raise
        final = answer.status < 500 and answer.body.get("outcome") in _FINAL_OUTCOMES
        if final:
            response = {"status": answer.status, "body": dict(answer.body)}
            try:
                await self._store.idempotency_complete(
                    **scope, response=response, now=self._clock.now()
                )
            except StoreError as exc:
                if not progress.started:
                    raise
                # The outcome is known and journaled; the caller gets it. The key stays in
                # flight in the store, so a retry never runs it again: this process replays
                # the answer (and records it once the store takes it: record_unrecorded);
                # after a restart, start-up settles the key from the journal.
                log.warning("the final answer was not recorded (%s)", exc.code)
                self._unrecorded[(tenant, principal.id, key)] = response
        elif not progress.started:
            await self._store.idempotency_release(**scope)
        return answer

    async def record_unrecorded(self) -> int:
        """Ask the store again to keep each final answer it refused; returns how many remain."""
        for (tenant, principal, key), response in list(self._unrecorded.items()):
            try:
                await self._store.idempotency_complete(
                    tenant=tenant,
                    principal=principal,
                    key=key,
                    response=response,
                    now=self._clock.now(),
                )
            except StoreError as exc:
                if exc.code not in (
                    Code.IDEMPOTENCY_ALREADY_COMPLETE,
                    Code.IDEMPOTENCY_RECORD_MISSING,
                ):
                    continue  # the store still refuses: asked again later
            self._unrecorded.pop((tenant, principal, key), None)
        return len(self._unrecorded)

    async def _propose_new(
        self, principal: Principal, proposal: Proposal, handler: str, progress: Progress
    ) -> Answer:
        intent = capture_intent(
            principal=principal,
            action=proposal.action,
            resource=proposal.target,
            parameters=proposal.parameters,
            idempotency_key=proposal.idempotency_key,
            target=self._target,
            now=self._clock.now(),
            ttl_seconds=self._ttl,
            intent_id=uuid4_text(),
            correlation_id=proposal.correlation_id,
        )
        self._streams.evidence.emit(
            "PROPOSAL_RECEIVED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "action": intent.action,
                "caller": principal.id,
                "payload_digest": intent.payload_digest,
            },
        )
        view = self._registry.admit(handler, proposal.target, intent.parameters)
        if self._ceilings is not None:
            try:
                await self._ceilings.check(view)
            except RequestRejected as exc:
                self._ceiling_refused(intent, principal, exc.code, "CHECK")
                raise
        decision = await self._decide(intent, principal)
        if decision is None:
            return self._unavailable(intent, principal)
        return await self._act(intent, principal, decision, handler, progress)

    async def _decide(
        self,
        intent: CapturedIntent,
        principal: Principal,
        approval: Mapping[str, Any] | None = None,
    ) -> Decision | None:
        asked = self._clock.now()
        try:
            decision = await self._authority.evaluate(
                intent, principal=principal, approval=approval
            )
        except AgentSafeError:
            log.exception("the authority could not answer")
            return None
        skew = abs(decision.authority_time - (asked + self._clock.now()) / 2)
        if skew > self._max_skew:
            self._streams.security.emit("CLOCK_SKEW_EXCEEDED", {"skew_ms": int(skew * 1000)})
            self._on_clock_skew(skew)
            return None
        if self._metrics is not None:
            self._metrics.proposals.inc(verdict=decision.verdict.value)
        self._streams.evidence.emit(
            "DECISION",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "decision_id": decision.decision_id,
                "dossier_id": decision.dossier_id,
                "verdict": decision.verdict.value,
                "reason_codes": list(decision.reason_codes),
                "caller": principal.id,
            },
        )
        return decision

    def _unavailable(self, intent: CapturedIntent, principal: Principal) -> Answer:
        if self.mode is ExecutorMode.SHADOW:
            self.shadow.record(intent.action, None, "UNAVAILABLE")
            outcome = "UNAVAILABLE"
        else:
            outcome = Outcome.BLOCKED.value
        self._streams.evidence.emit(
            "EXECUTION_BLOCKED",
            {
                "intent_id": intent.intent_id,
                "caller": principal.id,
                "reason_codes": [Code.AUTHORITY_UNAVAILABLE],
            },
        )
        body = decision_answer(
            mode=self.mode.value,
            intent_id=intent.intent_id,
            intent_hash=intent.intent_hash,
            verdict=Verdict.BLOCK.value,
            decision_id=None,
            dossier_id=None,
            reason_codes=[Code.AUTHORITY_UNAVAILABLE],
            fail_closed=True,
            outcome=outcome,
            executed=False,
        )
        return Answer(503, body)

    async def _act(
        self,
        intent: CapturedIntent,
        principal: Principal,
        decision: Decision,
        handler: str,
        progress: Progress,
    ) -> Answer:
        common: dict[str, Any] = {
            "mode": self.mode.value,
            "intent_id": intent.intent_id,
            "intent_hash": intent.intent_hash,
            "verdict": decision.verdict.value,
            "decision_id": decision.decision_id,
            "dossier_id": decision.dossier_id,
        }
        if self.mode is ExecutorMode.SHADOW:
            status = "INVALID" if Code.PARAMETERS_INVALID in decision.reason_codes else "OBSERVED"
            self.shadow.record(intent.action, decision.verdict.value, status)
            body = decision_answer(
                **common,
                reason_codes=decision.reason_codes,
                fail_closed=False,
                outcome=status,
                executed=False,
            )
            return Answer(200, body)
        if decision.verdict is Verdict.BLOCK:
            self._streams.evidence.emit(
                "EXECUTION_BLOCKED",
                {
                    "intent_id": intent.intent_id,
                    "decision_id": decision.decision_id,
                    "caller": principal.id,
                    "reason_codes": list(decision.reason_codes),
                },
            )
            self._count_outcome(Outcome.BLOCKED)
            body = decision_answer(
                **common,
                reason_codes=decision.reason_codes,
                fail_closed=False,
                outcome=Outcome.BLOCKED.value,
                executed=False,
            )
            return Answer(200, body)
        if decision.verdict is Verdict.ESCALATE:
            self._count_outcome(Outcome.ESCALATE_PENDING)
            body = decision_answer(
                **common,
                reason_codes=decision.reason_codes,
                fail_closed=False,
                outcome=Outcome.ESCALATE_PENDING.value,
                executed=False,
                escalation=await self._escalation_object(intent, principal, decision),
            )
            return Answer(200, body)
        return await self._attempt.run(
            intent=intent,
            principal=principal,
            decision=decision,
            handler=handler,
            common=common,
            progress=progress,
        )

    async def _escalation_object(
        self, intent: CapturedIntent, principal: Principal, decision: Decision
    ) -> Mapping[str, Any] | None:
        """With ``EXECUTOR_ESCALATION=APPROVAL``: a durable approval request, and the signed
        object the proposer presents back. Otherwise the hold is the answer."""
        if self.escalation is not EscalationMode.APPROVAL:
            return None
        request_id = uuid4_text()
        actor = principal.actor.id if principal.actor is not None else principal.id
        request = ApprovalRequest(
            request_id=request_id,
            intent=dict(intent.binding),
            intent_hash=intent.intent_hash,
            approvers=tuple(decision.approvers),
            proposer_principal=principal.id,
            proposer_actor=actor,
            expires_at=intent.expires_at,
            created_at=self._clock.now(),
            rule=decision.rule,
            reason_codes=tuple(str(code) for code in decision.reason_codes),
            verification=decision.verification,
        )
        await self._store.approval_create(request)
        url = approval_url(self._approval_origin, request_id)
        token = self._signer.sign_token(
            {
                "request_id": request_id,
                "intent_hash": intent.intent_hash,
                "exp": int(intent.expires_at),
            },
            typ=ESCALATION_TYP,
        )
        self._streams.evidence.emit(
            "APPROVAL_REQUESTED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "decision_id": decision.decision_id,
                "request_id": request_id,
                "approvers": list(decision.approvers),
                "verification": decision.verification.value,
                "caller": principal.id,
            },
        )
        self._on_approval_requested(request, url)
        return {
            "mode": "APPROVAL",
            "intent": dict(intent.binding),
            "request_id": request_id,
            "approval_url": url,
            "expires_at": intent.expires_at_text,
            "token": token,
        }

    # ------------------------------------------------------------------ reconciliation

    async def reconcile(self, principal: Principal, recovery: Mapping[str, Any]) -> Answer:
        """Read-only: ask the provider what it did with an attempt whose answer was lost."""
        intent = intent_from_binding(recovery.get("intent"))
        reference = recovery.get("reference")
        if not isinstance(reference, str):
            raise RequestRejected(Code.REQUEST_INVALID, "the recovery object has no reference")
        try:
            claims = self._signer.verify_token(reference, typ=RECOVERY_TYP)
        except AgentSafeError:
            raise RequestRejected(
                Code.RECOVERY_BINDING_MISMATCH, "the recovery reference does not verify"
            ) from None
        if claims.get("intent_hash") != intent.intent_hash:
            raise RequestRejected(
                Code.RECOVERY_BINDING_MISMATCH,
                "the presented intent does not match its recovery reference",
            )
        self._check(principal, lambda: check_intent_owner(principal, intent))
        handler = self._handler(intent.action)
        result = await self._registry.reconcile(
            handler, intent.idempotency_key, intent_hash=intent.intent_hash
        )
        grant_exp = claims.get("grant_exp")
        if (
            result.status is ReconcileStatus.NOT_EXECUTED
            and isinstance(grant_exp, int | float)
            and self._clock.now() < float(grant_exp) + self._settle_margin
        ):
            # The dispatch could still land (a provider whose lookup lags its commit): the
            # rule in docs/architecture.md, "When not executed may be concluded".
            result = ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.RECONCILE_TOO_EARLY)
        status = result.status.value
        outcome, executed = _RECONCILED[result.status]
        attempt_id = str(claims.get("attempt_id", ""))
        known = result.status is not ReconcileStatus.UNKNOWN
        if self._journal is not None and known and attempt_id:
            await self._journal.reconciled(attempt_id=attempt_id, status=status, by="CALLER")
            self.unknown.discard(attempt_id)
        settled = reconciled_answer(
            mode=self.mode.value,
            intent_id=intent.intent_id,
            intent_hash=intent.intent_hash,
            status=status,
        )
        if settled is not None:
            # A replay of the key now says what the provider did, not "unknown".
            await self._store.idempotency_settle(
                tenant=intent.tenant_id,
                principal=principal.id,
                key=intent.idempotency_key,
                response={"status": 200, "body": settled},
                now=self._clock.now(),
            )
        self._streams.evidence.emit(
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
            "reconciled_at": format_ms(self._clock.now()),
        }
        return Answer(200, body)

    # ------------------------------------------------------------------ escalations

    async def resume_escalation(
        self, principal: Principal, escalation: Mapping[str, Any]
    ) -> Answer:
        """``POST /v1/escalations``: one lookup; a fresh decision once the person answered."""
        if self.escalation is not EscalationMode.APPROVAL:
            raise RequestRejected(
                Code.ESCALATION_NOT_CONFIGURED,
                "this executor resolves no escalations (EXECUTOR_ESCALATION=NONE); "
                "the hold is the answer",
            )
        halted = self._halted(principal)
        if halted is not None:
            return halted
        intent, request_id = self._bound_escalation(principal, escalation)
        record = await self._store.approval_get(request_id)
        if record is None:
            raise RequestRejected(Code.APPROVAL_NOT_FOUND, "no such approval request")
        state = record.state_at(self._clock.now())
        intent_expired = self._clock.now() >= intent.expires_at
        common: dict[str, Any] = {
            "mode": self.mode.value,
            "intent_id": intent.intent_id,
            "intent_hash": intent.intent_hash,
            "decision_id": None,
            "dossier_id": None,
        }
        if state is ApprovalState.PENDING:
            body = decision_answer(
                **common,
                verdict=Verdict.ESCALATE.value,
                reason_codes=[Code.APPROVAL_PENDING],
                fail_closed=False,
                outcome=Outcome.ESCALATE_PENDING.value,
                executed=False,
                escalation=dict(escalation),
            )
            return Answer(200, body)
        if state is not ApprovalState.APPROVED or intent_expired:
            reasons = [_CLOSED_REASONS.get(state, Code.APPROVAL_EXPIRED)]
            if intent_expired:
                # An approval cannot revive an expired intent: BLOCK, never 409 (issue 21).
                reasons = [Code.APPROVAL_EXPIRED, Code.INTENT_EXPIRED]
            self._count_outcome(Outcome.BLOCKED)
            self._streams.evidence.emit(
                "EXECUTION_BLOCKED",
                {"intent_id": intent.intent_id, "caller": principal.id, "reason_codes": reasons},
            )
            body = decision_answer(
                **common,
                verdict=Verdict.BLOCK.value,
                reason_codes=reasons,
                fail_closed=False,
                outcome=Outcome.BLOCKED.value,
                executed=False,
            )
            return Answer(200, body)
        return await self._execute_approved(principal, intent, record, self._handler(intent.action))

    def _bound_escalation(
        self, principal: Principal, escalation: Mapping[str, Any]
    ) -> tuple[CapturedIntent, str]:
        """The intent and request id of an escalation object this executor signed for exactly
        that intent, presented by the principal that proposed it."""
        intent = intent_from_binding(escalation.get("intent"))
        token = escalation.get("token")
        request_id = escalation.get("request_id")
        try:
            claims = self._signer.verify_token(str(token), typ=ESCALATION_TYP)
        except AgentSafeError:
            claims = {}
        if (
            not isinstance(token, str)
            or not isinstance(request_id, str)
            or claims.get("intent_hash") != intent.intent_hash
            or claims.get("request_id") != request_id
        ):
            raise RequestRejected(
                Code.ESCALATION_BINDING_MISMATCH,
                "the escalation object does not belong to this intent",
            )
        self._check(principal, lambda: check_intent_owner(principal, intent))
        return intent, request_id

    async def cancel_escalation(
        self, principal: Principal, escalation: Mapping[str, Any], reason: str
    ) -> Answer:
        """``POST /v1/escalations/cancel``: the proposer withdraws its own pending escalation;
        a later resume is BLOCK APPROVAL_CANCELLED. 409 APPROVAL_NOT_CANCELLABLE once decided,
        expired or cancelled."""
        if self.escalation is not EscalationMode.APPROVAL:
            raise RequestRejected(
                Code.ESCALATION_NOT_CONFIGURED, "this executor resolves no escalations"
            )
        intent, request_id = self._bound_escalation(principal, escalation)
        try:
            record = await self._store.approval_cancel(
                request_id, by=principal.id, reason=reason, now=self._clock.now()
            )
        except ApprovalError as exc:
            raise RequestRejected(exc.code, exc.message) from None
        self._streams.evidence.emit(
            "APPROVAL_CANCELLED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "request_id": record.request.request_id,
                "by": principal.id,
            },
        )
        return Answer(
            200,
            {
                "request_id": record.request.request_id,
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "state": ApprovalState.CANCELLED.value,
                "cancelled_by": principal.id,
            },
        )

    async def _execute_approved(
        self, principal: Principal, intent: CapturedIntent, record: ApprovalRecord, handler: str
    ) -> Answer:
        """An approved intent runs once: the request id is its own idempotency key."""
        approval = {
            "decision": "APPROVE",
            "approver": record.approver,
            "approver_actor": None,  # checked against the proposer when it was decided
            "request_id": record.request.request_id,
            "intent_hash": intent.intent_hash,
            "verification": (record.verification or Verification.CREDENTIAL).value,
        }

        async def run(progress: Progress) -> Answer:
            decision = await self._decide(intent, principal, approval)
            if decision is None:
                return self._unavailable(intent, principal)
            return await self._act(intent, principal, decision, handler, progress)

        return await self._once(
            tenant=intent.tenant_id,
            principal=principal,
            key="approval:" + record.request.request_id,
            payload_digest=intent.intent_hash,
            conflict="this approval belongs to another intent",
            run=run,
        )


APPROVAL_PAGE_PATH = "/approve"
"""The approval page's route prefix (``routes/approval_page.py`` serves it)."""


def approval_url(origin: str | None, request_id: str) -> str:
    """Where a person decides ``request_id``: absolute with ``EXECUTOR_APPROVAL_ORIGIN``, else
    the path on this listener."""
    return f"{origin or ''}{APPROVAL_PAGE_PATH}/{request_id}"


_CLOSED_REASONS: dict[ApprovalState, Code] = {
    ApprovalState.DENIED: Code.APPROVAL_DENIED,
    ApprovalState.CANCELLED: Code.APPROVAL_CANCELLED,
    ApprovalState.EXPIRED: Code.APPROVAL_EXPIRED,
}

_FINAL_OUTCOMES = frozenset({*(outcome.value for outcome in Outcome), *RECORDED_STATUSES})
"""Answers recorded for a key and replayed; anything else (a 5xx, a shadow UNAVAILABLE) frees it."""

_RECONCILED: dict[ReconcileStatus, tuple[Outcome, bool | None]] = {
    ReconcileStatus.COMPLETED: (Outcome.COMPLETED, True),
    ReconcileStatus.NOT_EXECUTED: (Outcome.DEFINITELY_NOT_EXECUTED, False),
    ReconcileStatus.UNKNOWN: (Outcome.UNKNOWN_AFTER_DISPATCH, None),
}
