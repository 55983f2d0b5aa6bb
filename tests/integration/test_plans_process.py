"""The plan step route against a real ``agentsafe serve`` process (issue 16, item 5).

Two attacks the adversarial review ran, each reproduced here:

* ``/v1/plans/steps`` ran while the executor was halted;
* a different proposer, of another tenant, ran a step approved for someone else's plan and so
  spent the rightful proposer's approval.

The process is the real ``serve`` entry point with a test-double step executor
(``tests/support/plan_serve_child.py``); what ran is read from the plan audit on disk.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agentsafe.executor.clock import format_ms
from agentsafe.executor.tools.harness import DEMO_TENANT, ExecutorProcess, Workspace, free_port
from tests.plans import support as s

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

pytestmark = pytest.mark.slow

CHILD = Path(__file__).parents[1] / "support" / "plan_serve_child.py"
EXAMPLE = Path(__file__).parents[2] / "executor" / "examples" / "policy.yaml"
OTHER_TENANT = "00000000-0000-4000-8000-000000000002"


class Principals(BearerPrincipals):
    """The usual principals and a second proposer in another tenant."""

    def document(self) -> dict[str, Any]:
        doc = super().document()
        digest = hashlib.sha256(self.token("other-tenant-agent").encode()).hexdigest()
        doc["principals"].append(
            {
                "id": "other-tenant-agent",
                "role": "PROPOSER",
                "tenant_id": OTHER_TENANT,
                "actor": {"id": "other-agent", "type": "AI_AGENT"},
                "allowed_actions": ["create_payout"],
                "credential": {"kind": "BEARER", "token_sha256": digest},
            }
        )
        return doc


class Node:
    def __init__(self, process: ExecutorProcess, principals: Principals, journal: Path) -> None:
        self.process = process
        self.principals = principals
        self.journal = journal

    async def post(
        self, session: aiohttp.ClientSession, path: str, who: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        headers = {"authorization": f"Bearer {self.principals.token(who)}"}
        async with session.post(self.process.url + path, json=body, headers=headers) as r:
            return r.status, await r.json()

    def steps_started(self) -> int:
        lines = "".join(p.read_text() for p in (self.journal / "plans").glob("*.jsonl"))
        return sum(
            1 for line in lines.splitlines() if json.loads(line)["event"].endswith(".started")
        )


@pytest.fixture
async def node(tmp_path: Path) -> Any:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["plans"] = s.policy()
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(document))
    principals = Principals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(
            provider_url="http://127.0.0.1:9", port=free_port(), policy_file=policy_file
        ),
        principals.write(tmp_path / "principals.json"),
    )
    process = ExecutorProcess(env, tmp_path)
    process.argv = [sys.executable, str(CHILD)]
    await process.start()
    try:
        yield Node(process, principals, workspace.root / "journal")
    finally:
        assert process.terminate() == 0


def _now_fixtures(actor: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A plan, an approval request and a context at the real clock (the process's)."""
    now = time.time()
    observed = format_ms(now - 5)
    plan = s.plan(s.step(source=s.binding(observedAt=observed)), actor=actor)
    request = s.request(issuedAt=format_ms(now - 1), expiresAt=format_ms(now + 240))
    del request["approver"]
    return plan, request, s.context(observedAt=observed)


async def _approved(
    node: Node, session: aiohttp.ClientSession, actor: str, who: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    plan, request, context = _now_fixtures(actor)
    status, dry = await node.post(session, "/v1/plans/dry-run", who, {"plan": plan})
    assert status == 200, dry
    status, approved = await node.post(
        session,
        "/v1/plans/approvals",
        "treasury-lead",
        {"dryRun": dry["dryRun"], "request": request},
    )
    assert status == 200, approved
    step = {
        "dryRun": dry["dryRun"],
        "approval": approved["approval"],
        "context": context,
        "stepId": "query-incidents",
        "operation": s.operation(),
        "executionId": "exec-1",
    }
    return dry, approved, step


async def test_a_plan_step_is_refused_while_halted_and_runs_after_resume(node: Node) -> None:
    async with aiohttp.ClientSession() as session:
        _, _, step = await _approved(node, session, "treasury-workflow", "treasury-workflow")
        status, halted = await node.post(
            session, "/v1/control/halt", OPERATOR_ID, {"reason": "drill"}
        )
        assert status == 200, halted
        status, refused = await node.post(session, "/v1/plans/steps", "treasury-workflow", step)
        assert status == 503, refused
        assert refused["error"]["code"] == "EXECUTOR_HALTED"
        assert node.steps_started() == 0
        status, _ = await node.post(
            session, "/v1/control/resume", OPERATOR_ID, {"reason": "drill over"}
        )
        assert status == 200
        # Nothing was consumed by the refused attempt: the same approval runs once now.
        status, ran = await node.post(session, "/v1/plans/steps", "treasury-workflow", step)
        assert status == 200, ran
        assert ran["rows"] == 1
        assert node.steps_started() == 1


async def test_another_proposer_cannot_run_or_spend_someone_elses_approved_step(
    node: Node,
) -> None:
    async with aiohttp.ClientSession() as session:
        _, _, step = await _approved(node, session, "treasury-workflow", "treasury-workflow")
        status, refused = await node.post(session, "/v1/plans/steps", "other-tenant-agent", step)
        assert status == 403, refused
        assert refused["error"]["code"] == "PLAN_PRINCIPAL_MISMATCH"
        assert node.steps_started() == 0
        # The rightful proposer's approval is intact.
        status, ran = await node.post(session, "/v1/plans/steps", "treasury-workflow", step)
        assert status == 200, ran
        assert node.steps_started() == 1
        # Nor can a proposer dry-run a plan in another principal's name.
        plan, _, _ = _now_fixtures("treasury-workflow")
        status, refused = await node.post(
            session, "/v1/plans/dry-run", "other-tenant-agent", {"plan": plan}
        )
        assert status == 403, refused
        assert refused["error"]["code"] == "PLAN_PRINCIPAL_MISMATCH"
    assert DEMO_TENANT != OTHER_TENANT  # the other proposer is of another tenant
