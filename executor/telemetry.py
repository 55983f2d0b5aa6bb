"""OpenTelemetry traces: configured by the standard ``OTEL_*`` variables, off by default.

Role: the one place the executor touches the OpenTelemetry SDK (docs/tracing.md). Everything
else asks this module for a span, the current trace id, or the W3C Trace Context headers.

* **Off by default.** Tracing is on only when ``OTEL_TRACES_EXPORTER`` is ``otlp`` (the SDK's own
  default is ``otlp``; agentsafe's is ``none``) and ``OTEL_SDK_DISABLED`` is not ``true``. Off,
  :func:`span` yields ``None`` after one module-global check and nothing else is imported into a
  request's path; no header is read or written.
* **Never on the request's critical path.** Spans end into a ``BatchSpanProcessor`` whose worker
  thread exports over OTLP/HTTP (``opentelemetry-exporter-otlp-proto-http``). A collector that is
  down or slow costs dropped spans, nothing else: :class:`_DropCounting` keeps the processor's
  queue bounded itself, so a full queue drops the new span at once (``queue_full``), and a batch
  the exporter could not deliver is dropped too (``export_failed``); each drop is told to
  ``on_drop(reason, count)``, which ``assembly.py`` points at
  ``agentsafe_trace_spans_dropped_total{reason}`` on ``/metrics``.
* **The variables** (given by the caller: the executor's from its configuration's "Tracing"
  rows, ``ExecutorConfig.tracing_environment``, never from ``os.environ`` behind its back):
  ``OTEL_TRACES_EXPORTER`` (``none`` | ``otlp``),
  ``OTEL_SDK_DISABLED``, ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``http/protobuf`` only),
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` appended) or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (as given), ``OTEL_EXPORTER_OTLP_HEADERS`` (never
  logged), ``OTEL_EXPORTER_OTLP_TIMEOUT`` (milliseconds), ``OTEL_TRACES_SAMPLER`` and
  ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``,
  ``OTEL_BSP_EXPORT_TIMEOUT``. An invalid value refuses the start with ``CONFIG_INVALID``
  naming the variable, never its value.
* **Attribute rules** (:func:`safe_attributes`): a span carries only the names in
  :data:`ALLOWED_ATTRIBUTES` (the HTTP semantic conventions' request method, route template,
  status code, scheme, server address and port, protocol version, ``error.type``; agentsafe's
  code, outcome, verdict and action name), each a number, a boolean or a short token-like string
  (:data:`_SAFE_VALUE`). Anything else is dropped before the SDK sees it: never parameters, the
  raw path or query (which may carry an approval token), headers, tokens or secrets.
* **W3C Trace Context** (``traceparent``, ``tracestate``) through the SDK's own
  ``TraceContextTextMapPropagator``: an absent or invalid ``traceparent`` starts a new trace, as
  the W3C specification says, and is never a refusal. Baggage is neither read nor sent.

Callers: ``assembly.py`` (:func:`configure` with the drop counter and the guard's
``allowed_egress``), ``serve.py`` and ``proxy.py`` (:func:`shutdown` at exit),
``routes/app.py`` (the server span of every request), ``routes/refusals.py`` (a refusal's
code on the current span),
``dispatch/forward.py`` (the dispatch's client span, the headers sent to the provider),
``evidence/chain.py`` (the trace id of a chained line), ``gateway/forward.py`` (the held
request's headers upstream), ``gateway/listener.py`` (the intercepted request's server span),
``tools/mcp_bridge.py`` (a tool call's span; the global provider for ``agentsafe.client``).
The lifecycle's steps, each a span in its own module: ``door/door.py`` (``agentsafe.door``),
``policy/authority.py`` (``agentsafe.decision``, ``agentsafe.claim``, ``agentsafe.finalize``),
the attempt journal (``agentsafe.journal.append``: :func:`span` is handed to it by the assembly,
never imported, so the supervisor that reads the journal loads no SDK), ``egress/guard.py``
(``agentsafe.egress.resolve``, ``agentsafe.egress.connect``), ``dispatch/forward.py`` (the
lookup's ``agentsafe.lookup``), ``lifecycle/reconciliations.py`` (``agentsafe.reconcile``),
``lifecycle/recovery.py`` (``agentsafe.reconcile.start``, ``agentsafe.reconcile.recheck``).
``tools/doctor.py`` checks the configuration's ``OTEL_*`` values with :func:`settings_from`.
The operator: ``operator/cli.py`` (configures it), ``operator/handlers.py`` (a span per
reconcile), ``operator/render/workload.py`` (copies :data:`RENDERED_VARIABLES` into the pods),
``operator/render/network.py`` (the collector's endpoint, admitted by the NetworkPolicy).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import __version__
from .errors import ConfigError
from .headers import TRACE_HEADERS

__all__ = [
    "ALLOWED_ATTRIBUTES",
    "RENDERED_VARIABLES",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_HEADERS",
    "SpanKind",
    "TracingSettings",
    "configure",
    "current_trace_id",
    "enabled",
    "extract",
    "inject",
    "record_code",
    "safe_attributes",
    "set_attributes",
    "settings_from",
    "shutdown",
    "span",
]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
DEFAULT_SERVICE_NAME: Final = "agentsafe-executor"
DEFAULT_ENDPOINT: Final = "http://localhost:4318"

#: The variables the operator renders into the executor pods from its own environment (the
#: chart's ``tracing`` values); never ``OTEL_EXPORTER_OTLP_HEADERS`` (it may hold a credential,
#: which belongs in a Secret) nor ``OTEL_SERVICE_NAME`` (each process names itself).
RENDERED_VARIABLES: Final = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_EXPORT_TIMEOUT",
)

#: The only span attribute names agentsafe writes: codes and outcomes, never data.
ALLOWED_ATTRIBUTES: Final = frozenset(
    {
        "http.request.method",
        "http.route",
        "http.response.status_code",
        "url.scheme",
        "server.address",
        "server.port",
        "network.protocol.version",
        "error.type",
        "agentsafe.code",
        "agentsafe.outcome",
        "agentsafe.verdict",
        "agentsafe.action",
        "agentsafe.worker",
        "agentsafe.record",
    }
)
#: A string attribute value: a code, an outcome, a route template, a host name.
_SAFE_VALUE: Final = re.compile(r"[A-Za-z0-9_.:/{}\-]{1,128}")
_SAMPLERS: Final = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)
_PROPAGATOR: Final = TraceContextTextMapPropagator()

_lock = threading.Lock()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


# ---------------------------------------------------------------------- settings


@dataclass(frozen=True)
class TracingSettings:
    """What the ``OTEL_*`` variables say, checked; ``endpoint`` is the full traces URL."""

    endpoint: str
    headers: tuple[tuple[str, str], ...]
    timeout_seconds: float
    sampler: str
    sampler_arg: float
    service_name: str
    resource: tuple[tuple[str, str], ...]
    max_queue_size: int
    schedule_delay_millis: int
    max_export_batch_size: int
    export_timeout_millis: int

    def __repr__(self) -> str:  # the headers may carry the collector's credential
        return f"TracingSettings(endpoint={self.endpoint!r}, sampler={self.sampler!r})"


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, "must be a positive integer") from None
    if value <= 0:
        raise ConfigError(name, "must be a positive integer")
    return value


def _pairs(environ: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    """``k1=v1,k2=v2`` (W3C Baggage-like, values percent-decoded) as pairs."""
    raw = environ.get(name, "").strip()
    pairs: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(name, "must be a comma-separated list of key=value")
        pairs.append((key.strip(), unquote(value.strip())))
    return tuple(pairs)


def settings_from(environ: Mapping[str, str]) -> TracingSettings | None:
    """The tracing settings ``environ`` asks for, or None when tracing is off (the default).
    Raises :class:`~agentsafe.executor.errors.ConfigError` on an invalid value."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = {
        e.strip().lower()
        for e in environ.get("OTEL_TRACES_EXPORTER", "none").split(",")
        if e.strip()
    }
    if not exporters or exporters == {"none"}:
        return None
    if exporters != {"otlp"}:
        raise ConfigError("OTEL_TRACES_EXPORTER", "must be none or otlp")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() != "http/protobuf":
        raise ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL", "only http/protobuf is supported")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not endpoint:
        base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT
        endpoint = base.rstrip("/") + "/v1/traces"
    if not re.match(r"https?://[^/\s]+", endpoint):
        raise ConfigError("OTEL_EXPORTER_OTLP_ENDPOINT", "must be an http or https URL")
    sampler = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in _SAMPLERS:
        raise ConfigError("OTEL_TRACES_SAMPLER", f"must be one of {', '.join(sorted(_SAMPLERS))}")
    ratio = 1.0
    raw_ratio = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if raw_ratio and sampler.endswith("traceidratio"):
        try:
            ratio = float(raw_ratio)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError("OTEL_TRACES_SAMPLER_ARG", "must be a ratio between 0 and 1")
    resource = _pairs(environ, "OTEL_RESOURCE_ATTRIBUTES")
    service = environ.get("OTEL_SERVICE_NAME", "").strip() or dict(resource).get(
        "service.name", DEFAULT_SERVICE_NAME
    )
    return TracingSettings(
        endpoint=endpoint,
        headers=_pairs(environ, "OTEL_EXPORTER_OTLP_HEADERS"),
        timeout_seconds=_positive_int(environ, "OTEL_EXPORTER_OTLP_TIMEOUT", 10000) / 1000,
        sampler=sampler,
        sampler_arg=ratio,
        service_name=service,
        resource=resource,
        max_queue_size=_positive_int(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
        schedule_delay_millis=_positive_int(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000),
        max_export_batch_size=_positive_int(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        export_timeout_millis=_positive_int(environ, "OTEL_BSP_EXPORT_TIMEOUT", 30000),
    )


def _sampler(settings: TracingSettings) -> Sampler:
    ratio = TraceIdRatioBased(settings.sampler_arg)
    root: Sampler = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": ALWAYS_ON,
        "parentbased_always_off": ALWAYS_OFF,
        "parentbased_traceidratio": ratio,
    }[settings.sampler]
    return ParentBased(root) if settings.sampler.startswith("parentbased_") else root


# ---------------------------------------------------------------------- the export path

DropCounter = Callable[[str, int], None]
"""``on_drop(reason, count)``: ``queue_full`` or ``export_failed``."""


class _Exporting(SpanExporter):
    """The OTLP exporter, each export inside ``around`` (the process guard's
    ``allowed_egress`` in ``serve``), its failures counted as drops."""

    def __init__(
        self,
        inner: SpanExporter,
        *,
        on_drop: DropCounter,
        on_taken: Callable[[int], None],
        around: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self._inner = inner
        self._on_drop = on_drop
        self._on_taken = on_taken
        self._around = around

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._on_taken(len(spans))
        try:
            with self._around():
                result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._on_drop("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _DropCounting(SpanProcessor):
    """A ``BatchSpanProcessor`` whose queue bound is kept here, so that a span that would not
    fit is dropped at once and counted (``queue_full``) instead of silently displacing one."""

    def __init__(
        self,
        exporter: SpanExporter,
        settings: TracingSettings,
        *,
        on_drop: DropCounter,
        around: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self._capacity = settings.max_queue_size
        self._pending = 0
        self._lock = threading.Lock()
        self._on_drop = on_drop
        self._batch = BatchSpanProcessor(
            _Exporting(exporter, on_drop=on_drop, on_taken=self._taken, around=around),
            max_queue_size=settings.max_queue_size,
            schedule_delay_millis=settings.schedule_delay_millis,
            max_export_batch_size=min(settings.max_export_batch_size, settings.max_queue_size),
            export_timeout_millis=settings.export_timeout_millis,
        )

    def _taken(self, count: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - count)

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self._batch.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._lock:
            full = self._pending >= self._capacity
            if not full:
                self._pending += 1
        if full:
            self._on_drop("queue_full", 1)
            return
        self._batch.on_end(span)

    def shutdown(self) -> None:
        self._batch.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


def _no_drop_counter(reason: str, count: int) -> None:
    del reason, count


def configure(
    environ: Mapping[str, str],
    *,
    on_drop: DropCounter | None = None,
    around_export: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    exporter: SpanExporter | None = None,
    default_service_name: str = DEFAULT_SERVICE_NAME,
) -> bool:
    """Turn tracing on when ``environ`` asks for it (replacing a previous configuration) and
    return whether it is on. ``exporter`` replaces the OTLP exporter (tests: an in-memory one).
    Raises :class:`~agentsafe.executor.errors.ConfigError`."""
    global _tracer, _provider
    settings = settings_from(environ)
    shutdown()
    if settings is None:
        return False
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(
            endpoint=settings.endpoint,
            headers=dict(settings.headers),
            timeout=settings.timeout_seconds,
        )
    service = settings.service_name
    if not environ.get("OTEL_SERVICE_NAME") and "service.name" not in dict(settings.resource):
        service = default_service_name
    resource = Resource(
        {**dict(settings.resource), "service.name": service, "service.version": __version__}
    )
    provider = TracerProvider(resource=resource, sampler=_sampler(settings))
    provider.add_span_processor(
        _DropCounting(
            exporter,
            settings,
            on_drop=on_drop or _no_drop_counter,
            around=around_export or contextlib.nullcontext,
        )
    )
    with _lock:
        _provider = provider
        _tracer = provider.get_tracer("agentsafe", __version__)
    return True


def shutdown() -> None:
    """Export what is queued (bounded by the exporter's timeout) and turn tracing off."""
    global _tracer, _provider
    with _lock:
        provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def install_global() -> None:
    """Make this configuration OpenTelemetry's global tracer provider, so that libraries in the
    same process (``agentsafe.client`` in the MCP bridge) export through it; once per process."""
    provider = _provider
    if provider is not None:
        trace.set_tracer_provider(provider)


def enabled() -> bool:
    return _tracer is not None


def flush(timeout_millis: int = 10000) -> bool:
    """Export what is queued now (tests, and before a bundle is taken)."""
    provider = _provider
    return provider.force_flush(timeout_millis) if provider is not None else True


# ---------------------------------------------------------------------- spans


def safe_attributes(attributes: Mapping[str, object] | None) -> dict[str, str | int | float | bool]:
    """``attributes`` less every name outside :data:`ALLOWED_ATTRIBUTES` and every value that is
    not a number, a boolean or a short token (see the module docstring)."""
    kept: dict[str, str | int | float | bool] = {}
    for name, value in (attributes or {}).items():
        if name not in ALLOWED_ATTRIBUTES:
            continue
        safe_text = isinstance(value, str) and _SAFE_VALUE.fullmatch(value) is not None
        if safe_text or isinstance(value, bool | int | float):
            kept[name] = value  # type: ignore[assignment]
    return kept


_NO_SPAN: Final[contextlib.nullcontext[None]] = contextlib.nullcontext()
"""What :func:`span` gives when nothing would record: one shared context manager that yields
None and leaves the block's exception alone (it holds no state, so every thread may share it)."""


def span(
    name: str,
    attributes: Mapping[str, object] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: otel_context.Context | None = None,
    child_only: bool = False,
) -> contextlib.AbstractContextManager[trace.Span | None]:
    """A span named ``name`` (``agentsafe.claim``...) around the block, current inside it; the
    block's exception is recorded by its type only (``error.type``), never its message. Yields
    None, at the cost of one check, when tracing is off: a shared no-op context manager, not a
    generator made and run for every block (issue 34: 1.0 -> 0.4 us each, some ten blocks
    per ALLOW). ``child_only``: only inside a recording span (a step that background work shares
    with requests, such as a journal append or an egress connect, never starts a trace of its
    own)."""
    tracer = _tracer
    if tracer is None:
        return _NO_SPAN
    if child_only and not trace.get_current_span().is_recording():
        return _NO_SPAN
    return _recording(tracer, name, attributes, kind, context)


@contextlib.contextmanager
def _recording(
    tracer: trace.Tracer,
    name: str,
    attributes: Mapping[str, object] | None,
    kind: SpanKind,
    context: otel_context.Context | None,
) -> Iterator[trace.Span]:
    """:func:`span` while tracing is on."""
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=kind,
        attributes=safe_attributes(attributes),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_attribute("error.type", type(exc).__qualname__)
            current.set_status(trace.StatusCode.ERROR)
            raise


def set_attributes(attributes: Mapping[str, object]) -> None:
    """Add ``attributes`` (by the same rules) to the current span, if one is recording."""
    if _tracer is None:
        return
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(safe_attributes(attributes))


def record_code(code: str) -> None:
    """A refusal's or an outcome's code on the current span (``agentsafe.code``)."""
    set_attributes({"agentsafe.code": str(code)})


def current_trace_id() -> str | None:
    """The 32-hex trace id of the current span while tracing is on, else None."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id)


def extract(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The caller's W3C Trace Context from ``headers`` (None when tracing is off); an absent or
    invalid ``traceparent`` gives a context without a parent, so a new trace."""
    if _tracer is None:
        return None
    carrier = {k: v for k in TRACE_HEADERS if (v := headers.get(k)) is not None}
    return _PROPAGATOR.extract(carrier)


def inject(headers: MutableMapping[str, str]) -> None:
    """Write ``traceparent`` (and ``tracestate``) of the current span into ``headers``; nothing
    when tracing is off or no span is current."""
    if _tracer is None:
        return
    _PROPAGATOR.inject(headers)
