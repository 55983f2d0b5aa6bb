"""The operator's control routes and ``/metrics`` over real sockets, in principals-file mode.

Status (mode, actions, principals by id and role, the halt, the posture), halt and resume with
reasons, open attempts after a provider error, the secret reload's report (files, never values)
and the OpenMetrics exposition with fixed label names. Every operator action is one
``OPERATOR_ACTION`` line naming the principal and the action.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agentsafe.executor.clock import ManualClock, parse_ms

from .estate import (
    Estate,
    Starter,
    estates,
)

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Starter]:
    async with estates(tmp_path) as starter:
        yield starter


def _operator_actions(estate: Estate) -> list[dict[str, Any]]:
    return estate.security.named("OPERATOR_ACTION")


# ----------------------------------------------------------------------------- status


async def test_status_reports_mode_actions_principals_halt_and_posture(start: Starter) -> None:
    estate = await start()
    reply = await estate.client.get("/v1/control/status", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    status = reply.body
    assert status["mode"] == "ENFORCEMENT"
    assert status["actions"] == ["create_payout"]
    assert [(p["id"], p["role"]) for p in status["principals"]] == [
        ("agent", "PROPOSER"),
        ("other", "PROPOSER"),
        ("workload-agent", "PROPOSER"),
        ("ops", "OPERATOR"),
        ("watcher", "OPERATOR"),
        ("oncall", "OPERATOR"),
        ("auditor", "OPERATOR"),
    ]
    assert status["halt"]["halted"] is False
    assert status["halt"]["causes"] == []
    assert status["posture"]["mode"] == "DEVELOPMENT"
    assert status["posture"]["checks"]
    # Principals by id and role only: no credential material of any kind.
    for bearer in (estate.cast.agent, estate.cast.other, estate.cast.ops, estate.cast.watcher):
        assert bearer.token not in reply.text
        assert bearer.sha256 not in reply.text
    assert "token_sha256" not in reply.text
    assert _operator_actions(estate) == [{"principal": "ops", "action": "status"}]
    assert estate.executor.metrics.operator_actions.value(action="status") == 1


async def test_status_reports_the_open_attempts(start: Starter) -> None:
    estate = await start()
    estate.provider.set_mode("error")
    reply = await estate.client.propose(estate.cast.agent.token, key="err")
    assert reply.body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    status = (await estate.client.get("/v1/control/status", token=estate.cast.ops.token)).body
    [attempt] = status["open_attempts"]
    assert attempt["state"] == "UNKNOWN"
    assert attempt["intent_id"] == reply.body["intent_id"]
    assert attempt["principal"] == "agent"


# ----------------------------------------------------------------------------- halt and resume


async def test_halt_and_resume_carry_their_reasons(start: Starter) -> None:
    estate = await start()
    ops = estate.cast.ops.token
    reply = await estate.client.post("/v1/control/halt", {"reason": "card\ntesting\x07"}, token=ops)
    assert reply.status == 200, reply.text
    [cause] = reply.body["causes"]
    assert (cause["cause"], cause["reason"], cause["by"]) == ("OPERATOR", "card testing", "ops")
    assert reply.body["halted"] is True
    assert estate.security.named("HALTED") == [
        {"cause": "OPERATOR", "reason": "card testing", "by": "ops"}
    ]
    status = (await estate.client.get("/v1/control/status", token=ops)).body
    assert status["halt"]["halted"] is True
    assert status["halt"]["causes"][0]["by"] == "ops"

    reply = await estate.client.post("/v1/control/resume", {"reason": "contained"}, token=ops)
    assert reply.status == 200, reply.text
    assert reply.body["halted"] is False
    assert estate.security.named("RESUMED") == [
        {"reason": "contained", "by": "ops", "causes": ["OPERATOR"]}
    ]
    assert _operator_actions(estate) == [
        {"principal": "ops", "action": "halt"},
        {"principal": "ops", "action": "status"},
        {"principal": "ops", "action": "resume"},
    ]
    assert (await estate.client.propose(estate.cast.agent.token, key="after")).status == 200


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({}, 400, "REQUEST_INVALID"),
        ({"reason": ""}, 400, "REQUEST_INVALID"),
        ({"reason": "x" * 501}, 400, "REQUEST_INVALID"),
        ({"reason": "ok", "SNEAKY": "SECRETMARK"}, 400, "REQUEST_INVALID"),
        ({"reason": "  \n\t "}, 422, "REASON_REQUIRED"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/control/halt", "/v1/control/resume"])
async def test_halt_and_resume_need_a_reason(
    start: Starter, route: str, body: dict[str, Any], status: int, code: str
) -> None:
    estate = await start()
    reply = await estate.client.post(route, body, token=estate.cast.ops.token)
    assert (reply.status, reply.code) == (status, code), reply.text
    assert "SECRETMARK" not in reply.text
    assert "SNEAKY" not in reply.text
    assert estate.executor.halt.halted is False
    assert estate.security.named("HALTED") == []
    assert _operator_actions(estate) == []


# ----------------------------------------------------------------------------- open attempts


async def test_open_attempts_lists_an_attempt_whose_outcome_is_unknown(start: Starter) -> None:
    clock = ManualClock(start=time.time())
    estate = await start(clock=clock)
    ops = estate.cast.ops.token
    reply = await estate.client.get("/v1/control/open-attempts", token=ops)
    assert reply.status == 200, reply.text
    assert reply.body == {"open_attempts": []}

    estate.provider.set_mode("error")
    answer = (await estate.client.propose(estate.cast.agent.token, key="err-SECRETMARK")).body
    assert answer["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    reply = await estate.client.get("/v1/control/open-attempts", token=ops)
    assert reply.status == 200, reply.text
    [attempt] = reply.body["open_attempts"]
    assert attempt["state"] == "UNKNOWN"
    assert attempt["grant_claimed"] is True
    assert attempt["principal"] == "agent"
    assert attempt["action"] == "create_payout"
    assert attempt["intent_id"] == answer["intent_id"]
    assert attempt["intent_hash"] == answer["intent_hash"]
    assert attempt["grant_id"] == answer["authorization"]["grant_id"]
    # Identifiers only: neither the parameters nor the key travel to the operator.
    assert "SECRETMARK" not in reply.text
    assert "amountMinor" not in reply.text
    assert _operator_actions(estate)[-1] == {"principal": "ops", "action": "open-attempts"}

    # The caller reconciles while the grant still lives: the provider's "not found" may lag
    # its commit, so the outcome stays unknown and the attempt stays open.
    reconciled = await estate.client.post(
        "/v1/reconciliations", {"recovery": answer["recovery"]}, token=estate.cast.agent.token
    )
    assert reconciled.body["status"] == "UNKNOWN"
    assert reconciled.body["reason_codes"] == ["RECONCILE_TOO_EARLY"]
    reply = await estate.client.get("/v1/control/open-attempts", token=ops)
    assert [a["attempt_id"] for a in reply.body["open_attempts"]] == [attempt["attempt_id"]]
    # Past the grant's expiry plus the dispatch deadline: not executed, and no longer open.
    expires = parse_ms(answer["authorization"]["expires_at"])
    clock.advance(expires - clock.now() + 10.5)
    reconciled = await estate.client.post(
        "/v1/reconciliations", {"recovery": answer["recovery"]}, token=estate.cast.agent.token
    )
    assert reconciled.body["status"] == "NOT_EXECUTED"
    reply = await estate.client.get("/v1/control/open-attempts", token=ops)
    assert reply.body == {"open_attempts": []}


async def test_a_completed_attempt_is_never_open(start: Starter) -> None:
    estate = await start()
    answer = (await estate.client.propose(estate.cast.agent.token, key="fine")).body
    assert answer["outcome"] == "COMPLETED"
    reply = await estate.client.get("/v1/control/open-attempts", token=estate.cast.ops.token)
    assert reply.body == {"open_attempts": []}


# ----------------------------------------------------------------------------- secrets reload


async def test_secrets_reload_names_files_and_never_values(start: Starter) -> None:
    estate = await start()
    tls = estate.tls
    assert tls is not None
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    report = reply.body
    assert set(report) == {"secrets", "principals", "jwks", "tls"}
    files = report["secrets"]["files"]
    assert files["EXECUTOR_TLS_KEY"] == str(tls.key_file)
    assert files["EXECUTOR_AUTHORITY_SIGNING_KEY"] == str(
        estate.workspace.secrets_dir / "authority-signing-key.pem"
    )
    assert report["secrets"]["refused"] == []
    assert report["secrets"]["rotated"] == []
    assert "DOWNSTREAM_CREDENTIAL" in report["secrets"]["not_reloadable"]
    assert report["principals"] == {"file": str(estate.principals_file), "ok": True}
    assert report["jwks"]["file"] == str(estate.jwks.path)
    assert report["tls"]["file"] == str(tls.cert_file)
    values = [
        estate.workspace.downstream_credential,
        (estate.workspace.secrets_dir / "authority-signing-key.pem").read_text().splitlines()[1],
        tls.server.key_pem.decode().splitlines()[1],
        estate.cast.ops.token,
        estate.cast.ops.sha256,
        estate.cast.agent.token,
    ]
    for value in values:
        assert value not in reply.text
    assert "PRIVATE KEY" not in reply.text
    assert _operator_actions(estate) == [{"principal": "ops", "action": "secrets.reload"}]


async def test_an_unchanged_jwks_file_is_reported_ok(start: Starter) -> None:
    estate = await start()
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.body["jwks"] == {"file": str(estate.jwks.path), "ok": True}


async def test_unchanged_tls_material_is_not_reported_rotated(start: Starter) -> None:
    estate = await start()
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.body["tls"]["rotated"] is False
    assert estate.security.named("TLS_CONTEXT_ROTATED") == []


async def test_a_broken_jwks_file_on_reload_keeps_the_last_good_keys(start: Starter) -> None:
    estate = await start()
    token = estate.jwks.token()
    estate.jwks.path.write_text('{"keys": "SECRETMARK"}')
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    assert reply.body["jwks"] == {"file": str(estate.jwks.path), "ok": False}
    assert "SECRETMARK" not in reply.text
    [refused] = estate.security.named("JWKS_RELOAD_REFUSED")
    assert refused["file"] == "EXECUTOR_JWKS_FILE"
    assert "SECRETMARK" not in json.dumps(refused)
    reply = await estate.client.propose(token, key="still-good")
    assert reply.status == 200, reply.text


async def test_a_refused_secret_file_is_named_in_the_report(start: Starter) -> None:
    estate = await start()
    tls = estate.tls
    assert tls is not None
    tls.key_file.chmod(0o644)
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    [refused] = reply.body["secrets"]["refused"]
    assert refused["secret"] == "EXECUTOR_TLS_KEY"
    assert refused["file"] == str(tls.key_file)
    assert refused["code"]
    assert set(refused) == {"secret", "variable", "file", "code"}
    assert tls.server.key_pem.decode().splitlines()[1] not in reply.text
    # The listener keeps serving with the key it has.
    assert (await estate.client.get("/health")).status == 200


# ----------------------------------------------------------------------------- metrics


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _value(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    return sum(v for got, v in samples.get(name, []) if got == labels)


FIXED_LABELS = {
    "agentsafe_proposals_total": {"verdict"},
    "agentsafe_executions_total": {"outcome"},
    "agentsafe_door_refusals_total": {"method", "code"},
    "agentsafe_operator_actions_total": {"action"},
    "agentsafe_halts_total": {"cause"},
    "agentsafe_principals_locked_total": set(),
}


async def test_metrics_count_verdicts_outcomes_refusals_and_operator_actions(
    start: Starter,
) -> None:
    estate = await start()
    client, agent = estate.client, estate.cast.agent.token
    assert (await client.propose(agent, key="allow", amount=5000)).body["outcome"] == "COMPLETED"
    assert (await client.propose(agent, key="block", amount=900000)).body["outcome"] == "BLOCKED"
    assert (await client.propose(agent, key="esc", amount=20000)).body[
        "outcome"
    ] == "ESCALATE_PENDING"
    estate.provider.set_mode("error")
    assert (await client.propose(agent, key="err")).body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    for n in range(5):  # five different unknown tokens: still one series
        await client.propose(f"unknown-SECRETMARK-{n}", key="x")
    await client.get("/v1/control/status")
    await client.get("/v1/control/status", token=agent)
    await client.get("/v1/control/status", token=estate.cast.ops.token)
    await client.post("/v1/control/halt", {"reason": "drill"}, token=estate.cast.ops.token)
    await client.post("/v1/control/resume", {"reason": "drill over"}, token=estate.cast.ops.token)

    reply = await client.get("/metrics", token=estate.cast.watcher.token, headers=OPENMETRICS)
    assert reply.status == 200, reply.text
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    assert reply.text.rstrip().endswith("# EOF")
    samples = _samples(reply.text)

    assert _value(samples, "agentsafe_proposals_total", verdict="ALLOW") == 2
    assert _value(samples, "agentsafe_proposals_total", verdict="BLOCK") == 1
    assert _value(samples, "agentsafe_proposals_total", verdict="ESCALATE") == 1
    assert _value(samples, "agentsafe_executions_total", outcome="COMPLETED") == 1
    assert _value(samples, "agentsafe_executions_total", outcome="BLOCKED") == 1
    assert _value(samples, "agentsafe_executions_total", outcome="ESCALATE_PENDING") == 1
    assert _value(samples, "agentsafe_executions_total", outcome="UNKNOWN_AFTER_DISPATCH") == 1
    assert (
        _value(samples, "agentsafe_door_refusals_total", method="bearer", code="AUTH_FAILED") == 5
    )
    assert (
        _value(samples, "agentsafe_door_refusals_total", method="none", code="AUTH_REQUIRED") == 1
    )
    assert (
        _value(samples, "agentsafe_door_refusals_total", method="bearer", code="ROLE_FORBIDDEN")
        == 1
    )
    assert _value(samples, "agentsafe_operator_actions_total", action="status") == 1
    assert _value(samples, "agentsafe_operator_actions_total", action="halt") == 1
    assert _value(samples, "agentsafe_operator_actions_total", action="resume") == 1
    assert _value(samples, "agentsafe_halts_total", cause="OPERATOR") == 1

    # Fixed label names, and no value from any request in the exposition.
    for name, labels in FIXED_LABELS.items():
        assert name in samples, name
        for got, _ in samples[name]:
            assert set(got) == labels, (name, got)
    assert len(samples["agentsafe_door_refusals_total"]) == 3
    assert "SECRETMARK" not in reply.text
    assert agent not in reply.text
    assert "drill" not in reply.text
    # A scrape is counted, never written as a chained line (it arrives every few seconds).
    assert _operator_actions(estate)[-1] == {"principal": "ops", "action": "resume"}
    assert _value(samples, "agentsafe_metrics_scrapes_total") == 1
    again = _samples(
        (await client.get("/metrics", token=estate.cast.watcher.token, headers=OPENMETRICS)).text
    )
    assert _value(again, "agentsafe_metrics_scrapes_total") == 2
    assert _operator_actions(estate)[-1] == {"principal": "ops", "action": "resume"}
