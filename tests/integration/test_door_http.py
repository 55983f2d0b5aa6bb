"""The door over real sockets, in principals-file mode: every code, one AUTH_FAILED line each.

An in-process executor built by ``assembly.assemble`` from a principals file (BEARER, WORKLOAD_JWT
and MTLS principals, mode 0600, no legacy caller variables) serves TLS with a client CA; workload
tokens are signed with a real key whose JWKS is ``EXECUTOR_JWKS_FILE``. Each refusal is checked
for its status and code, for exactly one AUTH_FAILED line with the method and the code and nothing
else, and for echoing nothing the request carried.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.errors import ConfigError
from tests.support.pki import TokenSigner, unsigned_token

from .estate import (
    ISSUER,
    ONCALL_URI,
    TENANT,
    TWO_ACTION_POLICY,
    WORKLOAD_SUBJECT,
    Cast,
    Estate,
    Starter,
    assert_door_refusal,
    estates,
)


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Starter]:
    async with estates(tmp_path) as starter:
        yield starter


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# ----------------------------------------------------------------------------- start


async def test_legacy_caller_variables_beside_a_principals_file_refuse_to_start(
    start: Starter,
) -> None:
    with pytest.raises(ConfigError) as refused:
        await start(extra={"EXECUTOR_TENANT_ID": TENANT})
    assert refused.value.variable == "EXECUTOR_TENANT_ID"


async def test_a_group_writable_principals_file_refuses_to_start(start: Starter) -> None:
    with pytest.raises(ConfigError) as refused:
        await start(principals_mode=0o620)
    assert refused.value.code == "PRINCIPALS_FILE_MODE"
    assert refused.value.variable == "EXECUTOR_PRINCIPALS_FILE"


# ----------------------------------------------------------------------------- admitted


async def test_each_credential_kind_proves_its_principal(start: Starter) -> None:
    estate = await start()
    client = estate.client
    reply = await client.propose(estate.cast.agent.token, key="by-bearer")
    assert reply.status == 200, reply.text
    assert reply.body["outcome"] == "COMPLETED"
    reply = await client.propose(estate.jwks.token(), key="by-workload")
    assert reply.status == 200, reply.text
    assert reply.body["outcome"] == "COMPLETED"
    callers = [f["caller"] for f in estate.evidence.named("PROPOSAL_RECEIVED")]
    assert callers == ["agent", "workload-agent"]

    assert estate.tls is not None
    oncall = estate.tls.ca.issue_client(ONCALL_URI)
    reply = await client.get("/v1/control/status", cert=oncall)
    assert reply.status == 200, reply.text
    reply = await client.get("/v1/control/status", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    assert [f["principal"] for f in estate.security.named("OPERATOR_ACTION")] == ["oncall", "ops"]
    assert estate.auth_failures() == []
    assert len(estate.provider.received) == 2


# ----------------------------------------------------------------------------- 401


@pytest.mark.parametrize(
    ("authorization", "code", "method"),
    [
        (None, "AUTH_REQUIRED", "none"),
        ("Bearer not-a-known-token-SECRETMARK", "AUTH_FAILED", "bearer"),
        ("Basic dXNlcjpTRUNSRVRNQVJL", "AUTH_FAILED", "bearer"),
        ("Bearer", "AUTH_FAILED", "bearer"),
    ],
)
async def test_missing_or_unknown_credentials_are_401(
    start: Starter, authorization: str | None, code: str, method: str
) -> None:
    estate = await start()
    mark = estate.mark()
    headers = {"Authorization": authorization} if authorization is not None else {}
    reply = await estate.client.request(
        "POST",
        "/v1/actions",
        json_body={
            "proposal": {"action": "create_payout", "target": "t", "parameters": {}},
            "idempotency_key": "k",
        },
        headers=headers,
    )
    assert_door_refusal(
        estate, mark, reply, status=401, code=code, method=method,
        secrets=["SECRETMARK", "dXNlcjpTRUNSRVRNQVJL", "not-a-known-token"],
    )  # fmt: skip
    assert estate.provider.received == []


async def test_a_certificate_and_a_bearer_together_are_ambiguous(start: Starter) -> None:
    estate = await start()
    assert estate.tls is not None
    oncall = estate.tls.ca.issue_client(ONCALL_URI)
    mark = estate.mark()
    reply = await estate.client.get("/v1/control/status", cert=oncall, token=estate.cast.ops.token)
    assert_door_refusal(
        estate, mark, reply, status=401, code="AUTH_AMBIGUOUS", method="mtls",
        secrets=[estate.cast.ops.token, ONCALL_URI, "oncall"],
    )  # fmt: skip
    assert estate.security.named("OPERATOR_ACTION") == []


def _forged(estate: Estate) -> str:
    impostor = TokenSigner("ES256", kid=estate.jwks.signer.kid)
    return impostor.sign(estate.jwks.claims())


def _alg_none(estate: Estate) -> str:
    return unsigned_token({"alg": "none", "typ": "JWT"}, estate.jwks.claims(), b"")


def _hs256_with_public_key(estate: Estate) -> str:
    header = {"alg": "HS256", "typ": "JWT", "kid": estate.jwks.signer.kid}
    head = _b64(json.dumps(header).encode())
    body = _b64(json.dumps(estate.jwks.claims()).encode())
    key = estate.jwks.signer.public_pem()
    mac = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(mac)}"


def _claims(**overrides: Any) -> Any:
    return lambda estate: estate.jwks.token(**overrides)


NOW = int(time.time())

WORKLOAD_REFUSALS = [
    ("forged", _forged, "JWT_SIGNATURE_INVALID"),
    ("alg-none", _alg_none, "JWT_ALGORITHM_REFUSED"),
    ("hs256-public-key", _hs256_with_public_key, "JWT_ALGORITHM_REFUSED"),
    ("expired", _claims(iat=NOW - 7200, exp=NOW - 3600), "JWT_EXPIRED"),
    ("not-yet-valid", _claims(iat=NOW + 3600, exp=NOW + 7200), "JWT_EXPIRED"),
    ("older-than-a-day", _claims(iat=NOW - 90000, exp=NOW + 3600), "JWT_EXPIRED"),
    ("wrong-audience", _claims(aud=["someone-else"]), "JWT_AUDIENCE_MISMATCH"),
    ("another-subject", _claims(sub="system:serviceaccount:agents:intruder"),
     "JWT_SUBJECT_UNKNOWN"),
    ("unknown-issuer", _claims(iss="https://elsewhere.example"), "JWT_ISSUER_UNKNOWN"),
    ("claim-mismatch", _claims(**{"kubernetes.io": {"namespace": "default"}}),
     "JWT_CLAIM_MISMATCH"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "code"),
    [(make, code) for _, make, code in WORKLOAD_REFUSALS],
    ids=[name for name, _, _ in WORKLOAD_REFUSALS],
)
async def test_workload_token_refusals_have_their_own_codes(
    start: Starter, make: Any, code: str
) -> None:
    estate = await start()
    token = make(estate)
    mark = estate.mark()
    reply = await estate.client.propose(token, key="workload")
    segments = token.split(".")
    assert_door_refusal(
        estate, mark, reply, status=401, code=code, method="workload",
        secrets=[token, *[s for s in segments if s], WORKLOAD_SUBJECT, ISSUER, "intruder"],
    )  # fmt: skip
    assert estate.provider.received == []
    # The real token still works: none of these refusals locked the principal by default.
    reply = await estate.client.propose(estate.jwks.token(), key="workload")
    assert reply.status == 200, reply.text


async def test_a_rotated_jwks_file_is_read_again(start: Starter) -> None:
    estate = await start()
    old = estate.jwks.token()
    estate.jwks.signer = TokenSigner("EdDSA", kid="cluster-2")
    estate.jwks.write()
    mark = estate.mark()
    reply = await estate.client.propose(old, key="old-key")
    assert_door_refusal(
        estate, mark, reply, status=401, code="JWT_SIGNATURE_INVALID", method="workload"
    )
    reply = await estate.client.propose(estate.jwks.token(), key="new-key")
    assert reply.status == 200, reply.text
    assert estate.security.named("JWKS_RELOADED") == [{"source": "file", "keys": 1}]


# ----------------------------------------------------------------------------- 423 and 429


async def test_a_proven_principal_is_locked_after_repeated_failures(start: Starter) -> None:
    estate = await start(extra={"EXECUTOR_AUTH_LOCKOUT": "2/60/300"})
    # A genuine token for another audience proves no intent against this executor (anyone it
    # was ever shown to could replay it): it never counts towards the lock (issue 16 item 17).
    for attempt in range(3):
        mark = estate.mark()
        reply = await estate.client.propose(estate.jwks.token(aud=["nope"]), key=f"a{attempt}")
        assert_door_refusal(
            estate, mark, reply, status=401, code="JWT_AUDIENCE_MISMATCH", method="workload"
        )
    assert estate.security.named("PRINCIPAL_LOCKED") == []
    # Nor does a token naming the executor's key whose signature does not verify: a kid is
    # public, so anyone can make one with a key of their own (issue 30, item 20).
    forger = TokenSigner("ES256", kid=estate.jwks.signer.kid)
    for attempt in range(3):
        mark = estate.mark()
        reply = await estate.client.propose(forger.sign(estate.jwks.claims()), key=f"f{attempt}")
        assert_door_refusal(
            estate, mark, reply, status=401, code="JWT_SIGNATURE_INVALID", method="workload"
        )
    assert estate.security.named("PRINCIPAL_LOCKED") == []
    # The proven principal's own authorization refusals do (an operator route, twice).
    good = estate.jwks.token()
    for _ in range(2):
        mark = estate.mark()
        reply = await estate.client.get("/v1/control/status", token=good)
        assert_door_refusal(
            estate, mark, reply, status=403, code="ROLE_FORBIDDEN", method="workload"
        )
    assert estate.security.named("PRINCIPAL_LOCKED") == [
        {"principal": "workload-agent", "lock_seconds": 300}
    ]
    assert estate.executor.metrics.principals_locked.value() == 1
    mark = estate.mark()
    reply = await estate.client.propose(good, key="locked")
    assert_door_refusal(
        estate, mark, reply, status=423, code="PRINCIPAL_LOCKED", method="workload",
        secrets=[good, "workload-agent"],
    )  # fmt: skip
    # The lock names no one to a stranger: an unknown bearer is still just 401.
    mark = estate.mark()
    reply = await estate.client.propose("Bearer-unknown-token", key="stranger")
    assert_door_refusal(estate, mark, reply, status=401, code="AUTH_FAILED", method="bearer")
    # Another principal is untouched.
    reply = await estate.client.propose(estate.cast.agent.token, key="agent")
    assert reply.status == 200, reply.text
    assert [r.idempotency_key for r in estate.provider.received] == ["agent"]


async def test_failed_unauthenticated_attempts_are_rate_limited(start: Starter) -> None:
    estate = await start(extra={"EXECUTOR_RATE_LIMIT_UNAUTHENTICATED": "3/60"})
    for attempt in range(3):
        mark = estate.mark()
        reply = await estate.client.propose(f"guess-{attempt}", key="k")
        assert_door_refusal(estate, mark, reply, status=401, code="AUTH_FAILED", method="bearer")
    mark = estate.mark()
    reply = await estate.client.propose("guess-SECRETMARK", key="k")
    assert_door_refusal(
        estate, mark, reply, status=429, code="RATE_LIMITED", method="bearer",
        secrets=["SECRETMARK"],
    )  # fmt: skip
    retry_after = int(reply.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    mark = estate.mark()
    reply = await estate.client.get("/v1/control/status")
    assert_door_refusal(estate, mark, reply, status=429, code="RATE_LIMITED", method="none")
    # Probes are public and never counted.
    assert (await estate.client.get("/health")).status == 200


async def test_a_principals_own_rate_limit(start: Starter) -> None:
    estate = await start(cast=Cast(agent_rate_limit="2/60"))
    for n in range(2):
        reply = await estate.client.propose(estate.cast.agent.token, key=f"rl-{n}")
        assert reply.status == 200, reply.text
    mark = estate.mark()
    reply = await estate.client.propose(estate.cast.agent.token, key="rl-3")
    assert_door_refusal(
        estate, mark, reply, status=429, code="RATE_LIMITED", method="bearer",
        secrets=[estate.cast.agent.token],
    )  # fmt: skip
    assert 1 <= int(reply.headers["Retry-After"]) <= 60
    assert len(estate.provider.received) == 2
    # Its window is its own.
    reply = await estate.client.propose(estate.cast.other.token, key="other")
    assert reply.status == 200, reply.text


# ----------------------------------------------------------------------------- 403


@pytest.mark.parametrize(
    ("who", "method", "path"),
    [
        ("ops", "POST", "/v1/actions"),
        ("ops", "POST", "/v1/reconciliations"),
        ("agent", "GET", "/v1/control/status"),
        ("agent", "POST", "/v1/control/halt"),
        ("agent", "GET", "/metrics"),
    ],
)
async def test_a_route_for_another_role_is_forbidden(
    start: Starter, who: str, method: str, path: str
) -> None:
    estate = await start()
    token = getattr(estate.cast, who).token
    mark = estate.mark()
    body = {"reason": "SECRETMARK"} if method == "POST" else None
    reply = await estate.client.request(method, path, token=token, json_body=body)
    assert_door_refusal(
        estate, mark, reply, status=403, code="ROLE_FORBIDDEN", method="bearer",
        secrets=[token, "SECRETMARK"],
    )  # fmt: skip
    assert estate.executor.halt.halted is False
    assert estate.security.named("OPERATOR_ACTION") == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/control/halt"),
        ("POST", "/v1/control/resume"),
        ("POST", "/v1/control/secrets/reload"),
        ("POST", "/v1/control/evidence-export"),
    ],
)
async def test_an_operator_without_the_scope_is_forbidden(
    start: Starter, method: str, path: str
) -> None:
    estate = await start()
    token = estate.cast.watcher.token
    mark = estate.mark()
    reply = await estate.client.request(
        method, path, token=token, json_body={"reason": "SECRETMARK"}
    )
    assert_door_refusal(
        estate, mark, reply, status=403, code="SCOPE_FORBIDDEN", method="bearer",
        secrets=[token, "SECRETMARK"],
    )  # fmt: skip
    assert estate.executor.halt.halted is False
    assert estate.security.named("OPERATOR_ACTION") == []
    assert estate.security.named("HALTED") == []
    # What the watcher is scoped for, it may do.
    assert (await estate.client.get("/v1/control/status", token=token)).status == 200
    assert (await estate.client.get("/metrics", token=token)).status == 200


async def test_an_action_outside_the_principals_list_is_refused_before_capture(
    start: Starter,
) -> None:
    estate = await start()
    reply = await estate.client.propose(estate.cast.agent.token, key="x", action="create_refund")
    assert (reply.status, reply.code) == (403, "ACTION_NOT_PERMITTED_FOR_PRINCIPAL")
    assert "create_refund" not in reply.text
    assert estate.cast.agent.token not in reply.text
    assert not {"PROPOSAL_RECEIVED", "DECISION"} & set(estate.evidence_names())
    assert estate.provider.received == []


async def test_an_action_the_policy_has_but_the_principal_may_not_propose(
    start: Starter,
) -> None:
    estate = await start(policy=TWO_ACTION_POLICY, cast=Cast(other_actions=("create_refund",)))
    reply = await estate.client.propose(estate.cast.other.token, key="x", action="create_payout")
    assert (reply.status, reply.code) == (403, "ACTION_NOT_PERMITTED_FOR_PRINCIPAL")
    reply = await estate.client.propose(estate.cast.other.token, key="y", action="create_refund")
    assert reply.status == 200, reply.text
    assert [r.idempotency_key for r in estate.provider.received] == ["y"]


async def test_authorization_refusals_after_the_door_are_auth_failed_lines(
    start: Starter,
) -> None:
    estate = await start()
    mark = estate.mark()
    reply = await estate.client.propose(estate.cast.agent.token, key="x", action="create_refund")
    assert reply.code == "ACTION_NOT_PERMITTED_FOR_PRINCIPAL"
    assert [f for _, f in estate.security_since(mark, "AUTH_FAILED")] == [
        {"method": "bearer", "code": "ACTION_NOT_PERMITTED_FOR_PRINCIPAL"}
    ]
    estate.provider.set_mode("error")
    reply = await estate.client.propose(estate.cast.agent.token, key="err")
    mark = estate.mark()
    reply = await estate.client.post(
        "/v1/reconciliations", {"recovery": reply.body["recovery"]}, token=estate.cast.other.token
    )
    assert reply.code == "INTENT_PRINCIPAL_MISMATCH"
    assert [f for _, f in estate.security_since(mark, "AUTH_FAILED")] == [
        {"method": "bearer", "code": "INTENT_PRINCIPAL_MISMATCH"}
    ]


async def test_a_reconciliation_of_another_principals_intent_is_refused(start: Starter) -> None:
    estate = await start()
    estate.provider.set_mode("reset")  # acts, then drops the connection: the owner learns it
    reply = await estate.client.propose(estate.cast.agent.token, key="err")
    assert reply.body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
    recovery = reply.body["recovery"]
    assert recovery["intent"]["context"]["caller_principal"] == "agent"
    for token in (estate.cast.other.token, estate.jwks.token()):
        reply = await estate.client.post(
            "/v1/reconciliations", {"recovery": copy.deepcopy(recovery)}, token=token
        )
        assert (reply.status, reply.code) == (403, "INTENT_PRINCIPAL_MISMATCH"), reply.text
        assert recovery["reference"] not in reply.text
        assert "err" not in reply.body["error"]["message"]
    assert estate.evidence.named("RECONCILIATION") == []
    reply = await estate.client.post(
        "/v1/reconciliations", {"recovery": recovery}, token=estate.cast.agent.token
    )
    assert reply.status == 200, reply.text
    assert reply.body["status"] == "COMPLETED"


# ----------------------------------------------------------------------------- reload


async def test_a_principal_removed_from_the_file_is_refused_after_reload(start: Starter) -> None:
    estate = await start()
    other = estate.cast.other.token
    assert (await estate.client.propose(other, key="before")).status == 200
    estate.rewrite_principals(Cast(
        agent=estate.cast.agent, other=estate.cast.other, ops=estate.cast.ops,
        watcher=estate.cast.watcher, revoked=frozenset({"other"}),
    ))  # fmt: skip
    # Until the reload, the loaded set stands.
    assert (await estate.client.propose(other, key="still")).status == 200
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    assert reply.body["principals"] == {"file": str(estate.principals_file), "ok": True}
    for secret in (other, estate.cast.other.sha256, estate.cast.ops.token, estate.cast.ops.sha256):
        assert secret not in reply.text
    mark = estate.mark()
    reply = await estate.client.propose(other, key="after")
    assert_door_refusal(
        estate, mark, reply, status=401, code="AUTH_FAILED", method="bearer", secrets=[other]
    )
    assert (await estate.client.propose(estate.cast.agent.token, key="agent")).status == 200
    assert [r.idempotency_key for r in estate.provider.received] == ["before", "still", "agent"]


async def test_an_unusable_principals_file_on_reload_keeps_the_loaded_set(
    start: Starter,
) -> None:
    estate = await start()
    estate.principals_file.write_text("{not json SECRETMARK")
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.status == 200, reply.text
    assert reply.body["principals"] == {"file": str(estate.principals_file), "ok": False}
    assert "SECRETMARK" not in reply.text
    [refused] = estate.security.named("PRINCIPALS_RELOAD_REFUSED")
    assert refused == {"code": "PRINCIPALS_FILE_INVALID", "variable": "EXECUTOR_PRINCIPALS_FILE"}
    assert (await estate.client.propose(estate.cast.other.token, key="k")).status == 200


async def test_reload_cannot_be_used_to_widen_a_principal_by_a_file_others_may_write(
    start: Starter,
) -> None:
    estate = await start()
    estate.rewrite_principals(Cast(
        agent=estate.cast.agent, other=estate.cast.other, ops=estate.cast.ops,
        watcher=estate.cast.watcher, revoked=frozenset({"other"}),
    ))  # fmt: skip
    estate.principals_file.chmod(0o666)
    reply = await estate.client.post("/v1/control/secrets/reload", token=estate.cast.ops.token)
    assert reply.body["principals"]["ok"] is False
    [refused] = estate.security.named("PRINCIPALS_RELOAD_REFUSED")
    assert refused["code"] == "PRINCIPALS_FILE_MODE"
    # The old set still stands, the removal included nothing.
    assert (await estate.client.propose(estate.cast.other.token, key="k")).status == 200
