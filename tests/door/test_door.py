"""The door's fixed order with real credentials: bearers, workload tokens, certificates."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.codes import Code
from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.door.door import (
    Door,
    LegacyCaller,
    check_action,
    source_key,
)
from agentsafe.executor.door.principals_file import PrincipalSet, parse_principals
from agentsafe.executor.door.refusal_lines import BURST, INTERVAL_SECONDS, REPEATED_EVENT
from agentsafe.executor.door.workload import JwksSource, WorkloadVerifier
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.metrics import ExecutorMetrics
from agentsafe.executor.host.secrets import SecretHandle
from agentsafe.executor.intent import (
    DownstreamTarget,
    check_intent_owner,
    check_separation,
)
from agentsafe.executor.policy.policy import Verdict
from agentsafe.executor.principals import Actor, Principal, Role, legacy_principal
from agentsafe.executor.routes.refusals import status_of
from agentsafe.executor.windows import DoorWindows, LockoutRule, RateRule
from tests.support.intents import make_intent
from tests.support.pki import TestCA, TokenSigner

TENANT = "00000000-0000-4000-8000-000000000001"
ISSUER = "https://kubernetes.default.svc.cluster.example"
SUBJECT = "system:serviceaccount:agents:treasury"
AUDIENCE = "agentsafe-executor"
BATCH_TOKEN = "batch-token-" + "b" * 32
ALICE_TOKEN = "alice-token-" + "a" * 32
OPS_URI = "spiffe://bank.example/ns/ops/sa/oncall"
AUDIT_URI = "spiffe://bank.example/ns/ops/sa/audit"
NOW = 1_800_000_000.0


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_doc(pinned_der: bytes, *, batch_rate: str | None = None) -> dict[str, Any]:
    batch: dict[str, Any] = {
        "id": "batch-runner",
        "role": "PROPOSER",
        "tenant_id": TENANT,
        "actor": {"id": "batch-agent", "type": "AI_AGENT"},
        "allowed_actions": ["forward_request"],
        "credential": {"kind": "BEARER", "token_sha256": sha(BATCH_TOKEN)},
    }
    if batch_rate:
        batch["rate_limit"] = batch_rate
    return {
        "version": "agent-safe.principals/1",
        "principals": [
            batch,
            {
                "id": "treasury",
                "role": "PROPOSER",
                "tenant_id": TENANT,
                "actor": {"id": "payout-agent", "type": "AI_AGENT"},
                "allowed_actions": ["forward_request"],
                "credential": {"kind": "WORKLOAD_JWT", "issuer": ISSUER, "subject": SUBJECT},
            },
            {
                "id": "ops-oncall",
                "role": "OPERATOR",
                "scopes": ["status", "halt"],
                "credential": {"kind": "MTLS", "san_uri": OPS_URI},
            },
            {
                "id": "auditor",
                "role": "OPERATOR",
                "scopes": ["evidence"],
                "credential": {
                    "kind": "MTLS",
                    "san_uri": AUDIT_URI,
                    "cert_sha256": hashlib.sha256(pinned_der).hexdigest(),
                },
            },
            {
                "id": "alice",
                "role": "APPROVER",
                "actor": {"id": "alice@bank.example", "type": "HUMAN"},
                "credential": {"kind": "BEARER", "token_sha256": sha(ALICE_TOKEN)},
            },
        ],
    }


def load(doc: dict[str, Any]) -> PrincipalSet:
    return parse_principals(
        json.dumps(doc),
        registered_actions=["forward_request"],
        jwt_configured=True,
        client_ca_configured=True,
    )


class World:
    def __init__(self, tmp_path: Path, *, lockout: str = "3/60/300", unauth: str = "5/60",
                 batch_rate: str | None = None) -> None:  # fmt: skip
        self.clock = ManualClock(NOW)
        self.ca = TestCA()
        self.ops_cert = self.ca.issue_client(OPS_URI)
        self.audit_cert = self.ca.issue_client(AUDIT_URI)
        self.signer = TokenSigner("ES256")
        jwks = tmp_path / "jwks.json"
        jwks.write_text(json.dumps({"keys": [self.signer.jwk()]}))
        self.security = MemorySink()
        self.metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
        self.refusals = 0
        self.windows = DoorWindows(
            clock=self.clock,
            unauthenticated=RateRule.parse(unauth),
            lockout=LockoutRule.parse(lockout),
        )
        self.principals = load(make_doc(self.audit_cert.der, batch_rate=batch_rate))
        self.door = Door(
            self.principals,
            windows=self.windows,
            clock=self.clock,
            security=self.security,
            workload=WorkloadVerifier(JwksSource(jwks), audience=AUDIENCE, clock=self.clock),
            metrics=self.metrics,
            on_refusal=self._count,
        )

    def _count(self) -> None:
        self.refusals += 1

    def token(self, **overrides: Any) -> str:
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "sub": SUBJECT,
            "aud": [AUDIENCE],
            "iat": int(NOW) - 10,
            "exp": int(NOW) + 3600,
        }
        claims.update(overrides)
        return self.signer.sign(claims)

    def auth(self, *, bearer: str | None = None, header: str | list[str] | None = None,
             cert: bytes | None = None, role: Role = Role.PROPOSER, scope: str | None = None,
             source: str = "10.0.0.1") -> Principal:  # fmt: skip
        if bearer is not None:
            header = f"Bearer {bearer}"
        return self.door.authenticate(
            authorization_header=header,
            peer_cert_der=cert,
            route_role=role,
            route_scope=scope,
            source=source,
        )

    def refused(self, status: int, code: str, **kw: Any) -> RequestRejected:
        before = len(self.security.named("AUTH_FAILED"))
        with pytest.raises(RequestRejected) as info:
            self.auth(**kw)
        assert (status_of(info.value.code), info.value.code) == (status, code)
        failed = self.security.named("AUTH_FAILED")
        assert len(failed) == before + 1
        assert set(failed[-1]) == {"method", "code"}
        assert failed[-1]["code"] == code
        for secret in (BATCH_TOKEN, ALICE_TOKEN, kw.get("bearer") or "\x00"):
            assert secret not in str(info.value)
        return info.value

    def last_method(self) -> str:
        return str(self.security.named("AUTH_FAILED")[-1]["method"])


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_bearer_workload_and_certificate_each_name_their_principal(world: World) -> None:
    assert world.auth(bearer=BATCH_TOKEN).id == "batch-runner"
    assert world.auth(bearer=world.token()).id == "treasury"
    assert world.auth(cert=world.ops_cert.der, role=Role.OPERATOR, scope="halt").id == "ops-oncall"
    assert world.auth(cert=world.audit_cert.der, role=Role.OPERATOR, scope="evidence").id == (
        "auditor"
    )
    assert world.auth(bearer=ALICE_TOKEN, role=Role.APPROVER).id == "alice"
    assert world.security.events == []
    assert world.refusals == 0


def test_no_credential_is_auth_required(world: World) -> None:
    world.refused(401, "AUTH_REQUIRED")
    assert world.last_method() == "none"
    assert world.metrics.door_refusals.value(method="none", code="AUTH_REQUIRED") == 1
    assert world.refusals == 1


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer a b", "Token x"])
def test_malformed_authorization_is_auth_failed(world: World, header: str) -> None:
    world.refused(401, "AUTH_FAILED", header=header)


def test_unknown_bearer(world: World) -> None:
    world.refused(401, "AUTH_FAILED", bearer="guess-" + BATCH_TOKEN)
    assert world.last_method() == "bearer"


def test_certificate_plus_bearer_is_ambiguous(world: World) -> None:
    world.refused(401, "AUTH_AMBIGUOUS", bearer=BATCH_TOKEN, cert=world.ops_cert.der)
    assert world.last_method() == "mtls"


def test_certificate_with_unknown_san(world: World) -> None:
    stranger = world.ca.issue_client("spiffe://bank.example/ns/ops/sa/intruder")
    world.refused(401, "AUTH_FAILED", cert=stranger.der, role=Role.OPERATOR)
    nothing = world.ca.issue_client()
    world.refused(401, "AUTH_FAILED", cert=nothing.der, role=Role.OPERATOR)
    world.refused(401, "AUTH_FAILED", cert=b"not der", role=Role.OPERATOR)
    assert world.last_method() == "mtls"


def test_certificate_naming_two_principals_is_ambiguous(world: World) -> None:
    both = world.ca.issue_client(OPS_URI, AUDIT_URI)
    world.refused(401, "AUTH_AMBIGUOUS", cert=both.der, role=Role.OPERATOR)


def test_pinned_certificate_mismatch_counts_to_the_principals_lockout(world: World) -> None:
    impostor = world.ca.issue_client(AUDIT_URI)  # same SAN, same CA, another key
    for _ in range(3):
        world.refused(401, "AUTH_FAILED", cert=impostor.der, role=Role.OPERATOR, scope="evidence")
    assert world.security.named("PRINCIPAL_LOCKED") == [
        {"principal": "auditor", "lock_seconds": 300}
    ]
    assert world.metrics.principals_locked.value() == 1
    # the real certificate now meets the lock; the lock is no authentication failure
    spikes = world.refusals
    world.refused(423, "PRINCIPAL_LOCKED", cert=world.audit_cert.der, role=Role.OPERATOR,
                  scope="evidence")  # fmt: skip
    assert world.refusals == spikes
    # every failed authentication counts in its source's window (the bound on its spike share)
    assert world.windows.unauthenticated.count("10.0.0.1") == 3


def forged_with_known_kid(world: World, **claims: Any) -> str:
    """A token that names the JWKS's key and the treasury subject, signed by another key."""
    forger = TokenSigner("ES256", kid=world.signer.kid)
    body = {"iss": ISSUER, "sub": SUBJECT, "aud": AUDIENCE, "iat": int(NOW), "exp": int(NOW) + 60}
    body.update(claims)
    return forger.sign(body)


def test_a_bad_signature_for_a_known_key_never_locks_the_principal(world: World) -> None:
    """Issue 30, item 20: a kid is public (it is in the JWKS) and so is a subject; a token
    naming both, signed with the forger's own key, is anyone's to produce. Before, three of
    them locked the principal for 300 s; now they count only in their sources' windows."""
    for n in range(9):  # three times the World's lockout count (3)
        world.refused(401, "JWT_SIGNATURE_INVALID", bearer=forged_with_known_kid(world),
                      source=f"10.0.1.{n}")  # fmt: skip
    assert world.last_method() == "workload"
    assert world.security.named("PRINCIPAL_LOCKED") == []
    assert world.auth(bearer=world.token()).id == "treasury"


def test_a_replayed_token_for_another_audience_never_locks_the_principal(world: World) -> None:
    """Issue 16 item 17: a stranger holding the principal's token for another audience (or a
    stale one) replays it; only its own source's window fills, the principal is never locked."""
    for n in range(10):
        world.refused(401, "JWT_AUDIENCE_MISMATCH", bearer=world.token(aud="elsewhere"),
                      source=f"10.0.2.{n}")  # fmt: skip
        world.refused(401, "JWT_EXPIRED", bearer=world.token(exp=int(NOW) - 3600),
                      source=f"10.0.3.{n}")  # fmt: skip
    assert world.security.named("PRINCIPAL_LOCKED") == []
    assert world.auth(bearer=world.token()).id == "treasury"


def test_unproven_workload_failures_never_reveal_a_lock(world: World) -> None:
    for _ in range(3):
        world.refused(401, "JWT_AUDIENCE_MISMATCH", bearer=world.token(aud="elsewhere"))
    forger = TokenSigner("ES256")
    forged = forger.sign({"iss": ISSUER, "sub": SUBJECT, "aud": AUDIENCE,
                          "iat": int(NOW), "exp": int(NOW) + 60})  # fmt: skip
    world.refused(401, "JWT_SIGNATURE_INVALID", bearer=forged, source="10.0.0.9")
    other = world.token(sub="system:serviceaccount:agents:other")
    world.refused(401, "JWT_SUBJECT_UNKNOWN", bearer=other, source="10.0.0.9")
    world.refused(401, "JWT_ISSUER_UNKNOWN", bearer=world.token(iss="https://x"), source="10.0.0.9")


def test_the_unauthenticated_window_is_per_source_and_never_refuses_a_principal(
    world: World,
) -> None:
    for _ in range(5):
        world.refused(401, "AUTH_FAILED", bearer="wrong")
    error = world.refused(429, "RATE_LIMITED", bearer="wrong")
    assert error.headers["Retry-After"] == "60"
    assert world.refusals == 5, "the window's own 429 is no authentication failure"
    # a request that proves a principal passes even from the full source
    assert world.auth(bearer=BATCH_TOKEN).id == "batch-runner"
    assert world.auth(cert=world.ops_cert.der, role=Role.OPERATOR, scope="halt").id == (
        "ops-oncall"
    )
    # another source has its own window
    world.refused(401, "AUTH_FAILED", bearer="wrong", source="10.0.0.2")
    world.clock.advance(60)
    world.refused(401, "AUTH_FAILED", bearer="wrong")
    assert world.refusals == 7


def test_one_source_adds_at_most_its_window_to_the_spike(world: World) -> None:
    for _ in range(200):
        with pytest.raises(RequestRejected):
            world.auth(bearer="wrong")
    assert world.refusals == 5  # the window's count (5/60), never the flood's size
    assert world.metrics.door_refusals.value(method="bearer", code="RATE_LIMITED") == 195


def test_duplicate_authorization_headers_are_ambiguous(world: World) -> None:
    """Issue 16 item 10: two headers are refused, even when the first one is good."""
    world.refused(401, "AUTH_AMBIGUOUS", header=[f"Bearer {BATCH_TOKEN}", "Bearer other"])
    world.refused(401, "AUTH_AMBIGUOUS", header=[f"Bearer {BATCH_TOKEN}"] * 2)
    assert world.auth(header=[f"Bearer {BATCH_TOKEN}"]).id == "batch-runner"


def test_a_principals_authorization_refusals_lock_it_and_never_count_to_the_spike(
    world: World,
) -> None:
    """Issue 16 item 2: ROLE_FORBIDDEN / SCOPE_FORBIDDEN / refusals after the door and a
    principal's own 429s are not authentication attacks: they never feed AUTH_SPIKE; the
    authorization refusals count towards the principal's lock instead."""
    world.refused(403, "ROLE_FORBIDDEN", bearer=BATCH_TOKEN, role=Role.OPERATOR, scope="status")
    batch = world.auth(bearer=BATCH_TOKEN)
    world.door.record_refusal(batch, Code.ACTION_NOT_PERMITTED_FOR_PRINCIPAL)
    assert world.security.named("PRINCIPAL_LOCKED") == []
    world.door.record_refusal(batch, Code.INTENT_PRINCIPAL_MISMATCH)
    assert [e["principal"] for e in world.security.named("PRINCIPAL_LOCKED")] == ["batch-runner"]
    world.refused(423, "PRINCIPAL_LOCKED", bearer=BATCH_TOKEN)
    assert world.refusals == 0
    assert world.windows.unauthenticated.count("10.0.0.1") == 0


def test_a_principals_own_rate_limit_never_counts_to_the_spike(tmp_path: Path) -> None:
    world = World(tmp_path, batch_rate="1/60")
    world.auth(bearer=BATCH_TOKEN)
    for _ in range(100):
        with pytest.raises(RequestRejected):
            world.auth(bearer=BATCH_TOKEN)
    assert world.refusals == 0
    assert world.security.named("PRINCIPAL_LOCKED") == []


def test_repeated_refusals_are_summarised(world: World) -> None:
    """Issue 16 item 9: a flood writes a bounded number of lines, and says how many it held."""
    for n in range(300):
        with pytest.raises(RequestRejected):
            world.auth(bearer="wrong", source=f"10.9.{n // 200}.{n % 200}")
    assert len(world.security.named("AUTH_FAILED")) == BURST
    world.clock.advance(INTERVAL_SECONDS)
    world.door.flush_lines()
    assert world.security.named(REPEATED_EVENT) == [
        {"method": "bearer", "code": "AUTH_FAILED", "count": 300 - BURST,
         "seconds": int(INTERVAL_SECONDS)},
    ]  # fmt: skip
    world.door.flush_lines(everything=True)
    assert len(world.security.named(REPEATED_EVENT)) == 1
    assert world.metrics.door_refusals.value(method="bearer", code="AUTH_FAILED") == 300


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("fe80::1%eth0", "fe80::/64"),
        # the zone is cut before the address is read, whatever it holds (mutation testing)
        ("fe80::1%", "fe80::/64"),
        ("fe80::1%a%b", "fe80::/64"),
        (None, "unknown"),
        ("not-an-address", "unknown"),
    ],
)
def test_source_keys(address: str | None, key: str) -> None:
    assert source_key(address) == key


def test_the_principals_own_rate_limit(tmp_path: Path) -> None:
    world = World(tmp_path, batch_rate="2/10")
    world.auth(bearer=BATCH_TOKEN)
    world.auth(bearer=BATCH_TOKEN)
    error = world.refused(429, "RATE_LIMITED", bearer=BATCH_TOKEN)
    assert error.headers["Retry-After"] == "10"
    assert world.auth(bearer=ALICE_TOKEN, role=Role.APPROVER).id == "alice"
    world.clock.advance(10)
    assert world.auth(bearer=BATCH_TOKEN).id == "batch-runner"


def test_role_and_scope(world: World) -> None:
    world.refused(403, "ROLE_FORBIDDEN", bearer=BATCH_TOKEN, role=Role.OPERATOR, scope="status")
    world.refused(403, "ROLE_FORBIDDEN", bearer=ALICE_TOKEN, role=Role.PROPOSER)
    world.refused(403, "SCOPE_FORBIDDEN", cert=world.ops_cert.der, role=Role.OPERATOR,
                  scope="secrets.reload")  # fmt: skip
    assert world.auth(cert=world.ops_cert.der, role=Role.OPERATOR, scope="status")


def test_lockout_disabled(tmp_path: Path) -> None:
    world = World(tmp_path, lockout="0/60/300")
    for n in range(10):
        world.refused(401, "JWT_SIGNATURE_INVALID", bearer=forged_with_known_kid(world),
                      source=f"10.0.4.{n}")  # fmt: skip
    assert world.auth(bearer=world.token()).id == "treasury"


def test_revoked_principal_after_reload(world: World) -> None:
    assert world.auth(bearer=BATCH_TOKEN).id == "batch-runner"
    doc = make_doc(world.audit_cert.der)
    doc["principals"] = [p for p in doc["principals"] if p["id"] != "batch-runner"]
    world.door.replace_principals(load(doc))
    world.refused(401, "AUTH_FAILED", bearer=BATCH_TOKEN)


def test_legacy_mode_reads_the_rotating_token(world: World) -> None:
    principal = legacy_principal(tenant_id=TENANT, actor=Actor(id="agent", type="AI_AGENT"))
    current = {"handle": SecretHandle("EXECUTOR_CALLER_TOKEN", bytearray(b"first-token"))}

    class Rotating:
        name = "EXECUTOR_CALLER_TOKEN"

        def reveal(self) -> Any:
            return current["handle"].reveal()

    world.door.replace_principals(LegacyCaller(principal=principal, token=Rotating()))
    assert world.auth(bearer="first-token").id == "legacy-caller"
    current["handle"] = SecretHandle("EXECUTOR_CALLER_TOKEN", bytearray(b"second-token"))
    world.refused(401, "AUTH_FAILED", bearer="first-token")
    assert world.auth(bearer="second-token").id == "legacy-caller"
    world.refused(403, "ROLE_FORBIDDEN", bearer="second-token", role=Role.OPERATOR)
    world.refused(401, "AUTH_REQUIRED")


def test_legacy_mode_with_a_client_ca_needs_both(world: World) -> None:
    principal = legacy_principal(tenant_id=TENANT, actor=Actor(id="agent", type="AI_AGENT"))
    handle = SecretHandle("EXECUTOR_CALLER_TOKEN", bytearray(b"the-token"))
    world.door.replace_principals(
        LegacyCaller(principal=principal, token=handle, require_client_certificate=True)
    )
    world.refused(401, "AUTH_REQUIRED", bearer="the-token")
    world.refused(401, "AUTH_REQUIRED", cert=world.ops_cert.der)
    assert world.auth(bearer="the-token", cert=world.ops_cert.der).id == "legacy-caller"


def test_request_time_checks(world: World) -> None:
    batch = world.auth(bearer=BATCH_TOKEN)
    treasury = world.auth(bearer=world.token())
    alice = world.auth(bearer=ALICE_TOKEN, role=Role.APPROVER)
    check_action(batch, "forward_request")
    with pytest.raises(RequestRejected) as info:
        check_action(batch, "delete_everything")
    assert (status_of(info.value.code), info.value.code) == (
        403,
        "ACTION_NOT_PERMITTED_FOR_PRINCIPAL",
    )
    with pytest.raises(RequestRejected) as info:
        check_action(alice, "forward_request")
    assert info.value.code == "ACTION_NOT_PERMITTED_FOR_PRINCIPAL"
    intent = make_intent(
        now=NOW,
        principal=batch,
        action="forward_request",
        resource="payments/1",
        parameters={"amountMinor": 100, "currency": "EUR"},
        idempotency_key="k-1",
        target=DownstreamTarget(system="core", operation="pay", endpoint="https://x/pay"),
    )
    check_intent_owner(batch, intent)
    with pytest.raises(RequestRejected) as info:
        check_intent_owner(treasury, intent)
    assert (status_of(info.value.code), info.value.code) == (403, "INTENT_PRINCIPAL_MISMATCH")
    check_separation(alice, intent)
    selfish = Principal(id="bob", role=Role.APPROVER, actor=Actor(id="batch-agent", type="HUMAN"))
    with pytest.raises(RequestRejected) as info:
        check_separation(selfish, intent)
    assert (status_of(info.value.code), info.value.code) == (422, "SEPARATION_OF_DUTIES_VIOLATED")
    with pytest.raises(RequestRejected) as info:
        check_separation(batch, intent)
    assert info.value.code == "ROLE_FORBIDDEN"


def test_failures_that_prove_no_principal_lock_nobody(world: World) -> None:
    """Found by mutation testing (issue 23): an attempt names the principal a failure counts
    against only once it proved intent; an unknown bearer, a bad header or an unknown SAN names
    none, so no lock is ever kept, or announced, for a principal of no name."""
    bad_san = world.ca.issue_client("spiffe://bank.example/ns/x/sa/y").der
    for n in range(10):
        attempts: list[dict[str, Any]] = [
            {"bearer": f"guess-{n}-" + BATCH_TOKEN},
            {"header": "Basic dXNlcjpwYXNz"},
            {"cert": bad_san, "role": Role.OPERATOR},
        ]
        for kind, attempt in enumerate(attempts):
            with pytest.raises(RequestRejected) as info:
                world.auth(**attempt, source=f"10.0.{4 + kind}.{n}")
            assert info.value.code == "AUTH_FAILED"
    assert world.security.named("PRINCIPAL_LOCKED") == []
    assert not world.windows.lockout.locked("")
    assert world.auth(bearer=BATCH_TOKEN).id == "batch-runner"


def test_a_flush_before_the_interval_is_over_holds_the_summary(world: World) -> None:
    """Found by mutation testing (issue 23): the door's periodic flush writes only the intervals
    that are over; everything is written only when asked (at shutdown)."""
    for n in range(BURST + 5):
        with pytest.raises(RequestRejected):
            world.auth(bearer="wrong", source=f"10.8.0.{n}")
    world.door.flush_lines()
    assert world.security.named(REPEATED_EVENT) == []
    world.clock.advance(INTERVAL_SECONDS)
    world.door.flush_lines()
    assert [e["count"] for e in world.security.named(REPEATED_EVENT)] == [5]


def test_a_scope_refusal_locks_the_principal_and_never_counts_to_the_spike(world: World) -> None:
    """Found by mutation testing (issue 23): SCOPE_FORBIDDEN, like ROLE_FORBIDDEN, is the proven
    principal's own mistake, so it counts towards its lock and never towards AUTH_SPIKE."""
    for _ in range(3):
        world.refused(403, "SCOPE_FORBIDDEN", cert=world.ops_cert.der, role=Role.OPERATOR,
                      scope="evidence")  # fmt: skip
    assert world.refusals == 0
    assert [e["principal"] for e in world.security.named("PRINCIPAL_LOCKED")] == ["ops-oncall"]


def test_a_bearer_token_with_any_space_or_unprintable_character_is_refused() -> None:
    """Every code point, inside a token: refused exactly when it is white space or not
    printable (the rule as it was written per character, before issue 34)."""
    import sys

    from agentsafe.executor.door.door import _bearer_token

    for point in range(sys.maxunicode + 1):
        c = chr(point)
        refused = c.isspace() or not c.isprintable()
        assert (_bearer_token(f"Bearer ab{c}cd") is None) is refused, hex(point)
    assert _bearer_token("Bearer abc") == "abc"
    assert _bearer_token("bearer   abc  ") == "abc"
