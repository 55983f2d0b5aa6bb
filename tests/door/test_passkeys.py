"""Passkey challenges are bound to one request, intent, decision and approver.

Real authenticator responses are made by chromium's virtual authenticator in
``tests/routes/test_approval_page_browser.py``; here the refusals that come before or instead of the
``webauthn`` package's verification, against the real SQLite use store and the real authority key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.door.passkeys import ASSERTION_TYP, CHALLENGE_TTL_SECONDS, Passkeys
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.grants import SigningKey
from agentsafe.executor.policy.authority import LocalAuthority
from agentsafe.executor.policy.policy import compile_policy, load_policy
from agentsafe.executor.principals import Actor, Principal, Role
from agentsafe.executor.state.records import EnrolmentToken, PasskeyRecord
from agentsafe.executor.state.usestore import SQLiteUseStore
from agentsafe.executor.tools.harness import EXAMPLE_POLICY

APPROVER = Principal(
    id="treasury-lead", role=Role.APPROVER, actor=Actor(id="alice@bank.example", type="HUMAN")
)
ORIGIN = "https://approvals.bank.example:8443"
BOUND = {"request_id": "r", "intent_hash": "h", "decision": "APPROVE"}
CRED = {"id": "Y3JlZA"}


@pytest.fixture
async def keys(tmp_path: Path) -> AsyncIterator[tuple[Passkeys, ManualClock, SQLiteUseStore]]:
    clock = ManualClock()
    store = await SQLiteUseStore.open(tmp_path, clock=clock)
    authority = LocalAuthority(
        compile_policy(load_policy(EXAMPLE_POLICY)),
        keys=SigningKey.generate(),
        store=store,
        clock=clock,
    )
    try:
        yield Passkeys(store=store, signer=authority, clock=clock, origin=ORIGIN), clock, store
    finally:
        await store.close()


async def enrolled(store: SQLiteUseStore, clock: ManualClock) -> None:
    await store.enrolment_issue(
        EnrolmentToken("a" * 64, APPROVER.id, "ops", clock.now(), clock.now() + 60)
    )
    await store.passkey_enrol(
        "a" * 64,
        PasskeyRecord(APPROVER.id, "Y3JlZA", b"\xa5", 0, clock.now(), ("internal",)),
        now=clock.now(),
    )


def code(exc: pytest.ExceptionInfo[RequestRejected]) -> str:
    return str(exc.value.code)


async def test_without_an_origin_there_is_no_relying_party(tmp_path: Path) -> None:
    store = await SQLiteUseStore.open(tmp_path, clock=ManualClock())
    try:
        off = Passkeys(store=store, signer=None, clock=ManualClock(), origin=None)  # type: ignore[arg-type]
        assert not off.configured
        with pytest.raises(RequestRejected) as refused:
            await off.assertion_options(
                APPROVER, request_id="r", intent_hash="h", decision="APPROVE"
            )
        assert code(refused) == "WEBAUTHN_NOT_CONFIGURED"
    finally:
        await store.close()


async def test_options_need_an_enrolled_passkey_and_name_the_relying_party(
    keys: tuple[Passkeys, ManualClock, SQLiteUseStore],
) -> None:
    passkeys, clock, store = keys
    with pytest.raises(RequestRejected) as none:
        await passkeys.assertion_options(
            APPROVER, request_id="r", intent_hash="h", decision="APPROVE"
        )
    assert code(none) == "WEBAUTHN_NO_CREDENTIAL"
    await enrolled(store, clock)
    options = await passkeys.assertion_options(
        APPROVER, request_id="r", intent_hash="h", decision="APPROVE"
    )
    assert options["publicKey"]["rpId"] == "approvals.bank.example"
    assert options["publicKey"]["userVerification"] == "required"
    assert [c["id"] for c in options["publicKey"]["allowCredentials"]] == ["Y3JlZA"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_id", "another-request"),
        ("intent_hash", "sha256:another"),
        ("decision", "DENY"),
    ],
)
async def test_a_challenge_for_something_else_is_refused_before_any_signature_check(
    keys: tuple[Passkeys, ManualClock, SQLiteUseStore], field: str, value: str
) -> None:
    passkeys, clock, store = keys
    await enrolled(store, clock)
    bound = {"request_id": "r", "intent_hash": "sha256:h", "decision": "APPROVE"}
    options = await passkeys.assertion_options(APPROVER, **bound)
    presented = {**bound, field: value}
    with pytest.raises(RequestRejected) as refused:
        await passkeys.verify_assertion(
            APPROVER,
            **presented,
            challenge_token=options["challenge_token"],
            credential={"id": "Y3JlZA"},
        )
    assert code(refused) == "WEBAUTHN_CHALLENGE_INVALID"


async def test_another_approver_an_expired_or_forged_challenge_is_refused(
    keys: tuple[Passkeys, ManualClock, SQLiteUseStore],
) -> None:
    passkeys, clock, store = keys
    await enrolled(store, clock)
    bound = {"request_id": "r", "intent_hash": "sha256:h", "decision": "APPROVE"}
    options = await passkeys.assertion_options(APPROVER, **bound)
    other = Principal(id="risk-officer", role=Role.APPROVER)
    for who, token in ((other, options["challenge_token"]), (APPROVER, "not.a.token")):
        with pytest.raises(RequestRejected) as refused:
            await passkeys.verify_assertion(
                who, **bound, challenge_token=token, credential={"id": "Y3JlZA"}
            )
        assert code(refused) == "WEBAUTHN_CHALLENGE_INVALID"
    clock.advance(CHALLENGE_TTL_SECONDS)
    with pytest.raises(RequestRejected) as expired:
        await passkeys.verify_assertion(
            APPROVER,
            **bound,
            challenge_token=options["challenge_token"],
            credential={"id": "Y3JlZA"},
        )
    assert code(expired) == "WEBAUTHN_CHALLENGE_INVALID"
    assert ASSERTION_TYP.endswith("+jwt")


async def test_an_assertion_that_is_not_one_is_refused(
    keys: tuple[Passkeys, ManualClock, SQLiteUseStore],
) -> None:
    passkeys, clock, store = keys
    await enrolled(store, clock)
    bound = {"request_id": "r", "intent_hash": "sha256:h", "decision": "APPROVE"}
    options = await passkeys.assertion_options(APPROVER, **bound)
    for credential in (
        {"id": "someone-elses"},
        {"id": "Y3JlZA", "rawId": "Y3JlZA", "type": "public-key", "response": {}},
    ):
        with pytest.raises(RequestRejected) as refused:
            await passkeys.verify_assertion(
                APPROVER, **bound, challenge_token=options["challenge_token"], credential=credential
            )
        assert code(refused) == "WEBAUTHN_ASSERTION_INVALID"


async def test_enrolment_tokens_are_for_approvers_with_a_bounded_life(
    keys: tuple[Passkeys, ManualClock, SQLiteUseStore],
) -> None:
    passkeys, clock, _ = keys
    operator = Principal(id="ops", role=Role.OPERATOR)
    with pytest.raises(RequestRejected) as not_an_approver:
        await passkeys.issue_enrolment(operator, issued_by="ops")
    assert code(not_an_approver) == "ENROLMENT_PRINCIPAL_INVALID"
    for ttl in (59, 7 * 24 * 3600 + 1):
        with pytest.raises(RequestRejected) as bounded:
            await passkeys.issue_enrolment(APPROVER, issued_by="ops", ttl_seconds=ttl)
        assert code(bounded) == "REQUEST_INVALID"
    issued = await passkeys.issue_enrolment(APPROVER, issued_by="ops")
    assert issued.expires_at == clock.now() + 900
    options = await passkeys.registration_options(issued.token, display_name="alice")
    assert options["principal"] == APPROVER.id
    assert options["publicKey"]["authenticatorSelection"]["userVerification"] == "required"
    other = Principal(id="risk-officer", role=Role.APPROVER)
    with pytest.raises(RequestRejected) as foreign:
        await passkeys.register(
            issued.token, principal=other, challenge_token=options["challenge_token"], credential={}
        )
    assert code(foreign) == "ENROLMENT_TOKEN_INVALID"
    with pytest.raises(RequestRejected) as bad:
        await passkeys.register(
            issued.token,
            principal=APPROVER,
            challenge_token=options["challenge_token"],
            credential={},
        )
    assert code(bad) == "WEBAUTHN_REGISTRATION_INVALID"
    with pytest.raises(RequestRejected) as unknown:
        await passkeys.registration_options("x" * 43, display_name="alice")
    assert code(unknown) == "ENROLMENT_TOKEN_INVALID"
