"""The pure render functions: every object valid Kubernetes, restricted Pod Security, and the
executor's own loaders accepting what is rendered."""

from __future__ import annotations

import dataclasses
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from agentsafe.executor.config import WORKERS_DEFAULT, WORKERS_MAX, load_config
from agentsafe.executor.door.principals_file import load_principals_file, parse_principals
from agentsafe.executor.policy.policy import load_policy
from agentsafe.operator.models import AgentPolicySpec, PrincipalSpec
from agentsafe.operator.podsecurity import restricted_violations
from agentsafe.operator.render import (
    RenderError,
    RenderInput,
    SelectedPrincipal,
    render_agent_network_policies,
    render_children,
    render_configmap,
    render_environment,
    render_executor_network_policy,
    render_operator_token_secret,
    render_pdb,
    render_principals_document,
    render_service,
    render_service_account,
    render_statefulset,
)
from agentsafe.operator.render.workload import (
    SECRETS_DIR,
    check_environment,
    quantity,
    worker_warnings,
)

from .conftest import APPROVER_TOKEN, EXAMPLES, OPERATOR_TOKEN

K8S_VERSION = "1.34.0"


def _valid(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _with_spec(inp: RenderInput, **changes: Any) -> RenderInput:
    data = inp.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    for dotted, value in changes.items():
        target = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(parts[-1], None)
        else:
            target[parts[-1]] = value
    return dataclasses.replace(inp, spec=AgentPolicySpec.model_validate(data))


def test_every_child_is_valid_kubernetes_and_owned(render_input: RenderInput) -> None:
    rendered = render_children(render_input)
    kinds = [o["kind"] for o in rendered.objects]
    assert kinds == [
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "StatefulSet",
        "NetworkPolicy",
        "NetworkPolicy",
    ]  # one replica: no PodDisruptionBudget (test_a_budget_and_spread_from_two_replicas)
    for obj in rendered.objects:
        _valid(obj)
        meta = obj["metadata"]
        if meta["namespace"] == "payments":
            (owner,) = meta["ownerReferences"]
            assert owner["kind"] == "AgentPolicy"
            assert owner["uid"] == render_input.policy.uid
            assert owner["controller"] is True
        else:  # an agent namespace: found by label, deleted by the finalizer
            assert "ownerReferences" not in meta
            assert meta["labels"]["agentsafe.io/owner"] == "payments.payouts"
    assert rendered.principals == ("payout-agent", "treasury-lead")


def test_service_account_mounts_no_token(render_input: RenderInput) -> None:
    sa = render_service_account(render_input)
    assert sa["automountServiceAccountToken"] is False


def test_statefulset_is_restricted_and_hardened(render_input: RenderInput) -> None:
    sts = render_statefulset(render_input, digest="d" * 64)
    _valid(sts)
    assert restricted_violations(sts) == []
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["fsGroup"] == render_input.settings.executor_gid
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    # Issue 17: start-up may outlast the liveness budget; the startup probe covers it.
    startup = container["startupProbe"]
    assert startup["httpGet"] == container["livenessProbe"]["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    volumes = {v["name"]: v for v in pod["volumes"]}
    secrets = volumes["secrets"]["projected"]
    assert secrets["defaultMode"] == 0o440
    assert {s["secret"]["name"] for s in secrets["sources"]} == {
        "payouts-executor-tls",
        "payouts-authority-key",
        "payouts-downstream",
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["secrets"]["readOnly"] is True
    assert mounts["config"]["readOnly"] is True
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "data" not in volumes  # per replica, from the claim template
    # No secret value and no secret variable without _FILE.
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    derived = {e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e}
    # Only the pod's own name comes from elsewhere: each pod is its own replica.
    assert derived == {"EXECUTOR_REPLICA_ID": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert env["DOWNSTREAM_CREDENTIAL_FILE"].startswith(SECRETS_DIR + "/")
    assert "EXECUTOR_STORE_URL_FILE" not in env
    assert "topologySpreadConstraints" not in pod


def test_ephemeral_journal_uses_empty_dir(render_input: RenderInput) -> None:
    inp = _with_spec(render_input, **{"journal.size": None, "journal.ephemeral": True})
    sts = render_statefulset(inp, digest="0" * 64)
    _valid(sts)
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]
    assert restricted_violations(sts) == []


@pytest.mark.parametrize("ephemeral", [False, True])
def test_evidence_export_has_a_writable_directory(
    render_input: RenderInput, ephemeral: bool
) -> None:
    """EXECUTOR_EVIDENCE_DIR is rendered (without it evidence export answers 409
    EVIDENCE_NOT_CONFIGURED) on a mount that is not read-only: the data volume, a claim or an
    emptyDir, which the pod's fsGroup makes writable to the executor (issue 22)."""
    if ephemeral:
        render_input = _with_spec(render_input, **{"journal.size": None, "journal.ephemeral": True})
    env = render_environment(render_input)
    evidence = Path(env["EXECUTOR_EVIDENCE_DIR"])
    assert load_config(env).executor_evidence_dir == evidence
    sts = render_statefulset(render_input, digest="0" * 64)
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if evidence.is_relative_to(m["mountPath"])]
    assert mount["name"] == "data"
    assert mount.get("readOnly", False) is False
    assert not any(  # no read-only mount deeper in the path shadows it
        evidence.is_relative_to(m["mountPath"]) and m.get("readOnly")
        for m in container["volumeMounts"]
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
    assert ("emptyDir" in volumes["data"]) if ephemeral else ("data" in claims)
    assert {"name": "EXECUTOR_EVIDENCE_DIR", "value": str(evidence)} in container["env"]


def test_environment_is_what_the_executor_accepts(render_input: RenderInput) -> None:
    env = render_environment(render_input)
    config = load_config(env)
    assert config.production
    assert config.executor_mode.value == "SHADOW"
    assert str(config.executor_halt_file) == "/etc/agentsafe/config/halt"
    assert config.executor_jwt_audience == "agentsafe.io/payments/payouts"
    assert config.executor_hard_limit_single_minor == {"EUR": 100000, "USD": 100000}
    for source in config.secret_sources():
        assert source.origin.value in ("file", "absent")
    assert config.downstream_credential.variable == "DOWNSTREAM_CREDENTIAL_FILE"
    assert config.executor_tls_key.variable == "EXECUTOR_TLS_KEY_FILE"
    assert "DOWNSTREAM_ENVIRONMENT" not in env  # nothing in the executor reads it


def test_the_operators_tracing_settings_are_rendered_into_the_executor(
    render_input: RenderInput,
) -> None:
    assert not any(name.startswith("OTEL_") for name in render_environment(render_input))
    tracing = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel.observability:4318",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-secret",
    }
    settings = dataclasses.replace(render_input.settings, executor_tracing=tracing)
    env = render_environment(dataclasses.replace(render_input, settings=settings))
    assert {k: v for k, v in env.items() if k.startswith("OTEL_")} == {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel.observability:4318",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }  # never the headers: a collector credential belongs in a Secret
    wrong = dataclasses.replace(
        render_input.settings, executor_tracing={"OTEL_TRACES_EXPORTER": "zipkin"}
    )
    with pytest.raises(RenderError):
        render_environment(dataclasses.replace(render_input, settings=wrong))


def test_the_downstream_networks_are_the_executors_private_destination_override(
    render_input: RenderInput,
) -> None:
    """The executor's guard refuses private-use answers unless opened (issue 16): the networks
    the NetworkPolicy lets it reach are exactly the ones it may connect to."""
    inp = _with_spec(render_input, **{"downstream.cidrs": ["10.96.0.0/12", "fd00:10::/32"]})
    config = load_config(render_environment(inp))
    assert config.executor_egress_allow_cidrs == ("10.96.0.0/12", "fd00:10::/32")


def test_downstream_environment_is_refused_because_it_would_configure_nothing(
    render_input: RenderInput,
) -> None:
    with pytest.raises(ValueError, match=r"downstream\.environment"):
        _with_spec(render_input, **{"downstream.environment": "production"})


def test_a_downstream_url_the_executor_would_refuse_is_refused_by_the_spec(
    render_input: RenderInput,
) -> None:
    # Plain http to a non-loopback host: the executor's one URL validation refuses it in the
    # spec itself (issue 30, item 18: before, only the rendered environment was refused), so
    # admission, the reconcile and the executor agree, and the words never hold the URL.
    with pytest.raises(ValidationError) as info:
        _with_spec(render_input, **{"downstream.url": "http://payouts.bank.example/v1"})
    [error] = info.value.errors(include_url=False, include_input=False)
    assert error["loc"] == ("downstream", "url")
    assert "payouts.bank.example" not in str(error["msg"])


def test_enforcement_with_approval_renders(render_input: RenderInput) -> None:
    inp = _with_spec(render_input, mode="ENFORCEMENT", escalation="APPROVAL")
    config = load_config(render_environment(inp))
    assert config.enforcement
    assert config.executor_escalation.value == "APPROVAL"


def test_principals_round_trip_through_the_executor_loader(
    render_input: RenderInput, tmp_path: Path
) -> None:
    configmap = render_configmap(render_input)
    _valid(configmap)
    text = configmap["data"]["principals.json"]
    path = tmp_path / "principals.json"
    path.write_text(text)
    os.chmod(path, 0o444)
    loaded = load_principals_file(
        path,
        registered_actions={"create_payout"},
        jwt_configured=True,
        client_ca_configured=False,
    )
    by_id = {r.id: r for r in loaded.records}
    assert set(by_id) == {"payout-agent", "treasury-lead", "agentsafe-operator"}
    agent = by_id["payout-agent"]
    assert agent.principal.role.value == "PROPOSER"
    assert (
        loaded.by_workload(
            "https://kubernetes.default.svc.cluster.local",
            "system:serviceaccount:agents:payout-agent",
        )
        is agent
    )
    assert agent.rate_limit is not None
    assert agent.rate_limit.count == 60
    assert loaded.match_bearer(APPROVER_TOKEN) is by_id["treasury-lead"]
    operator = loaded.match_bearer(OPERATOR_TOKEN)
    assert operator is not None
    assert operator.principal.scopes == {"halt", "resume", "status"}
    # The rendered document is the executor's model, byte for byte re-rendered.
    document = render_principals_document(render_input)
    assert (
        parse_principals(
            document.model_dump(mode="json", exclude_none=True),
            registered_actions={"create_payout"},
            jwt_configured=True,
            client_ca_configured=False,
        ).summary()
        == loaded.summary()
    )


def test_no_token_is_ever_rendered(render_input: RenderInput) -> None:
    rendered = render_children(render_input)
    blob = json.dumps(rendered.objects)
    assert APPROVER_TOKEN not in blob
    assert OPERATOR_TOKEN not in blob
    principals = json.loads(rendered.objects[1]["data"]["principals.json"])
    bearer = next(p for p in principals["principals"] if p["id"] == "treasury-lead")
    assert set(bearer["credential"]) == {"kind", "token_sha256"}


def test_operator_token_secret_holds_the_token_only_there(render_input: RenderInput) -> None:
    secret = render_operator_token_secret(render_input, OPERATOR_TOKEN)
    _valid(secret)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == render_input.policy.uid


def test_policy_in_configmap_is_what_the_executor_loads(
    render_input: RenderInput, tmp_path: Path
) -> None:
    data = render_configmap(render_input)["data"]
    path = tmp_path / "policy.json"
    path.write_text(data["policy.json"])
    assert load_policy(path) == render_input.spec.policy
    assert json.loads(data["jwks.json"]) == dict(render_input.jwks)
    assert "halt" not in data  # the halt key has its own field manager


def test_invalid_cel_is_policy_invalid_and_renders_nothing(render_input: RenderInput) -> None:
    policy = render_input.spec.policy.as_json()
    policy["actions"][0]["rules"][0]["when"] = "params.amountMinor <="
    inp = _with_spec(render_input, policy=policy)
    with pytest.raises(RenderError) as info:
        render_children(inp)
    assert info.value.reason == "PolicyInvalid"
    assert "actions[0].rules[0].when" in info.value.message


def test_spec_tests_run_before_anything_renders(render_input: RenderInput) -> None:
    assert render_input.spec.tests, "the example AgentPolicy carries tests"
    case = render_input.spec.tests[0].model_dump(mode="json", by_alias=True, exclude_none=True)
    wrong = [{**case, "name": f"case {n}", "expect": {"verdict": "BLOCK"}} for n in range(7)]
    inp = _with_spec(render_input, tests=[case, *wrong])
    with pytest.raises(RenderError) as info:
        render_children(inp)
    assert info.value.reason == "PolicyTestsFailed"
    assert info.value.message.startswith("7 of 8 policy tests failed: 'case 0': verdict: expected")
    assert info.value.message.endswith("(and 2 more)")
    assert render_children(_with_spec(render_input, tests=[case])).policy_digest


def test_mtls_principal_needs_a_client_ca(render_input: RenderInput) -> None:
    mtls = SelectedPrincipal(
        name="oncall",
        spec=PrincipalSpec.model_validate(
            {"role": "OPERATOR", "scopes": ["status"], "mtls": {"sanURI": "spiffe://x/oncall"}}
        ),
    )
    inp = dataclasses.replace(render_input, principals=(*render_input.principals, mtls))
    with pytest.raises(RenderError) as info:
        render_configmap(inp)
    assert info.value.reason == "PrincipalsInvalid"
    assert "PRINCIPALS_MTLS_UNCONFIGURED" in info.value.message or "oncall" in info.value.message
    with_ca = _with_spec(inp, **{"tls.clientCA": {"name": "client-ca", "key": "ca.crt"}})
    assert "oncall" in render_configmap(with_ca)["data"]["principals.json"]
    env = load_config(render_environment(with_ca))
    assert env.executor_tls_client_ca_file is not None


def test_separation_of_duties_is_checked_at_render(render_input: RenderInput) -> None:
    # An approver whose actor is the proposer's actor: the executor would refuse to start.
    clash = SelectedPrincipal(
        name="self-approver",
        spec=PrincipalSpec.model_validate(
            {
                "role": "APPROVER",
                "actor": {"id": "payout-agent", "type": "agent"},
                "mtls": {"sanURI": "spiffe://x/self"},
            }
        ),
    )
    inp = _with_spec(
        dataclasses.replace(render_input, principals=(*render_input.principals, clash)),
        **{"tls.clientCA": {"name": "client-ca", "key": "ca.crt"}},
    )
    with pytest.raises(RenderError) as info:
        render_configmap(inp)
    assert info.value.reason == "PrincipalsInvalid"
    assert "SEPARATION" in info.value.message or "proposer" in info.value.message


def test_service_and_pdb(render_input: RenderInput) -> None:
    inp = _with_spec(render_input, replicas=2, store=_STORE)
    service = render_service(inp)
    pdb = render_pdb(inp)
    assert pdb is not None
    _valid(service)
    _valid(pdb)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == pdb["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == inp.policy.uid


@pytest.mark.parametrize(("replicas", "expected"), [(1, False), (2, True), (3, True), (16, True)])
def test_a_budget_and_spread_from_two_replicas(
    render_input: RenderInput, replicas: int, expected: bool
) -> None:
    changes: dict[str, Any] = {"replicas": replicas}
    if replicas > 1:
        changes["store"] = _STORE
    inp = _with_spec(render_input, **changes)
    kinds = [o["kind"] for o in render_children(inp).objects]
    assert ("PodDisruptionBudget" in kinds) is expected
    assert (render_pdb(inp) is not None) is expected
    pod = render_statefulset(inp, digest="0" * 64)["spec"]["template"]["spec"]
    assert ("topologySpreadConstraints" in pod) is expected


def test_executor_network_policy(render_input: RenderInput) -> None:
    policy = render_executor_network_policy(render_input)
    _valid(policy)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 8443}]
    agents = ingress["from"][0]["namespaceSelector"]["matchExpressions"][0]
    assert agents["values"] == ["agents"]
    operator = ingress["from"][1]
    assert operator["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "agentsafe-system"
    }
    dns, downstream = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert downstream["to"] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    assert downstream["ports"] == [{"protocol": "TCP", "port": 443}]


def _traced(inp: RenderInput, **tracing: str) -> RenderInput:
    settings = dataclasses.replace(
        inp.settings, executor_tracing={"OTEL_TRACES_EXPORTER": "otlp", **tracing}
    )
    return dataclasses.replace(inp, settings=settings)


@pytest.mark.parametrize(
    ("endpoint", "peer", "port"),
    [
        (
            "http://otel.observability:4318",
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "observability"}
                }
            },
            4318,
        ),
        (
            "https://otel.observability.svc.cluster.local",
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "observability"}
                }
            },
            443,
        ),
        ("http://10.0.4.7:4318", {"ipBlock": {"cidr": "10.0.4.7/32"}}, 4318),
        ("http://[fd00::7]:4318", {"ipBlock": {"cidr": "fd00::7/128"}}, 4318),
    ],
)
def test_the_executor_network_policy_admits_the_collector_when_tracing_is_on(
    render_input: RenderInput, endpoint: str, peer: dict[str, Any], port: int
) -> None:
    assert len(render_executor_network_policy(render_input)["spec"]["egress"]) == 2  # off
    # on: DNS, the downstream, the collector
    policy = render_executor_network_policy(
        _traced(render_input, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    )
    _valid(policy)
    _, _, collector = policy["spec"]["egress"]
    assert collector == {"to": [peer], "ports": [{"protocol": "TCP", "port": port}]}


def test_the_collector_rule_takes_the_traces_endpoint_and_needs_none_for_a_sidecar(
    render_input: RenderInput,
) -> None:
    bare = _traced(render_input, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://otel:4318/v1/traces")
    *_, collector = render_executor_network_policy(bare)["spec"]["egress"]
    assert collector["to"] == [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": render_input.policy.namespace}
            }
        }
    ]
    for sidecar in ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}):
        egress = render_executor_network_policy(_traced(render_input, **sidecar))["spec"]["egress"]
        assert len(egress) == 2  # localhost: the pod itself, no rule
    outside = _traced(render_input, OTEL_EXPORTER_OTLP_ENDPOINT="https://collector.example.com")
    assert len(render_executor_network_policy(outside)["spec"]["egress"]) == 2


_STORE = {
    "secretKeyRef": {"name": "payouts-pg-app", "key": "uri"},
    "podSelector": {"matchLabels": {"cnpg.io/cluster": "payouts-pg"}},
}


def test_a_shared_store_is_mounted_and_reached(render_input: RenderInput) -> None:
    inp = _with_spec(render_input, replicas=3, store=_STORE)
    sts = render_statefulset(inp, digest="0" * 64)
    _valid(sts)
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["EXECUTOR_STORE_URL_FILE"] == f"{SECRETS_DIR}/store-url"
    check_environment(env)  # the executor accepts it (production: the URL only as a file)
    sources = pod["volumes"][1]["projected"]["sources"]
    assert {
        "secret": {"name": "payouts-pg-app", "items": [{"key": "uri", "path": "store-url"}]}
    } in (sources)
    spread = pod["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    assert all(c["labelSelector"] == sts["spec"]["selector"] for c in spread)
    policy = render_executor_network_policy(inp)
    _valid(policy)
    *_, database = policy["spec"]["egress"]
    assert database == {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": inp.policy.namespace}
                },
                "podSelector": {"matchLabels": {"cnpg.io/cluster": "payouts-pg"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 5432}],
    }
    by_cidr = _with_spec(
        render_input, store={"secretKeyRef": _STORE["secretKeyRef"], "cidrs": ["10.9.0.0/16"]}
    )
    *_, database = render_executor_network_policy(by_cidr)["spec"]["egress"]
    assert database["to"] == [{"ipBlock": {"cidr": "10.9.0.0/16"}}]
    bad = _with_spec(
        render_input, store={"secretKeyRef": _STORE["secretKeyRef"], "cidrs": ["10.9.0.1/16"]}
    )
    with pytest.raises(RenderError):
        render_executor_network_policy(bad)


def test_agent_namespaces_may_not_reach_the_downstream(render_input: RenderInput) -> None:
    inp = _with_spec(render_input, **{"downstream.cidrs": ["203.0.113.0/24", "2001:db8::/32"]})
    (policy,) = render_agent_network_policies(inp)
    _valid(policy)
    assert policy["metadata"]["namespace"] == "agents"
    assert policy["spec"]["podSelector"] == {}
    peers = policy["spec"]["egress"][0]["to"]
    assert peers == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["203.0.113.0/24"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["2001:db8::/32"]}},
    ]


@pytest.mark.parametrize("cidr", ["203.0.113.7/24", "0.0.0.0/0", "not-a-cidr"])
def test_bad_cidrs_are_spec_invalid(render_input: RenderInput, cidr: str) -> None:
    inp = _with_spec(render_input, **{"downstream.cidrs": [cidr]})
    with pytest.raises(RenderError) as info:
        render_children(inp)
    assert info.value.reason == "SpecInvalid"


def test_policy_change_rolls_pods_but_jwks_does_not(render_input: RenderInput) -> None:
    def digest(inp: RenderInput) -> str:
        sts = render_children(inp).objects[3]
        return str(sts["spec"]["template"]["metadata"]["annotations"]["agentsafe.io/config-digest"])

    base = digest(render_input)
    assert digest(dataclasses.replace(render_input, jwks={"keys": []})) == base
    policy = render_input.spec.policy.as_json()
    policy["actions"][0]["rules"][0]["when"] = "params.amountMinor <= 4500"  # its tests still pass
    assert digest(_with_spec(render_input, policy=policy)) != base


def test_rendering_is_deterministic(render_input: RenderInput) -> None:
    assert render_children(render_input) == render_children(render_input)


def test_an_approvers_passkey_requirement_and_the_approval_origin_render(
    render_input: RenderInput,
) -> None:
    """Issue 21: a Principal's ``approval`` reaches the principals file, ``approvalOrigin`` the
    executor's EXECUTOR_APPROVAL_ORIGIN, and the executor's own loaders accept both."""
    principals = tuple(
        dataclasses.replace(
            p,
            spec=PrincipalSpec.model_validate(
                {
                    **p.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
                    "approval": {"verification": "WEBAUTHN"},
                }
            ),
        )
        if p.spec.role.value == "APPROVER"
        else p
        for p in render_input.principals
    )
    inp = dataclasses.replace(
        _with_spec(
            render_input,
            mode="ENFORCEMENT",
            escalation="APPROVAL",
            approvalOrigin="https://approvals.bank.example",
        ),
        principals=principals,
    )
    document = render_principals_document(inp)
    [lead] = [e for e in document.principals if e.id == "treasury-lead"]
    assert lead.approval is not None
    assert lead.approval.verification.value == "WEBAUTHN"
    config = load_config(render_environment(inp))
    assert config.executor_approval_origin == "https://approvals.bank.example"


def test_the_cloudnativepg_example_renders_a_replicated_executor(
    render_input: RenderInput,
) -> None:
    example = EXAMPLES.parent / "cloudnativepg" / "20-agentpolicy.yaml"
    body = yaml.safe_load(example.read_text())
    inp = dataclasses.replace(render_input, spec=AgentPolicySpec.model_validate(body["spec"]))
    assert len(inp.spec.tests) == 2  # run by render_children, as the operator does
    objects = render_children(inp).objects
    for obj in objects:
        _valid(obj)
    rendered = {o["kind"]: o for o in objects if o["metadata"]["namespace"] == "payments"}
    assert rendered["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    sts = rendered["StatefulSet"]
    assert sts["spec"]["replicas"] == 3
    pod = sts["spec"]["template"]["spec"]
    assert len(pod["topologySpreadConstraints"]) == 2
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["EXECUTOR_STORE_URL_FILE"] == f"{SECRETS_DIR}/store-url"
    assert "EXECUTOR_STORE_URL" not in env
    *_, database = rendered["NetworkPolicy"]["spec"]["egress"]
    assert database["to"][0]["podSelector"] == {"matchLabels": {"cnpg.io/cluster": "payouts-pg"}}
    assert database["ports"] == [{"protocol": "TCP", "port": 5432}]


def test_executor_pods_take_scheduling_and_resources_from_the_policy(
    render_input: RenderInput,
) -> None:
    pod = {
        "nodeSelector": {"node-role.example/agents": "true"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
            }
        ],
        "priorityClassName": "agents-critical",
        "imagePullSecrets": [{"name": "registry"}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    children = render_children(_with_spec(render_input, pod=pod))
    (statefulset,) = [c for c in children.objects if c["kind"] == "StatefulSet"]
    _valid(statefulset)
    spec = statefulset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == pod["nodeSelector"]
    assert spec["tolerations"] == pod["tolerations"]
    assert spec["affinity"] == pod["affinity"]
    assert spec["priorityClassName"] == "agents-critical"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["containers"][0]["resources"] == pod["resources"]
    (spread,) = spec["topologySpreadConstraints"]
    # Without a labelSelector the constraint counts this policy's executor pods.
    assert spread["labelSelector"] == statefulset["spec"]["selector"]
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"


def test_without_spec_pod_the_defaults_render(render_input: RenderInput) -> None:
    (statefulset,) = [
        c for c in render_children(render_input).objects if c["kind"] == "StatefulSet"
    ]
    spec = statefulset["spec"]["template"]["spec"]
    assert not {"nodeSelector", "tolerations", "affinity", "priorityClassName"} & set(spec)
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }


def test_an_empty_spread_list_turns_the_default_spread_off(render_input: RenderInput) -> None:
    inp = _with_spec(render_input, replicas=2, store=_STORE)
    inp2 = _with_spec(inp, **{"pod.topologySpreadConstraints": []})
    (default,) = [c for c in render_children(inp).objects if c["kind"] == "StatefulSet"]
    (off,) = [c for c in render_children(inp2).objects if c["kind"] == "StatefulSet"]
    assert len(default["spec"]["template"]["spec"]["topologySpreadConstraints"]) == 2
    assert "topologySpreadConstraints" not in off["spec"]["template"]["spec"]


def _env(statefulset: dict[str, Any]) -> dict[str, str | None]:
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def _statefulset(inp: RenderInput) -> dict[str, Any]:
    (statefulset,) = [c for c in render_children(inp).objects if c["kind"] == "StatefulSet"]
    _valid(statefulset)
    assert restricted_violations(statefulset) == []
    return statefulset


def test_one_worker_keeps_the_environment_and_resources_it_had(render_input: RenderInput) -> None:
    """A policy that asks for nothing renders no EXECUTOR_WORKERS (the executor's own default,
    one worker), so its pod template does not change under a new operator."""
    assert render_input.spec.workers is None
    statefulset = _statefulset(render_input)
    assert "EXECUTOR_WORKERS" not in _env(statefulset)
    explicit = _statefulset(_with_spec(render_input, workers=WORKERS_DEFAULT))
    assert explicit["spec"] == statefulset["spec"]


def test_spec_workers_renders_executor_workers_and_resources_per_worker(
    render_input: RenderInput,
) -> None:
    inp = _with_spec(render_input, workers=4)
    statefulset = _statefulset(inp)
    env = _env(statefulset)
    assert env["EXECUTOR_WORKERS"] == "4"
    # The executor's own loader accepts the rendered environment with the count in it.
    assert check_environment(render_environment(inp)).executor_workers == 4
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "400m", "memory": "512Mi"},
        "limits": {"memory": "2048Mi"},
    }
    # Every worker journals under the one data volume: nothing about it changes.
    assert env["EXECUTOR_JOURNAL_DIR"] == "/var/lib/agentsafe/journal"
    assert (
        statefulset["spec"]["volumeClaimTemplates"]
        == _statefulset(render_input)["spec"]["volumeClaimTemplates"]
    )
    # Explicit resources are passed through as written, whatever the workers.
    resources = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    given = _statefulset(_with_spec(inp, **{"pod.resources": resources}))
    assert given["spec"]["template"]["spec"]["containers"][0]["resources"] == resources


def test_the_operators_default_applies_when_the_spec_says_nothing(
    render_input: RenderInput,
) -> None:
    inp = dataclasses.replace(
        render_input, settings=dataclasses.replace(render_input.settings, executor_workers=3)
    )
    assert _env(_statefulset(inp))["EXECUTOR_WORKERS"] == "3"
    # spec.workers wins over the default, also when it asks for the executor's own default.
    assert _env(_statefulset(_with_spec(inp, workers=2)))["EXECUTOR_WORKERS"] == "2"
    one = _statefulset(_with_spec(inp, workers=1))
    assert "EXECUTOR_WORKERS" not in _env(one)
    assert one["spec"] == _statefulset(render_input)["spec"]


def test_the_executor_refuses_what_the_schema_would_refuse(render_input: RenderInput) -> None:
    """A count past the executor's bound never reaches a pod: the model refuses it first, and
    the executor's loader refuses the variable the same way (ConfigInvalid, not a crash)."""
    with pytest.raises(ValueError, match="workers"):
        _with_spec(render_input, workers=WORKERS_MAX + 1)
    env = render_environment(_with_spec(render_input, workers=2))
    env["EXECUTOR_WORKERS"] = str(WORKERS_MAX + 1)
    with pytest.raises(RenderError) as info:
        check_environment(env)
    assert info.value.reason == "ConfigInvalid"
    assert "EXECUTOR_WORKERS" in info.value.message


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("128Mi", Decimal(128 * 2**20)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1k", Decimal(1000)),
        ("2G", Decimal(2 * 10**9)),
    ],
)
def test_quantities_are_read_as_kubernetes_reads_them(text: str, value: Decimal) -> None:
    assert quantity(text) == value


def test_a_quantity_the_pattern_refuses_is_refused() -> None:
    for text in ("", "-1", "1mi", "1 Gi", "e3", "1e"):
        with pytest.raises(ValueError, match="quantity"):
            quantity(text)


def _warnings(inp: RenderInput, **changes: Any) -> list[str]:
    changed = _with_spec(inp, **changes)
    return worker_warnings(changed.spec, changed.settings)


def test_workers_over_the_cpu_or_memory_limit_are_warned_about(
    render_input: RenderInput,
) -> None:
    fits = {"limits": {"cpu": "4", "memory": "512Mi"}}
    assert _warnings(render_input, workers=4, **{"pod.resources": fits}) == []
    (cpu,) = _warnings(render_input, workers=4, **{"pod.resources": {"limits": {"cpu": "1500m"}}})
    assert cpu.startswith("4 workers (spec.workers) share a CPU limit of 1500m")
    assert "spec.pod.resources.limits.cpu to at least 4" in cpu
    tight = {"limits": {"cpu": "2", "memory": "256Mi"}}
    cpu, memory = _warnings(render_input, workers=3, **{"pod.resources": tight})
    assert "CPU limit of 2:" in cpu
    assert memory.startswith("3 workers (spec.workers) share a memory limit of 256Mi")
    assert "spec.pod.resources.limits.memory to at least 384Mi" in memory
    # Exactly one core and 128Mi per worker is enough; requests alone bound nothing.
    exact = {"limits": {"cpu": "2000m", "memory": "256Mi"}}
    assert _warnings(render_input, workers=2, **{"pod.resources": exact}) == []
    requests = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    assert _warnings(render_input, workers=8, **{"pod.resources": requests}) == []


def test_no_warning_for_one_worker_or_for_the_default_resources(
    render_input: RenderInput,
) -> None:
    small = {"limits": {"cpu": "250m", "memory": "256Mi"}}
    assert _warnings(render_input, **{"pod.resources": small}) == []
    assert _warnings(render_input, workers=1, **{"pod.resources": small}) == []
    assert _warnings(render_input, workers=WORKERS_MAX) == []


def test_a_warning_names_the_operators_default_as_its_source(render_input: RenderInput) -> None:
    settings = dataclasses.replace(render_input.settings, executor_workers=2)
    spec = _with_spec(render_input, **{"pod.resources": {"limits": {"cpu": "1"}}}).spec
    (warning,) = worker_warnings(spec, settings)
    assert warning.startswith("2 workers (the operator's --executor-workers) share a CPU limit")
