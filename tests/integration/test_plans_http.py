"""The plan routes over HTTP: dry run, approval by an APPROVER, one step, receipt verification."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agentsafe.executor.assembly import assemble
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace, free_port
from tests.plans import support as s

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

EXAMPLE = Path(__file__).parents[2] / "examples" / "policy.yaml"
PROPOSER = "treasury-workflow"  # a plan's actor is the principal that proposes it


@dataclass
class PlanNode:
    executor: Executor
    url: str
    session: aiohttp.ClientSession
    principals: BearerPrincipals
    step_executor: s.RecordingExecutor

    async def post(self, path: str, who: str, body: Any) -> tuple[int, dict[str, Any]]:
        headers = {"authorization": f"Bearer {self.principals.token(who)}"}
        async with self.session.post(self.url + path, json=body, headers=headers) as r:
            return r.status, await r.json()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[PlanNode]:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["plans"] = s.policy()
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(document))
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(
            provider_url="http://127.0.0.1:9", port=free_port(), policy_file=policy_file
        ),
        principals.write(tmp_path / "principals.json"),
    )
    step_executor = s.RecordingExecutor()
    executor = await assemble(
        env,
        streams=Streams(evidence=MemorySink(), security=MemorySink()),
        clock=s.manual_clock(),
        plan_executors=[step_executor],
    )
    await executor.reconcile_at_start()
    await executor.listen()
    async with aiohttp.ClientSession() as session:
        yield PlanNode(
            executor, f"http://127.0.0.1:{executor.port}", session, principals, step_executor
        )
    await executor.close()


async def test_a_plan_from_dry_run_to_verified_receipt(node: PlanNode, tmp_path: Path) -> None:
    status, dry = await node.post(
        "/v1/plans/dry-run", "treasury-workflow", {"plan": s.plan(actor=PROPOSER)}
    )
    assert status == 200, dry
    request = s.request()
    del request["approver"]
    request["maxRows"] = 100
    status, approved = await node.post(
        "/v1/plans/approvals", "treasury-lead", {"dryRun": dry["dryRun"], "request": request}
    )
    assert status == 200, approved
    assert approved["approval"]["payload"][
        "approver"
    ] == "treasury-lead" or "treasury-lead" in json.dumps(approved)
    step = {
        "dryRun": dry["dryRun"],
        "approval": approved["approval"],
        "context": s.context(),
        "stepId": "query-incidents",
        "operation": s.operation(),
        "executionId": "exec-1",
    }
    status, ran = await node.post("/v1/plans/steps", "treasury-workflow", step)
    assert status == 200, ran
    assert ran["rows"] == 1
    assert len(node.step_executor.calls) == 1
    status, again = await node.post("/v1/plans/steps", "treasury-workflow", step)
    assert status == 409
    assert again["error"]["code"] == "APPROVAL_ALREADY_USED"
    assert len(node.step_executor.calls) == 1
    verify = {
        "receipt": ran["receipt"],
        "dryRun": dry["dryRun"],
        "approval": approved["approval"],
        "context": s.context(),
    }
    status, verified = await node.post("/v1/plans/receipts/verify", OPERATOR_ID, verify)
    assert status == 200, verified
    assert verified["valid"] is True
    tampered = json.loads(json.dumps(verify))
    tampered["receipt"]["payload"]["rows"] = 0
    status, refused = await node.post("/v1/plans/receipts/verify", OPERATOR_ID, tampered)
    assert status == 422
    assert refused["error"]["code"] == "RECEIPT_SIGNATURE_INVALID"
    # The audit is durable: started and completed are on disk under the journal.
    audit_files = list(
        (Path(node.executor.config.executor_journal_dir or "") / "plans").glob("*.jsonl")
    )
    lines = "".join(p.read_text() for p in audit_files).splitlines()
    kinds = [json.loads(line)["event"] for line in lines]
    assert kinds == ["agent_plan_step.started", "agent_plan_step.completed"]
    assert "status = 'open'" not in "".join(lines), "audit events carry digests, not parameters"


async def test_roles_on_the_plan_routes(node: PlanNode) -> None:
    status, dry = await node.post(
        "/v1/plans/dry-run", "treasury-workflow", {"plan": s.plan(actor=PROPOSER)}
    )
    assert status == 200
    request = s.request()
    del request["approver"]
    status, body = await node.post(
        "/v1/plans/approvals", "treasury-workflow", {"dryRun": dry["dryRun"], "request": request}
    )
    assert status == 403
    assert body["error"]["code"] == "ROLE_FORBIDDEN"
    status, body = await node.post(
        "/v1/plans/dry-run", "treasury-lead", {"plan": s.plan(actor=PROPOSER)}
    )
    assert status == 403


async def test_a_plan_outside_the_policy_is_refused_with_its_code(node: PlanNode) -> None:
    bad = s.plan(s.step(tool="delete"), actor=PROPOSER)
    status, body = await node.post("/v1/plans/dry-run", "treasury-workflow", {"plan": bad})
    assert status >= 400
    assert body["error"]["code"]
    assert "delete" not in body["error"]["message"]


async def test_an_expired_plan_approval_is_409_as_on_every_route(node: PlanNode) -> None:
    # One code, one status (executor/codes.py): APPROVAL_EXPIRED is 409 on /v1/plans/steps as
    # on /v1/approvals, never the 403 the plan routes used to answer.
    status, dry = await node.post(
        "/v1/plans/dry-run", "treasury-workflow", {"plan": s.plan(actor=PROPOSER)}
    )
    assert status == 200
    request = s.request()
    del request["approver"]
    status, approved = await node.post(
        "/v1/plans/approvals", "treasury-lead", {"dryRun": dry["dryRun"], "request": request}
    )
    assert status == 200, approved
    clock = node.executor.clock
    assert isinstance(clock, ManualClock)
    clock.advance(301)  # past the request's expiresAt (issuedAt + 5 minutes)
    step = {
        "dryRun": dry["dryRun"],
        "approval": approved["approval"],
        "context": s.context(),
        "stepId": "query-incidents",
        "operation": s.operation(),
        "executionId": "exec-late",
    }
    status, body = await node.post("/v1/plans/steps", "treasury-workflow", step)
    assert (status, body["error"]["code"]) == (409, "APPROVAL_EXPIRED")
    assert node.step_executor.calls == []
