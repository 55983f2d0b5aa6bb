"""The build step and the fixtures' contract: binaries are built before pytest, never inside it.

``make e2e-build`` (``cluster/build.py``) builds or finds every binary; the session fixture only
finds them and, when one is missing, fails at once naming it and the command that builds it.
These tests use a private, empty cache (``AGENTSAFE_CACHE_DIR``), never the real one, and need
no control plane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import build
from cluster.build import (
    BUILD_COMMAND,
    HELM_VERSION,
    JAEGER_VERSION,
    KUBERNETES_VERSION,
    TOXIPROXY_VERSION,
    BuildRequest,
    cached_binaries,
    missing_binaries,
)

E2E = Path(__file__).resolve().parent
ETCD = "v3.6.8"


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTSAFE_CACHE_DIR", str(cache))
    return cache


def _plant(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def _plant_all(cache: Path, *, controller_manager: bool = True) -> None:
    kube = cache / "k8s" / KUBERNETES_VERSION
    names = ["kube-apiserver", "kubectl"] + (
        ["kube-controller-manager"] if controller_manager else []
    )
    for name in names:
        _plant(kube / name)
    (kube / "manifest.json").write_text(json.dumps({"pins": {"etcd": ETCD}}))
    _plant(cache / "etcd" / ETCD / "etcd")
    _plant(cache / "helm" / HELM_VERSION / "helm")
    _plant(cache / "toxiproxy" / TOXIPROXY_VERSION / "toxiproxy-server")
    for tool in build.RELEASE_TOOLS:
        _plant(tool.path)
    _plant(cache / "jaeger" / JAEGER_VERSION / "jaeger-all-in-one")


def test_an_empty_cache_names_every_missing_binary(empty_cache: Path) -> None:
    missing = missing_binaries()
    assert [entry.split()[0] for entry in missing] == [
        "kube-apiserver",
        "kubectl",
        "kube-controller-manager",
        "helm",
        "etcd",
    ]
    assert (
        f"kubectl {KUBERNETES_VERSION} ({empty_cache}/k8s/{KUBERNETES_VERSION}/kubectl)" in missing
    )
    assert cached_binaries() is None


def test_a_full_cache_is_found_and_one_missing_binary_is_named(empty_cache: Path) -> None:
    _plant_all(empty_cache)
    found = cached_binaries()
    assert found is not None
    assert found.etcd == empty_cache / "etcd" / ETCD / "etcd"
    assert missing_binaries() == []
    (empty_cache / "helm" / HELM_VERSION / "helm").unlink()
    assert missing_binaries() == [f"helm {HELM_VERSION} ({empty_cache}/helm/{HELM_VERSION}/helm)"]
    assert cached_binaries() is None


def test_without_garbage_collection_the_controller_manager_is_not_needed(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plant_all(empty_cache, controller_manager=False)
    monkeypatch.setenv("AGENTSAFE_E2E_GC", "0")
    request = BuildRequest.from_environment()
    assert request.controller_manager is False
    found = cached_binaries(request)
    assert found is not None
    assert found.kube_controller_manager is None
    assert missing_binaries(BuildRequest()) == [
        f"kube-controller-manager {KUBERNETES_VERSION}"
        f" ({empty_cache}/k8s/{KUBERNETES_VERSION}/kube-controller-manager)"
    ]


def test_the_build_step_finds_a_full_cache_without_building(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _plant_all(empty_cache)
    monkeypatch.setattr(build, "_build", _no_build)
    assert build.main([]) == 0
    out, err = capsys.readouterr()
    assert f"all binaries cached under {empty_cache}" in err
    assert f"etcd: {empty_cache}/etcd/{ETCD}/etcd" in out
    assert f"toxiproxy: {empty_cache}/toxiproxy/{TOXIPROXY_VERSION}/toxiproxy-server" in out
    assert f"cosign: {empty_cache}/cosign/{build.COSIGN_VERSION}/cosign" in out
    assert f"registry: {empty_cache}/registry/{build.REGISTRY_VERSION}/registry" in out
    assert f"jaeger: {empty_cache}/jaeger/{JAEGER_VERSION}/jaeger-all-in-one" in out


def _no_build(request: BuildRequest) -> build.Binaries:
    raise AssertionError("a full cache must not be built")


def test_toxiproxy_is_a_build_step_found_in_the_cache_or_built_once(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[str] = []

    def ensure(version: str = TOXIPROXY_VERSION) -> Path:
        built.append(version)
        target = empty_cache / "toxiproxy" / version / "toxiproxy-server"
        _plant(target)
        return target

    monkeypatch.setattr(build, "ensure_toxiproxy", ensure)
    monkeypatch.setattr(build, "go_executable", lambda: "/usr/local/go/bin/go")
    assert build.toxiproxy_binary() is None
    assert build.main(["--only-toxiproxy"]) == 0
    assert built == [TOXIPROXY_VERSION]
    assert build.main(["--only-toxiproxy"]) == 0  # cached: not built again
    assert built == [TOXIPROXY_VERSION]
    path = empty_cache / "toxiproxy" / TOXIPROXY_VERSION / "toxiproxy-server"
    assert build.toxiproxy_binary() == path
    _, err = capsys.readouterr()
    assert f"building toxiproxy {TOXIPROXY_VERSION}" in err
    assert f"toxiproxy {TOXIPROXY_VERSION} cached: {path}" in err
    monkeypatch.setattr(build, "go_executable", lambda: None)
    path.unlink()
    monkeypatch.delenv("AGENTSAFE_E2E", raising=False)
    assert build.main(["--only-toxiproxy"]) == 0
    assert "toxiproxy not built, make chaos will skip" in capsys.readouterr().err


def test_the_release_tools_are_a_build_step_found_in_the_cache_or_built_once(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[str] = []
    real_ensure = build.ensure_go_tool

    def ensure(tool: build.GoTool) -> Path:
        built.append(f"{tool.name}@{tool.version}")
        _plant(tool.path)
        return tool.path

    monkeypatch.setattr(build, "ensure_go_tool", ensure)
    monkeypatch.setattr(build, "go_executable", lambda: "/usr/local/go/bin/go")
    expected = [f"cosign@{build.COSIGN_VERSION}", f"registry@{build.REGISTRY_VERSION}"]
    assert build.main(["--only-release-tools"]) == 0
    assert built == expected
    assert build.main(["--only-release-tools"]) == 0  # cached: not built again
    assert built == expected
    cosign = empty_cache / "cosign" / build.COSIGN_VERSION / "cosign"
    assert build.go_tool_binary(build.COSIGN) == cosign
    out, err = capsys.readouterr()
    assert f"building cosign {build.COSIGN_VERSION}" in err
    assert f"cosign {build.COSIGN_VERSION} cached: {cosign}" in err
    assert f"cosign: {cosign}" in out
    monkeypatch.setattr(build, "go_executable", lambda: None)
    monkeypatch.setenv("AGENTSAFE_E2E", "require")
    cosign.unlink()
    monkeypatch.setattr(build, "ensure_go_tool", real_ensure)
    assert build.main(["--only-release-tools"]) == 1
    assert "no Go toolchain on PATH to build cosign" in capsys.readouterr().err


def test_jaeger_is_a_build_step_found_in_the_cache_or_built_once(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[str] = []

    def ensure(version: str = JAEGER_VERSION) -> Path:
        built.append(version)
        target = empty_cache / "jaeger" / version / "jaeger-all-in-one"
        _plant(target)
        return target

    monkeypatch.setattr(build, "ensure_jaeger", ensure)
    monkeypatch.setattr(build, "go_executable", lambda: "/usr/local/go/bin/go")
    assert build.jaeger_binary() is None
    assert build.main(["--only-jaeger"]) == 0
    assert build.main(["--only-jaeger"]) == 0  # cached: not built again
    assert built == [JAEGER_VERSION]
    path = empty_cache / "jaeger" / JAEGER_VERSION / "jaeger-all-in-one"
    assert f"jaeger {JAEGER_VERSION} cached: {path}" in capsys.readouterr().err
    monkeypatch.setattr(build, "go_executable", lambda: None)
    path.unlink()
    monkeypatch.delenv("AGENTSAFE_E2E", raising=False)
    assert build.main(["--only-jaeger"]) == 0
    assert "jaeger not built, the tracing test will skip" in capsys.readouterr().err


def test_without_go_the_build_step_skips_unless_required(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "go_executable", lambda: None)
    monkeypatch.delenv("AGENTSAFE_E2E", raising=False)
    assert build.main([]) == 0
    assert "no Go toolchain on PATH: nothing built" in capsys.readouterr().err
    monkeypatch.setenv("AGENTSAFE_E2E", "require")
    assert build.main([]) == 1
    assert "no Go toolchain on PATH to build" in capsys.readouterr().err
    assert not (empty_cache / "k8s").exists()


@pytest.mark.slow
def test_a_missing_binary_fails_the_session_at_once_naming_the_build_command(
    empty_cache: Path, tmp_path: Path
) -> None:
    """A fresh pytest over a suite that needs the binaries, with nothing built: no build starts."""
    env = {**os.environ, "AGENTSAFE_CACHE_DIR": str(empty_cache), "AGENTSAFE_E2E": "require"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(E2E.parent),
            f"{E2E / 'test_chart.py'}::test_helm_lint_passes",
        ],
        cwd=tmp_path,  # never the checkout: operator/ there would shadow the standard library
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"run `{BUILD_COMMAND}` first" in output
    assert f"kube-apiserver {KUBERNETES_VERSION} ({empty_cache}" in output
    assert not (empty_cache / "k8s").exists(), "the fixture must never start a build"
