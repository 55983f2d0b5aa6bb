"""Outbound HTTP: the contract every component uses to reach another system.

The contract (see ``docs/architecture.md``, "Outbound HTTP") is three names: :class:`HttpResponse`,
:class:`TransportError` and the :class:`Transport` protocol. Its one implementation is
``egress.GuardedClient``, the egress guard: every outbound request of the executor goes through
it, so this module deliberately holds no client of its own (``tests/test_socket_confinement.py``
keeps connection APIs out of it).

Every failure is a :class:`TransportError` whose ``sent`` says whether bytes may have reached the
peer: ``False`` only when the request provably never left (refused before a socket, connection
refused, a timeout before the request was written); ``True`` whenever it is not provable, which
the handler seam reports as UNKNOWN_AFTER_DISPATCH rather than guessing "not executed".

:func:`is_loopback_host` is the loopback test for names and literals that the synthetic provider
uses to refuse binding anywhere else; :data:`DEFAULT_MAX_RESPONSE_BYTES` is the guard's default
body limit (``EXECUTOR_EGRESS_MAX_RESPONSE_BYTES``).

Callers: ``egress/guard.py`` (implements the protocol), ``dispatch/forward.py`` and
``egress/credentials.py`` (use it), ``dispatch/seam.py`` (maps ``sent`` to an outcome),
``tools/synthetic.py`` (``is_loopback_host``).
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..codes import Code
from ..errors import AgentSafeError

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "HttpResponse",
    "Transport",
    "TransportError",
    "is_loopback_host",
]

DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HttpResponse:
    """A whole response: status, headers (lower-cased names) and the body read in full."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


class TransportError(AgentSafeError):
    """An outbound request failed; ``code`` is EGRESS_* or TRANSPORT_*.

    ``sent`` is False only when nothing can have reached the peer (the caller may report the
    attempt FAILED_BEFORE_DISPATCH); True means bytes may have arrived (UNKNOWN_AFTER_DISPATCH).
    """

    code = Code.TRANSPORT_FAILED

    def __init__(self, code: Code, sent: bool, message: str | None = None) -> None:
        super().__init__(message or code.replace("_", " ").lower(), code=code)
        self.sent = sent


class Transport(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse: ...

    async def close(self) -> None:
        """Release what the implementation holds (the guard's kept-alive connections)."""
        ...


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
