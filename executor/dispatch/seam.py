"""The handler seam: what may run, and how its outcome is classified.

A handler is registered under an action name with a strict parameter schema, performs its side
effect inside :meth:`Dispatch.run` (the point of no return; or at once after
:meth:`Dispatch.start`, which marks it the same way) and answers a read-only
:meth:`Handler.reconcile`. The :class:`Registry` is sealed once registration is over and wraps
every execution in the same steps, so an ordinary handler gets them without knowing:

1. :meth:`Registry.prepare`: the parameters are validated against the handler's schema and
   checked against the intent's execution payload digest (nothing runs on a mismatch), and the
   execution's :class:`Dispatch` is made;
2. the caller makes its claim durable (the attempt's GRANT_CLAIMED append, ``attempt.py``); if
   it cannot, the handler never runs and the attempt is FAILED_BEFORE_DISPATCH with
   JOURNAL_UNAVAILABLE (:meth:`Registry.execute` composes the steps with that append as a
   callback);
3. :meth:`Registry.run`: the handler runs, in its own task, and its end is classified:

   ======================================  ===========================  ==========
   what happened                            outcome                      executed
   ======================================  ===========================  ==========
   returned a mapping after dispatching     COMPLETED                    True
   raised before ``dispatch.run``           FAILED_BEFORE_DISPATCH       False
   ``TransportError`` with ``sent=False``   FAILED_BEFORE_DISPATCH       False
   raised ``ProviderRefused``               DEFINITELY_NOT_EXECUTED      False
   raised anything else after dispatching   UNKNOWN_AFTER_DISPATCH       None
   returned without ever dispatching        FAILED_BEFORE_DISPATCH       False
   ======================================  ===========================  ==========

   (The last row is a handler breaking its contract, reported HANDLER_CONTRACT_VIOLATED.)
   Those rows hold because nothing a handler sends before ``dispatch.run`` can leave: the seam's
   ``fetch`` (:class:`DispatchBoundFetch`) refuses such a send with ``SEND_BEFORE_DISPATCH``
   (``sent=False``) before a byte is written.

Deadlines are monotonic: the context carries ``deadline_monotonic`` (never later than the grant's
expiry), :meth:`ExecutionContext.remaining` is what a handler may give its provider, and
:meth:`Dispatch.run` refuses to start once it has passed (GRANT_EXPIRED). Correcting the wall
clock cannot extend a call. The seam does not shield a handler from cancellation: the pipeline
must not cancel an execution in flight; if it is cancelled anyway no report is produced and the
attempt stays open for reconciliation.

What a provider chose (a refusal's reason, a lookup's reason and reference, every string of a
result) is bounded and screened here, for every handler, before it reaches the agent or the
evidence: a reason must be an UPPER_SNAKE code of at most 64 characters (else
``PROVIDER_REASON_WITHHELD``), and the registry's ``screen`` (the process's redactor, which knows
the current secrets in their transformed forms too) replaces any secret a provider reflected; each
replacement is one ``PROVIDER_STRING_WITHHELD`` security event naming the action and the field.

A handler may also derive what it runs from the action itself (the effect plane's adapter bridge
does): :meth:`Registry.admit` asks it before the authority is asked, so a target that disagrees is
refused without a dossier, and hands the host ceilings the family's amount projection.

``ReconcileStatus``/``ReconcileResult`` live here (the handler contract returns them);
``reconcile.py`` imports them.

Callers: the attempt (prepare, run), startup and caller reconciliation (reconcile, the read path
only), ``dispatch/forward.py`` and every other handler.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import jsonschema

from ..canonical import canonical_json
from ..clock import Clock, format_ms
from ..codes import Code
from ..egress.transport import HttpResponse, Transport, TransportError
from ..errors import AgentSafeError, CanonicalizationError, HandlerError, RequestRejected
from ..events import EventSink
from ..intent import CapturedIntent, execution_payload_digest
from ..schema import (
    EcmaValidator,
    ParameterValidator,
    build_fast_validator,
    check_schema,
    is_strict,
)

__all__ = [
    "Authorization",
    "Dispatch",
    "DispatchBoundFetch",
    "DispatchRefused",
    "ExecutionContext",
    "ExecutionReport",
    "Handler",
    "Outcome",
    "Prepared",
    "ProviderRefused",
    "ReconcileResult",
    "ReconcileStatus",
    "Registry",
    "check_parameters_schema",
]

T = TypeVar("T")

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,127}$")
PROVIDER_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""What a provider's reason code may be (``fullmatch``): UPPER_SNAKE, at most 64 characters."""

Screen = Callable[[str], str]
"""Returns the text with every recognised secret replaced (the text itself when clean)."""


class Outcome(StrEnum):
    COMPLETED = "COMPLETED"
    BLOCKED = "BLOCKED"
    FAILED_BEFORE_DISPATCH = "FAILED_BEFORE_DISPATCH"
    UNKNOWN_AFTER_DISPATCH = "UNKNOWN_AFTER_DISPATCH"
    DEFINITELY_NOT_EXECUTED = "DEFINITELY_NOT_EXECUTED"
    ESCALATE_PENDING = "ESCALATE_PENDING"


class ReconcileStatus(StrEnum):
    COMPLETED = "COMPLETED"
    NOT_EXECUTED = "NOT_EXECUTED"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class ReconcileResult:
    """What a provider said about an idempotency key (never a provider body)."""

    status: ReconcileStatus
    reason_code: str | None = None
    provider_reference: str | None = None


@dataclass(frozen=True)
class Authorization:
    """The consumed binding kept as evidence; the grant token itself never appears here."""

    decision_id: str
    dossier_id: str
    grant_id: str
    expires_at: float

    def as_wire(self) -> dict[str, str]:
        return {
            "decision_id": self.decision_id,
            "dossier_id": self.dossier_id,
            "grant_id": self.grant_id,
            "expires_at": format_ms(self.expires_at),
        }


@dataclass(frozen=True)
class ExecutionContext:
    """Everything a handler is given for one execution."""

    intent: CapturedIntent
    parameters: Mapping[str, Any]
    authorization: Authorization
    deadline_monotonic: float
    clock: Clock
    attestation: str | None = None  # the authority's claim attestation, for signed dispatches

    @classmethod
    def create(
        cls,
        *,
        intent: CapturedIntent,
        authorization: Authorization,
        clock: Clock,
        parameters: Mapping[str, Any] | None = None,
    ) -> ExecutionContext:
        """A context whose deadline is the grant's expiry, moved onto the monotonic clock now."""
        left = authorization.expires_at - clock.now()
        return cls(
            intent=intent,
            parameters=intent.parameters if parameters is None else parameters,
            authorization=authorization,
            deadline_monotonic=clock.monotonic() + left,
            clock=clock,
        )

    @property
    def idempotency_key(self) -> str:
        return self.intent.idempotency_key

    def remaining(self) -> float:
        """Seconds left before the deadline on the monotonic clock (never negative)."""
        return max(0.0, self.deadline_monotonic - self.clock.monotonic())


class DispatchRefused(AgentSafeError):
    """:meth:`Dispatch.run` would not start (the deadline passed, or it already ran)."""

    code = Code.DISPATCH_REFUSED


class ProviderRefused(AgentSafeError):
    """The provider was reached and refused deterministically: nothing was effected.

    ``reason`` is the provider's reason code (UPPER_SNAKE), reported among the reason codes;
    ``receipt`` the provider's signed effect receipt of the refusal, verbatim, when it sent one.
    """

    code = Code.PROVIDER_REFUSED

    def __init__(
        self, reason: str, *, status: int | None = None, receipt: str | None = None
    ) -> None:
        super().__init__("the provider refused the request", code=Code.PROVIDER_REFUSED)
        self.reason = reason
        self.status = status
        self.receipt = receipt


class Dispatch:
    """The point of no return for one execution; :meth:`run` (or :meth:`start`) may be called
    once."""

    def __init__(self, ctx: ExecutionContext) -> None:
        self._ctx = ctx
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    def run(self, fn: Callable[[str], Awaitable[T]]) -> Awaitable[T]:
        """Start ``fn(idempotency_key)`` and return its awaitable, for the handler to await at
        once (``await dispatch.run(fn)``); from here on a failure is an unknown outcome.

        A refusal (it already ran, or the deadline passed) is raised at the call, before ``fn``
        is called. ``run`` is not a coroutine itself, so no frame of the seam stands in the
        await chain of the send: a resumption inside it does not pass through the seam on its
        way back to the handler (issue 32)."""
        return fn(self.start())

    def start(self) -> str:
        """Mark the point of no return now and return the idempotency key to send with, for a
        handler that sends at once, in its own body (the reference forward handler does: the
        seam is then not called back into between its credential and the send, issue 32);
        :meth:`run` is this, then ``fn``. From here on a failure is an unknown outcome.

        Refused (:class:`DispatchRefused`) when it already ran or the deadline passed, before
        anything is marked."""
        if self._started:
            raise DispatchRefused("dispatch runs once per execution", code=Code.DISPATCH_TWICE)
        if self._ctx.remaining() <= 0:
            raise DispatchRefused("the grant expired before dispatch", code=Code.GRANT_EXPIRED)
        self._started = True
        return self._ctx.idempotency_key


_EXECUTING: ContextVar[Dispatch | None] = ContextVar("agentsafe_executing", default=None)
"""The dispatch of the execution running in this context (set by :meth:`Registry.run` around a
handler's task, which copies it; tasks the handler starts inherit it)."""


class DispatchBoundFetch:
    """``seam.fetch``: the guarded client, refusing a send a handler makes before its
    ``dispatch.run``.

    Inside :meth:`Registry.run`, a request through ``seam.fetch`` before ``dispatch.run``
    started raises ``TransportError(SEND_BEFORE_DISPATCH, sent=False)`` before any byte leaves:
    the seam would report such an attempt FAILED_BEFORE_DISPATCH, ``executed=false``, while the
    provider had the request (issue 30, item 16). From ``dispatch.run`` on (inside it, and a
    read-back after it) and outside any execution (``reconcile``, plan steps, registration) it
    is the guarded client itself."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        executing = _EXECUTING.get()
        if executing is not None and not executing.started:
            raise TransportError(
                Code.SEND_BEFORE_DISPATCH,
                sent=False,
                message="a send through seam.fetch before dispatch.run is refused",
            )
        return await self._inner.request(method, url, headers=headers, body=body, timeout=timeout)

    async def close(self) -> None:
        await self._inner.close()


class Handler(Protocol):
    @property
    def parameters_schema(self) -> Mapping[str, Any]: ...

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]: ...

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        """Read-only: what the provider did with ``idempotency_key``, asked on behalf of the
        intent ``intent_hash`` (a signed lookup covers both, as every signed request does)."""
        ...


@dataclass(frozen=True)
class ExecutionReport:
    outcome: Outcome
    executed: bool | None
    result: Mapping[str, Any] | None = None
    reason_codes: tuple[str, ...] = ()
    dispatched: bool = False
    effect_receipt: str | None = None
    """A refusing provider's signed effect receipt, verbatim (``ProviderRefused.receipt``): a
    refusal returns no result to carry it, and the finalization is handed it all the same."""


@dataclass(frozen=True)
class Prepared:
    """An execution the seam checked and may run once (:meth:`Registry.prepare`): the action,
    its handler, the context and the execution's point of no return."""

    name: str
    handler: Handler
    ctx: ExecutionContext
    dispatch: Dispatch


_EXECUTED: dict[Outcome, bool | None] = {
    Outcome.COMPLETED: True,
    Outcome.FAILED_BEFORE_DISPATCH: False,
    Outcome.DEFINITELY_NOT_EXECUTED: False,
    Outcome.UNKNOWN_AFTER_DISPATCH: None,
}


def _report(
    outcome: Outcome,
    *codes: str,
    dispatched: bool,
    result: Mapping[str, Any] | None = None,
    effect_receipt: str | None = None,
) -> ExecutionReport:
    return ExecutionReport(
        outcome=outcome,
        executed=_EXECUTED[outcome],
        result=result,
        reason_codes=tuple(dict.fromkeys(codes)),
        dispatched=dispatched,
        effect_receipt=effect_receipt,
    )


def check_parameters_schema(schema: Any) -> ParameterValidator:
    """Accept only a strict object schema (``type: object``, ``additionalProperties: false``),
    or ``type: object`` with ``anyOf`` strict schemas (one handler serving several actions)."""
    if not isinstance(schema, Mapping):
        raise HandlerError("a parameter schema must be a JSON object", code=Code.SCHEMA_NOT_STRICT)
    if not is_strict(schema):
        raise HandlerError(
            "a parameter schema must be type object with additionalProperties false",
            code=Code.SCHEMA_NOT_STRICT,
        )
    try:
        check_schema(schema)
    except (jsonschema.SchemaError, OverflowError, RecursionError):
        raise HandlerError(
            "the parameter schema is not valid JSON Schema", code=Code.SCHEMA_INVALID
        ) from None
    # The compiled validator beside the reference, both without asserting formats (issue 34:
    # the reference walks the schema in Python on every execution).
    return ParameterValidator(EcmaValidator(schema), build_fast_validator(schema, formats=False))


def _code_of(exc: BaseException, default: str) -> str:
    return exc.code if isinstance(exc, AgentSafeError) else default


class Registry:
    """The sealed set of handlers this process can run."""

    def __init__(self, *, security: EventSink | None = None, screen: Screen | None = None) -> None:
        self._handlers: dict[str, tuple[Handler, ParameterValidator]] = {}
        self._sealed = False
        self._security = security
        self._screen = screen

    @property
    def sealed(self) -> bool:
        return self._sealed

    def register(self, name: str, handler: Handler) -> None:
        if self._sealed:
            raise HandlerError("the registry is sealed", code=Code.REGISTRY_SEALED)
        if not isinstance(name, str) or not _NAME.match(name):
            raise HandlerError("an action name must be a short identifier", code=Code.NAME_INVALID)
        if name in self._handlers:
            raise HandlerError("an action is registered once", code=Code.ACTION_ALREADY_REGISTERED)
        validator = check_parameters_schema(handler.parameters_schema)
        self._handlers[name] = (handler, validator)

    def seal(self) -> None:
        self._sealed = True

    def names(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def get(self, name: str) -> Handler:
        """The handler for ``name``; an unknown name is 422 ACTION_NOT_REGISTERED."""
        entry = self._handlers.get(name)
        if entry is None:
            raise RequestRejected(
                Code.ACTION_NOT_REGISTERED, "this action is not registered in this process"
            )
        return entry[0]

    def admit(self, name: str, target: str, parameters: Mapping[str, Any]) -> Mapping[str, Any]:
        """Before the authority is asked: a handler that derives its target (an adapter bridge,
        ``effects/adapter.py``) refuses a proposal whose target or action disagrees with it.
        Returns what the host ceilings read: the family's projection, or the parameters."""
        handler = self.get(name)
        admit = getattr(handler, "admit", None)
        if admit is None:
            return parameters
        projection: Mapping[str, Any] | None = admit(target, parameters)
        return projection if projection is not None else {}

    def ceiling_view(self, name: str, parameters: Mapping[str, Any]) -> Mapping[str, Any]:
        """What the host ceilings read for an action already admitted (the same projection)."""
        handler = self.get(name)
        view = getattr(handler, "ceiling_view", None)
        if view is None:
            return parameters
        projection: Mapping[str, Any] | None = view(parameters)
        return projection if projection is not None else {}

    def prepare(self, name: str, ctx: ExecutionContext) -> Prepared | ExecutionReport:
        """Step 1 of an execution (see module docs): the checks, then the execution's
        :class:`Dispatch`. Returns what :meth:`run` runs, or the refusal (FAILED_BEFORE_DISPATCH;
        nothing ran). The caller makes its claim durable between the two steps (the attempt's
        GRANT_CLAIMED) and calls :meth:`run` only once it holds."""
        failed = Outcome.FAILED_BEFORE_DISPATCH
        if not self._sealed:
            return _report(failed, Code.REGISTRY_NOT_SEALED, dispatched=False)
        entry = self._handlers.get(name)
        if entry is None:
            return _report(failed, Code.ACTION_NOT_REGISTERED, dispatched=False)
        handler, validator = entry
        if not validator.is_valid(ctx.parameters):
            return _report(failed, Code.PARAMETERS_INVALID, dispatched=False)
        try:
            digest = execution_payload_digest(ctx.parameters)
        except CanonicalizationError:
            return _report(failed, Code.PARAMETERS_INVALID, dispatched=False)
        if digest != ctx.intent.payload_digest:
            return _report(failed, Code.GRANT_BINDING_MISMATCH, dispatched=False)
        # Made here (it holds the context and nothing else), so that once the claim is durable
        # the handler is the next thing called, not the seam again (issue 32).
        return Prepared(name=name, handler=handler, ctx=ctx, dispatch=Dispatch(ctx))

    async def run(self, prepared: Prepared) -> ExecutionReport:
        """Step 3 of an execution: the handler, once, awaited as its own task, and how it ended
        classified (see module docs).

        The task copies this context with the execution's dispatch in it (``seam.fetch`` reads
        it), so a resumption inside the handler starts at the handler, not at its callers (issue
        32). Awaiting the task passes a cancellation of the caller on to it, as awaiting the
        handler did: the seam does not shield it."""
        name, dispatch, failed = prepared.name, prepared.dispatch, Outcome.FAILED_BEFORE_DISPATCH
        executing = _EXECUTING.set(dispatch)
        try:
            result = await asyncio.ensure_future(prepared.handler.execute(prepared.ctx, dispatch))
        except ProviderRefused as refused:
            reason = self._provider_code(name, "reason_code", refused.reason)
            if not dispatch.started:
                return _report(failed, reason, dispatched=False)
            self._emit_refused(name, reason, refused.status)
            return _report(
                Outcome.DEFINITELY_NOT_EXECUTED,
                reason,
                dispatched=True,
                effect_receipt=self._receipt(name, refused.receipt),
            )
        except TransportError as exc:
            if not exc.sent:
                return _report(failed, exc.code, dispatched=False)
            return _report(Outcome.UNKNOWN_AFTER_DISPATCH, exc.code, dispatched=True)
        except Exception as exc:
            if not dispatch.started:
                return _report(failed, _code_of(exc, Code.HANDLER_FAILED), dispatched=False)
            return _report(
                Outcome.UNKNOWN_AFTER_DISPATCH,
                _code_of(exc, Code.HANDLER_FAILED),
                dispatched=True,
            )
        finally:
            _EXECUTING.reset(executing)
        if not dispatch.started:
            return _report(failed, Code.HANDLER_CONTRACT_VIOLATED, dispatched=False)
        if not _json_mapping(result):
            return _report(
                Outcome.UNKNOWN_AFTER_DISPATCH, Code.HANDLER_CONTRACT_VIOLATED, dispatched=True
            )
        return ExecutionReport(
            outcome=Outcome.COMPLETED,
            executed=True,
            result=self._screened(name, dict(result)),
            dispatched=True,
        )

    async def execute(
        self,
        name: str,
        ctx: ExecutionContext,
        *,
        on_claimed: Callable[[ExecutionContext], Awaitable[None]],
    ) -> ExecutionReport:
        """:meth:`prepare`, ``on_claimed(ctx)``, :meth:`run`: one execution with the caller's
        durable claim as a callback between the steps (the attempt makes the two calls itself).
        If ``on_claimed`` raises, the handler never runs: FAILED_BEFORE_DISPATCH with
        JOURNAL_UNAVAILABLE."""
        prepared = self.prepare(name, ctx)
        if isinstance(prepared, ExecutionReport):
            return prepared
        try:
            await on_claimed(ctx)
        except Exception:
            return _report(
                Outcome.FAILED_BEFORE_DISPATCH, Code.JOURNAL_UNAVAILABLE, dispatched=False
            )
        return await self.run(prepared)

    async def reconcile(
        self, action: str, idempotency_key: str, *, intent_hash: str
    ) -> ReconcileResult:
        """Ask the handler what the provider did with a key; the read path, never execute.

        A handler that raises could not ask (its credential could not sign the lookup, say): the
        answer is UNKNOWN with the error's code, and ``RECONCILE_LOOKUP_FAILED`` on the security
        stream says so, because that is this process failing, not the provider being unsure."""
        entry = self._handlers.get(action)
        if entry is None:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.ACTION_NOT_REGISTERED)
        try:
            answer: object = await entry[0].reconcile(idempotency_key, intent_hash=intent_hash)
        except Exception as exc:
            code = _code_of(exc, Code.RECONCILE_FAILED)
            if self._security is not None:
                self._security.emit("RECONCILE_LOOKUP_FAILED", {"action": action, "code": code})
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=code)
        if not isinstance(answer, ReconcileResult):
            return ReconcileResult(
                ReconcileStatus.UNKNOWN, reason_code=Code.HANDLER_CONTRACT_VIOLATED
            )
        reason = answer.reason_code
        if reason is not None:
            reason = self._provider_code(action, "reason_code", reason)
        reference = answer.provider_reference
        if reference is not None and self._withheld(action, "provider_reference", reference):
            reference = None
        return ReconcileResult(answer.status, reason_code=reason, provider_reference=reference)

    # -- what a provider chose ----------------------------------------------------------------

    def _withheld(self, action: str, field: str, value: str) -> bool:
        """Whether ``value`` carries a secret (reported once, naming the field, never the value)."""
        if self._screen is None or self._screen(value) == value:
            return False
        if self._security is not None:
            self._security.emit("PROVIDER_STRING_WITHHELD", {"action": action, "field": field})
        return True

    def _receipt(self, action: str, receipt: str | None) -> str | None:
        """A refusal's receipt, screened like every string of a result (dropped if withheld)."""
        if receipt is None or self._withheld(action, "effect_receipt", receipt):
            return None
        return receipt

    def _provider_code(self, action: str, field: str, reason: object) -> str:
        if not isinstance(reason, str) or not PROVIDER_CODE.fullmatch(reason):
            return Code.PROVIDER_REASON_WITHHELD
        if self._withheld(action, field, reason):
            return Code.PROVIDER_REASON_WITHHELD
        return reason

    def _screened(self, action: str, result: dict[str, Any]) -> dict[str, Any]:
        """The result with every string a secret reached replaced by the screen's text."""
        if self._screen is None:
            return result
        screen = self._screen

        def walk(value: Any, path: str) -> Any:
            if isinstance(value, str):
                cleaned = screen(value)
                if cleaned != value and self._security is not None:
                    self._security.emit(
                        "PROVIDER_STRING_WITHHELD", {"action": action, "field": path}
                    )
                return cleaned
            if isinstance(value, Mapping):
                return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v, f"{path}[]") for v in value]
            return value

        out: dict[str, Any] = walk(result, "")
        return out

    def _emit_refused(self, name: str, reason: str, status: int | None) -> None:
        if self._security is not None:
            fields: dict[str, Any] = {"action": name, "reason_code": reason}
            if status is not None:
                fields["status"] = status
            self._security.emit("PROVIDER_REFUSED", fields)


def _json_mapping(value: Any) -> bool:
    if not isinstance(value, Mapping):
        return False
    try:
        canonical_json(dict(value))
    except (CanonicalizationError, TypeError, ValueError):
        return False
    return True
