"""Fixtures for the end-to-end suite: real Kubernetes binaries and a control plane per session.

Role: give every e2e test a running ``etcd`` + ``kube-apiserver`` (and
``kube-controller-manager`` for garbage collection when it was built) on loopback, with an
admin kubeconfig. The binaries come from :mod:`cluster.build` (built once into the cache
outside the repository). When they cannot be had (no Go toolchain, build failed) the suite is
skipped with one reason line — unless ``AGENTSAFE_E2E=require`` (set by ``.ci/run``), which
turns that into a failure.

``--backend=local`` (default) is the loopback control plane; ``--backend=node`` is the real
one-node cluster of :mod:`cluster.node` (``make cluster-up``; brought up here when none runs,
and then brought down after) with the chart installed from ``agentsafe:dev``;
``--backend=kind`` uses the cluster the current kubeconfig points at (see ``e2e/kind/``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster.build import Binaries, BuildRequest, BuildUnavailable, Tools, ensure_binaries
from cluster.chart_install import install_chart
from cluster.control_plane import (
    ControlPlane,
    ControlPlaneError,
    attached_cluster,
    running_control_plane,
)

REQUIRE_ENV = "AGENTSAFE_E2E"


@contextlib.contextmanager
def node_cluster(config: pytest.Config) -> Iterator[Path]:
    """The node's admin kubeconfig: a running node is reused (and left running); otherwise one
    is brought up for the session and brought down after it."""
    from cluster import node

    before = node.status()
    try:
        cluster = node.up()
    except (node.NodeError, BuildUnavailable) as error:
        _unavailable(f"the one-node cluster cannot start here: {str(error).splitlines()[0]}")
        raise  # unreachable: _unavailable always raises
    try:
        yield cluster.kubeconfig
    finally:
        if not before.get("running") and os.environ.get("AGENTSAFE_E2E_KEEP_NODE") != "1":
            node.down()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("local", "node", "kind"),
        default="local",
        help="local: loopback etcd+kube-apiserver; node: a real one-node cluster on this "
        "machine (make cluster-up); kind: the current kubeconfig's cluster",
    )


def _unavailable(message: str) -> None:
    if os.environ.get(REQUIRE_ENV, "").lower() == "require":
        pytest.fail(f"{REQUIRE_ENV}=require and {message}", pytrace=False)
    pytest.skip(f"e2e suite skipped: {message} (set {REQUIRE_ENV}=require to fail instead)")


@contextlib.contextmanager
def _uncaptured(config: pytest.Config) -> Iterator[None]:
    """Let build progress reach the terminal: a cold build takes many minutes."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        yield
        return
    with capture.global_and_fixture_disabled():
        yield


def _build_request() -> BuildRequest:
    gc = os.environ.get("AGENTSAFE_E2E_GC", "1") != "0"
    return BuildRequest(controller_manager=gc)


@pytest.fixture(scope="session")
def backend(pytestconfig: pytest.Config) -> str:
    return str(pytestconfig.getoption("backend"))


@pytest.fixture(scope="session")
def k8s_binaries(pytestconfig: pytest.Config, backend: str) -> Binaries:
    """kube-apiserver, kubectl, etcd, helm (built into the cache on first use)."""
    if backend == "kind":
        pytest.skip("locally built Kubernetes binaries belong to --backend=local and node")
    try:
        with _uncaptured(pytestconfig):
            return ensure_binaries(_build_request())
    except BuildUnavailable as error:
        first_line = str(error).splitlines()[0]
        _unavailable(f"the Kubernetes binaries cannot be built here: {first_line}")
        raise  # unreachable: _unavailable always raises


@pytest.fixture(scope="session")
def k8s_tools(request: pytest.FixtureRequest, backend: str) -> Tools:
    """kubectl and helm: the local builds, or (kind) the ones on PATH."""
    if backend in ("local", "node"):
        binaries: Binaries = request.getfixturevalue("k8s_binaries")
        return binaries.tools
    found = {name: shutil.which(name) for name in ("kubectl", "helm")}
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        _unavailable(f"--backend=kind needs {', '.join(missing)} on PATH")
    return Tools(kubectl=Path(str(found["kubectl"])), helm=Path(str(found["helm"])))


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, backend: str) -> Iterator[ControlPlane]:
    """The cluster under test: the loopback control plane, or (kind) the current kubeconfig's."""
    if backend == "kind":
        kubeconfig = os.environ.get("KUBECONFIG")
        if not kubeconfig:
            _unavailable("--backend=kind needs KUBECONFIG (e2e/kind/run.sh sets it)")
        tools: Tools = request.getfixturevalue("k8s_tools")
        with attached_cluster(Path(str(kubeconfig)), tools) as attached:
            yield attached
        return
    if backend == "node":
        with _uncaptured(request.config), node_cluster(request.config) as kubeconfig_path:
            tools = request.getfixturevalue("k8s_tools")
            with attached_cluster(kubeconfig_path, tools) as attached:
                with _uncaptured(request.config):
                    install_chart(attached)
                yield attached
        return
    binaries: Binaries = request.getfixturevalue("k8s_binaries")
    try:
        with running_control_plane(binaries) as plane:
            yield plane
    except ControlPlaneError as error:
        pytest.fail(f"the local control plane did not start: {error}", pytrace=False)
