"""RBAC comes from the resource table, is valid, and grants nothing beyond it."""

from __future__ import annotations

import kubernetes_validate

from agentsafe.operator.rbac import render_rbac
from agentsafe.operator.resources import RESOURCES


def test_rbac_is_valid_kubernetes() -> None:
    for obj in render_rbac():
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_every_touched_resource_is_granted_exactly() -> None:
    role, binding = render_rbac(service_account="op", namespace="ops")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    wanted: dict[tuple[str, str], set[str]] = {}
    for resource in RESOURCES:
        wanted.setdefault((resource.group, resource.plural), set()).update(resource.verbs)
    assert granted == wanted
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_least_privilege() -> None:
    role, _ = render_rbac()
    for rule in role["rules"]:
        assert "*" not in rule["verbs"]
        assert "*" not in rule.get("resources", [])
        assert "update" not in rule["verbs"]  # server-side apply only
        assert "escalate" not in rule["verbs"]
        assert "bind" not in rule["verbs"]
        if "secrets" in rule.get("resources", []):
            assert sorted(rule["verbs"]) == ["create", "get"]  # never list, update or delete
        assert "pods" not in rule.get("resources", [])
    non_resource = [r for r in role["rules"] if "nonResourceURLs" in r]
    assert non_resource == [
        {
            "nonResourceURLs": ["/openid/v1/jwks", "/.well-known/openid-configuration"],
            "verbs": ["get"],
        }
    ]


def test_the_webhook_configuration_is_granted_by_name_only() -> None:
    """Patching any ValidatingWebhookConfiguration would let the operator switch off another
    admission control: it may patch only its own, by name."""
    role, _ = render_rbac(named={"webhookConfiguration": "agentsafe-operator"})
    rules = [
        r for r in role["rules"] if "validatingwebhookconfigurations" in r.get("resources", [])
    ]
    assert rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["agentsafe-operator"],
            "verbs": ["patch"],
        }
    ]
