"""The explicit effect boundary: run one approved step through its host executor.

:func:`execute_agent_plan_step` reads every input and host callback once, before its first
await (later caller mutation cannot swap the executor, use store, verifier, signer, audit sink,
clock or operation), then:

1. refuses an executor not bound to exactly the step's tool and effect -- before anything is
   consumed;
2. verifies the approval, context and exact operation (``approval.py``);
3. consumes the approval-digest/step key in the use store and has the same store verify the
   record (a second attempt anywhere gets ``APPROVAL_ALREADY_USED``);
4. appends a durable *started* audit event; if that fails nothing runs and the approval stays
   consumed (``AUDIT_START_FAILED``; retry needs a new approval);
5. runs the executor with the frozen operation and the narrowed limits; its result must be a
   bounded plain JSON value within the approved rows and bytes;
6. signs a receipt (success, or failure with a stable code) and appends a *completed* audit
   event -- also after a cancellation, which returns no receipt. A failed terminal append raises
   :class:`AgentExecutionError` carrying the signed receipt.

Audit events carry only pseudonymous digests and finite values (effect, data mode, outcome,
stable codes, times), never identities, parameters, results, citations, scopes, signatures,
nonces, tokens or error text.

Callers: the public API, ``service.py``, the MCP adapter's users.
Also imported by ``assembly.py``, ``dispatch/registration.py``, ``handlers.py``, ``__init__.py``,
``mcp_adapter.py``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..canonical import canonical_json, sha256_digest, sha256_hex
from ..clock import format_ms
from ..codes import Code
from ..state.records import ConsumptionRecord
from .approval import Authorized, check_authorization, check_operation, skew_ms
from .cancel import capture_abort, check_abort, guarded
from .errors import AgentExecutionError, AgentSafetyAborted, AgentSafetyError
from .policy import load_plan_policy
from .receipts import (
    USE_NAMESPACE,
    consumption_json,
    receipt_payload,
    recheck_at,
    sign_receipt,
    use_binding,
    use_key,
    verify_use,
)
from .shapes import identifier, now_text
from .signing import capture_signer, capture_verifier, envelope_digest
from .snapshot import FrozenDict, envelope_budget, freeze, result_budget

__all__ = [
    "AuditSink",
    "StepExecution",
    "StepExecutor",
    "StepRequest",
    "StepResult",
    "execute_agent_plan_step",
]

_CODE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
STARTED = "agent_plan_step.started"
COMPLETED = "agent_plan_step.completed"


@dataclass(frozen=True)
class StepRequest:
    """What an executor receives: the frozen approved operation and the narrowed limits."""

    execution_id: str
    step_id: str
    tool: str
    effect: str
    source_id: str
    fields: tuple[str, ...]
    query_plan_fingerprint: str
    parameters: Any  # a frozen JSON snapshot
    max_rows: int
    max_bytes: int


@dataclass(frozen=True)
class StepResult:
    """An executor's answer: a plain JSON value and how many rows it holds."""

    value: Any
    rows: int


class StepExecutor(Protocol):
    """A host executor bound to exactly one tool and one effect."""

    @property
    def tool(self) -> str: ...

    @property
    def effect(self) -> str: ...

    async def execute(self, request: StepRequest) -> StepResult: ...


class AuditSink(Protocol):
    """Durably appends one audit event; returns only once it is persisted."""

    async def append(self, event: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class StepExecution:
    """A successful step: the owned frozen value, its counts, and the signed receipt."""

    value: Any
    rows: int
    bytes: int
    result_digest: str
    receipt: FrozenDict
    receipt_digest: str


def _pseudonym(kind: str, value: object) -> str | None:
    return None if value is None else sha256_digest({"kind": kind, "value": value})


def _audit_base(auth: Authorized, execution_id: str, use_digest: str) -> dict[str, Any]:
    plan = auth.dry_run["plan"]
    binding = auth.binding
    return {
        "executionIdDigest": _pseudonym("execution", execution_id),
        "planIdDigest": _pseudonym("plan", plan["id"]),
        "actorDigest": _pseudonym("actor", plan["actor"]),
        "providerDigest": _pseudonym("provider", plan.get("provider")),
        "modelDigest": _pseudonym("model", plan.get("model")),
        "stepIdDigest": _pseudonym("step", auth.entry["stepId"]),
        "toolDigest": _pseudonym("tool", auth.entry["tool"]),
        "sourceIdDigest": _pseudonym("source", binding["id"]),
        "schemaVersionDigest": _pseudonym("schemaVersion", binding["schemaVersion"]),
        "sourceVersionDigest": _pseudonym("sourceVersion", binding["sourceVersion"]),
        "effect": auth.entry["effect"],
        "dataMode": binding["dataMode"],
        "observedAt": binding["observedAt"],
        "planDigest": auth.payload["planDigest"],
        "policyDigest": auth.payload["policyDigest"],
        "bindingDigest": auth.binding_digest,
        "approvalDigest": auth.approval_digest,
        "inputDigest": auth.entry["operationDigest"],
        "useDigest": use_digest,
    }


def _capture_executor(executor: object) -> tuple[str, str, Callable[[StepRequest], Awaitable[Any]]]:
    try:
        tool = executor.tool  # type: ignore[attr-defined]
        effect = executor.effect  # type: ignore[attr-defined]
        execute = executor.execute  # type: ignore[attr-defined]
    except Exception:
        raise AgentSafetyError(
            "the executor is not a step executor", code=Code.EXECUTOR_INVALID
        ) from None
    if type(tool) is not str or type(effect) is not str or not callable(execute):
        raise AgentSafetyError(
            "the executor must name one tool and one effect", code=Code.EXECUTOR_INVALID
        )
    return tool, effect, execute


def _method(holder: object, name: str, code: Code) -> Callable[..., Any]:
    method: Callable[..., Any] | None = getattr(holder, name, None)
    if method is None or not callable(method):
        raise AgentSafetyError(f"the host object lacks {name}", code=code)
    return method


def _read_result(result: object, auth: Authorized) -> tuple[Any, int, int, str]:
    if type(result) is not StepResult:
        raise AgentSafetyError("the executor did not return a StepResult", code=Code.RESULT_INVALID)
    rows = result.rows
    if type(rows) is not int or rows < 0:
        raise AgentSafetyError("the executor did not count its rows", code=Code.RESULT_UNCOUNTED)
    if rows > auth.allocation["maxRows"]:
        raise AgentSafetyError(
            "the result has more rows than approved", code=Code.RESULT_ROWS_EXCEEDED
        )
    try:
        value = freeze(result.value, result_budget(auth.allocation["maxBytes"]))
    except AgentSafetyError as exc:
        code = (
            Code.RESULT_BYTES_EXCEEDED if exc.code == Code.JSON_TOO_LARGE else Code.RESULT_INVALID
        )
        raise AgentSafetyError("the result is not a bounded plain JSON value", code=code) from None
    encoded = canonical_json(value)
    if len(encoded) > auth.allocation["maxBytes"]:
        raise AgentSafetyError(
            "the result is larger than approved", code=Code.RESULT_BYTES_EXCEEDED
        )
    return value, rows, len(encoded), "sha256:" + sha256_hex(encoded)


async def execute_agent_plan_step(
    *,
    dry_run: object,
    policy: object,
    approval: object,
    approval_verifier: object,
    context: object,
    step_id: object,
    operation: object,
    use_consumer: object,
    executor: object,
    audit_sink: object,
    receipt_signer: object,
    execution_id: object,
    clock: object,
    max_clock_skew_ms: object = 5_000,
    cancel: object = None,
) -> StepExecution:
    """Run one approved step exactly once; see the module docstring for the sequence."""
    # -- capture everything, synchronously, before the first await ----------------------------
    abort = capture_abort(cancel)
    check_abort(abort)
    budget = envelope_budget()
    loaded = load_plan_policy(policy, budget)
    dry_snap = freeze(dry_run, budget)
    approval_snap = freeze(approval, budget)
    context_snap = freeze(context, budget)
    operation_snap = freeze(operation, budget)
    exec_id = identifier(execution_id, "execution_id", code=Code.EXECUTION_ID_INVALID)
    skew = skew_ms(max_clock_skew_ms)
    verifier = capture_verifier(approval_verifier, "approval verifier")
    signer = capture_signer(receipt_signer, "receipt signer")
    consume = _method(use_consumer, "consume", Code.USE_STORE_INVALID)
    verify_consumption = _method(use_consumer, "verify_consumption", Code.USE_STORE_INVALID)
    append = _method(audit_sink, "append", Code.AUDIT_SINK_INVALID)
    clock_now = _method(clock, "now", Code.CLOCK_INVALID)
    tool, effect, execute = _capture_executor(executor)

    def now() -> float:
        value = clock_now()
        if type(value) not in (int, float):
            raise AgentSafetyError("the clock returned no time", code=Code.CLOCK_INVALID)
        return now_text(value)[0]

    # -- refuse a mismatched executor before anything is consumed -----------------------------
    if type(step_id) is not str:
        raise AgentSafetyError("the step id must be a string", code=Code.STEP_UNKNOWN)
    started_at = now()
    auth = await check_authorization(
        loaded=loaded,
        dry_run=dry_snap,
        approval=approval_snap,
        verifier=verifier,
        step_id=step_id,
        context=context_snap,
        at=started_at,
        skew=skew,
        abort=abort,
    )
    if tool != auth.entry["tool"] or effect != auth.entry["effect"]:
        raise AgentSafetyError(
            "the executor is bound to another tool or effect", code=Code.EXECUTOR_MISMATCH
        )
    op = check_operation(operation_snap, auth)

    # -- consume once, verify the record with the same store -----------------------------------
    try:
        record = await guarded(
            lambda: consume(
                USE_NAMESPACE,
                use_key(auth.approval_digest, step_id),
                binding=use_binding(auth),
                now=started_at,
            ),
            abort,
        )
    except (AgentSafetyError, asyncio.CancelledError):
        raise
    except Exception:
        raise AgentSafetyError("the use store failed", code=Code.USE_STORE_FAILED) from None
    if record is None:
        raise AgentSafetyError(
            "this approval already ran this step", code=Code.APPROVAL_ALREADY_USED
        )
    if type(record) is not ConsumptionRecord:
        raise AgentSafetyError("the use store returned no record", code=Code.USE_STORE_FAILED)
    consumption, _ = await verify_use(
        freeze(consumption_json(record), budget), auth, verify_consumption, abort
    )
    use_digest = sha256_digest(consumption)
    base = _audit_base(auth, exec_id, use_digest)

    # -- durable start --------------------------------------------------------------------------
    started_event = freeze({"event": STARTED, **base, "at": format_ms(started_at)}, budget)
    try:
        await guarded(lambda: append(started_event), abort)
    except (asyncio.CancelledError, AgentSafetyAborted):
        raise
    except Exception:
        raise AgentSafetyError(
            "the started audit event was not persisted; the approval is spent",
            code=Code.AUDIT_START_FAILED,
        ) from None

    async def complete(
        outcome: str, *, code: str | None, result_digest: str | None, receipt_digest: str | None
    ) -> None:
        event = freeze(
            {
                "event": COMPLETED,
                **base,
                "outcome": outcome,
                "errorCode": code,
                "resultDigest": result_digest,
                "receiptDigest": receipt_digest,
                "at": format_ms(now()),
            },
            budget,
        )
        await append(event)

    # -- run ------------------------------------------------------------------------------------
    request = StepRequest(
        execution_id=exec_id,
        step_id=step_id,
        tool=tool,
        effect=effect,
        source_id=op["sourceId"],
        fields=op["fields"],
        query_plan_fingerprint=op["queryPlanFingerprint"],
        parameters=op["parameters"],
        max_rows=auth.allocation["maxRows"],
        max_bytes=auth.allocation["maxBytes"],
    )
    failure: str | None = None
    try:
        raw = await guarded(lambda: execute(request), abort)
    except (asyncio.CancelledError, AgentSafetyAborted):
        await _complete_cancelled(complete)
        raise
    except AgentSafetyError as exc:  # a host executor's own stable refusal
        failure = exc.code if _CODE.match(exc.code) else Code.EXECUTOR_FAILED
        raw = None
    except Exception:
        failure = Code.EXECUTOR_FAILED
        raw = None
    value: Any = None
    evidence: dict[str, Any]
    if failure is None:
        try:
            value, rows, size, result_digest = _read_result(raw, auth)
        except AgentSafetyError as exc:
            failure = exc.code
    if failure is None:
        evidence = {
            "outcome": "succeeded",
            "rows": rows,
            "bytes": size,
            "resultDigest": result_digest,
            "errorCode": None,
        }
    else:
        evidence = {
            "outcome": "failed",
            "rows": None,
            "bytes": None,
            "resultDigest": None,
            "errorCode": failure,
        }

    # -- receipt and terminal audit ---------------------------------------------------------------
    completed_at = now()
    try:
        recheck_at(auth, completed_at, skew)
        payload = receipt_payload(
            auth=auth,
            execution_id=exec_id,
            consumption=consumption,
            evidence=evidence,
            completed_at=format_ms(completed_at),
        )
        receipt = await sign_receipt(payload, signer, budget, abort)
    except (asyncio.CancelledError, AgentSafetyAborted):
        await _complete_cancelled(complete)
        raise
    except AgentSafetyError as exc:
        await _complete_quietly(complete, "failed", exc.code)
        raise AgentSafetyError(
            "the step ran but no receipt could be signed", code=Code.RECEIPT_REFUSED
        ) from None
    receipt_digest = envelope_digest(receipt)
    try:
        await guarded(
            lambda: complete(
                evidence["outcome"],
                code=failure,
                result_digest=evidence["resultDigest"],
                receipt_digest=receipt_digest,
            ),
            abort,
        )
    except (asyncio.CancelledError, AgentSafetyAborted):
        await _complete_cancelled(complete)
        raise
    except Exception:
        raise AgentExecutionError(
            "the completed audit event was not persisted",
            code=Code.AUDIT_COMPLETE_FAILED,
            receipt=receipt,
        ) from None
    if failure is not None:
        raise AgentExecutionError("the step failed", code=failure, receipt=receipt)
    check_abort(abort)
    return StepExecution(
        value=value,
        rows=evidence["rows"],
        bytes=evidence["bytes"],
        result_digest=evidence["resultDigest"],
        receipt=receipt,
        receipt_digest=receipt_digest,
    )


async def _complete_cancelled(complete: Callable[..., Awaitable[None]]) -> None:
    await _complete_quietly(complete, "cancelled", Code.OPERATION_CANCELLED)


async def _complete_quietly(
    complete: Callable[..., Awaitable[None]], outcome: str, code: str
) -> None:
    """Best-effort terminal event on a path that is already raising."""
    try:
        await complete(outcome, code=code, result_digest=None, receipt_digest=None)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: S110 - the original error is the one the caller needs
        pass
