"""The header names of a downstream request that the executor writes itself: one list.

Who writes which header, on every request to the downstream:

* :data:`TRANSPORT_HEADERS`: the HTTP client (framing and hop-by-hop headers); the egress guard
  refuses them from any caller;
* :data:`HANDLER_HEADERS`: the ``forward_request`` handler (``content-type``, ``idempotency-key``
  and the ``x-agent-safe-*`` binding headers);
* :data:`SIGNATURE_HEADERS`: the signed-request credential, beside the covered headers it signs;
* :data:`TRACE_HEADERS`: W3C Trace Context (``traceparent``, ``tracestate``), written by the
  ``forward_request`` handler when tracing is on (``telemetry.py``); never covered by the
  signature (docs/tracing.md says why).

:data:`RESERVED_HEADERS` is all four, and :func:`is_reserved` also counts every name under the
``x-agent-safe-`` prefix. No configured header (``DOWNSTREAM_CREDENTIAL_HEADER``) may name one, and
no credential may replace one. :data:`HEADER_NAME` is the RFC 9110 field-name grammar (a token).

Callers: ``config/parsing.py`` (``DOWNSTREAM_CREDENTIAL_HEADER``), ``egress/credentials.py``
(the static header credential), ``egress/urls.py`` (what a caller may pass the egress guard),
``dispatch/forward.py`` (what a credential may add).
Also imported by ``banking/transport.py``, ``gateway/forward.py``, ``gateway/intercept.py``,
``telemetry.py`` (:data:`TRACE_HEADERS`).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "BINDING_PREFIX",
    "HANDLER_HEADERS",
    "HEADER_NAME",
    "RESERVED_HEADERS",
    "SIGNATURE_HEADERS",
    "TRACE_HEADERS",
    "TRANSPORT_HEADERS",
    "is_reserved",
]

HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An RFC 9110 field name (``token``); use ``fullmatch``."""

BINDING_PREFIX: Final = "x-agent-safe-"

TRANSPORT_HEADERS: Final = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer"}
)
HANDLER_HEADERS: Final = frozenset(
    {
        "content-type",
        "idempotency-key",
        "x-agent-safe-intent-hash",
        "x-agent-safe-dossier-id",
        "x-agent-safe-grant-id",
        "x-agent-safe-decision-id",
        "x-agent-safe-claim-attestation",
    }
)
SIGNATURE_HEADERS: Final = frozenset({"content-digest", "signature-input", "signature"})
TRACE_HEADERS: Final = frozenset({"traceparent", "tracestate"})
RESERVED_HEADERS: Final = TRANSPORT_HEADERS | HANDLER_HEADERS | SIGNATURE_HEADERS | TRACE_HEADERS


def is_reserved(name: str) -> bool:
    """Whether the executor writes ``name`` itself (any case), so nothing else may supply it."""
    lowered = name.lower()
    return lowered in RESERVED_HEADERS or lowered.startswith(BINDING_PREFIX)
