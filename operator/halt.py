"""HaltSwitch mechanics: the durable halt key and the immediate control call.

A halt reaches an executor twice. Durably: the key ``halt`` of the policy's ConfigMap, which
``EXECUTOR_HALT_FILE`` points at, exists while any HaltSwitch that selects the policy is halted
(a pod that restarts starts halted; the executor refuses to resume while the file exists). It
is applied under its own field manager (``agentsafe-operator-halt``) so that re-rendering the
ConfigMap never clears it and a policy that fails to render can still be halted. At once:
``POST /v1/control/halt`` (``/resume``) with the reason on every executor endpoint, as the
operator's OPERATOR principal, over TLS verified against the executor's own certificate
(``ca.crt`` of its TLS Secret when present, else the certificate itself, pinned).

:func:`halt_document`, :func:`render_halt_configmap` and :func:`executor_endpoints` are pure;
:class:`ControlClient` does the HTTP.

Callers: ``handlers.py``, the tests.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from .models import HaltSwitchSpec
from .render.common import PolicyRef, names
from .render.config import HALT_KEY

__all__ = [
    "ControlClient",
    "ControlResult",
    "Endpoint",
    "executor_endpoints",
    "halt_document",
    "render_halt_configmap",
    "switches_halting",
    "trust_context",
]

MAX_REASON: Final = 500


@dataclass(frozen=True)
class Endpoint:
    pod: str
    address: str
    ready: bool


@dataclass(frozen=True)
class ControlResult:
    pod: str
    acknowledged: bool
    error: str | None = None


def switches_halting(
    switches: Iterable[Mapping[str, Any]], policy_labels: Mapping[str, str] | None
) -> list[tuple[str, str]]:
    """(name, reason) of every halted HaltSwitch (not being deleted) selecting the policy."""
    out: list[tuple[str, str]] = []
    for switch in switches:
        if switch.get("metadata", {}).get("deletionTimestamp"):
            continue
        try:
            spec = HaltSwitchSpec.model_validate(switch.get("spec") or {})
        except ValueError:
            continue  # an invalid stored switch halts nothing; its own handler reports it
        if spec.halted and spec.policy_selector.matches(dict(policy_labels or {})):
            out.append((str(switch["metadata"]["name"]), spec.reason or ""))
    return sorted(out)


def halt_document(halting: Sequence[tuple[str, str]]) -> str | None:
    """The halt file's content, or ``None`` when nothing halts the policy."""
    if not halting:
        return None
    body = {"haltedBy": [{"haltSwitch": name, "reason": reason} for name, reason in halting]}
    return json.dumps(body, sort_keys=True) + "\n"


def render_halt_configmap(policy: PolicyRef, document: str | None) -> dict[str, Any]:
    """What the halt field manager applies: the halt key, or no key at all (which removes the
    one it applied before)."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names(policy).config, "namespace": policy.namespace},
    }
    if document is not None:
        body["data"] = {HALT_KEY: document}
    return body


def executor_endpoints(slices: Iterable[Mapping[str, Any]]) -> list[Endpoint]:
    """Every executor pod address in the Service's EndpointSlices, ready or not (a halted
    executor is not ready and must still be reachable for the resume)."""
    seen: dict[str, Endpoint] = {}
    for piece in slices:
        for endpoint in piece.get("endpoints") or []:
            addresses = endpoint.get("addresses") or []
            target = endpoint.get("targetRef") or {}
            if not addresses:
                continue
            pod = str(target.get("name") or addresses[0])
            ready = bool((endpoint.get("conditions") or {}).get("ready", False))
            seen.setdefault(pod, Endpoint(pod=pod, address=str(addresses[0]), ready=ready))
    return sorted(seen.values(), key=lambda e: e.pod)


def trust_context(*, ca_pem: str | None, certificate_pem: str | None) -> ssl.SSLContext:
    """Trust the executor's CA, or pin its certificate when no CA is given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem or certificate_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not ca_pem:
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


class ControlClient:
    """Calls the executors' control routes as the operator's OPERATOR principal."""

    def __init__(self, *, timeout: float = 2.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def call_all(
        self,
        endpoints: Sequence[Endpoint],
        *,
        action: str,
        reason: str,
        token: str,
        port: int,
        server_hostname: str,
        context: ssl.SSLContext,
    ) -> list[ControlResult]:
        """``POST /v1/control/<action>`` on every endpoint at once; one result per pod."""
        if action not in ("halt", "resume"):
            raise ValueError("action is halt or resume")
        body = {"reason": reason[:MAX_REASON]}
        headers = {"Authorization": f"Bearer {token}"}
        connector = aiohttp.TCPConnector(ssl=context, force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:

            async def one(endpoint: Endpoint) -> ControlResult:
                host = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
                url = f"https://{host}:{port}/v1/control/{action}"
                try:
                    async with session.post(
                        url, json=body, headers=headers, server_hostname=server_hostname
                    ) as response:
                        if response.status == 200:
                            return ControlResult(endpoint.pod, True)
                        code = await _error_code(response)
                        return ControlResult(endpoint.pod, False, f"HTTP {response.status} {code}")
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    return ControlResult(endpoint.pod, False, type(exc).__name__)

            return list(await asyncio.gather(*(one(e) for e in endpoints)))


async def _error_code(response: aiohttp.ClientResponse) -> str:
    try:
        data = await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if code is None and isinstance(data, dict):
        code = data.get("code")
    return str(code)[:64] if isinstance(code, str) else ""
