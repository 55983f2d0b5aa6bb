"""Build and cache the node's binaries (the half of a cluster that runs pods), with no containers.

Role: the node counterpart of :mod:`build` (which builds the control plane). It turns pinned
releases from the Go module proxy into executables under the same cache
(``~/.cache/agentsafe/<component>/<version>/``), so only a cold machine pays for them. Callers:
``python e2e/cluster/node_build.py`` (``make node-build``, ``make cluster-up``; prints progress
while building) and :mod:`node` through :func:`ensure_node_binaries`.

What is built and how:

* ``kubelet``, ``kube-scheduler``, ``kube-proxy``: exactly as :mod:`build` builds
  kube-apiserver (a throwaway wrapper module pinning ``k8s.io/kubernetes`` and its staging
  modules), into the same ``k8s/<version>/`` directory.
* ``coredns``: ``go install github.com/coredns/coredns@<pinned>``.
* ``kube-router``: ``go build`` of ``.../kube-router/v2/cmd/kube-router`` at the pinned release
  in a throwaway wrapper module (as etcd is built in :mod:`build`), with
  :data:`KUBE_ROUTER_REPLACES`; the node runs it only as the NetworkPolicy firewall (it is the
  one enforcer that works without nft queue).
* ``pause``: the sandbox process every pod holds its namespaces with. Ten lines of Go, written
  here and built static, so the pause image needs no registry. Its cache key is a hash of the
  source, so a change to it rebuilds it.

The Debian packages the node also needs (containerd, runc, the CNI plugins, iptables, ipset,
nftables, debootstrap, buildah) come from apt, not from here; :mod:`node` checks for them and
says which to install.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

try:
    from .build import (
        KUBERNETES_VERSION,
        BuildUnavailable,
        _Builder,
        _executable,
        _install,
        _locked,
        _log,
        _module_info,
        _nice_prefix,
        _record,
        _run,
        cache_root,
        e2e_required,
        go_executable,
        wrapper_go_mod,
    )
except ImportError:  # run as a script: python e2e/cluster/node_build.py
    from build import (  # type: ignore[no-redef]
        KUBERNETES_VERSION,
        BuildUnavailable,
        _Builder,
        _executable,
        _install,
        _locked,
        _log,
        _module_info,
        _nice_prefix,
        _record,
        _run,
        cache_root,
        e2e_required,
        go_executable,
        wrapper_go_mod,
    )

COREDNS_VERSION = "v1.15.0"
KUBE_ROUTER_VERSION = "v2.10.0"
"""v2.1.0 until 2026-12-05: security flaws are reported against it, and it carried the ipset
bookkeeping kube-router fixed later (a full sync restored the sets of the sync before it). v2.10.0
is the newest release the Go module proxy serves here with a Go that this machine has (1.26)."""
KUBE_ROUTER_MODULE = "github.com/cloudnativelabs/kube-router/v2"
KUBE_ROUTER_PACKAGE = f"{KUBE_ROUTER_MODULE}/cmd/kube-router"
KUBE_ROUTER_REPLACES = {"github.com/vishvananda/netlink": "v1.3.1"}
"""v2.10.0 pins netlink at an untagged commit the module proxy does not serve (403); it builds
against v1.3.1, the newest netlink release, and the node's firewall is proved by traffic in the
e2e suite (the routing and service-proxy parts, which use netlink most, are never run)."""
NODE_COMMANDS = ("kubelet", "kube-scheduler", "kube-proxy")

PAUSE_SOURCE = """\
// pause: holds a pod's namespaces open until the kubelet stops the sandbox.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
}
"""


@dataclasses.dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_scheduler: Path
    kube_proxy: Path
    coredns: Path
    kube_router: Path
    pause: Path


def pause_key() -> str:
    return hashlib.sha256(PAUSE_SOURCE.encode()).hexdigest()[:16]


def node_paths(kubernetes_version: str = KUBERNETES_VERSION) -> NodeBinaries:
    root = cache_root()
    kube = root / "k8s" / kubernetes_version
    return NodeBinaries(
        kubelet=kube / "kubelet",
        kube_scheduler=kube / "kube-scheduler",
        kube_proxy=kube / "kube-proxy",
        coredns=root / "coredns" / COREDNS_VERSION / "coredns",
        kube_router=root / "kube-router" / KUBE_ROUTER_VERSION / "kube-router",
        pause=root / "pause" / pause_key() / "pause",
    )


def cached_node_binaries(kubernetes_version: str = KUBERNETES_VERSION) -> NodeBinaries | None:
    """The cached node binaries if every one is present; never builds."""
    found = node_paths(kubernetes_version)
    paths = [getattr(found, field.name) for field in dataclasses.fields(found)]
    return found if all(_executable(path) for path in paths) else None


def _go_install(builder: _Builder, package: str, out: Path, what: str) -> float:
    env = builder.env()
    env["GOBIN"] = str(out)
    started = time.monotonic()
    _run(
        [
            *_nice_prefix(),
            builder.go,
            "install",
            "-trimpath",
            "-p",
            "2",
            "-ldflags",
            "-s -w",
            package,
        ],
        cwd=builder.workroot,
        env=env,
        what=what,
    )
    return time.monotonic() - started


def _build_kube_router(builder: _Builder, out: Path) -> float:
    """kube-router at :data:`KUBE_ROUTER_VERSION` from a wrapper module that requires it and
    replaces :data:`KUBE_ROUTER_REPLACES` (``go install pkg@version`` honours no replace)."""
    info = _module_info(
        builder.go, f"{KUBE_ROUTER_MODULE}@{KUBE_ROUTER_VERSION}", builder.env(), builder.workroot
    )
    module = Path(tempfile.mkdtemp(prefix="kube-router-wrapper-", dir=builder.workroot))
    (module / "go.mod").write_text(
        wrapper_go_mod(
            module="agentsafe.local/e2e/kuberouterbuild",
            upstream_go_mod=Path(info["GoMod"]).read_text(),
            requires={KUBE_ROUTER_MODULE: KUBE_ROUTER_VERSION},
            replaces=KUBE_ROUTER_REPLACES,
        )
    )
    started = time.monotonic()
    _run(
        [
            *_nice_prefix(),
            builder.go,
            "build",
            "-trimpath",
            "-p",
            "2",
            "-o",
            str(out / "kube-router"),
            "-ldflags",
            "-s -w",
            KUBE_ROUTER_PACKAGE,
        ],
        cwd=module,
        env=builder.env(),
        what=f"build kube-router {KUBE_ROUTER_VERSION}",
    )
    return time.monotonic() - started


def _build_pause(builder: _Builder, out: Path) -> float:
    module = Path(tempfile.mkdtemp(prefix="pause-", dir=builder.workroot))
    (module / "go.mod").write_text("module agentsafe.local/pause\n\ngo 1.22\n")
    (module / "main.go").write_text(PAUSE_SOURCE)
    started = time.monotonic()
    _run(
        [builder.go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "pause"), "."],
        cwd=module,
        env=builder.env(),
        what="build pause",
    )
    return time.monotonic() - started


def ensure_node_binaries(
    kubernetes_version: str = KUBERNETES_VERSION, *, gomaxprocs: int | None = None
) -> NodeBinaries:
    """Return the cached node binaries, building whatever is missing (progress on stderr)."""
    cached = cached_node_binaries(kubernetes_version)
    if cached is not None:
        return cached
    go = go_executable()
    if go is None:
        raise BuildUnavailable("no Go toolchain on PATH to build kubelet, CoreDNS and kube-router")
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / ".node-build.lock").open("w") as lock:
        if _locked(lock):
            _log("another node build holds the lock; waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
        targets = node_paths(kubernetes_version)
        go_version = subprocess.run(
            [go, "version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        total = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="agentsafe-node-build-") as work:
            builder = _Builder(go=go, gomaxprocs=gomaxprocs, workroot=Path(work))
            out = Path(work) / "bin"
            out.mkdir()

            def done(target: Path, seconds: float, version: str) -> None:
                _install(out / target.name, target)
                entry = {"version": version, "seconds": round(seconds, 1), "go": go_version}
                _record(target.parent, target.name, entry)
                _log(f"{target.name}: built in {seconds:.0f} s")

            if not _executable(targets.pause):
                done(targets.pause, _build_pause(builder, out), pause_key())
            missing = [
                name for name in NODE_COMMANDS if not _executable(targets.kubelet.parent / name)
            ]
            if missing:
                seconds = builder.build_kubernetes(kubernetes_version, missing, out)
                for name in missing:
                    done(targets.kubelet.parent / name, seconds, kubernetes_version)
            if not _executable(targets.coredns):
                package = f"github.com/coredns/coredns@{COREDNS_VERSION}"
                seconds = _go_install(builder, package, out, f"build coredns {COREDNS_VERSION}")
                done(targets.coredns, seconds, COREDNS_VERSION)
            if not _executable(targets.kube_router):
                done(targets.kube_router, _build_kube_router(builder, out), KUBE_ROUTER_VERSION)
        _log(f"node binaries ready in {time.monotonic() - total:.0f} s")
    result = cached_node_binaries(kubernetes_version)
    if result is None:
        raise BuildUnavailable("the node build finished but a binary is missing from the cache")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    parser.add_argument("--gomaxprocs", type=int, default=None)
    args = parser.parse_args(argv)
    cached = cached_node_binaries(args.kubernetes_version)
    if cached is None and go_executable() is None and not e2e_required():
        _log(
            "no Go toolchain on PATH: no node binaries built, the node part of the e2e suite "
            "will skip (AGENTSAFE_E2E=require makes this a failure)"
        )
        return 0
    if cached is not None:
        _log(f"node binaries cached under {cache_root()}")
    try:
        binaries = ensure_node_binaries(args.kubernetes_version, gomaxprocs=args.gomaxprocs)
    except BuildUnavailable as error:
        _log(f"cannot provide the node binaries: {error}")
        return 1
    for field in dataclasses.fields(binaries):
        print(f"{field.name}: {getattr(binaries, field.name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
