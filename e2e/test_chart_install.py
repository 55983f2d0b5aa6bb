"""What ``cluster/chart_install.py`` says when an install fails, decided without a cluster.

helm's own error is "context deadline exceeded"; the install adds what the cluster saw. The
objects here are trimmed from what ``kubectl get -o json`` returned on a node under DiskPressure
that evicted the operator's pods in a loop (CI, 2026-12-04).
"""

from __future__ import annotations

from typing import Any

from cluster.chart_install import event_findings, node_findings, pod_findings


def _node(**conditions: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "agentsafe-node"},
        "status": {
            "conditions": [
                {"type": kind, "status": status, "message": f"{kind} is {status}"}
                for kind, status in conditions.items()
            ]
        },
    }


def _evicted() -> dict[str, Any]:
    return {"status": {"phase": "Failed", "reason": "Evicted", "conditions": []}}


def test_a_healthy_node_is_one_line_and_a_pressured_one_names_the_pressure() -> None:
    healthy = _node(Ready="True", DiskPressure="False", MemoryPressure="False")
    assert node_findings([healthy]) == ["  nodes: every condition as a healthy node's"]
    pressured = _node(Ready="True", DiskPressure="True", MemoryPressure="False")
    assert node_findings([pressured]) == [
        "  node agentsafe-node: DiskPressure=True (DiskPressure is True)"
    ]


def test_hundreds_of_evicted_pods_are_one_line_with_their_count() -> None:
    crashing = {
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        }
    }
    ready = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_findings([_evicted()] * 300 + [crashing, ready]) == [
        "  pods not ready: 300 x Failed Evicted",
        "  pods not ready: 1 x Running CrashLoopBackOff",
    ]


def test_repeated_warnings_are_said_once_in_the_order_they_last_happened() -> None:
    def event(at: str, reason: str, message: str) -> dict[str, Any]:
        return {"lastTimestamp": at, "reason": reason, "message": message}

    events = [
        event("2026-12-04T18:40:03Z", "Evicted", "The node had condition: [DiskPressure]."),
        event("2026-12-04T18:40:01Z", "FailedScheduling", "0/1 nodes are available"),
        event("2026-12-04T18:40:02Z", "Evicted", "The node had condition: [DiskPressure]."),
    ]
    assert event_findings(events) == [
        "  warning FailedScheduling: 0/1 nodes are available",
        "  warning Evicted: The node had condition: [DiskPressure].",
    ]
