"""Loading agent-safe.principals/1: schema, refusals to start, lookups."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.door.principals_file import (
    PrincipalsDocument,
    PrincipalsFileError,
    load_principals_file,
    parse_principals,
    render_principals_file,
)
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.principals import Role, Verification

TENANT = "00000000-0000-4000-8000-000000000001"
TOKEN = "batch-runner-token-0123456789"
SECRET_DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


def document() -> dict[str, Any]:
    return {
        "version": "agent-safe.principals/1",
        "principals": [
            {
                "id": "treasury-workflow",
                "role": "PROPOSER",
                "tenant_id": TENANT,
                "actor": {
                    "id": "synthetic-payout-agent",
                    "type": "AI_AGENT",
                    "runtime": "workflow-runner",
                },
                "allowed_actions": ["forward_request"],
                "credential": {
                    "kind": "WORKLOAD_JWT",
                    "issuer": "https://kubernetes.default.svc.cluster.example",
                    "subject": "system:serviceaccount:agent-safe-agents:treasury-workflow",
                    "required_claims": {"kubernetes.io/namespace": "agent-safe-agents"},
                },
                "rate_limit": "120/60",
            },
            {
                "id": "batch-runner",
                "role": "PROPOSER",
                "tenant_id": TENANT,
                "actor": {"id": "synthetic-batch-agent", "type": "AI_AGENT"},
                "allowed_actions": ["forward_request"],
                "credential": {"kind": "BEARER", "token_sha256": SECRET_DIGEST},
            },
            {
                "id": "ops-oncall",
                "role": "OPERATOR",
                "scopes": ["status", "metrics", "secrets.reload"],
                "credential": {"kind": "MTLS", "san_uri": "spiffe://bank.example/ns/ops/sa/oncall"},
            },
            {
                "id": "alice",
                "role": "APPROVER",
                "actor": {"id": "alice@bank.example", "type": "HUMAN"},
                "credential": {"kind": "BEARER", "token_sha256": "ab" * 32},
            },
        ],
    }


def parse(doc: Any, **kw: Any):  # type: ignore[no-untyped-def]
    options = {
        "registered_actions": ["forward_request"],
        "jwt_configured": True,
        "client_ca_configured": True,
    }
    options.update(kw)
    return parse_principals(json.dumps(doc), **options)


def refused(doc: Any, **kw: Any) -> PrincipalsFileError:
    with pytest.raises(PrincipalsFileError) as info:
        parse(doc, **kw)
    assert isinstance(info.value, ConfigError)
    assert info.value.variable == "EXECUTOR_PRINCIPALS_FILE"
    return info.value


def test_the_specification_example_loads() -> None:
    principals = parse(document())
    assert len(principals) == 4
    treasury = principals.get("treasury-workflow")
    assert treasury is not None
    assert treasury.principal.role is Role.PROPOSER
    assert treasury.principal.tenant_id == TENANT
    assert treasury.principal.allowed_actions == frozenset({"forward_request"})
    assert treasury.rate_limit is not None
    assert str(treasury.rate_limit) == "120/60"
    ops = principals.by_san_uri("spiffe://bank.example/ns/ops/sa/oncall")
    assert ops is not None
    assert ops.principal.scopes == frozenset({"status", "metrics", "secrets.reload"})
    assert (
        principals.by_workload(
            "https://kubernetes.default.svc.cluster.example",
            "system:serviceaccount:agent-safe-agents:treasury-workflow",
        )
        is treasury
    )
    assert principals.get("alice").principal.role is Role.APPROVER  # type: ignore[union-attr]
    assert principals.bearer_principal_ids() == ("batch-runner", "alice")
    assert {"id": "ops-oncall", "role": "OPERATOR", "credential": "MTLS"} in principals.summary()


def test_bearer_lookup_by_digest() -> None:
    principals = parse(document())
    record = principals.match_bearer(TOKEN)
    assert record is not None
    assert record.id == "batch-runner"
    assert principals.match_bearer(TOKEN + "x") is None
    assert principals.match_bearer(SECRET_DIGEST) is None  # the digest itself is not the token
    assert principals.match_bearer(bytearray(TOKEN.encode())) is record


@pytest.mark.parametrize(
    ("mutate", "code", "principal"),
    [
        (lambda d: d["principals"].append(copy.deepcopy(d["principals"][1])),
         "PRINCIPALS_DUPLICATE_ID", "batch-runner"),
        (lambda d: d["principals"][3]["credential"].update(token_sha256=SECRET_DIGEST),
         "PRINCIPALS_CREDENTIAL_SHARED", "alice"),
        (lambda d: d["principals"][0].update(allowed_actions=["transfer_funds"]),
         "PRINCIPALS_ACTION_UNKNOWN", "treasury-workflow"),
        (lambda d: d["principals"][0].update(rate_limit="120 per minute"),
         "PRINCIPALS_RATE_LIMIT_INVALID", "treasury-workflow"),
        (lambda d: d["principals"][0].update(rate_limit="0/60"),
         "PRINCIPALS_RATE_LIMIT_INVALID", "treasury-workflow"),
        (lambda d: d["principals"][2].update(scopes=["status", "root"]),
         "PRINCIPALS_ROLE_INVALID", "ops-oncall"),
        (lambda d: d["principals"][1].pop("tenant_id"), "PRINCIPALS_ROLE_INVALID", "batch-runner"),
        (lambda d: d["principals"][3].pop("actor"), "PRINCIPALS_ROLE_INVALID", "alice"),
        (lambda d: d["principals"][1].update(colour="blue"), "PRINCIPALS_FILE_INVALID",
         "batch-runner"),
        (lambda d: d["principals"][1]["credential"].update(token_sha256="zz"),
         "PRINCIPALS_FILE_INVALID", "batch-runner"),
        (lambda d: d["principals"][1]["credential"].update(kind="PASSWORD"),
         "PRINCIPALS_FILE_INVALID", "batch-runner"),
        (lambda d: d["principals"][1].update(tenant_id="not-a-uuid"), "PRINCIPALS_FILE_INVALID",
         "batch-runner"),
        (lambda d: d.update(version="agent-safe.principals/2"), "PRINCIPALS_FILE_INVALID", None),
    ],
)  # fmt: skip
def test_refusals_to_start_name_the_principal(mutate: Any, code: str, principal: str) -> None:
    doc = document()
    mutate(doc)
    error = refused(doc)
    assert error.code == code
    assert error.principal_id == principal
    if principal is not None:
        assert principal in str(error)
    assert SECRET_DIGEST not in str(error)


def test_schema_errors_do_not_echo_values() -> None:
    doc = document()
    doc["principals"][1]["credential"]["token_sha256"] = "SECRET-VALUE-" + "x" * 20
    error = refused(doc)
    assert "SECRET-VALUE" not in str(error)


def test_workload_without_jwt_configuration_is_refused() -> None:
    error = refused(document(), jwt_configured=False)
    assert (error.code, error.principal_id) == ("PRINCIPALS_JWT_UNCONFIGURED", "treasury-workflow")


def test_certificate_without_client_ca_is_refused() -> None:
    error = refused(document(), client_ca_configured=False)
    assert (error.code, error.principal_id) == ("PRINCIPALS_MTLS_UNCONFIGURED", "ops-oncall")


def test_more_than_two_hundred_principals_is_refused() -> None:
    doc = document()
    base = doc["principals"][1]
    doc["principals"] = []
    for i in range(201):
        entry = copy.deepcopy(base)
        entry["id"] = f"p{i}"
        entry["credential"]["token_sha256"] = hashlib.sha256(str(i).encode()).hexdigest()
        doc["principals"].append(entry)
    assert refused(doc).code == "PRINCIPALS_TOO_MANY"
    doc["principals"] = doc["principals"][:200]
    assert len(parse(doc)) == 200


def test_shared_workload_and_certificate_identities_are_refused() -> None:
    doc = document()
    twin = copy.deepcopy(doc["principals"][0])
    twin["id"] = "twin"
    twin["actor"]["id"] = "other-agent"
    doc["principals"].append(twin)
    assert refused(doc).code == "PRINCIPALS_CREDENTIAL_SHARED"
    doc = document()
    twin = copy.deepcopy(doc["principals"][2])
    twin["id"] = "ops-twin"
    doc["principals"].append(twin)
    assert refused(doc).code == "PRINCIPALS_CREDENTIAL_SHARED"


@pytest.mark.parametrize(
    "mutate",
    [
        # the proposer's actor is the approver's actor
        lambda d: d["principals"][1]["actor"].update(id="alice@bank.example"),
        # the proposer's actor is the approver's id
        lambda d: d["principals"][1]["actor"].update(id="alice"),
        # the proposer's id is the approver's actor
        lambda d: d["principals"][3]["actor"].update(id="batch-runner"),
        # the proposer's actor is an operator's actor
        lambda d: d["principals"][2].update(actor={"id": "synthetic-batch-agent", "type": "HUMAN"}),
    ],
)
def test_separation_of_duties_at_load(mutate: Any) -> None:
    doc = document()
    mutate(doc)
    error = refused(doc)
    assert error.code == "SEPARATION_OF_DUTIES_VIOLATED"
    assert error.principal_id == "batch-runner"


def test_invalid_json_is_refused() -> None:
    with pytest.raises(PrincipalsFileError) as info:
        parse_principals(
            b"{not json", registered_actions=[], jwt_configured=False, client_ca_configured=False
        )
    assert info.value.code == "PRINCIPALS_FILE_INVALID"


def write(path: Path, doc: Any, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(doc))
    os.chmod(path, mode)
    return path


def load(path: Path):  # type: ignore[no-untyped-def]
    return load_principals_file(
        path,
        registered_actions=["forward_request"],
        jwt_configured=True,
        client_ca_configured=True,
    )


def test_file_mode_and_type_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path / "principals.json", document(), 0o644)
    assert len(load(path)) == 4
    for mode in (0o620, 0o602, 0o666):
        os.chmod(path, mode)
        with pytest.raises(PrincipalsFileError) as info:
            load(path)
        assert info.value.code == "PRINCIPALS_FILE_MODE"
    with pytest.raises(PrincipalsFileError) as info:
        load(tmp_path)
    assert info.value.code == "PRINCIPALS_FILE_MODE"
    with pytest.raises(PrincipalsFileError) as info:
        load(tmp_path / "missing.json")
    assert info.value.code == "PRINCIPALS_FILE_UNREADABLE"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user owns needs root")
def test_file_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "principals.json", document())
    os.chown(path, 65534, 65534)
    with pytest.raises(PrincipalsFileError) as info:
        load(path)
    assert info.value.code == "PRINCIPALS_FILE_OWNER"
    os.chown(path, 0, 0)
    assert len(load(path)) == 4


def test_reload_revokes_a_removed_principal(tmp_path: Path) -> None:
    path = write(tmp_path / "principals.json", document())
    first = load(path)
    assert first.match_bearer(TOKEN) is not None
    doc = document()
    del doc["principals"][1]
    write(path, doc)
    second = load(path)
    assert second.match_bearer(TOKEN) is None
    assert second.get("batch-runner") is None


def test_render_round_trips() -> None:
    model = PrincipalsDocument.model_validate(document())
    text = render_principals_file(model)
    again = parse(json.loads(text))
    assert [r.id for r in again.records] == [r.id for r in parse(document()).records]


def test_an_approver_may_require_a_passkey_and_nobody_else_carries_approval() -> None:
    doc = document()
    doc["principals"][3]["approval"] = {"verification": "WEBAUTHN"}
    alice = parse(doc).get("alice")
    assert alice is not None
    assert alice.principal.verification is Verification.WEBAUTHN
    assert parse(document()).get("alice").principal.verification is Verification.CREDENTIAL  # type: ignore[union-attr]
    doc["principals"][3]["approval"] = {"verification": "FINGERPRINT"}
    assert refused(doc).code == "PRINCIPALS_FILE_INVALID"
    doc = document()
    doc["principals"][2]["approval"] = {"verification": "WEBAUTHN"}
    error = refused(doc)
    assert (error.code, error.principal_id) == ("PRINCIPALS_ROLE_INVALID", "ops-oncall")


# Issue 30, item 13: names are compared once, as principals.actor_key writes them.
@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        # two spellings of the approver's actor: another principal's actor differs in case only
        (
            lambda d: d["principals"][2].update(
                actor={"id": "Alice@Bank.example", "type": "HUMAN"}
            ),
            "PRINCIPALS_ACTOR_COLLISION",
        ),
        # a principal id that differs from another's in case only
        (lambda d: d["principals"][2].update(id="ALICE"), "PRINCIPALS_ACTOR_COLLISION"),
        # a fullwidth letter (NFKC) and a soft hyphen (default-ignorable)
        (
            lambda d: d["principals"][1]["actor"].update(id="\uff41lice@bank.example"),
            "PRINCIPALS_ACTOR_COLLISION",
        ),
        (
            lambda d: d["principals"][1]["actor"].update(id="al\u00adice@bank.example"),
            "PRINCIPALS_ACTOR_COLLISION",
        ),
    ],
)
def test_two_spellings_of_one_actor_are_refused(mutate: Any, code: str) -> None:
    doc = document()
    mutate(doc)
    error = refused(doc)
    assert error.code == code
    assert error.principal_id == "alice"  # the later of the two, by id; the names are not echoed
    assert "bank.example" not in str(error).lower()


def test_one_spelling_shared_by_two_principals_is_still_one_person() -> None:
    doc = document()  # the approver is also the on-call operator: the same spelling is allowed
    doc["principals"][2]["actor"] = {"id": "alice@bank.example", "type": "HUMAN"}
    assert len(parse(doc)) == 4
    doc = document()  # one principal may spell itself two ways (id and actor)
    doc["principals"][3]["actor"]["id"] = "Alice"
    assert len(parse(doc)) == 4


def test_separation_of_duties_at_load_folds_case() -> None:
    doc = document()
    doc["principals"][3]["actor"]["id"] = "Synthetic-Batch-Agent"  # the proposer's, in capitals
    error = refused(doc)
    assert error.code in {"SEPARATION_OF_DUTIES_VIOLATED", "PRINCIPALS_ACTOR_COLLISION"}
    assert error.principal_id in {"batch-runner", "alice"}
