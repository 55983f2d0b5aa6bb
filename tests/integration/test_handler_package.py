"""An adopter's package (examples/handlers) pip-installed into a venv and run by a real
``agentsafe serve``: its second action and its plan step executor, with nothing patched.

The two commands are docs/handlers.md's, read from its last block (issue 31: the page is run as
written): ``pip install ./examples/handlers`` from a directory holding the example, into a fresh
venv that sees agentsafe from this environment (a ``.pth``), and ``EXECUTOR_HANDLERS=...
EXECUTOR_POLICY_FILE=examples/handlers/policy.yaml agentsafe serve`` from that directory, with the
page's variables on top of the test's listener, principals and downstream."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agentsafe.executor.clock import format_ms
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
)
from tests.plans import support as s

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "handlers"
PAGE = REPO / "docs" / "handlers.md"


def documented() -> tuple[list[str], dict[str, str], list[str]]:
    """docs/handlers.md's last block: the pip command's words, and the serve command's
    variables and words."""
    text = PAGE.read_text(encoding="utf-8")
    block = text[text.rindex("```\n", 0, text.rindex("```")) + 4 : text.rindex("```")]
    install, serve = (shlex.split(line) for line in block.splitlines() if line.strip())
    variables = {}
    while "=" in serve[0]:
        name, _, value = serve.pop(0).partition("=")
        variables[name] = value
    return install, variables, serve


INSTALL, VARIABLES, SERVE = documented()


def test_the_page_says_what_this_test_runs() -> None:
    assert INSTALL[:2] == ["pip", "install"]
    assert SERVE == ["agentsafe", "serve"]
    assert set(VARIABLES) == {"EXECUTOR_HANDLERS", "EXECUTOR_POLICY_FILE"}


def make_venv(root: Path) -> Path:
    """A fresh venv that sees agentsafe from the test's own environment (a .pth), with the
    example package pip-installed into it offline. Returns its python."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "agentsafe-base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    shutil.copytree(EXAMPLE, root / "examples" / "handlers")
    # the page's command, by the pip of this environment into the venv (it has none of its own)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *INSTALL[1:], "--quiet"],
        check=True,
        cwd=root,
    )
    return python


@dataclass
class Node:
    executor: ExecutorProcess
    provider: ProviderProcess
    principals: BearerPrincipals
    session: aiohttp.ClientSession

    async def post(self, path: str, who: str, body: Any) -> tuple[int, dict[str, Any]]:
        headers = {"authorization": f"Bearer {self.principals.token(who)}"}
        async with self.session.post(self.executor.url + path, json=body, headers=headers) as r:
            return r.status, await r.json()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    python = make_venv(tmp_path)
    provider = ProviderProcess(tmp_path)
    await provider.start()
    # The example policy as it ships (docs/handlers.md's command): its own plans section.
    policy_file = Path(VARIABLES["EXECUTOR_POLICY_FILE"])
    document = yaml.safe_load((tmp_path / policy_file).read_text())
    assert document["plans"] == s.policy(), "the example's plans section is the one tested here"
    principals = BearerPrincipals()
    doc = principals.document()
    doc["principals"][0]["allowed_actions"] = ["create_payout", "post_ledger_note"]
    principals_file = tmp_path / "principals.json"
    principals_file.write_text(json.dumps(doc))
    principals_file.chmod(0o600)
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=provider.url, port=free_port(), policy_file=policy_file),
        principals_file,
        **VARIABLES,
    )
    executor = ExecutorProcess(env, tmp_path)
    executor.argv[0] = str(python)
    await executor.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Node(executor, provider, principals, session)
    finally:
        executor.terminate()
        provider.terminate()


def note(key: str, text: str) -> dict[str, Any]:
    return {
        "proposal": {
            "action": "post_ledger_note",
            "target": "ledger:GB-OPS-1",
            "parameters": {"account": "GB-OPS-1", "note": text},
        },
        "idempotency_key": key,
    }


async def test_the_packaged_action_runs_once_and_a_block_reaches_nothing(node: Node) -> None:
    status, answer = await node.post("/v1/actions", "treasury-workflow", note("n-1", "hello"))
    assert status == 200, answer
    assert answer["outcome"] == "COMPLETED"
    assert answer["result"]["accepted"] is True
    received = await node.provider.received()
    assert received["count"] == 1
    status, again = await node.post("/v1/actions", "treasury-workflow", note("n-1", "hello"))
    assert status == 200
    assert again["intent_hash"] == answer["intent_hash"]
    assert (await node.provider.received())["count"] == 1, "a replay reaches nothing"
    status, blocked = await node.post(
        "/v1/actions", "treasury-workflow", note("n-2", "the password is x")
    )
    assert blocked["verdict"] == "BLOCK"
    assert "NOTE_LOOKS_SENSITIVE" in blocked["reason_codes"]
    assert (await node.provider.received())["count"] == 1
    events = node.executor.stderr_events()
    registered = [e for e in events if e.get("event") == "HANDLERS_REGISTERED"]
    assert registered
    assert registered[0]["registration"] == "bank_notes"
    assert registered[0]["handlers"] == ["post_ledger_note"]
    evidence = node.executor.stdout_events()
    assert any(e.get("event") == "EFFECT_OBSERVED" for e in evidence)
    status, ready = await node.executor.get_json(node.session, "/ready")
    # anonymous /ready names no action (issue 22): the registration line above does
    assert (status, ready) == (200, {"ready": True, "code": "READY"})


async def test_the_packaged_plan_executor_runs_a_step_in_serve(node: Node) -> None:
    now = time.time()
    observed = format_ms(now - 5)
    context = s.context(observedAt=observed)
    # the plan's actor is the calling principal (issue 16: no step for someone else's plan)
    plan = s.plan(s.step(source=s.binding(observedAt=observed)), actor="treasury-workflow")
    status, dry = await node.post("/v1/plans/dry-run", "treasury-workflow", {"plan": plan})
    assert status == 200, dry
    request = s.request(issuedAt=format_ms(now), expiresAt=format_ms(now + 240))
    del request["approver"]
    status, approved = await node.post(
        "/v1/plans/approvals", "treasury-lead", {"dryRun": dry["dryRun"], "request": request}
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
    status, ran = await node.post("/v1/plans/steps", "treasury-workflow", step)
    assert status == 200, ran
    assert ran["rows"] == 1
    status, again = await node.post("/v1/plans/steps", "treasury-workflow", step)
    assert status == 409
    assert again["error"]["code"] == "APPROVAL_ALREADY_USED"
    status, verified = await node.post(
        "/v1/plans/receipts/verify",
        OPERATOR_ID,
        {
            "receipt": ran["receipt"],
            "dryRun": dry["dryRun"],
            "approval": approved["approval"],
            "context": context,
        },
    )
    assert status == 200, verified
    assert verified["valid"] is True
