"""What of the one-node cluster (``cluster/node.py``) is decided without starting it.

The node itself is exercised by ``test_scenario.py --backend=node``; here, on every machine:
the gotchas each rendered configuration must carry (each one broke a real bring-up), the
provisioner's answer to a claim, and ``cluster.node run``'s rule that a node that cannot start
is a skip, or a failure under ``AGENTSAFE_E2E=require``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cluster import node, provisioner


def test_the_kubelet_accepts_cgroup_v1_and_never_collects_imported_images(tmp_path: Path) -> None:
    config = yaml.safe_load(
        node.kubelet_config(
            tmp_path, ca=tmp_path / "ca.crt", socket_path=tmp_path / "c.sock", port=1, healthz=2
        )
    )
    assert config["failCgroupV1"] is False
    assert config["address"] == node.NODE_IP
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authentication"]["anonymous"]["enabled"] is False


def test_the_kubelet_evicts_below_an_absolute_floor_not_a_share_of_the_disk(
    tmp_path: Path,
) -> None:
    # This machine's disk reports 252 GiB while what is free is what its host leaves: "1%" put
    # a node with 1.7 GiB free under DiskPressure, and it evicted the chart's pods in a loop.
    config = yaml.safe_load(
        node.kubelet_config(
            tmp_path, ca=tmp_path / "ca.crt", socket_path=tmp_path / "c.sock", port=1, healthz=2
        )
    )
    hard = config["evictionHard"]
    assert hard["nodefs.available"] == hard["imagefs.available"] == "256Mi"
    assert not any(value.endswith("%") for value in hard.values())


def test_up_refuses_a_disk_too_full_for_the_node_and_says_so(tmp_path: Path) -> None:
    assert node.disk_shortfall(tmp_path, free_bytes=node.MIN_FREE_BYTES) is None
    message = node.disk_shortfall(tmp_path / ".cluster", free_bytes=300 << 20)
    assert message is not None
    assert message.startswith("only 300 MiB free on the filesystem of ")
    assert "free some space" in message


def test_the_disk_check_of_a_state_dir_under_missing_dirs_measures_its_nearest_ancestor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `cluster-up --state-dir` may name a directory two levels under one that does not exist
    # yet: the check measured its parent, which did not exist either (FileNotFoundError).
    state_dir = tmp_path / "missing" / "also-missing" / ".cluster"
    real = node.disk_shortfall(state_dir)  # this disk, whatever it has free: an answer
    assert real is None or real.startswith("only ")
    measured: list[Path] = []

    def disk_usage(path: Path) -> SimpleNamespace:
        measured.append(Path(path))
        return SimpleNamespace(total=1 << 40, used=0, free=300 << 20)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    message = node.disk_shortfall(state_dir)
    assert measured == [tmp_path]
    assert message is not None
    assert message.startswith(f"only 300 MiB free on the filesystem of {state_dir};")
    assert node.disk_shortfall(state_dir, free_bytes=node.MIN_FREE_BYTES) is None


def test_containerd_restricts_oom_score_adj_and_uses_the_built_pause_image(tmp_path: Path) -> None:
    text = node.containerd_config(tmp_path, socket_path=tmp_path / "c.sock", cni_bin="/opt/cni/bin")
    assert "restrict_oom_score_adj = true" in text
    assert f'sandbox_image = "{node.PAUSE_IMAGE}"' in text
    assert 'bin_dir = "/opt/cni/bin"' in text


def test_kube_proxy_runs_in_nftables_mode_and_leaves_conntrack_alone(tmp_path: Path) -> None:
    config = yaml.safe_load(node.kube_proxy_config(tmp_path / "k", healthz=1, metrics=2))
    assert config["mode"] == "nftables"
    assert config["conntrack"]["maxPerCore"] == 0


def test_kube_router_is_only_the_firewall_and_resyncs_every_ten_seconds(tmp_path: Path) -> None:
    argv = node.kube_router_argv(tmp_path / "kube-router", tmp_path / "k", 1)
    assert "--run-firewall=true" in argv
    assert "--run-router=false" in argv
    assert "--run-service-proxy=false" in argv
    assert "--iptables-sync-period=10s" in argv


def test_kube_router_is_told_the_node_port_range_the_host_listeners_avoid(tmp_path: Path) -> None:
    """kube-router opens this range on node addresses to every pod; the suite's host listeners
    (``free_port(avoid=node.NODE_PORTS)``) stay out of the range it is told."""
    argv = node.kube_router_argv(tmp_path / "kube-router", tmp_path / "k", 1)
    assert "--service-node-port-range=30000-32767" in argv
    assert (node.NODE_PORTS.start, node.NODE_PORTS.stop) == (30000, 32768)


def test_the_pod_network_is_the_bridge_the_node_ip_lives_on(tmp_path: Path) -> None:
    (bridge,) = node.cni_config(tmp_path)["plugins"]
    assert bridge["bridge"] == node.BRIDGE
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.POD_CIDR, "gateway": node.NODE_IP}]]
    assert bridge["ipMasq"] is False


def test_the_provisioner_answers_a_placed_claim_with_a_prebound_local_volume(
    tmp_path: Path,
) -> None:
    claim = {
        "metadata": {
            "name": "data-x-0",
            "namespace": "payments",
            "uid": "u-1",
            "annotations": {provisioner.SELECTED_NODE: node.NODE_NAME},
        },
        "spec": {
            "storageClassName": provisioner.STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
        "status": {"phase": "Pending"},
    }
    assert provisioner.wanted(claim, node.NODE_NAME)
    assert not provisioner.wanted(claim, "another-node")
    volume = provisioner.volume_for(claim, root=tmp_path, node=node.NODE_NAME)
    assert volume["spec"]["claimRef"]["uid"] == "u-1"
    assert volume["spec"]["local"]["path"] == str(tmp_path / "pvc-u-1")
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Delete"


@pytest.mark.parametrize(("require", "code"), [("require", 1), ("", 0)])
def test_a_node_that_cannot_start_fails_only_when_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, require: str, code: int
) -> None:
    def cannot_start(*args: object, **kwargs: object) -> node.Cluster:
        raise node.NodeError("this machine cannot run the node yet: run as root")

    def must_not_stop() -> bool:
        raise AssertionError("nothing was started, so nothing is stopped")

    monkeypatch.setattr(node, "status", lambda: {"running": False})
    monkeypatch.setattr(node, "up", cannot_start)
    monkeypatch.setattr(node, "down", must_not_stop)
    monkeypatch.setenv(node.REQUIRE_ENV, require)
    assert node.run(tmp_path, ["false"]) == code


SAVED_FILTER = "\n".join(
    [
        "*filter",
        ":KUBE-ROUTER-INPUT - [0:0]",
        ":KUBE-POD-FW-MINE - [0:0]",
        ":KUBE-POD-FW-OTHER - [0:0]",
        ":KUBE-NWPLCY-P - [0:0]",
        '-A KUBE-ROUTER-INPUT -p tcp -m comment --comment "allow LOCAL TCP traffic to node ports"'
        " -m addrtype --dst-type LOCAL -m multiport --dports 30000:32767 -j RETURN",
        "-A KUBE-ROUTER-INPUT -s 10.244.0.3/32 -j KUBE-POD-FW-MINE",
        "-A KUBE-ROUTER-INPUT -s 10.244.0.30/32 -j KUBE-POD-FW-OTHER",
        "-A KUBE-POD-FW-MINE -j KUBE-NWPLCY-P",
        "-A KUBE-POD-FW-OTHER -j DROP",
        "-A KUBE-NWPLCY-P -m set --match-set KUBE-DST-X dst -m tcp --dport 5432"
        " -j MARK --set-xmark 0x10000/0x10000",
        "COMMIT",
    ]
)


def test_the_firewall_report_follows_one_pods_chains_and_lists_their_ipsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def sh(*argv: str, check: bool = True, input: str | None = None) -> Any:
        out = (
            SAVED_FILTER
            if argv[0] == "iptables-save"
            else "Name: KUBE-DST-X\nMembers:\n10.244.0.1\n"
        )
        return subprocess.CompletedProcess(list(argv), 0, out, "")

    monkeypatch.setattr(node, "_sh", sh)
    monkeypatch.setattr(node.State, "load", classmethod(lambda cls: None))
    report = node.firewall_report("10.244.0.3")
    assert "--dports 30000:32767 -j RETURN" in report  # the rule that opens node ports to pods
    assert "-A KUBE-POD-FW-MINE -j KUBE-NWPLCY-P" in report
    assert "--dport 5432" in report
    assert "ipset KUBE-DST-X: 10.244.0.1" in report
    assert "OTHER" not in report  # another pod's jump and chain are left out
    assert "kube-router's log not found" in report
