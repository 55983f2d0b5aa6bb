"""Traces through a real executor on loopback: the server span, the provider's traceparent, the
evidence lines' trace id, and nothing of it while tracing is off (docs/tracing.md).

The executor is assembled in this process with chained evidence streams, a real synthetic
provider receives the dispatch; the spans go to the SDK's in-memory exporter (the real collector
is Jaeger, in e2e/tracing/test_jaeger.py).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from agentsafe.executor import telemetry
from agentsafe.executor.assembly import assemble
from agentsafe.executor.events import DeferredSink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace, free_port
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.integration.bearer_principals import BearerPrincipals, principals_env

PAYOUT = {"amountMinor": 1200, "currency": "USD"}
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
ON = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "10"}


SERVER = "POST /v1/actions"
APPEND = "agentsafe.journal.append"

#: One ALLOW's spans under the request's server span: (span, its record) -> its parent's name.
ALLOW_TREE = Counter(
    {
        ("agentsafe.door", None, SERVER): 1,
        ("agentsafe.decision", None, SERVER): 1,
        (APPEND, "ATTEMPT_OPENED", SERVER): 1,
        ("agentsafe.claim", None, SERVER): 1,
        (APPEND, "GRANT_CLAIMED", SERVER): 1,
        ("agentsafe.dispatch", None, SERVER): 1,
        ("agentsafe.egress.resolve", None, "agentsafe.dispatch"): 1,
        ("agentsafe.egress.connect", None, "agentsafe.dispatch"): 1,
        ("agentsafe.finalize", None, SERVER): 1,
        (APPEND, "ATTEMPT_CLOSED", SERVER): 1,
    }
)
#: A BLOCK and an ESCALATE: the door and the decision, nothing claimed, journaled or sent.
REFUSED_TREE = Counter(
    {("agentsafe.door", None, SERVER): 1, ("agentsafe.decision", None, SERVER): 1}
)


def _tree(spans: tuple[ReadableSpan, ...]) -> Counter[tuple[str, object, str | None]]:
    """Each span below the server span as (name, its journal record, its parent's name); every
    span in one trace."""
    assert len({span.context.trace_id for span in spans}) == 1
    names = {span.context.span_id: span.name for span in spans}
    return Counter(
        (
            span.name,
            dict(span.attributes or {}).get("agentsafe.record"),
            names.get(span.parent.span_id) if span.parent is not None else None,
        )
        for span in spans
        if span.name != SERVER
    )


class Node:
    def __init__(self, executor: Executor, principals: BearerPrincipals, out: io.StringIO) -> None:
        self.executor = executor
        self.url = f"http://127.0.0.1:{executor.port}"
        self.principals = principals
        self.out = out

    async def propose(
        self, key: str, headers: dict[str, str] | None = None, parameters: Any = PAYOUT
    ) -> tuple[int, Any]:
        body = {
            "proposal": {
                "action": "create_payout",
                "target": "payout:t-1",
                "parameters": parameters,
            },
            "idempotency_key": key,
        }
        sent = {"authorization": f"Bearer {self.principals.token('treasury-workflow')}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.url + "/v1/actions", json=body, headers={**sent, **(headers or {})}
            ) as r,
        ):
            return r.status, await r.json()

    def evidence(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines() if line]


@pytest.fixture
async def provider() -> AsyncIterator[SyntheticProvider]:
    synthetic = SyntheticProvider()
    await synthetic.start()
    yield synthetic
    await synthetic.stop()


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()
    telemetry.shutdown()


async def _node(
    tmp_path: Path, provider_url: str, exporter: InMemorySpanExporter | None = None, **extra: str
) -> Node:
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=provider_url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
        **extra,
    )
    out, err = io.StringIO(), io.StringIO()
    executor = await assemble(
        env, streams=Streams(evidence=DeferredSink(), security=DeferredSink()), chain=(out, err)
    )
    if exporter is not None:  # assemble turned tracing on with OTLP; the same, in memory
        telemetry.configure(ON, exporter=exporter)
    await executor.reconcile_at_start()
    await executor.listen()
    return Node(executor, principals, out)


async def test_one_allow_is_one_trace_from_the_caller_to_the_provider(
    tmp_path: Path, provider: SyntheticProvider, memory: InMemorySpanExporter
) -> None:
    node = await _node(tmp_path, provider.base_url, **ON)
    try:
        # assemble turned tracing on with the OTLP exporter; the same settings, in memory
        telemetry.configure(ON, exporter=memory)
        status, answer = await node.propose(
            "k-trace-1", {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
        )
        assert status == 200, answer
        assert answer["verdict"] == "ALLOW"
    finally:
        await node.executor.close()
    telemetry.flush()
    spans = {span.name: span for span in memory.get_finished_spans()}
    server = spans["POST /v1/actions"]
    dispatch = spans["agentsafe.dispatch"]
    assert server.kind is SpanKind.SERVER
    assert format_trace_id(server.context.trace_id) == TRACE_ID
    assert server.parent is not None
    assert format_span_id(server.parent.span_id) == CALLER_SPAN
    assert dict(server.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v1/actions",
        "url.scheme": "http",
        "network.protocol.version": "1.1",
        "http.response.status_code": 200,
        "agentsafe.verdict": "ALLOW",
    }
    assert dispatch.kind is SpanKind.CLIENT
    assert dispatch.parent is not None
    assert dispatch.parent.span_id == server.context.span_id
    # the lifecycle's steps, each one span of the same trace, in the order they ran
    finished = memory.get_finished_spans()
    assert _tree(finished) == ALLOW_TREE
    steps = sorted(finished, key=lambda span: span.start_time or 0)
    assert [(s.name, dict(s.attributes or {}).get("agentsafe.record")) for s in steps] == [
        (SERVER, None),
        ("agentsafe.door", None),
        ("agentsafe.decision", None),
        (APPEND, "ATTEMPT_OPENED"),
        ("agentsafe.claim", None),
        (APPEND, "GRANT_CLAIMED"),
        ("agentsafe.dispatch", None),
        ("agentsafe.egress.resolve", None),
        ("agentsafe.egress.connect", None),
        ("agentsafe.finalize", None),
        (APPEND, "ATTEMPT_CLOSED"),
    ]
    assert dict(spans["agentsafe.decision"].attributes or {}) == {
        "agentsafe.action": "create_payout",
        "agentsafe.verdict": "ALLOW",
        "agentsafe.code": "POLICY_ALLOWED",
    }
    assert dict(spans["agentsafe.claim"].attributes or {}) == {"agentsafe.outcome": "CLAIMED"}
    assert dict(spans["agentsafe.door"].attributes or {}) == {"agentsafe.outcome": "AUTHENTICATED"}
    assert dict(spans["agentsafe.finalize"].attributes or {}) == {"agentsafe.outcome": "COMPLETED"}
    resolve = dict(spans["agentsafe.egress.resolve"].attributes or {})
    assert resolve == {
        "server.address": "127.0.0.1",
        "server.port": provider.port,
        "url.scheme": "http",
    }
    assert dict(dispatch.attributes or {})["http.response.status_code"] == 202  # accepted
    # the provider's request carries the same trace, its parent the dispatch span
    (received,) = provider.received
    version, trace_id, parent_id, flags = received.headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
    assert parent_id == format_span_id(dispatch.context.span_id)
    assert received.headers["tracestate"] == "congo=t61rcWkgMzE"
    # the evidence lines of this request carry the trace id
    request = {"PROPOSAL_RECEIVED", "DECISION", "OUTCOME"}
    lines = {line["event"]: line for line in node.evidence() if line["event"] in request}
    assert set(lines) == request
    assert {line.get("trace_id") for line in lines.values()} == {TRACE_ID}


async def test_an_invalid_traceparent_starts_a_new_trace_never_a_refusal(
    tmp_path: Path, provider: SyntheticProvider, memory: InMemorySpanExporter
) -> None:
    node = await _node(tmp_path, provider.base_url, **ON)
    try:
        telemetry.configure(ON, exporter=memory)
        status, answer = await node.propose(
            "k-trace-2", {"traceparent": "00-zz-not-valid", "tracestate": "=bad"}
        )
        assert status == 200, answer
        status, answer = await node.propose(
            "k-trace-3", {"traceparent": f"00-{'0' * 32}-{CALLER_SPAN}-01"}
        )
        assert status == 200, answer
    finally:
        await node.executor.close()
    telemetry.flush()
    servers = [s for s in memory.get_finished_spans() if s.name == "POST /v1/actions"]
    assert len(servers) == 2
    for server in servers:
        assert server.parent is None
    assert len({s.context.trace_id for s in servers}) == 2
    for received in provider.received:
        trace_id = received.headers["traceparent"].split("-")[1]
        assert trace_id in {format_trace_id(s.context.trace_id) for s in servers}


async def test_tracing_off_reads_and_writes_nothing(
    tmp_path: Path, provider: SyntheticProvider
) -> None:
    node = await _node(tmp_path, provider.base_url)
    try:
        status, answer = await node.propose("k-off-1", {"traceparent": TRACEPARENT})
        assert status == 200, answer
    finally:
        await node.executor.close()
    (received,) = provider.received
    assert "traceparent" not in received.headers
    assert "tracestate" not in received.headers
    assert all("trace_id" not in line for line in node.evidence())


async def test_dropped_spans_are_on_metrics(tmp_path: Path, provider: SyntheticProvider) -> None:
    # a collector nobody listens on: the export fails, the request does not wait for it
    dead = f"http://127.0.0.1:{free_port()}"
    node = await _node(
        tmp_path,
        provider.base_url,
        **ON,
        OTEL_EXPORTER_OTLP_ENDPOINT=dead,
        OTEL_EXPORTER_OTLP_TIMEOUT="500",
    )
    try:
        status, answer = await node.propose("k-drop-1", {"traceparent": TRACEPARENT})
        assert status == 200, answer
        telemetry.flush()
        text = node.executor.metrics.render()[0].decode()
    finally:
        await node.executor.close()
        telemetry.shutdown()
    counts = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("agentsafe_trace_spans_dropped_total{")
    }
    assert counts['reason="queue_full"'] == 0
    assert counts['reason="export_failed"'] >= 2  # the server span and the dispatch span


async def test_a_refusal_and_an_unknown_path_are_server_spans_with_their_code(
    tmp_path: Path, provider: SyntheticProvider, memory: InMemorySpanExporter
) -> None:
    node = await _node(tmp_path, provider.base_url, **ON)
    try:
        telemetry.configure(ON, exporter=memory)
        async with aiohttp.ClientSession() as session:
            async with session.get(node.url + "/no/such/secret-path?token=abc") as r:
                assert r.status == 404
            async with session.post(node.url + "/v1/actions", json={}) as r:
                assert r.status == 401
    finally:
        await node.executor.close()
    telemetry.flush()
    unknown, refused = (s for s in memory.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert unknown.name == "GET"
    assert "http.route" not in dict(unknown.attributes or {})
    assert dict(unknown.attributes or {})["http.response.status_code"] == 404
    assert refused.name == "POST /v1/actions"
    assert dict(refused.attributes or {})["agentsafe.code"] == "AUTH_REQUIRED"
    assert dict(refused.attributes or {})["http.response.status_code"] == 401
    for span in (unknown, refused):
        assert "secret-path" not in str(dict(span.attributes or {}))


@pytest.mark.parametrize(
    ("amount", "verdict", "outcome", "code"),
    [
        (100_000, "BLOCK", "BLOCKED", "AMOUNT_ABOVE_POLICY"),
        (20_000, "ESCALATE", "ESCALATE_PENDING", "APPROVAL_REQUIRED"),
    ],
)
async def test_a_block_and_an_escalate_are_one_trace_of_the_door_and_the_decision(
    tmp_path: Path,
    provider: SyntheticProvider,
    memory: InMemorySpanExporter,
    amount: int,
    verdict: str,
    outcome: str,
    code: str,
) -> None:
    node = await _node(tmp_path, provider.base_url, **ON)
    try:
        telemetry.configure(ON, exporter=memory)
        status, answer = await node.propose(
            f"k-{verdict}", {"traceparent": TRACEPARENT}, {"amountMinor": amount, "currency": "USD"}
        )
        assert status == 200, answer
        assert (answer["verdict"], answer["outcome"]) == (verdict, outcome)
    finally:
        await node.executor.close()
    telemetry.flush()
    finished = memory.get_finished_spans()
    assert _tree(finished) == REFUSED_TREE
    assert provider.received == []
    spans = {span.name: span for span in finished}
    assert format_trace_id(spans[SERVER].context.trace_id) == TRACE_ID
    assert dict(spans[SERVER].attributes or {})["agentsafe.verdict"] == verdict
    assert dict(spans["agentsafe.decision"].attributes or {}) == {
        "agentsafe.action": "create_payout",
        "agentsafe.verdict": verdict,
        "agentsafe.code": code,
    }
    # the parameters are in no span
    for span in finished:
        assert str(amount) not in str(dict(span.attributes or {}))


async def test_a_refusal_at_the_door_is_the_door_span_with_its_code(
    tmp_path: Path, provider: SyntheticProvider, memory: InMemorySpanExporter
) -> None:
    node = await _node(tmp_path, provider.base_url, **ON)
    try:
        telemetry.configure(ON, exporter=memory)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                node.url + "/v1/actions",
                json={},
                headers={"authorization": "Bearer not-a-token", "traceparent": TRACEPARENT},
            ) as r,
        ):
            assert r.status == 401
    finally:
        await node.executor.close()
    telemetry.flush()
    finished = memory.get_finished_spans()
    assert _tree(finished) == Counter({("agentsafe.door", None, SERVER): 1})
    door = next(span for span in finished if span.name == "agentsafe.door")
    attributes = dict(door.attributes or {})
    assert attributes["agentsafe.outcome"] == "REFUSED"
    assert attributes["agentsafe.code"] == "AUTH_FAILED"
    assert "not-a-token" not in str(attributes)


async def test_reconciliation_is_traced_the_route_the_lookup_and_the_start(
    tmp_path: Path, provider: SyntheticProvider, memory: InMemorySpanExporter
) -> None:
    """``POST /v1/reconciliations``: the door, ``agentsafe.reconcile`` and under it the lookup's
    client span (its egress resolve below it); at the next start, ``agentsafe.reconcile.start``
    is a trace of its own with the lookup and the journal's RECONCILED under it."""
    provider.set_mode("error")  # a 500 with no body: the outcome is unknown, the attempt open
    node = await _node(tmp_path, provider.base_url, **ON)
    try:
        telemetry.configure(ON, exporter=memory)
        _, answer = await node.propose("k-unknown-1")
        assert answer["outcome"] == "UNKNOWN_AFTER_DISPATCH", answer
        telemetry.flush()
        memory.clear()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                node.url + "/v1/reconciliations",
                json={"recovery": answer["recovery"]},
                headers={
                    "authorization": f"Bearer {node.principals.token('treasury-workflow')}",
                    "traceparent": TRACEPARENT,
                },
            ) as r,
        ):
            reconciled = await r.json()
            assert r.status == 200, reconciled
        assert reconciled["reason_codes"] == ["RECONCILE_TOO_EARLY"]
        telemetry.flush()
        route = memory.get_finished_spans()
        memory.clear()
    finally:
        await node.executor.close()
    names = {span.context.span_id: span.name for span in route}
    tree = Counter(
        (span.name, names.get(span.parent.span_id) if span.parent is not None else None)
        for span in route
    )
    assert tree == Counter(
        {
            ("POST /v1/reconciliations", None): 1,
            ("agentsafe.door", "POST /v1/reconciliations"): 1,
            ("agentsafe.reconcile", "POST /v1/reconciliations"): 1,
            ("agentsafe.lookup", "agentsafe.reconcile"): 1,
            ("agentsafe.egress.resolve", "agentsafe.lookup"): 1,
        }
    )
    spans = {span.name: span for span in route}
    assert {format_trace_id(s.context.trace_id) for s in route} == {TRACE_ID}
    assert spans["agentsafe.lookup"].kind is SpanKind.CLIENT
    assert dict(spans["agentsafe.lookup"].attributes or {})["http.response.status_code"] == 404
    assert dict(spans["agentsafe.reconcile"].attributes or {}) == {"agentsafe.outcome": "UNKNOWN"}

    # the next process settles the open attempt at start-up: one trace of its own
    restarted = InMemorySpanExporter()  # the first one was shut down with its provider
    again = await _node(tmp_path, provider.base_url, restarted, **ON)
    await again.executor.close()
    telemetry.flush()
    finished = restarted.get_finished_spans()
    start = [s for s in finished if s.name == "agentsafe.reconcile.start"]
    assert len(start) == 1
    (root,) = start
    assert root.parent is None
    below = Counter(
        s.name for s in finished if s.context.trace_id == root.context.trace_id and s is not root
    )
    assert below == {
        "agentsafe.lookup": 1,
        "agentsafe.egress.resolve": 1,
        "agentsafe.egress.connect": 1,
        "agentsafe.journal.append": 1,  # RECONCILED
    }
    (appended,) = (s for s in finished if s.name == "agentsafe.journal.append")
    assert dict(appended.attributes or {})["agentsafe.record"] == "RECONCILED"
