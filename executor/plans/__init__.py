"""The plan boundary: dry run, reviewer-signed approval, single-use step execution and signed
receipts for multi-step agent plans.

A deterministic trust boundary between untrusted plan proposals and host-owned effects. Dry
runs, approvals and verification never call a model, tool or source;
:func:`execute_agent_plan_step` is the one explicit effect boundary. See ``docs/plans.md``.

Callers: the executor's ``/v1/plans/*`` routes (through :class:`PlanService`), hosts embedding
the library.
"""

from __future__ import annotations

from .approval import issue_agent_approval, verify_agent_step_authorization
from .dryrun import dry_run_agent_plan, dry_run_digest, operation_digest
from .errors import AgentExecutionError, AgentSafetyAborted, AgentSafetyError
from .execute import (
    AuditSink,
    StepExecution,
    StepExecutor,
    StepRequest,
    StepResult,
    execute_agent_plan_step,
)
from .limits import AGENT_SAFETY_HARD_LIMITS
from .mcp_adapter import McpReadExecutor, create_read_only_mcp_executor
from .policy import Effect, PlanPolicy, SourcePolicy
from .receipts import (
    ConsumptionVerifier,
    UseConsumer,
    issue_agent_execution_receipt,
    verify_agent_execution_receipt,
)
from .service import ExecutorRegistry, PlanService
from .signing import Ed25519Signer, Ed25519Verifier, Signer, Verifier, envelope_digest
from .snapshot import FrozenDict, thaw

__all__ = [
    "AGENT_SAFETY_HARD_LIMITS",
    "AgentExecutionError",
    "AgentSafetyAborted",
    "AgentSafetyError",
    "AuditSink",
    "ConsumptionVerifier",
    "Ed25519Signer",
    "Ed25519Verifier",
    "Effect",
    "ExecutorRegistry",
    "FrozenDict",
    "McpReadExecutor",
    "PlanPolicy",
    "PlanService",
    "Signer",
    "SourcePolicy",
    "StepExecution",
    "StepExecutor",
    "StepRequest",
    "StepResult",
    "UseConsumer",
    "Verifier",
    "create_read_only_mcp_executor",
    "dry_run_agent_plan",
    "dry_run_digest",
    "envelope_digest",
    "execute_agent_plan_step",
    "issue_agent_approval",
    "issue_agent_execution_receipt",
    "operation_digest",
    "thaw",
    "verify_agent_execution_receipt",
    "verify_agent_step_authorization",
]
