"""host/metrics.py keeps each counter's (and the duration histogram's) labelled children (issue
34): the exposition is held to the code that resolved the labels on every increment.

The oracle is that code, kept here: ``_inc_by_labels`` and ``_observe_by_labels`` are
``BoundedCounter.inc`` and ``ExecutorMetrics.observe_request`` as they were, applied to a second
``ExecutorMetrics``; the same operations on both must render the same bytes in both formats
(less the ``_created`` samples, the wall-clock time a series was created at, which differs
between two registries by construction: a kept child was created by the same first increment
as before).
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsafe.executor.codes import Code
from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.host.metrics import (
    OTHER,
    REQUEST_OUTCOMES,
    BoundedCounter,
    ExecutorMetrics,
)
from agentsafe.executor.policy.policy import Verdict

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
ROUTES = (("POST", "/v1/actions"), ("GET", "/v1/approvals/{request_id}"), ("GET", "/healthz"))


def _inc_by_labels(counter: BoundedCounter, amount: float = 1.0, **labels: Any) -> None:
    """``BoundedCounter.inc`` before issue 34: ``labels()`` resolved on every increment."""
    if set(labels) != set(counter._label_names):
        raise TypeError(f"labels must be exactly {counter._label_names}")
    if not counter._label_names:
        counter._counter.inc(amount)
        return
    bounded = {name: counter._bound(name, labels[name]) for name in counter._label_names}
    counter._counter.labels(**bounded).inc(amount)


def _observe_by_labels(
    metrics: ExecutorMetrics, method: Any, route: Any, outcome: Any, seconds: float
) -> None:
    """``ExecutorMetrics.observe_request`` before issue 34."""
    if (method, route) not in metrics._routes:
        method, route = OTHER, OTHER
    if outcome not in metrics._outcomes:
        outcome = OTHER
    metrics._durations.labels(route=route, method=method, outcome=outcome).observe(seconds)


class _MixedCode(str, Enum):  # noqa: UP042 - the mixin's str() is the point
    """A ``str`` mixin enum: ``str()`` of a member is ``_MixedCode.X``, not its value, so
    prometheus_client labels it differently from the equal string ``"EGRESS_TIMEOUT"``."""

    EGRESS_TIMEOUT = "EGRESS_TIMEOUT"


class _Stream(StrEnum):
    evidence = "evidence"


def _metrics() -> ExecutorMetrics:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    metrics.declare_routes(ROUTES)
    return metrics


def _exposition(metrics: ExecutorMetrics) -> list[bytes]:
    out = []
    for accept in (OPENMETRICS, None):
        body, _ = metrics.render(accept)
        out.append(b"\n".join(line for line in body.split(b"\n") if b"_created" not in line))
    return out


_COUNTERS = (
    "proposals",
    "executions",
    "door_refusals",
    "egress_refusals",
    "halts",
    "chained_lines",
    "secret_rotations",
    "posture_drift",
    "redactions",
    "operator_actions",
)
_ODD = [OTHER, "", "has space", Code.EGRESS_TIMEOUT, _MixedCode.EGRESS_TIMEOUT, _Stream.evidence]


def _values(counter: BoundedCounter, name: str) -> st.SearchStrategy[Any]:
    """A label's values: mostly two or three of its known set (so that children are found
    again and neighbours differ by one label), else anything."""
    known = sorted(counter._allowed.get(name, ()))[:3] or ["SECRET_A", "SECRET_B", "CHECK"]
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(_ODD),
        st.text(alphabet="ABCDEFGHIJ_", min_size=1, max_size=3),  # open sets, past their cap
    )


def _increment(name: str) -> st.SearchStrategy[tuple[Any, ...]]:
    counter: BoundedCounter = getattr(_metrics(), name)
    labels = st.tuples(*(_values(counter, label) for label in counter._label_names))
    return st.tuples(st.just("inc"), st.just(name), st.sampled_from([1.0, 0.0, 2.5]), labels)


_INCREMENT = st.sampled_from(_COUNTERS).flatmap(_increment)
_OBSERVE = st.tuples(
    st.just("observe"),
    st.sampled_from([*ROUTES, ("GET", "/v1/actions"), ("DELETE", "/x")]),
    st.sampled_from([*REQUEST_OUTCOMES, "weird"]),
    st.floats(min_value=0.0, max_value=40.0),
)


def _apply(metrics: ExecutorMetrics, operation: tuple[Any, ...], *, oracle: bool) -> str:
    """One operation, on the code under test or the oracle; what it raised, if anything."""
    try:
        if operation[0] == "inc":
            _, name, amount, values = operation
            counter: BoundedCounter = getattr(metrics, name)
            labels = dict(zip(counter._label_names, values, strict=True))
            if oracle:
                _inc_by_labels(counter, amount, **labels)
            else:
                counter.inc(amount, **labels)
        else:
            _, (method, route), outcome, seconds = operation
            if oracle:
                _observe_by_labels(metrics, method, route, outcome, seconds)
            else:
                metrics.observe_request(method, route, outcome, seconds)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_INCREMENT, _OBSERVE), max_size=60))
def test_kept_children_render_what_labels_per_increment_rendered(
    operations: list[tuple[Any, ...]],
) -> None:
    kept, oracle = _metrics(), _metrics()
    for operation in operations:
        # every operation twice: the second finds the child the first kept
        for _ in range(2):
            assert _apply(kept, operation, oracle=False) == _apply(oracle, operation, oracle=True)
    assert _exposition(kept) == _exposition(oracle)


def test_a_mixin_enum_member_is_labelled_as_before_not_as_the_equal_string() -> None:
    kept, oracle = _metrics(), _metrics()
    for metrics, inc in ((kept, BoundedCounter.inc), (oracle, _inc_by_labels)):
        inc(metrics.egress_refusals, code="EGRESS_TIMEOUT")
        inc(metrics.egress_refusals, code=_MixedCode.EGRESS_TIMEOUT)
    assert _exposition(kept) == _exposition(oracle)
    assert kept.egress_refusals.value(code="_MixedCode.EGRESS_TIMEOUT") == 1


def test_kept_children_stay_bounded() -> None:
    metrics = _metrics()
    for n in range(500):
        metrics.door_refusals.inc(method=f"m{n}", code=f"C{n}")
        metrics.secret_rotations.inc(name=f"SECRET_{n}")
        metrics.observe_request("GET", f"/raw/{n}", "ok", 0.01)
        metrics.observe_request("POST", "/v1/actions", f"outcome-{n}", 0.01)
    assert metrics.door_refusals._children == {}  # every one was OTHER
    assert len(metrics.secret_rotations._children) == 32  # the open set's cap
    assert metrics._duration_children == {}


def test_a_route_no_longer_declared_is_other_again() -> None:
    metrics = _metrics()
    metrics.observe_request("POST", "/v1/actions", "ALLOW", 0.01)
    metrics.declare_routes([("GET", "/healthz")])
    metrics.observe_request("POST", "/v1/actions", "ALLOW", 0.01)
    assert metrics.request_count("POST", "/v1/actions", "ALLOW") == 1
    assert metrics.request_count(OTHER, OTHER, "ALLOW") == 1


@pytest.mark.parametrize("labels", [{}, {"cause": "FILE", "extra": "x"}, {"reason": "FILE"}])
def test_label_names_are_still_checked_first(labels: dict[str, str]) -> None:
    metrics = _metrics()
    metrics.halts.inc(cause="FILE")  # a kept child for FILE
    with pytest.raises(TypeError, match="labels must be exactly"):
        metrics.halts.inc(**labels)
