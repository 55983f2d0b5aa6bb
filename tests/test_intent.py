"""Intent capture: binding fields, bounds, re-hashing a presented intent."""

from __future__ import annotations

import copy

import pytest

from agentsafe.executor.clock import format_ms, parse_ms
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.intent import (
    MAX_ARRAY_LENGTH,
    MAX_DEPTH,
    MAX_ENTRIES,
    DownstreamTarget,
    capture_intent,
    check_json_bounds,
    intent_from_binding,
    intent_hash,
)
from agentsafe.executor.principals import Actor, legacy_principal
from agentsafe.executor.routes.refusals import status_of

TENANT = "00000000-0000-4000-8000-000000000001"
PRINCIPAL = legacy_principal(tenant_id=TENANT, actor=Actor("agent-1", "AI_AGENT", "demo"))
TARGET = DownstreamTarget("synthetic-bank", "payout", "POST /payouts")


def _capture(**overrides: object) -> object:
    args: dict[str, object] = {
        "principal": PRINCIPAL,
        "action": "create_payout",
        "resource": "payout:beneficiary-1",
        "parameters": {"amountMinor": 5000, "currency": "USD"},
        "idempotency_key": "payout-1-v1",
        "target": TARGET,
        "now": 1_800_000_000.0,
        "ttl_seconds": 60,
    }
    args.update(overrides)
    return capture_intent(**args)  # type: ignore[arg-type]


def test_binding_carries_configuration_not_request_identity() -> None:
    intent = _capture(correlation_id="run-1")
    binding = intent.binding  # type: ignore[attr-defined]
    assert binding["protocol_version"] == "agent-safe.intent/1"
    assert binding["tenant_id"] == TENANT
    assert binding["actor"] == {"id": "agent-1", "type": "AI_AGENT", "runtime": "demo"}
    assert binding["context"] == {"caller_principal": "legacy-caller", "correlation_id": "run-1"}
    assert binding["downstream_target"] == TARGET.as_binding()
    assert binding["expires_at"] == format_ms(1_800_000_060.0)
    assert intent.intent_hash == intent_hash(binding)  # type: ignore[attr-defined]


def test_presented_intent_is_rehashed_and_changes_are_visible() -> None:
    intent = _capture()
    again = intent_from_binding(copy.deepcopy(dict(intent.binding)))  # type: ignore[attr-defined]
    assert again.intent_hash == intent.intent_hash  # type: ignore[attr-defined]
    changed = copy.deepcopy(dict(intent.binding))  # type: ignore[attr-defined]
    changed["action"]["parameters"]["amountMinor"] = 5001
    assert intent_from_binding(changed).intent_hash != intent.intent_hash  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.pop("tenant_id"),
        lambda b: b.update(extra=1),
        lambda b: b.update(intent_id="not-a-uuid"),
        lambda b: b.update(intent_id=b["intent_id"] + "\n"),
        lambda b: b.update(intent_id=b["intent_id"].upper()),
        lambda b: b.update(captured_at="2026-01-01T00:00:00Z"),
        lambda b: b.update(protocol_version="agent-safe.intent/2"),
        lambda b: b["action"].update(extra=1),
    ],
)
def test_malformed_presented_intent_is_refused(mutate: object) -> None:
    binding = copy.deepcopy(dict(_capture().binding))  # type: ignore[attr-defined]
    mutate(binding)  # type: ignore[operator]
    with pytest.raises(RequestRejected) as info:
        intent_from_binding(binding)
    assert status_of(info.value.code) == 400


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_bounds_at_the_limit_and_one_past() -> None:
    check_json_bounds(_nested(MAX_DEPTH))
    with pytest.raises(RequestRejected) as info:
        check_json_bounds(_nested(MAX_DEPTH + 1))
    assert info.value.code == "REQUEST_TOO_DEEP"
    check_json_bounds([0] * MAX_ARRAY_LENGTH)
    with pytest.raises(RequestRejected):
        check_json_bounds([0] * (MAX_ARRAY_LENGTH + 1))
    check_json_bounds({str(i): i for i in range(MAX_ENTRIES)})
    with pytest.raises(RequestRejected):
        check_json_bounds({str(i): i for i in range(MAX_ENTRIES + 1)})


@pytest.mark.parametrize("key", ["__proto__", "prototype", "constructor"])
def test_prototype_keys_are_refused(key: str) -> None:
    with pytest.raises(RequestRejected) as info:
        check_json_bounds({"a": {key: 1}})
    assert "__proto__" not in info.value.message


def test_non_finite_and_unsafe_numbers_are_refused() -> None:
    for value in (float("nan"), float("inf"), 2**60):
        with pytest.raises(RequestRejected):
            check_json_bounds({"n": value})


def test_timestamps_round_trip() -> None:
    assert parse_ms(format_ms(1_800_000_000.123)) == pytest.approx(1_800_000_000.123)
    with pytest.raises(ValueError):
        parse_ms("2026-08-14T10:00:00Z")
