"""Intent capture: binding fields, bounds, re-hashing a presented intent."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

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


def test_the_downstream_environment_is_bound_only_when_configured() -> None:
    """DOWNSTREAM_ENVIRONMENT: the target gains ``environment`` and the hash covers it; without
    it the target's bytes are today's (the peer vectors, tests/conformance, still match)."""
    plain = _capture(intent_id="11111111-1111-4111-8111-111111111111")
    staged = _capture(
        intent_id="11111111-1111-4111-8111-111111111111",
        target=DownstreamTarget("synthetic-bank", "payout", "POST /payouts", "sandbox"),
    )
    assert plain.binding["downstream_target"] == {  # type: ignore[attr-defined]
        "system": "synthetic-bank",
        "operation": "payout",
        "endpoint": "POST /payouts",
    }
    assert staged.binding["downstream_target"]["environment"] == "sandbox"  # type: ignore[attr-defined]
    assert staged.intent_hash != plain.intent_hash  # type: ignore[attr-defined]
    # Presented back (an escalation, a reconciliation), it is re-hashed with the environment.
    again = intent_from_binding(copy.deepcopy(staged.binding))  # type: ignore[attr-defined]
    assert again.intent_hash == staged.intent_hash  # type: ignore[attr-defined]


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


def test_the_limits_are_the_public_contract() -> None:
    # The bounds are part of the wire contract (413/400 answers), not tunables: a changed value
    # must fail here, not only move the boundary the tests above probe (docs/mutation.md).
    from agentsafe.executor.intent import MAX_BODY_BYTES

    assert (MAX_BODY_BYTES, MAX_DEPTH, MAX_ENTRIES, MAX_ARRAY_LENGTH) == (102_400, 20, 5000, 1000)


def test_every_view_of_a_captured_intent() -> None:
    # Found by mutation testing: the views other modules read were checked only through them.
    import dataclasses

    from agentsafe.executor.intent import CapturedIntent, execution_payload_digest

    intent = _capture(intent_id="11111111-2222-4333-8444-555555555555")
    assert isinstance(intent, CapturedIntent)
    assert TARGET.as_binding() == {
        "system": "synthetic-bank",
        "operation": "payout",
        "endpoint": "POST /payouts",
    }
    assert intent.binding["downstream_target"] == {
        "system": "synthetic-bank",
        "operation": "payout",
        "endpoint": "POST /payouts",
    }
    assert intent.intent_id == "11111111-2222-4333-8444-555555555555"
    assert intent.tenant_id == TENANT
    assert intent.idempotency_key == "payout-1-v1"
    assert intent.action == "create_payout"
    assert intent.resource == "payout:beneficiary-1"
    assert intent.parameters == {"amountMinor": 5000, "currency": "USD"}
    assert intent.caller_principal == "legacy-caller"
    assert intent.captured_at == 1_800_000_000.0
    assert intent.expires_at == 1_800_000_060.0
    assert intent.expires_at_text == "2027-01-15T08:01:00.000Z"
    assert intent.payload_digest == execution_payload_digest(intent.parameters)
    assert intent.payload_digest == (
        "sha256:"
        + __import__("hashlib").sha256(b'{"amountMinor":5000,"currency":"USD"}').hexdigest()
    )
    no_context = CapturedIntent(binding={**intent.binding, "context": {}}, intent_hash="x")
    assert no_context.caller_principal is None
    for frozen in (intent, TARGET):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.intent_hash = "x"  # type: ignore[misc,union-attr]


def _code(value: object) -> str:
    with pytest.raises(RequestRejected) as info:
        check_json_bounds(value)
    return str(info.value.code)


def test_bounds_count_and_nest_across_lists_and_objects() -> None:
    # Found by mutation testing: entries add up over every container, lists nest like objects,
    # and scalars inside lists and at the top are checked too.
    half = MAX_ENTRIES // 2 + 1
    assert _code([{str(i): i for i in range(half)}, {str(i): i for i in range(half)}]) == (
        "REQUEST_TOO_LARGE"
    )
    check_json_bounds([{str(i): i for i in range(half - 2)}, {str(i): i for i in range(half - 2)}])
    listed: object = 1
    for _ in range(MAX_DEPTH):
        listed = [listed]
    check_json_bounds(listed)
    assert _code([listed]) == "REQUEST_TOO_DEEP"
    mixed: object = 1
    for level in range(MAX_DEPTH):
        mixed = [mixed] if level % 2 else {"a": mixed}
    check_json_bounds(mixed)
    assert _code({"a": mixed}) == "REQUEST_TOO_DEEP"
    for scalar in (float("nan"), 2**53):
        assert _code([scalar]) == "REQUEST_INVALID"
        assert _code(scalar) == "REQUEST_INVALID"
    assert _code({"a": {"constructor": 1}}) == "REQUEST_INVALID"


def test_the_largest_exact_integer_is_accepted() -> None:
    from agentsafe.executor.canonical import MAX_SAFE_INTEGER

    check_json_bounds({"n": MAX_SAFE_INTEGER, "m": -MAX_SAFE_INTEGER})
    assert _code({"n": MAX_SAFE_INTEGER + 1}) == "REQUEST_INVALID"


@pytest.mark.parametrize("missing", ["tenant_id", "actor"])
def test_a_principal_without_tenant_or_actor_cannot_propose(missing: str) -> None:
    import dataclasses

    principal = dataclasses.replace(PRINCIPAL, **{missing: None})
    with pytest.raises(RequestRejected) as info:
        _capture(principal=principal)
    assert info.value.code == "ROLE_FORBIDDEN"


def test_a_presented_intent_passes_the_json_bounds() -> None:
    binding = copy.deepcopy(dict(_capture().binding))  # type: ignore[attr-defined]
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = {"a": deep}
    binding["action"]["parameters"] = {"deep": deep}
    with pytest.raises(RequestRejected) as info:
        intent_from_binding(binding)
    assert info.value.code == "REQUEST_TOO_DEEP"


def test_only_the_proposer_may_present_its_intent() -> None:
    import dataclasses

    from agentsafe.executor.intent import CapturedIntent, check_intent_owner

    intent = _capture()
    check_intent_owner(PRINCIPAL, intent)  # type: ignore[arg-type]
    other = dataclasses.replace(PRINCIPAL, id="someone-else")
    for principal, presented in (
        (other, intent),
        (PRINCIPAL, CapturedIntent(binding={**intent.binding, "context": {}}, intent_hash="x")),  # type: ignore[attr-defined]
    ):
        with pytest.raises(RequestRejected) as info:
            check_intent_owner(principal, presented)  # type: ignore[arg-type]
        assert info.value.code == "INTENT_PRINCIPAL_MISMATCH"


def test_separation_of_duties_on_a_captured_intent() -> None:
    from agentsafe.executor.intent import check_separation
    from agentsafe.executor.principals import Principal, Role

    intent = _capture()

    def approver(pid: str, actor: str | None = None, role: Role = Role.APPROVER) -> Principal:
        return Principal(id=pid, role=role, actor=Actor(actor, "HUMAN") if actor else None)

    check_separation(approver("lead"), intent)  # type: ignore[arg-type]
    check_separation(approver("lead", actor="person-1"), intent)  # type: ignore[arg-type]
    refusals = [
        (approver("lead", role=Role.OPERATOR), "ROLE_FORBIDDEN"),
        (approver("lead", role=Role.PROPOSER), "ROLE_FORBIDDEN"),
        (approver("legacy-caller"), "SEPARATION_OF_DUTIES_VIOLATED"),  # the proposer's id
        (approver("agent-1"), "SEPARATION_OF_DUTIES_VIOLATED"),  # id is the proposer's actor
        (approver("lead", actor="agent-1"), "SEPARATION_OF_DUTIES_VIOLATED"),  # same actor
    ]
    for who, code in refusals:
        with pytest.raises(RequestRejected) as info:
            check_separation(who, intent)  # type: ignore[arg-type]
        assert info.value.code == code, who


def test_array_items_add_up_across_arrays() -> None:
    per = MAX_ARRAY_LENGTH - 1
    count = MAX_ENTRIES // per + 1  # every array is within bounds, together they are not
    assert _code({f"k{i}": [0] * per for i in range(count)}) == "REQUEST_TOO_LARGE"
    check_json_bounds({f"k{i}": [0] * per for i in range(MAX_ENTRIES // per - 1)})


# What each refusal says: the code is the contract, and the words go back to the caller in the
# refusal's body, so they name the rule broken and never the data (mutation testing, issue 23).


def _said(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(RequestRejected) as info:
        call()
    return (str(info.value.code), info.value.message)


def _presented(mutate: Callable[[dict[str, Any]], object]) -> Callable[[], object]:
    binding = copy.deepcopy(dict(_capture().binding))  # type: ignore[attr-defined]
    mutate(binding)
    return lambda: intent_from_binding(binding)


def test_what_each_bounds_refusal_says() -> None:
    cases: list[tuple[object, tuple[str, str]]] = [
        (_nested(MAX_DEPTH + 1), ("REQUEST_TOO_DEEP", "JSON nests deeper than 20")),
        ({"a": {"__proto__": 1}}, ("REQUEST_INVALID", "a forbidden key was supplied")),
        (
            [0] * (MAX_ARRAY_LENGTH + 1),
            ("REQUEST_TOO_LARGE", "an array holds more than 1000 items"),
        ),
        (
            {str(i): i for i in range(MAX_ENTRIES + 1)},
            ("REQUEST_TOO_LARGE", "JSON holds more than 5000 entries"),
        ),
        ({"n": float("inf")}, ("REQUEST_INVALID", "numbers must be finite")),
        ([2**53], ("REQUEST_INVALID", "an integer is outside the exact range")),
    ]
    for value, said in cases:
        assert _said(lambda value=value: check_json_bounds(value)) == said


def test_what_each_presented_intent_refusal_says() -> None:
    not_an_intent = ("REQUEST_INVALID", "the intent is not an agent-safe.intent/1")
    cases: list[tuple[Callable[[dict[str, Any]], object], tuple[str, str]]] = [
        (lambda b: b.pop("context"), not_an_intent),
        (lambda b: b["action"].update(extra=1), not_an_intent),
        (lambda b: b.update(actor="agent-1"), not_an_intent),
        (
            lambda b: b.update(protocol_version="agent-safe.intent/2"),
            ("REQUEST_INVALID", "unknown intent protocol version"),
        ),
        (lambda b: b.update(intent_id="x"), ("REQUEST_INVALID", "intent_id is not a UUIDv4")),
        (
            lambda b: b.update(expires_at="tomorrow"),
            ("REQUEST_INVALID", "intent timestamps are malformed"),
        ),
    ]
    for mutate, said in cases:
        assert _said(_presented(mutate)) == said
    assert _said(lambda: intent_from_binding([])) == not_an_intent


def test_what_each_principal_refusal_says() -> None:
    import dataclasses

    from agentsafe.executor.intent import check_intent_owner, check_separation
    from agentsafe.executor.principals import Principal, Role

    intent: Any = _capture()
    no_tenant = dataclasses.replace(PRINCIPAL, tenant_id=None)
    assert _said(lambda: _capture(principal=no_tenant)) == (
        "ROLE_FORBIDDEN",
        "this principal cannot propose",
    )
    other = dataclasses.replace(PRINCIPAL, id="someone-else")
    assert _said(lambda: check_intent_owner(other, intent)) == (
        "INTENT_PRINCIPAL_MISMATCH",
        "the intent belongs to another principal",
    )
    operator = Principal(id="lead", role=Role.OPERATOR)
    assert _said(lambda: check_separation(operator, intent)) == (
        "ROLE_FORBIDDEN",
        "only an approver may decide",
    )
    proposer = Principal(id="legacy-caller", role=Role.APPROVER)
    assert _said(lambda: check_separation(proposer, intent)) == (
        "SEPARATION_OF_DUTIES_VIOLATED",
        "an approver may not decide an intent it proposed",
    )


def test_separation_of_duties_compares_names_folded() -> None:
    """Issue 30, item 13: ``Mallory@Bank.example`` may not approve what ``mallory@bank.example``
    proposed (case, compatibility forms and default-ignorables folded)."""
    from agentsafe.executor.intent import check_separation
    from agentsafe.executor.principals import Principal, Role

    intent = _capture()  # proposed by "legacy-caller" whose actor is "agent-1"
    for pid, actor in [
        ("lead", "AGENT-1"),
        ("lead", "\uff41gent-1"),  # fullwidth a
        ("lead", "agent\u00ad-1"),  # a soft hyphen
        ("Legacy-Caller", None),
        ("lead", "LEGACY-CALLER"),
    ]:
        who = Principal(id=pid, role=Role.APPROVER, actor=Actor(actor, "HUMAN") if actor else None)
        with pytest.raises(RequestRejected) as info:
            check_separation(who, intent)  # type: ignore[arg-type]
        assert info.value.code == "SEPARATION_OF_DUTIES_VIOLATED", (pid, actor)
    # a look-alike of another script is another name here (the display marks it instead)
    other = Principal(id="lead", role=Role.APPROVER, actor=Actor("\u0430gent-1", "HUMAN"))
    check_separation(other, intent)  # type: ignore[arg-type]


def test_what_an_intent_reads_from_its_binding_is_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The payload digest and the timestamps are computed once per intent (issue 34: the
    grant, the claim, the seam and the evidence each ask), and are what a fresh reading gives."""
    from agentsafe.executor import intent as intent_module

    intent: Any = _capture()
    fresh = (
        intent_module.execution_payload_digest(intent.parameters),
        parse_ms(intent.binding["captured_at"]),
        parse_ms(intent.binding["expires_at"]),
    )
    calls: list[str] = []
    monkeypatch.setattr(
        intent_module,
        "execution_payload_digest",
        lambda parameters: calls.append("digest") or fresh[0],
    )
    monkeypatch.setattr(
        intent_module, "parse_ms", lambda text: calls.append("parse") or parse_ms(text)
    )
    for _ in range(3):
        assert (intent.payload_digest, intent.captured_at, intent.expires_at) == fresh
    assert calls == ["digest", "parse", "parse"]
