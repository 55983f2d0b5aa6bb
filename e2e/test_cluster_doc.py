"""docs/cluster.md, run as written on the real one-node cluster (issue 31).

The page's ```` ```sh ```` block is read from the markdown (so this breaks when the page
changes) and run as one bash script from the repository's root, every command's output and exit
status recorded: ``make cluster-up`` (the node ``make e2e`` brought up is reused: the page says a
second ``cluster-up`` of the same node prints its kubeconfig again), the namespace and its Pod
Security label, ``helm install`` of the chart from ``agentsafe:dev`` with ``--wait``, the examples
applied, and ``make cluster-down``; then ``make cluster-status`` must say no node runs, no
process the node started may be left, and the kubeconfig the page exports must be git-ignored
(the page's comments). Two
liberties, each the page's own: ``sudo`` is dropped when the test already runs as root, and
where the page's cached kubectl and helm are not at the path it names (another
``AGENTSAFE_CACHE_DIR``), the suite's own builds are ``K`` and ``H`` ("or your own kubectl /
helm").

It needs the node, so it runs only under ``--backend=node``, in a ``cluster.node run`` of its own
(``make e2e``'s last step: the scenario's node has the chart installed already); anywhere else it
skips with one line, and a machine that lacks what the page needs (root, the node) skips too,
or fails under ``AGENTSAFE_E2E=require``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster.build import Binaries

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "cluster.md"
_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.S | re.M)


def commands(text: str) -> list[str]:
    """The page's first sh block, continuation lines joined."""
    found = _BLOCK.search(text)
    assert found is not None, "docs/cluster.md has no sh block"
    out: list[str] = []
    pending = ""
    for line in found.group(1).splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        if (pending + line).strip():
            out.append(pending + line)
        pending = ""
    return out


COMMANDS = commands(PAGE.read_text(encoding="utf-8"))


@dataclass
class Ran:
    command: str
    rc: int
    out: str


def test_the_page_is_the_walk_through_this_test_checks() -> None:
    assert COMMANDS[0].startswith("sudo make cluster-up")
    assert "cluster-down" in COMMANDS[-1]
    assert any(c.startswith("$H install agentsafe charts/agentsafe") for c in COMMANDS)
    assert any(c.startswith("$K apply -f examples/k8s/") for c in COMMANDS)


def _unavailable(message: str) -> None:
    if os.environ.get("AGENTSAFE_E2E", "").lower() == "require":
        pytest.fail(f"AGENTSAFE_E2E=require and {message}", pytrace=False)
    pytest.skip(f"docs/cluster.md not run: {message} (AGENTSAFE_E2E=require fails instead)")


def _script(tools: Binaries) -> str:
    lines = []
    for command in COMMANDS:
        if os.geteuid() == 0:
            command = re.sub(r"^sudo ", "", command)
        for name, tool in (("K", tools.kubectl), ("H", tools.helm)):
            written = re.match(rf"^{name}=(\S+)", command)
            if written and not Path(os.path.expanduser(written.group(1))).exists():
                command = f"{name}={tool}" + command[written.end() :]
        lines.append(command)
    return "\n".join(lines)


def test_the_page_runs_as_written(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if backend != "node":
        pytest.skip("docs/cluster.md runs on the real node only (make e2e: --backend=node)")
    k8s_binaries: Binaries = request.getfixturevalue("k8s_binaries")
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        _unavailable("the page's make cluster-up needs root (or sudo)")
    from cluster import node

    if not node.status().get("running"):
        _unavailable("no one-node cluster is running here (make e2e brings it up)")
    recorded = node.State.load()
    assert recorded is not None, "a running node without its record in /run"
    assert recorded.pids, "the running node recorded no processes"
    logs = tmp_path / "runs"
    logs.mkdir()
    script = []
    for n, command in enumerate(_script(k8s_binaries).splitlines()):
        script.append(f"{{ {command}\n}} >{logs}/{n} 2>&1; echo $? >{logs}/{n}.rc")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, env=env, timeout=280, check=True)
    ran = [
        Ran(c, int((logs / f"{n}.rc").read_text()), (logs / str(n)).read_text())
        for n, c in enumerate(COMMANDS)
    ]
    for step in ran:
        assert step.rc == 0, f"{step.command}\n{step.out[-3000:]}"
    up = ran[0]
    assert "kubeconfig" in up.out, up.out[-2000:]
    applied = next(step for step in ran if "examples/k8s/" in step.command)
    assert "agentpolicy.agentsafe.io/payouts" in applied.out, applied.out
    status = subprocess.run(
        ["make", "cluster-status"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert "no node is running" in status.stdout, status.stdout + status.stderr
    # "stop everything": no process the node started is left (etcd ... kubelet, containerd).
    left = node.State(state_dir=recorded.state_dir, pids=recorded.pids).running()
    assert not left, f"still running after cluster-down: {sorted(left)}"
    # "admin credentials (git-ignored)"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".cluster/kubeconfig"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0, ".cluster/kubeconfig is not git-ignored"
