"""Signed execution receipts: issue after a step ran, verify later, deterministically.

A receipt's payload binds the execution id, the approval (id and digest), the plan, policy and
dry-run digests, the step and its operation-input digest, the digest of the source binding in
force, the authenticated consumption record (nonce, time, opaque token, binding digest) and its
digest, the outcome with its row/byte counts and result digest, and the completion time.

Issuing re-verifies the approval and context at the completion time, asks the use store to
verify the consumption record (public digests alone cannot create a receipt) and refuses
evidence beyond the approved row/byte ceilings. Verifying repeats every check against the
supplied historical context, evaluating the approval at the signed completion time, so an
authentic receipt stays verifiable after the approval expires; any modified field is refused.

Callers: the public API, ``execute.py``, ``service.py``.
Also imported by ``__init__.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..canonical import canonical_json, sha256_digest
from ..codes import Code
from ..state.records import ConsumptionRecord
from .approval import Authorized, authorize_step, check_operation, check_window, skew_ms
from .cancel import capture_abort, check_abort, guarded
from .dryrun import check_binding_fresh
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS as HARD
from .policy import load_plan_policy
from .shapes import digest, identifier, integer, now_text, obj, text, timestamp
from .signing import (
    RECEIPT_TYPE,
    CapturedSigner,
    capture_signer,
    capture_verifier,
    check_signature_bytes,
    encode_signature,
    envelope_digest,
    read_envelope,
    unsigned,
)
from .snapshot import Budget, FrozenDict, envelope_budget, freeze, freeze_object

__all__ = [
    "USE_NAMESPACE",
    "ConsumptionVerifier",
    "UseConsumer",
    "consumption_json",
    "issue_agent_execution_receipt",
    "use_binding",
    "use_key",
    "verify_agent_execution_receipt",
]

USE_NAMESPACE = "agentsafe.plan-step"
_OUTCOMES = frozenset({"succeeded", "failed"})


class ConsumptionVerifier(Protocol):
    async def verify_consumption(self, record: ConsumptionRecord) -> bool: ...


class UseConsumer(ConsumptionVerifier, Protocol):
    """The atomic single-use store (``SQLiteUseStore`` is one)."""

    async def consume(
        self, namespace: str, key: str, *, binding: dict[str, Any], now: float
    ) -> ConsumptionRecord | None: ...


def use_key(approval_digest: str, step_id: str) -> str:
    return f"{approval_digest}/{step_id}"


def use_binding(auth: Authorized) -> dict[str, Any]:
    return {
        "approvalDigest": auth.approval_digest,
        "stepId": auth.entry["stepId"],
        "operationDigest": auth.entry["operationDigest"],
    }


def consumption_json(record: ConsumptionRecord) -> dict[str, Any]:
    return {
        "namespace": record.namespace,
        "key": record.key,
        "nonce": record.nonce,
        "consumedAt": record.consumed_at,
        "bindingDigest": record.binding_digest,
        "token": record.token,
    }


_RECORD_KEYS = frozenset({"namespace", "key", "nonce", "consumedAt", "bindingDigest", "token"})


async def verify_use(
    record: Any,
    auth: Authorized,
    verify: Callable[[ConsumptionRecord], Awaitable[bool]],
    abort: asyncio.Event | None,
) -> tuple[FrozenDict, float]:
    """The consumption record must be for this approval and step, bound to this input, and
    verified by the store that issued it. Returns the record and its consumption time."""
    rec = obj(record, "consumption", code=Code.CONSUMPTION_INVALID, required=_RECORD_KEYS)
    for key in ("namespace", "key", "nonce", "token"):
        text(rec[key], f"consumption.{key}", code=Code.CONSUMPTION_INVALID, max_length=512)
    digest(rec["bindingDigest"], "consumption.bindingDigest", code=Code.CONSUMPTION_INVALID)
    consumed_at = rec["consumedAt"]
    if type(consumed_at) not in (int, float) or consumed_at < 0:
        raise AgentSafetyError(
            "consumption.consumedAt is not a time", code=Code.CONSUMPTION_INVALID
        )
    if (
        rec["namespace"] != USE_NAMESPACE
        or rec["key"] != use_key(auth.approval_digest, auth.entry["stepId"])
        or rec["bindingDigest"] != sha256_digest(use_binding(auth))
    ):
        raise AgentSafetyError(
            "the consumption record is for another use", code=Code.CONSUMPTION_MISMATCH
        )
    typed = ConsumptionRecord(
        rec["namespace"],
        rec["key"],
        rec["nonce"],
        float(consumed_at),
        rec["bindingDigest"],
        rec["token"],
    )
    try:
        valid = await guarded(lambda: verify(typed), abort)
    except (AgentSafetyError, asyncio.CancelledError):
        raise
    except Exception:
        raise AgentSafetyError(
            "the use store could not verify", code=Code.USE_STORE_FAILED
        ) from None
    if valid is not True:
        raise AgentSafetyError(
            "the consumption record is not authentic", code=Code.CONSUMPTION_UNVERIFIED
        )
    return rec, float(consumed_at)


_EVIDENCE_KEYS = frozenset({"outcome"})
_EVIDENCE_OPTIONAL = frozenset({"rows", "bytes", "resultDigest", "errorCode"})


def read_evidence(evidence: Any, auth: Authorized) -> dict[str, Any]:
    """Bounded outcome evidence within the approved ceilings."""
    ev = obj(
        evidence,
        "evidence",
        code=Code.EVIDENCE_INVALID,
        required=_EVIDENCE_KEYS,
        optional=_EVIDENCE_OPTIONAL,
    )
    outcome = ev["outcome"]
    if outcome not in _OUTCOMES:
        raise AgentSafetyError("evidence.outcome is not an outcome", code=Code.EVIDENCE_INVALID)
    if outcome == "succeeded":
        if set(ev) != {"outcome", "rows", "bytes", "resultDigest"}:
            raise AgentSafetyError(
                "success evidence needs rows, bytes and resultDigest", code=Code.EVIDENCE_INVALID
            )
        rows = integer(
            ev["rows"],
            "evidence.rows",
            code=Code.EVIDENCE_INVALID,
            minimum=0,
            maximum=HARD["maxRows"] * 16,
        )
        size = integer(
            ev["bytes"],
            "evidence.bytes",
            code=Code.EVIDENCE_INVALID,
            minimum=0,
            maximum=HARD["maxBytes"] * 16,
        )
        result = digest(ev["resultDigest"], "evidence.resultDigest", code=Code.EVIDENCE_INVALID)
        if rows > auth.allocation["maxRows"] or size > auth.allocation["maxBytes"]:
            raise AgentSafetyError(
                "the evidence exceeds the approved rows or bytes",
                code=Code.EVIDENCE_EXCEEDS_APPROVAL,
            )
        return {
            "outcome": outcome,
            "rows": rows,
            "bytes": size,
            "resultDigest": result,
            "errorCode": None,
        }
    if set(ev) != {"outcome", "errorCode"}:
        raise AgentSafetyError(
            "failure evidence carries an errorCode only", code=Code.EVIDENCE_INVALID
        )
    code = identifier(ev["errorCode"], "evidence.errorCode", code=Code.EVIDENCE_INVALID)
    return {
        "outcome": outcome,
        "rows": None,
        "bytes": None,
        "resultDigest": None,
        "errorCode": code,
    }


def receipt_payload(
    *,
    auth: Authorized,
    execution_id: str,
    consumption: FrozenDict,
    evidence: dict[str, Any],
    completed_at: str,
) -> dict[str, Any]:
    return {
        "executionId": execution_id,
        "approvalId": auth.payload["id"],
        "approvalDigest": auth.approval_digest,
        "planId": auth.payload["planId"],
        "planDigest": auth.payload["planDigest"],
        "policyDigest": auth.payload["policyDigest"],
        "dryRunDigest": auth.payload["dryRunDigest"],
        "stepId": auth.entry["stepId"],
        "operationDigest": auth.entry["operationDigest"],
        "bindingDigest": auth.binding_digest,
        "consumption": consumption,
        "useDigest": sha256_digest(consumption),
        **evidence,
        "completedAt": completed_at,
    }


def recheck_at(auth: Authorized, at: float, skew: int) -> None:
    """The approval window and context freshness at a later time (same snapshots)."""
    check_window(auth.payload, at, skew)
    observed = timestamp(
        auth.binding["observedAt"], "context.observedAt", code=Code.CONTEXT_INVALID
    )
    try:
        check_binding_fresh(observed, auth.source, at, "context")
    except AgentSafetyError as exc:
        raise AgentSafetyError("the source context is not fresh", code=Code.CONTEXT_STALE) from exc


async def sign_receipt(
    payload: dict[str, Any], signer: CapturedSigner, budget: Budget, abort: asyncio.Event | None
) -> FrozenDict:
    content = freeze(unsigned(RECEIPT_TYPE, signer.algorithm, signer.key_id, payload), budget)
    message = canonical_json(content)
    try:
        signature = await guarded(lambda: signer.sign(message), abort)
    except (AgentSafetyError, asyncio.CancelledError):
        raise
    except Exception:
        raise AgentSafetyError("the receipt signer failed", code=Code.SIGNER_FAILED) from None
    check_signature_bytes(signature, Code.SIGNER_FAILED)
    return freeze_object({**content, "signature": encode_signature(signature)}, budget)


async def issue_agent_execution_receipt(
    *,
    dry_run: object,
    policy: object,
    approval: object,
    approval_verifier: object,
    context: object,
    step_id: object,
    operation: object,
    consumption: object,
    use_verifier: object,
    evidence: object,
    execution_id: object,
    signer: object,
    now: object,
    max_clock_skew_ms: object,
    cancel: object = None,
) -> FrozenDict:
    """Sign a receipt for a step a separately authorized host executor finished."""
    abort = capture_abort(cancel)
    check_abort(abort)
    verifier = capture_verifier(approval_verifier, "approval verifier")
    captured = capture_signer(signer, "receipt signer")
    verify_use_fn = getattr(use_verifier, "verify_consumption", None)
    if not callable(verify_use_fn):
        raise AgentSafetyError("a consumption verifier is required", code=Code.USE_STORE_INVALID)
    now_s, now_str = now_text(now)
    skew = skew_ms(max_clock_skew_ms)
    budget = envelope_budget()
    loaded = load_plan_policy(policy, budget)
    auth = await authorize_step(
        loaded=loaded,
        budget=budget,
        dry_run=dry_run,
        approval=approval,
        verifier=verifier,
        step_id=step_id,
        context=context,
        at=now_s,
        skew=skew,
        abort=abort,
    )
    check_operation(freeze(operation, budget), auth)
    exec_id = identifier(execution_id, "execution_id", code=Code.EXECUTION_ID_INVALID)
    ev = read_evidence(freeze(evidence, budget), auth)
    record, consumed_at = await verify_use(freeze(consumption, budget), auth, verify_use_fn, abort)
    if consumed_at > now_s + skew / 1000:
        raise AgentSafetyError(
            "the step completed before it was consumed", code=Code.CONSUMPTION_MISMATCH
        )
    payload = receipt_payload(
        auth=auth, execution_id=exec_id, consumption=record, evidence=ev, completed_at=now_str
    )
    receipt = await sign_receipt(payload, captured, budget, abort)
    check_abort(abort)
    return receipt


_RECEIPT_KEYS = frozenset(
    {
        "executionId",
        "approvalId",
        "approvalDigest",
        "planId",
        "planDigest",
        "policyDigest",
        "dryRunDigest",
        "stepId",
        "operationDigest",
        "bindingDigest",
        "consumption",
        "useDigest",
        "outcome",
        "rows",
        "bytes",
        "resultDigest",
        "errorCode",
        "completedAt",
    }
)


async def verify_agent_execution_receipt(
    receipt: object,
    *,
    dry_run: object,
    policy: object,
    approval: object,
    approval_verifier: object,
    receipt_verifier: object,
    context: object,
    use_verifier: object,
    max_clock_skew_ms: object,
    cancel: object = None,
) -> FrozenDict:
    """Verify a receipt against the plan, policy, approval and historical context it binds;
    return its payload. Any modified field is ``RECEIPT_MISMATCH``."""
    abort = capture_abort(cancel)
    check_abort(abort)
    a_verifier = capture_verifier(approval_verifier, "approval verifier")
    r_verifier = capture_verifier(receipt_verifier, "receipt verifier")
    verify_use_fn = getattr(use_verifier, "verify_consumption", None)
    if not callable(verify_use_fn):
        raise AgentSafetyError("a consumption verifier is required", code=Code.USE_STORE_INVALID)
    skew = skew_ms(max_clock_skew_ms)
    budget = envelope_budget()
    loaded = load_plan_policy(policy, budget)
    envelope, payload, message, signature = read_envelope(
        freeze(receipt, budget), type_=RECEIPT_TYPE, verifier=r_verifier, prefix="RECEIPT"
    )
    try:
        valid = await guarded(lambda: r_verifier.verify(message, signature), abort)
    except (AgentSafetyError, asyncio.CancelledError):
        raise
    except Exception:
        raise AgentSafetyError("the verifier failed", code=Code.VERIFIER_FAILED) from None
    if valid is not True:
        raise AgentSafetyError(
            "the receipt signature does not verify", code=Code.RECEIPT_SIGNATURE_INVALID
        )
    obj(payload, "receipt.payload", code=Code.RECEIPT_MALFORMED, required=_RECEIPT_KEYS)
    completed = timestamp(
        payload["completedAt"], "receipt.completedAt", code=Code.RECEIPT_MALFORMED
    )
    exec_id = identifier(payload["executionId"], "receipt.executionId", code=Code.RECEIPT_MALFORMED)
    auth = await authorize_step(
        loaded=loaded,
        budget=budget,
        dry_run=dry_run,
        approval=approval,
        verifier=a_verifier,
        step_id=payload["stepId"],
        context=context,
        at=completed,
        skew=skew,
        abort=abort,
    )
    if payload["approvalDigest"] != auth.approval_digest:
        raise AgentSafetyError("the receipt is for another approval", code=Code.RECEIPT_MISMATCH)
    evidence = {k: payload[k] for k in ("outcome", "rows", "bytes", "resultDigest", "errorCode")}
    compact = {k: v for k, v in evidence.items() if v is not None}
    try:
        ev = read_evidence(freeze(compact, budget), auth)
    except AgentSafetyError as exc:
        code = exc.code if exc.code == Code.EVIDENCE_EXCEEDS_APPROVAL else Code.RECEIPT_MISMATCH
        raise AgentSafetyError("the receipt's evidence is refused", code=code) from None
    record, consumed_at = await verify_use(payload["consumption"], auth, verify_use_fn, abort)
    if consumed_at > completed + skew / 1000:
        raise AgentSafetyError(
            "the receipt completes before its consumption", code=Code.RECEIPT_MISMATCH
        )
    expected = receipt_payload(
        auth=auth,
        execution_id=exec_id,
        consumption=record,
        evidence=ev,
        completed_at=payload["completedAt"],
    )
    if freeze(expected, budget) != payload:
        raise AgentSafetyError("a receipt field does not match", code=Code.RECEIPT_MISMATCH)
    result = freeze_object({**payload, "receiptDigest": envelope_digest(envelope)}, budget)
    check_abort(abort)
    return result
