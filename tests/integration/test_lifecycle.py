"""The whole action lifecycle against a real loopback provider: every outcome and error code."""

from __future__ import annotations

import asyncio
import copy
import time

import pytest

from agentsafe.executor.clock import ManualClock, parse_ms
from agentsafe.executor.host.halt import HaltCause
from agentsafe.executor.tools.harness import wait_until

from .conftest import Factory

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


async def test_allow_executes_once_with_the_bound_headers(running: Factory) -> None:
    run = await running()
    status, body = await run.propose(5000, key="payout-1")
    assert status == 200
    assert body["verdict"] == "ALLOW"
    assert body["outcome"] == "COMPLETED"
    assert body["executed"] is True
    assert body["replayed"] is False
    assert body["finalization"] == "RECORDED"
    assert body["result"]["status"] == 202
    assert set(body["authorization"]) == {"decision_id", "dossier_id", "grant_id", "expires_at"}
    [received] = run.provider.received
    headers = {k.lower(): v for k, v in received.headers.items()}
    assert headers["idempotency-key"] == "payout-1"
    assert headers["x-agent-safe-intent-hash"] == body["intent_hash"]
    assert headers["x-agent-safe-dossier-id"] == body["dossier_id"]
    assert headers["x-agent-safe-grant-id"] == body["authorization"]["grant_id"]
    assert headers["authorization"] == run.workspace.downstream_credential
    # The grant itself never leaves the process.
    assert "grant" not in body["authorization"]
    events = [name for name, _ in run.evidence.events]
    for expected in ("PROPOSAL_RECEIVED", "DECISION", "GRANT_CLAIMED", "DISPATCH", "OUTCOME"):
        assert expected in events


async def test_same_key_replays_and_executes_nothing(running: Factory) -> None:
    run = await running()
    _, first = await run.propose(5000, key="payout-1")
    status, again = await run.propose(5000, key="payout-1")
    assert status == 200
    assert again["replayed"] is True
    assert again["intent_id"] == first["intent_id"]
    assert len(run.provider.received) == 1


async def test_same_key_with_another_payload_conflicts(running: Factory) -> None:
    run = await running()
    await run.propose(5000, key="payout-1")
    status, body = await run.propose(4000, key="payout-1")
    assert status == 409
    assert body["error"]["code"] == "IDEMPOTENCY_KEY_CONFLICT"
    assert len(run.provider.received) == 1


@pytest.mark.slow  # waits out the 3 s downstream timeout
async def test_key_in_flight_is_refused(running: Factory) -> None:
    run = await running(DOWNSTREAM_TIMEOUT_MS="3000")
    run.provider.set_mode("hang")
    first = asyncio.ensure_future(run.propose(5000, key="slow"))
    await wait_until(
        lambda: asyncio.sleep(0, result=len(run.provider.received) == 1),
        timeout=10,
        what="the provider to receive",
    )
    status, body = await run.propose(5000, key="slow")
    assert status == 409
    assert body["error"]["code"] == "IDEMPOTENCY_IN_PROGRESS"
    _, answer = await first
    assert answer["outcome"] == "UNKNOWN_AFTER_DISPATCH"


async def test_over_policy_is_blocked(running: Factory) -> None:
    run = await running()
    status, body = await run.propose(900000, key="big")
    assert status == 200
    assert body["verdict"] == "BLOCK"
    assert body["outcome"] == "BLOCKED"
    assert body["executed"] is False
    assert body["authorization"] is None
    assert "AMOUNT_ABOVE_POLICY" in body["reason_codes"]
    assert run.provider.received == []


async def test_escalation_is_held(running: Factory) -> None:
    run = await running()
    status, body = await run.propose(20000, key="medium")
    assert status == 200
    assert body["verdict"] == "ESCALATE"
    assert body["outcome"] == "ESCALATE_PENDING"
    assert body["executed"] is False
    assert run.provider.received == []
    status, answer, _ = await run.post("/v1/escalations", {"escalation": {"intent": {}}})
    assert status == 409
    assert answer["error"]["code"] == "ESCALATION_NOT_CONFIGURED"


async def test_parameters_outside_the_schema_are_blocked(running: Factory) -> None:
    run = await running()
    status, body = await run.propose(5000, key="bad-currency", currency="usd")
    assert status == 200
    assert body["verdict"] == "BLOCK"
    assert "PARAMETERS_INVALID" in body["reason_codes"]
    assert run.provider.received == []


async def test_unregistered_action_is_refused_before_the_authority(running: Factory) -> None:
    run = await running()
    status, body = await run.propose(5000, key="x", action="delete_everything")
    assert status == 422
    assert body["error"]["code"] == "ACTION_NOT_REGISTERED"
    assert "DECISION" not in [name for name, _ in run.evidence.events]


async def test_provider_refusal_is_definitely_not_executed(running: Factory) -> None:
    run = await running()
    run.provider.set_mode("refuse")
    status, body = await run.propose(5000, key="refused")
    assert status == 200
    assert body["outcome"] == "DEFINITELY_NOT_EXECUTED"
    assert body["executed"] is False
    assert "INSUFFICIENT_FUNDS" in body["reason_codes"]
    assert body["result"] is None


async def test_provider_error_is_unknown_then_reconciled_not_executed(running: Factory) -> None:
    clock = ManualClock(start=time.time())
    run = await running(clock=clock)
    run.provider.set_mode("error")
    _, body = await run.propose(5000, key="err")
    assert body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    assert body["executed"] is None
    recovery = body["recovery"]
    assert recovery["intent"]["idempotency_key"] == "err"
    # While the grant lives (plus the dispatch deadline) the dispatch could still land: the
    # provider's "not found" is not taken for "not executed".
    status, early, _ = await run.post("/v1/reconciliations", {"recovery": recovery})
    assert status == 200
    assert (early["status"], early["executed"]) == ("UNKNOWN", None)
    assert early["reason_codes"] == ["RECONCILE_TOO_EARLY"]
    _, replay = await run.propose(5000, key="err")
    assert (replay["replayed"], replay["outcome"]) == (True, "UNKNOWN_AFTER_DISPATCH")
    expires = parse_ms(body["authorization"]["expires_at"])
    clock.advance(expires - clock.now() + 10.5)  # past the expiry plus DOWNSTREAM_TIMEOUT_MS
    status, answer, _ = await run.post("/v1/reconciliations", {"recovery": recovery})
    assert status == 200
    assert answer["status"] == "NOT_EXECUTED"
    assert answer["executed"] is False
    assert len(run.provider.received) == 1
    # The key's replay now says what the provider did.
    _, replay = await run.propose(5000, key="err")
    assert replay["replayed"] is True
    assert replay["outcome"] == "DEFINITELY_NOT_EXECUTED"
    assert replay["reason_codes"] == ["RECONCILED_NOT_EXECUTED"]
    assert len(run.provider.received) == 1


async def test_reset_after_sending_is_unknown_then_reconciled_completed(running: Factory) -> None:
    run = await running()
    run.provider.set_mode("reset")
    _, body = await run.propose(5000, key="reset")
    assert body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    status, answer, _ = await run.post("/v1/reconciliations", {"recovery": body["recovery"]})
    assert status == 200
    assert answer["status"] == "COMPLETED"
    assert answer["executed"] is True
    assert len(run.provider.received) == 1


async def test_timeout_is_unknown(running: Factory) -> None:
    run = await running(DOWNSTREAM_TIMEOUT_MS="300")
    run.provider.set_mode("hang")
    _, body = await run.propose(5000, key="hang")
    assert body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    assert body["recovery"] is not None


async def test_changed_intent_in_a_recovery_is_refused(running: Factory) -> None:
    run = await running()
    run.provider.set_mode("error")
    _, body = await run.propose(5000, key="err")
    recovery = copy.deepcopy(body["recovery"])
    recovery["intent"]["action"]["parameters"]["amountMinor"] = 1
    status, answer, _ = await run.post("/v1/reconciliations", {"recovery": recovery})
    assert status == 409
    assert answer["error"]["code"] == "RECOVERY_BINDING_MISMATCH"
    forged = copy.deepcopy(body["recovery"])
    forged["reference"] = forged["reference"][:-4] + "AAAA"
    status, answer, _ = await run.post("/v1/reconciliations", {"recovery": forged})
    assert status == 409
    assert answer["error"]["code"] == "RECOVERY_BINDING_MISMATCH"


async def test_shadow_never_executes(running: Factory) -> None:
    run = await running(mode="SHADOW")
    for amount, key in ((5000, "a"), (900000, "b"), (20000, "c")):
        status, body = await run.propose(amount, key=key)
        assert status == 200
        assert body["mode"] == "SHADOW"
        assert body["executed"] is False
        assert body["authorization"] is None
        assert body["outcome"] == "OBSERVED"
    assert run.provider.received == []
    report = run.executor.shadow.as_dict()
    assert report["total"] == 3


async def test_host_ceilings_refuse_before_the_authority(running: Factory) -> None:
    run = await running(
        EXECUTOR_HARD_LIMIT_SINGLE_MINOR="USD:4000,EUR:100000",
        EXECUTOR_HARD_LIMIT_WINDOW_SECONDS="60",
        EXECUTOR_HARD_LIMIT_WINDOW_COUNT="1",
    )
    status, body = await run.propose(4500, key="over")
    assert status == 422
    assert body["error"]["code"] == "HARD_LIMIT_EXCEEDED"
    status, body = await run.propose(100, key="chf", currency="CHF")
    assert status == 422
    assert body["error"]["code"] == "HARD_LIMIT_CURRENCY_UNKNOWN"
    status, body = await run.propose(None, key="half")
    assert status == 422
    assert body["error"]["code"] == "HARD_LIMIT_AMOUNT_INVALID"
    status, body = await run.propose(100, key="first")
    assert body["outcome"] == "COMPLETED"
    status, body = await run.propose(100, key="second")
    assert status == 422
    assert body["error"]["code"] == "HARD_LIMIT_WINDOW_COUNT_EXCEEDED"
    assert len(run.provider.received) == 1
    # A refused key is not recorded as an answer: it may be retried.
    status, body = await run.propose(4500, key="over")
    assert body["error"]["code"] == "HARD_LIMIT_EXCEEDED"
    # Three capitals are not a currency: ISO 4217 (the iso4217 package) must list it.
    status, body = await run.propose(100, key="abc", currency="ABC")
    assert status == 422
    assert body["error"]["code"] == "HARD_LIMIT_CURRENCY_UNKNOWN"
    # Every refusal is one evidence line and one count.
    refusals = [line["code"] for line in run.evidence.named("CEILING_REFUSED")]
    assert refusals == [
        "HARD_LIMIT_EXCEEDED",
        "HARD_LIMIT_CURRENCY_UNKNOWN",
        "HARD_LIMIT_AMOUNT_INVALID",
        "HARD_LIMIT_WINDOW_COUNT_EXCEEDED",
        "HARD_LIMIT_EXCEEDED",
        "HARD_LIMIT_CURRENCY_UNKNOWN",
    ]
    counted = run.executor.metrics.ceiling_refusals
    assert counted.value(code="HARD_LIMIT_EXCEEDED") == 2
    assert counted.value(code="HARD_LIMIT_CURRENCY_UNKNOWN") == 2
    assert counted.value(code="HARD_LIMIT_WINDOW_COUNT_EXCEEDED") == 1


async def test_a_journal_that_cannot_take_the_attempt_fails_before_dispatch(
    running: Factory,
) -> None:
    run = await running()
    assert run.executor.journal is not None
    await run.executor.journal.close()
    status, body = await run.propose(5000, key="nojournal")
    assert status == 200
    assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
    assert body["executed"] is False
    assert run.provider.received == []


# ----------------------------------------------------------------------------- the HTTP surface


async def test_every_response_carries_the_security_headers(running: Factory) -> None:
    run = await running()
    for method, path in (("GET", "/health"), ("GET", "/nope"), ("POST", "/v1/actions")):
        async with run.session.request(method, run.url + path) as response:
            for header, value in SECURITY_HEADERS.items():
                assert response.headers.get(header) == value, (path, header)


@pytest.mark.parametrize(
    ("token", "code"),
    [(None, "AUTH_REQUIRED"), ("wrong-token", "AUTH_FAILED")],
)
async def test_callers_must_present_the_caller_token(
    running: Factory, token: str | None, code: str
) -> None:
    run = await running()
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    async with run.session.post(run.url + "/v1/actions", json={}, headers=headers) as response:
        assert response.status == 401
        body = await response.json()
    assert body["error"]["code"] == code
    assert run.provider.received == []


async def test_body_refusals_echo_nothing(running: Factory) -> None:
    run = await running()
    auth = {"authorization": f"Bearer {run.token}"}
    big = {
        "proposal": {"action": "create_payout", "target": "x", "parameters": {"p": "a" * 110_000}}
    }
    async with run.session.post(run.url + "/v1/actions", json=big, headers=auth) as response:
        assert response.status == 413
    async with run.session.post(
        run.url + "/v1/actions", data="secret-text", headers={**auth, "content-type": "text/plain"}
    ) as response:
        assert response.status == 415
        assert "secret-text" not in await response.text()
    async with run.session.post(
        run.url + "/v1/actions",
        data="{not json SECRET",
        headers={**auth, "content-type": "application/json"},
    ) as response:
        assert response.status == 400
        text = await response.text()
        assert "SECRET" not in text
        assert '"REQUEST_MALFORMED"' in text
    # A JSON bound (here an array's length) is the same REQUEST_TOO_LARGE as the byte limit,
    # with the same status: one code, one status (executor/codes.py).
    wide = {
        "proposal": {"action": "create_payout", "target": "x", "parameters": {"p": [0] * 1001}},
        "idempotency_key": "wide-1",
    }
    async with run.session.post(run.url + "/v1/actions", json=wide, headers=auth) as response:
        assert response.status == 413
        assert (await response.json())["error"]["code"] == "REQUEST_TOO_LARGE"
    assert run.provider.received == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"proposal": {}, "proposal": {}}', "a key appears twice in one object"),
        ('{"n": NaN}', "numbers must be finite"),
        ('{"n": -Infinity}', "numbers must be finite"),
        ('{"n": 1e999}', "numbers must be finite"),
        ('{"n": ' + "7" * 5000 + "}", "an integer is outside the exact range"),
    ],
)
async def test_bodies_that_are_not_i_json_are_invalid(
    running: Factory, text: str, message: str
) -> None:
    run = await running()
    async with run.session.post(
        run.url + "/v1/actions",
        data=text,
        headers={"authorization": f"Bearer {run.token}", "content-type": "application/json"},
    ) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"] == {"code": "REQUEST_INVALID", "message": message}
    assert run.provider.received == []


@pytest.mark.parametrize("field", ["tenant_id", "actor", "credentials", "SNEAKY_FIELD"])
async def test_request_may_not_supply_identity_or_unknown_fields(
    running: Factory, field: str
) -> None:
    run = await running()
    body = {
        "proposal": {"action": "create_payout", "target": "t", "parameters": {}},
        "idempotency_key": "k",
        field: "x",
    }
    status, answer, _ = await run.post("/v1/actions", body)
    assert status == 400
    assert answer["error"]["code"] == "REQUEST_INVALID"
    assert field not in answer["error"]["message"]


async def test_anonymous_ready_says_only_ready_and_a_code(running: Factory) -> None:
    """A bank's probe port is reachable by more than its kubelet: anonymous /ready never names
    the mode, the actions or the counts (issue 22); an OPERATOR reads them in the status."""
    run = await running()
    async with run.session.get(run.url + "/ready") as response:
        assert response.status == 200
        body = await response.json()
    assert body == {"ready": True, "code": "READY"}
    details = (await run.executor.status())["readiness"]
    assert details["mode"] == "ENFORCEMENT"
    assert details["actions"] == ["create_payout"]
    assert (details["unknown_attempts"], details["code"]) == (0, "READY")


async def test_ready_names_why_it_is_not(running: Factory) -> None:
    run = await running()
    run.executor.halt.halt(HaltCause.OPERATOR, reason="drill", by="test")
    async with run.session.get(run.url + "/ready") as response:
        assert response.status == 503
        assert await response.json() == {"ready": False, "code": "EXECUTOR_HALTED"}


async def test_grant_jwks_is_published(running: Factory) -> None:
    run = await running()
    async with run.session.get(run.url + "/.well-known/agentsafe-grant-jwks.json") as response:
        assert response.status == 200
        jwks = await response.json()
    [key] = jwks["keys"]
    assert key["kty"] == "OKP"
    assert key["crv"] == "Ed25519"
    assert "d" not in key


@pytest.mark.parametrize("key", ["a/b", "50%", "-leading", "spa ce", "x" * 256])
async def test_idempotency_keys_are_url_safe_tokens(running: Factory, key: str) -> None:
    run = await running()
    status, body = await run.propose(100, key=key)
    assert status == 400
    assert body["error"]["code"] == "REQUEST_INVALID"
    assert "idempotency_key" in body["error"]["message"]
    assert run.provider.received == []
