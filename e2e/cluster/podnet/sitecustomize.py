"""Stand-in for the cluster's pod network, loaded only into the e2e operator process.

Role: a real cluster routes a pod's IP to the pod; here the stand-in executor "pod" listens on
loopback, and the API server refuses loopback IPs in EndpointSlices. So the kubelet stand-in
publishes an FQDN EndpointSlice under the reserved ``.test`` domain (RFC 6761), and this module
— put on the operator process's ``PYTHONPATH`` by ``operator_process.py``, nowhere else — makes
names under :data:`POD_DOMAIN` resolve to 127.0.0.1. Every other name resolves as usual.
"""

from __future__ import annotations

import socket
from typing import Any

POD_DOMAIN = ".pod.agentsafe-e2e.test"
_original_getaddrinfo = socket.getaddrinfo


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else host
    if isinstance(name, str) and name.rstrip(".").endswith(POD_DOMAIN):
        return _original_getaddrinfo("127.0.0.1", *args, **kwargs)
    return _original_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
