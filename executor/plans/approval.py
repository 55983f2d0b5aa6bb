"""Reviewer approvals: issue a signed, single-plan approval and verify it for one step.

:func:`issue_agent_approval` revalidates the dry run from its own normalised plan under the same
policy snapshot (any difference is ``DRY_RUN_MISMATCH``), checks provenance is still fresh, reads
the reviewer's request and signs an envelope (``signing.py``) whose payload allocates rows and
bytes to every step. A single-step plan may narrow with ``maxRows``/``maxBytes``; a multi-step
plan narrows only with ``stepLimits`` (aggregate narrowing is ambiguous and refused); narrowing
never widens.

:func:`verify_agent_step_authorization` checks the envelope against the configured verifier, the
exact dry run and policy, the validity window, the step, the current source context (same
versions, scopes, data mode, attribution and citations; fresh provenance) and, when given, the
exact operation. It returns the step's authorization with the *narrowed* limits.

Callers: the public API, ``receipts.py``, ``execute.py``, ``service.py``.
Also imported by ``__init__.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..canonical import canonical_json, sha256_digest
from ..clock import format_ms
from ..codes import Code
from .cancel import capture_abort, check_abort, guarded
from .dryrun import (
    binding_digest,
    check_binding_fresh,
    evaluate_plan,
    operation_digest,
    read_binding,
)
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS as HARD
from .policy import LoadedPolicy, SourcePolicy, load_plan_policy
from .shapes import identifier, integer, now_text, obj, seq, text, timestamp
from .signing import (
    APPROVAL_TYPE,
    CapturedVerifier,
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
    "Authorized",
    "authorize_step",
    "check_authorization",
    "check_operation",
    "issue_agent_approval",
    "revalidate_dry_run",
    "verify_agent_step_authorization",
]

_REQUEST = Code.APPROVAL_REQUEST_INVALID
_MALFORMED = Code.APPROVAL_MALFORMED


def skew_ms(value: object) -> int:
    return integer(
        value,
        "max_clock_skew_ms",
        code=Code.SKEW_INVALID,
        minimum=0,
        maximum=HARD["maxClockSkewMs"],
    )


def revalidate_dry_run(dry_run: Any, loaded: LoadedPolicy) -> FrozenDict:
    """Re-run the dry run from its own plan under ``loaded`` at its own time; it must match."""
    root = obj(
        dry_run,
        "dryRun",
        code=Code.DRY_RUN_MISMATCH,
        required=frozenset(
            {"version", "evaluatedAt", "planDigest", "policyDigest", "plan", "steps", "budget"}
        ),
    )
    if root["policyDigest"] != loaded.digest:
        raise AgentSafetyError(
            "the dry run was made under another policy", code=Code.POLICY_DIGEST_MISMATCH
        )
    at = timestamp(root["evaluatedAt"], "dryRun.evaluatedAt", code=Code.DRY_RUN_MISMATCH)
    try:
        again = evaluate_plan(root["plan"], loaded, at)
    except AgentSafetyError as exc:
        raise AgentSafetyError(
            f"the dry run no longer validates ({exc.code})", code=Code.DRY_RUN_MISMATCH
        ) from None
    if again != root:
        raise AgentSafetyError("the dry run was altered", code=Code.DRY_RUN_MISMATCH)
    return root


def _plan_step(dry_run: FrozenDict, step_id: str) -> tuple[FrozenDict, FrozenDict]:
    for entry, step in zip(dry_run["steps"], dry_run["plan"]["steps"], strict=True):
        if entry["stepId"] == step_id:
            return entry, step
    raise AgentSafetyError("the step is not in the plan", code=Code.STEP_UNKNOWN)


def _allocations(dry_run: FrozenDict, request: FrozenDict) -> list[dict[str, Any]]:
    entries = dry_run["steps"]
    aggregate = "maxRows" in request or "maxBytes" in request
    per_step = "stepLimits" in request
    if aggregate and (len(entries) > 1 or per_step):
        raise AgentSafetyError(
            "narrow a multi-step plan with stepLimits only", code=Code.APPROVAL_AMBIGUOUS_NARROWING
        )
    limits: dict[str, tuple[int | None, int | None]] = {}
    if aggregate:
        limits[entries[0]["stepId"]] = (request.get("maxRows"), request.get("maxBytes"))
    if per_step:
        items = seq(
            request["stepLimits"], "request.stepLimits", code=_REQUEST, max_length=len(entries)
        )
        for index, item in enumerate(items):
            where = f"request.stepLimits[{index}]"
            limit = obj(
                item,
                where,
                code=_REQUEST,
                required=frozenset({"stepId"}),
                optional=frozenset({"maxRows", "maxBytes"}),
            )
            step_id = identifier(limit["stepId"], f"{where}.stepId", code=_REQUEST)
            if step_id in limits:
                raise AgentSafetyError(f"{where} repeats a step", code=_REQUEST)
            limits[step_id] = (limit.get("maxRows"), limit.get("maxBytes"))
    known = {entry["stepId"] for entry in entries}
    if not set(limits) <= known:
        raise AgentSafetyError("stepLimits names a step not in the plan", code=Code.STEP_UNKNOWN)
    out: list[dict[str, Any]] = []
    for entry in entries:
        rows, size = limits.get(entry["stepId"], (None, None))
        max_rows = entry["maxRows"] if rows is None else rows
        max_bytes = entry["maxBytes"] if size is None else size
        integer(max_rows, "request maxRows", code=_REQUEST, minimum=0, maximum=HARD["maxRows"])
        integer(max_bytes, "request maxBytes", code=_REQUEST, minimum=1, maximum=HARD["maxBytes"])
        if max_rows > entry["maxRows"] or max_bytes > entry["maxBytes"]:
            raise AgentSafetyError(
                "an approval may narrow limits, never widen them", code=Code.APPROVAL_WIDENS
            )
        out.append(
            {
                "stepId": entry["stepId"],
                "tool": entry["tool"],
                "effect": entry["effect"],
                "operationDigest": entry["operationDigest"],
                "bindingDigest": entry["bindingDigest"],
                "maxRows": max_rows,
                "maxBytes": max_bytes,
            }
        )
    return out


def _check_fresh(dry_run: FrozenDict, loaded: LoadedPolicy, now: float) -> None:
    for index, step in enumerate(dry_run["plan"]["steps"]):
        binding = step["source"]
        source = loaded.model.sources[binding["id"]]
        observed = timestamp(binding["observedAt"], "observedAt", code=Code.TIMESTAMP_INVALID)
        check_binding_fresh(observed, source, now, f"plan.steps[{index}].source")


async def issue_agent_approval(
    dry_run: object,
    policy: object,
    request: object,
    signer: object,
    *,
    now: object,
    max_clock_skew_ms: object,
    cancel: object = None,
) -> FrozenDict:
    """Sign a reviewer's approval of exactly this dry run under exactly this policy."""
    abort = capture_abort(cancel)
    check_abort(abort)
    captured = capture_signer(signer)
    now_s, _ = now_text(now)
    skew = skew_ms(max_clock_skew_ms)
    budget = envelope_budget()
    loaded = load_plan_policy(policy, budget)
    dry = revalidate_dry_run(freeze(dry_run, budget), loaded)
    req = obj(
        freeze(request, budget),
        "request",
        code=_REQUEST,
        required=frozenset({"id", "approver", "issuedAt", "expiresAt"}),
        optional=frozenset({"maxRows", "maxBytes", "stepLimits"}),
    )
    approval_id = identifier(req["id"], "request.id", code=_REQUEST)
    approver = text(req["approver"], "request.approver", code=_REQUEST)
    issued = timestamp(req["issuedAt"], "request.issuedAt", code=_REQUEST)
    expires = timestamp(req["expiresAt"], "request.expiresAt", code=_REQUEST)
    if abs(round((issued - now_s) * 1000)) > skew:
        raise AgentSafetyError("issuedAt is too far from now", code=Code.APPROVAL_CLOCK_SKEW)
    lifetime = round((expires - issued) * 1000)
    if lifetime <= 0 or expires <= now_s:
        raise AgentSafetyError("the approval would expire before it is used", code=_REQUEST)
    if lifetime > loaded.model.max_approval_lifetime_ms:
        raise AgentSafetyError(
            "the approval lives longer than the policy allows", code=Code.APPROVAL_LIFETIME_EXCEEDED
        )
    _check_fresh(dry, loaded, now_s)
    payload = {
        "id": approval_id,
        "approver": approver,
        "issuedAt": req["issuedAt"],
        "expiresAt": req["expiresAt"],
        "planId": dry["plan"]["id"],
        "planDigest": dry["planDigest"],
        "policyDigest": loaded.digest,
        "dryRunDigest": sha256_digest(dry),
        "steps": _allocations(dry, req),
    }
    content = freeze(unsigned(APPROVAL_TYPE, captured.algorithm, captured.key_id, payload), budget)
    message = canonical_json(content)
    try:
        signature = await guarded(lambda: captured.sign(message), abort)
    except (AgentSafetyError, asyncio.CancelledError):
        raise
    except Exception:
        raise AgentSafetyError("the signer failed", code=Code.SIGNER_FAILED) from None
    check_signature_bytes(signature, Code.SIGNER_FAILED)
    envelope = freeze_object({**content, "signature": encode_signature(signature)}, budget)
    check_abort(abort)
    return envelope


# -- verification ------------------------------------------------------------------------------

_PAYLOAD_KEYS = frozenset(
    {
        "id",
        "approver",
        "issuedAt",
        "expiresAt",
        "planId",
        "planDigest",
        "policyDigest",
        "dryRunDigest",
        "steps",
    }
)
_ALLOCATION_KEYS = frozenset(
    {"stepId", "tool", "effect", "operationDigest", "bindingDigest", "maxRows", "maxBytes"}
)


@dataclass(frozen=True)
class Authorized:
    """What a verified approval allows for one step, with everything it was checked against."""

    loaded: LoadedPolicy
    dry_run: FrozenDict
    approval: FrozenDict
    approval_digest: str
    payload: FrozenDict
    entry: FrozenDict  # the dry run's step entry
    plan_step: FrozenDict  # the normalised plan step
    allocation: FrozenDict  # narrowed limits
    source: SourcePolicy
    binding: FrozenDict  # the current context's binding of the step's source
    binding_digest: str

    def authorization(self) -> dict[str, Any]:
        return {
            "approvalId": self.payload["id"],
            "approvalDigest": self.approval_digest,
            "planId": self.payload["planId"],
            "planDigest": self.payload["planDigest"],
            "policyDigest": self.payload["policyDigest"],
            "dryRunDigest": self.payload["dryRunDigest"],
            "stepId": self.entry["stepId"],
            "tool": self.entry["tool"],
            "effect": self.entry["effect"],
            "sourceId": self.entry["sourceId"],
            "operationDigest": self.entry["operationDigest"],
            "contextBindingDigest": self.binding_digest,
            "maxRows": self.allocation["maxRows"],
            "maxBytes": self.allocation["maxBytes"],
            "expiresAt": self.payload["expiresAt"],
        }


def check_window(payload: FrozenDict, at: float, skew: int) -> None:
    issued = timestamp(payload["issuedAt"], "approval.issuedAt", code=_MALFORMED)
    expires = timestamp(payload["expiresAt"], "approval.expiresAt", code=_MALFORMED)
    if at * 1000 < issued * 1000 - skew:
        raise AgentSafetyError("the approval is not yet valid", code=Code.APPROVAL_NOT_YET_VALID)
    if at >= expires:
        raise AgentSafetyError("the approval has expired", code=Code.APPROVAL_EXPIRED)


def check_context(
    context: Any, plan_binding: FrozenDict, loaded: LoadedPolicy, at: float
) -> tuple[FrozenDict, SourcePolicy]:
    """The current context's binding of one source: same as the plan's but ``observedAt``,
    which must be fresh at ``at``."""
    root = obj(context, "context", code=Code.CONTEXT_INVALID, required=frozenset({"sources"}))
    sources = root["sources"]
    if type(sources) is not FrozenDict or len(sources) > HARD["maxSources"]:
        raise AgentSafetyError(
            "context.sources must be a bounded object", code=Code.CONTEXT_INVALID
        )
    source_id = plan_binding["id"]
    if source_id not in sources:
        raise AgentSafetyError("the context lacks the step's source", code=Code.CONTEXT_MISMATCH)
    try:
        binding, source, observed = read_binding(
            sources[source_id], "context.sources[]", loaded.model, code=Code.CONTEXT_INVALID
        )
    except AgentSafetyError as exc:
        code = Code.CONTEXT_MISMATCH if exc.code != Code.CONTEXT_INVALID else exc.code
        raise AgentSafetyError(f"the context binding is refused ({exc.code})", code=code) from None
    if binding["id"] != source_id:
        raise AgentSafetyError(
            "the context binding names another source", code=Code.CONTEXT_MISMATCH
        )
    for key in binding:
        if key != "observedAt" and binding[key] != plan_binding[key]:
            raise AgentSafetyError(
                "the current source context drifted from the plan", code=Code.CONTEXT_MISMATCH
            )
    try:
        check_binding_fresh(observed, source, at, "context")
    except AgentSafetyError as exc:
        raise AgentSafetyError(
            "the current source context is not fresh", code=Code.CONTEXT_STALE
        ) from exc
    return binding, source


async def check_authorization(
    *,
    loaded: LoadedPolicy,
    dry_run: Any,
    approval: Any,
    verifier: CapturedVerifier,
    step_id: object,
    context: Any,
    at: float,
    skew: int,
    abort: asyncio.Event | None,
) -> Authorized:
    """Everything :func:`verify_agent_step_authorization` checks, on snapshots, at ``at``."""
    dry = revalidate_dry_run(dry_run, loaded)
    envelope, payload, message, signature = read_envelope(
        approval, type_=APPROVAL_TYPE, verifier=verifier, prefix="APPROVAL"
    )
    try:
        valid = await guarded(lambda: verifier.verify(message, signature), abort)
    except (AgentSafetyError, asyncio.CancelledError):
        raise
    except Exception:
        raise AgentSafetyError("the verifier failed", code=Code.VERIFIER_FAILED) from None
    if valid is not True:
        raise AgentSafetyError(
            "the approval signature does not verify", code=Code.APPROVAL_SIGNATURE_INVALID
        )
    obj(payload, "approval.payload", code=_MALFORMED, required=_PAYLOAD_KEYS)
    if (
        payload["planDigest"] != dry["planDigest"]
        or payload["policyDigest"] != loaded.digest
        or payload["dryRunDigest"] != sha256_digest(dry)
        or payload["planId"] != dry["plan"]["id"]
    ):
        raise AgentSafetyError(
            "the approval is for another plan, policy or dry run",
            code=Code.APPROVAL_BINDING_MISMATCH,
        )
    allocations = seq(
        payload["steps"], "approval.steps", code=_MALFORMED, max_length=HARD["maxSteps"]
    )
    if len(allocations) != len(dry["steps"]):
        raise AgentSafetyError(
            "the approval does not allocate every step", code=Code.APPROVAL_BINDING_MISMATCH
        )
    for allocation, entry in zip(allocations, dry["steps"], strict=True):
        obj(allocation, "approval.steps[]", code=_MALFORMED, required=_ALLOCATION_KEYS)
        for key in ("stepId", "tool", "effect", "operationDigest", "bindingDigest"):
            if allocation[key] != entry[key]:
                raise AgentSafetyError(
                    "an approval step does not match the plan", code=Code.APPROVAL_BINDING_MISMATCH
                )
        rows = integer(
            allocation["maxRows"], "maxRows", code=_MALFORMED, minimum=0, maximum=HARD["maxRows"]
        )
        size = integer(
            allocation["maxBytes"], "maxBytes", code=_MALFORMED, minimum=1, maximum=HARD["maxBytes"]
        )
        if rows > entry["maxRows"] or size > entry["maxBytes"]:
            raise AgentSafetyError("an approval step widens the plan", code=Code.APPROVAL_WIDENS)
    check_window(payload, at, skew)
    if type(step_id) is not str:
        raise AgentSafetyError("the step id must be a string", code=Code.STEP_UNKNOWN)
    entry, plan_step = _plan_step(dry, step_id)
    allocation = next(a for a in allocations if a["stepId"] == step_id)
    binding, source = check_context(context, plan_step["source"], loaded, at)
    return Authorized(
        loaded=loaded,
        dry_run=dry,
        approval=envelope,
        approval_digest=envelope_digest(envelope),
        payload=payload,
        entry=entry,
        plan_step=plan_step,
        allocation=allocation,
        source=source,
        binding=binding,
        binding_digest=binding_digest(binding),
    )


_OPERATION_KEYS = frozenset(
    {"tool", "effect", "sourceId", "fields", "queryPlanFingerprint", "parameters"}
)


async def authorize_step(
    *,
    loaded: LoadedPolicy,
    budget: Budget,
    dry_run: object,
    approval: object,
    verifier: CapturedVerifier,
    step_id: object,
    context: object,
    at: float,
    skew: int,
    abort: asyncio.Event | None,
) -> Authorized:
    """Snapshot the caller's dry run, approval and context into ``budget`` (in that order), then
    :func:`check_authorization` at ``at``. For public operations that have not snapshotted them."""
    return await check_authorization(
        loaded=loaded,
        dry_run=freeze(dry_run, budget),
        approval=freeze(approval, budget),
        verifier=verifier,
        step_id=step_id,
        context=freeze(context, budget),
        at=at,
        skew=skew,
        abort=abort,
    )


def check_operation(operation: Any, auth: Authorized) -> FrozenDict:
    """The exact operation must be the approved one; its parameters are bounded by the
    policy's parameter ceilings and must hash to the step's parameters digest."""
    op = obj(operation, "operation", code=Code.OPERATION_INVALID, required=_OPERATION_KEYS)
    policy = auth.loaded.model
    limits = Budget(
        nodes=policy.max_operation_parameter_nodes,
        depth=policy.max_operation_parameter_depth,
        containers=policy.max_operation_parameter_nodes,
        bytes=policy.max_operation_parameter_bytes,
    )
    try:
        freeze(op["parameters"], limits)
    except AgentSafetyError as exc:
        raise AgentSafetyError(
            f"the operation parameters exceed the policy ({exc.code})",
            code=Code.OPERATION_PARAMETERS_EXCEEDED,
        ) from None
    step = auth.plan_step
    fields = op["fields"]
    if type(fields) is not tuple or not all(type(f) is str for f in fields):
        raise AgentSafetyError("operation.fields must be strings", code=Code.OPERATION_INVALID)
    for key in ("tool", "effect", "queryPlanFingerprint"):
        if type(op[key]) is not str:
            raise AgentSafetyError(f"operation.{key} must be a string", code=Code.OPERATION_INVALID)
    if type(op["sourceId"]) is not str:
        raise AgentSafetyError("operation.sourceId must be a string", code=Code.OPERATION_INVALID)
    recomputed = operation_digest(
        tool=op["tool"],
        effect=op["effect"],
        source_id=op["sourceId"],
        query_plan_fingerprint=op["queryPlanFingerprint"],
        fields=fields,
        parameters_digest=sha256_digest(op["parameters"]),
    )
    if recomputed != step["operationDigest"]:
        raise AgentSafetyError(
            "the operation is not the approved one", code=Code.OPERATION_MISMATCH
        )
    return op


async def verify_agent_step_authorization(
    *,
    dry_run: object,
    policy: object,
    approval: object,
    verifier: object,
    step_id: object,
    context: object,
    now: object,
    max_clock_skew_ms: object,
    operation: object = None,
    cancel: object = None,
) -> FrozenDict:
    """Verify ``approval`` for one step now; return the authorization with narrowed limits."""
    abort = capture_abort(cancel)
    check_abort(abort)
    captured = capture_verifier(verifier)
    now_s, _ = now_text(now)
    skew = skew_ms(max_clock_skew_ms)
    budget = envelope_budget()
    loaded = load_plan_policy(policy, budget)
    auth = await authorize_step(
        loaded=loaded,
        budget=budget,
        dry_run=dry_run,
        approval=approval,
        verifier=captured,
        step_id=step_id,
        context=context,
        at=now_s,
        skew=skew,
        abort=abort,
    )
    if operation is not None:
        check_operation(freeze(operation, budget), auth)
    result = freeze_object({**auth.authorization(), "verifiedAt": format_ms(now_s)}, budget)
    check_abort(abort)
    return result


__all__ += ["check_context", "check_window", "skew_ms"]
