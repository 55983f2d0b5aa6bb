"""The plan routes' service object: one method per route, JSON in, JSON-able dicts out.

The executor's HTTP layer authenticates the caller, parses the body and calls:

* ``POST /v1/plans/dry-run`` (PROPOSER) -> :meth:`PlanService.dry_run`
* ``POST /v1/plans/approvals`` (APPROVER) -> :meth:`PlanService.approve`
* ``POST /v1/plans/steps`` (PROPOSER) -> :meth:`PlanService.execute_step`
* ``POST /v1/plans/receipts/verify`` (OPERATOR with ``evidence``) ->
  :meth:`PlanService.verify_receipt`

Every refusal is an :class:`AgentSafetyError` (or :class:`AgentExecutionError`, which carries a
receipt) with a stable code; the routes answer it with the code's status from the registry
(``codes.py``), so nothing here knows HTTP. The service owns no
state beyond what it is given: the policy, signers/verifiers, the use store, the audit sink, the
executor registry and the clock.

Callers: ``routes/plans.py`` (the plan routes), ``assembly.py`` (construction), the package's
public API.
Also imported by ``plane.py``, ``__init__.py``, ``routes/table.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..clock import Clock
from ..codes import Code
from .approval import issue_agent_approval
from .dryrun import dry_run_agent_plan, dry_run_digest
from .errors import AgentSafetyError
from .execute import AuditSink, StepExecutor, execute_agent_plan_step
from .policy import PlanPolicy
from .receipts import UseConsumer, verify_agent_execution_receipt
from .shapes import obj, text
from .signing import Signer, Verifier, envelope_digest
from .snapshot import FrozenDict, envelope_budget, freeze, thaw

__all__ = ["ExecutorRegistry", "PlanService"]


class ExecutorRegistry:
    """Step executors by their exact ``(tool, effect)``; sealed before serving."""

    def __init__(self) -> None:
        self._executors: dict[tuple[str, str], StepExecutor] = {}
        self._sealed = False

    def register(self, executor: StepExecutor) -> None:
        if self._sealed:
            raise AgentSafetyError("the executor registry is sealed", code=Code.REGISTRY_SEALED)
        tool, effect = executor.tool, executor.effect
        if type(tool) is not str or type(effect) is not str:
            raise AgentSafetyError(
                "an executor names one tool and one effect", code=Code.EXECUTOR_INVALID
            )
        if (tool, effect) in self._executors:
            raise AgentSafetyError(
                "an executor is already registered for this tool and effect",
                code=Code.EXECUTOR_DUPLICATE,
            )
        self._executors[(tool, effect)] = executor

    def seal(self) -> None:
        self._sealed = True

    def get(self, tool: str, effect: str) -> StepExecutor | None:
        return self._executors.get((tool, effect))


class PlanService:
    """What the plan routes call; see the module docstring."""

    def __init__(
        self,
        *,
        policy: PlanPolicy | Mapping[str, Any],
        approval_signer: Signer,
        approval_verifier: Verifier,
        receipt_signer: Signer,
        receipt_verifier: Verifier,
        use_store: UseConsumer,
        audit_sink: AuditSink,
        executors: ExecutorRegistry,
        clock: Clock,
        max_clock_skew_ms: int = 5_000,
    ) -> None:
        self._policy: object = policy if type(policy) is PlanPolicy else dict(policy)
        self._approval_signer = approval_signer
        self._approval_verifier = approval_verifier
        self._receipt_signer = receipt_signer
        self._receipt_verifier = receipt_verifier
        self._store = use_store
        self._audit = audit_sink
        self._executors = executors
        self._clock = clock
        self._skew = max_clock_skew_ms

    def _body(
        self, body: object, required: frozenset[str], optional: frozenset[str] = frozenset()
    ) -> FrozenDict:
        return obj(
            freeze(body, envelope_budget()),
            "body",
            code=Code.REQUEST_INVALID,
            required=required,
            optional=optional,
        )

    async def dry_run(self, body: object) -> dict[str, Any]:
        """``{"plan"}`` -> ``{"dryRun", "dryRunDigest"}``."""
        req = self._body(body, frozenset({"plan"}))
        dry = dry_run_agent_plan(req["plan"], self._policy, now=self._clock.now())
        return {"dryRun": thaw(dry), "dryRunDigest": dry_run_digest(dry)}

    async def approve(self, body: object, *, approver: str) -> dict[str, Any]:
        """``{"dryRun", "request"}`` from the authenticated APPROVER -> ``{"approval",
        "approvalDigest"}``. The request's ``approver`` must be the caller (it is filled in
        when absent)."""
        req = self._body(body, frozenset({"dryRun", "request"}))
        request = req["request"]
        if type(request) is not FrozenDict:
            raise AgentSafetyError("request must be an object", code=Code.APPROVAL_REQUEST_INVALID)
        text(approver, "approver", code=Code.APPROVER_MISMATCH)
        if request.get("approver", approver) != approver:
            raise AgentSafetyError(
                "the request names another approver", code=Code.APPROVER_MISMATCH
            )
        full = {**thaw(request), "approver": approver}
        approval = await issue_agent_approval(
            req["dryRun"],
            self._policy,
            full,
            self._approval_signer,
            now=self._clock.now(),
            max_clock_skew_ms=self._skew,
        )
        return {"approval": thaw(approval), "approvalDigest": envelope_digest(approval)}

    async def execute_step(self, body: object) -> dict[str, Any]:
        """``{"dryRun", "approval", "context", "stepId", "operation", "executionId"}`` ->
        ``{"value", "rows", "bytes", "resultDigest", "receipt", "receiptDigest"}``."""
        req = self._body(
            body, frozenset({"dryRun", "approval", "context", "stepId", "operation", "executionId"})
        )
        executor = self._executor_for(req["dryRun"], req["stepId"])
        result = await execute_agent_plan_step(
            dry_run=req["dryRun"],
            policy=self._policy,
            approval=req["approval"],
            approval_verifier=self._approval_verifier,
            context=req["context"],
            step_id=req["stepId"],
            operation=req["operation"],
            use_consumer=self._store,
            executor=executor,
            audit_sink=self._audit,
            receipt_signer=self._receipt_signer,
            execution_id=req["executionId"],
            clock=self._clock,
            max_clock_skew_ms=self._skew,
        )
        return {
            "value": thaw(result.value),
            "rows": result.rows,
            "bytes": result.bytes,
            "resultDigest": result.result_digest,
            "receipt": thaw(result.receipt),
            "receiptDigest": result.receipt_digest,
        }

    def _executor_for(self, dry_run: object, step_id: object) -> StepExecutor:
        steps = dry_run.get("steps") if type(dry_run) is FrozenDict else None
        if type(steps) is tuple:
            for entry in steps:
                if type(entry) is FrozenDict and entry.get("stepId") == step_id:
                    tool, effect = entry.get("tool"), entry.get("effect")
                    if type(tool) is str and type(effect) is str:
                        found = self._executors.get(tool, effect)
                        if found is not None:
                            return found
                    raise AgentSafetyError(
                        "no executor is registered for this step", code=Code.EXECUTOR_NOT_REGISTERED
                    )
        raise AgentSafetyError("the step is not in the plan", code=Code.STEP_UNKNOWN)

    async def verify_receipt(self, body: object) -> dict[str, Any]:
        """``{"receipt", "dryRun", "approval", "context"}`` -> ``{"valid": true, "receipt":
        payload, "receiptDigest"}``; an invalid receipt raises with its code."""
        req = self._body(body, frozenset({"receipt", "dryRun", "approval", "context"}))
        verified = await verify_agent_execution_receipt(
            req["receipt"],
            dry_run=req["dryRun"],
            policy=self._policy,
            approval=req["approval"],
            approval_verifier=self._approval_verifier,
            receipt_verifier=self._receipt_verifier,
            context=req["context"],
            use_verifier=self._store,
            max_clock_skew_ms=self._skew,
        )
        payload = thaw(verified)
        digest = payload.pop("receiptDigest")
        return {"valid": True, "receipt": payload, "receiptDigest": digest}
