"""A checker for the Pod Security Standards' "restricted" profile (and "baseline" under it).

:func:`restricted_violations` takes a pod spec, or any workload manifest carrying one
(``spec.template.spec``), and returns one line per violated rule, following the published
profile (Kubernetes "Pod Security Standards", restricted, latest):

baseline: no hostNetwork/hostPID/hostIPC; no privileged containers; capabilities added only
from the baseline list; no hostPath volumes; no hostPort; AppArmor/SELinux/procMount/sysctls
left at defaults (only the safe set of sysctls); seccomp not Unconfined.
restricted: volume types only configMap, csi, downwardAPI, emptyDir, ephemeral,
persistentVolumeClaim, projected, secret; allowPrivilegeEscalation false; runAsNonRoot true
(pod or every container) and runAsUser not 0; seccompProfile RuntimeDefault or Localhost (pod
or every container); capabilities drop ALL and add at most NET_BIND_SERVICE.

Callers: the tests (every rendered workload must come back empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["restricted_violations"]

_ALLOWED_VOLUMES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
_SAFE_SYSCTLS: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
_SELINUX_TYPES: Final = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)


def _pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    if "containers" in obj:
        return obj
    spec = obj.get("spec") or {}
    if "containers" in spec:
        return spec
    template = (spec.get("template") or {}).get("spec")
    if template is None:
        raise ValueError("no pod spec in this object")
    return dict(template)


def restricted_violations(obj: Mapping[str, Any]) -> list[str]:
    pod = _pod_spec(obj)
    out: list[str] = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            out.append(f"{flag} must be false")
    for volume in pod.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind not in _ALLOWED_VOLUMES:
                out.append(f"volume {volume.get('name')}: type {kind} is not allowed")
    pod_sc = pod.get("securityContext") or {}
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')} is not allowed")
    _selinux(pod_sc, "pod", out)
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        out.append("pod: seccompProfile.type must be RuntimeDefault or Localhost")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod: runAsUser must not be 0")
    containers = [
        *(pod.get("initContainers") or []),
        *(pod.get("containers") or []),
        *(pod.get("ephemeralContainers") or []),
    ]
    for container in containers:
        name = f"container {container.get('name')}"
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged must be false")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        run_as_non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if run_as_non_root is not True:
            out.append(f"{name}: runAsNonRoot must be true (pod or container)")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile.type must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities must drop ALL")
        for cap in caps.get("add") or []:
            if cap != "NET_BIND_SERVICE":
                out.append(f"{name}: capability {cap} may not be added")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount must be Default")
        _selinux(sc, name, out)
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"{name}: appArmorProfile must be RuntimeDefault or Localhost")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{name}: hostPort is not allowed")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{name}: hostProcess is not allowed")
    return out


def _selinux(sc: Mapping[str, Any], where: str, out: list[str]) -> None:
    options = sc.get("seLinuxOptions") or {}
    if options.get("type", "") not in _SELINUX_TYPES:
        out.append(f"{where}: seLinuxOptions.type is not allowed")
    if options.get("user") or options.get("role"):
        out.append(f"{where}: seLinuxOptions user/role must be unset")
