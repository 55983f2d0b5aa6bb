"""Fixtures for the operator tests: the example objects from examples/k8s, a render input, an
in-memory API stand-in holding them (``kube``) and the handlers' ``runtime`` over it."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from agentsafe.operator.models import AgentPolicySpec, PrincipalSpec
from agentsafe.operator.render import PolicyRef, RenderInput, SelectedPrincipal
from agentsafe.operator.runtime import Runtime
from agentsafe.operator.settings import OperatorSettings

from .fakekube import FakeKube, RecordingEvents

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "k8s"
APPROVER_TOKEN = "approver-token-value-never-rendered-0123456789"
OPERATOR_TOKEN = "operator-token-value-never-rendered-9876543210"
NS = "payments"


def load_examples(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


@pytest.fixture
def policy_body() -> dict[str, Any]:
    body = load_examples("30-agentpolicy.yaml")[0]
    body["metadata"].update(uid="11111111-2222-3333-4444-555555555555", generation=1)
    return body


@pytest.fixture
def principal_bodies() -> list[dict[str, Any]]:
    return load_examples("40-principals.yaml")


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(issuer="https://kubernetes.default.svc.cluster.local")


@pytest.fixture
def render_input(
    policy_body: dict[str, Any], principal_bodies: list[dict[str, Any]], settings: OperatorSettings
) -> RenderInput:
    selected = tuple(
        SelectedPrincipal(
            name=p["metadata"]["name"],
            spec=PrincipalSpec.model_validate(p["spec"]),
            token_sha256=hashlib.sha256(APPROVER_TOKEN.encode()).hexdigest()
            if "bearer" in p["spec"]
            else None,
        )
        for p in principal_bodies
    )
    return RenderInput(
        policy=PolicyRef("payouts", "payments", policy_body["metadata"]["uid"], 1),
        spec=AgentPolicySpec.model_validate(policy_body["spec"]),
        settings=settings,
        principals=selected,
        operator_token_sha256=hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(),
        jwks={
            "keys": [
                {
                    "kty": "OKP",
                    "crv": "Ed25519",
                    "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo",
                    "kid": "k1",
                    "alg": "EdDSA",
                    "use": "sig",
                }
            ]
        },
    )


def secret(
    namespace: str, name: str, data: dict[str, bytes], *, watched: bool = True
) -> dict[str, Any]:
    """A Secret; ``watched``: labelled for the operator's Secret watch, as the examples are."""
    labels = {"agentsafe.io/watch": "true"} if watched else {}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


@pytest.fixture
def kube(policy_body: dict[str, Any], principal_bodies: list[dict[str, Any]]) -> FakeKube:
    fake = FakeKube()
    fake.put(policy_body)
    for body in principal_bodies:
        fake.put(body)
    fake.put(secret(NS, "payouts-executor-tls", {"tls.crt": b"-", "tls.key": b"-"}))
    fake.put(secret(NS, "payouts-downstream", {"token": b"downstream-api-key"}))
    fake.put(secret(NS, "treasury-lead-token", {"token": APPROVER_TOKEN.encode()}))
    return fake


@pytest.fixture
def runtime(kube: FakeKube, settings: OperatorSettings) -> Runtime:
    return Runtime(kube=kube, settings=settings, events=RecordingEvents())


def memo_for(rt: Runtime) -> kopf.Memo:
    """kopf's own Memo holding the runtime, as ``cli.py``'s startup handler leaves it."""
    memo = kopf.Memo()
    memo["runtime"] = rt
    return memo


def sts_status(
    statefulset: dict[str, Any], *, ready: int, replicas: int = 1, updated: int | None = None
) -> dict[str, Any]:
    """What the StatefulSet controller reports once it observed ``statefulset``'s spec."""
    status: dict[str, Any] = {
        "observedGeneration": statefulset["metadata"]["generation"],
        "replicas": replicas,
        "currentReplicas": replicas,
        "updatedReplicas": replicas if updated is None else updated,
        "availableReplicas": ready,
        "currentRevision": "payouts-executor-1",
        "updateRevision": "payouts-executor-1",
    }
    if ready:
        status["readyReplicas"] = ready  # omitted when zero, as the API server does
    return status
