"""Counters: fixed label names, bounded label values, OpenMetrics exposition."""

from __future__ import annotations

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.host.metrics import ExecutorMetrics, StateSnapshot, outcome_of_status
from agentsafe.executor.policy.policy import Verdict

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def test_two_instances_do_not_share_counts() -> None:
    a, b = (
        ExecutorMetrics(verdicts=Verdict, outcomes=Outcome),
        ExecutorMetrics(verdicts=Verdict, outcomes=Outcome),
    )
    a.proposals.inc(verdict="ALLOW")
    assert a.proposals.value(verdict="ALLOW") == 1
    assert b.proposals.value(verdict="ALLOW") == 0


def test_unknown_label_values_collapse_to_other() -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    for i in range(100):
        metrics.door_refusals.inc(method="bearer", code=f"ATTACKER_{i}")
    metrics.door_refusals.inc(method="telepathy", code="AUTH_FAILED")
    assert metrics.door_refusals.value(method="bearer", code="OTHER") == 100
    assert metrics.door_refusals.value(method="OTHER", code="AUTH_FAILED") == 1


def test_open_label_sets_are_capped() -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    for i in range(40):
        metrics.secret_rotations.inc(name=f"SECRET_{i}")
    metrics.secret_rotations.inc(name="has spaces and <html>")
    assert metrics.secret_rotations.value(name="SECRET_0") == 1
    assert metrics.secret_rotations.value(name="OTHER") == 40 - 32 + 1


def test_label_names_are_fixed() -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    with pytest.raises(TypeError):
        metrics.halts.inc(cause="FILE", extra="x")
    with pytest.raises(TypeError):
        metrics.halts.inc()


def test_render_is_parseable_openmetrics() -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    metrics.proposals.inc(verdict="BLOCK")
    metrics.executions.inc(outcome="COMPLETED")
    metrics.door_refusals.inc(method="workload", code="JWT_EXPIRED")
    metrics.egress_refusals.inc(code="EGRESS_TIMEOUT")
    metrics.halts.inc(cause="OPERATOR")
    metrics.principals_locked.inc()
    metrics.operator_actions.inc(action="halt")
    metrics.posture_drift.inc(check="ROOT_WRITABLE")
    metrics.redactions.inc()
    metrics.tls_rotations.inc()
    metrics.chained_lines.inc(stream="security")
    body, content_type = metrics.render(OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("agentsafe_proposals_total", (("verdict", "BLOCK"),))] == 1
    assert (
        samples[
            ("agentsafe_door_refusals_total", (("code", "JWT_EXPIRED"), ("method", "workload")))
        ]
        == 1
    )
    assert samples[("agentsafe_principals_locked_total", ())] == 1
    assert samples[("agentsafe_tls_context_rotations_total", ())] == 1
    assert samples[("agentsafe_chained_lines_total", (("stream", "security"),))] == 1


def test_proposal_and_execution_labels_are_the_verdicts_and_outcomes() -> None:
    """The label sets come from policy.Verdict and seam.Outcome (passed in by assembly); the
    exposed values stay exactly these."""
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    verdicts = ("ALLOW", "BLOCK", "ESCALATE")
    outcomes = (
        "COMPLETED",
        "BLOCKED",
        "FAILED_BEFORE_DISPATCH",
        "UNKNOWN_AFTER_DISPATCH",
        "DEFINITELY_NOT_EXECUTED",
        "ESCALATE_PENDING",
    )
    for verdict in (*verdicts, "MAYBE"):
        metrics.proposals.inc(verdict=verdict)
    for outcome in (*outcomes, "OBSERVED"):
        metrics.executions.inc(outcome=outcome)
    assert all(metrics.proposals.value(verdict=v) == 1 for v in (*verdicts, "OTHER"))
    assert all(metrics.executions.value(outcome=o) == 1 for o in (*outcomes, "OTHER"))
    body, _ = metrics.render()
    assert b'agentsafe_proposals_total{verdict="ALLOW"} 1.0' in body
    assert b'agentsafe_executions_total{outcome="ESCALATE_PENDING"} 1.0' in body


def test_durations_are_labelled_only_by_declared_routes_and_known_outcomes() -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    metrics.declare_routes([("POST", "/v1/actions"), ("GET", "/approve/{request_id}")])
    metrics.observe_request("POST", "/v1/actions", "ALLOW", 0.02)
    metrics.observe_request("GET", "/approve/{request_id}", "ok", 0.001)
    metrics.observe_request("GET", "/approve/req-123", "ok", 0.001)  # a raw path: never a label
    metrics.observe_request("POST", "/v1/actions", "<script>", 0.001)
    assert metrics.request_count("POST", "/v1/actions", "ALLOW") == 1
    assert metrics.request_count("GET", "/approve/{request_id}", "ok") == 1
    assert metrics.request_count("OTHER", "OTHER", "ok") == 1
    assert metrics.request_count("POST", "/v1/actions", "OTHER") == 1
    body = metrics.render()[0].decode()
    assert "req-123" not in body
    assert "<script>" not in body


def test_state_gauges_follow_each_snapshot() -> None:
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)

    def gauges() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = metrics.render(OPENMETRICS)[0].decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            if family.type == "gauge"
            for s in family.samples
        }

    metrics.set_state(
        StateSnapshot(
            halted=True,
            open_attempts=3,
            unknown_attempts=2,
            pending_escalations=4,
            journal_bytes=1234,
            store_available=False,
            certificate_expiry_seconds={"serving": 86400.0, "client_ca": -5.0},
        )
    )
    first = gauges()
    assert first[("agentsafe_halted", ())] == 1
    assert first[("agentsafe_open_attempts", ())] == 3
    assert first[("agentsafe_unknown_attempts", ())] == 2
    assert first[("agentsafe_pending_escalations", ())] == 4
    assert first[("agentsafe_journal_bytes", ())] == 1234
    assert first[("agentsafe_store_available", ())] == 0
    expiry = "agentsafe_tls_certificate_expiry_seconds"
    assert first[(expiry, (("certificate", "serving"),))] == 86400
    assert first[(expiry, (("certificate", "client_ca"),))] == -5
    metrics.set_state(
        StateSnapshot(
            halted=False,
            open_attempts=0,
            unknown_attempts=0,
            pending_escalations=0,
            journal_bytes=0,
            certificate_expiry_seconds={"serving": 100.0},
        )
    )
    second = gauges()
    assert second[("agentsafe_halted", ())] == 0
    assert second[("agentsafe_store_available", ())] == 1
    assert second[(expiry, (("certificate", "serving"),))] == 100
    # A certificate no longer configured leaves the exposition rather than keep its old value.
    assert (expiry, (("certificate", "client_ca"),)) not in second


def test_outcome_classes_by_status() -> None:
    assert [outcome_of_status(s) for s in (200, 201, 401, 409, 413, 500, 503)] == [
        "ok", "ok", "refused", "refused", "refused", "error", "unavailable",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("accept", "media_type"),
    [
        (None, "text/plain"),
        ("text/plain", "text/plain"),
        ("*/*", "text/plain"),
        (OPENMETRICS, "application/openmetrics-text"),
        (
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            "application/openmetrics-text",
        ),
    ],
)
def test_the_exposition_follows_the_scrapers_accept_header(
    accept: str | None, media_type: str
) -> None:
    """``promtool check metrics`` and older scrapers ask for the text format (or nothing) and
    cannot read OpenMetrics' ``info`` type: they get text 0.0.4; Prometheus asks for
    OpenMetrics and gets it (the negotiation is prometheus_client's own)."""
    from prometheus_client.parser import text_string_to_metric_families as text_families

    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    metrics.proposals.inc(verdict="ALLOW")
    body, content_type = metrics.render(accept)
    assert content_type.split(";")[0] == media_type
    if media_type == "text/plain":
        assert "version=0.0.4" in content_type
        assert not body.endswith(b"# EOF\n")
        families = {f.name: f.type for f in text_families(body.decode())}
        assert families["agentsafe_build_info"] == "gauge"  # OpenMetrics' info, as text reads it
        assert b"# TYPE agentsafe_build_info info" not in body
    else:
        assert body.endswith(b"# EOF\n")
        families = {f.name: f.type for f in text_string_to_metric_families(body.decode())}
        assert families["agentsafe_build"] == "info"
