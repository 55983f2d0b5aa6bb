"""Build and cache the real Kubernetes binaries the end-to-end suite runs, with no containers.

Role: turn pinned releases from the Go module proxy into executables under a cache outside the
repository (``~/.cache/agentsafe/k8s/<version>/`` and siblings), so only a cold machine pays the
build. Callers: ``make e2e-build`` (:data:`BUILD_COMMAND`; a prerequisite of ``make e2e`` and
``make test``, so every build finishes before pytest starts and no test timeout ever covers one)
runs :func:`main`, which prints progress while building; the session fixture in
``e2e/conftest.py`` only looks binaries up with :func:`cached_binaries` and, when one is missing,
fails at once naming it (:func:`missing_binaries`) and this command. A new binary for the suites
is one more step in :func:`_build_missing` and one more field of :class:`Binaries`.

What is built and how:

* ``kube-apiserver``, ``kubectl`` (and ``kube-controller-manager`` unless disabled): a throwaway
  wrapper module in a temporary directory outside the repository requires ``k8s.io/kubernetes``
  at :data:`KUBERNETES_VERSION` and replaces every ``k8s.io/*`` staging module with its ``v0.x``
  release. The list of staging modules is read from that release's own ``go.mod`` (its
  ``=> ./staging/...`` replacements), never hard-coded. The version ldflags make ``/version``
  report the real release.
* ``etcd``: the same way, from ``go.etcd.io/etcd/server/v3`` (whose root package is etcd's
  ``main``) at the version the Kubernetes release itself pins.
* ``helm``: ``go install helm.sh/helm/v3/cmd/helm@<pinned>``.
* ``toxiproxy-server`` (the nemesis harness's fault-injecting TCP proxy, ``make chaos``,
  ``e2e/chaos/``): ``go install github.com/Shopify/toxiproxy/v2/cmd/server@<pinned>`` into
  ``<cache>/toxiproxy/<version>/`` (:func:`ensure_toxiproxy`, :func:`toxiproxy_binary`).
* ``cosign`` and the OCI ``registry`` (distribution) for ``make release`` and its test
  (``e2e/release/``): ``go install`` of their ``cmd/`` packages at the pinned versions into
  ``<cache>/cosign/<version>/`` and ``<cache>/registry/<version>/`` (:data:`RELEASE_TOOLS`,
  :func:`ensure_go_tool`; ``--only-release-tools`` waits for the background job, then finds or
  builds just these two).
* ``jaeger-all-in-one`` (the real OTLP collector and trace store of the tracing test,
  ``e2e/tracing/test_jaeger.py``): ``github.com/jaegertracing/jaeger/cmd/all-in-one``
  at the pinned version, built as its own main module (its go.mod has a replace directive, which
  ``go install pkg@version`` refuses) into ``<cache>/jaeger/<version>/`` (:data:`JAEGER`,
  :func:`jaeger_binary`; ``--only-jaeger`` waits for the background job, then finds or builds
  just this one).

These three are needed only by the late stages (the end of ``make e2e``, ``make
release-test``), so ``make e2e-build`` (``--background-start``, and the full run) builds them as
ONE background job at nice 19 (:data:`BACKGROUND_TOOLS`, :func:`start_background`,
:func:`wait_for_background`); ``--no-background`` builds them in the foreground instead.

Everything is built with ``CGO_ENABLED=0 GOFLAGS=-mod=mod``, ``-trimpath`` and ``-ldflags=-s -w``
(no symbol table, no DWARF: a shorter link, the same program) under ``nice`` so that the build
shares two cores politely. A finished binary is moved into place atomically, and a
``manifest.json`` beside it records what was built, with which Go, and how long it took.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

KUBERNETES_VERSION = "v1.36.3"
HELM_VERSION = "v3.21.4"
TOXIPROXY_VERSION = "v2.5.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
COSIGN_VERSION = "v2.6.5"
COSIGN_MODULE = "github.com/sigstore/cosign/v2"
REGISTRY_VERSION = "v3.1.2"
REGISTRY_MODULE = "github.com/distribution/distribution/v3"
JAEGER_VERSION = "v1.76.0"
JAEGER_MODULE = "github.com/jaegertracing/jaeger"
#: None: take the etcd release that the Kubernetes release pins in its go.mod.
ETCD_VERSION: str | None = None

KUBE_COMMANDS = ("kube-apiserver", "kubectl")
CONTROLLER_MANAGER = "kube-controller-manager"

#: What builds (or finds) every binary the suites need; printed wherever one is missing.
BUILD_COMMAND = "make e2e-build"
#: ``require`` (set by ``.ci/run``): no Go toolchain is a failure, never a skipped suite.
REQUIRE_ENV = "AGENTSAFE_E2E"
#: ``0``: no kube-controller-manager (owner references are then asserted, not collected).
GC_ENV = "AGENTSAFE_E2E_GC"


def e2e_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").lower() == "require"


class BuildUnavailable(RuntimeError):
    """The binaries are not cached and cannot be built here (no Go toolchain, build failed)."""


def cache_root() -> Path:
    """``$AGENTSAFE_CACHE_DIR`` or ``$XDG_CACHE_HOME/agentsafe`` or ``~/.cache/agentsafe``."""
    explicit = os.environ.get("AGENTSAFE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentsafe"


@dataclasses.dataclass(frozen=True)
class Tools:
    """The clients the tests drive a cluster with (local builds, or from PATH for kind)."""

    kubectl: Path
    helm: Path


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Paths of the built executables; ``kube_controller_manager`` is None when not built."""

    kubernetes_version: str
    etcd_version: str
    helm_version: str
    kube_apiserver: Path
    kubectl: Path
    etcd: Path
    helm: Path
    kube_controller_manager: Path | None

    @property
    def tools(self) -> Tools:
        return Tools(kubectl=self.kubectl, helm=self.helm)


def _log(message: str) -> None:
    print(f"[e2e-build {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def go_executable() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    default = Path("/usr/local/go/bin/go")
    return str(default) if default.exists() else None


def _go_env(go: str, *, gomaxprocs: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    env.setdefault("GOTOOLCHAIN", "local")
    # One compile at a time leaves the other core for whatever else runs on the machine.
    env["GOMAXPROCS"] = str(gomaxprocs or max(1, min(2, os.cpu_count() or 1)))
    env["PATH"] = f"{Path(go).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


#: Foreground builds run at this niceness; False in the background job, whose builds keep the
#: job's own (19, or :data:`FOREGROUND_NICE` once a stage waits for it: :func:`_hasten`).
_NICE_BUILDS = True
FOREGROUND_NICE = 10


def _nice_prefix() -> list[str]:
    nice = shutil.which("nice")
    return [nice, "-n", str(FOREGROUND_NICE)] if nice and _NICE_BUILDS else []


def _run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], what: str) -> str:
    """Run a build step, printing a heartbeat every 30 s so a long build is visibly alive."""
    _log(f"{what}: {' '.join(argv)}")
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as output:
        process = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdout=output, stderr=subprocess.STDOUT
        )
        while True:
            try:
                process.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                _log(f"{what}: still building ({time.monotonic() - started:.0f} s)")
        output.seek(0)
        text = output.read()
    if process.returncode != 0:
        tail = "\n".join(text.splitlines()[-40:])
        raise BuildUnavailable(f"{what} failed (exit {process.returncode}):\n{tail}")
    _log(f"{what}: done in {time.monotonic() - started:.0f} s")
    return text


def _module_info(go: str, module: str, env: Mapping[str, str], workdir: Path) -> dict[str, str]:
    text = _run(
        [go, "mod", "download", "-json", module],
        cwd=workdir,
        env=env,
        what=f"download {module}",
    )
    info: dict[str, str] = json.loads(text[text.index("{") :])
    if "Error" in info:
        raise BuildUnavailable(f"go mod download {module}: {info['Error']}")
    return info


_STAGING = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._/-]+)\s*=>\s*\./staging/", re.MULTILINE)
_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)
_GODEBUG = re.compile(r"^godebug\s+.*$", re.MULTILINE)
_REQUIRE_LINE = re.compile(r"^\s*([^\s()]+)\s+(v\S+)", re.MULTILINE)


def staging_modules(go_mod: str) -> list[str]:
    """The ``k8s.io/*`` modules a Kubernetes ``go.mod`` replaces with its staging directory."""
    return sorted(set(_STAGING.findall(go_mod)))


def required_version(go_mod: str, module: str) -> str | None:
    for path, version in _REQUIRE_LINE.findall(go_mod):
        if path == module:
            return str(version)
    return None


def staging_release(kubernetes_version: str) -> str:
    """``v1.36.3`` -> ``v0.36.3``: the tag the staging modules are published under."""
    match = re.fullmatch(r"v1\.(\d+\.\d+(?:-[0-9A-Za-z.-]+)?)", kubernetes_version)
    if not match:
        raise ValueError(f"not a Kubernetes v1.x release: {kubernetes_version}")
    return f"v0.{match.group(1)}"


def wrapper_go_mod(
    *,
    module: str,
    upstream_go_mod: str,
    requires: Mapping[str, str],
    replaces: Mapping[str, str],
) -> str:
    """A throwaway ``go.mod``: same ``go``/``godebug`` lines as upstream, our requires/replaces."""
    go_line = _GO_DIRECTIVE.search(upstream_go_mod)
    lines = [f"module {module}", "", f"go {go_line.group(1) if go_line else '1.22'}", ""]
    lines += [match.group(0) for match in _GODEBUG.finditer(upstream_go_mod)]
    lines += ["", "require ("]
    lines += [f"\t{path} {version}" for path, version in sorted(requires.items())]
    lines += [")", ""]
    if replaces:
        lines += ["replace ("]
        lines += [f"\t{path} => {path} {version}" for path, version in sorted(replaces.items())]
        lines += [")", ""]
    return "\n".join(lines)


def kube_ldflags(version: str, *, build_date: str) -> str:
    match = re.fullmatch(r"v(\d+)\.(\d+)\..*", version)
    if not match:
        raise ValueError(f"not a release version: {version}")
    major, minor = match.groups()
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{name}={value}" for name, value in values.items()]
    return " ".join(flags)


@dataclasses.dataclass(frozen=True)
class _Paths:
    kube_dir: Path
    etcd_dir: Path
    helm_dir: Path


def _paths(kubernetes_version: str, etcd_version: str, helm_version: str) -> _Paths:
    root = cache_root()
    return _Paths(
        kube_dir=root / "k8s" / kubernetes_version,
        etcd_dir=root / "etcd" / etcd_version,
        helm_dir=root / "helm" / helm_version,
    )


def _record(directory: Path, name: str, entry: Mapping[str, object]) -> None:
    manifest = directory / "manifest.json"
    data: dict[str, object] = {}
    if manifest.exists():
        data = json.loads(manifest.read_text())
    data[name] = dict(entry)
    staging = manifest.with_suffix(".tmp")
    staging.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    staging.replace(manifest)


def _install(built: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.partial")
    shutil.copy2(built, staging)
    staging.chmod(0o755)
    staging.replace(target)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@dataclasses.dataclass
class _Builder:
    go: str
    gomaxprocs: int | None
    workroot: Path

    def env(self) -> dict[str, str]:
        return _go_env(self.go, gomaxprocs=self.gomaxprocs)

    def kubernetes_go_mod(self, version: str) -> str:
        info = _module_info(self.go, f"k8s.io/kubernetes@{version}", self.env(), self.workroot)
        return Path(info["GoMod"]).read_text()

    def build_kubernetes(self, version: str, commands: Sequence[str], out: Path) -> float:
        upstream = self.kubernetes_go_mod(version)
        staging = staging_modules(upstream)
        if not staging:
            raise BuildUnavailable(f"k8s.io/kubernetes@{version} go.mod lists no staging modules")
        release = staging_release(version)
        module_dir = Path(tempfile.mkdtemp(prefix="kube-wrapper-", dir=self.workroot))
        (module_dir / "go.mod").write_text(
            wrapper_go_mod(
                module="agentsafe.local/e2e/kubebuild",
                upstream_go_mod=upstream,
                requires={"k8s.io/kubernetes": version},
                replaces=dict.fromkeys(staging, release),
            )
        )
        _log(f"kubernetes {version}: {len(staging)} staging modules replaced with {release}")
        packages = [f"k8s.io/kubernetes/cmd/{name}" for name in commands]
        started = time.monotonic()
        build_date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _run(
            [
                *_nice_prefix(),
                self.go,
                "build",
                "-trimpath",
                "-p",
                "2",
                "-o",
                str(out) + "/",
                "-ldflags",
                kube_ldflags(version, build_date=build_date),
                *packages,
            ],
            cwd=module_dir,
            env=self.env(),
            what=f"build {', '.join(commands)} {version}",
        )
        return time.monotonic() - started

    def build_etcd(self, version: str, out: Path) -> float:
        module = "go.etcd.io/etcd/server/v3"
        info = _module_info(self.go, f"{module}@{version}", self.env(), self.workroot)
        upstream = Path(info["GoMod"]).read_text()
        module_dir = Path(tempfile.mkdtemp(prefix="etcd-wrapper-", dir=self.workroot))
        (module_dir / "go.mod").write_text(
            wrapper_go_mod(
                module="agentsafe.local/e2e/etcdbuild",
                upstream_go_mod=upstream,
                requires={module: version},
                replaces={},
            )
        )
        started = time.monotonic()
        _run(
            [
                *_nice_prefix(),
                self.go,
                "build",
                "-trimpath",
                "-p",
                "2",
                "-o",
                str(out / "etcd"),
                "-ldflags",
                "-s -w",
                module,
            ],
            cwd=module_dir,
            env=self.env(),
            what=f"build etcd {version}",
        )
        return time.monotonic() - started

    def build_helm(self, version: str, out: Path) -> float:
        env = self.env()
        env["GOBIN"] = str(out)
        ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={version}"
        started = time.monotonic()
        _run(
            [
                *_nice_prefix(),
                self.go,
                "install",
                "-trimpath",
                "-p",
                "2",
                "-ldflags",
                ldflags,
                f"helm.sh/helm/v3/cmd/helm@{version}",
            ],
            cwd=self.workroot,
            env=env,
            what=f"build helm {version}",
        )
        return time.monotonic() - started


def _etcd_version_from(upstream_go_mod: str) -> str:
    pinned = required_version(upstream_go_mod, "go.etcd.io/etcd/server/v3")
    if not pinned:
        raise BuildUnavailable("the Kubernetes go.mod does not pin go.etcd.io/etcd/server/v3")
    return pinned


@dataclasses.dataclass(frozen=True)
class BuildRequest:
    kubernetes_version: str = KUBERNETES_VERSION
    helm_version: str = HELM_VERSION
    etcd_version: str | None = ETCD_VERSION
    controller_manager: bool = True
    gomaxprocs: int | None = None

    @classmethod
    def from_environment(cls) -> BuildRequest:
        """The suites' request: the pins, kube-controller-manager unless ``AGENTSAFE_E2E_GC=0``."""
        return cls(controller_manager=os.environ.get(GC_ENV, "1") != "0")


def _etcd_version_cached(kubernetes_version: str) -> str | None:
    manifest = cache_root() / "k8s" / kubernetes_version / "manifest.json"
    if not manifest.exists():
        return None
    value = json.loads(manifest.read_text()).get("pins", {}).get("etcd")
    return str(value) if value else None


def cached_binaries(request: BuildRequest = BuildRequest()) -> Binaries | None:
    """The cached binaries for ``request`` if every one is present; never builds."""
    etcd_version = request.etcd_version or _etcd_version_cached(request.kubernetes_version)
    if etcd_version is None or missing_binaries(request):
        return None
    paths = _paths(request.kubernetes_version, etcd_version, request.helm_version)
    kcm = paths.kube_dir / CONTROLLER_MANAGER
    found = Binaries(
        kubernetes_version=request.kubernetes_version,
        etcd_version=etcd_version,
        helm_version=request.helm_version,
        kube_apiserver=paths.kube_dir / "kube-apiserver",
        kubectl=paths.kube_dir / "kubectl",
        etcd=paths.etcd_dir / "etcd",
        helm=paths.helm_dir / "helm",
        kube_controller_manager=kcm if _executable(kcm) else None,
    )
    return found


def missing_binaries(request: BuildRequest = BuildRequest()) -> list[str]:
    """What :func:`cached_binaries` lacks for ``request``, one ``"<name> <version> (<path>)"`` each.

    etcd's version is the one the Kubernetes release pins, recorded by the first build; before
    that its path is unknown and the entry says so.
    """
    etcd_version = request.etcd_version or _etcd_version_cached(request.kubernetes_version)
    paths = _paths(request.kubernetes_version, etcd_version or "?", request.helm_version)
    kube = [*KUBE_COMMANDS, *([CONTROLLER_MANAGER] if request.controller_manager else [])]
    wanted = [(name, request.kubernetes_version, paths.kube_dir / name) for name in kube]
    wanted.append(("helm", request.helm_version, paths.helm_dir / "helm"))
    missing = [f"{name} {version} ({at})" for name, version, at in wanted if not _executable(at)]
    if etcd_version is None:
        missing.append(f"etcd (the version {request.kubernetes_version} pins; not built yet)")
    elif not _executable(paths.etcd_dir / "etcd"):
        missing.append(f"etcd {etcd_version} ({paths.etcd_dir / 'etcd'})")
    return missing


def ensure_binaries(request: BuildRequest = BuildRequest()) -> Binaries:
    """Return cached binaries, building whatever is missing. Raises :class:`BuildUnavailable`."""
    cached = cached_binaries(request)
    if cached is not None:
        return cached
    cache_root().mkdir(parents=True, exist_ok=True)
    # One build at a time per cache (CI's build step and a test session must not race).
    with (cache_root() / ".build.lock").open("w") as lock:
        if _locked(lock):
            _log("another build holds the lock; waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = cached_binaries(request)
        if cached is not None:
            return cached
        return _build(request)


def _locked(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def _build(request: BuildRequest) -> Binaries:
    go = go_executable()
    if go is None:
        raise BuildUnavailable("no Go toolchain on PATH to build kube-apiserver, etcd and helm")
    total_started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentsafe-k8s-build-") as work:
        builder = _Builder(go=go, gomaxprocs=request.gomaxprocs, workroot=Path(work))
        upstream = builder.kubernetes_go_mod(request.kubernetes_version)
        etcd_version = request.etcd_version or _etcd_version_from(upstream)
        paths = _paths(request.kubernetes_version, etcd_version, request.helm_version)
        paths.kube_dir.mkdir(parents=True, exist_ok=True)
        _record(paths.kube_dir, "pins", {"etcd": etcd_version, "helm": request.helm_version})
        out = Path(work) / "bin"
        out.mkdir()
        for name, seconds in _build_missing(builder, request, paths, etcd_version, out):
            _log(f"{name}: built in {seconds:.0f} s")
    _log(f"all binaries ready in {time.monotonic() - total_started:.0f} s")
    result = cached_binaries(dataclasses.replace(request, etcd_version=etcd_version))
    if result is None:
        raise BuildUnavailable("the build finished but a binary is missing from the cache")
    return result


def _build_missing(
    builder: _Builder, request: BuildRequest, paths: _Paths, etcd_version: str, out: Path
) -> Iterator[tuple[str, float]]:
    go_version = subprocess.run(
        [builder.go, "version"], capture_output=True, text=True, check=False
    ).stdout.strip()

    def done(directory: Path, name: str, seconds: float, version: str) -> None:
        _install(out / name, directory / name)
        entry = {"version": version, "seconds": round(seconds, 1), "go": go_version}
        _record(directory, name, entry)

    if not _executable(paths.etcd_dir / "etcd"):
        seconds = builder.build_etcd(etcd_version, out)
        done(paths.etcd_dir, "etcd", seconds, etcd_version)
        yield "etcd", seconds
    if not _executable(paths.helm_dir / "helm"):
        seconds = builder.build_helm(request.helm_version, out)
        done(paths.helm_dir, "helm", seconds, request.helm_version)
        yield "helm", seconds
    version = request.kubernetes_version
    missing = [name for name in KUBE_COMMANDS if not _executable(paths.kube_dir / name)]
    if missing:
        seconds = builder.build_kubernetes(version, missing, out)
        for name in missing:
            done(paths.kube_dir, name, seconds, version)
        yield " + ".join(missing), seconds
    if request.controller_manager and not _executable(paths.kube_dir / CONTROLLER_MANAGER):
        seconds = builder.build_kubernetes(version, [CONTROLLER_MANAGER], out)
        done(paths.kube_dir, CONTROLLER_MANAGER, seconds, version)
        yield CONTROLLER_MANAGER, seconds


@dataclasses.dataclass(frozen=True)
class GoTool:
    """One ``go install``-able command, cached as ``<cache>/<name>/<version>/<binary>``."""

    name: str
    module: str
    package: str
    version: str
    binary: str
    version_ldflags: str = ""
    #: Build inside a copy of ``module`` as the main module (``go build``), for a module whose
    #: go.mod has replace directives, which ``go install pkg@version`` refuses.
    as_main_module: bool = False

    @property
    def directory(self) -> Path:
        return cache_root() / self.name / self.version

    @property
    def path(self) -> Path:
        return self.directory / self.binary


def toxiproxy_tool(version: str = TOXIPROXY_VERSION) -> GoTool:
    return GoTool(
        name="toxiproxy",
        module=TOXIPROXY_MODULE,
        package=f"{TOXIPROXY_MODULE}/cmd/server",
        version=version,
        binary="toxiproxy-server",
        version_ldflags=f"-X {TOXIPROXY_MODULE}.Version={version.removeprefix('v')}",
    )


#: ``make release`` signs and attests with cosign; its test pushes to this registry.
COSIGN = GoTool(
    name="cosign",
    module=COSIGN_MODULE,
    package=f"{COSIGN_MODULE}/cmd/cosign",
    version=COSIGN_VERSION,
    binary="cosign",
    version_ldflags=f"-X sigs.k8s.io/release-utils/version.gitVersion={COSIGN_VERSION}",
)
REGISTRY = GoTool(
    name="registry",
    module=REGISTRY_MODULE,
    package=f"{REGISTRY_MODULE}/cmd/registry",
    version=REGISTRY_VERSION,
    binary="registry",
    version_ldflags=f"-X {REGISTRY_MODULE}/version.version={REGISTRY_VERSION}",
)
RELEASE_TOOLS = (COSIGN, REGISTRY)
#: The tracing test's real collector: OTLP/HTTP in, an in-memory store, the query API.
JAEGER = GoTool(
    name="jaeger",
    module=JAEGER_MODULE,
    package=f"{JAEGER_MODULE}/cmd/all-in-one",
    version=JAEGER_VERSION,
    binary="jaeger-all-in-one",
    version_ldflags=f"-X {JAEGER_MODULE}/internal/version.latestVersion={JAEGER_VERSION}",
    as_main_module=True,
)


def go_tool_binary(tool: GoTool) -> Path | None:
    """The cached binary of ``tool``, or None; never builds."""
    return tool.path if _executable(tool.path) else None


def _main_module_copy(go: str, tool: GoTool, env: Mapping[str, str], work: Path) -> Path:
    """A writable copy of ``tool.module@tool.version`` from the module cache (downloaded and
    checked against the checksum database), to build as the main module with its go.sum."""
    info = _module_info(go, f"{tool.module}@{tool.version}", env, work)
    source = work / "src"
    shutil.copytree(info["Dir"], source)
    for path in [source, *source.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return source


def ensure_go_tool(tool: GoTool) -> Path:
    """The cached binary of ``tool``, built once per version from the Go module proxy
    (``go install <package>@<version>``). Raises :class:`BuildUnavailable`."""
    found = go_tool_binary(tool)
    if found is not None:
        return found
    go = go_executable()
    if go is None:
        raise BuildUnavailable(f"no Go toolchain on PATH to build {tool.name}")
    cache_root().mkdir(parents=True, exist_ok=True)
    # One build of this tool at a time per cache (the background job and a foreground step must
    # not race); its own lock, so that it builds beside the control plane's (``.build.lock``).
    with (cache_root() / f".build-{tool.name}.lock").open("w") as lock:
        if _locked(lock):
            _log(f"another build of {tool.name} holds the lock; waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = go_tool_binary(tool)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=f"agentsafe-{tool.name}-build-") as work:
            env = _go_env(go)
            env["GOBIN"] = str(Path(work) / "bin")
            started = time.monotonic()
            built = Path(work) / "bin" / tool.package.rsplit("/", 1)[-1]
            ldflags = f"-s -w {tool.version_ldflags}".strip()
            argv = [*_nice_prefix(), go]
            if tool.as_main_module:
                cwd = _main_module_copy(go, tool, env, Path(work))
                env["GOFLAGS"] = "-mod=readonly -buildvcs=false"
                package = "./" + tool.package.removeprefix(tool.module + "/")
                argv += ["build", "-trimpath", "-p", "2", "-ldflags", ldflags, "-o", str(built)]
                argv.append(package)
            else:
                cwd = Path(work)
                argv += ["install", "-trimpath", "-p", "2", "-ldflags", ldflags]
                argv.append(f"{tool.package}@{tool.version}")
            _run(argv, cwd=cwd, env=env, what=f"build {tool.name} {tool.version}")
            seconds = time.monotonic() - started
            _install(built, tool.path)
        go_version = subprocess.run(
            [go, "version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        entry = {"version": tool.version, "seconds": round(seconds, 1), "go": go_version}
        _record(tool.directory, tool.binary, entry)
        _log(f"{tool.binary}: built in {seconds:.0f} s")
    return tool.path


def toxiproxy_binary(version: str = TOXIPROXY_VERSION) -> Path | None:
    """The cached ``toxiproxy-server`` for ``version``, or None; never builds."""
    return go_tool_binary(toxiproxy_tool(version))


def ensure_toxiproxy(version: str = TOXIPROXY_VERSION) -> Path:
    """The cached ``toxiproxy-server``, built once per version (:func:`ensure_go_tool`)."""
    return ensure_go_tool(toxiproxy_tool(version))


def jaeger_binary() -> Path | None:
    """The cached Jaeger ``all-in-one``, or None; never builds."""
    return go_tool_binary(JAEGER)


def ensure_jaeger() -> Path:
    """The cached Jaeger ``all-in-one``, built once per version (:func:`ensure_go_tool`)."""
    return ensure_go_tool(JAEGER)


def _tool_step(tool: GoTool, consequence: str, ensure: Callable[[], Path] | None = None) -> int:
    """One Go tool's build step: found in the cache, built, or (no Go) skipped."""
    found = go_tool_binary(tool)
    if found is not None:
        _log(f"{tool.name} {tool.version} cached: {found}")
        print(f"{tool.name}: {found}")
        return 0
    if go_executable() is None and not e2e_required():
        _log(f"no Go toolchain on PATH: {tool.name} not built, {consequence}")
        return 0
    _log(f"cache {cache_root()}: building {tool.name} {tool.version}")
    try:
        built = ensure() if ensure is not None else ensure_go_tool(tool)
    except BuildUnavailable as error:
        _log(f"cannot provide {tool.name}: {error}")
        return 1
    print(f"{tool.name}: {built}")
    return 0


def _toxiproxy_step() -> int:
    return _tool_step(toxiproxy_tool(), "make chaos will skip", lambda: ensure_toxiproxy())


def _jaeger_step() -> int:
    return _tool_step(JAEGER, "the tracing test will skip", lambda: ensure_jaeger())


def _release_tools_step() -> int:
    failed = 0
    for tool in RELEASE_TOOLS:
        failed |= _tool_step(tool, "make release and its test will stop")
    return failed


# --- the late tools' background build -------------------------------------------------------
#
# Jaeger (the tracing test, run last by ``make e2e``), cosign and the registry (``make
# release-test``, after ``make e2e``) are needed only late and take most of a cold build. So
# ``make e2e-build`` starts their builds as ONE background job at nice 19 (CFS weight 15 against
# 1024: the tests barely notice it) and goes on; the stages that need them wait for it
# (:func:`wait_for_background`, printing its progress), verify the cached binaries, and build
# in the foreground only what is still missing. Files under ``<cache>/background/``:
# ``build.log`` (the job's progress), ``state.json`` (``status``: running, ok or failed; the
# tools that failed) and ``job.lock``, held by the job for its whole life (a free lock with
# ``status: running`` is a job that died). Each tool's own ``.build-<name>.lock`` keeps two
# builds of one tool from ever running at once.

#: In the order the stages need them: ``make e2e`` (Jaeger), then ``make release-test``.
BACKGROUND_TOOLS = (JAEGER, *RELEASE_TOOLS)
BACKGROUND_NICE = 19
#: How long a stage waits for the job at most (a cold build under load took about an hour).
BACKGROUND_WAIT_SECONDS = 3 * 3600
_TAIL_LINES = 40


def background_dir() -> Path:
    return cache_root() / "background"


def _read_state() -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads((background_dir() / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return data


def _write_state(state: Mapping[str, object]) -> None:
    target = background_dir() / "state.json"
    staging = target.with_name(f".state.{os.getpid()}.tmp")
    staging.write_text(json.dumps(dict(state), indent=2, sort_keys=True) + "\n")
    staging.replace(target)


def _job_running() -> bool:
    lock = background_dir() / "job.lock"
    if not lock.exists():
        return False
    with lock.open("a") as handle:
        return _locked(handle)


def _tool_verified(tool: GoTool) -> bool:
    """The binary is in place and its manifest records this version (written after the move)."""
    if go_tool_binary(tool) is None:
        return False
    try:
        entry = json.loads((tool.directory / "manifest.json").read_text()).get(tool.binary, {})
    except (OSError, ValueError):
        return False
    return isinstance(entry, dict) and entry.get("version") == tool.version


def start_background(tools: Sequence[GoTool] = BACKGROUND_TOOLS) -> int:
    """Start the one background job building whichever of ``tools`` is missing; return at once.

    Nothing starts when every tool is cached (each is printed as by :func:`_tool_step`), when a
    job is already running, or without Go (then the waiting stages skip or fail as before)."""
    missing = [tool for tool in tools if go_tool_binary(tool) is None]
    for tool in tools:
        if tool not in missing:
            _tool_step(tool, "")
    if not missing:
        return 0
    names = ", ".join(f"{tool.name} {tool.version}" for tool in missing)
    if go_executable() is None:
        if e2e_required():
            _log(f"no Go toolchain on PATH to build {names}")
            return 1
        _log(f"no Go toolchain on PATH: {names} not built, their tests will skip")
        return 0
    directory = background_dir()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "build.log"
    with (directory / "job.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"a background build is already running (log: {log})")
            return 0
        _write_state({"status": "running", "tools": [tool.name for tool in missing]})
        nice = shutil.which("nice")
        argv = [*([nice, "-n", str(BACKGROUND_NICE)] if nice else []), sys.executable]
        argv += [str(Path(__file__).resolve()), "--background-job", str(lock.fileno())]
        argv += [tool.name for tool in missing]
        with log.open("w") as output:
            # Its own session: the job outlives this command (make goes on to the next stage)
            # and keeps the job lock, handed over as an open descriptor, until it exits.
            job = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(lock.fileno(),),
                start_new_session=True,
            )
            # Never waited for here (the job reports through state.json); a returncode keeps
            # Popen from warning that it is still running when this command exits.
            job.returncode = 0
    _log(f"building {names} as one background job at nice {BACKGROUND_NICE} (log: {log})")
    return 0


def _background_job(lock_fd: int, names: Sequence[str]) -> int:
    """The job itself (``--background-job``): build each tool in turn; record the result."""
    del lock_fd  # held open, and so locked, until this process exits
    global _NICE_BUILDS
    _NICE_BUILDS = False  # the builds inherit the job's niceness, which a waiter may raise
    by_name = {tool.name: tool for tool in BACKGROUND_TOOLS}
    started = time.monotonic()
    _write_state({"status": "running", "tools": list(names), "pid": os.getpid()})
    failed: list[str] = []
    for name in names:
        tool = by_name[name]
        _log(f"building {tool.name} {tool.version}")
        try:
            ensure_go_tool(tool)
        except BuildUnavailable as error:
            _log(f"cannot provide {tool.name}: {error}")
            failed.append(name)
    status = "failed" if failed else "ok"
    seconds = round(time.monotonic() - started, 1)
    _write_state({"status": status, "tools": list(names), "failed": failed, "seconds": seconds})
    _log(f"background build {status} in {seconds:.0f} s" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


def _print_from(log: Path, position: int) -> int:
    try:
        with log.open("rb") as handle:
            handle.seek(position)
            chunk = handle.read()
    except OSError:
        return position
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        print(f"  | {line}", file=sys.stderr, flush=True)
    return position + len(complete)


def wait_for_background(tools: Sequence[GoTool]) -> int | None:
    """Wait for a background job that builds any of ``tools``, printing its progress.

    Returns 0 when every tool is in place, 1 when the job failed on one of them (its log's tail
    is printed, and the failure is then marked as reported, so the next run builds in the
    foreground), and None when there is nothing to wait for."""
    state = _read_state()
    wanted = {tool.name for tool in tools}
    if state is None or not wanted & set(_names(state.get("tools"))):
        return None
    if all(_tool_verified(tool) for tool in tools):
        return 0
    log = background_dir() / "build.log"
    if _job_running():
        _log(f"waiting for the background build of {', '.join(sorted(wanted))} (log: {log})")
        _hasten(state)
    position = 0
    deadline = time.monotonic() + BACKGROUND_WAIT_SECONDS
    while _job_running() and not all(_tool_verified(tool) for tool in tools):
        position = _print_from(log, position)
        if time.monotonic() > deadline:
            _log(f"the background build did not finish in {BACKGROUND_WAIT_SECONDS} s")
            return 1
        time.sleep(1)  # polls a build of minutes: a second is fine-grained enough
    _print_from(log, position)
    if all(_tool_verified(tool) for tool in tools):
        return 0
    state = _read_state() or {}
    status = state.get("status")
    failed = sorted(wanted & set(_names(state.get("failed"))))
    if status == "running":
        failed = sorted(wanted)
        reason = "the background build ended without a result (killed?)"
    else:
        reason = f"the background build of {', '.join(failed)} failed"
    if not failed:
        return None
    _log(f"{reason}; the last lines of {log}:\n" + _tail(log))
    state["failed"] = sorted(set(_names(state.get("failed"))) - set(failed))
    state["reported"] = sorted(set(_names(state.get("reported"))) | set(failed))
    if status == "running":
        state["status"] = "failed"
    _write_state(state)
    return 1


def _hasten(state: Mapping[str, object]) -> None:
    """A stage now waits for the job: it is the critical path, so its process group (the job
    and its go, compile and link processes) goes from nice 19 to the foreground builds' 10.
    Needs root (CAP_SYS_NICE), as in CI; elsewhere it stays at 19 and this says so."""
    pid = state.get("pid")
    if not isinstance(pid, int):
        return
    try:
        os.setpriority(os.PRIO_PGRP, pid, FOREGROUND_NICE)
    except PermissionError:
        _log(f"the background build stays at nice {BACKGROUND_NICE} (raising it needs root)")
    except ProcessLookupError:
        return
    else:
        _log(f"the background build now runs at nice {FOREGROUND_NICE}, as a foreground build")


def _names(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-_TAIL_LINES:])


def _waited_step(tools: Sequence[GoTool], step: Callable[[], int]) -> int:
    """A late stage's step: wait for the background job first, then find (or build) as before."""
    waited = wait_for_background(tools)
    return 1 if waited == 1 else step()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    parser.add_argument("--helm-version", default=HELM_VERSION)
    parser.add_argument("--etcd-version", default=ETCD_VERSION)
    parser.add_argument(
        "--no-controller-manager",
        action="store_true",
        default=not BuildRequest.from_environment().controller_manager,
        help="skip kube-controller-manager (owner references are then asserted, not collected;"
        f" the default when {GC_ENV}=0)",
    )
    parser.add_argument("--gomaxprocs", type=int, default=None)
    parser.add_argument(
        "--only-toxiproxy",
        action="store_true",
        help="build (or find) only toxiproxy-server, the chaos harness's proxy",
    )
    parser.add_argument(
        "--only-release-tools",
        action="store_true",
        help=f"build (or find) only cosign {COSIGN_VERSION} and the registry {REGISTRY_VERSION}"
        " (make release and its test)",
    )
    parser.add_argument(
        "--only-jaeger",
        action="store_true",
        help=f"build (or find) only Jaeger all-in-one {JAEGER_VERSION} (the tracing test)",
    )
    parser.add_argument(
        "--background-start",
        action="store_true",
        help="only start the background build of Jaeger, cosign and the registry (at nice"
        f" {BACKGROUND_NICE}) and return; --only-jaeger and --only-release-tools wait for it",
    )
    parser.add_argument(
        "--no-background",
        action="store_true",
        help="build Jaeger, cosign and the registry in the foreground too (no background job)",
    )
    parser.add_argument("--background-job", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.background_job:
        return _background_job(int(args.background_job[0]), args.background_job[1:])
    if args.background_start:
        return start_background()
    if args.only_toxiproxy:
        return _toxiproxy_step()
    if args.only_jaeger:
        return _waited_step([JAEGER], _jaeger_step)
    if args.only_release_tools:
        return _waited_step(RELEASE_TOOLS, _release_tools_step)
    # First, so that the late tools' downloads and builds use every idle moment from here on.
    background = 0 if args.no_background else start_background()
    request = BuildRequest(
        kubernetes_version=args.kubernetes_version,
        helm_version=args.helm_version,
        etcd_version=args.etcd_version,
        controller_manager=not args.no_controller_manager,
        gomaxprocs=args.gomaxprocs,
    )
    started = time.monotonic()
    missing = missing_binaries(request)
    if missing and go_executable() is None and not e2e_required():
        _log(
            "no Go toolchain on PATH: nothing built, the e2e suite will skip"
            f" ({REQUIRE_ENV}=require makes this a failure)"
        )
        return 0
    if missing:
        _log(f"cache {cache_root()}: building {len(missing)} missing: {'; '.join(missing)}")
    try:
        binaries = ensure_binaries(request)
    except BuildUnavailable as error:
        _log(f"cannot provide the Kubernetes binaries: {error}")
        return 1
    if not missing:
        _log(f"all binaries cached under {cache_root()} ({time.monotonic() - started:.1f} s)")
    for field in dataclasses.fields(binaries):
        print(f"{field.name}: {getattr(binaries, field.name)}")
    failed = _toxiproxy_step()
    if args.no_background:
        return failed | _release_tools_step() | _jaeger_step()
    return failed | background


if __name__ == "__main__":
    raise SystemExit(main())
