"""The executor's metrics, rendered as OpenMetrics text for ``GET /metrics`` (docs/monitoring.md).

Three kinds, each cheap where it is recorded:

- **Counters** (``agentsafe_*_total``): one ``inc`` where the event happens. Every counter has
  fixed label names and a bounded set of label values: a value outside the counter's known set
  (or, for open-ended names such as secret names, beyond a small cap of distinct values) is
  counted as ``OTHER``, so no caller can grow the exposition without bound. A scrape is counted
  (``agentsafe_metrics_scrapes_total``), never written as a chained line. Each counter keeps
  the labelled children prometheus_client gave it for label values it took as they are, so an
  increment does not resolve its labels again (``labels()`` was 1.3% of a BLOCK's CPU, issue
  34); the kept children are bounded as the series are, and values it did not take as they are
  (``OTHER``, or not exactly ``str``) go through ``labels()`` as before.
- **One latency histogram** (``agentsafe_request_duration_seconds``): one ``observe`` per request
  in ``routes/app.py``, by the route's template (a row of the route table, never the raw path),
  its method and the answer's outcome class (:data:`REQUEST_OUTCOMES`); its labelled children
  are kept as the counters' are (declared routes times outcomes at most), and the routes
  observe a kept one directly (:attr:`ExecutorMetrics.kept_durations`).
- **State gauges**, set at scrape time from a :class:`StateSnapshot` the control plane takes
  (halted, open and unknown attempts, pending escalations, journal bytes, whether the store
  answers, the seconds until each TLS certificate's ``notAfter``): nothing is recorded on the
  request path for them.
  ``agentsafe_build_info`` is 1 with the version, the interpreter and the commit (when known).

The registry is this object's own :class:`prometheus_client.CollectorRegistry`, never the global
one, so two executors in one test process never share a count.

Under ``EXECUTOR_WORKERS`` above 1 the supervisor gives every worker the same fresh, private
``PROMETHEUS_MULTIPROC_DIR`` (``host/workers.py``) before the worker imports prometheus_client:
counters and the histogram are then summed over every worker (a dead worker's counts stay, as
a counter's must), and :meth:`ExecutorMetrics.render` reads the whole group through
``MultiProcessCollector``, so a scrape that reaches any worker reports all of them. The state
gauges then follow each live worker (``live*`` modes: a dead worker's files are marked dead by
the supervisor): ``halted`` and ``pending_escalations`` the maximum, open and unknown attempts
and journal bytes the sum, ``store_available`` and certificate expiry the minimum; every worker
refreshes its own every few seconds (``plane.py``), the scraped one at the scrape.

Callers: ``door/door.py`` (refusals, locks), ``lifecycle/pipeline.py`` (proposals,
executions), ``host/halt.py``, ``host/tlsctx.py``, ``routes/app.py`` (request durations),
``routes/control.py`` (operator actions, and ``GET /metrics`` serves
:meth:`ExecutorMetrics.render` after :meth:`ExecutorMetrics.set_state`), ``plane.py`` (the
snapshot); ``assembly.py`` builds it and hands its
counters to the egress guard, the secret store, the posture monitor, the redactor
and the chained sinks. The label values of ``proposals`` and ``executions`` are the policy's
``Verdict`` and the seam's ``Outcome``: ``host/`` sits below both wings and cannot import them,
so ``assembly.py`` passes them in and there is no second copy here. Dropped trace spans
(``agentsafe_trace_spans_dropped_total``) are counted by the tracing module's export thread,
through the callback ``assembly.py`` gives it.
Also imported by ``tools/doctor.py``, ``operator/metrics.py``.
Also imported by ``lifecycle/outcomes.py``, ``lifecycle/recovery.py``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from .. import __version__
from ..codes import Code
from ..events import EventSink

__all__ = [
    "DURATION_BUCKETS",
    "MULTIPROC_ENV",
    "OTHER",
    "REQUEST_OUTCOMES",
    "BoundedCounter",
    "CountingSink",
    "ExecutorMetrics",
    "StateSnapshot",
    "build_commit",
    "outcome_of_status",
]

OTHER = "OTHER"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_NAME_VALUE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")

DOOR_METHODS = ("bearer", "workload", "mtls", "none")
DOOR_CODES = (
    Code.RATE_LIMITED,
    Code.AUTH_AMBIGUOUS,
    Code.AUTH_REQUIRED,
    Code.AUTH_FAILED,
    Code.PRINCIPAL_LOCKED,
    Code.ROLE_FORBIDDEN,
    Code.SCOPE_FORBIDDEN,
    Code.JWT_SIGNATURE_INVALID,
    Code.JWT_AUDIENCE_MISMATCH,
    Code.JWT_ISSUER_UNKNOWN,
    Code.JWT_EXPIRED,
    Code.JWT_ALGORITHM_REFUSED,
    Code.JWT_SUBJECT_UNKNOWN,
    Code.JWT_CLAIM_MISMATCH,
    Code.JWT_MALFORMED,
    Code.ACTION_NOT_PERMITTED_FOR_PRINCIPAL,
    Code.INTENT_PRINCIPAL_MISMATCH,
)
EGRESS_CODES = (
    Code.EGRESS_ORIGIN_NOT_ALLOWED,
    Code.EGRESS_SCHEME_NOT_ALLOWED,
    Code.EGRESS_PATH_NOT_ALLOWED,
    Code.EGRESS_ADDRESS_REFUSED,
    Code.EGRESS_TLS_REJECTED,
    Code.EGRESS_TLS_PIN_MISMATCH,
    Code.EGRESS_BODY_TOO_LARGE,
    Code.EGRESS_TIMEOUT,
    Code.EGRESS_REDIRECT_REFUSED,
    Code.EGRESS_RESPONSE_INVALID,
    Code.EGRESS_INIT_UNSUPPORTED,
)
#: Why a trace span was dropped: its queue was full, or its batch was not exported.
TRACE_DROP_REASONS = ("queue_full", "export_failed")
HALT_CAUSES = (
    "OPERATOR",
    "FILE",
    "AUTH_SPIKE",
    "EGRESS_SPIKE",
    "POSTURE_DRIFT",
    "CLOCK_SKEW",
    "JOURNAL",
    Code.EFFECT_MISMATCH.value,
    "CHAIN_HEADS",
    Code.STORE_LOST_WRITES.value,
)
CEILING_CODES = tuple(code.value for code in Code if code.value.startswith("HARD_LIMIT_"))
OPERATOR_ACTIONS = (
    "halt",
    "resume",
    "secrets.reload",
    "status",
    "open-attempts",
    "open-attempts.decision",
    "evidence",
)
STREAMS = ("evidence", "security")
VERDICT_OUTCOMES = ("ALLOW", "BLOCK", "ESCALATE")
"""The outcome of a request a decision answered: its verdict (``routes/app.py`` marks it)."""
REQUEST_OUTCOMES = (*VERDICT_OUTCOMES, "ok", "refused", "unavailable", "error")
"""The outcome label of a request's duration: a decision's verdict, else its answer's class
(2xx ``ok``, 4xx ``refused``, 503 ``unavailable``, any other 5xx ``error``)."""
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Seconds: a BLOCK answers in milliseconds; an ALLOW waits for the provider (its timeout is
``DOWNSTREAM_TIMEOUT_MS``), so the top buckets reach the longest dispatch."""
CERTIFICATES = ("serving", "client_ca")
INTEGRITY_FINDINGS = ("CHAIN_GAP", "JOURNAL_DAY_FILE_MISSING", "JOURNAL_TORN_LINE")
"""What start-up finds that an incident reader must see: a chain resumed past a crash (lines
a dead process may have written are not in the chain), a journal day file gone, a torn line."""


_GaugeMode = Literal["livemax", "livesum", "livemin"]
_STATE_GAUGES: tuple[tuple[str, str, _GaugeMode], ...] = (
    ("halted", "1 while the executor is halted (any cause), else 0", "livemax"),
    ("open_attempts", "Attempts the journal holds open", "livesum"),
    ("unknown_attempts", "Attempts whose outcome nobody knows now", "livesum"),
    ("pending_escalations", "Approval requests waiting for a decision", "livemax"),
    ("journal_bytes", "Bytes in the attempt journal's day files", "livesum"),
    ("store_available", "1 while the use store answers its ping, else 0", "livemin"),
)
"""The state gauges, and how each combines over ``EXECUTOR_WORKERS`` workers."""


def outcome_of_status(status: int) -> str:
    """The outcome class of an answer that carries no verdict."""
    if status == 503:
        return "unavailable"
    if status >= 500:
        return "error"
    if status >= 400:
        return "refused"
    return "ok"


def build_commit() -> str:
    """The commit this installation was built from, when the installer recorded one (a
    ``pip install`` from a VCS URL writes it into ``direct_url.json``); ``unknown`` otherwise."""
    try:
        text = metadata.distribution("agentsafe").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return "unknown"
    try:
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return "unknown"
    return (
        commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,64}", commit) else "unknown"
    )


@dataclass(frozen=True)
class StateSnapshot:
    """What the state gauges show, taken by the control plane when a scrape arrives."""

    halted: bool
    open_attempts: int
    unknown_attempts: int
    pending_escalations: int
    journal_bytes: int
    store_available: bool = True
    certificate_expiry_seconds: Mapping[str, float] = field(default_factory=dict)
    """``notAfter`` minus now, by certificate (:data:`CERTIFICATES`); absent: not configured."""


def _all_str(values: tuple[object, ...]) -> bool:
    """Every value exactly a ``str``: prometheus_client labels a series with ``str(value)``, which
    for a ``str`` subclass (an enum's member) may differ from the value a kept child was found
    by, so only exact strings find or keep a child. (A loop: ``all()`` of a generator costs
    four times as much on the one or three labels here.)"""
    for value in values:  # noqa: SIM110
        if type(value) is not str:
            return False
    return True


class BoundedCounter:
    """A labelled counter whose label values come from a closed set or a capped open set."""

    def __init__(
        self,
        counter: Counter,
        *,
        registry: CollectorRegistry,
        sample_name: str,
        label_names: tuple[str, ...],
        allowed: dict[str, tuple[str, ...] | None],
        open_cap: int = 32,
    ) -> None:
        self._counter = counter
        self._registry = registry
        self._sample_name = sample_name
        self._label_names = label_names
        self._allowed = {name: frozenset(values) for name, values in allowed.items() if values}
        self._open_cap = open_cap
        self._seen: dict[str, set[str]] = {n: set() for n in label_names if n not in self._allowed}
        self._lock = threading.Lock()
        self._label_set = frozenset(label_names)
        # The labelled child of each tuple of label values taken as they are (every one exactly
        # a ``str`` its bound left unchanged): at most the closed sets' product times the open
        # sets' caps, so bounded as the series are. ``labels()`` would return the same child.
        self._children: dict[tuple[str, ...], Any] = {}

    def _bound(self, name: str, value: str) -> str:
        allowed = self._allowed.get(name)
        if allowed is not None:
            return value if value in allowed else OTHER
        if not isinstance(value, str) or not _NAME_VALUE.match(value):
            return OTHER
        with self._lock:
            seen = self._seen[name]
            if value in seen:
                return value
            if len(seen) >= self._open_cap:
                return OTHER
            seen.add(value)
            return value

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if labels.keys() != self._label_set:
            raise TypeError(f"labels must be exactly {self._label_names}")
        if not self._label_names:
            self._counter.inc(amount)
            return
        key = tuple([labels[name] for name in self._label_names])
        child = self._children.get(key) if _all_str(key) else None
        if child is None:
            bounded = {name: self._bound(name, labels[name]) for name in self._label_names}
            child = self._counter.labels(**bounded)
            if _all_str(key) and tuple(bounded.values()) == key:
                self._children[key] = child
        child.inc(amount)

    def value(self, **labels: str) -> float:
        """The current count (tests and the status route)."""
        value = self._registry.get_sample_value(self._sample_name, dict(labels))
        return 0.0 if value is None else float(value)


class ExecutorMetrics:
    """The executor's counters in a private registry. ``verdicts`` and ``outcomes`` are the
    label values of ``proposals`` and ``executions`` (``policy.Verdict``, ``seam.Outcome``)."""

    def __init__(
        self, *, verdicts: Iterable[str], outcomes: Iterable[str], namespace: str = "agentsafe"
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._ns = namespace
        # Read by prometheus_client at its import: set by the supervisor, never changed later.
        self.multiprocess_dir = os.environ.get(MULTIPROC_ENV) or None
        self.proposals = self._counter(
            "proposals", "Proposals by the authority's verdict", verdict=map(str, verdicts)
        )
        self.executions = self._counter(
            "executions", "Executions by outcome", outcome=map(str, outcomes)
        )
        self.door_refusals = self._counter(
            "door_refusals", "Refusals at the door by method and code",
            method=DOOR_METHODS, code=DOOR_CODES,
        )  # fmt: skip
        self.egress_refusals = self._counter(
            "egress_refusals", "Outbound requests refused by code", code=EGRESS_CODES
        )
        self.halts = self._counter("halts", "Halts by cause", cause=HALT_CAUSES)
        self.ceiling_refusals = self._counter(
            "ceiling_refusals", "Refusals by the host ceilings by code", code=CEILING_CODES
        )
        self.effect_mismatches = self._counter(
            "effect_mismatches", "Observed effects (or receipts) that were not the authorised one"
        )
        self.principals_locked = self._counter("principals_locked", "Principal locks placed")
        self.operator_actions = self._counter(
            "operator_actions", "Operator actions by action", action=OPERATOR_ACTIONS
        )
        self.secret_rotations = self._counter(
            "secret_rotations", "Secret rotations by secret name", name=None
        )
        self.posture_drift = self._counter("posture_drift", "Posture drift by check", check=None)
        self.redactions = self._counter("redactions", "Lines in which a redaction was made")
        self.tls_rotations = self._counter("tls_context_rotations", "TLS context rotations")
        self.chained_lines = self._counter(
            "chained_lines", "Chained lines written by stream", stream=STREAMS
        )
        self.scrapes = self._counter("metrics_scrapes", "Scrapes of GET /metrics")
        self.trace_spans_dropped = self._counter(
            "trace_spans_dropped",
            "Trace spans dropped, never exported (queue full, or the collector failed)",
            reason=TRACE_DROP_REASONS,
        )
        for reason in TRACE_DROP_REASONS:  # every series from the start: an increase over 0
            self.trace_spans_dropped.inc(0, reason=reason)
        self.integrity_findings = self._counter(
            "evidence_integrity_findings",
            "Gaps found in the evidence chain or the journal, by finding",
            finding=INTEGRITY_FINDINGS,
        )
        for finding in INTEGRITY_FINDINGS:  # every series from the start: an increase over 0
            self.integrity_findings.inc(0, finding=finding)
        self._durations = Histogram(
            "request_duration_seconds",
            "Request durations by route template, method and outcome",
            labelnames=("route", "method", "outcome"),
            namespace=namespace,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._routes: frozenset[tuple[str, str]] = frozenset()
        self._outcomes = frozenset(REQUEST_OUTCOMES)
        # (method, route, outcome) taken as they are -> the histogram's child (routes x outcomes)
        self._duration_children: dict[tuple[str, str, str], Any] = {}
        self._state_gauges = {
            name: Gauge(
                name, doc, namespace=namespace, registry=self.registry, multiprocess_mode=mode
            )
            for name, doc, mode in _STATE_GAUGES
        }
        self._expiry = Gauge(
            "tls_certificate_expiry_seconds",
            "Seconds until the certificate's notAfter (negative: expired)",
            labelnames=("certificate",),
            namespace=namespace,
            registry=self.registry,
            multiprocess_mode="livemin",
        )
        self._build = Info(
            "build",
            "The build: version, interpreter, commit (unknown when not recorded)",
            namespace=namespace,
            registry=self.registry,
        )
        self._build.info(
            {"version": __version__, "python": platform.python_version(), "commit": build_commit()}
        )

    def _counter(
        self, metric_name: str, documentation: str, /, **labels: Iterable[str] | None
    ) -> BoundedCounter:
        label_names = tuple(labels)
        counter = Counter(
            metric_name, documentation, labelnames=label_names, namespace=self._ns,
            registry=self.registry,
        )  # fmt: skip
        allowed = {k: (tuple(v) if v is not None else None) for k, v in labels.items()}
        return BoundedCounter(
            counter,
            registry=self.registry,
            sample_name=f"{self._ns}_{metric_name}_total",
            label_names=label_names,
            allowed=allowed,
        )

    def declare_routes(self, routes: Iterable[tuple[str, str]]) -> None:
        """The (method, route template) pairs durations may be recorded for (the route table)."""
        self._routes = frozenset(routes)
        self._duration_children.clear()  # a route no longer declared is OTHER from now on

    @property
    def kept_durations(self) -> Mapping[tuple[str, str, str], Any]:
        """The histogram's children :meth:`observe_request` kept, by (method, route, outcome)
        taken as they are (exact strings only). ``routes/app.py`` observes a kept child itself,
        so a request whose labels were seen before makes no call here (issue 32). Live: it
        follows every later observation, and :meth:`declare_routes` empties it."""
        return self._duration_children

    def observe_request(self, method: str, route: str, outcome: str, seconds: float) -> None:
        """One request's duration (``routes/app.py``, the first time it sees these labels, see
        :attr:`kept_durations`); an undeclared route or outcome is ``OTHER``, so the label set
        stays the table's."""
        key = (method, route, outcome)
        child = self._duration_children.get(key) if _all_str(key) else None
        if child is None:
            if (method, route) not in self._routes:
                method, route = OTHER, OTHER
            if outcome not in self._outcomes:
                outcome = OTHER
            child = self._durations.labels(route=route, method=method, outcome=outcome)
            if _all_str(key) and (method, route, outcome) == key:
                self._duration_children[key] = child
        child.observe(seconds)

    def request_count(self, method: str, route: str, outcome: str) -> float:
        """How many durations were recorded for these labels (tests)."""
        value = self.registry.get_sample_value(
            f"{self._ns}_request_duration_seconds_count",
            {"route": route, "method": method, "outcome": outcome},
        )
        return 0.0 if value is None else float(value)

    def set_state(self, state: StateSnapshot) -> None:
        """Set the state gauges from a snapshot (the metrics route, just before rendering)."""
        gauges = self._state_gauges
        gauges["halted"].set(1 if state.halted else 0)
        gauges["open_attempts"].set(state.open_attempts)
        gauges["unknown_attempts"].set(state.unknown_attempts)
        gauges["pending_escalations"].set(state.pending_escalations)
        gauges["journal_bytes"].set(state.journal_bytes)
        gauges["store_available"].set(1 if state.store_available else 0)
        for name in CERTIFICATES:
            seconds = state.certificate_expiry_seconds.get(name)
            if seconds is None:
                # (a multiprocess gauge cannot be removed; an unconfigured one is never set)
                if self.multiprocess_dir is None and self._has_expiry(name):
                    self._expiry.remove(name)
            else:
                self._expiry.labels(certificate=name).set(seconds)

    def _has_expiry(self, name: str) -> bool:
        sample = f"{self._ns}_tls_certificate_expiry_seconds"
        return self.registry.get_sample_value(sample, {"certificate": name}) is not None

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type: this process's registry, or under
        ``EXECUTOR_WORKERS`` every worker's files (and this build's info).

        The format follows the scraper's ``Accept`` header exactly as prometheus_client's own
        exporters negotiate it (``choose_encoder``): OpenMetrics when the scraper asks for
        ``application/openmetrics-text`` (Prometheus does), otherwise the classic text format
        0.0.4, which ``promtool check metrics`` and older scrapers read."""
        registry = self.registry
        if self.multiprocess_dir is not None:
            registry = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            registry.register(self._build)
        encoder, content_type = choose_encoder(accept or "")
        body: bytes = encoder(registry)
        return body, content_type


class CountingSink:
    """Counts the chained lines each stream writes (``agentsafe_chained_lines_total``): wraps
    the stream's chained sink (``assembly.py``)."""

    def __init__(self, sink: EventSink, metrics: ExecutorMetrics, stream: str) -> None:
        self._sink = sink
        self._metrics = metrics
        self._stream = stream

    def emit(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        self._sink.emit(event, fields)
        self._metrics.chained_lines.inc(stream=self._stream)
