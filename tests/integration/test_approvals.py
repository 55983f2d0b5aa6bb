"""Human approval of escalations: durable requests, APPROVER decisions, one execution."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agentsafe.executor.assembly import assemble
from agentsafe.executor.clock import Clock, ManualClock
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.support.approval_policy import approval_policy
from tests.support.pki import TestCA

from .bearer_principals import APPROVERS_OPERATOR_ID, BearerPrincipals, principals_env

PROPOSER, APPROVER, OTHER_APPROVER, OPERATOR = (
    "treasury-workflow",
    "treasury-lead",
    "risk-officer",
    "ops-oncall",
)
APPROVERS_OPERATOR = APPROVERS_OPERATOR_ID


@dataclass
class Node:
    executor: Executor
    url: str
    session: aiohttp.ClientSession
    principals: BearerPrincipals
    evidence: MemorySink
    security: MemorySink

    async def call(
        self, method: str, path: str, who: str, body: Any = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {"authorization": f"Bearer {self.principals.token(who)}"}
        async with self.session.request(
            method, self.url + path, json=body, headers=headers
        ) as response:
            return response.status, await response.json()

    async def propose(self, amount: int, key: str) -> tuple[int, dict[str, Any]]:
        body = {
            "proposal": {
                "action": "create_payout",
                "target": "payout:beneficiary-9",
                "parameters": {"amountMinor": amount, "currency": "EUR"},
            },
            "idempotency_key": key,
        }
        return await self.call("POST", "/v1/actions", PROPOSER, body)


Start = Callable[..., Awaitable[Node]]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Start, SyntheticProvider]]:
    provider = SyntheticProvider()
    await provider.start()
    started: list[Node] = []

    async def start(
        clock: Clock | None = None,
        verification: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> Node:
        principals = BearerPrincipals(approvers_operator=True)
        workspace = Workspace(tmp_path / f"ws{len(started)}")
        policy = approval_policy(tmp_path / f"policy{len(started)}.yaml", verification)
        env = workspace.environment(
            provider_url=provider.base_url, port=free_port(), policy_file=policy
        )
        env = principals_env(
            env,
            principals.write(tmp_path / f"principals{len(started)}.json"),
            EXECUTOR_ESCALATION="APPROVAL",
            **(extra or {}),
        )
        evidence, security = MemorySink(), MemorySink()
        executor = await assemble(
            env, streams=Streams(evidence=evidence, security=security), clock=clock
        )
        await executor.reconcile_at_start()
        await executor.listen()
        n = Node(
            executor,
            f"http://127.0.0.1:{executor.port}",
            aiohttp.ClientSession(),
            principals,
            evidence,
            security,
        )
        started.append(n)
        return n

    yield start, provider
    for n in started:
        await n.session.close()
        await n.executor.close()
    await provider.stop()


async def test_approved_escalation_runs_once(node: tuple[Start, SyntheticProvider]) -> None:
    start, provider = node
    n = await start()
    status, held = await n.propose(20000, "esc-1")
    assert status == 200
    assert held["outcome"] == "ESCALATE_PENDING"
    escalation = held["escalation"]
    assert escalation["mode"] == "APPROVAL"
    assert escalation["intent"]["intent_id"] == held["intent_id"]

    status, still = await n.call("POST", "/v1/escalations", PROPOSER, {"escalation": escalation})
    assert status == 200
    assert still["outcome"] == "ESCALATE_PENDING"

    status, listing = await n.call("GET", "/v1/approvals?state=PENDING", APPROVER)
    assert status == 200
    [item] = listing["approvals"]
    assert item["request_id"] == escalation["request_id"]
    assert item["intent"]["parameters"] == {"amountMinor": 20000, "currency": "EUR"}
    assert item["proposer"]["principal"] == PROPOSER
    # An approver the rule does not name sees nothing and cannot decide.
    status, other = await n.call("GET", "/v1/approvals?state=PENDING", OTHER_APPROVER)
    assert other["approvals"] == []
    status, _ = await n.call(
        "POST",
        f"/v1/approvals/{escalation['request_id']}",
        OTHER_APPROVER,
        {"decision": "APPROVE", "reason": "not mine"},
    )
    assert status == 404

    status, decided = await n.call(
        "POST",
        f"/v1/approvals/{escalation['request_id']}",
        APPROVER,
        {"decision": "APPROVE", "reason": "within the quarterly plan"},
    )
    assert status == 200
    assert decided["state"] == "APPROVED"
    status, again = await n.call(
        "POST",
        f"/v1/approvals/{escalation['request_id']}",
        APPROVER,
        {"decision": "DENY", "reason": "changed my mind"},
    )
    assert status == 409
    assert again["error"]["code"] == "APPROVAL_ALREADY_DECIDED"

    assert provider.received == []
    status, done = await n.call("POST", "/v1/escalations", PROPOSER, {"escalation": escalation})
    assert status == 200
    assert done["verdict"] == "ALLOW"
    assert done["outcome"] == "COMPLETED"
    assert done["executed"] is True
    assert "APPROVED_BY_APPROVER" in done["reason_codes"]
    assert len(provider.received) == 1

    status, replay = await n.call("POST", "/v1/escalations", PROPOSER, {"escalation": escalation})
    assert replay["replayed"] is True
    assert len(provider.received) == 1
    assert "APPROVAL_DECIDED" in [e for e, _ in n.evidence.events]


async def test_denied_escalation_is_blocked(node: tuple[Start, SyntheticProvider]) -> None:
    start, provider = node
    n = await start()
    _, held = await n.propose(30000, "esc-deny")
    escalation = held["escalation"]
    status, _ = await n.call(
        "POST",
        f"/v1/approvals/{escalation['request_id']}",
        APPROVER,
        {"decision": "DENY", "reason": "no"},
    )
    assert status == 200
    status, answer = await n.call("POST", "/v1/escalations", PROPOSER, {"escalation": escalation})
    assert answer["verdict"] == "BLOCK"
    assert answer["reason_codes"] == ["APPROVAL_DENIED"]
    assert provider.received == []


async def test_forged_or_rebound_escalations_are_refused(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, _ = node
    n = await start()
    _, first = await n.propose(20000, "esc-a")
    _, second = await n.propose(25000, "esc-b")
    changed = copy.deepcopy(first["escalation"])
    changed["intent"]["action"]["parameters"]["amountMinor"] = 20001
    rebound = copy.deepcopy(first["escalation"])
    rebound["token"] = second["escalation"]["token"]
    swapped = copy.deepcopy(first["escalation"])
    swapped["request_id"] = second["escalation"]["request_id"]
    for forged in (changed, rebound, swapped):
        status, body = await n.call("POST", "/v1/escalations", PROPOSER, {"escalation": forged})
        assert status == 409
        assert body["error"]["code"] == "ESCALATION_BINDING_MISMATCH"


async def test_roles_are_separated(node: tuple[Start, SyntheticProvider]) -> None:
    start, _ = node
    n = await start()
    _, held = await n.propose(20000, "esc-roles")
    request_id = held["escalation"]["request_id"]
    for who in (PROPOSER, OPERATOR):
        status, body = await n.call(
            "POST", f"/v1/approvals/{request_id}", who, {"decision": "APPROVE", "reason": "me"}
        )
        assert status == 403
        assert body["error"]["code"] == "ROLE_FORBIDDEN"
    status, body = await n.call(
        "POST", "/v1/escalations", APPROVER, {"escalation": held["escalation"]}
    )
    assert status == 403


async def test_an_approval_cannot_revive_an_expired_intent(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, provider = node
    clock = ManualClock(start=1_800_000_000.0)
    n = await start(clock=clock)
    _, held = await n.propose(20000, "esc-late")
    escalation = held["escalation"]
    await n.call(
        "POST",
        f"/v1/approvals/{escalation['request_id']}",
        APPROVER,
        {"decision": "APPROVE", "reason": "ok"},
    )
    clock.advance(61)
    status, body = await n.call("POST", "/v1/escalations", PROPOSER, {"escalation": escalation})
    # Issue 21: expiry is a BLOCK whose reason codes say so, never a 409.
    assert status == 200
    assert body["verdict"] == "BLOCK"
    assert body["outcome"] == "BLOCKED"
    assert body["executed"] is False
    assert body["reason_codes"] == ["APPROVAL_EXPIRED", "INTENT_EXPIRED"]
    assert provider.received == []


async def test_an_undecided_escalation_expires_as_a_block(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, provider = node
    clock = ManualClock(start=1_800_000_000.0)
    n = await start(clock=clock)
    _, held = await n.propose(20000, "esc-undecided")
    clock.advance(61)
    status, body = await n.call(
        "POST", "/v1/escalations", PROPOSER, {"escalation": held["escalation"]}
    )
    assert (status, body["verdict"]) == (200, "BLOCK")
    assert "APPROVAL_EXPIRED" in body["reason_codes"]
    status, late = await n.call(
        "POST",
        f"/v1/approvals/{held['escalation']['request_id']}",
        APPROVER,
        {"decision": "APPROVE", "reason": "too late"},
    )
    assert (status, late["error"]["code"]) == (409, "APPROVAL_EXPIRED")
    assert provider.received == []


async def test_the_escalation_carries_its_approval_url_rule_and_reason(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, _ = node
    n = await start()
    _, held = await n.propose(20000, "esc-url")
    escalation = held["escalation"]
    assert escalation["approval_url"] == f"/approve/{escalation['request_id']}"
    status, item = await n.call("GET", f"/v1/approvals/{escalation['request_id']}", APPROVER)
    assert status == 200
    assert item["rule"] == "medium"
    assert item["reason_codes"] == held["reason_codes"]
    assert item["verification"] == {
        "rule": "CREDENTIAL",
        "required": "CREDENTIAL",
        "decided_with": None,
    }
    assert item["display"]["amount"] == "200.00 EUR"
    assert item["display"]["target"] == '"payout:beneficiary-9"'
    assert item["intent"]["intent_hash"] == held["intent_hash"]


async def test_the_proposer_or_an_operator_cancels_a_pending_escalation(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, provider = node
    n = await start()
    _, first = await n.propose(20000, "esc-cancel-1")
    _, second = await n.propose(21000, "esc-cancel-2")
    status, cancelled = await n.call(
        "POST",
        "/v1/escalations/cancel",
        PROPOSER,
        {"escalation": first["escalation"], "reason": "the invoice was withdrawn"},
    )
    assert status == 200
    assert cancelled["state"] == "CANCELLED"
    status, again = await n.call(
        "POST",
        "/v1/escalations/cancel",
        PROPOSER,
        {"escalation": first["escalation"], "reason": "twice"},
    )
    assert (status, again["error"]["code"]) == (409, "APPROVAL_NOT_CANCELLABLE")
    rid = second["escalation"]["request_id"]
    # An operator without the approvers scope may not; one with it may.
    status, refused = await n.call(
        "POST", f"/v1/control/approvals/{rid}/cancel", OPERATOR, {"reason": "incident 42"}
    )
    assert (status, refused["error"]["code"]) == (403, "SCOPE_FORBIDDEN")
    status, by_operator = await n.call(
        "POST", f"/v1/control/approvals/{rid}/cancel", APPROVERS_OPERATOR, {"reason": "incident"}
    )
    assert status == 200
    assert (by_operator["state"], by_operator["cancelled_by"]) == ("CANCELLED", APPROVERS_OPERATOR)
    for held in (first, second):
        status, decided = await n.call(
            "POST",
            f"/v1/approvals/{held['escalation']['request_id']}",
            APPROVER,
            {"decision": "APPROVE", "reason": "late"},
        )
        assert (status, decided["error"]["code"]) == (409, "APPROVAL_CANCELLED")
        status, answer = await n.call(
            "POST", "/v1/escalations", PROPOSER, {"escalation": held["escalation"]}
        )
        assert (status, answer["verdict"], answer["reason_codes"]) == (
            200,
            "BLOCK",
            ["APPROVAL_CANCELLED"],
        )
    status, listing = await n.call("GET", "/v1/approvals?state=CANCELLED", APPROVER)
    assert len(listing["approvals"]) == 2
    assert provider.received == []


async def test_a_rule_requiring_webauthn_refuses_a_decision_with_a_bearer_alone(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, provider = node
    n = await start(verification="WEBAUTHN")
    _, held = await n.propose(20000, "esc-webauthn")
    rid = held["escalation"]["request_id"]
    status, item = await n.call("GET", f"/v1/approvals/{rid}", APPROVER)
    assert item["verification"]["required"] == "WEBAUTHN"
    for decision in ("APPROVE", "DENY"):
        status, refused = await n.call(
            "POST", f"/v1/approvals/{rid}", APPROVER, {"decision": decision, "reason": "cli"}
        )
        assert (status, refused["error"]["code"]) == (403, "APPROVAL_VERIFICATION_REQUIRED")
    # Without EXECUTOR_APPROVAL_ORIGIN there is no relying party: passkeys are off.
    status, challenge = await n.call(
        "POST", f"/v1/approvals/{rid}/challenge", APPROVER, {"decision": "APPROVE"}
    )
    assert (status, challenge["error"]["code"]) == (409, "WEBAUTHN_NOT_CONFIGURED")
    status, still = await n.call(
        "POST", "/v1/escalations", PROPOSER, {"escalation": held["escalation"]}
    )
    assert still["outcome"] == "ESCALATE_PENDING"
    assert provider.received == []


@pytest.mark.slow
async def test_two_executor_processes_share_one_approval_store(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    principals_file = principals.write(tmp_path / "principals.json")
    first = Workspace(tmp_path / "a")
    second = Workspace(tmp_path / "b")
    env_a = principals_env(
        first.environment(provider_url=provider.url, port=free_port()),
        principals_file,
        EXECUTOR_ESCALATION="APPROVAL",
    )
    env_b = principals_env(
        second.environment(provider_url=provider.url, port=free_port()),
        principals_file,
        EXECUTOR_ESCALATION="APPROVAL",
        EXECUTOR_STATE_DIR=env_a["EXECUTOR_STATE_DIR"],
        EXECUTOR_AUTHORITY_SIGNING_KEY_FILE=env_a["EXECUTOR_AUTHORITY_SIGNING_KEY_FILE"],
        EXECUTOR_SECRETS_DIR=env_a["EXECUTOR_SECRETS_DIR"],
    )
    a = ExecutorProcess(env_a, tmp_path, "executor-a")
    b = ExecutorProcess(env_b, tmp_path, "executor-b")
    await a.start()
    await b.start()
    try:
        async with aiohttp.ClientSession() as session:

            async def call(
                proc: ExecutorProcess, method: str, path: str, who: str, body: Any = None
            ) -> tuple[int, Any]:
                headers = {"authorization": f"Bearer {principals.token(who)}"}
                async with session.request(
                    method, proc.url + path, json=body, headers=headers
                ) as r:
                    return r.status, await r.json()

            proposal = {
                "proposal": {
                    "action": "create_payout",
                    "target": "payout:shared",
                    "parameters": {"amountMinor": 20000, "currency": "EUR"},
                },
                "idempotency_key": "shared-1",
            }
            _, held = await call(a, "POST", "/v1/actions", PROPOSER, proposal)
            escalation = held["escalation"]
            status, listing = await call(b, "GET", "/v1/approvals?state=PENDING", APPROVER)
            assert [x["request_id"] for x in listing["approvals"]] == [escalation["request_id"]]
            status, _ = await call(
                b,
                "POST",
                f"/v1/approvals/{escalation['request_id']}",
                APPROVER,
                {"decision": "APPROVE", "reason": "approved on the other replica"},
            )
            assert status == 200
            _, done = await call(a, "POST", "/v1/escalations", PROPOSER, {"escalation": escalation})
            assert done["outcome"] == "COMPLETED"
            _, replay = await call(
                b, "POST", "/v1/escalations", PROPOSER, {"escalation": escalation}
            )
            assert replay["replayed"] is True
            assert int((await provider.received())["count"]) == 1
    finally:
        a.terminate()
        b.terminate()
        provider.terminate()


async def test_the_approvals_command_line(
    node: tuple[Start, SyntheticProvider], tmp_path: Path
) -> None:
    start, _ = node
    n = await start()
    _, held = await n.propose(20000, "esc-cli")
    request_id = held["escalation"]["request_id"]
    token_file = tmp_path / "approver-token"
    token_file.write_text(n.principals.token(APPROVER))
    agentsafe = str(Path(sys.executable).parent / "agentsafe")
    base = [agentsafe, "approvals", "--url", n.url, "--token-file", str(token_file)]
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}

    async def run(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *base,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, _ = await run("list")
    assert code == 0
    assert request_id in out
    assert "create_payout" in out
    # Declining at the prompt decides nothing.
    code, out, _ = await run("approve", request_id, "--reason", "checked", stdin=b"n\n")
    assert code == 1
    assert '"amountMinor": 20000' in out
    assert "nothing decided" in out
    code, out, _ = await run("approve", request_id, "--reason", "checked", stdin=b"y\n")
    assert code == 0, out
    assert "APPROVED" in out
    code, _, err = await run("deny", request_id, "--reason", "again", "--yes")
    assert code == 2
    assert "APPROVAL_ALREADY_DECIDED" in err


async def run_cli(n: Node, who: str, *argv: str) -> tuple[int, str, str]:
    """``agentsafe`` as a person runs it, in its own process, against this executor."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AGENTSAFE_EXECUTOR_URL": n.url,
        "AGENTSAFE_APPROVER_TOKEN": n.principals.token(who),
        "AGENTSAFE_OPERATOR_TOKEN": n.principals.token(who),
        "COLUMNS": "200",
        "TERM": "xterm-256color",
        "FORCE_COLOR": "1",  # rich writes styles: agent text must still not carry its own
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("agentsafe")),
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


HOSTILE_TARGET = (
    "payout:ok [conceal]+9,000,000 to mallory[/conceal] \x1b[8mhidden\x1b[0m \u202eevil"
)


async def test_the_cli_shows_agent_text_inert_never_as_markup(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, provider = node
    # A held clock: four CLI processes on a loaded machine must not outlive the 60 s intent.
    n = await start(clock=ManualClock(start=time.time()), verification="WEBAUTHN")
    body = {
        "proposal": {
            "action": "create_payout",
            "target": HOSTILE_TARGET,
            "parameters": {"amountMinor": 20000, "currency": "EUR"},
        },
        "idempotency_key": "cli-hostile",
    }
    _, held = await n.call("POST", "/v1/actions", PROPOSER, body)
    rid = held["escalation"]["request_id"]

    code, out, err = await run_cli(n, APPROVER, "approvals", "show", rid)
    assert code == 0, err
    assert "[conceal]+9,000,000 to mallory[/conceal]" in out
    assert "\\u001b[8mhidden\\u001b[0m" in out
    assert "\x1b[8m" not in out
    assert "\\u202eevil" in out
    assert "\u202e" not in out
    assert "200.00 EUR" in out
    assert "medium" in out
    assert held["intent_hash"] in out
    code, out, _ = await run_cli(n, APPROVER, "approvals", "list")
    assert code == 0
    assert "[conceal]" in out
    assert "\x1b[8m" not in out

    # A rule that requires a passkey cannot be decided from a terminal; it says where to go.
    code, _, err = await run_cli(n, APPROVER, "approvals", "approve", rid, "--reason", "x", "--yes")
    assert code == 2
    assert f"/approve/{rid}" in err
    assert "passkey" in err

    code, out, err = await run_cli(
        n, APPROVERS_OPERATOR, "approvers", "cancel", rid, "--reason", "cli", "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out)["state"] == "CANCELLED"
    assert provider.received == []


def settled(read: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    """``read`` as the coroutine ``wait_until`` polls."""

    async def poll() -> Any:
        return read()

    return poll


class WebhookReceiver:
    """A real HTTPS receiver on loopback (a test CA's certificate) that records every POST."""

    def __init__(self, tmp_path: Path, *, status: int = 200) -> None:
        self.ca = TestCA("webhook receiver CA")
        self.ca_file = self.ca.write(tmp_path, "webhook-ca")
        self.status = status
        self.received: list[tuple[str, dict[str, str], Any]] = []
        self._tmp = tmp_path
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        async def hook(request: web.Request) -> web.Response:
            self.received.append((request.path, dict(request.headers), await request.json()))
            return web.Response(status=self.status, text="ok")

        app = web.Application()
        app.router.add_post("/hooks/approvals", hook)
        cert, key = self.ca.issue_server().write(self._tmp, "webhook")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def env(self) -> dict[str, str]:
        return {
            "EXECUTOR_APPROVAL_WEBHOOK_URL": f"https://localhost:{self.port}/hooks/approvals",
            "EXECUTOR_APPROVAL_WEBHOOK_CA_FILE": str(self.ca_file),
            "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK": "true",
        }

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def test_a_pending_escalation_is_posted_to_the_webhook_slack_compatible(
    node: tuple[Start, SyntheticProvider], tmp_path: Path
) -> None:
    start, _ = node
    receiver = WebhookReceiver(tmp_path)
    await receiver.start()
    try:
        n = await start(extra=receiver.env())
        body = {
            "proposal": {
                "action": "create_payout",
                "target": "payout:<https://evil.example|click> <!channel> & co",
                "parameters": {"amountMinor": 20000, "currency": "EUR"},
            },
            "idempotency_key": "esc-webhook",
        }
        status, held = await n.call("POST", "/v1/actions", PROPOSER, body)
        assert (status, held["outcome"]) == (200, "ESCALATE_PENDING")
        await wait_until(settled(lambda: receiver.received), timeout=15, what="the webhook")
        [(path, headers, message)] = receiver.received
        assert path == "/hooks/approvals"
        assert headers["Content-Type"] == "application/json"
        assert set(message) == {"text", "blocks", "unfurl_links", "unfurl_media"}
        assert all(block["type"] == "section" for block in message["blocks"])
        own = message["blocks"][0]["text"]
        assert (own["type"], own["verbatim"]) == ("mrkdwn", True)
        shown = "\n".join(block["text"]["text"] for block in message["blocks"])
        request_id = held["escalation"]["request_id"]
        assert f"/approve/{request_id}" in shown
        assert request_id in message["text"]
        assert "200.00 EUR" in shown
        assert held["intent_hash"] in shown
        assert "*Rule*: medium" in shown
        # The agent's text can make neither a link nor a mention.
        assert "&lt;https[:]//evil[.]example|click&gt; &lt;[!]channel&gt; &amp; co" in shown
        assert "<https://evil" not in shown
        assert "<!channel>" not in shown
        assert "amountMinor" not in json.dumps(message)
        await wait_until(
            settled(lambda: any(e == "APPROVAL_NOTIFIED" for e, _ in n.evidence.events)),
            timeout=5,
            what="APPROVAL_NOTIFIED",
        )
    finally:
        await receiver.stop()


async def test_a_webhook_that_refuses_is_reported_and_the_request_stays_pending(
    node: tuple[Start, SyntheticProvider], tmp_path: Path
) -> None:
    start, _ = node
    receiver = WebhookReceiver(tmp_path, status=500)
    await receiver.start()
    try:
        n = await start(extra=receiver.env())
        _, held = await n.propose(20000, "esc-webhook-500")
        failed = await wait_until(
            settled(lambda: [f for e, f in n.security.events if e == "APPROVAL_NOTIFY_FAILED"]),
            timeout=15,
            what="APPROVAL_NOTIFY_FAILED",
        )
        assert failed == [
            {
                "request_id": held["escalation"]["request_id"],
                "code": "APPROVAL_NOTIFY_FAILED",
                "status": 500,
            }
        ]
        status, item = await n.call(
            "GET", f"/v1/approvals/{held['escalation']['request_id']}", APPROVER
        )
        assert (status, item["state"]) == (200, "PENDING")
    finally:
        await receiver.stop()


async def test_the_pending_escalations_gauge_follows_the_store(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, _ = node
    n = await start()

    async def pending() -> float:
        headers = {"authorization": f"Bearer {n.principals.token(OPERATOR)}"}
        async with n.session.get(n.url + "/metrics", headers=headers) as response:
            assert response.status == 200
            text = await response.text()
        [family] = [
            f
            for f in text_string_to_metric_families(text)
            if f.name == "agentsafe_pending_escalations"
        ]
        return float(family.samples[0].value)

    assert await pending() == 0
    _, first = await n.propose(20000, "esc-gauge-1")
    _, second = await n.propose(30000, "esc-gauge-2")
    assert await pending() == 2
    status, _ = await n.call(
        "POST",
        f"/v1/approvals/{first['escalation']['request_id']}",
        APPROVER,
        {"decision": "DENY", "reason": "no"},
    )
    assert status == 200
    assert await pending() == 1
    assert second["outcome"] == "ESCALATE_PENDING"


# Issue 30, items 9-11: what a person reads in the terminal (a real `agentsafe` process).
INVISIBLE = "\u3164\u115f\u1160\uffa0\u034f\ufe0f\U000e0100\u2800"
INVISIBLE_TARGET = "payout:bene" + INVISIBLE + "ficiary-1"
HOMOGLYPH_TARGET = "p\u0430yout:beneficiary-1"  # a Cyrillic а


async def propose_target(n: Node, target: str, key: str) -> tuple[str, dict[str, Any]]:
    body = {
        "proposal": {
            "action": "create_payout",
            "target": target,
            "parameters": {"amountMinor": 20000, "currency": "EUR"},
        },
        "idempotency_key": key,
    }
    status, held = await n.call("POST", "/v1/actions", PROPOSER, body)
    assert (status, held["outcome"]) == (200, "ESCALATE_PENDING"), held
    return str(held["escalation"]["request_id"]), held


async def test_invisible_characters_and_look_alikes_reach_no_one_raw(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, _ = node
    n = await start(clock=ManualClock(start=time.time()))
    hidden_id, _ = await propose_target(n, INVISIBLE_TARGET, "cli-invisible")
    alike_id, _ = await propose_target(n, HOMOGLYPH_TARGET, "cli-homoglyph")

    # The API's display fields: escaped, and the look-alike marked with the scripts it mixes.
    status, item = await n.call("GET", f"/v1/approvals/{hidden_id}", APPROVER)
    assert status == 200
    assert item["display"]["target"] == (
        '"payout:bene\\u3164\\u115f\\u1160\\uffa0\\u034f\\ufe0f\\udb40\\udd00\\u2800ficiary-1"'
    )
    assert not any(ch in json.dumps(item["display"], ensure_ascii=False) for ch in INVISIBLE)
    assert item["intent"]["target"] == INVISIBLE_TARGET  # the raw value is still there, exact
    status, item = await n.call("GET", f"/v1/approvals/{alike_id}", APPROVER)
    assert item["display"]["target"] == '"p\\u0430yout:beneficiary-1"'
    [warning] = item["display"]["warnings"]
    assert warning.startswith("target: p\\u0430yout: mixed scripts: Cyrillic, Latin")
    assert "\u0430" not in json.dumps(item["display"], ensure_ascii=False)

    code, out, err = await run_cli(n, APPROVER, "approvals", "show", hidden_id)
    assert code == 0, err
    assert "\\u3164\\u115f\\u1160\\uffa0\\u034f\\ufe0f\\udb40\\udd00\\u2800" in out
    assert not any(ch in out for ch in INVISIBLE)
    code, out, err = await run_cli(n, APPROVER, "approvals", "show", alike_id)
    assert code == 0, err
    assert '"p\\u0430yout:beneficiary-1"' in out
    assert "mixed scripts: Cyrillic, Latin" in out
    assert "\u0430" not in out
    code, out, err = await run_cli(n, APPROVER, "approvals", "list")
    assert code == 0, err
    assert not any(ch in out for ch in INVISIBLE + "\u0430")
    assert f"{alike_id} target: p\\u0430yout: mixed scripts: Cyrillic, Latin" in out


def table_column(out: str, index: int) -> str:
    """One column of a rich table's body, its folded lines joined (styles removed)."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    cells = [line.split("\u2502")[index].strip() for line in plain.split("\n") if "\u2502" in line]
    return "".join(cells)


async def test_the_list_never_cuts_the_tail_of_a_long_target(
    node: tuple[Start, SyntheticProvider],
) -> None:
    start, _ = node
    n = await start(clock=ManualClock(start=time.time()))
    target = "payout:" + "x" * 493 + "MALLORY-ACCT"
    assert len(target) == 512
    await propose_target(n, target, "cli-long")
    code, out, err = await run_cli(n, APPROVER, "approvals", "list")
    assert code == 0, err
    assert "\u2026" not in out
    assert table_column(out, 3) == f'"{target}"'


async def start_receiver_process(tmp_path: Path) -> tuple[asyncio.subprocess.Process, int, Path]:
    """``tests/support/webhook_receiver.py`` in its own process, HTTPS on loopback."""
    ca = TestCA("webhook receiver process CA")
    ca_file = ca.write(tmp_path, "receiver-ca")
    cert, key = ca.issue_server().write(tmp_path, "receiver")
    script = Path(__file__).resolve().parents[1] / "support" / "webhook_receiver.py"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(cert),
        str(key),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    first = await asyncio.wait_for(process.stdout.readline(), 30)
    assert first.startswith(b"listening "), first
    return process, int(first.split()[1]), ca_file


async def test_the_webhook_neutralises_agent_text_for_slack(
    node: tuple[Start, SyntheticProvider], tmp_path: Path
) -> None:
    """Issue 30, item 12: a target holding a URL, formatting and a channel name reaches a real
    receiver process as text no Slack client can link, format or mention."""
    start, _ = node
    receiver, port, ca_file = await start_receiver_process(tmp_path)
    try:
        n = await start(
            extra={
                "EXECUTOR_APPROVAL_WEBHOOK_URL": f"https://localhost:{port}/hooks/approvals",
                "EXECUTOR_APPROVAL_WEBHOOK_CA_FILE": str(ca_file),
                "EXECUTOR_APPROVAL_WEBHOOK_ALLOW_INSECURE_LOOPBACK": "true",
            }
        )
        target = "https://evil.example/approve/now *Decide* #treasury-ops @here :bank: p\u0430y"
        request_id, held = await propose_target(n, target, "webhook-neutral")
        assert receiver.stdout is not None
        line = await asyncio.wait_for(receiver.stdout.readline(), 30)
        received = json.loads(line)
        assert received["path"] == "/hooks/approvals"
        message = received["body"]
        texts = [block["text"] for block in message["blocks"]]
        mrkdwn = [t for t in texts if t["type"] == "mrkdwn"]
        plain = [t for t in texts if t["type"] == "plain_text"]
        # Slack parses mrkdwn only where the executor wrote it, and even there verbatim.
        assert mrkdwn
        assert all(t.get("verbatim") is True for t in mrkdwn)
        assert all(t.get("emoji") is False for t in plain)
        own = "\n".join(t["text"] for t in mrkdwn) + message["text"]
        for fragment in ("evil", "Decide* #", "treasury-ops", "@here", ":bank:", "p\u0430y"):
            assert fragment not in own, fragment  # no agent text where Slack formats
        [shown] = [t["text"] for t in plain if t["text"].startswith("Target: ")]
        assert shown == (
            'Target: "https[:]//evil[.]example/approve/now *Decide* [#]treasury-ops [@]here'
            ' :bank: p\\u0430y"'
        )
        everything = json.dumps(message, ensure_ascii=False)
        for raw in ("https://evil", "evil.example", "#treasury", "@here", "\u0430"):
            assert raw not in everything, raw
        [look] = [t["text"] for t in plain if t["text"].startswith("\u26a0")]
        assert "mixed scripts: Cyrillic, Latin" in look
        assert f"/approve/{request_id}" in own
        assert held["intent_hash"] in own
        assert (message["unfurl_links"], message["unfurl_media"]) == (False, False)
    finally:
        if receiver.returncode is None:
            receiver.terminate()
        await asyncio.wait_for(receiver.wait(), 30)


async def test_an_approver_spelling_the_proposers_actor_in_capitals_cannot_decide(
    node: tuple[Start, SyntheticProvider], tmp_path: Path
) -> None:
    """Issue 30, item 13, on a running executor: after a reload, the approver's actor is
    ``Synthetic-Payout-Agent``, the actor that proposed as ``synthetic-payout-agent``. The
    file loads (no two principals spell one name differently any more), and the decision is
    refused: separation of duties compares names folded, wherever it compares them."""
    start, provider = node
    n = await start()
    _, held = await n.propose(20000, "sod-capitals")
    request_id = held["escalation"]["request_id"]
    document = n.principals.document()
    for entry in document["principals"]:
        if entry["id"] == PROPOSER:
            entry["actor"]["id"] = "synthetic-payout-agent-v2"
        if entry["id"] == APPROVER:
            entry["actor"]["id"] = "Synthetic-Payout-Agent"
    path = tmp_path / "principals0.json"
    path.write_text(json.dumps(document))
    status, reloaded = await n.call("POST", "/v1/control/secrets/reload", OPERATOR)
    assert status == 200, reloaded
    status, refused = await n.call(
        "POST", f"/v1/approvals/{request_id}", APPROVER, {"decision": "APPROVE", "reason": "me"}
    )
    assert (status, refused["error"]["code"]) == (422, "SEPARATION_OF_DUTIES_VIOLATED")
    status, item = await n.call("GET", f"/v1/approvals/{request_id}", APPROVER)
    assert (status, item["state"]) == (200, "PENDING")
    assert provider.received == []


async def test_a_principals_file_spelling_one_actor_twice_is_refused_on_reload(
    node: tuple[Start, SyntheticProvider], tmp_path: Path
) -> None:
    """Issue 30, item 13: ``Mallory@Bank.example`` beside ``mallory@bank.example`` is refused
    with a stable code that names principals by id only; the loaded set stays in force."""
    start, _ = node
    n = await start()
    document = n.principals.document()
    for entry in document["principals"]:
        if entry["id"] == APPROVER:
            entry["actor"]["id"] = "Mallory@Bank.example"
        if entry["id"] == OTHER_APPROVER:
            entry["actor"]["id"] = "mallory@bank.example"
    (tmp_path / "principals0.json").write_text(json.dumps(document))
    status, reloaded = await n.call("POST", "/v1/control/secrets/reload", OPERATOR)
    assert (status, reloaded["principals"]["ok"]) == (200, False)
    refusals = [f for e, f in n.security.events if e == "PRINCIPALS_RELOAD_REFUSED"]
    assert refusals == [
        {"code": "PRINCIPALS_ACTOR_COLLISION", "variable": "EXECUTOR_PRINCIPALS_FILE"}
    ]
    assert "allory" not in json.dumps([reloaded, n.security.events])
    _, held = await n.propose(20000, "after-refused-reload")
    assert held["outcome"] == "ESCALATE_PENDING"  # the old set still answers
