"""Fixtures for the end-to-end suite: real Kubernetes binaries and a control plane per session.

Role: give every e2e test a running ``etcd`` + ``kube-apiserver`` (and
``kube-controller-manager`` for garbage collection when it was built) on loopback, with an
admin kubeconfig. The binaries come from :mod:`cluster.build`, which ``make e2e-build`` (a
prerequisite of ``make e2e`` and ``make test``) runs before pytest starts: no test timeout ever
covers a build. This module only finds them. When one is missing the session fails at once,
naming it and the command that builds it; only where they cannot be built at all (no Go
toolchain) is the suite skipped with one reason line — unless ``AGENTSAFE_E2E=require`` (set by
``.ci/run``), which turns that into a failure too.

``--backend=local`` (default) is the loopback control plane; ``--backend=node`` is the real
one-node cluster of :mod:`cluster.node`, which must be running (``make cluster-up``, or ``make
e2e-node``/``make e2e``, which bring it up before pytest and down after), with the chart
installed here from ``agentsafe:dev``; ``--backend=kind`` uses the cluster the current
kubeconfig points at (see ``e2e/kind/``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from cluster.build import (
    BUILD_COMMAND,
    REQUIRE_ENV,
    Binaries,
    BuildRequest,
    Tools,
    cached_binaries,
    e2e_required,
    go_executable,
    missing_binaries,
)
from cluster.chart_install import INSTALL_SECONDS, install_chart
from cluster.control_plane import (
    ControlPlane,
    ControlPlaneError,
    attached_cluster,
    running_control_plane,
)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item (``item.rep_call``), so a fixture's teardown can
    tell that its test failed and say more about why (``test_scenario.py``)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected: the first test that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--backend=node`` installs the chart (``control_plane``) in the setup of the first test
    that asks for the cluster, under that test's pytest-timeout (``timeout = 300``,
    pyproject.toml). That test gets the install's own bound on top (``INSTALL_SECONDS``: helm
    install, helm test and a failure's diagnosis), so a slow install fails with helm's message
    and what the cluster saw, not pytest-timeout's, and the test still has its own time."""
    if config.getoption("backend") != "node":
        return
    first = next((item for item in items if "control_plane" in _fixturenames(item)), None)
    if first is None:
        return
    marker = first.get_closest_marker("timeout")
    option = config.getoption("timeout", None)
    if marker is not None and marker.args:
        timeout = float(marker.args[0])
    elif option is not None:
        timeout = float(option)
    else:
        timeout = float(config.getini("timeout") or 0)
    if timeout > 0:  # 0 is no timeout at all
        first.add_marker(pytest.mark.timeout(timeout + INSTALL_SECONDS), append=False)


def _fixturenames(item: pytest.Item) -> list[str]:
    names: list[str] = getattr(item, "fixturenames", [])
    return names


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("local", "node", "kind"),
        default="local",
        help="local: loopback etcd+kube-apiserver; node: the real one-node cluster on this "
        "machine (make cluster-up); kind: the current kubeconfig's cluster",
    )


def _unavailable(message: str) -> None:
    if e2e_required():
        pytest.fail(f"{REQUIRE_ENV}=require and {message}", pytrace=False)
    pytest.skip(f"e2e suite skipped: {message} (set {REQUIRE_ENV}=require to fail instead)")


def _running_node() -> Path:
    """The running node's admin kubeconfig. The suite never brings a node up itself (that
    builds images and takes minutes): ``make e2e-node`` does, before pytest starts."""
    from cluster import node

    info = node.status()
    if not info.get("running") or not info.get("ready"):
        _unavailable("no one-node cluster is running here (make cluster-up, or make e2e-node)")
    return Path(str(info["kubeconfig"]))


@pytest.fixture(scope="session")
def backend(pytestconfig: pytest.Config) -> str:
    return str(pytestconfig.getoption("backend"))


@pytest.fixture(scope="session")
def k8s_binaries(backend: str) -> Binaries:
    """kube-apiserver, kubectl, etcd, helm from the cache; never builds (see BUILD_COMMAND)."""
    if backend == "kind":
        pytest.skip("locally built Kubernetes binaries belong to --backend=local and node")
    request = BuildRequest.from_environment()
    found = cached_binaries(request)
    if found is not None:
        return found
    if go_executable() is None:
        _unavailable(f"no Go toolchain to build the Kubernetes binaries ({BUILD_COMMAND} needs go)")
    missing = "\n  ".join(missing_binaries(request))
    pytest.fail(
        f"the e2e binaries are not built; run `{BUILD_COMMAND}` first"
        f" (or `.venv/bin/python e2e/cluster/build.py`). Missing:\n  {missing}",
        pytrace=False,
    )


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
        with attached_cluster(_running_node(), request.getfixturevalue("k8s_tools")) as attached:
            install_chart(attached)
            yield attached
        return
    binaries: Binaries = request.getfixturevalue("k8s_binaries")
    try:
        with running_control_plane(binaries) as plane:
            yield plane
    except ControlPlaneError as error:
        pytest.fail(f"the local control plane did not start: {error}", pytrace=False)
