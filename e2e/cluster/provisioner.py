"""The one-node cluster's storage: a small dynamic provisioner of local volumes.

Role: give the StatefulSet's claims real volumes, again and again (the scenario deletes its
namespaces and starts over, so static PersistentVolumes would all end up ``Released``). It is
the host process ``provisioner`` that :mod:`node` starts, with the cluster's kubeconfig:

* a claim of the ``standard`` StorageClass (provisioner ``agentsafe.local/node-path``,
  ``WaitForFirstConsumer``) that the scheduler has placed on the node (the
  ``volume.kubernetes.io/selected-node`` annotation) gets a directory under the node's state
  directory and a ``local`` PersistentVolume pre-bound to it (``claimRef``), which the
  controller manager's binder binds;
* a volume of ours that is ``Released`` (its claim was deleted; reclaim policy ``Delete``) has
  its directory removed and is deleted.

Hand-written because the usual answer (rancher's local-path-provisioner) needs a helper image
and a registry; what it does here is two list calls and a few creates a second, through
kubectl. The directory is owned by the images' non-root user (65532), as the pods run.
Run: ``python -m cluster.provisioner --kubeconfig K --kubectl PATH --root DIR --node NAME``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROVISIONER = "agentsafe.local/node-path"
STORAGE_CLASS = "standard"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
NONROOT = 65532


def _log(message: str) -> None:
    print(f"[provisioner {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Kubectl:
    def __init__(self, binary: str, kubeconfig: str) -> None:
        self.argv = [binary, "--kubeconfig", kubeconfig]

    def json(self, *args: str) -> Any:
        result = subprocess.run(
            [*self.argv, *args, "-o", "json"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(result.stderr.strip())
        return json.loads(result.stdout)

    def run(self, *args: str, input: str | None = None) -> bool:
        result = subprocess.run(
            [*self.argv, *args], capture_output=True, text=True, input=input, check=False
        )
        if result.returncode != 0:
            _log(f"kubectl {' '.join(args[:3])}: {result.stderr.strip()}")
        return result.returncode == 0


def volume_for(claim: dict[str, Any], *, root: Path, node: str) -> dict[str, Any]:
    """The PersistentVolume that answers ``claim`` (pre-bound to it by ``claimRef``)."""
    meta = claim["metadata"]
    spec = claim["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {PROVISIONED_BY: PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "local": {"path": str(root / f"pvc-{meta['uid']}")},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def wanted(claim: dict[str, Any], node: str) -> bool:
    annotations = claim["metadata"].get("annotations") or {}
    return (
        claim["spec"].get("storageClassName") == STORAGE_CLASS
        and (claim.get("status") or {}).get("phase") == "Pending"
        and not claim["spec"].get("volumeName")
        and annotations.get(SELECTED_NODE) == node
    )


def sync(kubectl: Kubectl, *, root: Path, node: str) -> None:
    volumes = kubectl.json("get", "pv")["items"]
    names = {v["metadata"]["name"] for v in volumes}
    for claim in kubectl.json("get", "pvc", "--all-namespaces")["items"]:
        if not wanted(claim, node):
            continue
        volume = volume_for(claim, root=root, node=node)
        if volume["metadata"]["name"] in names:
            continue
        path = Path(volume["spec"]["local"]["path"])
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, NONROOT, NONROOT)
        path.chmod(0o770)
        if kubectl.run("create", "-f", "-", input=json.dumps(volume)):
            meta = claim["metadata"]
            _log(f"provisioned {volume['metadata']['name']} for {meta['namespace']}/{meta['name']}")
    for volume in volumes:
        annotations = volume["metadata"].get("annotations") or {}
        phase = (volume.get("status") or {}).get("phase")
        if annotations.get(PROVISIONED_BY) != PROVISIONER or phase not in ("Released", "Failed"):
            continue
        path = Path(volume["spec"]["local"]["path"])
        if path.parent == root:
            shutil.rmtree(path, ignore_errors=True)
        if kubectl.run("delete", "pv", volume["metadata"]["name"], "--wait=false"):
            _log(f"deleted {volume['metadata']['name']} (its claim is gone)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kubectl", required=True)
    parser.add_argument("--root", type=Path, required=True, help="where volumes are made")
    parser.add_argument("--node", required=True, help="the node's name")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    kubectl = Kubectl(args.kubectl, args.kubeconfig)
    _log(f"provisioning {STORAGE_CLASS} claims under {args.root}")
    while True:
        try:
            sync(kubectl, root=args.root.resolve(), node=args.node)
        except (RuntimeError, OSError, ValueError) as error:
            _log(f"sync failed, retrying: {error}")
        time.sleep(args.interval)  # the provisioner's resync period


if __name__ == "__main__":
    sys.exit(main())
