"""Install the chart on a real cluster exactly as the issue and the docs tell a user to.

Role: the ``--backend=node`` fixture in ``e2e/conftest.py`` calls :func:`install_chart` once
per session; ``e2e/kind/run.sh`` does the same steps in shell for kind. The operator then runs
as a real pod from ``agentsafe:dev`` (imported into the node's containerd, never pulled), in a
namespace that enforces the restricted Pod Security Standard, and ``helm test`` runs.
"""

from __future__ import annotations

import json

from .control_plane import ControlPlane

RELEASE = "agentsafe"
NAMESPACE = "agentsafe-system"
IMAGE_REPOSITORY = "agentsafe"
IMAGE_TAG = "dev"
IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"


MONITORING = "agentsafe-e2e-monitoring"
"""The namespace the chart tells the operator Prometheus runs in (``metrics.scraper``)."""


def install_chart(plane: ControlPlane, *, namespace: str = NAMESPACE) -> None:
    """``helm upgrade --install ... --wait`` from the repository's chart, then ``helm test``."""
    from .kind_backend import REPO

    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
        },
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    print(f"[e2e] helm install {RELEASE} charts/agentsafe (image {IMAGE}) --wait", flush=True)
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
        "5m",
        timeout=330,
    )
    plane.helm("test", RELEASE, "--namespace", namespace, "--timeout", "2m", timeout=150)
