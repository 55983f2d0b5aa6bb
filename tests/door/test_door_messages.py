"""What each refusal of the door says, and the small promises mutation testing found untested.

A door refusal's message is what an operator reads beside the code in an incident: it names the
rule that refused (the window, the lock, the role, the certificate) and nothing the caller sent.
These pin the words, one scenario per refusal path of ``door/door.py`` (issue 23). Also: a
refusal recorded after the door names the credential method of the principal; ``principals`` is
a property (``plane.status`` reads it as one); ``LegacyCaller`` is immutable.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentsafe.executor.door.door import LegacyCaller, check_action
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.host.secrets import SecretHandle
from agentsafe.executor.principals import Actor, Role, legacy_principal

from .test_door import (
    ALICE_TOKEN,
    AUDIT_URI,
    BATCH_TOKEN,
    TENANT,
    World,
    load,
    make_doc,
    sha,
)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, unauth="50/60")


def said(world: World, status: int, code: str, **kw: object) -> str:
    return world.refused(status, code, **kw).message  # type: ignore[arg-type]


def test_each_credential_refusal_says_which_rule(world: World) -> None:
    assert said(world, 401, "AUTH_REQUIRED") == "a credential is required"
    assert said(world, 401, "AUTH_FAILED", header="Basic x") == "the credential is not accepted"
    assert said(world, 401, "AUTH_FAILED", bearer="wrong") == "the credential is not accepted"
    both = said(world, 401, "AUTH_AMBIGUOUS", bearer=BATCH_TOKEN, cert=world.ops_cert.der)
    assert both == "present one credential, not two"
    assert said(world, 401, "AUTH_FAILED", cert=b"not der", role=Role.OPERATOR) == (
        "the certificate is not accepted"
    )
    stranger = world.ca.issue_client("spiffe://bank.example/ns/ops/sa/intruder")
    assert said(world, 401, "AUTH_FAILED", cert=stranger.der, role=Role.OPERATOR) == (
        "the certificate is not accepted"
    )
    two = world.ca.issue_client("spiffe://bank.example/ns/ops/sa/oncall", AUDIT_URI)
    assert said(world, 401, "AUTH_AMBIGUOUS", cert=two.der, role=Role.OPERATOR) == (
        "the certificate names more than one principal"
    )
    impostor = world.ca.issue_client(AUDIT_URI)
    assert said(world, 401, "AUTH_FAILED", cert=impostor.der, role=Role.OPERATOR) == (
        "the certificate is not accepted"
    )
    expired = world.token(aud="elsewhere")
    assert said(world, 401, "JWT_AUDIENCE_MISMATCH", bearer=expired) == (
        "the workload token is not accepted"
    )


def test_each_authorization_refusal_says_which_rule(world: World) -> None:
    assert said(world, 403, "ROLE_FORBIDDEN", bearer=ALICE_TOKEN, role=Role.PROPOSER) == (
        "this route is not for the caller's role"
    )
    lacks = said(world, 403, "SCOPE_FORBIDDEN", cert=world.ops_cert.der, role=Role.OPERATOR,
                 scope="secrets.reload")  # fmt: skip
    assert lacks == "the caller lacks this route's scope"


def test_the_windows_and_the_lock_say_which(tmp_path: Path) -> None:
    world = World(tmp_path, unauth="1/60")
    world.refused(401, "AUTH_FAILED", bearer="wrong")
    # the source's window refuses further failures only; a proven principal still gets through
    assert said(world, 429, "RATE_LIMITED", bearer="wrong-again") == (
        "too many failed attempts from this source"
    )
    world.auth(bearer=BATCH_TOKEN)
    world = World(tmp_path, batch_rate="1/10")
    world.auth(bearer=BATCH_TOKEN)
    assert said(world, 429, "RATE_LIMITED", bearer=BATCH_TOKEN) == (
        "the principal's rate limit is reached"
    )
    world = World(tmp_path, lockout="1/60/300")
    world.refused(403, "ROLE_FORBIDDEN", bearer=BATCH_TOKEN, role=Role.OPERATOR, scope="status")
    assert said(world, 423, "PRINCIPAL_LOCKED", bearer=BATCH_TOKEN) == ("the principal is locked")


def test_legacy_refusals_say_what_is_needed(world: World) -> None:
    principal = legacy_principal(tenant_id=TENANT, actor=Actor(id="agent", type="AI_AGENT"))
    handle = SecretHandle("EXECUTOR_CALLER_TOKEN", bytearray(b"the-token"))
    world.door.replace_principals(
        LegacyCaller(principal=principal, token=handle, require_client_certificate=True)
    )
    assert said(world, 401, "AUTH_REQUIRED", bearer="the-token") == (
        "a client certificate and the token are required"
    )
    assert world.last_method() == "bearer"  # a token came, the certificate did not
    assert said(world, 401, "AUTH_REQUIRED") == "a client certificate and the token are required"
    assert world.last_method() == "mtls"  # nothing came: the certificate is what is missing
    world.door.replace_principals(LegacyCaller(principal=principal, token=handle))
    assert said(world, 401, "AUTH_REQUIRED") == "a credential is required"
    assert said(world, 401, "AUTH_FAILED", bearer="other") == "the credential is not accepted"


def test_a_refusal_after_the_door_names_the_principals_credential_method(world: World) -> None:
    batch = world.auth(bearer=BATCH_TOKEN)
    treasury = world.auth(bearer=world.token())
    ops = world.auth(cert=world.ops_cert.der, role=Role.OPERATOR, scope="status")
    legacy = legacy_principal(tenant_id=TENANT, actor=Actor(id="agent", type="AI_AGENT"))
    for principal, method in ((batch, "bearer"), (treasury, "workload"), (ops, "mtls")):
        world.door.record_refusal(principal, "ACTION_NOT_PERMITTED_FOR_PRINCIPAL")  # type: ignore[arg-type]
        assert world.last_method() == method
    world.door.record_refusal(legacy, "ACTION_NOT_PERMITTED_FOR_PRINCIPAL")  # type: ignore[arg-type]
    assert world.last_method() == "bearer"  # the legacy caller presents a bearer token


def test_principals_is_the_set_in_force_and_legacy_callers_are_immutable(world: World) -> None:
    assert world.door.principals is world.principals
    principal = legacy_principal(tenant_id=TENANT, actor=Actor(id="agent", type="AI_AGENT"))
    caller = LegacyCaller(principal=principal, token=SecretHandle("T", bytearray(b"t")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        caller.require_client_certificate = True  # type: ignore[misc]
    assert caller.require_client_certificate is False
    world.door.replace_principals(caller)
    assert world.door.principals is caller


def _token_of_length(world: World, length: int) -> str | None:
    for pad in range(11_950, 12_050):
        token = world.token(pad="p" * pad)
        if len(token) == length:
            return token
    return None


def test_a_bearer_longer_than_16_kib_is_refused_even_when_it_verifies(world: World) -> None:
    at_bound = _token_of_length(world, 16 * 1024)
    assert at_bound is not None
    assert world.auth(bearer=at_bound).id == "treasury"
    over = _token_of_length(world, 16 * 1024 + 2) or _token_of_length(world, 16 * 1024 + 3)
    assert over is not None
    assert said(world, 401, "AUTH_FAILED", bearer=over) == "the credential is not accepted"


def test_only_the_bearer_scheme_carries_a_token(world: World) -> None:
    for scheme in ("Basic", "Token", "bearerx"):
        world.refused(401, "AUTH_FAILED", header=f"{scheme} {BATCH_TOKEN}")
    assert world.auth(header=f"bearer {BATCH_TOKEN}").id == "batch-runner"  # any case


def test_a_token_with_a_control_character_is_never_matched(world: World) -> None:
    """Even when a principal's digest is of exactly that token: it is not a token at all."""
    control = "ctl-token-\x01-" + "c" * 24
    document = make_doc(world.audit_cert.der)
    for principal in document["principals"]:
        if principal["id"] == "batch-runner":
            principal["credential"]["token_sha256"] = sha(control)
    world.door.replace_principals(load(document))
    world.refused(401, "AUTH_FAILED", header=f"Bearer {control}")


def test_an_action_outside_the_principals_list_says_so(world: World) -> None:
    batch = world.auth(bearer=BATCH_TOKEN)
    with pytest.raises(RequestRejected) as info:
        check_action(batch, "delete_everything")
    assert (info.value.code, info.value.message) == (
        "ACTION_NOT_PERMITTED_FOR_PRINCIPAL",
        "the caller may not propose this action",
    )


def test_several_authorization_headers_are_refused_in_words(world: World) -> None:
    header = [f"Bearer {BATCH_TOKEN}", f"Bearer {BATCH_TOKEN}"]
    assert said(world, 401, "AUTH_AMBIGUOUS", header=header) == (
        "send one Authorization header, not several"
    )
