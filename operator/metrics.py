"""The operator's own metrics, served on its own port (``GET /metrics``, plain HTTP, in-pod).

The operator is a separate process from every executor, so it has its own exposition
(docs/monitoring.md): how many reconciles ran per handler and how each ended, how long they
took, how many AgentPolicies are Ready, and ``agentsafe_operator_build_info``. Label values come
from closed sets (:data:`HANDLERS`, :data:`RESULTS`); a policy's name never becomes a label.
The registry is this object's own, never prometheus_client's global one.

:meth:`OperatorMetrics.serve` starts prometheus_client's HTTP server in a daemon thread of this
process (it answers ``/metrics`` only from this registry); the NetworkPolicy the chart renders
admits only the configured scraper to that port.

Callers: ``cli.py`` (serves), ``runtime.py`` (holds it in the ``Runtime``, through which the
kopf handlers record each run), the tests.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import start_http_server
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest

from agentsafe.executor import __version__
from agentsafe.executor.host.metrics import build_commit

__all__ = ["HANDLERS", "RECONCILE_BUCKETS", "RESULTS", "OperatorMetrics"]

HANDLERS: Final = ("agentpolicy", "agentpolicy.delete", "principal", "haltswitch", "readiness")
RESULTS: Final = ("applied", "not_ready", "invalid", "api_error", "error")
"""How a handler run ended: ``applied`` (everything rendered and applied), ``not_ready`` (a
render refusal: a missing Secret, an invalid policy; reported as Ready=False), ``invalid`` (the
stored object does not validate), ``api_error`` (the API server refused; kopf retries), ``error``
(anything else)."""
RECONCILE_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class OperatorMetrics:
    """Reconcile counts, results and durations, and the Ready policies, in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ns = "agentsafe_operator"
        self._runs = Counter(
            "reconciles", "Handler runs by handler and result", ("handler", "result"),
            namespace=ns, registry=self.registry,
        )  # fmt: skip
        self._durations = Histogram(
            "reconcile_duration_seconds", "Handler run durations by handler", ("handler",),
            namespace=ns, buckets=RECONCILE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._policies = Gauge(
            "policies", "AgentPolicies by their last reconcile's Ready", ("ready",),
            namespace=ns, registry=self.registry,
        )  # fmt: skip
        build = {"version": __version__, "python": platform.python_version()}
        Info(
            "build", "The build: version, interpreter, commit (unknown when not recorded)",
            namespace=ns, registry=self.registry,
        ).info({**build, "commit": build_commit()})  # fmt: skip
        self._ready: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()
        for handler in HANDLERS:
            for result in RESULTS:
                self._runs.labels(handler=handler, result=result)
        for ready in ("true", "false"):
            self._policies.labels(ready=ready).set(0)

    @contextmanager
    def timed(self, handler: str) -> Iterator[dict[str, str]]:
        """Time one handler run; the caller sets ``["result"]`` in the yielded dict (an
        exception that escapes without one counts as ``error``)."""
        if handler not in HANDLERS:
            raise ValueError(f"unknown handler {handler!r}")
        started = time.perf_counter()
        run: dict[str, str] = {}
        try:
            yield run
        finally:
            result = run.get("result", "error")
            self._runs.labels(
                handler=handler, result=result if result in RESULTS else "error"
            ).inc()
            self._durations.labels(handler=handler).observe(time.perf_counter() - started)

    def policy_ready(self, namespace: str, name: str, ready: bool | None) -> None:
        """Record a policy's Ready after a reconcile; ``None``: the policy is gone."""
        with self._lock:
            if ready is None:
                self._ready.pop((namespace, name), None)
            else:
                self._ready[(namespace, name)] = ready
            ready_count = sum(1 for value in self._ready.values() if value)
            self._policies.labels(ready="true").set(ready_count)
            self._policies.labels(ready="false").set(len(self._ready) - ready_count)

    def runs(self, handler: str, result: str) -> float:
        """How many runs of ``handler`` ended with ``result`` (tests)."""
        value = self.registry.get_sample_value(
            "agentsafe_operator_reconciles_total", {"handler": handler, "result": result}
        )
        return 0.0 if value is None else float(value)

    def render(self) -> tuple[bytes, str]:
        """The OpenMetrics exposition and its content type."""
        body: bytes = generate_latest(self.registry)  # type: ignore[no-untyped-call]
        return body, CONTENT_TYPE_LATEST

    def serve(self, address: str, port: int) -> WSGIServer:
        """Serve ``/metrics`` on ``address:port`` in a daemon thread; the server (its
        ``server_port`` is the port bound, for 0; ``shutdown()`` stops it)."""
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        return server
