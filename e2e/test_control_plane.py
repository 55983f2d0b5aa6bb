"""Smoke tests of the local control plane: the claims the scenario relies on, checked first.

The API server reports the pinned release, issues TokenRequest tokens whose signature verifies
against its own ``/openid/v1/jwks``, authenticates them (and refuses a forged one), serves a CRD
applied with kubectl, and — when kube-controller-manager was built — garbage-collects dependents.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cluster.build import KUBERNETES_VERSION
from cluster.control_plane import SERVICE_ACCOUNT_ISSUER, ControlPlane
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

REPO = Path(__file__).resolve().parent.parent
AUDIENCE = "agentsafe-e2e-smoke"


def _b64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def _jwt_parts(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
    header, payload, signature = token.split(".")
    return (
        json.loads(_b64(header)),
        json.loads(_b64(payload)),
        f"{header}.{payload}".encode(),
        _b64(signature),
    )


def _namespace(plane: ControlPlane) -> str:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    plane.kubectl("create", "namespace", name)
    return name


def test_version_reports_the_pinned_release(control_plane: ControlPlane, backend: str) -> None:
    if backend != "local":
        pytest.skip("the pinned release is what the local backend builds")
    version = control_plane.get_json("/version")
    assert version["gitVersion"] == KUBERNETES_VERSION
    assert version["gitTreeState"] == "clean"
    client = json.loads(control_plane.kubectl("version", "--client", "-o", "json").stdout)
    assert client["clientVersion"]["gitVersion"] == KUBERNETES_VERSION


def test_token_request_signed_by_the_published_jwks(control_plane: ControlPlane) -> None:
    namespace = _namespace(control_plane)
    control_plane.kubectl("create", "serviceaccount", "agent", "-n", namespace)
    token = control_plane.create_token("agent", namespace=namespace, audience=AUDIENCE)
    header, claims, signed, signature = _jwt_parts(token)
    assert claims["iss"] == SERVICE_ACCOUNT_ISSUER
    assert claims["aud"] == [AUDIENCE]
    assert claims["sub"] == f"system:serviceaccount:{namespace}:agent"

    discovery = control_plane.get_json("/.well-known/openid-configuration")
    assert discovery["issuer"] == SERVICE_ACCOUNT_ISSUER
    jwks = control_plane.get_json("/openid/v1/jwks")
    keys = {key["kid"]: key for key in jwks["keys"]}
    assert header["kid"] in keys
    jwk = keys[header["kid"]]
    assert jwk["kty"] == "RSA"
    public = rsa.RSAPublicNumbers(
        e=int.from_bytes(_b64(jwk["e"])), n=int.from_bytes(_b64(jwk["n"]))
    ).public_key()
    public.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())


def test_token_review_accepts_real_and_refuses_forged(control_plane: ControlPlane) -> None:
    namespace = _namespace(control_plane)
    control_plane.kubectl("create", "serviceaccount", "agent", "-n", namespace)
    token = control_plane.create_token(
        "agent", namespace=namespace, audience=SERVICE_ACCOUNT_ISSUER
    )
    # Authenticated (the default audience) but not authorized by RBAC: 403, not 401.
    status, _ = control_plane.get(f"/api/v1/namespaces/{namespace}/secrets", token=token)
    assert status == 403
    header, payload, signature = token.split(".")
    forged_claims = json.loads(_b64(payload))
    forged_claims["sub"] = f"system:serviceaccount:{namespace}:someone-else"
    forged_payload = base64.urlsafe_b64encode(json.dumps(forged_claims).encode()).rstrip(b"=")
    forged = f"{header}.{forged_payload.decode()}.{signature}"
    status, _ = control_plane.get(f"/api/v1/namespaces/{namespace}/secrets", token=forged)
    assert status == 401


def _crd_files() -> list[Path]:
    return sorted((REPO / "crds").glob("*.yaml"))


SAMPLE_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.smoke.agentsafe.io}
spec:
  group: smoke.agentsafe.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties: {size: {type: integer, minimum: 1}}
"""


def _wait_established(plane: ControlPlane, name: str) -> None:
    plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s", timeout=90)


def test_a_crd_can_be_applied_and_served(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", "-", input=SAMPLE_CRD)
    _wait_established(control_plane, "widgets.smoke.agentsafe.io")
    namespace = _namespace(control_plane)
    good = "apiVersion: smoke.agentsafe.io/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 2}"
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=good)
    bad = good.replace("size: 2", "size: 0")
    refused = control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=bad, check=False)
    assert refused.returncode != 0
    assert "spec.size" in refused.stderr


@pytest.mark.skipif(not _crd_files(), reason="crds/*.yaml not generated yet")
def test_the_generated_agentsafe_crds_apply(control_plane: ControlPlane) -> None:
    for path in _crd_files():
        # --force-conflicts: the chart (helm) may have installed the same CRDs already.
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    names = json.loads(control_plane.kubectl("get", "crd", "-o", "json").stdout)
    ours = [
        item["metadata"]["name"]
        for item in names["items"]
        if item["spec"]["group"] == "agentsafe.io"
    ]
    assert ours
    for name in ours:
        _wait_established(control_plane, name)
    # kubectl explain reads the descriptions the models give every field (the API server
    # publishes them once the CRD is established; poll, it takes a moment).
    deadline = time.monotonic() + 60
    while True:
        explained = control_plane.kubectl(
            "explain", "agentpolicies.spec.pod.tolerations.effect", check=False
        )
        if explained.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "the taint effect tolerated" in explained.stdout, explained.stderr
    halted = control_plane.kubectl("explain", "haltswitches.spec.halted").stdout
    assert "true stops every selected executor" in halted


def test_dependents_are_garbage_collected(control_plane: ControlPlane) -> None:
    if not control_plane.garbage_collection:
        pytest.skip("kube-controller-manager not built: owner references are asserted instead")
    namespace = _namespace(control_plane)
    control_plane.kubectl("create", "configmap", "owner", "-n", namespace)
    got = control_plane.kubectl("get", "cm/owner", "-n", namespace, "-o", "json")
    owner = json.loads(got.stdout)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(child))
    control_plane.kubectl("delete", "cm/owner", "-n", namespace)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = control_plane.kubectl("get", "cm/child", "-n", namespace, check=False)
        if found.returncode != 0 and "NotFound" in found.stderr:
            return
        time.sleep(0.5)  # polling interval: the collector works asynchronously
    pytest.fail("the dependent ConfigMap was not garbage-collected within 60 s")
