"""The restricted Pod Security checker finds each violation it claims to check."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentsafe.operator.podsecurity import restricted_violations

GOOD: dict[str, Any] = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "image": "x",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
    "volumes": [{"name": "v", "emptyDir": {}}],
}


def _set(path: str, value: Any) -> dict[str, Any]:
    pod = copy.deepcopy(GOOD)
    target: Any = pod
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
    last = parts[-1]
    if value is None:
        target.pop(last, None)
    else:
        target[last] = value
    return pod


def test_the_good_pod_passes() -> None:
    assert restricted_violations(GOOD) == []
    assert restricted_violations({"spec": {"template": {"spec": GOOD}}}) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("hostNetwork", True, "hostNetwork"),
        ("hostPID", True, "hostPID"),
        ("hostIPC", True, "hostIPC"),
        ("volumes", [{"name": "h", "hostPath": {"path": "/"}}], "hostPath"),
        ("securityContext.runAsNonRoot", None, "runAsNonRoot"),
        ("securityContext.runAsUser", 0, "runAsUser"),
        ("securityContext.seccompProfile", {"type": "Unconfined"}, "seccompProfile"),
        ("securityContext.seccompProfile", None, "seccompProfile"),
        ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "sysctl"),
        ("containers.0.securityContext.privileged", True, "privileged"),
        ("containers.0.securityContext.allowPrivilegeEscalation", None, "allowPrivilegeEscalation"),
        ("containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]}, "drop ALL"),
        (
            "containers.0.securityContext.capabilities",
            {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
            "SYS_ADMIN",
        ),
        ("containers.0.securityContext.procMount", "Unmasked", "procMount"),
        ("containers.0.securityContext.seLinuxOptions", {"type": "spc_t"}, "seLinuxOptions"),
        ("containers.0.ports", [{"containerPort": 1, "hostPort": 1}], "hostPort"),
    ],
)
def test_each_violation_is_found(path: str, value: Any, expected: str) -> None:
    found = restricted_violations(_set(path, value))
    assert any(expected in line for line in found), found


def test_net_bind_service_may_be_added() -> None:
    pod = _set(
        "containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    )
    assert restricted_violations(pod) == []
