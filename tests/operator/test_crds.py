"""The generated CRDs: valid manifests, structural schemas, and CEL rules that say what they mean.

The CEL rules are evaluated here with the CEL engine the executor uses (``cel``), against
objects as the API server would see them after defaulting; the API server itself evaluates
them in the end-to-end suite.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import cel
import jsonschema
import kubernetes_validate
import pytest

from agentsafe.executor.config import WORKERS_MAX
from agentsafe.operator.crds import generate_crds, peering_crds, plain_text
from agentsafe.operator.models import AgentPolicySpec, HaltSwitchSpec, PrincipalSpec

FORBIDDEN = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const", "discriminator"}


def _crd(kind: str) -> dict[str, Any]:
    return next(c for c in generate_crds() if c["spec"]["names"]["kind"] == kind)


def _root(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = _crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def _rules(kind: str, path: str) -> list[str]:
    node = _root(kind)
    for part in [p for p in path.split(".") if p]:
        node = node["properties"][part]
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


def _passes(kind: str, path: str, obj: dict[str, Any]) -> bool:
    return all(bool(cel.evaluate(rule, {"self": obj})) for rule in _rules(kind, path))


@pytest.mark.parametrize(
    "crd", [*generate_crds(), *peering_crds()], ids=lambda c: c["metadata"]["name"]
)
def test_crd_is_a_valid_manifest(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, "1.34.0", strict=True)


@pytest.mark.parametrize("kind", ["AgentPolicy", "Principal", "HaltSwitch"])
def test_schema_is_structural(kind: str) -> None:
    for path, node in _nodes(_root(kind)):
        if node.get("x-kubernetes-int-or-string") is True:
            # The one union a structural schema allows (a resource quantity): exactly this anyOf.
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
            continue
        assert not FORBIDDEN & set(node), f"{path}: {FORBIDDEN & set(node)}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), path


@pytest.mark.parametrize(
    ("kind", "columns", "short"),
    [
        ("AgentPolicy", ["Mode", "Ready", "Halted", "Replicas", "Workers", "Age"], "ap"),
        ("Principal", ["Role", "Credential", "Policies", "Age"], "asp"),
        ("HaltSwitch", ["Halted", "Reason", "Acknowledged", "Age"], "halt"),
    ],
)
def test_names_columns_status(kind: str, columns: list[str], short: str) -> None:
    crd = _crd(kind)
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["group"] == "agentsafe.io"
    assert crd["spec"]["scope"] == "Namespaced"
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns
    assert short in crd["spec"]["names"]["shortNames"]
    assert crd["spec"]["names"]["categories"] == ["agentsafe"]


def test_policy_document_is_embedded_with_free_form_parameters() -> None:
    action = _root("AgentPolicy")["properties"]["spec"]["properties"]["policy"]["properties"][
        "actions"
    ]["items"]
    assert action["properties"]["parameters"]["x-kubernetes-preserve-unknown-fields"] is True
    rule = action["properties"]["rules"]["items"]
    assert rule["properties"]["verdict"]["enum"] == ["ALLOW", "BLOCK", "ESCALATE"]
    assert "reasonCode" in rule["properties"]


def test_defaults_come_from_the_models() -> None:
    spec = _root("AgentPolicy")["properties"]["spec"]
    assert spec["properties"]["mode"]["default"] == "SHADOW"
    assert spec["properties"]["escalation"]["default"] == "NONE"
    assert spec["properties"]["intentTTLSeconds"]["default"] == 60
    assert spec["properties"]["journal"]["properties"]["ephemeral"]["default"] is False


def _credential(**extra: Any) -> dict[str, Any]:
    return {"role": "APPROVER", "actor": {"id": "a", "type": "person"}, **extra}


def test_principal_needs_exactly_one_credential() -> None:
    sa = {"serviceAccount": {"name": "a", "namespace": "b"}}
    bearer = {"bearer": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert _passes("Principal", "spec", _credential(**sa))
    assert not _passes("Principal", "spec", _credential(**sa, **bearer))
    assert not _passes("Principal", "spec", _credential())
    # The model agrees with the CEL rules on the same objects (one source of truth).
    PrincipalSpec.model_validate(_credential(**sa))


def test_principal_role_shapes() -> None:
    sa = {"serviceAccount": {"name": "a", "namespace": "b"}}
    proposer = {
        "role": "PROPOSER",
        "tenantId": "3f1c2a9e-8d4b-4c6e-9a7f-1b2c3d4e5f60",
        "actor": {"id": "a", "type": "agent"},
        "allowedActions": ["x"],
        **sa,
    }
    assert _passes("Principal", "spec", proposer)
    assert not _passes("Principal", "spec", {**proposer, "scopes": ["halt"]})
    assert not _passes("Principal", "spec", {"role": "OPERATOR", **sa})
    assert _passes("Principal", "spec", {"role": "OPERATOR", "scopes": ["halt"], **sa})


def test_halt_needs_a_reason() -> None:
    assert _passes("HaltSwitch", "spec", {"halted": False})
    assert not _passes("HaltSwitch", "spec", {"halted": True})
    assert not _passes("HaltSwitch", "spec", {"halted": True, "reason": ""})
    assert _passes("HaltSwitch", "spec", {"halted": True, "reason": "incident 42"})
    HaltSwitchSpec.model_validate({"halted": True})  # the rule lives in CEL, not the model


def test_journal_is_ephemeral_xor_sized() -> None:
    assert _passes("AgentPolicy", "spec.journal", {"ephemeral": False, "size": "1Gi"})
    assert _passes("AgentPolicy", "spec.journal", {"ephemeral": True})
    assert not _passes("AgentPolicy", "spec.journal", {"ephemeral": True, "size": "1Gi"})
    assert not _passes("AgentPolicy", "spec.journal", {"ephemeral": False})


def test_approval_escalation_is_not_for_shadow() -> None:
    assert not _passes("AgentPolicy", "spec", {"mode": "SHADOW", "escalation": "APPROVAL"})
    assert _passes("AgentPolicy", "spec", {"mode": "ENFORCEMENT", "escalation": "APPROVAL"})
    assert _passes("AgentPolicy", "spec", {"mode": "SHADOW", "escalation": "NONE"})


def test_more_than_one_replica_needs_a_shared_store() -> None:
    store = {"secretKeyRef": {"name": "pg-app", "key": "uri"}, "podSelector": {}}
    assert _passes("AgentPolicy", "spec", {"mode": "SHADOW", "escalation": "NONE", "replicas": 1})
    assert not _passes(
        "AgentPolicy", "spec", {"mode": "SHADOW", "escalation": "NONE", "replicas": 2}
    )
    assert _passes(
        "AgentPolicy",
        "spec",
        {"mode": "SHADOW", "escalation": "NONE", "replicas": 3, "store": store},
    )


def test_the_store_says_where_the_database_is() -> None:
    ref = {"secretKeyRef": {"name": "pg-app", "key": "uri"}}
    assert not _passes("AgentPolicy", "spec.store", ref)
    assert _passes("AgentPolicy", "spec.store", {**ref, "cidrs": ["10.0.0.0/24"]})
    assert _passes("AgentPolicy", "spec.store", {**ref, "podSelector": {}, "namespace": "db"})
    assert not _passes(
        "AgentPolicy", "spec.store", {**ref, "cidrs": ["10.0.0.0/24"], "namespace": "db"}
    )


def test_static_header_credential_needs_a_header() -> None:
    path = "spec.downstream.credential"
    ref = {"secretKeyRef": {"name": "s", "key": "k"}}
    assert not _passes("AgentPolicy", path, {"kind": "STATIC_HEADER", **ref})
    assert _passes("AgentPolicy", path, {"kind": "STATIC_HEADER", "header": "X-Key", **ref})


def test_the_api_server_refuses_a_worker_count_out_of_range(policy_body: dict[str, Any]) -> None:
    """The CRD's schema (what the API server validates) and the model both refuse 0 and
    WORKERS_MAX + 1; unset has no default in the CRD, so the operator's own default applies."""
    node = _root("AgentPolicy")["properties"]["spec"]["properties"]["workers"]
    assert "default" not in node
    schema = jsonschema.Draft202012Validator(node)
    for good in (1, 2, WORKERS_MAX):
        assert schema.is_valid(good), good
        AgentPolicySpec.model_validate({**policy_body["spec"], "workers": good})
    assert not schema.is_valid("2")
    for bad in (0, -1, WORKERS_MAX + 1, 1.5):
        assert not schema.is_valid(bad), bad
        with pytest.raises(ValueError, match="workers"):
            AgentPolicySpec.model_validate({**policy_body["spec"], "workers": bad})
    status = _root("AgentPolicy")["properties"]["status"]["properties"]
    assert status["workers"]["type"] == "integer"


def test_policy_name_is_bounded() -> None:
    assert _passes("AgentPolicy", "", {"metadata": {"name": "p" * 40}})
    assert not _passes("AgentPolicy", "", {"metadata": {"name": "p" * 41}})


def test_models_refuse_unknown_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        AgentPolicySpec.model_validate({"mode": "SHADOW", "surprise": 1})


def test_the_cloudnativepg_example_is_a_valid_replicated_policy() -> None:
    from pathlib import Path

    import yaml

    path = (
        Path(__file__).resolve().parents[2] / "examples" / "cloudnativepg" / "20-agentpolicy.yaml"
    )
    body = yaml.safe_load(path.read_text())
    spec = AgentPolicySpec.model_validate(body["spec"])
    assert spec.replicas == 3
    assert spec.store is not None
    assert _passes("AgentPolicy", "spec", spec.wire())
    assert _passes("AgentPolicy", "spec.store", spec.store.wire())


def test_only_an_approver_carries_approval_and_the_origin_needs_approvals() -> None:
    approver = {"role": "APPROVER", "actor": {"id": "a", "type": "HUMAN"}, "bearer": {}}
    assert _passes("Principal", "spec", {**approver, "approval": {"verification": "WEBAUTHN"}})
    operator = {"role": "OPERATOR", "scopes": ["approvers"], "bearer": {}}
    assert not _passes("Principal", "spec", {**operator, "approval": {}})
    origin = {"approvalOrigin": "https://approvals.bank.example"}
    assert _passes(
        "AgentPolicy", "spec", {"mode": "ENFORCEMENT", "escalation": "APPROVAL", **origin}
    )
    assert not _passes(
        "AgentPolicy", "spec", {"mode": "ENFORCEMENT", "escalation": "NONE", **origin}
    )


def _fields(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for name, sub in node.get("properties", {}).items():
        found.append((f"{path}.{name}", sub))
        found.extend(_fields(sub, f"{path}.{name}"))
    if "items" in node:
        found.extend(_fields(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), dict):
        found.extend(_fields(node["additionalProperties"], f"{path}{{}}"))
    return found


@pytest.mark.parametrize("crd", generate_crds(), ids=lambda crd: crd["spec"]["names"]["kind"])
def test_every_field_is_described_for_kubectl_explain(crd: dict[str, Any]) -> None:
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = _fields(root, "")
    assert len(fields) > 25
    # .metadata is ObjectMeta: the API server allows it no description of ours.
    fields = [(path, sub) for path, sub in fields if path != ".metadata"]
    undescribed = [path for path, sub in fields if not sub.get("description")]
    assert undescribed == []
    # Plain text: no RST roles or literals from the models' docstrings.
    for path, sub in fields:
        assert not re.search(r"``|:[a-z]+:`", sub["description"]), path


@pytest.mark.parametrize("crd", generate_crds(), ids=lambda crd: crd["spec"]["names"]["kind"])
def test_conditions_are_a_map_by_type_with_date_time_stamps(crd: dict[str, Any]) -> None:
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]
    stamp = conditions["items"]["properties"]["lastTransitionTime"]
    assert stamp["format"] == "date-time"


def test_plain_text_drops_rst() -> None:
    assert plain_text("uses ``EXECUTOR_X`` and :class:`~a.b.Policy`\n  here") == (
        "uses EXECUTOR_X and Policy here"
    )
