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
import time
from collections.abc import Iterator
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
        _plant(cache / tool.name / tool.version / tool.binary)
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


# --- the late tools' background build (make e2e-build starts it, make e2e / release-test wait) ---
#
# A stand-in for the Go toolchain (a stub, named as such: the logic under test is the job, the
# state file, the waiting and the locks, not Go). It records each call with its niceness, holds
# each build until its gate file exists, fails a build whose ``<name>.fail`` file exists, and
# writes a tiny executable where go would have written the binary.
FAKE_GO = r"""#!/bin/sh
echo "nice=$(nice) $*" >> "$FAKE_GO_CALLS"
case "$1" in
version) echo "go version go0.0-fake linux/amd64"; exit 0 ;;
mod) echo "{\"Dir\": \"$FAKE_GO_SRC\", \"GoMod\": \"$FAKE_GO_SRC/go.mod\"}"; exit 0 ;;
esac
out=""; prev=""; last=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg; last=$arg
done
pkg=${last%@*}; name=${pkg##*/}
[ -n "$out" ] || out="$GOBIN/$name"
i=0
while [ ! -e "$FAKE_GO_GATES/$name" ]; do
  i=$((i + 1)); [ "$i" -lt 1200 ] || { echo "fake go: gate $name never opened" >&2; exit 3; }
  sleep 0.1
done
if [ -e "$FAKE_GO_GATES/$name.fail" ]; then
  echo "fake go: the build of $name failed on purpose" >&2; exit 2
fi
mkdir -p "$(dirname "$out")"
printf '#!/bin/sh\necho %s\n' "$name" > "$out"
chmod +x "$out"
"""
BUILD_PY = E2E / "cluster" / "build.py"
LATE = {"all-in-one": "jaeger", "cosign": "cosign", "registry": "registry"}


class Waiter:
    """A build.py run in the background of the test, its output in files."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.out = cwd / f"waiter-{len(list(cwd.glob('waiter-*')))}"
        self.err = self.out.with_suffix(".err")
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)

    def wait(self, *, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        return self.err.read_text()


class FakeGo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "fakebin"
        self.gates = root / "gates"
        self.calls = root / "calls.log"
        self.cache = root / "cache"
        src = root / "src"
        for directory in (self.bin, self.gates, src, self.cache):
            directory.mkdir(parents=True)
        (src / "go.mod").write_text("module fake\n")
        (self.bin / "go").write_text(FAKE_GO)
        (self.bin / "go").chmod(0o755)
        self.calls.touch()
        self.env = {
            **os.environ,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "AGENTSAFE_CACHE_DIR": str(self.cache),
            "AGENTSAFE_E2E": "require",
            "FAKE_GO_CALLS": str(self.calls),
            "FAKE_GO_GATES": str(self.gates),
            "FAKE_GO_SRC": str(src),
        }

    def open(self, *names: str) -> None:
        for name in names:
            (self.gates / name).touch()

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(BUILD_PY), *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self, *args: str) -> Waiter:
        return Waiter([sys.executable, str(BUILD_PY), *args], self.env, self.root)

    def until(self, waiter: Waiter, text: str) -> None:
        """Poll (bounded) until ``text`` is in what ``waiter`` has written to stderr so far."""
        deadline = time.monotonic() + 60
        while text not in waiter.err.read_text():
            assert waiter.process.poll() is None, waiter.err.read_text()
            assert time.monotonic() < deadline, waiter.err.read_text()
            time.sleep(0.05)

    def builds(self) -> list[tuple[str, str]]:
        """(niceness, binary) of every build or install the stub saw, in order."""
        found = []
        for line in self.calls.read_text().splitlines():
            nice, _, argv = line.partition(" ")
            if argv.startswith(("build ", "install ")):
                package = argv.split()[-1].split("@")[0]
                found.append((nice, LATE.get(package.rsplit("/", 1)[-1], package)))
        return found

    def state(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.cache / "background" / "state.json").read_text())
        return data

    def settle(self) -> None:
        """Open every gate and wait (bounded) until the job has written its result."""
        self.open(*LATE)
        deadline = time.monotonic() + 120
        while self.state().get("status") == "running":
            assert time.monotonic() < deadline, "the background job never finished"
            time.sleep(0.1)


@pytest.fixture
def fake_go(tmp_path: Path) -> Iterator[FakeGo]:
    fake = FakeGo(tmp_path)
    try:
        yield fake
    finally:
        if (fake.cache / "background" / "state.json").exists():
            fake.settle()


def test_the_late_tools_build_in_one_background_job_the_late_stages_wait_for(
    fake_go: FakeGo,
) -> None:
    started = fake_go.run("--background-start")
    assert started.returncode == 0, started.stderr
    assert "background job" in started.stderr
    assert fake_go.state()["status"] == "running"
    assert "(log: " in started.stderr
    again = fake_go.run("--background-start")  # make e2e runs e2e-build again: no second job
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stderr
    # make e2e: waits for Jaeger (held at its gate until the waiter says it waits), not cosign
    jaeger = fake_go.start("--only-jaeger")
    fake_go.until(jaeger, "waiting for the background build of jaeger")
    fake_go.open("all-in-one")
    assert jaeger.wait(timeout=120) == 0, jaeger.stderr
    assert f"build jaeger {JAEGER_VERSION}" in jaeger.stderr  # the job's progress, printed
    assert f"jaeger: {fake_go.cache}/jaeger/{JAEGER_VERSION}/jaeger-all-in-one" in jaeger.stdout
    assert fake_go.state()["status"] == "running"  # cosign's gate is still closed
    fake_go.open("cosign", "registry")
    release = fake_go.run("--only-release-tools")  # make release-test
    assert release.returncode == 0, release.stderr
    assert f"cosign: {fake_go.cache}/cosign/{build.COSIGN_VERSION}/cosign" in release.stdout
    assert fake_go.state()["status"] == "ok"
    # each tool built once, all in the job, at nice 19 (the stub's niceness) until a stage waits:
    # from then on at the foreground's 10 (as root; otherwise it cannot be raised)
    waited = "nice=10" if os.geteuid() == 0 else "nice=19"
    assert fake_go.builds() == [("nice=19", "jaeger"), (waited, "cosign"), (waited, "registry")]
    if os.geteuid() == 0:
        assert "the background build now runs at nice 10" in jaeger.stderr


def test_a_failed_background_build_fails_the_waiting_stage_with_the_log_tail(
    fake_go: FakeGo,
) -> None:
    fake_go.open("all-in-one", "cosign", "registry", "cosign.fail")
    assert fake_go.run("--background-start").returncode == 0
    release = fake_go.run("--only-release-tools")
    assert release.returncode == 1, release.stderr
    assert "the background build of cosign failed" in release.stderr
    assert "fake go: the build of cosign failed on purpose" in release.stderr  # the log's tail
    assert fake_go.state()["status"] == "failed"
    assert "registry" in [name for _, name in fake_go.builds()]  # the job went on with the next
    jaeger = fake_go.run("--only-jaeger")
    assert jaeger.returncode == 0, jaeger.stderr
    # once reported, the next run builds what is missing in the foreground, as without a job
    (fake_go.gates / "cosign.fail").unlink()
    retry = fake_go.run("--only-release-tools")
    assert retry.returncode == 0, retry.stderr
    assert [name for _, name in fake_go.builds()].count("cosign") == 2  # the job's, then this


def test_the_full_build_step_starts_the_late_tools_in_the_background(fake_go: FakeGo) -> None:
    """``make e2e-build`` (build.py without arguments) starts the job first; with the control
    plane's binaries planted it builds nothing else in the foreground."""
    _plant_all(fake_go.cache)
    for tool in (*build.RELEASE_TOOLS, build.JAEGER):
        tool_path = fake_go.cache / tool.name / tool.version / tool.binary
        tool_path.unlink()
    result = fake_go.run()
    assert result.returncode == 0, result.stderr
    assert "background job" in result.stderr
    assert fake_go.state()["status"] == "running"
    fake_go.settle()
    assert fake_go.state()["status"] == "ok"
    assert sorted(b[1] for b in fake_go.builds()) == ["cosign", "jaeger", "registry"]
