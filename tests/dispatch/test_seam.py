"""The handler seam: registration rules and how every way a handler can end is classified."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Mapping
from typing import Any

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.dispatch import seam as seam_module
from agentsafe.executor.dispatch.seam import (
    Authorization,
    Dispatch,
    ExecutionContext,
    ExecutionReport,
    Outcome,
    Prepared,
    ProviderRefused,
    ReconcileResult,
    ReconcileStatus,
    Registry,
)
from agentsafe.executor.egress.transport import TransportError
from agentsafe.executor.errors import AgentSafeError, HandlerError, JournalError, RequestRejected
from agentsafe.executor.events import MemorySink
from agentsafe.executor.routes.refusals import status_of
from tests.support.intents import make_intent

IH = "sha256:" + "ab" * 32  # the intent a lookup is asked on behalf of

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["amountMinor", "currency"],
    "properties": {
        "amountMinor": {"type": "integer", "minimum": 1},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
    },
}


def make_ctx(clock: ManualClock, *, grant_seconds: float = 30.0) -> ExecutionContext:
    intent = make_intent(now=clock.now())
    auth = Authorization("dec-1", "dos-1", "grant-1", expires_at=clock.now() + grant_seconds)
    return ExecutionContext.create(intent=intent, authorization=auth, clock=clock)


class ScriptedHandler:
    """A handler whose behaviour each test scripts; it records what the seam let it do."""

    def __init__(self, script: str, *, schema: Mapping[str, Any] = SCHEMA) -> None:
        self.script = script
        self.parameters_schema = schema
        self.ran = False
        self.sent_keys: list[str] = []
        self.order: list[str] | None = None

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        self.ran = True
        if self.order is not None:
            self.order.append("handler")
        if self.script == "raise_before":
            raise RuntimeError("broke before dispatch")
        if self.script == "agentsafe_before":
            raise HandlerError("nope", code="CREDENTIAL_INVALID")
        if self.script == "no_dispatch":
            return {"ok": True}

        async def send(key: str) -> str:
            self.sent_keys.append(key)
            if self.script == "raise_inside":
                raise ConnectionResetError("reset after send")
            if self.script == "not_sent":
                raise TransportError("TRANSPORT_CONNECT_FAILED", False)
            if self.script == "maybe_sent":
                raise TransportError("EGRESS_TIMEOUT", True)
            return "sent"

        await dispatch.run(send)
        if self.script == "raise_after":
            raise HandlerError("provider said 500", code="PROVIDER_ERROR")
        if self.script == "refused":
            raise ProviderRefused("INSUFFICIENT_FUNDS", status=422)
        if self.script == "twice":
            await dispatch.run(send)
        if self.script == "bad_result":
            return {"value": float("nan")}
        return {"status": 202, "accepted": True}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        if self.script == "reconcile_raises":
            raise OSError("lookup failed")
        return ReconcileResult(ReconcileStatus.COMPLETED, provider_reference=idempotency_key)


async def _noop(_: ExecutionContext) -> None:
    return None


def sealed(handler: ScriptedHandler, *, security: MemorySink | None = None) -> Registry:
    registry = Registry(security=security)
    registry.register("create_payout", handler)
    registry.seal()
    return registry


# -- value objects ---------------------------------------------------------------------------


def test_outcomes_are_the_contract_names() -> None:
    assert [o.value for o in Outcome] == [
        "COMPLETED",
        "BLOCKED",
        "FAILED_BEFORE_DISPATCH",
        "UNKNOWN_AFTER_DISPATCH",
        "DEFINITELY_NOT_EXECUTED",
        "ESCALATE_PENDING",
    ]


def test_authorization_wire_form_uses_millisecond_timestamps() -> None:
    auth = Authorization("dec-1", "dos-1", "grant-1", expires_at=1_800_000_030.5)
    assert auth.as_wire() == {
        "decision_id": "dec-1",
        "dossier_id": "dos-1",
        "grant_id": "grant-1",
        "expires_at": "2027-01-15T08:00:30.500Z",
    }


def test_remaining_follows_the_monotonic_clock_only() -> None:
    clock = ManualClock()
    ctx = make_ctx(clock, grant_seconds=10)
    assert ctx.remaining() == pytest.approx(10)
    clock._now -= 3600  # the wall clock is set back an hour: the deadline does not move
    assert ctx.remaining() == pytest.approx(10)
    clock.advance(4)
    assert ctx.remaining() == pytest.approx(6)
    clock.advance(7)
    assert ctx.remaining() == 0.0


# -- registration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "additionalProperties": True},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "array", "additionalProperties": False},
        {"type": "object", "additionalProperties": False, "properties": {"a": {"type": 7}}},
        ["not", "a", "schema"],
    ],
)
def test_register_requires_a_strict_valid_schema(schema: Any) -> None:
    registry = Registry()
    with pytest.raises(HandlerError) as err:
        registry.register("create_payout", ScriptedHandler("ok", schema=schema))
    assert err.value.code in {"SCHEMA_NOT_STRICT", "SCHEMA_INVALID"}
    assert registry.names() == ()


def test_register_refuses_a_schema_whose_ref_leads_back_to_itself() -> None:
    registry = Registry()
    schema = {"type": "object", "additionalProperties": False, "allOf": [{"$ref": "#"}]}
    with pytest.raises(HandlerError) as err:
        registry.register("create_payout", ScriptedHandler("ok", schema=schema))
    assert err.value.code == "SCHEMA_INVALID"
    assert registry.names() == ()


def test_register_refuses_duplicates_bad_names_and_anything_after_seal() -> None:
    registry = Registry()
    registry.register("create_payout", ScriptedHandler("ok"))
    registry.register("forward_request", ScriptedHandler("ok"))
    with pytest.raises(HandlerError) as dup:
        registry.register("create_payout", ScriptedHandler("ok"))
    assert dup.value.code == "ACTION_ALREADY_REGISTERED"
    for bad in ("", "has space", "9starts-with-digit", "x" * 200):
        with pytest.raises(HandlerError) as name:
            registry.register(bad, ScriptedHandler("ok"))
        assert name.value.code == "NAME_INVALID"
    registry.seal()
    with pytest.raises(HandlerError) as late:
        registry.register("late_action", ScriptedHandler("ok"))
    assert late.value.code == "REGISTRY_SEALED"
    assert registry.names() == ("create_payout", "forward_request")
    assert "create_payout" in registry
    assert "late_action" not in registry


def test_get_unknown_action_is_422_action_not_registered() -> None:
    registry = sealed(ScriptedHandler("ok"))
    with pytest.raises(RequestRejected) as err:
        registry.get("delete_everything")
    assert (status_of(err.value.code), err.value.code) == (422, "ACTION_NOT_REGISTERED")


async def test_an_unsealed_registry_executes_nothing() -> None:
    handler = ScriptedHandler("ok")
    registry = Registry()
    registry.register("create_payout", handler)
    report = await registry.execute("create_payout", make_ctx(ManualClock()), on_claimed=_noop)
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("REGISTRY_NOT_SEALED",)
    assert not handler.ran


# -- classification --------------------------------------------------------------------------


async def test_completed_after_dispatch_passes_the_idempotency_key() -> None:
    handler = ScriptedHandler("ok")
    report = await sealed(handler).execute(
        "create_payout", make_ctx(ManualClock()), on_claimed=_noop
    )
    assert report.outcome is Outcome.COMPLETED
    assert report.executed is True
    assert report.dispatched is True
    assert report.result == {"status": 202, "accepted": True}
    assert report.reason_codes == ()
    assert handler.sent_keys == ["payout-1-v1"]


@pytest.mark.parametrize(
    ("script", "outcome", "executed", "dispatched", "code"),
    [
        ("raise_before", Outcome.FAILED_BEFORE_DISPATCH, False, False, "HANDLER_FAILED"),
        ("agentsafe_before", Outcome.FAILED_BEFORE_DISPATCH, False, False, "CREDENTIAL_INVALID"),
        ("not_sent", Outcome.FAILED_BEFORE_DISPATCH, False, False, "TRANSPORT_CONNECT_FAILED"),
        ("raise_inside", Outcome.UNKNOWN_AFTER_DISPATCH, None, True, "HANDLER_FAILED"),
        ("maybe_sent", Outcome.UNKNOWN_AFTER_DISPATCH, None, True, "EGRESS_TIMEOUT"),
        ("raise_after", Outcome.UNKNOWN_AFTER_DISPATCH, None, True, "PROVIDER_ERROR"),
        ("twice", Outcome.UNKNOWN_AFTER_DISPATCH, None, True, "DISPATCH_TWICE"),
        ("bad_result", Outcome.UNKNOWN_AFTER_DISPATCH, None, True, "HANDLER_CONTRACT_VIOLATED"),
        ("no_dispatch", Outcome.FAILED_BEFORE_DISPATCH, False, False, "HANDLER_CONTRACT_VIOLATED"),
        ("refused", Outcome.DEFINITELY_NOT_EXECUTED, False, True, "INSUFFICIENT_FUNDS"),
    ],
)
async def test_how_a_handler_ends_decides_the_outcome(
    script: str, outcome: Outcome, executed: bool | None, dispatched: bool, code: str
) -> None:
    report = await sealed(ScriptedHandler(script)).execute(
        "create_payout", make_ctx(ManualClock()), on_claimed=_noop
    )
    assert report.outcome is outcome
    assert report.executed is executed
    assert report.dispatched is dispatched
    assert code in report.reason_codes
    assert report.result is None


async def test_provider_refusal_is_reported_on_the_security_stream() -> None:
    security = MemorySink()
    await sealed(ScriptedHandler("refused"), security=security).execute(
        "create_payout", make_ctx(ManualClock()), on_claimed=_noop
    )
    assert security.named("PROVIDER_REFUSED") == [
        {"action": "create_payout", "reason_code": "INSUFFICIENT_FUNDS", "status": 422}
    ]


async def test_the_claim_is_journaled_before_the_handler_body() -> None:
    handler = ScriptedHandler("ok")
    order: list[str] = []
    handler.order = order

    async def on_claimed(ctx: ExecutionContext) -> None:
        assert ctx.authorization.grant_id == "grant-1"
        order.append("claimed")

    report = await sealed(handler).execute(
        "create_payout", make_ctx(ManualClock()), on_claimed=on_claimed
    )
    assert report.outcome is Outcome.COMPLETED
    assert order == ["claimed", "handler"]


async def test_a_journal_that_refuses_the_claim_stops_the_handler() -> None:
    handler = ScriptedHandler("ok")

    async def on_claimed(_: ExecutionContext) -> None:
        raise JournalError("disk full")

    report = await sealed(handler).execute(
        "create_payout", make_ctx(ManualClock()), on_claimed=on_claimed
    )
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.executed is False
    assert report.reason_codes == ("JOURNAL_UNAVAILABLE",)
    assert not handler.ran
    assert handler.sent_keys == []


async def test_invalid_parameters_never_reach_the_journal_or_the_handler() -> None:
    clock = ManualClock()
    bad = {"amountMinor": 5000, "currency": "USD", "beneficiary": "attacker"}
    intent = make_intent(now=clock.now(), parameters=bad)
    auth = Authorization("dec-1", "dos-1", "grant-1", expires_at=clock.now() + 30)
    ctx = ExecutionContext.create(intent=intent, authorization=auth, clock=clock)
    claimed: list[str] = []

    async def on_claimed(_: ExecutionContext) -> None:
        claimed.append("x")

    handler = ScriptedHandler("ok")
    report = await sealed(handler).execute("create_payout", ctx, on_claimed=on_claimed)
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("PARAMETERS_INVALID",)
    assert claimed == []
    assert not handler.ran


async def test_parameters_that_differ_from_the_bound_intent_are_refused() -> None:
    clock = ManualClock()
    ctx = make_ctx(clock)
    swapped = ExecutionContext(
        intent=ctx.intent,
        parameters={"amountMinor": 4999, "currency": "USD"},
        authorization=ctx.authorization,
        deadline_monotonic=ctx.deadline_monotonic,
        clock=clock,
    )
    handler = ScriptedHandler("ok")
    report = await sealed(handler).execute("create_payout", swapped, on_claimed=_noop)
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("GRANT_BINDING_MISMATCH",)
    assert not handler.ran


async def test_dispatch_refuses_once_the_grant_has_expired() -> None:
    clock = ManualClock()
    ctx = make_ctx(clock, grant_seconds=5)
    handler = ScriptedHandler("ok")

    async def slow_claim(_: ExecutionContext) -> None:
        clock.advance(5.001)  # the journal's fsync took the rest of the grant

    report = await sealed(handler).execute("create_payout", ctx, on_claimed=slow_claim)
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("GRANT_EXPIRED",)
    assert handler.ran
    assert handler.sent_keys == []


async def test_start_marks_the_point_of_no_return_once_and_hands_back_the_key() -> None:
    """``start`` is what ``run`` does before it calls ``fn``: refused (nothing marked) once the
    deadline passed, marked and the key handed back otherwise, refused a second time, by either
    way in."""
    clock = ManualClock()
    expired = Dispatch(make_ctx(clock, grant_seconds=-1))
    with pytest.raises(AgentSafeError) as info:
        expired.start()
    assert (info.value.code, expired.started) == ("GRANT_EXPIRED", False)

    ctx = make_ctx(clock)
    dispatch = Dispatch(ctx)
    assert dispatch.started is False
    assert dispatch.start() == ctx.idempotency_key
    assert dispatch.started is True
    with pytest.raises(AgentSafeError) as info:
        dispatch.start()
    assert info.value.code == "DISPATCH_TWICE"

    async def send(key: str) -> str:
        return key

    with pytest.raises(AgentSafeError) as info:
        await dispatch.run(send)
    assert info.value.code == "DISPATCH_TWICE"
    started = Dispatch(ctx)
    assert await started.run(send) == ctx.idempotency_key
    with pytest.raises(AgentSafeError) as info:
        started.start()
    assert info.value.code == "DISPATCH_TWICE"


async def test_unknown_action_at_execute_fails_before_dispatch() -> None:
    report = await sealed(ScriptedHandler("ok")).execute(
        "other", make_ctx(ManualClock()), on_claimed=_noop
    )
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("ACTION_NOT_REGISTERED",)


# -- the two steps: prepare, then run (the attempt journals GRANT_CLAIMED between them) --------


async def test_prepare_refuses_without_running_and_run_classifies() -> None:
    handler = ScriptedHandler("ok")
    registry = sealed(handler)
    refused = registry.prepare("other", make_ctx(ManualClock()))
    assert isinstance(refused, ExecutionReport)
    assert (refused.outcome, refused.reason_codes) == (
        Outcome.FAILED_BEFORE_DISPATCH,
        ("ACTION_NOT_REGISTERED",),
    )
    prepared = registry.prepare("create_payout", make_ctx(ManualClock()))
    assert isinstance(prepared, Prepared)
    assert not handler.ran  # preparing runs nothing
    assert not prepared.dispatch.started
    report = await registry.run(prepared)
    assert (report.outcome, report.executed, report.dispatched) == (Outcome.COMPLETED, True, True)
    assert handler.ran


async def test_the_handler_runs_in_its_own_task_with_the_callers_context() -> None:
    """The handler is a task of its own (its resumptions start at it, issue 32) that copies the
    caller's context: a context variable the caller set is read there, and ``seam.fetch`` still
    knows the execution's dispatch (``test_registration.py`` shows the refusal it makes)."""
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    seen: dict[str, Any] = {}

    class Looking(ScriptedHandler):
        async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
            seen["task"] = asyncio.current_task()
            seen["marker"] = marker.get()
            seen["executing"] = seam_module._EXECUTING.get()
            return await super().execute(ctx, dispatch)

    registry = sealed(Looking("ok"))
    prepared = registry.prepare("create_payout", make_ctx(ManualClock()))
    assert isinstance(prepared, Prepared)
    marker.set("the caller's")
    report = await registry.run(prepared)
    assert report.outcome is Outcome.COMPLETED
    assert seen["task"] is not asyncio.current_task()
    assert seen["marker"] == "the caller's"
    assert seen["executing"] is prepared.dispatch
    assert seam_module._EXECUTING.get() is None  # reset in the caller once the handler ended


async def test_a_cancelled_caller_cancels_the_handler_in_flight() -> None:
    """The seam does not shield a handler: cancelling whoever awaits ``run`` reaches the
    handler's own task, and no report is produced."""
    started, stopped = asyncio.Event(), asyncio.Event()

    class Hanging(ScriptedHandler):
        async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
            async def send(key: str) -> str:
                started.set()
                try:
                    await asyncio.Event().wait()
                finally:
                    stopped.set()
                return key

            await dispatch.run(send)
            return {"ok": True}

    registry = sealed(Hanging("ok"))
    prepared = registry.prepare("create_payout", make_ctx(ManualClock()))
    assert isinstance(prepared, Prepared)
    caller = asyncio.create_task(registry.run(prepared))
    await asyncio.wait_for(started.wait(), timeout=10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert stopped.is_set()  # the handler's task was cancelled, not left running
    assert prepared.dispatch.started


def test_provider_refused_is_an_agentsafe_error_with_the_reason() -> None:
    refused = ProviderRefused("INSUFFICIENT_FUNDS", status=422)
    assert isinstance(refused, AgentSafeError)
    assert refused.code == "PROVIDER_REFUSED"
    assert refused.reason == "INSUFFICIENT_FUNDS"


# -- the read path ---------------------------------------------------------------------------


async def test_reconcile_reads_and_never_executes() -> None:
    handler = ScriptedHandler("ok")
    registry = sealed(handler)
    result = await registry.reconcile("create_payout", "payout-1-v1", intent_hash=IH)
    assert result == ReconcileResult(ReconcileStatus.COMPLETED, provider_reference="payout-1-v1")
    assert not handler.ran


async def test_reconcile_failures_are_unknown() -> None:
    registry = sealed(ScriptedHandler("reconcile_raises"))
    result = await registry.reconcile("create_payout", "k", intent_hash=IH)
    assert result.status is ReconcileStatus.UNKNOWN
    assert result.reason_code == "RECONCILE_FAILED"
    missing = await registry.reconcile("nope", "k", intent_hash=IH)
    assert missing == ReconcileResult(ReconcileStatus.UNKNOWN, reason_code="ACTION_NOT_REGISTERED")


# -- what a provider chose is bounded and screened (issue 16, item 12) ----------------------


class ReflectingHandler:
    """A handler whose provider hands a chosen string back in every place it can."""

    parameters_schema = SCHEMA

    def __init__(self, reason: str | None, reference: str) -> None:
        self.reason = reason
        self.reference = reference

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        async def send(key: str) -> str:
            return "sent"

        await dispatch.run(send)
        if self.reason is not None:
            raise ProviderRefused(self.reason, status=422)
        return {"status": 202, "accepted": True, "nested": {"ref": [self.reference]}}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        return ReconcileResult(
            ReconcileStatus.UNKNOWN,
            reason_code=self.reason,
            provider_reference=self.reference,
        )


SECRET = "dwn-7Hq2LmP9xV4nR8sT1kWz"


def screening(handler: ReflectingHandler, security: MemorySink) -> Registry:
    from agentsafe.executor.evidence.redact import Redactor

    redactor = Redactor()
    redactor.set_secret("DOWNSTREAM_CREDENTIAL", ("Bearer " + SECRET).encode())
    registry = Registry(security=security, screen=lambda t: redactor.redact(t, jws=False)[0])
    registry.register("create_payout", handler)
    registry.seal()
    return registry


@pytest.mark.parametrize(
    "reason",
    [
        "BEARER_DWN_7HQ2LMP9XV4NR8ST1KWZ",  # the credential, as the forward handler reduced it
        "DWN_7HQ2LMP9XV4NR8ST1KWZ",
        "Bearer " + SECRET,  # not UPPER_SNAKE at all
        "A" * 65,  # too long
        "INSUFFICIENT\nFUNDS",
        "ÄRGER",
    ],
)
async def test_a_provider_reason_that_is_a_secret_or_no_code_is_withheld(reason: str) -> None:
    security = MemorySink()
    registry = screening(ReflectingHandler(reason, "ref-1"), security)
    report = await registry.execute("create_payout", make_ctx(ManualClock()), on_claimed=_noop)
    assert report.outcome is Outcome.DEFINITELY_NOT_EXECUTED
    assert report.reason_codes == ("PROVIDER_REASON_WITHHELD",)
    assert [e["reason_code"] for e in security.named("PROVIDER_REFUSED")] == [
        "PROVIDER_REASON_WITHHELD"
    ]
    answer = await registry.reconcile("create_payout", "k", intent_hash=IH)
    assert answer.reason_code == "PROVIDER_REASON_WITHHELD"
    assert SECRET.casefold() not in str(security.events).casefold()


async def test_an_ordinary_provider_code_passes() -> None:
    security = MemorySink()
    registry = screening(ReflectingHandler("INSUFFICIENT_FUNDS", "ref-1"), security)
    report = await registry.execute("create_payout", make_ctx(ManualClock()), on_claimed=_noop)
    assert report.reason_codes == ("INSUFFICIENT_FUNDS",)
    assert security.named("PROVIDER_STRING_WITHHELD") == []


async def test_a_secret_in_a_result_or_a_lookup_reference_is_replaced() -> None:
    import base64

    encoded = base64.urlsafe_b64encode(("Bearer " + SECRET).encode()).decode().rstrip("=")
    security = MemorySink()
    registry = screening(ReflectingHandler(None, encoded), security)
    report = await registry.execute("create_payout", make_ctx(ManualClock()), on_claimed=_noop)
    assert report.outcome is Outcome.COMPLETED
    assert report.result == {
        "status": 202,
        "accepted": True,
        "nested": {"ref": ["[REDACTED:SECRET]"]},
    }
    answer = await registry.reconcile("create_payout", "k", intent_hash=IH)
    assert answer.provider_reference is None
    assert [e["field"] for e in security.named("PROVIDER_STRING_WITHHELD")] == [
        "nested.ref[]",
        "provider_reference",
    ]
