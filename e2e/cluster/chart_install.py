"""Install the chart on a real cluster exactly as the issue and the docs tell a user to.

Role: the ``--backend=node`` fixture in ``e2e/conftest.py`` calls :func:`install_chart` once
per session; ``e2e/kind/run.sh`` does the same steps in shell for kind. The operator then runs
as a real pod from ``agentsafe:dev`` (imported into the node's containerd, never pulled), in a
namespace that enforces the restricted Pod Security Standard, and ``helm test`` runs.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from typing import Any

from .control_plane import ControlPlane

RELEASE = "agentsafe"
NAMESPACE = "agentsafe-system"
IMAGE_REPOSITORY = "agentsafe"
IMAGE_TAG = "dev"
IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"


MONITORING = "agentsafe-e2e-monitoring"
"""The namespace the chart tells the operator Prometheus runs in (``metrics.scraper``)."""

KUBECTL_SECONDS = 20
"""Each kubectl call of the install: the namespace, and each of the diagnosis's three gets."""
HELM_INSTALL_SECONDS = 250
"""``helm upgrade --install --wait --timeout 4m``, and 10 s for helm to say what timed out."""
HELM_TEST_SECONDS = 150
"""``helm test --timeout 2m``, and 30 s for helm to say what failed."""
INSTALL_SECONDS = KUBECTL_SECONDS + HELM_INSTALL_SECONDS + HELM_TEST_SECONDS + 3 * KUBECTL_SECONDS
"""The most :func:`install_chart` takes, a failure's diagnosis included (480 s). The session
fixture installs in the setup of the first test that asks for the cluster, under that test's
pytest-timeout; ``e2e/conftest.py`` adds this to it, so helm's own message and the diagnosis
are always said, never cut off, and the test keeps its own time."""


def install_chart(plane: ControlPlane, *, namespace: str = NAMESPACE) -> None:
    """``helm upgrade --install ... --wait`` from the repository's chart, then ``helm test``."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
        },
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(manifest), timeout=KUBECTL_SECONDS)
    print(f"[e2e] helm install {RELEASE} charts/agentsafe (image {IMAGE}) --wait", flush=True)
    try:
        _helm_install(plane, namespace)
        plane.helm(
            "test", RELEASE, "--namespace", namespace, "--timeout", "2m", timeout=HELM_TEST_SECONDS
        )
    except (AssertionError, subprocess.TimeoutExpired) as error:
        # helm says only "context deadline exceeded": say what the cluster saw, within
        # INSTALL_SECONDS, so a CI log shows why (an evicting node, a crashing pod).
        raise AssertionError(f"{error}\n{diagnosis(plane, namespace)}") from error


def _helm_install(plane: ControlPlane, namespace: str) -> None:
    from .kind_backend import REPO

    plane.helm(
        "upgrade",
        "--install",
        RELEASE,
        str(REPO / "charts" / "agentsafe"),
        "--namespace",
        namespace,
        "--set",
        f"image.repository={IMAGE_REPOSITORY}",
        "--set",
        f"image.tag={IMAGE_TAG}",
        "--set",
        "image.pullPolicy=Never",
        # The namespace the scenario's scraper runs in (test_the_scraper_reads_metrics_...).
        "--set",
        f"metrics.scraper.namespaceSelector.kubernetes\\.io/metadata\\.name={MONITORING}",
        "--wait",
        "--timeout",
        "4m",
        timeout=HELM_INSTALL_SECONDS,
    )


def diagnosis(plane: ControlPlane, namespace: str) -> str:
    """What the cluster says about a failed install: the node's conditions that are not as a
    healthy node's, the namespace's pods that are not ready, and its last warning events."""
    lines = ["what the cluster says:"]
    try:
        nodes = _items(plane, "nodes")
        pods = _items(plane, "pods", "--namespace", namespace)
        events = _items(plane, "events", "--namespace", namespace, "--field-selector=type=Warning")
    except (AssertionError, subprocess.TimeoutExpired, ValueError) as error:
        return f"what the cluster says: unknown (kubectl failed: {str(error).splitlines()[0]})"
    lines += node_findings(nodes) + pod_findings(pods) + event_findings(events)
    return "\n".join(lines)


def _items(plane: ControlPlane, *args: str) -> list[dict[str, Any]]:
    result = plane.kubectl("get", *args, "-o", "json", timeout=KUBECTL_SECONDS)
    items: list[dict[str, Any]] = json.loads(result.stdout)["items"]
    return items


def node_findings(nodes: list[dict[str, Any]]) -> list[str]:
    """A line per condition unlike a healthy node's (Ready False, any pressure True)."""
    found = []
    for node in nodes:
        for condition in node.get("status", {}).get("conditions", []):
            healthy = "True" if condition.get("type") == "Ready" else "False"
            if condition.get("status") != healthy:
                found.append(
                    f"  node {node['metadata']['name']}: {condition.get('type')}="
                    f"{condition.get('status')} ({condition.get('message', '')})"
                )
    return found or ["  nodes: every condition as a healthy node's"]


def pod_findings(pods: list[dict[str, Any]]) -> list[str]:
    """A line per reason pods are not ready, with how many share it (an evicting node makes
    hundreds of pods with one reason)."""
    reasons: Counter[str] = Counter()
    for pod in pods:
        status = pod.get("status", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", [])
        )
        if ready or status.get("phase") == "Succeeded":
            continue
        waiting = [
            s["state"]["waiting"].get("reason", "")
            for s in status.get("containerStatuses", [])
            if "waiting" in s.get("state", {})
        ]
        reason = f"{status.get('phase')} {status.get('reason') or ''} {' '.join(waiting)}"
        reasons[" ".join(reason.split())] += 1
    return [f"  pods not ready: {n} x {reason}" for reason, n in sorted(reasons.items())]


def event_findings(events: list[dict[str, Any]], *, last: int = 5) -> list[str]:
    """The last warning events, one line per distinct reason and message."""
    oldest_first = [
        f"{event.get('reason')}: {event.get('message', '')}".strip()
        for event in sorted(events, key=lambda e: str(e.get("lastTimestamp") or ""))
    ]
    # Each distinct line once, at its latest occurrence: the first of each, newest first, then
    # back to oldest first.
    latest_last = list(dict.fromkeys(reversed(oldest_first)))[::-1]
    return [f"  warning {line}" for line in latest_last[-last:]]
