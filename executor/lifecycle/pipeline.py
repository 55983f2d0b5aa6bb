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

Which handler runs an action is asked once per request; the owner and action checks are the
door's and the intent's own (``check_action``, ``check_intent_owner``).

Decided first (issue 34). Step 4 runs before step 3 in every mode, and outside shadow and
without host ceilings step 5 too, recording nothing (in ``propose``): the authority is local and
pure, so a key already kept costs only that CPU, and is then answered exactly as in step 3. A
BLOCK then takes one write, its key with its final answer (``UseStore.idempotency_record``),
instead of claiming the key and completing it in two commits; its three lines follow that write.
Any other verdict claims the key (step 3) and goes on with the decision it has. A step that
refuses or fails, or a skewed clock, leaves the proposal to the order above with the intent it
has, which asks again and refuses, counts and records as it always has.

Tasks (issue 32): the proposal route runs :meth:`Pipeline.propose` as its own task and
:meth:`Pipeline.decide_and_act` runs the attempt as its own task, each awaited where it is made
(cancelling the awaiting task cancels it), so a resumption after a durable step starts at the
coroutine that waited instead of walking the whole request again. A task inherits its parent's
context: on the shared store the key holder that ``idempotency_begin`` sets in the pipeline's
task (``state/pgconn.py`` ``HELD_KEY``) is seen by the attempt's task, which opens its attempt
under it, and the pipeline's task lets go of it when it completes or frees the key.

An ESCALATE opens an approval request (``escalations.py``'s ``EscalationRequests``); the
reconciliation route (``reconciliations.py``) and the escalations' resume and cancel
(``escalations.py``) live beside the pipeline and reuse its checks, its once-per-key rule and its
path to the authority and the attempt (``check``, ``handler``, ``halted``, ``once``,
``decide_and_act``). What the pipeline and its attempts report goes to one ``Outcomes``
(``outcomes.py``).

Callers: ``routes/app.py`` (HTTP), ``assembly.py`` (construction), ``plane.py`` (holds it),
``escalations.py`` and ``reconciliations.py`` (type only), tests.
Also imported by ``gateway/listener.py``, ``routes/table.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ..canonical import sha256_digest
from ..clock import Clock
from ..codes import Code
from ..config import EscalationMode, ExecutorMode
from ..dispatch.effects import EffectRegister
from ..dispatch.seam import Outcome, Registry
from ..door.door import check_action
from ..errors import AgentSafeError, RequestRejected, StoreError
from ..events import Streams
from ..host.metrics import ExecutorMetrics
from ..ids import uuid4_text
from ..intent import (
    CapturedIntent,
    DownstreamTarget,
    capture_intent,
)
from ..policy.authority import Authority, Decision, Verdict
from ..principals import Principal
from ..state.journal import AttemptJournal
from ..state.protocol import UseStore
from ..state.records import (
    ApprovalRequest,
    IdempotencyKind,
    IdempotencyState,
)
from .answers import Answer, decision_answer, halted_answer
from .approval_requests import EscalationRequests, no_webhook
from .attempt import Attempt, Progress, TokenSigner, UnknownAttempts
from .ceilings import HostCeilings
from .outcomes import Outcomes, ignore_mismatch
from .shadow import RECORDED_STATUSES, ShadowReport

__all__ = ["ActionCatalog", "Pipeline", "Proposal"]

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
        on_approval_requested: Callable[[ApprovalRequest, str], None] = no_webhook,
        effects: EffectRegister | None = None,
        on_effect_mismatch: Callable[[str], None] = ignore_mismatch,
    ) -> None:
        self.mode = mode
        self._authority = authority
        self.signer = signer
        self._catalog = catalog
        self.registry = registry
        self.store = store
        self.journal = journal
        self._ceilings = ceilings
        self.streams = streams
        self.clock = clock
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
        self.settle_margin = settle_margin_s
        self._owner = journal.identity if journal is not None else ""
        self.requests = EscalationRequests(
            mode=escalation,
            store=store,
            signer=signer,
            clock=clock,
            streams=streams,
            origin=approval_origin,
            on_requested=on_approval_requested,
        )
        self.outcomes = Outcomes(
            mode=mode,
            streams=streams,
            metrics=metrics,
            unknown_attempts=self.unknown,
            on_effect_mismatch=on_effect_mismatch,
        )
        self._attempt = Attempt(
            authority=authority,
            signer=signer,
            registry=registry,
            journal=journal,
            ceilings=ceilings,
            streams=streams,
            clock=clock,
            report=self.outcomes,
            effects=effects,
        )

    def handler(self, action: str) -> str:
        """The registered handler that runs ``action``, or 422 ACTION_NOT_REGISTERED."""
        handler = self._catalog.handler_for(action)
        if handler is None:
            raise RequestRejected(Code.ACTION_NOT_REGISTERED, _NOT_REGISTERED)
        return handler

    def check(self, principal: Principal, check: Callable[[], None]) -> None:
        """Run one of the door's checks; a refusal counts toward the principal's window."""
        try:
            check()
        except RequestRejected as exc:
            self._on_forbidden(principal, exc.code)
            raise

    def halted(self, principal: Principal) -> Answer | None:
        """While halted or degraded, the 503 answer (nothing asked of the authority)."""
        refusal = self._refusal()
        if refusal is None:
            return None
        try:
            self.streams.evidence.emit(
                "EXECUTION_BLOCKED", {"caller": principal.id, "reason_codes": [refusal]}
            )
        except AgentSafeError as exc:  # a halt for a failing chain (CHAIN_HEADS): still coded
            log.warning("EXECUTION_BLOCKED was not recorded (%s)", exc.code)
        self.outcomes.outcome(Outcome.BLOCKED)
        return halted_answer(self.mode.value, refusal)

    # ------------------------------------------------------------------ proposals

    async def propose(self, principal: Principal, proposal: Proposal) -> Answer:
        """``POST /v1/actions``, steps 1 to 3 here and the rest in :meth:`_propose_new`.

        The route runs it as its own task, so a resumption after a store write starts here. The
        action check and the handler lookup are this stage's own (written here, not through
        :meth:`check` and :meth:`handler`, which the escalations and the reconciliation route
        share): each helper call after a call into another module is one more visit of the
        pipeline on every request (issue 32)."""
        halted = self.halted(principal)
        if halted is not None:
            return halted
        try:
            check_action(principal, proposal.action)
        except RequestRejected as exc:  # counts toward the principal's window, as check() does
            self._on_forbidden(principal, exc.code)
            raise
        handler = self._catalog.handler_for(proposal.action)
        if handler is None:
            raise RequestRejected(Code.ACTION_NOT_REGISTERED, _NOT_REGISTERED)
        assert principal.tenant_id is not None
        # Steps 4 and 5 before the key, recording nothing (the module docstring, "Decided
        # first"), written here and not in a helper: each helper call after a call into another
        # module is one more visit of the pipeline on every request (issue 32).
        intent = capture_intent(
            principal=principal,
            action=proposal.action,
            resource=proposal.target,
            parameters=proposal.parameters,
            idempotency_key=proposal.idempotency_key,
            target=self._target,
            now=self.clock.now(),
            ttl_seconds=self._ttl,
            intent_id=uuid4_text(),
            correlation_id=proposal.correlation_id,
        )
        decided: tuple[CapturedIntent, Decision] | None = None
        if self.mode is not ExecutorMode.SHADOW and self._ceilings is None:
            try:
                self.registry.admit(handler, intent.resource, intent.parameters)
                asked = self.clock.now()
                decision = await self._authority.evaluate(intent, principal=principal)
            except AgentSafeError:  # refused or failed: the old way says so, in its order
                pass
            else:
                skew = abs(decision.authority_time - (asked + self.clock.now()) / 2)
                if skew <= self._max_skew:
                    decided = (intent, decision)
        payload_digest = proposal.payload_digest()
        if decided is not None and decided[1].verdict is Verdict.BLOCK:
            return await self._block_once(principal, proposal, payload_digest, *decided)
        run: Callable[[Progress], Awaitable[Answer]] = (
            partial(self._propose_new, intent, principal, handler)
            if decided is None
            else partial(self._received, *decided, principal, handler)
        )
        return await self.once(
            tenant=principal.tenant_id,
            principal=principal,
            key=proposal.idempotency_key,
            payload_digest=payload_digest,
            conflict=_CONFLICT,
            run=run,
        )

    async def _block_once(
        self,
        principal: Principal,
        proposal: Proposal,
        payload_digest: str,
        intent: CapturedIntent,
        decision: Decision,
    ) -> Answer:
        """A BLOCK decided before its key was claimed: the key and its final answer in one
        write (``UseStore.idempotency_record``), where claiming the key and then completing it
        took two commits. A key already kept is answered as :meth:`once` answers it, and this
        proposal leaves no line. A new key's lines (PROPOSAL_RECEIVED, DECISION,
        EXECUTION_BLOCKED) follow its durable answer, before the caller has it."""
        assert principal.tenant_id is not None
        scope = {
            "tenant": principal.tenant_id,
            "principal": principal.id,
            "key": proposal.idempotency_key,
        }
        common = self._common(intent, decision)
        body = decision_answer(
            **common,
            reason_codes=decision.reason_codes,
            fail_closed=False,
            outcome=Outcome.BLOCKED.value,
            executed=False,
        )
        state = await self.store.idempotency_record(
            **scope,
            payload_digest=payload_digest,
            response={"status": 200, "body": body},
            now=self.clock.now(),
        )
        if state.kind is not IdempotencyKind.NEW:
            return await self._kept(state, principal, scope, _CONFLICT)
        self._line_received(intent, principal)
        self._line_decision(intent, principal, decision)
        self._line_blocked(intent, principal, decision)
        self.outcomes.outcome(Outcome.BLOCKED)
        return Answer(200, dict(body))

    async def once(
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
        state = await self.store.idempotency_begin(
            **scope,
            payload_digest=payload_digest,
            now=self.clock.now(),
            attempt_id=progress.attempt_id,
            owner=self._owner,
        )
        if state.kind is not IdempotencyKind.NEW:
            return await self._kept(state, principal, scope, conflict)
        try:
            answer = await run(progress)
        except BaseException:
            if not progress.started:
                await asyncio.shield(self.store.idempotency_release(**scope))
            raise
        final = answer.status < 500 and answer.body.get("outcome") in _FINAL_OUTCOMES
        if final:
            response = {"status": answer.status, "body": dict(answer.body)}
            try:
                await self.store.idempotency_complete(
                    **scope, response=response, now=self.clock.now()
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
            await self.store.idempotency_release(**scope)
        return answer

    async def _kept(
        self,
        state: IdempotencyState,
        principal: Principal,
        scope: Mapping[str, str],
        conflict: str,
    ) -> Answer:
        """The answer for a key the store already keeps: its answer replayed, 409 for another
        proposal under it, 409 while it is in flight (unless its answer was given and the store
        did not take it: that answer, replayed)."""
        if state.kind is IdempotencyKind.REPLAY:
            assert state.response is not None
            body = dict(state.response["body"])
            body["replayed"] = True
            self.streams.evidence.emit(
                "PROPOSAL_REPLAYED", {"caller": principal.id, "intent_id": body.get("intent_id")}
            )
            return Answer(int(state.response["status"]), body)
        if state.kind is IdempotencyKind.CONFLICT:
            raise RequestRejected(Code.IDEMPOTENCY_KEY_CONFLICT, conflict)
        given = self._unrecorded.get((scope["tenant"], scope["principal"], scope["key"]))
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
        self.streams.evidence.emit(
            "PROPOSAL_REPLAYED", {"caller": principal.id, "intent_id": body.get("intent_id")}
        )
        return Answer(int(given["status"]), body)

    async def record_unrecorded(self) -> int:
        """Ask the store again to keep each final answer it refused; returns how many remain."""
        for (tenant, principal, key), response in list(self._unrecorded.items()):
            try:
                await self.store.idempotency_complete(
                    tenant=tenant,
                    principal=principal,
                    key=key,
                    response=response,
                    now=self.clock.now(),
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
        self, intent: CapturedIntent, principal: Principal, handler: str, progress: Progress
    ) -> Answer:
        """A proposal not decided before its key (shadow, host ceilings, or a step that refused
        or failed there), now that the key is its: recorded, then decided and acted on."""
        self._line_received(intent, principal)
        return await self.decide_and_act(intent, principal, handler, progress)

    async def _received(
        self,
        intent: CapturedIntent,
        decision: Decision,
        principal: Principal,
        handler: str,
        progress: Progress,
    ) -> Answer:
        """A proposal decided before its key was claimed (in :meth:`propose`), now that the
        key is its: recorded and acted on as :meth:`_propose_new` would."""
        self._line_received(intent, principal)
        return await self._act(intent, principal, handler, progress, decision)

    def _line_received(self, intent: CapturedIntent, principal: Principal) -> None:
        self.streams.evidence.emit(
            "PROPOSAL_RECEIVED",
            {
                "intent_id": intent.intent_id,
                "intent_hash": intent.intent_hash,
                "action": intent.action,
                "caller": principal.id,
                "payload_digest": intent.payload_digest,
            },
        )

    def _line_decision(
        self, intent: CapturedIntent, principal: Principal, decision: Decision
    ) -> None:
        if self._metrics is not None:
            self._metrics.proposals.inc(verdict=decision.verdict.value)
        self.streams.evidence.emit(
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

    def _line_blocked(
        self, intent: CapturedIntent, principal: Principal, decision: Decision
    ) -> None:
        self.streams.evidence.emit(
            "EXECUTION_BLOCKED",
            {
                "intent_id": intent.intent_id,
                "decision_id": decision.decision_id,
                "caller": principal.id,
                "reason_codes": list(decision.reason_codes),
            },
        )

    def _common(self, intent: CapturedIntent, decision: Decision) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "intent_id": intent.intent_id,
            "intent_hash": intent.intent_hash,
            "verdict": decision.verdict.value,
            "decision_id": decision.decision_id,
            "dossier_id": decision.dossier_id,
        }

    async def decide_and_act(
        self,
        intent: CapturedIntent,
        principal: Principal,
        handler: str,
        progress: Progress,
        approval: Mapping[str, Any] | None = None,
    ) -> Answer:
        """Steps 5 to 7 for a new proposal and an approved escalation alike: ask the authority
        about ``intent`` and act on its answer, in one flow (issue 32: a helper called after a
        call into another module is one more visit of the pipeline on every request).

        A new proposal (no ``approval``) is first admitted by its handler and checked against
        the host ceilings; an approved escalation was, when it was proposed. An authority that
        cannot answer, or answers with too much clock skew, is :meth:`unavailable`; shadow,
        BLOCK and ESCALATE are answered without an attempt (:meth:`_without_attempt`); an ALLOW
        runs its attempt as its own task (see the module docstring)."""
        if approval is None:
            view = self.registry.admit(handler, intent.resource, intent.parameters)
            if self._ceilings is not None:
                try:
                    await self._ceilings.check(view)
                except RequestRejected as exc:
                    self.outcomes.ceiling_refused(intent, principal, exc.code, "CHECK")
                    raise
        asked = self.clock.now()
        try:
            decision = await self._authority.evaluate(
                intent, principal=principal, approval=approval
            )
        except AgentSafeError:
            log.exception("the authority could not answer")
            return self.unavailable(intent, principal)
        skew = abs(decision.authority_time - (asked + self.clock.now()) / 2)
        if skew > self._max_skew:
            self.streams.security.emit("CLOCK_SKEW_EXCEEDED", {"skew_ms": int(skew * 1000)})
            self._on_clock_skew(skew)
            return self.unavailable(intent, principal)
        return await self._act(intent, principal, handler, progress, decision)

    async def _act(
        self,
        intent: CapturedIntent,
        principal: Principal,
        handler: str,
        progress: Progress,
        decision: Decision,
    ) -> Answer:
        """Step 6 and 7 on the authority's answer: its line, then no attempt or one."""
        common = self._common(intent, decision)  # before the line: see propose (issue 32)
        self._line_decision(intent, principal, decision)
        if self.mode is ExecutorMode.SHADOW or decision.verdict is not Verdict.ALLOW:
            return await self._without_attempt(intent, principal, decision, common)
        # The attempt runs as its own task, awaited here (cancelling this one cancels it): its
        # resumptions after each durable step start at the attempt, not again at the pipeline
        # (issue 32). It inherits this task's context, so on the shared store the key holder
        # idempotency_begin set (state/pgconn.py HELD_KEY) fences its ATTEMPT_OPENED; the key
        # is completed or released here afterwards, in the task that began it.
        return await asyncio.ensure_future(
            self._attempt.run(
                intent=intent,
                principal=principal,
                decision=decision,
                handler=handler,
                common=common,
                progress=progress,
            )
        )

    def unavailable(self, intent: CapturedIntent, principal: Principal) -> Answer:
        if self.mode is ExecutorMode.SHADOW:
            self.shadow.record(intent.action, None, "UNAVAILABLE")
            outcome = "UNAVAILABLE"
        else:
            outcome = Outcome.BLOCKED.value
        self.streams.evidence.emit(
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

    async def _without_attempt(
        self,
        intent: CapturedIntent,
        principal: Principal,
        decision: Decision,
        common: dict[str, Any],
    ) -> Answer:
        """The answer to a decision that starts no attempt: any verdict in shadow, else BLOCK
        or ESCALATE (an approval request opened)."""
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
            self._line_blocked(intent, principal, decision)
            self.outcomes.outcome(Outcome.BLOCKED)
            body = decision_answer(
                **common,
                reason_codes=decision.reason_codes,
                fail_closed=False,
                outcome=Outcome.BLOCKED.value,
                executed=False,
            )
            return Answer(200, body)
        self.outcomes.outcome(Outcome.ESCALATE_PENDING)
        body = decision_answer(
            **common,
            reason_codes=decision.reason_codes,
            fail_closed=False,
            outcome=Outcome.ESCALATE_PENDING.value,
            executed=False,
            escalation=await self.requests.open(intent, principal, decision),
        )
        return Answer(200, body)


_NOT_REGISTERED = "no handler runs this action"

_CONFLICT = "this idempotency key was used with a different proposal"

_FINAL_OUTCOMES = frozenset({*(outcome.value for outcome in Outcome), *RECORDED_STATUSES})
"""Answers recorded for a key and replayed; anything else (a 5xx, a shadow UNAVAILABLE) frees it."""
