"""executor/telemetry.py: off by default, the OTEL_* variables, the attribute rule, the drops.

The SDK is real (TracerProvider, BatchSpanProcessor); the exporters here are the SDK's in-memory
one and two stand-ins for a collector (one that fails, one that blocks), named as such. The real
collector is Jaeger, in e2e/tracing/test_jaeger.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentsafe.executor import telemetry
from agentsafe.executor.errors import ConfigError

ON = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "10"}


@pytest.fixture(autouse=True)
def _off_afterwards() -> Iterator[None]:
    yield
    telemetry.shutdown()


def _poll(predicate: object, *, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_off_by_default_and_off_costs_nothing() -> None:
    assert telemetry.settings_from({}) is None
    assert telemetry.settings_from({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert telemetry.settings_from({**ON, "OTEL_SDK_DISABLED": "true"}) is None
    assert telemetry.configure({}) is False
    with telemetry.span("agentsafe.claim", {"agentsafe.code": "X"}) as current:
        assert current is None
    headers: dict[str, str] = {}
    telemetry.inject(headers)
    assert headers == {}
    assert telemetry.current_trace_id() is None
    assert telemetry.extract({"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}) is None


def test_the_standard_variables_are_read() -> None:
    settings = telemetry.settings_from(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01",
            "OTEL_SERVICE_NAME": "payments-executor",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20collector-secret",
        }
    )
    assert settings is not None
    assert settings.endpoint == "http://collector:4318/v1/traces"
    assert settings.sampler == "parentbased_traceidratio"
    assert settings.sampler_arg == 0.01
    assert settings.service_name == "payments-executor"
    assert dict(settings.headers) == {"authorization": "Bearer collector-secret"}
    assert "collector-secret" not in repr(settings)
    traces = telemetry.settings_from(
        {**ON, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c.example/custom"}
    )
    assert traces is not None
    assert traces.endpoint == "https://c.example/custom"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin-secret-value"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_TRACES_SAMPLER", "sometimes-secret-value"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "-secret-value"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://secret-value"),
    ],
)
def test_an_invalid_value_is_refused_by_name_never_echoed(variable: str, value: str) -> None:
    environ = {**ON, "OTEL_TRACES_SAMPLER": "traceidratio", variable: value}
    with pytest.raises(ConfigError) as info:
        telemetry.settings_from(environ)
    assert info.value.code == "CONFIG_INVALID"
    assert info.value.variable == variable
    assert "secret" not in str(info.value)


def test_spans_carry_codes_and_outcomes_never_parameters_tokens_or_secrets() -> None:
    memory = InMemorySpanExporter()
    assert telemetry.configure(ON, exporter=memory)
    with telemetry.span(
        "agentsafe.claim",
        {
            "agentsafe.code": "GRANT_ALREADY_CLAIMED",
            "agentsafe.outcome": "COMPLETED",
            "http.route": "/v1/actions",
            "http.response.status_code": 200,
            "parameters": '{"amountMinor": 1200}',
            "agentsafe.parameters": "iban=DE89370400440532013000",
            "authorization": "Bearer agent-token",
            "url.full": "https://bank/approve/secret-token",
        },
    ):
        telemetry.set_attributes(
            {
                "agentsafe.verdict": "ALLOW",
                # an allowed name with a value that is not a token (free text, a secret)
                "agentsafe.action": "create payout for Bearer abc.def",
                "error.type": "x" * 200,
            }
        )
        telemetry.record_code("AMOUNT_ABOVE_POLICY")
    telemetry.flush()
    (span,) = memory.get_finished_spans()
    assert dict(span.attributes or {}) == {
        "agentsafe.code": "AMOUNT_ABOVE_POLICY",
        "agentsafe.outcome": "COMPLETED",
        "http.route": "/v1/actions",
        "http.response.status_code": 200,
        "agentsafe.verdict": "ALLOW",
    }


def test_an_exception_is_recorded_by_its_type_never_its_message() -> None:
    memory = InMemorySpanExporter()
    telemetry.configure(ON, exporter=memory)
    with pytest.raises(ValueError, match="secret"), telemetry.span("agentsafe.dispatch"):
        raise ValueError("the secret parameter value")
    telemetry.flush()
    (span,) = memory.get_finished_spans()
    assert dict(span.attributes or {}) == {"error.type": "ValueError"}
    assert not span.events


def test_w3c_trace_context_in_and_out() -> None:
    memory = InMemorySpanExporter()
    telemetry.configure(ON, exporter=memory)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    context = telemetry.extract({"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"})
    with telemetry.span("GET /v1/actions", context=context):
        assert telemetry.current_trace_id() == "0af7651916cd43dd8448eb211c80319c"
        sent: dict[str, str] = {}
        telemetry.inject(sent)
    assert sent["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
    assert sent["tracestate"] == "congo=t61rcWkgMzE"
    # an invalid traceparent (version ff, all-zero ids, garbage) is ignored: a new trace
    for invalid in (
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "not a traceparent",
    ):
        with telemetry.span("x", context=telemetry.extract({"traceparent": invalid})):
            fresh = telemetry.current_trace_id()
        assert fresh is not None
        assert fresh != "0af7651916cd43dd8448eb211c80319c"


class _FailingCollector(SpanExporter):
    """Stands in for a collector that is down: every export fails."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE


class _BlockedCollector(SpanExporter):
    """Stands in for a collector that hangs: the first export waits until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(10)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def test_a_collector_that_fails_costs_dropped_spans_and_they_are_counted() -> None:
    drops: list[tuple[str, int]] = []
    collector = _FailingCollector()
    telemetry.configure(ON, exporter=collector, on_drop=lambda r, n: drops.append((r, n)))
    for _ in range(3):
        with telemetry.span("agentsafe.door"):
            pass
    _poll(lambda: sum(n for _, n in drops) == 3)
    assert {reason for reason, _ in drops} == {"export_failed"}


def test_a_full_queue_drops_the_new_span_at_once_and_counts_it() -> None:
    drops: list[tuple[str, int]] = []
    collector = _BlockedCollector()
    environ = {**ON, "OTEL_BSP_MAX_QUEUE_SIZE": "4", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1"}
    telemetry.configure(environ, exporter=collector, on_drop=lambda r, n: drops.append((r, n)))
    try:
        with telemetry.span("first"):
            pass
        assert collector.entered.wait(10)  # the worker holds the first span, blocked
        for _ in range(10):
            with telemetry.span("more"):
                pass
        # four fit the queue; the other six were dropped while the request went on
        assert drops == [("queue_full", 1)] * 6
    finally:
        collector.release.set()
    _poll(lambda: collector.exported == 5)


def test_the_mcp_bridge_reads_the_trace_context_from_meta() -> None:
    mcp_types = pytest.importorskip("mcp_types")
    from agentsafe.executor.tools.mcp_bridge import _trace_context

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    params = mcp_types.CallToolRequestParams(
        name="create_payout", arguments={}, _meta={"traceparent": parent, "other": "x"}
    )
    assert _trace_context(params) == {"traceparent": parent}
    assert _trace_context(mcp_types.CallToolRequestParams(name="create_payout")) == {}
