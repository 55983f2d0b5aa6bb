"""The executor's counters, rendered as OpenMetrics text for ``GET /metrics``.

Every counter has fixed label names and a bounded set of label values: a value outside the
counter's known set (or, for open-ended names such as secret names, beyond a small cap of
distinct values) is counted as ``OTHER``, so no caller can grow the exposition without bound.
The registry is this object's own :class:`prometheus_client.CollectorRegistry`, never the global
one, so two executors in one test process never share a count.

Callers: ``door/door.py`` (refusals, locks), ``lifecycle/pipeline.py`` (proposals,
executions), ``host/halt.py``, ``host/tlsctx.py``, ``routes/control.py`` (operator actions, and
``GET /metrics`` serves :meth:`ExecutorMetrics.render`); ``assembly.py`` builds it and hands its
counters to the egress guard, the secret store, the posture monitor, the redactor
and the chained sinks. The label values of ``proposals`` and ``executions`` are the policy's
``Verdict`` and the seam's ``Outcome``: ``host/`` sits below both wings and cannot import them,
so ``assembly.py`` passes them in and there is no second copy here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..codes import Code

__all__ = ["OTHER", "BoundedCounter", "ExecutorMetrics"]

OTHER = "OTHER"
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
HALT_CAUSES = (
    "OPERATOR",
    "FILE",
    "AUTH_SPIKE",
    "EGRESS_SPIKE",
    "POSTURE_DRIFT",
    "CLOCK_SKEW",
    Code.EFFECT_MISMATCH.value,
)
CEILING_CODES = tuple(code.value for code in Code if code.value.startswith("HARD_LIMIT_"))
OPERATOR_ACTIONS = (
    "halt",
    "resume",
    "secrets.reload",
    "status",
    "open-attempts",
    "metrics",
    "evidence",
)
STREAMS = ("evidence", "security")


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
        if set(labels) != set(self._label_names):
            raise TypeError(f"labels must be exactly {self._label_names}")
        if not self._label_names:
            self._counter.inc(amount)
            return
        bounded = {name: self._bound(name, labels[name]) for name in self._label_names}
        self._counter.labels(**bounded).inc(amount)

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

    def render(self) -> tuple[bytes, str]:
        """The OpenMetrics exposition and its content type."""
        body: bytes = generate_latest(self.registry)  # type: ignore[no-untyped-call]
        return body, CONTENT_TYPE_LATEST
