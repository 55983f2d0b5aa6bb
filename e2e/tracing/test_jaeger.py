"""One ALLOW from ``agentsafe.client`` through ``agentsafe serve`` to the provider is ONE trace in
a real Jaeger (all-in-one v1.76.0, OTLP/HTTP in, its query API read back).

Everything is real: Jaeger built by ``make e2e-build`` from the Go module proxy
(``e2e/cluster/build.py``, cached by version, in its background job at nice 19; ``make e2e``
runs this test last, after ``build.py --only-jaeger`` has waited for that job), the executor as
its own ``agentsafe serve`` process (its process guard in force: the exporter connects inside
``allowed_egress``), the synthetic provider on loopback, the agent's own OpenTelemetry SDK
exporting to the same Jaeger. Without a cached Jaeger the test skips
(``AGENTSAFE_E2E=require``: fails).

The expected shape is :data:`SHAPE`, one row per span: the agent's step and its client span, the
executor's server span, and under it each lifecycle step of one ALLOW (the door, the decision, the
journal appends, the claim, the dispatch with the egress guard's resolve and connect, the
finalization); the provider's request is the dispatch span's child (its ``traceparent``).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cluster import build
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentsafe.client import AgentSafeClient, Verdict
from agentsafe.executor.tools.harness import ExecutorProcess, Workspace, free_port, wait_until
from agentsafe.executor.tools.synthetic import SyntheticProvider

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("jaeger")]

AGENT = "agent-host"
EXECUTOR = "agentsafe-executor"

SERVER = (EXECUTOR, "POST /v1/actions")
DISPATCH = (EXECUTOR, "agentsafe.dispatch")

#: One row per span: ((service, span name), the (service, span name) of its parent); None: the
#: trace's root. The journal's three appends (ATTEMPT_OPENED, GRANT_CLAIMED, ATTEMPT_CLOSED) are
#: three rows.
SHAPE: Counter[tuple[tuple[str, str], tuple[str, str] | None]] = Counter(
    [
        ((AGENT, "agent.step"), None),
        ((AGENT, "POST /v1/actions"), (AGENT, "agent.step")),
        (SERVER, (AGENT, "POST /v1/actions")),
        ((EXECUTOR, "agentsafe.door"), SERVER),
        ((EXECUTOR, "agentsafe.decision"), SERVER),
        ((EXECUTOR, "agentsafe.journal.append"), SERVER),  # ATTEMPT_OPENED
        ((EXECUTOR, "agentsafe.claim"), SERVER),
        ((EXECUTOR, "agentsafe.journal.append"), SERVER),  # GRANT_CLAIMED
        (DISPATCH, SERVER),
        ((EXECUTOR, "agentsafe.egress.resolve"), DISPATCH),
        ((EXECUTOR, "agentsafe.egress.connect"), DISPATCH),
        ((EXECUTOR, "agentsafe.finalize"), SERVER),
        ((EXECUTOR, "agentsafe.journal.append"), SERVER),  # ATTEMPT_CLOSED
    ]
)


class Jaeger:
    def __init__(self, binary: Path, log: Path) -> None:
        self.otlp = free_port()
        self.query = free_port()
        self.admin = free_port()
        ports = {
            "--collector.otlp.http.host-port": self.otlp,
            "--collector.otlp.grpc.host-port": free_port(),
            "--collector.grpc-server.host-port": free_port(),
            "--collector.http-server.host-port": free_port(),
            "--query.http-server.host-port": self.query,
            "--query.grpc-server.host-port": free_port(),
            "--admin.http.host-port": self.admin,
        }
        argv = [str(binary), "--memory.max-traces=1000", "--collector.otlp.enabled"]
        argv += [f"{flag}=127.0.0.1:{port}" for flag, port in ports.items()]
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={"COLLECTOR_OTLP_ENABLED": "true", "PATH": "/usr/bin:/bin"},
        )
        self.url = f"http://127.0.0.1:{self.query}"
        self.log = log

    async def ready(self) -> None:
        async def up() -> bool:
            assert self.process.poll() is None, self.log.read_text(errors="replace")[-2000:]
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{self.admin}/") as r,
                ):
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(up, timeout=60, what="jaeger to answer")

    async def trace(self, trace_id: str) -> dict[str, Any] | None:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/api/traces/{trace_id}") as r,
        ):
            if r.status != 200:
                return None
            body: dict[str, Any] = await r.json()
        data = body.get("data") or []
        return data[0] if data else None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self._log.close()


@pytest.fixture
async def jaeger(tmp_path: Path) -> AsyncIterator[Jaeger]:
    binary = build.jaeger_binary()
    if binary is None:
        message = f"no Jaeger {build.JAEGER_VERSION} in the cache: run {build.BUILD_COMMAND}"
        if build.e2e_required():
            pytest.fail(message)
        pytest.skip(message)
    running = Jaeger(binary, tmp_path / "jaeger.log")
    try:
        await running.ready()
        yield running
    finally:
        running.stop()


@pytest.fixture
def agent_tracing(jaeger: Jaeger) -> Iterator[TracerProvider]:
    """The agent host's own OpenTelemetry set-up, handed to agentsafe.client."""
    provider = TracerProvider(resource=Resource({"service.name": AGENT}))
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{jaeger.otlp}/v1/traces")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def _shape(found: dict[str, Any]) -> Counter[tuple[tuple[str, str], tuple[str, str] | None]]:
    processes = {key: p["serviceName"] for key, p in found["processes"].items()}
    by_id = {s["spanID"]: (processes[s["processID"]], s["operationName"]) for s in found["spans"]}
    shape: Counter[tuple[tuple[str, str], tuple[str, str] | None]] = Counter()
    for span in found["spans"]:
        parents = [r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"]
        shape[(by_id[span["spanID"]], by_id.get(parents[0]) if parents else None)] += 1
    return shape


def _records(found: dict[str, Any]) -> list[str]:
    """The journal records of the trace's appends, in the order they started."""
    appends = [s for s in found["spans"] if s["operationName"] == "agentsafe.journal.append"]
    return [
        next(t["value"] for t in s["tags"] if t["key"] == "agentsafe.record")
        for s in sorted(appends, key=lambda s: s["startTime"])
    ]


async def test_one_allow_is_one_trace_in_jaeger(
    tmp_path: Path, jaeger: Jaeger, agent_tracing: TracerProvider
) -> None:
    provider = SyntheticProvider()
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(
        provider_url=provider.base_url,
        port=free_port(),
        extra={
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{jaeger.otlp}",
            "OTEL_SERVICE_NAME": EXECUTOR,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    executor = ExecutorProcess(env, tmp_path)
    try:
        await executor.start()
        tracer = agent_tracing.get_tracer("agent")
        with tracer.start_as_current_span("agent.step") as step:
            trace_id = trace.format_trace_id(step.get_span_context().trace_id)
            async with AgentSafeClient(
                executor.url, token=executor.token, tracer_provider=agent_tracing
            ) as client:
                decision = await client.propose(
                    "create_payout", "payout:t-1", {"amountMinor": 1200, "currency": "USD"}
                )
        assert decision.verdict is Verdict.ALLOW
        assert decision.executed is True

        async def complete() -> dict[str, Any] | None:
            found = await jaeger.trace(trace_id)
            return found if found and len(found["spans"]) >= SHAPE.total() else None

        found = await wait_until(complete, timeout=30, what="the whole trace in Jaeger")
    finally:
        executor.terminate()
        await provider.stop()
    assert _shape(found) == SHAPE
    assert _records(found) == ["ATTEMPT_OPENED", "GRANT_CLAIMED", "ATTEMPT_CLOSED"]
    assert {s["traceID"] for s in found["spans"]} == {trace_id}
    # the provider's request carries the same trace, its parent the executor's dispatch span
    (received,) = provider.received
    _, sent_trace, parent, _ = received.headers["traceparent"].split("-")
    assert sent_trace == trace_id
    dispatch = next(s for s in found["spans"] if s["operationName"] == "agentsafe.dispatch")
    assert parent == dispatch["spanID"]
    # and the executor's evidence lines of the request carry it
    decisions = [e for e in executor.stdout_events() if e.get("event") == "DECISION"]
    assert [e.get("trace_id") for e in decisions] == [trace_id]
