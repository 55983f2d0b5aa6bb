"""A real kube-apiserver refuses, at admission, an AgentPolicy whose CEL ``when`` does not compile.

The operator runs as ``agentsafe operator`` (a child process, admin kubeconfig) with its webhook
on 127.0.0.1 in the operator-CA mode the chart uses without cert-manager: it creates its CA
Secret, signs its serving certificate and sets ``caBundle`` on the ValidatingWebhookConfiguration
itself. That configuration is the chart's own (``helm template --show-only
templates/webhook.yaml``) with two changes the loopback cluster needs: ``clientConfig.url``
instead of the Service (no kubelet, no pods, no Service routing here) and a namespaceSelector for
this test's namespace alone, so no other test's AgentPolicy meets it. Then ``kubectl apply``:
the broken rule is refused with its path and the compiler's message, the good policy is
admitted unchanged, a metadata-only change of a stored object never calls the webhook, workers
over their CPU limit are admitted with the webhook's warning (the CRD itself refuses a count out
of range), and the CA Secret stays the one the operator created.

The file sorts after ``test_chart.py`` on purpose: it applies the CRDs with kubectl to the shared
loopback API server, and the chart tests' ``helm install --dry-run`` refuses CRDs that exist
without Helm's ownership labels (a clean-clone CI run failed on exactly that order).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster.control_plane import ControlPlane, free_port
from cluster.polling import poll

from agentsafe.executor.config import WORKERS_MAX

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "agentsafe"
EXAMPLE = REPO / "examples" / "k8s" / "30-agentpolicy.yaml"
AGENTSAFE = Path(os.environ.get("AGENTSAFE_BIN", REPO / ".venv" / "bin" / "agentsafe"))
BROKEN_WHEN = "params.amountMinor <<< 1"


def _chart_webhook_configuration(plane: ControlPlane) -> dict[str, Any]:
    text = plane.helm(
        "template",
        "agentsafe",
        str(CHART),
        "--namespace",
        "agentsafe-system",
        "--show-only",
        "templates/webhook.yaml",
    ).stdout
    (configuration,) = [d for d in yaml.safe_load_all(text) if d]
    assert configuration["kind"] == "ValidatingWebhookConfiguration"
    return dict(configuration)


def _policy(namespace: str, name: str, when: str | None = None) -> dict[str, Any]:
    body = copy.deepcopy(next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d))
    body["metadata"] = {"name": name, "namespace": namespace}
    if when is not None:
        body["spec"]["policy"]["actions"][0]["rules"][1]["when"] = when
    return dict(body)


def _contains(stored: Any, given: Any) -> bool:
    """``given`` is ``stored`` with the API server's schema defaults left out."""
    if isinstance(given, dict):
        return isinstance(stored, dict) and all(
            key in stored and _contains(stored[key], value) for key, value in given.items()
        )
    if isinstance(given, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(given)
            and all(_contains(a, b) for a, b in zip(stored, given, strict=True))
        )
    return bool(stored == given)


def _apply(plane: ControlPlane, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return plane.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)


@contextlib.contextmanager
def _operator(
    plane: ControlPlane, workdir: Path, *, namespace: str, configuration: str, port: int
) -> Iterator[Path]:
    log = workdir / "operator.log"
    argv = [
        str(AGENTSAFE),
        "operator",
        f"--namespace={namespace}",
        f"--operator-namespace={namespace}",
        f"--liveness=http://127.0.0.1:{free_port()}/healthz",
        "--issuer=https://kubernetes.default.svc.cluster.local",
        f"--webhook-port={port}",
        "--webhook-address=127.0.0.1",
        "--webhook-ca-secret=agentsafe-operator-webhook-ca",
        "--webhook-dns-name=127.0.0.1",
        f"--webhook-configuration={configuration}",
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=plane.env({"TMPDIR": str(workdir)}),
            cwd=workdir,
        )
    try:
        yield log
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def webhook(
    control_plane: ControlPlane, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    if backend != "local":
        pytest.skip("the loopback API server dials the operator on 127.0.0.1")
    plane = control_plane
    tmp_path = tmp_path_factory.mktemp("admission")
    plane.kubectl("apply", "-f", str(REPO / "crds"))
    for crd in ("agentpolicies.agentsafe.io", "kopfpeerings.kopf.dev"):
        plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}")
    namespace = f"admission-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "agentsafe", "namespace": namespace},
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(peering))
    configuration = _chart_webhook_configuration(plane)
    name = f"agentsafe-admission-{namespace}"
    port = free_port()
    configuration["metadata"]["name"] = name
    (hook,) = configuration["webhooks"]
    path = hook["clientConfig"]["service"]["path"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    plane.kubectl("apply", "-f", "-", input=json.dumps(configuration))
    try:
        with _operator(plane, tmp_path, namespace=namespace, configuration=name, port=port) as log:

            def trusted() -> str | None:
                got = plane.kubectl("get", "validatingwebhookconfiguration", name, "-o", "json")
                found = json.loads(got.stdout)
                bundle = found["webhooks"][0]["clientConfig"].get("caBundle")
                return str(bundle) if bundle else None

            try:
                bundle = poll("the operator to set caBundle", trusted, deadline=90)

                # Serving: a valid policy goes through once the operator's server listens.
                def admitted() -> bool | None:
                    result = _apply(plane, _policy(namespace, "probe"))
                    return True if result.returncode == 0 else None

                poll("the webhook to admit a valid AgentPolicy", admitted, deadline=90)
            except AssertionError:
                print(log.read_text(errors="replace")[-4000:])
                raise
            yield {"namespace": namespace, "bundle": bundle, "name": name, "log": log}
    finally:
        plane.kubectl("delete", "validatingwebhookconfiguration", name, check=False)
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_a_broken_when_rule_is_refused_at_admission(
    control_plane: ControlPlane, webhook: dict[str, Any]
) -> None:
    plane, namespace = control_plane, webhook["namespace"]
    result = _apply(plane, _policy(namespace, "broken", when=BROKEN_WHEN))
    assert result.returncode != 0, result.stdout
    print(result.stderr)  # what a platform engineer reads (shown with pytest -s)
    assert 'admission webhook "agentpolicies.agentsafe.io" denied the request' in result.stderr
    assert "AgentPolicy refused: PolicyInvalid: actions[0].rules[1].when: " in result.stderr
    # Nothing was stored.
    missing = plane.kubectl("get", "agentpolicy", "broken", "-n", namespace, check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr

    # An undeclared variable (the authority's own variable list) is refused the same way.
    result = _apply(plane, _policy(namespace, "broken", when="secret.value == 'x'"))
    assert result.returncode != 0
    assert "undeclared reference" in result.stderr
    assert "secret.value" not in result.stderr  # never the expression (issue 30, item 18)


def test_a_good_policy_is_admitted_unchanged_and_an_update_that_breaks_it_refused(
    control_plane: ControlPlane, webhook: dict[str, Any]
) -> None:
    plane, namespace = control_plane, webhook["namespace"]
    good = _policy(namespace, "good")
    assert _apply(plane, good).returncode == 0
    stored = json.loads(
        plane.kubectl("get", "agentpolicy", "good", "-n", namespace, "-o", "json").stdout
    )
    # Stored as applied (plus the CRD's schema defaults, such as approvers: []).
    assert _contains(stored["spec"], good["spec"])

    result = _apply(plane, _policy(namespace, "good", when=BROKEN_WHEN))
    assert result.returncode != 0
    assert "actions[0].rules[1].when" in result.stderr
    again = json.loads(
        plane.kubectl("get", "agentpolicy", "good", "-n", namespace, "-o", "json").stdout
    )
    assert again["spec"] == stored["spec"]

    # A metadata-only change never needs the webhook (matchConditions: spec unchanged).
    plane.kubectl("label", "agentpolicy", "good", "-n", namespace, "team=payments")

    # Server-side dry run is reviewed too (kubectl apply --dry-run=server in CI pipelines).
    broken = json.dumps(_policy(namespace, "dry", when=BROKEN_WHEN))
    dry = plane.kubectl("apply", "--dry-run=server", "-f", "-", input=broken, check=False)
    assert dry.returncode != 0
    assert "PolicyInvalid" in dry.stderr


def test_workers_over_the_cpu_limit_are_admitted_with_a_warning_and_out_of_range_refused(
    control_plane: ControlPlane, webhook: dict[str, Any]
) -> None:
    """kubectl prints the webhook's warning and stores the policy; a worker count past the
    executor's bound never reaches the webhook: the CRD's own schema refuses it."""
    plane, namespace = control_plane, webhook["namespace"]
    tight = _policy(namespace, "tight")
    tight["spec"]["workers"] = 4
    tight["spec"]["pod"] = {"resources": {"limits": {"cpu": "1"}}}
    result = _apply(plane, tight)
    assert result.returncode == 0, result.stderr
    print(result.stderr)  # what a platform engineer reads (shown with pytest -s)
    assert "Warning: 4 workers (spec.workers) share a CPU limit of 1:" in result.stderr
    stored = json.loads(
        plane.kubectl("get", "agentpolicy", "tight", "-n", namespace, "-o", "json").stdout
    )
    assert stored["spec"]["workers"] == 4
    for bad in (0, WORKERS_MAX + 1):
        wrong = _policy(namespace, "wrong")
        wrong["spec"]["workers"] = bad
        result = _apply(plane, wrong)
        assert result.returncode != 0, bad
        assert "spec.workers" in result.stderr, result.stderr
        assert "webhook" not in result.stderr  # the schema, before any webhook
    assert plane.kubectl("get", "agentpolicy", "wrong", "-n", namespace, check=False).returncode


def test_resources_take_every_quantity_a_deployment_takes_and_refuse_the_rest(
    control_plane: ControlPlane, webhook: dict[str, Any]
) -> None:
    """Issue 31, item 15: ``cpu: 1`` (an integer), ``.5``, ``1e9`` and ``100u`` are admitted by
    the CRD's schema (``x-kubernetes-int-or-string`` with the quantity grammar) and by the
    webhook, and stored as written; what Kubernetes itself cannot read, a float and a negative
    are refused, naming the field."""
    plane, namespace = control_plane, webhook["namespace"]
    quantities = _policy(namespace, "quantities")
    quantities["spec"]["pod"] = {
        "resources": {
            "requests": {"cpu": ".5", "memory": "1e9", "ephemeral-storage": "100u"},
            "limits": {"cpu": 1, "memory": "2Gi"},
        }
    }
    result = _apply(plane, quantities)
    assert result.returncode == 0, result.stderr
    stored = json.loads(
        plane.kubectl("get", "agentpolicy", "quantities", "-n", namespace, "-o", "json").stdout
    )
    assert stored["spec"]["pod"]["resources"] == quantities["spec"]["pod"]["resources"]
    for bad in ("1i", "-1", "1.1.M", 0.5, -1):
        wrong = _policy(namespace, "wrong-quantity")
        wrong["spec"]["pod"] = {"resources": {"limits": {"cpu": bad}}}
        result = _apply(plane, wrong)
        assert result.returncode != 0, bad
        assert "spec.pod.resources.limits" in result.stderr, result.stderr
    assert plane.kubectl(
        "get", "agentpolicy", "wrong-quantity", "-n", namespace, check=False
    ).returncode


def test_the_ca_bundle_is_the_ca_the_operator_keeps(
    control_plane: ControlPlane, webhook: dict[str, Any]
) -> None:
    secret = json.loads(
        control_plane.kubectl(
            "get",
            "secret",
            "agentsafe-operator-webhook-ca",
            "-n",
            webhook["namespace"],
            "-o",
            "json",
        ).stdout
    )
    assert base64.b64decode(secret["data"]["ca.crt"]) == base64.b64decode(webhook["bundle"])
    assert "ca.key" in secret["data"]
    # The key never appears in the operator's output.
    key = base64.b64decode(secret["data"]["ca.key"]).decode()
    body = "".join(key.splitlines()[1:-1])
    assert body[:40] not in webhook["log"].read_text(errors="replace")
