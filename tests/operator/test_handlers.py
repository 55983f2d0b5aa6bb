"""Handler wiring and behaviour, against an in-memory API stand-in (``FakeKube``).

The handler functions are called directly with the arguments kopf would pass (``body``,
``patch``, ``memo``); ``kopf.Patch`` and ``kopf.Memo`` are kopf's own classes. The halt tests
run a real TLS control endpoint on loopback (a stand-in for an executor's control routes,
named so) and check the operator reaches it as its OPERATOR principal.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from aiohttp import web

from agentsafe.executor.door.principals_file import parse_principals
from agentsafe.operator.handlers import (
    build_registry,
    halt_handler,
    halt_retry_timer,
    policy_delete_handler,
    policy_handler,
    principal_handler,
)
from agentsafe.operator.kubeapi import ApiError
from agentsafe.operator.runtime import Runtime, refresh_jwks
from agentsafe.operator.settings import HALT_FIELD_MANAGER, OperatorSettings
from tests.support.pki import Issued, TestCA

from .conftest import NS, memo_for, secret, sts_status
from .fakekube import FakeKube, RecordingEvents, check_status

CONFIG = (
    "ConfigMap",
    NS,
    "payouts-executor-config",
)
POLICY = ("AgentPolicy", NS, "payouts")


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


async def _reconcile(rt: Runtime, body: dict[str, Any]) -> dict[str, Any]:
    patch = kopf.Patch()
    await policy_handler(body=kopf.Body(body), patch=patch, memo=memo_for(rt))
    status = dict(patch.get("status") or {})
    check_status("AgentPolicy", status)
    return status


async def test_reconcile_applies_every_child_and_generates_secrets_once(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    status = await _reconcile(runtime, policy_body)
    assert _ready(status)["reason"] == "ExecutorsNotReady"  # no kubelet: no ready pods
    reconciled = next(c for c in status["conditions"] if c["type"] == "Reconciled")
    assert reconciled["status"] == "True"
    assert reconciled["observedGeneration"] == 1
    assert status["principals"] == ["payout-agent", "treasury-lead"]
    assert status["audience"] == "agentsafe.io/payments/payouts"
    for kind, name in [
        ("ServiceAccount", "payouts-executor"),
        ("StatefulSet", "payouts-executor"),
        ("Service", "payouts-executor"),
        ("NetworkPolicy", "payouts-executor"),
        ("Secret", "payouts-operator-token"),
        ("Secret", "payouts-authority-key"),
    ]:
        assert (kind, NS, name) in kube.objects, (kind, name)
    assert ("NetworkPolicy", "agents", "agentsafe-payments-payouts-no-downstream") in kube.objects
    assert ("PodDisruptionBudget", NS, "payouts-executor") not in kube.objects  # one replica
    token_secret = kube.objects[("Secret", NS, "payouts-operator-token")]
    key_secret = kube.objects[("Secret", NS, "payouts-authority-key")]
    # The principals file holds the digest of the generated token, never the token.
    token = base64.b64decode(token_secret["data"]["token"]).decode()
    principals = kube.objects[CONFIG]["data"]["principals.json"]
    assert token not in principals
    loaded = parse_principals(
        principals,
        registered_actions={"create_payout"},
        jwt_configured=True,
        client_ca_configured=False,
    )
    assert loaded.match_bearer(token) is not None
    # A second pass changes neither generated Secret.
    await _reconcile(runtime, policy_body)
    assert kube.objects[("Secret", NS, "payouts-operator-token")] == token_secret
    assert kube.objects[("Secret", NS, "payouts-authority-key")] == key_secret


async def test_two_replicas_get_a_budget_that_goes_when_scaled_back_to_one(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    pdb = ("PodDisruptionBudget", NS, "payouts-executor")
    policy_body["spec"]["store"] = {
        "secretKeyRef": {"name": "payouts-pg-app", "key": "uri"},
        "podSelector": {"matchLabels": {"cnpg.io/cluster": "payouts-pg"}},
    }
    policy_body["spec"]["replicas"] = 2
    status = await _reconcile(runtime, policy_body)
    assert _ready(status)["reason"] == "SecretMissing"  # the store's Secret is checked too
    assert "Secret payments/payouts-pg-app" in _ready(status)["message"]
    kube.put(secret(NS, "payouts-pg-app", {"uri": b"postgresql://app@payouts-pg-rw/app"}))
    await _reconcile(runtime, policy_body)
    assert kube.objects[pdb]["spec"]["maxUnavailable"] == 1
    sts = kube.objects[("StatefulSet", NS, "payouts-executor")]
    assert "topologySpreadConstraints" in sts["spec"]["template"]["spec"]
    policy_body["spec"]["replicas"] = 1
    policy_body["metadata"]["generation"] = 2
    await _reconcile(runtime, policy_body)
    assert pdb not in kube.objects
    assert ("delete", *pdb) in kube.calls
    sts = kube.objects[("StatefulSet", NS, "payouts-executor")]
    assert "topologySpreadConstraints" not in sts["spec"]["template"]["spec"]


async def test_ready_when_replicas_are_ready(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    await _reconcile(runtime, policy_body)
    sts = kube.objects[("StatefulSet", NS, "payouts-executor")]
    sts["status"] = sts_status(sts, ready=1)
    status = await _reconcile(runtime, policy_body)
    assert _ready(status)["status"] == "True"
    assert _ready(status)["reason"] == "ExecutorsReady"
    assert _ready(status)["message"] == "1/1 ready"
    # The same decision as the StatefulSet watch: a spec its controller has not observed yet.
    sts["status"]["observedGeneration"] = sts["metadata"]["generation"] - 1
    status = await _reconcile(runtime, policy_body)
    assert (_ready(status)["status"], _ready(status)["reason"]) == ("False", "ExecutorsNotReady")
    assert "not yet observed" in _ready(status)["message"]


def _executor_env(kube: FakeKube) -> dict[str, Any]:
    statefulset = kube.objects[("StatefulSet", NS, "payouts-executor")]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


async def test_the_workers_are_reported_and_a_tight_limit_is_warned_about_once(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    """status.workers says what the pods run (the operator's default when the spec says
    nothing); a CPU limit below the workers is in the Reconciled message on every pass and a
    Warning Event once, not on every drift repair."""
    status = await _reconcile(runtime, policy_body)
    assert status["workers"] == 1
    assert "EXECUTOR_WORKERS" not in _executor_env(kube)
    assert not [e for e in runtime.events.posted if e[1] == "WorkersOverResources"]  # type: ignore[attr-defined]
    policy_body["spec"]["workers"] = 4
    policy_body["spec"]["pod"] = {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}
    policy_body["metadata"]["generation"] = 2
    status = await _reconcile(runtime, policy_body)
    assert status["workers"] == 4
    assert _executor_env(kube)["EXECUTOR_WORKERS"] == "4"
    reconciled = next(c for c in status["conditions"] if c["type"] == "Reconciled")
    assert reconciled["status"] == "True"
    assert "; warning: 4 workers (spec.workers) share a CPU limit of 2:" in reconciled["message"]
    warned = [e for e in runtime.events.posted if e[1] == "WorkersOverResources"]  # type: ignore[attr-defined]
    assert [(kind, text.split(":")[0]) for kind, _, text in warned] == [
        ("Warning", "4 workers (spec.workers) share a CPU limit of 2")
    ]
    policy_body["status"] = status
    again = await _reconcile(runtime, policy_body)  # the timer's pass: the stored message has it
    assert next(c for c in again["conditions"] if c["type"] == "Reconciled") == reconciled
    assert [e for e in runtime.events.posted if e[1] == "WorkersOverResources"] == warned  # type: ignore[attr-defined]
    policy_body["spec"]["pod"]["resources"]["limits"]["cpu"] = "4"
    policy_body["metadata"]["generation"] = 3
    policy_body["status"] = await _reconcile(runtime, policy_body)
    fixed = next(c for c in policy_body["status"]["conditions"] if c["type"] == "Reconciled")
    assert "warning" not in fixed["message"]


async def test_the_operators_default_worker_count_is_rendered_and_reported(
    kube: FakeKube, settings: OperatorSettings, policy_body: dict[str, Any]
) -> None:
    rt = Runtime(
        kube=kube,
        settings=dataclasses.replace(settings, executor_workers=2),
        events=RecordingEvents(),
    )
    status = await _reconcile(rt, policy_body)
    assert status["workers"] == 2
    assert _executor_env(kube)["EXECUTOR_WORKERS"] == "2"


async def test_missing_secret_is_a_condition_naming_it(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    del kube.objects[("Secret", NS, "payouts-downstream")]
    del kube.objects[("Secret", NS, "treasury-lead-token")]
    status = await _reconcile(runtime, policy_body)
    ready = _ready(status)
    assert (ready["status"], ready["reason"]) == ("False", "SecretMissing")
    assert "Secret payments/payouts-downstream" in ready["message"]
    assert "Secret payments/treasury-lead-token (key token)" in ready["message"]
    assert ("StatefulSet", NS, "payouts-executor") not in kube.objects
    assert runtime.events.posted[-1][:2] == ("Warning", "SecretMissing")  # type: ignore[attr-defined]


async def test_invalid_cel_leaves_children_untouched(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    await _reconcile(runtime, policy_body)
    before = copy.deepcopy(kube.objects)
    broken = copy.deepcopy(policy_body)
    broken["metadata"]["generation"] = 2
    broken["spec"]["policy"]["actions"][0]["rules"][1]["when"] = "params.amountMinor <<< 1"
    status = await _reconcile(runtime, broken)
    ready = _ready(status)
    assert (ready["status"], ready["reason"]) == ("False", "PolicyInvalid")
    assert "actions[0].rules[1].when" in ready["message"]
    assert ready["observedGeneration"] == 2
    assert kube.objects == before


async def test_failing_policy_tests_render_nothing(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    status = await _reconcile(runtime, policy_body)
    reconciled = next(c for c in status["conditions"] if c["type"] == "Reconciled")
    assert reconciled["message"].endswith("; 3 policy tests passed")
    before = copy.deepcopy(kube.objects)
    changed = copy.deepcopy(policy_body)
    changed["metadata"]["generation"] = 2
    # Widen "small" so the large payout case no longer gets its BLOCK.
    changed["spec"]["policy"]["actions"][0]["rules"][0]["when"] = "params.amountMinor <= 90000"
    status = await _reconcile(runtime, changed)
    for type_ in ("Reconciled", "Ready"):
        condition = next(c for c in status["conditions"] if c["type"] == type_)
        assert (condition["status"], condition["reason"]) == ("False", "PolicyTestsFailed")
        assert condition["observedGeneration"] == 2
    message = _ready(status)["message"]
    assert "2 of 3 policy tests failed" in message
    assert "'a large payout is blocked': verdict: expected BLOCK, got ALLOW" in message
    assert kube.objects == before
    assert runtime.events.posted[-1][:2] == ("Warning", "PolicyTestsFailed")  # type: ignore[attr-defined]


async def test_invalid_stored_object_is_permanent_with_a_condition(
    runtime: Runtime, policy_body: dict[str, Any]
) -> None:
    policy_body["spec"]["replicas"] = 0
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError, match=r"spec\.replicas"):
        await policy_handler(body=kopf.Body(policy_body), patch=patch, memo=memo_for(runtime))
    check_status("AgentPolicy", patch["status"])
    # A merge patch of these two fields only: what the last good reconcile reported stays.
    assert set(patch["status"]) == {"observedGeneration", "conditions"}
    ready = _ready(patch["status"])
    assert (ready["status"], ready["reason"]) == ("False", "SpecInvalid")


async def test_invalid_principal_is_permanent_and_touches_no_policy(
    runtime: Runtime, kube: FakeKube, principal_bodies: list[dict[str, Any]]
) -> None:
    broken = copy.deepcopy(principal_bodies[1])
    broken["metadata"]["generation"] = 2
    broken["spec"]["role"] = "SUPERUSER"
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError, match=r"spec\.role"):
        await principal_handler(body=kopf.Body(broken), patch=patch, memo=memo_for(runtime))
    check_status("Principal", patch["status"])
    assert patch["status"]["observedGeneration"] == 2
    ready = _ready(patch["status"])
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "False",
        "SpecInvalid",
        2,
    )
    assert "SUPERUSER" not in ready["message"]  # where and why, never the value
    assert kube.calls == []  # refused before anything was read or written
    assert runtime.events.posted == [  # type: ignore[attr-defined]
        ("Warning", "SpecInvalid", ready["message"])
    ]


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (409, kopf.TemporaryError),
        (429, kopf.TemporaryError),
        (503, kopf.TemporaryError),
        (422, kopf.PermanentError),
    ],
)
async def test_api_errors_map_to_kopf_errors(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any], status: int, error: type
) -> None:
    kube.fail_next = ApiError(status, "Reason", "refused")
    with pytest.raises(error):
        await _reconcile(runtime, policy_body)


async def test_drift_is_repaired(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    await _reconcile(runtime, policy_body)
    original = copy.deepcopy(kube.objects[("StatefulSet", NS, "payouts-executor")])
    del kube.objects[("NetworkPolicy", NS, "payouts-executor")]
    kube.objects[("StatefulSet", NS, "payouts-executor")]["spec"]["template"]["spec"]["containers"][
        0
    ]["securityContext"]["privileged"] = True
    await _reconcile(runtime, policy_body)  # what the timer runs
    assert ("NetworkPolicy", NS, "payouts-executor") in kube.objects
    repaired = kube.objects[("StatefulSet", NS, "payouts-executor")]
    assert repaired["spec"] == original["spec"]
    assert repaired["metadata"]["labels"] == original["metadata"]["labels"]
    assert repaired["metadata"]["ownerReferences"] == original["metadata"]["ownerReferences"]


async def test_agent_namespace_policies_are_pruned_and_deleted(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    await _reconcile(runtime, policy_body)
    moved = copy.deepcopy(policy_body)
    moved["spec"]["agentNamespaces"] = ["robots"]
    await _reconcile(runtime, moved)
    agent_policies = [k for k in kube.objects if k[0] == "NetworkPolicy" and k[1] != NS]
    assert agent_policies == [
        ("NetworkPolicy", "robots", "agentsafe-payments-payouts-no-downstream")
    ]
    await policy_delete_handler(body=kopf.Body(moved), memo=memo_for(runtime))
    assert [k for k in kube.objects if k[0] == "NetworkPolicy" and k[1] != NS] == []


async def test_principal_change_rerenders_selecting_policies(
    runtime: Runtime,
    kube: FakeKube,
    policy_body: dict[str, Any],
    principal_bodies: list[dict[str, Any]],
) -> None:
    await _reconcile(runtime, policy_body)
    approver = copy.deepcopy(principal_bodies[1])
    approver["metadata"]["generation"] = 1
    patch = kopf.Patch()
    await principal_handler(body=kopf.Body(approver), patch=patch, memo=memo_for(runtime), old=None)
    check_status("Principal", patch["status"])
    assert patch["status"]["policies"] == 1
    assert patch["status"]["credential"] == "Bearer"
    assert patch["status"]["selectedBy"] == ["payouts"]
    # Revocation: the Principal is being deleted -> re-rendered without it.
    deleting = copy.deepcopy(approver)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(deleting)
    await principal_handler(body=kopf.Body(deleting), patch=kopf.Patch(), memo=memo_for(runtime))
    principals = json.loads(kube.objects[CONFIG]["data"]["principals.json"])
    assert [p["id"] for p in principals["principals"]] == [
        "payout-agent",
        "agentsafe-operator",
        "agentsafe-metrics",
    ]
    assert kube.objects[("AgentPolicy", NS, "payouts")]["status"]["principals"] == ["payout-agent"]


async def test_jwks_is_read_from_the_issuer(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    jwks = {"keys": [{"kty": "RSA", "kid": "abc", "n": "AQAB", "e": "AQAB"}]}
    kube.json_paths["/openid/v1/jwks"] = jwks
    assert await refresh_jwks(runtime) is True
    assert await refresh_jwks(runtime) is False
    await _reconcile(runtime, policy_body)
    assert json.loads(kube.objects[CONFIG]["data"]["jwks.json"]) == jwks


def test_registry_wires_every_handler() -> None:
    registry = build_registry()
    changing = {
        (h.selector.any_name, h.reason and str(h.reason), h.fn.__name__, bool(h.initial))
        for h in registry._changing.get_all_handlers()
    }
    for plural, fn in [
        ("agentpolicies", "policy_handler"),
        ("principals", "principal_handler"),
        ("haltswitches", "halt_handler"),
    ]:
        assert (plural, "create", fn, False) in changing
        assert (plural, "update", fn, False) in changing
        assert (plural, None, fn, True) in changing  # resume: on operator start
    deletes = {
        (h.selector.any_name, h.fn.__name__, h.requires_finalizer)
        for h in registry._changing.get_all_handlers()
        if h.reason is not None and str(h.reason) == "delete"
    }
    assert deletes == {
        ("agentpolicies", "policy_delete_handler", True),
        ("principals", "principal_handler", True),
        ("haltswitches", "halt_handler", True),
    }
    watching = {
        (h.selector.group, h.selector.version, h.selector.any_name, h.fn.__name__)
        for h in registry._watching.get_all_handlers()
    }
    assert watching == {
        ("apps", "v1", "statefulsets", "statefulset_handler"),
        ("", "v1", "secrets", "secret_handler"),  # tests/operator/test_secret_watch.py
        *(
            ("agentsafe.io", "v1alpha1", plural, "finalizer_migration_handler")
            for plural in ("agentpolicies", "principals", "haltswitches")
        ),
    }
    (watch,) = [h for h in registry._watching.get_all_handlers() if h.selector.group == "apps"]
    # Only the StatefulSets the renderer labels (the owner reference then names the policy).
    assert dict(watch.labels or {}) == {
        "app.kubernetes.io/name": "agentsafe-executor",
        "app.kubernetes.io/managed-by": "agentsafe-operator",
    }
    timers = {
        (h.selector.any_name, h.fn.__name__, h.interval)
        for h in registry._spawning.get_all_handlers()
    }
    assert timers == {
        ("agentpolicies", "policy_handler", 60.0),
        ("haltswitches", "halt_retry_timer", 5.0),
    }


# --------------------------------------------------------------------------------------------
# HaltSwitch, against a real TLS control endpoint stand-in


class ControlStandIn:
    """Stand-in for an executor's control routes over real TLS: records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.halt_file_blocks_resume = False
        self.lost: list[dict[str, Any]] = []  # what GET /v1/control/status lists

    async def status(self, request: web.Request) -> web.Response:
        self.calls.append(("status", request.headers.get("Authorization", ""), {}))
        return web.json_response(
            {"halt": {"halted": bool(self.lost)}, "store_lost_writes": self.lost}
        )

    async def handle(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        body = await request.json()
        self.calls.append((action, request.headers.get("Authorization", ""), body))
        if action == "resume" and self.halt_file_blocks_resume:
            return web.json_response(
                {"error": {"code": "HALT_CAUSE_PERSISTS", "message": "file"}}, status=409
            )
        return web.json_response({"halted": action == "halt"})


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[tuple[ControlStandIn, int, Issued, TestCA]]:
    ca = TestCA()
    server = ca.issue_server(dns_names=("payouts-executor.payments.svc",), ips=())
    cert, key = server.write(tmp_path, "executor")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    stand_in = ControlStandIn()
    app = web.Application()
    app.router.add_post("/v1/control/{action}", stand_in.handle)
    app.router.add_get("/v1/control/status", stand_in.status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield stand_in, port, server, ca
    finally:
        await runner.cleanup()


def _slice(pods: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "payouts-executor-abc",
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": "payouts-executor"},
        },
        "endpoints": [
            {
                "addresses": [address],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod},
            }
            for pod, address in pods.items()
        ],
    }


def _switch(halted: bool, reason: str | None = None, generation: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"halted": halted, "policySelector": {}}
    if reason:
        spec["reason"] = reason
    return {
        "apiVersion": "agentsafe.io/v1alpha1",
        "kind": "HaltSwitch",
        "metadata": {"name": "stop-payouts", "namespace": NS, "generation": generation},
        "spec": spec,
    }


@pytest.fixture
async def halting(
    control: tuple[ControlStandIn, int, Issued, TestCA],
    kube: FakeKube,
    settings: OperatorSettings,
    policy_body: dict[str, Any],
) -> tuple[Runtime, ControlStandIn, str]:
    stand_in, port, server, ca = control
    rt = Runtime(
        kube=kube,
        settings=OperatorSettings(issuer=settings.issuer, port=port),
        events=RecordingEvents(),
    )
    kube.put(
        secret(
            NS,
            "payouts-executor-tls",
            {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem},
        )
    )
    await _reconcile(rt, policy_body)
    kube.put(_slice({"payouts-executor-0": "127.0.0.1"}))
    token = base64.b64decode(
        kube.objects[("Secret", NS, "payouts-operator-token")]["data"]["token"]
    ).decode()
    return rt, stand_in, token


async def _flip(rt: Runtime, body: dict[str, Any]) -> dict[str, Any]:
    rt.kube.put(body)  # type: ignore[attr-defined]
    patch = kopf.Patch()
    await halt_handler(body=kopf.Body(body), patch=patch, memo=memo_for(rt))
    status = dict(patch.get("status") or {})
    check_status("HaltSwitch", status)
    if status:
        rt.kube.objects[("HaltSwitch", NS, "stop-payouts")]["status"] = status  # type: ignore[attr-defined]
    return status


async def test_halt_writes_the_file_key_and_reaches_every_pod(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, stand_in, token = halting
    status = await _flip(rt, _switch(True, "incident 42"))
    assert json.loads(kube.objects[CONFIG]["data"]["halt"]) == {
        "haltedBy": [{"haltSwitch": "stop-payouts", "reason": "incident 42"}]
    }
    assert ("apply:" + HALT_FIELD_MANAGER, "ConfigMap", NS, "payouts-executor-config") in kube.calls
    assert stand_in.calls == [("halt", f"Bearer {token}", {"reason": "incident 42"})]
    assert status["acknowledged"] == "1/1"
    (pod,) = status["pods"]
    assert pod["pod"] == "payouts-executor-0"
    assert pod["acknowledged"] is True
    assert pod["at"]
    assert _ready(status)["reason"] == "Halted"
    # Re-rendering the policy never clears the halt (its own field manager owns the key).
    policy = kube.objects[("AgentPolicy", NS, "payouts")]
    policy_status = await _reconcile(rt, policy)
    assert "halt" in kube.objects[CONFIG]["data"]
    assert policy_status["halted"] is True
    assert _ready(policy_status)["reason"] == "Halted"


async def test_a_halt_moves_the_policys_ready_without_a_reconcile(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, _, _ = halting
    # The policy as kopf left it after its reconcile, and its executor ready.
    await kube.patch_status(
        "AgentPolicy", NS, "payouts", await _reconcile(rt, kube.objects[POLICY])
    )
    sts = kube.objects[("StatefulSet", NS, "payouts-executor")]
    sts["status"] = sts_status(sts, ready=1)
    await kube.patch_status(
        "AgentPolicy", NS, "payouts", await _reconcile(rt, kube.objects[POLICY])
    )
    assert _ready(kube.objects[POLICY]["status"])["status"] == "True"
    mark = len(kube.calls)
    await _flip(rt, _switch(True, "incident 42"))
    policy_status = kube.objects[POLICY]["status"]
    assert (_ready(policy_status)["status"], _ready(policy_status)["reason"]) == (
        "False",
        "Halted",
    )
    assert policy_status["halted"] is True
    # Only the halt key was applied: the children were not re-rendered.
    applied = [c for c in kube.calls[mark:] if c[0].startswith("apply:")]
    assert applied == [("apply:" + HALT_FIELD_MANAGER, "ConfigMap", NS, "payouts-executor-config")]
    await _flip(rt, _switch(False, generation=2))
    policy_status = kube.objects[POLICY]["status"]
    assert (_ready(policy_status)["status"], _ready(policy_status)["reason"]) == (
        "True",
        "ExecutorsReady",
    )
    assert policy_status["halted"] is False


async def test_a_failed_ready_refresh_does_not_hold_back_the_halt(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, stand_in, _ = halting
    await kube.patch_status(
        "AgentPolicy", NS, "payouts", await _reconcile(rt, kube.objects[POLICY])
    )

    async def refuse(*_: Any, **__: Any) -> None:
        raise ApiError(503, "ServiceUnavailable", "etcd is busy")

    monkeypatch.setattr(kube, "patch_status", refuse)
    status = await _flip(rt, _switch(True, "incident 42"))
    assert [c[0] for c in stand_in.calls] == ["halt"]
    assert status["acknowledged"] == "1/1"
    assert "halt" in kube.objects[CONFIG]["data"]


async def test_unhalt_removes_the_key_and_resumes(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, stand_in, _ = halting
    await _flip(rt, _switch(True, "incident 42"))
    status = await _flip(rt, _switch(False, generation=2))
    assert "halt" not in kube.objects[CONFIG]["data"]
    assert "policy.json" in kube.objects[CONFIG]["data"]
    assert [c[0] for c in stand_in.calls] == ["halt", "resume"]
    assert status["acknowledged"] == "1/1"
    assert status["halted"] is False


async def test_deleting_a_halted_switch_releases_it(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, stand_in, _ = halting
    await _flip(rt, _switch(True, "incident 42"))
    deleting = _switch(True, "incident 42")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await _flip(rt, deleting)
    assert "halt" not in kube.objects[CONFIG]["data"]
    assert [c[0] for c in stand_in.calls] == ["halt", "resume"]


async def test_another_switch_keeps_the_halt(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, stand_in, _ = halting
    other = _switch(True, "audit")
    other["metadata"]["name"] = "audit-hold"
    kube.put(other)
    await _flip(rt, _switch(True, "incident 42"))
    await _flip(rt, _switch(False, generation=2))
    held = json.loads(kube.objects[CONFIG]["data"]["halt"])
    assert held == {"haltedBy": [{"haltSwitch": "audit-hold", "reason": "audit"}]}
    assert [c[0] for c in stand_in.calls] == ["halt"]  # no resume while another holds


async def test_unanswered_pods_are_retried(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, stand_in, _ = halting
    # A second pod whose address answers nothing (a closed loopback port stands in).
    kube.put(_slice({"payouts-executor-0": "127.0.0.1", "payouts-executor-1": "127.0.0.2"}))
    status = await _flip(rt, _switch(True, "incident 42"))
    by_pod = {p["pod"]: p for p in status["pods"]}
    assert by_pod["payouts-executor-0"]["acknowledged"] is True
    assert by_pod["payouts-executor-1"]["acknowledged"] is False
    assert by_pod["payouts-executor-1"]["error"]
    assert status["acknowledged"] == "1/2"
    assert _ready(status)["reason"] == "Pending"
    # The pod goes away (rescheduled): the retry timer calls again and completes.
    kube.put(_slice({"payouts-executor-0": "127.0.0.1"}))
    body = kube.objects[("HaltSwitch", NS, "stop-payouts")]
    patch = kopf.Patch()
    await halt_retry_timer(body=kopf.Body(body), patch=patch, memo=memo_for(rt))
    assert patch["status"]["acknowledged"] == "1/1"
    assert [c[0] for c in stand_in.calls] == ["halt", "halt"]
    # All acknowledged: the timer does nothing.
    kube.objects[("HaltSwitch", NS, "stop-payouts")]["status"] = dict(patch["status"])
    await halt_retry_timer(
        body=kopf.Body(kube.objects[("HaltSwitch", NS, "stop-payouts")]),
        patch=kopf.Patch(),
        memo=memo_for(rt),
    )
    assert len(stand_in.calls) == 2


async def test_resume_refused_while_the_file_persists_is_not_acknowledged(
    halting: tuple[Runtime, ControlStandIn, str],
) -> None:
    rt, stand_in, _ = halting
    await _flip(rt, _switch(True, "incident 42"))
    stand_in.halt_file_blocks_resume = True  # the kubelet has not synced the ConfigMap yet
    status = await _flip(rt, _switch(False, generation=2))
    (pod,) = status["pods"]
    assert pod["acknowledged"] is False
    assert "HALT_CAUSE_PERSISTS" in pod["error"]


async def test_wrong_certificate_is_not_trusted(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube
) -> None:
    rt, stand_in, _ = halting
    other = TestCA("another CA")
    impostor = other.issue_server(dns_names=("payouts-executor.payments.svc",), ips=())
    kube.put(
        secret(
            NS,
            "payouts-executor-tls",
            {"tls.crt": impostor.cert_pem, "tls.key": impostor.key_pem, "ca.crt": other.cert_pem},
        )
    )
    status = await _flip(rt, _switch(True, "incident 42"))
    assert stand_in.calls == []
    assert status["pods"][0]["acknowledged"] is False


async def test_invalid_halt_switch_is_permanent(
    halting: tuple[Runtime, ControlStandIn, str],
) -> None:
    rt, _, _ = halting
    body = _switch(True, "x")
    body["spec"]["surprise"] = True
    with pytest.raises(kopf.PermanentError):
        await _flip(rt, body)


# --------------------------------------------------------------------------------------------
# StoreLostWrites: the keys an executor's shared database lost, in the policy's status


def _lost_writes(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status["conditions"] if c["type"] == "StoreLostWrites"), None)


async def test_a_policy_names_the_keys_its_executors_store_lost(
    halting: tuple[Runtime, ControlStandIn, str], kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    rt, stand_in, token = halting
    policy_body["spec"]["store"] = {
        "secretKeyRef": {"name": "payouts-pg-app", "key": "uri"},
        "podSelector": {"matchLabels": {"cnpg.io/cluster": "payouts-pg"}},
    }
    policy_body["spec"]["replicas"] = 2
    kube.put(secret(NS, "payouts-pg-app", {"uri": b"postgresql://app@payouts-pg-rw/app"}))
    status = await _reconcile(rt, policy_body)
    condition = _lost_writes(status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "NoLostWrites")
    assert ("status", f"Bearer {token}", {}) in stand_in.calls
    stand_in.lost = [
        {
            "attempt_id": "att-1",
            "grant_id": "g-1",
            "tenant": "t-1",
            "principal": "treasury-workflow",
            "idempotency_key": "payout-42",
            "claimed_at": "2026-12-02T10:00:00.000Z",
            "rerun_elsewhere": False,
        }
    ]
    status = await _reconcile(rt, policy_body)
    condition = _lost_writes(status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "LostWritesFound")
    assert "payouts-executor-0: 1 (t-1/treasury-workflow/payout-42)" in condition["message"]
    assert "docs/playbooks/store-lost-writes.md" in condition["message"]
    # executors that cannot be asked leave the last word standing
    kube.put(_slice({}))
    status = await _reconcile(rt, {**policy_body, "status": status})
    condition = _lost_writes(status)
    assert condition is not None
    assert condition["status"] == "True"


async def test_a_policy_without_a_store_asks_nothing(
    halting: tuple[Runtime, ControlStandIn, str], policy_body: dict[str, Any]
) -> None:
    rt, stand_in, _ = halting
    status = await _reconcile(rt, policy_body)
    assert _lost_writes(status) is None
    assert not [c for c in stand_in.calls if c[0] == "status"]


async def test_a_reconcile_is_one_span_when_tracing_is_on(
    runtime: Runtime, kube: FakeKube, policy_body: dict[str, Any]
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentsafe.executor import telemetry
    from agentsafe.operator.handlers import traced

    memory = InMemorySpanExporter()
    telemetry.configure({"OTEL_TRACES_EXPORTER": "otlp"}, exporter=memory)
    try:
        patch = kopf.Patch()
        handler = traced("reconcile", policy_handler)
        await handler(body=kopf.Body(policy_body), patch=patch, memo=memo_for(runtime))
        telemetry.flush()
    finally:
        telemetry.shutdown()
    (span,) = memory.get_finished_spans()
    assert span.name == "agentsafe.operator.reconcile"
    assert dict(span.attributes or {}) == {"agentsafe.outcome": "ok"}
    assert "status" in patch
