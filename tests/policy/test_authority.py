"""LocalAuthority: every verdict path and reason code, grants, claims, approvals, signed tokens.

``FakeUseStore`` below is an in-memory stand-in for the use store's grant claims (the only part
the authority uses); one test at the end runs against the real ``SQLiteUseStore``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentsafe.executor.canonical import canonical_json, sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import PolicyError
from agentsafe.executor.grants import (
    KeySet,
    SigningKey,
    TokenRefused,
    b64url_decode,
    b64url_encode,
    verify_jws,
)
from agentsafe.executor.intent import CapturedIntent, DownstreamTarget
from agentsafe.executor.policy import authority as authority_module
from agentsafe.executor.policy.attestation import claim_token_digest, verify_claim_attestation
from agentsafe.executor.policy.authority import (
    ESCALATION_TYP,
    GRANT_TYP,
    RECOVERY_TYP,
    Authority,
    Claim,
    Decision,
    Finalization,
    GrantRefused,
    LocalAuthority,
    Verdict,
)
from agentsafe.executor.policy.policy import compile_policy, parse_policy
from agentsafe.executor.principals import Actor, Principal, Role
from tests.support.intents import make_intent

REPO = Path(__file__).resolve().parents[2]
EXAMPLE: dict[str, Any] = yaml.safe_load((REPO / "examples" / "policy.yaml").read_text())
TARGET = DownstreamTarget(system="bank", operation="payout", endpoint="https://bank.test/p")
PROPOSER = Principal(
    id="agent-1",
    role=Role.PROPOSER,
    tenant_id="acme",
    actor=Actor(id="bot-1", type="agent"),
)
TTL = 120


class FakeUseStore:
    """Stand-in for ``UseStore.claim_grant``: an in-memory set, first claim wins."""

    def __init__(self) -> None:
        self.claims: dict[str, tuple[str, float, float]] = {}

    async def claim_grant(
        self, grant_id: str, *, binding_digest: str, expires_at: float, now: float
    ) -> bool:
        if grant_id in self.claims:
            return False
        self.claims[grant_id] = (binding_digest, expires_at, now)
        return True


def policy(extra_actions: list[dict[str, Any]] | None = None) -> Any:
    data = copy.deepcopy(EXAMPLE)
    data["actions"].extend(extra_actions or [])
    return compile_policy(
        parse_policy(data), registered_handlers={"forward_request", "loose_handler"}
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store() -> FakeUseStore:
    return FakeUseStore()


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def authority(clock: ManualClock, store: FakeUseStore, key: SigningKey) -> LocalAuthority:
    return LocalAuthority(policy(EXTRA), keys=key, store=store, clock=clock)


EXTRA: list[dict[str, Any]] = [
    {
        "name": "broken_rule",
        "handler": "loose_handler",
        "parameters": {"type": "object"},
        "rules": [
            {"name": "typed", "when": "params.amount > 1", "verdict": "ALLOW"},
            {"name": "fallback", "when": "true", "verdict": "ALLOW"},
        ],
    },
    {
        "name": "non_boolean",
        "handler": "loose_handler",
        "parameters": {"type": "object"},
        "rules": [{"name": "number", "when": "1 + 1", "verdict": "ALLOW"}],
    },
    {
        "name": "narrow",
        "handler": "loose_handler",
        "parameters": {"type": "object"},
        "rules": [
            {"name": "only-eur", "when": "params.currency == 'EUR'", "verdict": "ALLOW"},
            {"name": "ops", "when": "principal.id == 'ops'", "verdict": "BLOCK"},
        ],
    },
    {
        "name": "contextual",
        "handler": "loose_handler",
        "parameters": {"type": "object"},
        "rules": [
            {
                "name": "everything",
                "when": (
                    "action.type == 'contextual' && action.resource == 'res-1'"
                    " && target.system == 'bank' && tenant == 'acme'"
                    " && principal.id == 'agent-1' && principal.actor == 'bot-1'"
                    " && principal.role == 'PROPOSER'"
                    " && context.caller_principal == 'agent-1'"
                    " && now == timestamp('2027-01-15T08:00:00Z')"
                ),
                "verdict": "ALLOW",
                "reasonCode": "ALL_VARIABLES_SEEN",
            }
        ],
    },
    {
        "name": "dangling_ref",
        "handler": "loose_handler",
        "parameters": {"type": "object", "properties": {"x": {"$ref": "https://example.test/s"}}},
        "rules": [{"name": "any", "when": "true", "verdict": "ALLOW"}],
    },
]


def intent(
    clock: ManualClock,
    *,
    amount: int = 4200,
    action: str = "create_payout",
    parameters: dict[str, Any] | None = None,
    principal: Principal = PROPOSER,
    ttl: int = TTL,
) -> CapturedIntent:
    return make_intent(
        now=clock.now(),
        principal=principal,
        action=action,
        resource="res-1",
        parameters=parameters
        if parameters is not None
        else {"amountMinor": amount, "currency": "EUR"},
        idempotency_key=str(uuid.uuid4()),
        target=TARGET,
        ttl_seconds=ttl,
    )


def grant_payload(decision: Decision, key: SigningKey) -> dict[str, Any]:
    assert decision.grant is not None
    return verify_jws(decision.grant, typ=GRANT_TYP, keys=KeySet([key]))


def approval(subject: CapturedIntent, **overrides: Any) -> dict[str, Any]:
    base = {
        "decision": "APPROVE",
        "approver": "treasury-lead",
        "approver_actor": "alice",
        "request_id": str(uuid.uuid4()),
        "intent_hash": subject.intent_hash,
    }
    base.update(overrides)
    return base


def test_local_authority_satisfies_the_protocol(authority: LocalAuthority) -> None:
    checked: Authority = authority
    assert checked is authority


# -- verdicts -----------------------------------------------------------------------------------


async def test_allow_issues_a_bound_grant(
    authority: LocalAuthority, clock: ManualClock, key: SigningKey
) -> None:
    subject = intent(clock, amount=5000)
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.verdict is Verdict.ALLOW
    assert decision.reason_codes == ("POLICY_ALLOWED",)
    assert decision.rule == "small"
    assert decision.approvers == ()
    assert decision.authority_time == clock.now()
    for value in (decision.decision_id, decision.dossier_id, decision.grant_id):
        assert value is not None
        assert uuid.UUID(value).version == 4
    assert len({decision.decision_id, decision.dossier_id, decision.grant_id}) == 3
    payload = grant_payload(decision, key)
    assert payload == {
        "sub": decision.grant_id,
        "decision_id": decision.decision_id,
        "dossier_id": decision.dossier_id,
        "iat": clock.now(),
        "nbf": clock.now(),
        "exp": clock.now() + 60,
        "binding": {
            "intent_hash": subject.intent_hash,
            "execution_payload_digest": sha256_digest({"amountMinor": 5000, "currency": "EUR"}),
            "execution_payload_canonicalization_profile": "RFC8785/JCS",
        },
    }
    assert decision.grant_expires_at == clock.now() + 60
    assert decision.grant is not None
    assert decision.grant not in repr(decision)


async def test_grant_never_outlives_the_intent(
    authority: LocalAuthority, clock: ManualClock, key: SigningKey
) -> None:
    subject = intent(clock, ttl=10)
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.grant_expires_at == subject.expires_at
    assert grant_payload(decision, key)["exp"] == subject.expires_at


async def test_escalate_carries_the_rules_approvers(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    decision = await authority.evaluate(intent(clock, amount=5001), principal=PROPOSER)
    assert decision.verdict is Verdict.ESCALATE
    assert decision.approvers == ("treasury-lead",)
    assert decision.reason_codes == ("APPROVAL_REQUIRED",)
    assert decision.rule == "medium"
    assert decision.grant is None
    assert decision.grant_id is None


async def test_block_carries_the_rules_reason_code(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    decision = await authority.evaluate(intent(clock, amount=50001), principal=PROPOSER)
    assert decision.verdict is Verdict.BLOCK
    assert decision.reason_codes == ("AMOUNT_ABOVE_POLICY",)
    assert decision.rule == "large"
    assert decision.grant is None


async def test_block_without_reason_code(authority: LocalAuthority, clock: ManualClock) -> None:
    ops = Principal(id="ops", role=Role.PROPOSER, tenant_id="acme", actor=Actor("o", "agent"))
    subject = intent(clock, action="narrow", parameters={"currency": "USD"}, principal=ops)
    decision = await authority.evaluate(subject, principal=ops)
    assert (decision.verdict, decision.reason_codes) == (Verdict.BLOCK, ("POLICY_BLOCKED",))


async def test_unknown_action(authority: LocalAuthority, clock: ManualClock) -> None:
    decision = await authority.evaluate(intent(clock, action="delete_bank"), principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("POLICY_ACTION_UNKNOWN",),
    )
    assert decision.rule is None


@pytest.mark.parametrize(
    "parameters",
    [
        {"amountMinor": 0, "currency": "EUR"},
        {"amountMinor": 10, "currency": "eur"},
        {"amountMinor": 10},
        {"amountMinor": "10", "currency": "EUR"},
        {"amountMinor": 10.5, "currency": "EUR"},
        {"amountMinor": True, "currency": "EUR"},
        {"amountMinor": 10, "currency": "EUR", "note": "sneaky"},
    ],
)
async def test_parameters_failing_the_schema(
    authority: LocalAuthority, clock: ManualClock, parameters: dict[str, Any]
) -> None:
    decision = await authority.evaluate(intent(clock, parameters=parameters), principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (Verdict.BLOCK, ("PARAMETERS_INVALID",))
    assert decision.grant is None
    assert "sneaky" not in repr(decision)


async def test_no_rule_matches(authority: LocalAuthority, clock: ManualClock) -> None:
    subject = intent(clock, action="narrow", parameters={"currency": "USD"})
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (Verdict.BLOCK, ("POLICY_NO_MATCH",))


async def test_evaluation_error_blocks_and_does_not_fall_through(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    # params.amount is absent: the first rule errors, and the ALLOW after it is never reached.
    subject = intent(clock, action="broken_rule", parameters={"other": 1})
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.verdict is Verdict.BLOCK
    assert decision.reason_codes == ("POLICY_EVALUATION_ERROR",)
    assert decision.rule == "typed"
    # a string where the rule compares with an int is an error too, not a silent false
    subject = intent(clock, action="broken_rule", parameters={"amount": "5"})
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.reason_codes == ("POLICY_EVALUATION_ERROR",)


async def test_non_boolean_rule_blocks(authority: LocalAuthority, clock: ManualClock) -> None:
    subject = intent(clock, action="non_boolean", parameters={})
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("POLICY_EVALUATION_ERROR",),
    )


async def test_unresolvable_schema_reference_blocks(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    subject = intent(clock, action="dangling_ref", parameters={"x": 1})
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("POLICY_EVALUATION_ERROR",),
    )


async def test_rules_see_every_variable(authority: LocalAuthority, clock: ManualClock) -> None:
    assert clock.now() == 1_800_000_000.0  # 2027-01-15T08:00:00Z, named in the rule
    subject = intent(clock, action="contextual", parameters={})
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.verdict is Verdict.ALLOW, decision.reason_codes
    assert decision.reason_codes == ("ALL_VARIABLES_SEEN",)


async def test_expired_intent_is_blocked(authority: LocalAuthority, clock: ManualClock) -> None:
    subject = intent(clock)
    clock.advance(TTL)
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (Verdict.BLOCK, ("INTENT_EXPIRED",))


async def test_every_decision_has_fresh_identifiers(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    subject = intent(clock, amount=99999)
    first = await authority.evaluate(subject, principal=PROPOSER)
    second = await authority.evaluate(subject, principal=PROPOSER)
    assert first.decision_id != second.decision_id
    assert first.dossier_id != second.dossier_id


# -- approvals ----------------------------------------------------------------------------------


async def test_approval_turns_escalate_into_allow(
    authority: LocalAuthority, clock: ManualClock, key: SigningKey
) -> None:
    subject = intent(clock, amount=20000)
    decision = await authority.evaluate(subject, principal=PROPOSER, approval=approval(subject))
    assert decision.verdict is Verdict.ALLOW
    assert decision.reason_codes == ("APPROVED_BY_APPROVER",)
    assert decision.rule == "medium"
    payload = grant_payload(decision, key)
    assert payload["binding"]["intent_hash"] == subject.intent_hash


async def test_denial_blocks(authority: LocalAuthority, clock: ManualClock) -> None:
    subject = intent(clock, amount=20000)
    decision = await authority.evaluate(
        subject, principal=PROPOSER, approval=approval(subject, decision="DENY")
    )
    assert (decision.verdict, decision.reason_codes) == (Verdict.BLOCK, ("APPROVAL_DENIED",))
    assert decision.grant is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"approver": "someone-else"},
        {"intent_hash": "sha256:" + "0" * 64},
        {"decision": "MAYBE"},
        {"decision": None},
        {"request_id": ""},
        {"request_id": None},
        {"approver": None},
    ],
)
async def test_approval_that_does_not_bind(
    authority: LocalAuthority, clock: ManualClock, overrides: dict[str, Any]
) -> None:
    subject = intent(clock, amount=20000)
    decision = await authority.evaluate(
        subject, principal=PROPOSER, approval=approval(subject, **overrides)
    )
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("APPROVAL_BINDING_MISMATCH",),
    )
    assert decision.grant is None


async def test_approval_for_another_intent_does_not_transfer(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    approved = intent(clock, amount=20000)
    other = intent(clock, amount=20000)
    decision = await authority.evaluate(other, principal=PROPOSER, approval=approval(approved))
    assert decision.reason_codes == ("APPROVAL_BINDING_MISMATCH",)


@pytest.mark.parametrize("overrides", [{"approver_actor": "bot-1"}, {"approver": "agent-1"}])
async def test_self_approval_is_refused(clock: ManualClock, overrides: dict[str, Any]) -> None:
    data = copy.deepcopy(EXAMPLE)
    data["actions"][0]["rules"][1]["approvers"] = ["treasury-lead", "agent-1"]
    local = LocalAuthority(
        compile_policy(parse_policy(data)),
        keys=SigningKey.generate(),
        store=FakeUseStore(),
        clock=clock,
    )
    subject = intent(clock, amount=20000)
    decision = await local.evaluate(
        subject, principal=PROPOSER, approval=approval(subject, **overrides)
    )
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("SEPARATION_OF_DUTIES_VIOLATED",),
    )


async def test_approval_cannot_lift_a_block(authority: LocalAuthority, clock: ManualClock) -> None:
    subject = intent(clock, amount=60000)
    decision = await authority.evaluate(subject, principal=PROPOSER, approval=approval(subject))
    assert (decision.verdict, decision.reason_codes) == (Verdict.BLOCK, ("AMOUNT_ABOVE_POLICY",))


async def test_approval_cannot_revive_an_expired_intent(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    subject = intent(clock, amount=20000)
    clock.advance(TTL + 1)
    decision = await authority.evaluate(subject, principal=PROPOSER, approval=approval(subject))
    assert decision.reason_codes == ("INTENT_EXPIRED",)


# -- claims -------------------------------------------------------------------------------------


async def allowed(authority: LocalAuthority, clock: ManualClock) -> tuple[CapturedIntent, str]:
    subject = intent(clock)
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    return subject, decision.grant


async def test_claim_round_trip(
    authority: LocalAuthority, clock: ManualClock, store: FakeUseStore
) -> None:
    subject = intent(clock)
    decision = await authority.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    claim = await authority.claim(decision.grant, intent=subject)
    assert claim.attestation is not None
    assert claim == Claim(
        grant_id=str(decision.grant_id),
        decision_id=decision.decision_id,
        dossier_id=decision.dossier_id,
        expires_at=clock.now() + 60,
        intent_hash=subject.intent_hash,
        execution_payload_digest=subject.payload_digest,
        attestation=claim.attestation,
        claim_token_digest=claim_token_digest(decision.grant),
    )
    # The claim attestation verifies against the published keys and names this claim.
    attested = verify_claim_attestation(claim.attestation, keys=authority.key_set)
    assert attested["sub"] == claim.grant_id
    assert attested["decision_id"] == claim.decision_id
    assert attested["binding"]["intent_hash"] == subject.intent_hash
    assert attested["binding"]["execution_payload_digest"] == subject.payload_digest
    assert attested["claim_token_digest"] == claim_token_digest(decision.grant)
    binding_digest, expires_at, claimed_at = store.claims[claim.grant_id]
    assert binding_digest.startswith("sha256:")
    assert (expires_at, claimed_at) == (claim.expires_at, clock.now())
    finalized = await authority.finalize(claim, outcome="COMPLETED", executed=True)
    assert finalized.status == "RECORDED"


async def refused(authority: LocalAuthority, grant: str, subject: CapturedIntent) -> str:
    with pytest.raises(GrantRefused) as info:
        await authority.claim(grant, intent=subject)
    return info.value.code


async def test_double_claim(authority: LocalAuthority, clock: ManualClock) -> None:
    subject, grant = await allowed(authority, clock)
    await authority.claim(grant, intent=subject)
    assert await refused(authority, grant, subject) == "GRANT_ALREADY_CLAIMED"


async def test_expired_grant(authority: LocalAuthority, clock: ManualClock) -> None:
    subject, grant = await allowed(authority, clock)
    clock.advance(60)
    assert await refused(authority, grant, subject) == "GRANT_EXPIRED"


async def test_grant_not_yet_valid(authority: LocalAuthority, clock: ManualClock) -> None:
    subject, grant = await allowed(authority, clock)
    clock.advance(-5)
    assert await refused(authority, grant, subject) == "GRANT_EXPIRED"


async def test_grant_presented_with_another_intent(
    authority: LocalAuthority, clock: ManualClock, store: FakeUseStore
) -> None:
    _, grant = await allowed(authority, clock)
    other = intent(clock)
    assert await refused(authority, grant, other) == "GRANT_BINDING_MISMATCH"
    assert store.claims == {}


async def test_grant_presented_with_changed_parameters(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    subject, grant = await allowed(authority, clock)
    binding = copy.deepcopy(dict(subject.binding))
    binding["action"]["parameters"]["amountMinor"] = 4999
    changed = CapturedIntent(binding=binding, intent_hash=subject.intent_hash)
    assert await refused(authority, grant, changed) == "GRANT_BINDING_MISMATCH"


async def test_tampered_payload(authority: LocalAuthority, clock: ManualClock) -> None:
    subject, grant = await allowed(authority, clock)
    header, payload, signature = grant.split(".")
    raw = bytearray(b64url_decode(payload))
    position = raw.index(b'"exp":') + 6
    raw[position] = ord("9") if raw[position] != ord("9") else ord("8")
    tampered = f"{header}.{b64url_encode(bytes(raw))}.{signature}"
    assert await refused(authority, tampered, subject) == "GRANT_SIGNATURE_INVALID"


async def test_alg_none_grant(
    authority: LocalAuthority, clock: ManualClock, key: SigningKey
) -> None:
    subject, grant = await allowed(authority, clock)
    header = b64url_encode(canonical_json({"alg": "none", "kid": key.kid, "typ": GRANT_TYP}))
    payload = grant.split(".")[1]
    assert await refused(authority, f"{header}.{payload}.", subject) == "GRANT_SIGNATURE_INVALID"


async def test_hs256_grant(authority: LocalAuthority, clock: ManualClock, key: SigningKey) -> None:
    from cryptography.hazmat.primitives import hashes, hmac

    subject, grant = await allowed(authority, clock)
    header = b64url_encode(canonical_json({"alg": "HS256", "kid": key.kid, "typ": GRANT_TYP}))
    payload = grant.split(".")[1]
    mac = hmac.HMAC(key.public_key.public_bytes_raw(), hashes.SHA256())
    mac.update(f"{header}.{payload}".encode())
    forged = f"{header}.{payload}.{b64url_encode(mac.finalize())}"
    assert await refused(authority, forged, subject) == "GRANT_SIGNATURE_INVALID"


async def test_grant_from_another_key(
    authority: LocalAuthority, clock: ManualClock, store: FakeUseStore
) -> None:
    subject = intent(clock)
    rogue = LocalAuthority(authority.policy, keys=SigningKey.generate(), store=store, clock=clock)
    decision = await rogue.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    assert await refused(authority, decision.grant, subject) == "GRANT_SIGNATURE_INVALID"


async def test_token_of_another_type_is_not_a_grant(
    authority: LocalAuthority, clock: ManualClock
) -> None:
    subject, grant = await allowed(authority, clock)
    payload = json.loads(b64url_decode(grant.split(".")[1]))
    lookalike = authority.sign_token(payload, typ=ESCALATION_TYP)
    assert await refused(authority, lookalike, subject) == "GRANT_SIGNATURE_INVALID"


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c", "x" * 20000])
async def test_malformed_grant(authority: LocalAuthority, clock: ManualClock, token: str) -> None:
    subject = intent(clock)
    assert await refused(authority, token, subject) == "GRANT_MALFORMED"


@pytest.mark.parametrize(
    "mutation",
    [
        lambda p: p.pop("sub"),
        lambda p: p.update(sub="not-a-uuid"),
        lambda p: p.update(exp="soon"),
        lambda p: p.update(exp=True),
        lambda p: p["binding"].pop("execution_payload_digest"),
        lambda p: p["binding"].update(extra="x"),
        lambda p: p.update(binding="sha256:00"),
    ],
)
async def test_signed_but_malformed_payload(
    authority: LocalAuthority, clock: ManualClock, key: SigningKey, mutation: Any
) -> None:
    from agentsafe.executor.grants import sign_jws

    subject, grant = await allowed(authority, clock)
    payload = json.loads(b64url_decode(grant.split(".")[1]))
    mutation(payload)
    token = sign_jws(payload, typ=GRANT_TYP, key=key)
    assert await refused(authority, token, subject) == "GRANT_MALFORMED"


async def test_retired_key_grants_still_claim(clock: ManualClock) -> None:
    old = SigningKey.generate()
    store = FakeUseStore()
    before = LocalAuthority(policy(), keys=old, store=store, clock=clock)
    subject = intent(clock)
    decision = await before.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    after = LocalAuthority(
        policy(), keys=SigningKey.generate(), store=store, clock=clock, retired_keys=(old,)
    )
    assert (await after.claim(decision.grant, intent=subject)).grant_id == decision.grant_id
    assert {k["kid"] for k in after.jwks()["keys"]} == {old.kid, after.key_set.kids[0]}


class _Verifications:
    """Counts the grant verifications ``LocalAuthority`` makes (``verify_jws`` as the authority
    module calls it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0

        def counting(token: str, **kwargs: Any) -> dict[str, Any]:
            self.count += 1
            return verify_jws(token, **kwargs)

        monkeypatch.setattr(authority_module, "verify_jws", counting)


async def test_an_issued_grant_is_claimed_without_verifying_it_again(
    clock: ManualClock, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: the grant an attempt presents is the token this authority signed moments
    before; its signature is not verified a second time. The claim is the one a verification
    gives: another authority under the same key, which did not issue it, verifies it."""
    verifications = _Verifications(monkeypatch)
    issuer = LocalAuthority(policy(), keys=key, store=FakeUseStore(), clock=clock)
    verifier = LocalAuthority(policy(), keys=key, store=FakeUseStore(), clock=clock)
    subject = intent(clock)
    decision = await issuer.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    own = await issuer.claim(decision.grant, intent=subject)
    assert verifications.count == 0
    verified = await verifier.claim(decision.grant, intent=subject)
    assert verifications.count == 1
    assert dataclasses.replace(own, attestation=None) == dataclasses.replace(
        verified, attestation=None
    )
    assert own.attestation is not None
    assert verify_claim_attestation(own.attestation, keys=issuer.key_set) == (
        verify_claim_attestation(str(verified.attestation), keys=issuer.key_set)
    )


async def test_a_grant_presented_again_is_verified_again(
    authority: LocalAuthority, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    verifications = _Verifications(monkeypatch)
    subject, grant = await allowed(authority, clock)
    other = intent(clock)
    assert await refused(authority, grant, other) == "GRANT_BINDING_MISMATCH"
    assert verifications.count == 0
    assert (await authority.claim(grant, intent=subject)).intent_hash == subject.intent_hash
    assert verifications.count == 1
    assert await refused(authority, grant, subject) == "GRANT_ALREADY_CLAIMED"
    assert verifications.count == 2


async def test_an_issued_grant_altered_by_a_byte_is_verified_and_refused(
    authority: LocalAuthority, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    verifications = _Verifications(monkeypatch)
    subject, grant = await allowed(authority, clock)
    header, payload, signature = grant.split(".")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    assert await refused(authority, f"{header}.{payload}.{flipped}", subject) == (
        "GRANT_SIGNATURE_INVALID"
    )
    assert verifications.count == 1
    assert (await authority.claim(grant, intent=subject)).intent_hash == subject.intent_hash
    assert verifications.count == 1


async def test_an_issued_grant_under_a_key_rotated_out_is_refused(
    authority: LocalAuthority, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signed here, but under a key no longer in the key set: refused as a verification
    refuses it, not taken on the strength of having been issued. Under a retired key still in
    the set, it claims without a verification."""
    verifications = _Verifications(monkeypatch)
    retired_subject, retired = await allowed(authority, clock)
    gone_subject, gone = await allowed(authority, clock)
    authority.rotate_key(SigningKey.generate())
    assert (await authority.claim(retired, intent=retired_subject)).grant_id
    assert verifications.count == 0
    for _ in range(2):  # two more rotations: the first key leaves the set (keep_retired=2)
        authority.rotate_key(SigningKey.generate())
    assert await refused(authority, gone, gone_subject) == "GRANT_SIGNATURE_INVALID"
    assert verifications.count == 1


async def test_the_record_of_issued_grants_is_bounded(
    authority: LocalAuthority, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(authority_module, "ISSUED_GRANTS_KEPT", 3)
    issued = [await allowed(authority, clock) for _ in range(4)]
    verifications = _Verifications(monkeypatch)
    for subject, grant in issued:
        assert (await authority.claim(grant, intent=subject)).intent_hash == subject.intent_hash
    assert verifications.count == 1  # the first, forgotten when the fourth was issued


# -- other signed tokens ------------------------------------------------------------------------


def test_escalation_and_recovery_tokens(authority: LocalAuthority) -> None:
    body = {"request_id": "r-1", "intent_hash": "sha256:ab", "expires_at": "2027-01-01"}
    token = authority.sign_token(body, typ=ESCALATION_TYP)
    assert authority.verify_token(token, typ=ESCALATION_TYP) == body
    with pytest.raises(TokenRefused) as info:
        authority.verify_token(token, typ=RECOVERY_TYP)
    assert info.value.code == "JWS_TYPE_MISMATCH"
    other = LocalAuthority(
        authority.policy, keys=SigningKey.generate(), store=FakeUseStore(), clock=ManualClock()
    )
    with pytest.raises(TokenRefused) as info:
        authority.verify_token(other.sign_token(body, typ=ESCALATION_TYP), typ=ESCALATION_TYP)
    assert info.value.code == "JWS_KEY_UNKNOWN"


def test_tokens_cannot_be_grants(authority: LocalAuthority) -> None:
    with pytest.raises(ValueError, match="token type"):
        authority.sign_token({"sub": "x"}, typ=GRANT_TYP)
    with pytest.raises(ValueError, match="token type"):
        authority.sign_token({"sub": "x"}, typ="JWT")


async def test_finalizer_hook(clock: ManualClock) -> None:
    seen: list[tuple[str, str, bool | None]] = []

    async def record(claim: Claim, finalization: Finalization) -> None:
        seen.append((claim.grant_id, finalization.outcome, finalization.executed))

    local = LocalAuthority(
        policy(), keys=SigningKey.generate(), store=FakeUseStore(), clock=clock, finalizer=record
    )
    subject = intent(clock)
    decision = await local.evaluate(subject, principal=PROPOSER)
    assert decision.grant is not None
    claim = await local.claim(decision.grant, intent=subject)
    finalized = await local.finalize(claim, outcome="UNKNOWN_AFTER_DISPATCH", executed=None)
    assert finalized.status == "RECORDED"
    assert seen == [(claim.grant_id, "UNKNOWN_AFTER_DISPATCH", None)]


def test_grant_ttl_is_bounded(clock: ManualClock) -> None:
    with pytest.raises(ValueError):
        LocalAuthority(
            policy(),
            keys=SigningKey.generate(),
            store=FakeUseStore(),
            clock=clock,
            grant_ttl_seconds=61,
        )


# -- the real use store -------------------------------------------------------------------------


async def test_fifty_concurrent_claims_on_sqlite(tmp_path: Path, clock: ManualClock) -> None:
    from agentsafe.executor.state.usestore import SQLiteUseStore

    store = await SQLiteUseStore.open(tmp_path / "state", clock=clock)
    try:
        local = LocalAuthority(policy(), keys=SigningKey.generate(), store=store, clock=clock)
        subject = intent(clock)
        decision = await local.evaluate(subject, principal=PROPOSER)
        assert decision.grant is not None
        grant = decision.grant
        results = await asyncio.gather(
            *(local.claim(grant, intent=subject) for _ in range(50)), return_exceptions=True
        )
    finally:
        await store.close()
    claims = [r for r in results if isinstance(r, Claim)]
    refusals = [r for r in results if isinstance(r, GrantRefused)]
    assert len(claims) == 1
    assert len(refusals) == 49
    assert {r.code for r in refusals} == {"GRANT_ALREADY_CLAIMED"}


# -- issue 21: a rule's approval.verification ---------------------------------------------------


def webauthn_authority(clock: ManualClock, store: FakeUseStore, key: SigningKey) -> LocalAuthority:
    data = copy.deepcopy(EXAMPLE)
    for rule in data["actions"][0]["rules"]:
        if rule["verdict"] == "ESCALATE":
            rule["approval"] = {"verification": "WEBAUTHN"}
    compiled = compile_policy(
        parse_policy(data), registered_handlers={"forward_request", "loose_handler"}
    )
    return LocalAuthority(compiled, keys=key, store=store, clock=clock)


@pytest.mark.parametrize(
    ("verification", "verdict", "reason"),
    [
        (None, "BLOCK", "APPROVAL_VERIFICATION_REQUIRED"),
        ("CREDENTIAL", "BLOCK", "APPROVAL_VERIFICATION_REQUIRED"),
        ("WEBAUTHN", "ALLOW", "APPROVED_BY_APPROVER"),
        ("RETINA", "BLOCK", "APPROVAL_BINDING_MISMATCH"),
    ],
)
async def test_an_approval_below_the_rules_verification_is_blocked(
    clock: ManualClock,
    store: FakeUseStore,
    key: SigningKey,
    verification: str | None,
    verdict: str,
    reason: str,
) -> None:
    authority = webauthn_authority(clock, store, key)
    subject = intent(clock, amount=20000)
    held = await authority.evaluate(subject, principal=PROPOSER)
    assert (held.verdict.value, held.verification.value) == ("ESCALATE", "WEBAUTHN")
    evidence = approval(subject)
    if verification is not None:
        evidence["verification"] = verification
    decision = await authority.evaluate(subject, principal=PROPOSER, approval=evidence)
    assert (decision.verdict.value, decision.reason_codes) == (verdict, (reason,))


async def test_a_denial_needs_no_verification_to_block(
    clock: ManualClock, store: FakeUseStore, key: SigningKey
) -> None:
    authority = webauthn_authority(clock, store, key)
    subject = intent(clock, amount=20000)
    decision = await authority.evaluate(
        subject, principal=PROPOSER, approval=approval(subject, decision="DENY")
    )
    assert decision.reason_codes == ("APPROVAL_DENIED",)


def test_only_an_escalate_rule_asks_a_verification() -> None:
    data = copy.deepcopy(EXAMPLE)
    data["actions"][0]["rules"][0]["approval"] = {"verification": "WEBAUTHN"}
    with pytest.raises(PolicyError) as refused:
        parse_policy(data)
    assert "only an ESCALATE rule has approval" in str(refused.value)
    data = copy.deepcopy(EXAMPLE)
    data["actions"][0]["rules"][1]["approval"] = {"verification": "FACE"}
    with pytest.raises(PolicyError):
        parse_policy(data)


@pytest.mark.parametrize(
    "overrides",
    [{"approver_actor": "BOT-1"}, {"approver_actor": "\uff42ot-1"}, {"approver": "Agent-1"}],
)
async def test_self_approval_in_other_capitals_is_refused(
    clock: ManualClock, overrides: dict[str, Any]
) -> None:
    """Issue 30, item 13: the authority compares approver and proposer names folded."""
    data = copy.deepcopy(EXAMPLE)
    data["actions"][0]["rules"][1]["approvers"] = ["treasury-lead", "Agent-1"]
    local = LocalAuthority(
        compile_policy(parse_policy(data)),
        keys=SigningKey.generate(),
        store=FakeUseStore(),
        clock=clock,
    )
    subject = intent(clock, amount=20000)
    decision = await local.evaluate(
        subject, principal=PROPOSER, approval=approval(subject, **overrides)
    )
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("SEPARATION_OF_DUTIES_VIOLATED",),
    )


def test_a_parameter_schema_whose_ref_leads_back_to_itself_is_refused_when_loaded() -> None:
    looping = {
        "name": "looping",
        "handler": "loose_handler",
        "parameters": {
            "type": "object",
            "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "properties": {"x": {"$ref": "#/$defs/a"}},
        },
        "rules": [{"name": "any", "when": "true", "verdict": "ALLOW"}],
    }
    with pytest.raises(PolicyError) as info:
        policy([looping])
    assert info.value.code == "POLICY_INVALID"
    assert "leads back to itself" in str(info.value)


class _Panic(BaseException):
    """Stands in for pyo3's ``PanicException`` (a ``BaseException``), which the reference
    resolver under ``jsonschema`` (``referencing`` over ``rpds``) can raise."""


class _PanickingValidator:
    """A test double for a reference validator that panics on every value."""

    def is_valid(self, instance: Any) -> bool:
        raise _Panic("rpds")


async def test_a_reference_validator_that_panics_blocks_with_an_evaluation_error(
    clock: ManualClock, store: FakeUseStore, key: SigningKey
) -> None:
    compiled = policy(EXTRA)
    action = compiled.actions["broken_rule"]
    compiled.actions["broken_rule"] = dataclasses.replace(
        action, validator=_PanickingValidator(), fast_validator=None
    )
    local = LocalAuthority(compiled, keys=key, store=store, clock=clock)
    subject = intent(clock, action="broken_rule", parameters={"amount": 5})
    decision = await local.evaluate(subject, principal=PROPOSER)
    assert (decision.verdict, decision.reason_codes) == (
        Verdict.BLOCK,
        ("POLICY_EVALUATION_ERROR",),
    )
