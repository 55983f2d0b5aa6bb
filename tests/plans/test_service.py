"""PlanService: the route-facing object, JSON in and out, through a JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentsafe.executor.plans import AgentSafetyError
from agentsafe.executor.plans.service import ExecutorRegistry, PlanService
from agentsafe.executor.routes.refusals import status_of

from . import support as s


def _wire(value: Any) -> Any:
    return json.loads(json.dumps(value))


async def test_routes_round_trip(store, approver, receipt_signer) -> None:
    executor = s.RecordingExecutor()
    registry = ExecutorRegistry()
    registry.register(executor)
    registry.seal()
    audit = s.MemoryAudit()
    service = PlanService(
        policy=s.policy(),
        approval_signer=approver,
        approval_verifier=approver.verifier(),
        receipt_signer=receipt_signer,
        receipt_verifier=receipt_signer.verifier(),
        use_store=store,
        audit_sink=audit,
        executors=registry,
        clock=s.manual_clock(),
    )
    dry = _wire(await service.dry_run({"plan": s.plan()}))
    assert dry["dryRunDigest"].startswith("sha256:")
    request = s.request()
    del request["approver"]
    approved = _wire(
        await service.approve(
            {"dryRun": dry["dryRun"], "request": request}, approver="reviewer@example.test"
        )
    )
    with pytest.raises(AgentSafetyError) as caught:
        await service.approve(
            {"dryRun": dry["dryRun"], "request": s.request()}, approver="someone-else"
        )
    assert caught.value.code == "APPROVER_MISMATCH"
    body = {
        "dryRun": dry["dryRun"],
        "approval": approved["approval"],
        "context": s.context(),
        "stepId": "query-incidents",
        "operation": s.operation(),
        "executionId": "exec-1",
    }
    ran = _wire(await service.execute_step(body))
    assert ran["rows"] == 1
    with pytest.raises(AgentSafetyError) as caught:
        await service.execute_step(body)
    assert caught.value.code == "APPROVAL_ALREADY_USED"
    assert status_of(caught.value.code) == 409
    verified = await service.verify_receipt(
        {
            "receipt": ran["receipt"],
            "dryRun": dry["dryRun"],
            "approval": approved["approval"],
            "context": s.context(),
        }
    )
    assert verified["valid"] is True
    assert verified["receiptDigest"] == ran["receiptDigest"]


def test_registry_is_exact_and_sealed() -> None:
    registry = ExecutorRegistry()
    registry.register(s.RecordingExecutor())
    with pytest.raises(AgentSafetyError):
        registry.register(s.RecordingExecutor())
    registry.seal()
    with pytest.raises(AgentSafetyError):
        registry.register(s.RecordingExecutor(tool="other"))
    assert registry.get("query", "write") is None
