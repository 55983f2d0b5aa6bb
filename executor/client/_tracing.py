"""W3C Trace Context from the agent's own OpenTelemetry set-up to the executor.

The client owns no tracer provider: the agent host configures OpenTelemetry (or not). Each HTTP
request the client sends is a ``CLIENT`` span of the ``tracer_provider`` given to the client,
else of the host's global one (a no-op one when the host set none), named
``POST /v1/actions`` and the like, with the HTTP semantic conventions' method, route, status
code and server address; the span's ``traceparent`` and ``tracestate`` go on the request, so
the executor's spans join the agent's trace. Only the W3C Trace Context propagator is used,
never the host's global one: baggage (whatever the host put there) never leaves for the
executor. With ``opentelemetry-api`` not installed, nothing is sent.

Callers: ``client/_client.py`` (every request).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from typing import Any
from urllib.parse import urlsplit

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - the agent host did not install opentelemetry-api
    _PROPAGATOR = None

__all__ = ["request_span"]


@contextlib.contextmanager
def request_span(
    method: str,
    url: str,
    route: str,
    headers: MutableMapping[str, str],
    *,
    tracer_provider: Any = None,
) -> Iterator[Any]:
    """A client span around one request to ``url`` (``route`` its template), its context
    written into ``headers``; ``tracer_provider`` (None: the global one) makes it. Yields the
    span (``set_attribute`` for the status) or None."""
    if _PROPAGATOR is None:
        yield None
        return
    target = urlsplit(url)
    tracer = _trace.get_tracer("agentsafe.client", tracer_provider=tracer_provider)
    attributes: dict[str, str | int] = {
        "http.request.method": method,
        "http.route": route,
        "server.address": target.hostname or "",
        "url.scheme": target.scheme,
    }
    if target.port is not None:
        attributes["server.port"] = target.port
    with tracer.start_as_current_span(
        f"{method} {route}",
        kind=_trace.SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
    ) as span:
        _PROPAGATOR.inject(headers)
        yield span
