"""The approval page in a real browser: enrol a passkey, read the exact intent, decide with it.

The executor is the real one (``assembly.assemble``) serving real TLS on localhost with
``EXECUTOR_ESCALATION=APPROVAL`` and ``EXECUTOR_APPROVAL_ORIGIN`` set to that listener, a policy
whose escalating rule names only ``treasury-lead`` and requires ``WEBAUTHN``, and the synthetic
provider behind it. Debian's chromium, driven by Playwright, holds a virtual authenticator
(``tests.support.browser``). The agent's target carries rich-console markup and HTML; the page
must show both literally.

Screenshots: ``build/artifacts/approval-page/<test>/``.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.assembly import assemble
from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.display import inert_json, inert_value
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace, free_port
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.integration.bearer_principals import (
    APPROVERS_OPERATOR_ID,
    BearerPrincipals,
    principals_env,
)
from tests.integration.estate import Tls
from tests.support.approval_policy import approval_policy
from tests.support.browser import artifact_dir, chromium_page
from tests.support.pki import Issued, TestCA

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("browser")]

PROPOSER, APPROVER, OTHER_APPROVER = "treasury-workflow", "treasury-lead", "risk-officer"
TARGET = "payout:beneficiary-9 [conceal]and 9,000,000 more[/conceal] <img src=x id=injected>"


@dataclass
class Served:
    executor: Executor
    origin: str
    provider: SyntheticProvider
    principals: BearerPrincipals
    session: aiohttp.ClientSession
    server: Issued
    evidence: MemorySink

    async def call(
        self, method: str, path: str, who: str, body: Any = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {"authorization": f"Bearer {self.principals.token(who)}"}
        async with self.session.request(
            method, self.origin + path, json=body, headers=headers
        ) as response:
            return response.status, await response.json()

    async def propose(self, amount: int, key: str) -> dict[str, Any]:
        body = {
            "proposal": {
                "action": "create_payout",
                "target": TARGET,
                "parameters": {"amountMinor": amount, "currency": "EUR"},
            },
            "idempotency_key": key,
        }
        status, held = await self.call("POST", "/v1/actions", PROPOSER, body)
        assert status == 200, held
        assert held["outcome"] == "ESCALATE_PENDING"
        return dict(held["escalation"])

    async def resume(self, escalation: dict[str, Any]) -> dict[str, Any]:
        status, answer = await self.call(
            "POST", "/v1/escalations", PROPOSER, {"escalation": escalation}
        )
        assert status == 200, answer
        return answer

    async def enrolment_url(self, principal: str) -> str:
        status, issued = await self.call(
            "POST",
            f"/v1/control/approvers/{principal}/enrolment-tokens",
            APPROVERS_OPERATOR_ID,
            {},
        )
        assert status == 201, issued
        return str(issued["enrolment_url"])


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    provider = SyntheticProvider()
    await provider.start()
    principals = BearerPrincipals(approvers_operator=True)
    workspace = Workspace(tmp_path / "ws")
    port = free_port()
    origin = f"https://localhost:{port}"
    env = workspace.environment(
        provider_url=provider.base_url,
        port=port,
        policy_file=approval_policy(tmp_path / "policy.yaml", "WEBAUTHN"),
    )
    env = principals_env(
        env,
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_ESCALATION="APPROVAL",
        EXECUTOR_APPROVAL_ORIGIN=origin,
        # The longest intent life: a browser on a loaded machine must not outlive the intent.
        EXECUTOR_INTENT_TTL_SECONDS="300",
    )
    ca = TestCA("agentsafe approval page test CA")
    tls = Tls.make(workspace, ca=ca)
    env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
    env["EXECUTOR_TLS_CERT_FILE"] = str(tls.cert_file)
    env["EXECUTOR_TLS_KEY_FILE"] = str(tls.key_file)
    evidence = MemorySink()
    executor = await assemble(env, streams=Streams(evidence=evidence, security=MemorySink()))
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx))
    try:
        await executor.reconcile_at_start()
        await executor.listen()
        yield Served(executor, origin, provider, principals, session, tls.server, evidence)
    finally:
        await session.close()
        await executor.close()
        await provider.stop()


async def sign_in(page: Any, url: str, credential: str) -> None:
    await page.goto(url)
    await page.fill("#credential", credential)
    await page.click("#signin-button")


async def status_text(page: Any, contains: str) -> str:
    locator = page.locator("#status")
    await locator.filter(has_text=contains).wait_for(timeout=15_000)
    return str(await locator.text_content())


async def enrol(page: Any, served: Served, shots: Path) -> None:
    await sign_in(page, await served.enrolment_url(APPROVER), served.principals.token(APPROVER))
    await status_text(page, "Signed in")
    await page.click("#register")
    await status_text(page, "Passkey registered for treasury-lead")
    await page.screenshot(path=str(shots / "1-enrolled.png"), full_page=True)


async def test_enrol_see_the_exact_intent_approve_and_it_executes_once(served: Served) -> None:
    shots = artifact_dir("approve")
    async with chromium_page(served.server.cert) as page:
        errors: list[str] = []  # a CSP violation is reported as a console error
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        await enrol(page, served, shots)
        escalation = await served.propose(20000, "page-approve")
        assert escalation["approval_url"] == (f"{served.origin}/approve/{escalation['request_id']}")
        await sign_in(page, escalation["approval_url"], served.principals.token(APPROVER))
        await status_text(page, "Signed in")
        # The agent's text is shown literally: markup neither hides nor renders.
        assert await page.text_content("#f-target") == inert_value(TARGET)
        assert "[conceal]and 9,000,000 more[/conceal]" in str(await page.text_content("#f-target"))
        assert await page.locator("#injected").count() == 0
        assert await page.locator("img").count() == 0
        assert await page.text_content("#f-amount") == "200.00 EUR"
        assert await page.text_content("#f-rule") == "medium"
        assert await page.text_content("#f-hash") == sha256_digest(escalation["intent"])
        assert await page.text_content("#f-intent") == inert_json(escalation["intent"])
        assert await page.text_content("#f-verification") == "WEBAUTHN (you have 1 passkey(s))"
        await page.screenshot(path=str(shots / "2-pending.png"), full_page=True)

        assert served.provider.received == []
        await page.fill("#reason", "matches invoice 4711")
        await page.click("#approve")
        text = await status_text(page, "APPROVED")
        assert text == "APPROVED by treasury-lead (WEBAUTHN)"
        await page.screenshot(path=str(shots / "3-approved.png"), full_page=True)
        assert errors == []
        async with served.session.get(escalation["approval_url"]) as response:
            csp = response.headers["Content-Security-Policy"]
            assert response.headers["X-Frame-Options"] == "DENY"
        assert csp.startswith("default-src 'none'; script-src 'nonce-")
        assert "'unsafe-inline'" not in csp
        assert "frame-ancestors 'none'" in csp

    done = await served.resume(escalation)
    assert (done["verdict"], done["outcome"], done["executed"]) == ("ALLOW", "COMPLETED", True)
    assert "APPROVED_BY_APPROVER" in done["reason_codes"]
    assert len(served.provider.received) == 1
    again = await served.resume(escalation)
    assert again["replayed"] is True
    assert len(served.provider.received) == 1
    decided = [f for e, f in served.evidence.events if e == "APPROVAL_DECIDED"]
    assert decided[-1]["verification"] == "WEBAUTHN"


async def test_deny_with_the_passkey_blocks(served: Served) -> None:
    shots = artifact_dir("deny")
    async with chromium_page(served.server.cert) as page:
        await enrol(page, served, shots)
        escalation = await served.propose(30000, "page-deny")
        await sign_in(page, escalation["approval_url"], served.principals.token(APPROVER))
        await status_text(page, "Signed in")
        await page.fill("#reason", "beneficiary not on the approved list")
        await page.click("#deny")
        assert await status_text(page, "DENIED") == "DENIED by treasury-lead (WEBAUTHN)"
        assert await page.locator("#decide").is_hidden()
        await page.screenshot(path=str(shots / "2-denied.png"), full_page=True)
    answer = await served.resume(escalation)
    assert (answer["verdict"], answer["reason_codes"]) == ("BLOCK", ["APPROVAL_DENIED"])
    assert served.provider.received == []


async def test_an_approver_the_rule_does_not_name_sees_and_decides_nothing(
    served: Served,
) -> None:
    shots = artifact_dir("other-approver")
    escalation = await served.propose(20000, "page-other")
    async with chromium_page(served.server.cert) as page:
        await sign_in(page, escalation["approval_url"], served.principals.token(OTHER_APPROVER))
        text = await status_text(page, "Refused")
        assert text.startswith("Refused: APPROVAL_NOT_FOUND")
        assert await page.locator("#request").is_hidden()
        assert await page.locator("#f-target").text_content() == ""
        assert await page.locator("#signin").is_visible()  # another credential may be tried
        await page.screenshot(path=str(shots / "1-refused.png"), full_page=True)
    status, refused = await served.call(
        "POST",
        f"/v1/approvals/{escalation['request_id']}",
        OTHER_APPROVER,
        {"decision": "APPROVE", "reason": "not mine"},
    )
    assert (status, refused["error"]["code"]) == (404, "APPROVAL_NOT_FOUND")
    assert (await served.resume(escalation))["outcome"] == "ESCALATE_PENDING"


# In the page, as the approver: an assertion made for request A presented to decide request B.
_CROSS = """
async ([credential, a, b]) => {
  const call = async (path, body) => {
    const r = await fetch(path, {method: "POST", body: JSON.stringify(body), headers: {
      "content-type": "application/json", authorization: "Bearer " + credential}});
    return [r.status, await r.json()];
  };
  const sign = async (id) => {
    const [, ch] = await call("/v1/approvals/" + id + "/challenge", {decision: "APPROVE"});
    const options = PublicKeyCredential.parseRequestOptionsFromJSON(ch.publicKey);
    const assertion = await navigator.credentials.get({publicKey: options});
    return {token: ch.challenge_token, credential: assertion.toJSON()};
  };
  const forA = await sign(a);
  const forB = await sign(b);
  const decideB = (answer) => call("/v1/approvals/" + b, {
    decision: "APPROVE", reason: "cross", webauthn: answer});
  return {
    tokenOfA: await decideB({challenge_token: forA.token, credential: forA.credential}),
    assertionOfA: await decideB({challenge_token: forB.token, credential: forA.credential}),
    own: await decideB({challenge_token: forB.token, credential: forB.credential}),
  };
}
"""


async def test_an_assertion_made_for_another_intent_is_refused(served: Served) -> None:
    shots = artifact_dir("wrong-intent")
    async with chromium_page(served.server.cert) as page:
        await enrol(page, served, shots)
        first = await served.propose(20000, "page-a")
        second = await served.propose(25000, "page-b")
        await sign_in(page, second["approval_url"], served.principals.token(APPROVER))
        await status_text(page, "Signed in")
        results = await page.evaluate(
            _CROSS,
            [served.principals.token(APPROVER), first["request_id"], second["request_id"]],
        )
        await page.screenshot(path=str(shots / "2-cross.png"), full_page=True)
    status, body = results["tokenOfA"]
    assert (status, body["error"]["code"]) == (403, "WEBAUTHN_CHALLENGE_INVALID")
    status, body = results["assertionOfA"]
    assert (status, body["error"]["code"]) == (403, "WEBAUTHN_ASSERTION_INVALID")
    # B's own assertion (answered after the refusals) still decides B, and only B.
    status, body = results["own"]
    assert (status, body["state"]) == (200, "APPROVED")
    assert (await served.resume(first))["outcome"] == "ESCALATE_PENDING"
    assert (await served.resume(second))["outcome"] == "COMPLETED"
    assert len(served.provider.received) == 1


async def test_invisible_characters_and_look_alikes_are_shown_escaped_and_marked(
    served: Served,
) -> None:
    """Issue 30, items 9 and 10: in the browser, no invisible character or look-alike is raw."""
    shots = artifact_dir("look-alikes")
    invisible = "\u3164\u115f\u1160\uffa0\u034f\ufe0f\U000e0100\u2800"
    target = "p\u0430yout:beneficiary-1" + invisible
    body = {
        "proposal": {
            "action": "create_payout",
            "target": target,
            "parameters": {"amountMinor": 20000, "currency": "EUR"},
        },
        "idempotency_key": "page-look-alikes",
    }
    status, held = await served.call("POST", "/v1/actions", PROPOSER, body)
    assert status == 200, held
    escalation = held["escalation"]
    async with chromium_page(served.server.cert) as page:
        await sign_in(page, escalation["approval_url"], served.principals.token(APPROVER))
        await status_text(page, "Signed in")
        shown = str(await page.text_content("#f-target"))
        assert shown == (
            '"p\\u0430yout:beneficiary-1\\u3164\\u115f\\u1160\\uffa0\\u034f\\ufe0f'
            '\\udb40\\udd00\\u2800"'
        )
        assert await page.locator("#warnings").is_visible()
        warnings = await page.locator("#f-warnings li").all_text_contents()
        assert any("mixed scripts: Cyrillic, Latin" in w for w in warnings), warnings
        assert any("U+0430 CYRILLIC SMALL LETTER A" in w for w in warnings), warnings
        whole = str(await page.text_content("body"))
        assert not any(ch in whole for ch in invisible + "\u0430")
        await page.screenshot(path=str(shots / "1-marked.png"), full_page=True)
