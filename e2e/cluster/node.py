"""A real one-node Kubernetes cluster on this machine, with no Docker: ``make cluster-up``.

Role: the Docker-free twin of ``kind create cluster``. ``up`` starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy (nftables mode),
kube-router (NetworkPolicy firewall only) and a local-volume provisioner (:mod:`provisioner`)
as host processes, then CoreDNS as a pod and a default StorageClass; it imports the images
pods run (``agentsafe:dev`` built from the Dockerfile, the pause and CoreDNS images) and
writes an admin kubeconfig to
``.cluster/kubeconfig``. ``down`` stops all of it and restores the host. Callers: ``make
cluster-up`` / ``make cluster-down`` (``cd e2e && python -m cluster.node up|down|status``) and
the e2e suite's ``--backend=node`` fixture.

The node shares the host's kernel, so it changes host state; all of it is recorded before it
changes and put back by ``down`` (also after a crash: the record lives in ``/run``):

* sysctls the kubelet and kube-proxy set (``vm.overcommit_memory``, ``kernel.panic``, ...,
  ``net.ipv4.ip_forward``);
* iptables chains named ``KUBE-*`` (the kubelet's ``KUBE-FIREWALL``, kube-router's policy
  chains) and kube-router's ipsets: only those that did not exist before are removed (kube-router's
  own cleanup panics once the API server is gone, so it is not used);
* kube-proxy's nftables tables, the ``agentsafe0`` bridge, pod network namespaces, cgroups
  under ``kubepods``, mounts under the state directory;
* the few fixed paths nothing can move (``/run/containerd``, ``/var/log/pods``,
  ``/var/log/containers``, ``/var/lib/cni``), removed only if they did not exist before.

Networking: pods live on the ``agentsafe0`` bridge in 10.244.0.0/24 and the node IP is the
bridge's 10.244.0.1 (the kubelet refuses a loopback node IP). The API server listens there, on
a free port, with 10.96.0.1 (the ``kubernetes`` Service) in its certificate and the lease
endpoint reconciler, so pods reach it through the Service. Nothing listens on a routable
address and no traffic leaves the machine: CoreDNS answers ``cluster.local`` only.

One node per machine: a host lock (``/run/agentsafe-node.lock``) makes a second ``up`` say
which one is running. Every component authenticates with the admin client certificate; this is
a test and development cluster, not a production one.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import images, provisioner
from .build import BuildUnavailable, ensure_binaries
from .control_plane import SERVICE_ACCOUNT_ISSUER, ControlPlaneError
from .node_build import COREDNS_VERSION, NodeBinaries, ensure_node_binaries, pause_key
from .pki import make_pki

REPO = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO / ".cluster"
HOST_LOCK = Path("/run/agentsafe-node.lock")
HOST_RECORD = Path("/run/agentsafe-node.json")
NODE_NAME = "agentsafe-node"
BRIDGE = "agentsafe0"
NODE_IP = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
PAUSE_IMAGE = f"agentsafe.local/pause:{pause_key()}"
COREDNS_IMAGE = f"agentsafe.local/coredns:{COREDNS_VERSION}"
STORAGE_CLASS = provisioner.STORAGE_CLASS
NONROOT = images.NONROOT

SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
FIXED_PATHS = ("/run/containerd", "/var/log/pods", "/var/log/containers", "/var/lib/cni")
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
DEBIAN_TOOLS = {
    "containerd": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "iptables": "iptables",
    "iptables-save": "iptables",
    "ipset": "ipset",
    "nft": "nftables",
    "ip": "iproute2",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
}
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
EVICTION_FLOOR = "256Mi"
"""Free space below which the kubelet evicts pods (node and image filesystems). An absolute
floor, not a share: this machine's disk reports 252 GiB in all while the space actually free is
whatever its host leaves, so "1%" (2.5 GiB) put a node with 1.7 GiB free under DiskPressure and
it evicted every pod the chart started, hundreds a minute, until ``helm --wait`` timed out."""
MIN_FREE_BYTES = 1536 << 20
"""Free space ``up`` asks for on the filesystem of the state directory: what a node running the
scenario takes there (1.2 GiB measured: containerd's content and snapshots 0.7, the exported
image archives 0.3, etcd 0.1) plus the eviction floor."""


class NodeError(RuntimeError):
    """The node could not be brought up or down; the message says what to do next."""


def _log(message: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _sh(
    *argv: str, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise NodeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive; /proc says so.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


# --- prerequisites ---------------------------------------------------------------------------


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run the node, as the apt packages to install."""
    problems = []
    packages = sorted({pkg for tool, pkg in DEBIAN_TOOLS.items() if shutil.which(tool) is None})
    if not any(Path(d, "bridge").exists() and Path(d, "host-local").exists() for d in CNI_BIN_DIRS):
        packages.append("containernetworking-plugins")
    if packages:
        problems.append(f"apt-get install -y {' '.join(packages)}")
    if os.geteuid() != 0:
        problems.append("run as root: the node changes the host's network, cgroups and sysctls")
    return problems


def disk_shortfall(path: Path, *, free_bytes: int | None = None) -> str | None:
    """Why the filesystem holding ``path`` is too full for the node, or None if it is not.
    ``path`` need not exist yet (``up`` creates it): its nearest existing ancestor is measured."""
    probe = next(p for p in (path, *path.parents) if p.exists())
    free = shutil.disk_usage(probe).free if free_bytes is None else free_bytes
    if free >= MIN_FREE_BYTES:
        return None
    return (
        f"only {free / (1 << 20):.0f} MiB free on the filesystem of {path}; the node needs "
        f"{MIN_FREE_BYTES >> 20} MiB (its kubelet evicts every pod below {EVICTION_FLOOR}): "
        "free some space (old clones, ~/.cache/go-build) and run it again"
    )


def install_packages() -> None:
    """Install the missing Debian packages with apt-get (as root, where apt exists): a fresh
    CI machine gets what the node needs from its package registry, nothing else."""
    packages = sorted({pkg for tool, pkg in DEBIAN_TOOLS.items() if shutil.which(tool) is None})
    if not any(Path(d, "bridge").exists() for d in CNI_BIN_DIRS):
        packages.append("containernetworking-plugins")
    if not packages or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    _log(f"installing Debian packages: {' '.join(packages)} (about a minute)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", *packages],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise NodeError(f"{' '.join(argv[:2])} failed:\n{tail}")


def cni_bin_dir() -> str:
    for directory in CNI_BIN_DIRS:
        if Path(directory, "bridge").exists():
            return directory
    raise NodeError("no CNI plugins: apt-get install -y containernetworking-plugins")


# --- the state record ------------------------------------------------------------------------


@dataclasses.dataclass
class State:
    """What ``up`` started and changed; ``down`` reads it back (also from another process)."""

    state_dir: str
    started_at: str = ""
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    sysctls: dict[str, str] = dataclasses.field(default_factory=dict)
    chains: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    ipsets: list[str] = dataclasses.field(default_factory=list)
    nft_tables: list[str] = dataclasses.field(default_factory=list)
    netns: list[str] = dataclasses.field(default_factory=list)
    fixed_paths: list[str] = dataclasses.field(default_factory=list)
    """The fixed paths that did NOT exist before (so ``down`` removes them)."""
    server: str = ""
    containerd_socket: str = ""
    ready: bool = False

    def save(self) -> None:
        data = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        for target in (HOST_RECORD, Path(self.state_dir) / "state.json"):
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(f".{target.name}.partial")
            staging.write_text(data)
            staging.replace(target)

    @classmethod
    def load(cls) -> State | None:
        if not HOST_RECORD.exists():
            return None
        data = json.loads(HOST_RECORD.read_text())
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def running(self) -> list[str]:
        return [name for name, pid in self.pids.items() if _alive(pid)]


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """One ``up``/``down`` at a time per machine; a second one says who holds it."""
    HOST_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with HOST_LOCK.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise NodeError(
                f"a cluster-up or cluster-down is already running on this machine ({holder}); "
                "wait for it, or see `make cluster-status`"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}, started {time.strftime('%H:%M:%S')}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- host snapshots --------------------------------------------------------------------------


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    return values


def restore_sysctls(saved: dict[str, str]) -> None:
    for name, value in saved.items():
        path = _sysctl_path(name)
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
                _log(f"restored {name} = {value}")


def _iptables_tools() -> list[tuple[str, str]]:
    return [("iptables", "iptables-save"), ("ip6tables", "ip6tables-save")]


def read_chains() -> dict[str, list[str]]:
    """``{"iptables/filter": [chain, ...]}`` for every table of both families."""
    chains: dict[str, list[str]] = {}
    for tool, save in _iptables_tools():
        if shutil.which(save) is None:
            continue
        table = ""
        for line in _sh(save, check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
                chains.setdefault(f"{tool}/{table}", [])
            elif line.startswith(":"):
                chains[f"{tool}/{table}"].append(line[1:].split()[0])
    return chains


def remove_new_chains(before: dict[str, list[str]]) -> None:
    """Delete the ``KUBE-*`` chains (and rules jumping to them) that ``before`` did not have."""
    for tool, save in _iptables_tools():
        if shutil.which(save) is None:
            continue
        table = ""
        rules: dict[str, list[str]] = {}
        new: dict[str, list[str]] = {}
        for line in _sh(save, check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
                rules[table] = []
                new[table] = []
            elif line.startswith(":"):
                chain = line[1:].split()[0]
                if chain.startswith("KUBE-") and chain not in before.get(f"{tool}/{table}", []):
                    new[table].append(chain)
            elif line.startswith("-A "):
                rules[table].append(line)
        for table, chains in new.items():
            if not chains:
                continue
            doomed = set(chains)
            for rule in rules[table]:
                words = rule.split()
                owner = words[1]
                target = words[words.index("-j") + 1] if "-j" in words else ""
                target = target or (words[words.index("-g") + 1] if "-g" in words else "")
                if owner not in doomed and target in doomed:
                    # iptables-save quotes comments; hand the rule back through the shell lexer.
                    _sh("sh", "-c", f"{tool} -t {table} -D {rule[3:]}", check=False)
            for chain in chains:
                _sh(tool, "-t", table, "-F", chain, check=False)
            for chain in chains:
                _sh(tool, "-t", table, "-X", chain, check=False)
            _log(f"removed {tool} {table} chains: {', '.join(sorted(chains))}")


def read_ipsets() -> list[str]:
    return sorted(_sh("ipset", "list", "-n", check=False).stdout.split())


def remove_new_ipsets(before: Sequence[str]) -> None:
    new = [name for name in read_ipsets() if name not in before]
    for name in new:
        _sh("ipset", "destroy", name, check=False)
    if new:
        _log(f"removed {len(new)} ipsets")


def read_nft_tables() -> list[str]:
    return _sh("nft", "list", "tables", check=False).stdout.splitlines()


def remove_new_empty_tables(before: Sequence[str]) -> None:
    """The iptables-nft tables (``ip filter``, ...) the components' iptables calls created:
    removed when they did not exist before and hold no rule (nobody else uses them)."""
    for line in read_nft_tables():
        if line in before or not line.startswith("table "):
            continue
        _, family, name = line.split()
        listing = _sh("nft", "-j", "list", "table", family, name, check=False)
        if listing.returncode != 0:
            continue
        entries = json.loads(listing.stdout).get("nftables", [])
        if any("rule" in entry or "set" in entry or "map" in entry for entry in entries):
            continue
        _sh("nft", "delete", "table", family, name, check=False)
        _log(f"removed the empty nftables {line}, which did not exist before")


def read_netns() -> list[str]:
    directory = Path("/run/netns")
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


# --- rendering configuration -----------------------------------------------------------------


def _kubeconfig(path: Path, *, server: str, ca: Path, cert: Path, key: Path, inline: bool) -> None:
    if inline:
        cluster = {"certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}
        user = {
            "client-certificate-data": base64.b64encode(cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
        }
    else:
        cluster = {"certificate-authority": str(ca)}
        user = {"client-certificate": str(cert), "client-key": str(key)}
    cluster["server"] = server
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "agentsafe", "cluster": cluster}],
        "users": [{"name": "agentsafe-admin", "user": user}],
        "contexts": [
            {"name": "agentsafe", "context": {"cluster": "agentsafe", "user": "agentsafe-admin"}}
        ],
        "current-context": "agentsafe",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def containerd_config(state: Path, *, socket_path: Path, cni_bin: str | None = None) -> str:
    """containerd's CRI configuration; ``cni_bin`` defaults to where the CNI plugins are."""
    cni_bin = cni_bin if cni_bin is not None else cni_bin_dir()
    return f"""version = 2
root = "{state / "containerd" / "root"}"
state = "/run/containerd"
oom_score = 0

[grpc]
  address = "{socket_path}"

[ttrpc]
  address = "{socket_path}.ttrpc"

[debug]
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM drops CAP_SYS_RESOURCE: without it every pod fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{state / "cni" / "net.d"}"
"""


def cni_config(state: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "agentsafe",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(state / "cni" / "ipam"),
                },
            }
        ],
    }


def kubelet_config(state: Path, *, ca: Path, socket_path: Path, port: int, healthz: int) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine is cgroup v1 (hybrid); kubelet 1.36 refuses it unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{socket_path}",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [DNS_SERVICE_IP],
        "resolvConf": str(state / "resolv.conf"),
        "failSwapOn": False,
        "podLogsDirectory": "/var/log/pods",
        # Images are imported, never pulled: garbage-collecting one would strand its pods.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": EVICTION_FLOOR,
            "imagefs.available": EVICTION_FLOOR,
        },
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "maxPods": 60,
        "registerWithTaints": [],
    }
    return yaml.safe_dump(config, sort_keys=False)


KUBE_ROUTER_SYNC = "10s"
"""How often kube-router rebuilds its firewall from what it has seen, besides doing so on each
event (its default is every 5 minutes): a change an event-driven sync missed is put right within
this period. It was added for a NetworkPolicy change that traffic did not show within 30 s
(2026-12-04); that turned out to be the NodePort range (:data:`NODE_PORTS`), not a missed sync,
and the period stays as a bound."""


NODE_PORTS = range(30000, 32768)
"""The Services' NodePort range (the API server's default), told to kube-router as
``--service-node-port-range``. kube-router lets every pod reach this node's own addresses on
these ports whatever the NetworkPolicies say (its rule "allow LOCAL TCP traffic to node ports"), so
a host listener that a test proves a policy against must be outside them: the halt test's
PostgreSQL once drew a port in them about one run in five, and the executor then reached it
without the policy's store rule."""


def kube_router_argv(binary: Path, kubeconfig: Path, health_port: int) -> list[str]:
    """kube-router as the NetworkPolicy firewall only (kube-proxy routes Services, the bridge
    plugin is the CNI)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        f"--iptables-sync-period={KUBE_ROUTER_SYNC}",
        f"--service-node-port-range={NODE_PORTS.start}-{NODE_PORTS.stop - 1}",
        "--metrics-port=0",
        f"--health-port={health_port}",
        "--v=1",
    ]


def kube_proxy_config(kubeconfig: Path, *, healthz: int, metrics: int) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # Leave the host's conntrack sysctls alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


COREFILE = """\
.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loop
    loadbalance
}
"""


def addon_objects(state: Path) -> list[dict[str, Any]]:
    """CoreDNS (a pod, so NetworkPolicies can name it) and the default StorageClass."""
    labels = {"k8s-app": "kube-dns"}
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": NONROOT,
                            "runAsGroup": NONROOT,
                            "seccompProfile": {"type": "RuntimeDefault"},
                            # port 53 as a non-root user, inside the pod's own netns only
                            "sysctls": [
                                {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
                            ],
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": COREDNS_IMAGE,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": provisioner.PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
    ]
    return objects


# --- processes -------------------------------------------------------------------------------


def _spawn(state: State, name: str, argv: Sequence[str], *, cwd: Path | None = None) -> int:
    logs = Path(state.state_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as sink:
        popen = subprocess.Popen(
            list(argv),
            cwd=str(cwd or state.state_dir),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    state.pids[name] = popen.pid
    state.save()
    return popen.pid


def log_tail(state_dir: Path, name: str, lines: int = 25) -> str:
    try:
        text = (state_dir / "logs" / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def firewall_report(pod_ip: str, *, log_lines: int = 15) -> str:
    """What this node's firewall holds for the pod at ``pod_ip``, for a test that waited in vain
    for a NetworkPolicy change to show in traffic: the ``KUBE-*`` filter chains that pod's
    packets run through (from kube-router's top-level chains down), the ipsets they match on
    with their members, and kube-router's last syncs, errors and log lines. Read-only and best
    effort: a part that cannot be read says so instead of raising."""
    parts: list[str] = []
    saved = _sh("iptables-save", "-t", "filter", check=False)
    rules: dict[str, list[str]] = {}
    for line in saved.stdout.splitlines():
        if line.startswith("-A "):
            rules.setdefault(line.split()[1], []).append(line)

    def target(rule: str) -> str:
        words = rule.split()
        return words[words.index("-j") + 1] if "-j" in words else ""

    def another_pods(rule: str) -> bool:
        return target(rule).startswith("KUBE-POD-FW-") and not (
            f"{pod_ip}/" in rule or f"{pod_ip} " in rule
        )

    shown: list[str] = []
    visited: list[str] = []
    pending = ["KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT"]
    while pending:
        chain = pending.pop(0)
        if chain in visited or chain not in rules:
            continue
        visited.append(chain)
        for rule in rules[chain]:
            if another_pods(rule):
                continue
            shown.append(rule)
            if target(rule).startswith("KUBE-"):
                pending.append(target(rule))
    if saved.returncode != 0:
        parts.append(f"iptables-save failed: {saved.stderr.strip()}")
    parts.extend(shown)
    sets = sorted({r.split("--match-set ", 1)[1].split()[0] for r in shown if "--match-set " in r})
    for name in sets:
        listed = _sh("ipset", "list", name, check=False)
        members = listed.stdout.split("Members:", 1)[-1].split() if listed.returncode == 0 else []
        parts.append(
            f"ipset {name}: {' '.join(members) or '(empty)'}"
            if listed.returncode == 0
            else f"ipset {name}: {listed.stderr.strip()}"
        )
    state = State.load()
    if state is None:
        parts.append("(no node state: kube-router's log not found)")
    else:
        log = log_tail(Path(state.state_dir), "kube-router", 100_000).splitlines()
        syncs = [line for line in log if "sync iptables took" in line]
        errors = [line for line in log if line[:1] in ("E", "W") and line[1:5].isdigit()]
        parts.append(f"--- kube-router: {len(syncs)} syncs; the last 3 ---")
        parts.extend(syncs[-3:])
        parts.append(f"--- kube-router: {len(errors)} errors and warnings; the last 5 ---")
        parts.extend(errors[-5:])
        parts.append(f"--- kube-router: the last {log_lines} lines ---")
        parts.extend(log[-log_lines:])
    return "\n".join(parts)


def _wait(what: str, probe: Any, *, deadline: float, state: State, names: Sequence[str]) -> Any:
    """Poll ``probe`` until truthy; fail early (with its log) when a process it needs died."""
    started = time.monotonic()
    last_report = started
    while True:
        for name in names:
            pid = state.pids.get(name)
            if pid is not None and not _alive(pid):
                tail = log_tail(Path(state.state_dir), name)
                raise NodeError(f"{name} exited while waiting for {what}:\n{tail}")
        try:
            value = probe()
        except (OSError, subprocess.SubprocessError, ValueError):
            value = None
        if value:
            _log(f"{what}: ready in {time.monotonic() - started:.1f} s")
            return value
        now = time.monotonic()
        if now - started > deadline:
            tails = "\n".join(f"--- {n}\n{log_tail(Path(state.state_dir), n)}" for n in names)
            raise NodeError(f"{what}: not ready after {deadline:.0f} s\n{tails}")
        if now - last_report > 15:
            _log(f"{what}: still waiting ({now - started:.0f} s)")
            last_report = now
        time.sleep(0.3)  # polling interval while a component starts


def _https_ok(url: str, *, ca: Path, cert: Path, key: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    with urllib.request.urlopen(url, context=context, timeout=5) as reply:
        return bool(reply.status == 200)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return bool(reply.status == 200)


# --- up --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A running node: where its kubeconfig is and how to reach it."""

    state_dir: Path
    kubeconfig: Path
    server: str
    kubectl: Path
    helm: Path

    def kubectl_run(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            check=False,
            timeout=180,
        )
        if check and result.returncode != 0:
            raise NodeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout


def _existing(state_dir: Path) -> Cluster | None:
    state = State.load()
    if state is None:
        return None
    running = state.running()
    if not running:
        return None
    if Path(state.state_dir).resolve() != state_dir.resolve() or not state.ready:
        raise NodeError(
            f"a node is already running on this machine from {state.state_dir} "
            f"({', '.join(sorted(running))}); one node per machine: `make cluster-down` first"
        )
    binaries = ensure_binaries()
    return Cluster(
        state_dir=state_dir,
        kubeconfig=state_dir / "kubeconfig",
        server=state.server,
        kubectl=binaries.kubectl,
        helm=binaries.helm,
    )


def up(state_dir: Path = DEFAULT_STATE_DIR, *, build_image: bool = True) -> Cluster:
    """Bring the node up (idempotent: a running one is reused). Raises :class:`NodeError`."""
    install_packages()
    problems = missing_prerequisites()
    if problems:
        raise NodeError("this machine cannot run the node yet: " + "; ".join(problems))
    with host_lock():
        existing = _existing(state_dir)
        if existing is not None:
            _log(f"the node is already up; kubeconfig: {existing.kubeconfig}")
            return existing
        shortfall = disk_shortfall(state_dir)
        if shortfall is not None:
            raise NodeError(shortfall)
        leftover = State.load()
        if leftover is not None:
            _log(f"cleaning up what an earlier node left behind ({leftover.state_dir})")
            _down(leftover)
        started = time.monotonic()
        try:
            cluster = _up(state_dir, build_image=build_image)
        except BaseException:
            _log("bring-up failed; restoring the host")
            failed = State.load()
            if failed is not None:
                with contextlib.suppress(Exception):
                    _collect_logs_hint(failed)
                _down(failed)
            raise
        _log(f"the node is up in {time.monotonic() - started:.0f} s")
        _log(f"export KUBECONFIG={cluster.kubeconfig}")
        return cluster


def _collect_logs_hint(state: State) -> None:
    _log(f"component logs are in {Path(state.state_dir) / 'logs'} until the next cluster-up")


def _up(state_dir: Path, *, build_image: bool) -> Cluster:
    _log("control-plane binaries (cached in ~/.cache/agentsafe; built once)")
    binaries = ensure_binaries()
    if binaries.kube_controller_manager is None:
        raise NodeError("kube-controller-manager is not built: python e2e/cluster/build.py")
    _log("node binaries (kubelet, kube-scheduler, kube-proxy, CoreDNS, kube-router, pause)")
    node = ensure_node_binaries()
    _log("images (buildah; the base from debootstrap, built once)")
    archives = _build_images(node, state_dir, build_image=build_image)

    for sub in ("logs", "containerd", "kubelet", "cni"):
        shutil.rmtree(state_dir / sub, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    state = State(
        state_dir=str(state_dir.resolve()),
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        sysctls=read_sysctls(),
        chains=read_chains(),
        ipsets=read_ipsets(),
        nft_tables=read_nft_tables(),
        netns=read_netns(),
        fixed_paths=[path for path in FIXED_PATHS if not Path(path).exists()],
    )
    state.save()
    _log(f"host state recorded in {HOST_RECORD} (cluster-down restores it)")

    # The node IP lives on the pod bridge: the kubelet refuses loopback.
    if _sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _sh("ip", "link", "add", BRIDGE, "type", "bridge")
    _sh("ip", "addr", "replace", f"{NODE_IP}/24", "dev", BRIDGE)
    _sh("ip", "link", "set", BRIDGE, "up")
    # Pods reach Services through the host's nftables and each other across the bridge.
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    with contextlib.suppress(OSError):
        Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1\n")

    pki_dir = state_dir / "pki"
    shutil.rmtree(pki_dir, ignore_errors=True)
    pki = make_pki(
        pki_dir,
        admin_user="agentsafe-node-admin",
        extra_ips=[NODE_IP, API_SERVICE_IP],
        extra_dns_names=[
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc.cluster.local",
        ],
    )
    api_port = free_port(NODE_IP)
    server = f"https://{NODE_IP}:{api_port}"
    state.server = server
    components = state_dir / "components.kubeconfig"
    _kubeconfig(
        components,
        server=server,
        ca=pki.ca_cert,
        cert=pki.admin_cert,
        key=pki.admin_key,
        inline=False,
    )

    etcd_port = free_port()
    peer = free_port()
    _log("starting etcd")
    shutil.rmtree(state_dir / "etcd", ignore_errors=True)
    _spawn(
        state,
        "etcd",
        [
            str(binaries.etcd),
            "--name=agentsafe-node",
            f"--data-dir={state_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=agentsafe-node=http://127.0.0.1:{peer}",
            "--listen-metrics-urls=",
            "--log-level=warn",
            "--unsafe-no-fsync",
        ],
    )
    _wait(
        "etcd",
        lambda: _http_ok(f"http://127.0.0.1:{etcd_port}/health"),
        deadline=60,
        state=state,
        names=["etcd"],
    )
    _log("starting kube-apiserver")
    _spawn(
        state,
        "kube-apiserver",
        [
            str(binaries.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--bind-address={NODE_IP}",
            f"--advertise-address={NODE_IP}",
            f"--secure-port={api_port}",
            f"--cert-dir={state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
            # The node's name resolves nowhere: reach the kubelet at its IP.
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            "--anonymous-auth=false",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=lease",
            "--allow-privileged=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    _wait(
        "kube-apiserver",
        lambda: _https_ok(
            f"{server}/readyz", ca=pki.ca_cert, cert=pki.admin_cert, key=pki.admin_key
        ),
        deadline=120,
        state=state,
        names=["etcd", "kube-apiserver"],
    )
    kubeconfig = state_dir / "kubeconfig"
    _kubeconfig(
        kubeconfig,
        server=server,
        ca=pki.ca_cert,
        cert=pki.admin_cert,
        key=pki.admin_key,
        inline=True,
    )
    cluster = Cluster(
        state_dir=state_dir,
        kubeconfig=kubeconfig,
        server=server,
        kubectl=binaries.kubectl,
        helm=binaries.helm,
    )

    _log("starting kube-controller-manager and kube-scheduler")
    _spawn(
        state,
        "kube-controller-manager",
        [
            str(binaries.kube_controller_manager),
            f"--kubeconfig={components}",
            f"--authentication-kubeconfig={components}",
            f"--authorization-kubeconfig={components}",
            "--controllers=garbagecollector,namespace,serviceaccount,statefulset,endpointslice,"
            "endpoint,replicaset,deployment,podgc,root-ca-cert-publisher,persistentvolume-binder,"
            "nodeipam,disruption,job,ttl-after-finished,pvc-protection,pv-protection",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_private_key}",
            "--allocate-node-cidrs=true",
            f"--cluster-cidr={POD_CIDR}",
            "--node-cidr-mask-size=24",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--v=1",
        ],
    )
    _spawn(
        state,
        "kube-scheduler",
        [
            str(node.kube_scheduler),
            f"--kubeconfig={components}",
            f"--authentication-kubeconfig={components}",
            f"--authorization-kubeconfig={components}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--v=1",
        ],
    )

    _log("starting containerd")
    socket_path = state_dir / "containerd" / "containerd.sock"
    (state_dir / "containerd").mkdir(parents=True, exist_ok=True)
    (state_dir / "containerd" / "config.toml").write_text(
        containerd_config(state_dir, socket_path=socket_path)
    )
    (state_dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    (state_dir / "cni" / "net.d" / "10-agentsafe.conflist").write_text(
        json.dumps(cni_config(state_dir), indent=2)
    )
    state.containerd_socket = str(socket_path)
    _spawn(
        state,
        "containerd",
        ["containerd", "--config", str(state_dir / "containerd" / "config.toml")],
    )
    _wait(
        "containerd",
        lambda: _ctr(state, "version", check=False).returncode == 0,
        deadline=60,
        state=state,
        names=["containerd"],
    )
    for name, archive in archives.items():
        _ctr(state, "images", "import", str(archive), what=f"import {name}")
    _log(f"images in containerd: {', '.join(archives)}")

    _log("starting kubelet")
    (state_dir / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    kubelet_dir = state_dir / "kubelet"
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    (kubelet_dir / "config.yaml").write_text(
        kubelet_config(
            state_dir,
            ca=pki.ca_cert,
            socket_path=socket_path,
            port=free_port(NODE_IP),
            healthz=free_port(),
        )
    )
    _spawn(
        state,
        "kubelet",
        [
            str(node.kubelet),
            f"--config={kubelet_dir / 'config.yaml'}",
            f"--kubeconfig={components}",
            f"--root-dir={kubelet_dir / 'root'}",
            f"--cert-dir={kubelet_dir / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ],
    )
    _wait(
        f"node {NODE_NAME} registered",
        lambda: cluster.kubectl_run("get", "node", NODE_NAME, "-o", "name", check=False),
        deadline=120,
        state=state,
        names=["kubelet", "containerd", "kube-apiserver"],
    )
    _log("starting kube-proxy (nftables) and kube-router (NetworkPolicy firewall)")
    (state_dir / "kube-proxy.yaml").write_text(
        kube_proxy_config(components, healthz=free_port(), metrics=free_port())
    )
    _spawn(state, "kube-proxy", [str(node.kube_proxy), f"--config={state_dir / 'kube-proxy.yaml'}"])
    _spawn(state, "kube-router", kube_router_argv(node.kube_router, components, free_port()))
    _wait(
        f"node {NODE_NAME} Ready",
        lambda: (
            "True"
            in cluster.kubectl_run(
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
        ),
        deadline=120,
        state=state,
        names=["kubelet", "containerd", "kube-proxy", "kube-router"],
    )
    # No nodelifecycle controller runs, so nothing would lift these taints.
    for taint in ("node.kubernetes.io/not-ready", "node.cloudprovider.kubernetes.io/uninitialized"):
        cluster.kubectl_run("taint", "node", NODE_NAME, f"{taint}-", check=False)

    _log("CoreDNS, the default StorageClass and its local-volume provisioner")
    shutil.rmtree(state_dir / "volumes", ignore_errors=True)
    _spawn(
        state,
        "provisioner",
        [
            sys.executable,
            "-m",
            "cluster.provisioner",
            f"--kubeconfig={components}",
            f"--kubectl={binaries.kubectl}",
            f"--root={state_dir / 'volumes'}",
            f"--node={NODE_NAME}",
        ],
        cwd=Path(__file__).resolve().parents[1],
    )
    manifest = "\n---\n".join(json.dumps(obj) for obj in addon_objects(state_dir))
    cluster.kubectl_run("apply", "-f", "-", input=manifest)
    _wait(
        "CoreDNS",
        lambda: (
            cluster.kubectl_run(
                "get",
                "deployment",
                "coredns",
                "-n",
                "kube-system",
                "-o",
                "jsonpath={.status.readyReplicas}",
                check=False,
            ).strip()
            == "1"
        ),
        deadline=180,
        state=state,
        names=[
            "kubelet",
            "containerd",
            "kube-proxy",
            "kube-router",
            "kube-scheduler",
            "provisioner",
        ],
    )
    state.ready = True
    state.save()
    return cluster


def _ctr(
    state: State, *args: str, check: bool = True, what: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = ["ctr", "--address", state.containerd_socket, "--namespace", "k8s.io", *args]
    if what:
        _log(f"{what} ...")
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if check and result.returncode != 0:
        raise NodeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def _build_images(node: NodeBinaries, state_dir: Path, *, build_image: bool) -> dict[str, Path]:
    try:
        if build_image or not images.image_exists(images.AGENTSAFE_IMAGE):
            images.build_agentsafe()
        images.build_single_binary(PAUSE_IMAGE, node.pause)
        images.build_single_binary(COREDNS_IMAGE, node.coredns)
        out = state_dir / "images"
        out.mkdir(parents=True, exist_ok=True)
        return {
            name: images.export_archive(name, out / f"{index}.tar")
            for index, name in enumerate((images.AGENTSAFE_IMAGE, PAUSE_IMAGE, COREDNS_IMAGE))
        }
    except images.ImageError as error:
        raise NodeError(str(error)) from None


# --- down ------------------------------------------------------------------------------------


def down() -> bool:
    """Stop the node and restore the host (idempotent). Returns whether there was one."""
    with host_lock():
        state = State.load()
        if state is None:
            _log("no node is recorded on this machine; nothing to do")
            return False
        _down(state)
        return True


def _stop(state: State, name: str, *, grace: float = 10.0) -> None:
    pid = state.pids.get(name)
    if pid is None or not _alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)  # polling interval while a process exits
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _shim_pids(state: State) -> list[int]:
    """containerd's runc shims for our containerd (matched by its socket, never by name)."""
    if not state.containerd_socket:
        return []
    found = []
    needle = state.containerd_socket.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and b"containerd-shim" in cmdline:
            found.append(int(entry.name))
    return found


def _mounts_under(prefixes: Sequence[str]) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            mounts.append(point)
    return sorted(mounts, key=len, reverse=True)


def _remove_cgroups() -> None:
    root = Path("/sys/fs/cgroup")
    for controller in [root, *[p for p in root.iterdir() if p.is_dir()]] if root.is_dir() else []:
        top = controller / "kubepods"
        if not top.is_dir():
            continue
        for directory in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _down(state: State) -> None:
    started = time.monotonic()
    state_dir = Path(state.state_dir)
    _log("stopping the control loops first, so nothing is recreated while pods stop")
    for name in (
        "provisioner",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-router",
        "kube-proxy",
    ):
        _stop(state, name)
    _log("stopping kubelet")
    _stop(state, "kubelet")
    if state.pids.get("containerd") and _alive(state.pids["containerd"]):
        tasks = _ctr(state, "tasks", "ls", "-q", check=False).stdout.split()
        if tasks:
            _log(f"killing {len(tasks)} containers")
        for task in tasks:
            _ctr(state, "tasks", "kill", "-s", "SIGKILL", task, check=False)
        # containerd's CRI plugin deletes a task once it exits; wait for the list to empty.
        deadline = time.monotonic() + 20
        while tasks and time.monotonic() < deadline:
            time.sleep(0.2)  # polling interval while killed tasks exit
            tasks = _ctr(state, "tasks", "ls", "-q", check=False).stdout.split()
            for task in tasks:
                _ctr(state, "tasks", "delete", task, check=False)
    _log("stopping containerd, kube-apiserver and etcd")
    for name in ("containerd", "kube-apiserver", "etcd"):
        _stop(state, name)
    for pid in _shim_pids(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _log("restoring the host: network namespaces, bridge, firewall, sysctls, mounts, cgroups")
    for name in read_netns():
        if name not in state.netns and name.startswith("cni-"):
            _sh("ip", "netns", "delete", name, check=False)
    if _sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        _sh("ip", "link", "delete", BRIDGE, check=False)
    for family, table in NFT_TABLES:
        line = f"table {family} {table}"
        if line in read_nft_tables() and line not in state.nft_tables:
            _sh("nft", "delete", "table", family, table, check=False)
            _log(f"removed nftables {line}")
    remove_new_chains(state.chains)
    remove_new_ipsets(state.ipsets)
    remove_new_empty_tables(state.nft_tables)
    restore_sysctls(state.sysctls)
    for point in _mounts_under([str(state_dir), "/run/containerd", "/run/netns/cni-"]):
        _sh("umount", "-l", point, check=False)
    _remove_cgroups()
    for path in state.fixed_paths:
        if Path(path).exists():
            shutil.rmtree(path, ignore_errors=True)
            _log(f"removed {path}")
    for sub in ("containerd", "kubelet", "cni", "etcd", "volumes", "images", "apiserver-certs"):
        shutil.rmtree(state_dir / sub, ignore_errors=True)
    (state_dir / "kubeconfig").unlink(missing_ok=True)
    HOST_RECORD.unlink(missing_ok=True)
    (state_dir / "state.json").unlink(missing_ok=True)
    _log(f"the node is down and the host restored in {time.monotonic() - started:.0f} s")


# --- run: up, a command, down ---------------------------------------------------------------

REQUIRE_ENV = "AGENTSAFE_E2E"


def run(state_dir: Path, argv: Sequence[str]) -> int:
    """``make e2e``'s node step. A node that cannot start is a failure under
    ``AGENTSAFE_E2E=require`` (CI) and a one-line skip otherwise."""
    was_running = bool(status().get("running"))
    try:
        cluster = up(state_dir, build_image=True)
    except (NodeError, BuildUnavailable, ControlPlaneError) as error:
        first = str(error).splitlines()[0]
        if os.environ.get(REQUIRE_ENV, "").lower() == "require":
            _log(f"error: {REQUIRE_ENV}=require and the node cannot start: {first}")
            return 1
        _log(f"skipped: the node cannot start here: {first} (set {REQUIRE_ENV}=require to fail)")
        return 0
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    try:
        _log(f"running: {' '.join(argv)}")
        return subprocess.run(list(argv), env=env, check=False).returncode
    finally:
        if not was_running:
            down()
        else:
            _log("the node was up before; leaving it up (make cluster-down stops it)")


# --- status and CLI --------------------------------------------------------------------------


def status() -> dict[str, Any]:
    state = State.load()
    if state is None:
        return {"running": False}
    return {
        "running": bool(state.running()),
        "ready": state.ready,
        "state_dir": state.state_dir,
        "kubeconfig": str(Path(state.state_dir) / "kubeconfig"),
        "server": state.server,
        "started_at": state.started_at,
        "processes": {name: _alive(pid) for name, pid in state.pids.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cluster",
        description="A real one-node Kubernetes cluster on this machine, without Docker "
        "(the twin of `kind create cluster`). Needs root and the Debian packages containerd, "
        "runc, containernetworking-plugins, iptables, ipset, nftables, debootstrap, buildah.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="bring the node up (reuses a running one)")
    up_parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    up_parser.add_argument(
        "--no-image-rebuild",
        action="store_true",
        help="reuse agentsafe:dev if buildah has it (default: rebuild; buildah caches layers)",
    )
    sub.add_parser("down", help="stop the node and restore the host (idempotent)")
    sub.add_parser(
        "packages",
        help="install the Debian packages the node needs that are missing (as root, with "
        "apt-get; `make e2e-build` runs this before any test starts)",
    )
    run_parser = sub.add_parser(
        "run",
        help="bring the node up, run a command against it (KUBECONFIG set), bring it down "
        "again even when the command fails; a node that was already up is left up",
    )
    run_parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    run_parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    status_parser = sub.add_parser("status", help="is a node running, and where")
    status_parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = up(args.state_dir, build_image=not args.no_image_rebuild)
            print(f"kubeconfig: {cluster.kubeconfig}")
            print(f"kubectl:    {cluster.kubectl}")
            print(f"helm:       {cluster.helm}")
            return 0
        if args.command == "down":
            down()
            return 0
        if args.command == "packages":
            install_packages()
            for problem in missing_prerequisites():
                _log(f"still missing: {problem}")
            return 0
        if args.command == "run":
            return run(args.state_dir, [a for a in args.argv if a != "--"] or ["true"])
        info = status()
        if args.output == "json":
            print(json.dumps(info, indent=2, sort_keys=True))
        elif not info["running"]:
            print("no node is running on this machine")
        else:
            print(f"node running from {info['state_dir']} since {info['started_at']}")
            print(f"kubeconfig: {info['kubeconfig']}")
            for name, alive in sorted(info["processes"].items()):
                print(f"  {name:<24} {'running' if alive else 'STOPPED'}")
        return 0
    except (NodeError, BuildUnavailable, ControlPlaneError) as error:
        _log(f"error: {error}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
