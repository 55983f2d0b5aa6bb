"""The JSON precondition and the limits: exact types only, no user code runs, and every bound
accepts its limit and refuses one past it."""

from __future__ import annotations

from collections import OrderedDict, UserDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.plans import AGENT_SAFETY_HARD_LIMITS, AgentSafetyError, FrozenDict, thaw
from agentsafe.executor.plans.policy import PlanPolicy
from agentsafe.executor.plans.snapshot import Budget, freeze

from . import support as s


def _budget(**kw: int) -> Budget:
    base = {"nodes": 10_000, "depth": 10, "containers": 1_000, "bytes": 100_000}
    base.update(kw)
    return Budget(**base)


class Exploding(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: Any) -> Any:
        raise AssertionError("user code ran")

    def items(self) -> Any:
        raise AssertionError("user code ran")

    def keys(self) -> Any:
        raise AssertionError("user code ran")


class Property:
    @property
    def value(self) -> Any:
        raise AssertionError("user code ran")


class StrSub(str):
    pass


class IntSub(int):
    pass


@pytest.mark.parametrize(
    "value",
    [
        Exploding(a=1),
        UserDict(a=1),
        OrderedDict(a=1),
        Property(),
        StrSub("x"),
        IntSub(1),
        {StrSub("k"): 1},
        {1: "int key"},
        [Exploding()],
        {"a": (1, Property())},
        b"bytes",
        {1, 2},
        float("inf"),
        float("nan"),
        2**53,
        "\ud800",
    ],
)
def test_non_plain_values_are_refused_without_running_user_code(value: Any) -> None:
    with pytest.raises(AgentSafetyError) as caught:
        freeze(value, _budget())
    assert caught.value.code in {"JSON_TYPE_REFUSED", "JSON_NUMBER_INVALID", "JSON_INVALID"}


def test_snapshot_is_deep_and_immutable() -> None:
    source: dict[str, Any] = {"a": [1, {"b": "c"}]}
    frozen = freeze(source, _budget())
    source["a"][1]["b"] = "changed"
    assert frozen["a"][1]["b"] == "c"
    assert type(frozen) is FrozenDict
    assert type(frozen["a"]) is tuple
    with pytest.raises(TypeError):
        FrozenDict({"a": 1})  # only freeze() makes one
    with pytest.raises(AttributeError):
        frozen._data = {}  # type: ignore[misc]


def test_plan_with_a_subclass_inside_is_refused_by_the_dry_run() -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    plan = s.plan()
    plan["steps"][0]["source"] = Exploding(plan["steps"][0]["source"])
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(plan, s.policy(), now=s.NOW)
    assert caught.value.code == "JSON_TYPE_REFUSED"


@pytest.mark.parametrize(
    ("limit", "make", "code"),
    [
        ("depth", lambda n: _nest(n), "JSON_TOO_DEEP"),
        ("nodes", lambda n: list(range(n - 1)), "JSON_TOO_MANY_NODES"),
        ("containers", lambda n: [[] for _ in range(n - 1)], "JSON_TOO_MANY_CONTAINERS"),
    ],
)
def test_structure_limits_at_and_one_past(limit: str, make: Any, code: str) -> None:
    n = 6
    freeze(make(n), _budget(**{limit: n}))
    with pytest.raises(AgentSafetyError) as caught:
        freeze(make(n + 1), _budget(**{limit: n}))
    assert caught.value.code == code


def _nest(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_byte_budget_counts_keys_and_values_cumulatively() -> None:
    value = {"ab": "cdé"}  # 2 braces + 2 key bytes + 4 value bytes
    freeze(value, _budget(bytes=8))
    with pytest.raises(AgentSafetyError):
        freeze(value, _budget(bytes=7))
    budget = _budget(bytes=16)
    freeze(value, budget)
    freeze(value, budget)  # 16 spent: the budget is shared
    with pytest.raises(AgentSafetyError) as caught:
        freeze([], budget)
    assert caught.value.code == "JSON_TOO_LARGE"


def test_collection_width_checked_before_reading() -> None:
    width = AGENT_SAFETY_HARD_LIMITS["maxCollectionLength"]
    freeze(list(range(width)), Budget(nodes=10**6, depth=4, containers=4, bytes=10**7))
    with pytest.raises(AgentSafetyError) as caught:
        freeze(list(range(width + 1)), Budget(nodes=10**6, depth=4, containers=4, bytes=10**7))
    assert caught.value.code == "JSON_COLLECTION_TOO_LONG"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_freeze_preserves_canonical_form(value: Any) -> None:
    frozen = freeze(value, _budget(depth=64))
    assert canonical_json(frozen) == canonical_json(value)
    assert canonical_json(thaw(frozen)) == canonical_json(value)
    assert freeze(frozen, _budget(depth=64)) == frozen


@pytest.mark.parametrize(
    "ceiling",
    [
        "maxSteps",
        "maxRows",
        "maxBytes",
        "maxFieldsPerStep",
        "maxAuthorizationScopesPerSource",
        "maxCitationsPerSource",
        "maxOperationParameterBytes",
        "maxOperationParameterNodes",
        "maxOperationParameterDepth",
        "maxApprovalLifetimeMs",
    ],
)
def test_policy_ceilings_capped_by_hard_limits(ceiling: str) -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    hard = AGENT_SAFETY_HARD_LIMITS[ceiling]
    PlanPolicy.model_validate(s.policy(**{ceiling: hard}), by_alias=True)
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(), s.policy(**{ceiling: hard + 1}), now=s.NOW)
    assert caught.value.code == "POLICY_INVALID"


def test_policy_refuses_bool_for_numbers_and_strings_for_ints() -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    for bad in (True, "5", 5.5):  # 5.0 is the JSON number 5, so it is accepted
        with pytest.raises(AgentSafetyError) as caught:
            dry_run_agent_plan(s.plan(), s.policy(maxSteps=bad), now=s.NOW)
        assert caught.value.code == "POLICY_INVALID"


def test_policy_model_and_dict_have_one_digest() -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    model = PlanPolicy.model_validate(s.policy(), by_alias=True)
    a = dry_run_agent_plan(s.plan(), model, now=s.NOW)
    b = dry_run_agent_plan(s.plan(), s.policy(), now=s.NOW)
    assert a == b
    schema = PlanPolicy.model_json_schema(by_alias=True)
    assert "allowedEffects" in schema["properties"]


@pytest.mark.parametrize(
    ("field", "limit_key", "make"),
    [
        ("fields", "maxFieldsPerStep", lambda n: [f"f{i}" for i in range(n)]),
    ],
)
def test_fields_per_step_at_and_past(field: str, limit_key: str, make: Any) -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    names = [f"f{i}" for i in range(4)]
    policy = s.policy(maxFieldsPerStep=3)
    policy["sources"]["incidents"]["fields"] = names
    dry_run_agent_plan(s.plan(s.step(fields=names[:3])), policy, now=s.NOW)
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(s.step(fields=names)), policy, now=s.NOW)
    assert caught.value.code == "PLAN_LIMIT_EXCEEDED"


def test_scopes_and_citations_per_source_at_and_past() -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    policy = s.policy(maxAuthorizationScopesPerSource=2, maxCitationsPerSource=2)
    ok = s.binding(
        authorizationScope=["incidents:read", "incidents:list"],
        citations=[
            "https://data.example.test/incidents/1",
            "https://data.example.test/incidents/2",
        ],
    )
    dry_run_agent_plan(s.plan(s.step(source=ok)), policy, now=s.NOW)
    policy["sources"]["incidents"]["authorizationScope"].append("incidents:x")
    too_many = s.binding(authorizationScope=["incidents:read", "incidents:list", "incidents:x"])
    with pytest.raises(AgentSafetyError):
        dry_run_agent_plan(s.plan(s.step(source=too_many)), policy, now=s.NOW)
    three = s.binding(citations=[f"https://data.example.test/incidents/{i}" for i in range(3)])
    with pytest.raises(AgentSafetyError):
        dry_run_agent_plan(s.plan(s.step(source=three)), policy, now=s.NOW)


def test_provenance_age_at_and_past() -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    at_limit = s.binding(observedAt="2026-07-10T19:59:00.000Z")  # exactly 60 s
    dry_run_agent_plan(s.plan(s.step(source=at_limit)), s.policy(), now=s.NOW)
    past = s.binding(observedAt="2026-07-10T19:58:59.999Z")
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(s.step(source=past)), s.policy(), now=s.NOW)
    assert caught.value.code == "PLAN_PROVENANCE_STALE"
    future = s.binding(observedAt="2026-07-10T20:00:00.001Z")
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(s.step(source=future)), s.policy(), now=s.NOW)
    assert caught.value.code == "PLAN_PROVENANCE_INVALID"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(extra=1),
        lambda p: p["steps"][0].update(extra=1),
        lambda p: p["steps"][0]["source"].update(token="x"),
        lambda p: p["steps"].append(p["steps"][0]),
        lambda p: p["steps"][0]["source"].update(observedAt="2026-07-10T19:59:30Z"),
        lambda p: p["steps"][0]["source"].update(observedAt="2026-07-10 19:59:30.000Z"),
        lambda p: p["steps"][0].update(maxRows=True),
        lambda p: p["steps"][0].update(maxRows=1.0),
        lambda p: p.update(steps=[]),
        lambda p: p.update(actor=""),
        lambda p: p.update(actor="a\nb"),
        lambda p: p["steps"][0]["source"].update(id="payments"),
        lambda p: p["steps"][0]["source"].update(dataMode="cached"),
        lambda p: p["steps"][0].update(fields=["status", "status"]),
    ],
)
def test_invalid_plans_are_refused(mutate: Any) -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    plan = s.plan()
    mutate(plan)
    with pytest.raises(AgentSafetyError):
        dry_run_agent_plan(plan, s.policy(), now=s.NOW)


def test_conflicting_bindings_of_one_source() -> None:
    from agentsafe.executor.plans import dry_run_agent_plan

    a = s.step("a", maxRows=100)
    b = s.step("b", maxRows=100, source=s.binding(attribution="Other"))
    with pytest.raises(AgentSafetyError) as caught:
        dry_run_agent_plan(s.plan(a, b), s.policy(), now=s.NOW)
    assert caught.value.code == "PLAN_BINDING_CONFLICT"
