"""examples/cert-manager/: the executor's serving certificate issued by cert-manager.

A documented example (cert-manager is not installed here): its Secret is the one the AgentPolicy
example names, and its DNS names cover the Service and pods the operator renders for it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import yaml

from agentsafe.operator.models import AgentPolicySpec
from agentsafe.operator.render.common import PolicyRef, names

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cert-manager" / "payouts-executor-tls.yaml"
POLICY = ROOT / "examples" / "k8s" / "30-agentpolicy.yaml"


def test_the_certificate_serves_the_example_policys_executor() -> None:
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc}
    certificate = docs["Certificate"]
    policy = yaml.safe_load(POLICY.read_text())
    spec = AgentPolicySpec.model_validate(policy["spec"])
    namespace = policy["metadata"]["namespace"]
    assert certificate["metadata"]["namespace"] == namespace
    assert certificate["spec"]["secretName"] == spec.tls.secret_name
    assert certificate["spec"]["issuerRef"]["name"] == docs["Issuer"]["metadata"]["name"]
    assert "server auth" in certificate["spec"]["usages"]
    ref = PolicyRef(name=policy["metadata"]["name"], namespace=namespace, uid="u")
    service = names(ref).service
    dns = certificate["spec"]["dnsNames"]
    wanted = [f"{service}.{namespace}.svc", f"{service}-0.{service}.{namespace}.svc"]
    for host in wanted:
        assert any(fnmatchcase(host, pattern) for pattern in dns), host
