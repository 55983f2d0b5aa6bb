"""CEL wrapper: compile-time refusals with the compiler's message, typed evaluation errors, and the
engine's behaviour on the variable types policies see (int64, nested maps, strings, bools,
timestamps)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agentsafe.executor.errors import PolicyError
from agentsafe.executor.policy.celexpr import Activation, EvaluationError, compile_expression

NOW = datetime(2026, 8, 14, 10, 30, tzinfo=UTC)


def activation(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "action": {"type": "create_payout", "resource": "payouts"},
        "target": {"system": "bank", "operation": "payout", "endpoint": "https://bank.test/p"},
        "params": {"amountMinor": 4200, "currency": "EUR", "meta": {"tags": ["a", "b"]}},
        "principal": {"id": "agent-1", "role": "PROPOSER", "actor": "bot-1"},
        "tenant": "acme",
        "context": {"caller_principal": "agent-1"},
        "now": NOW,
    }
    base.update(overrides)
    return base


_OVER_VARIABLES = [
    ("params.amountMinor <= 5000", True),
    ("params.amountMinor > 5000", False),
    ("params.currency == 'EUR' && tenant == 'acme'", True),
    ("params.meta.tags.exists(t, t == 'b')", True),
    ("params.meta.tags.all(t, t.size() == 1)", True),
    ("'amountMinor' in params && has(params.currency)", True),
    ("!has(params.reference)", True),
    ("principal.role == 'PROPOSER' && principal.actor.startsWith('bot-')", True),
    ("target.endpoint.matches('^https://')", True),
    ("action.type == 'create_payout' && action.resource == 'payouts'", True),
    ("context.caller_principal == principal.id", True),
    ("now.getHours() == 10 && now > timestamp('2026-01-01T00:00:00Z')", True),
    ("now < timestamp('2026-08-14T10:00:00Z')", False),
    ("params.amountMinor * 1000000 > 4000000000", True),
]


@pytest.mark.parametrize(("source", "expected"), _OVER_VARIABLES)
def test_expressions_over_policy_variables(source: str, expected: bool) -> None:
    assert compile_expression(source).evaluate(activation()) is expected


@pytest.mark.parametrize("source", [source for source, _ in _OVER_VARIABLES])
def test_an_expression_reads_only_the_variables_it_names(source: str) -> None:
    """An evaluation binds only :attr:`Expression.variables` (the authority builds no more):
    the answer is the one the full activation gives, and without them it is an error."""
    expression = compile_expression(source)
    every = activation()
    only = {name: value for name, value in every.items() if name in expression.variables}
    assert expression.evaluate(Activation(only)) is expression.evaluate(Activation(every))
    if expression.variables:
        with pytest.raises(EvaluationError):
            expression.evaluate(Activation({}))


def test_the_named_variables_leave_out_comprehension_binders_and_literals() -> None:
    assert compile_expression("true").variables == frozenset()
    assert compile_expression("[1, 2].all(x, x > 0)").variables == frozenset()
    assert compile_expression(
        "params.meta.tags.exists(now, now == 'a') && tenant == 'acme'"
    ).variables == frozenset({"params", "now", "tenant"})
    assert compile_expression("has(context.x) || principal.id == 'a'").variables == frozenset(
        {"context", "principal"}
    )


def test_prepared_activation_gives_the_same_answers() -> None:
    prepared = Activation(activation())
    assert compile_expression("params.amountMinor == 4200").evaluate(prepared) is True
    assert compile_expression("params.currency == 'USD'").evaluate(prepared) is False


def test_integers_are_int64_and_overflow_is_an_error() -> None:
    expr = compile_expression("params.amountMinor + 1 > 0")
    assert expr.evaluate(activation(params={"amountMinor": 2**62})) is True
    with pytest.raises(EvaluationError) as info:
        expr.evaluate(activation(params={"amountMinor": 2**63 - 1}))
    assert info.value.code == "POLICY_EVALUATION_ERROR"
    # the engine's message would quote the operands: ours names only the kind of failure
    assert str(2**63 - 1) not in str(info.value)


def test_int_and_double_do_not_mix_silently() -> None:
    with pytest.raises(EvaluationError):
        compile_expression("params.amountMinor + 0.5 > 1.0").evaluate(activation())


@pytest.mark.parametrize(
    ("source", "params"),
    [
        ("params.missing == 1", {}),
        ("params.items[3] == 1", {"items": [1]}),
        ("params.amountMinor / 0 == 1", {"amountMinor": 1}),
        ("int(params.text) == 1", {"text": "not a number"}),
        ("params.text.matches('[')", {"text": "x"}),
    ],
)
def test_evaluation_failures_are_typed(source: str, params: dict[str, object]) -> None:
    with pytest.raises(EvaluationError) as info:
        compile_expression(source).evaluate(activation(params=params))
    assert info.value.code == "POLICY_EVALUATION_ERROR"
    assert "not a number" not in str(info.value)


@pytest.mark.parametrize("source", ["params.amountMinor", "'yes'", "null", "[true]"])
def test_non_boolean_result_is_an_error(source: str) -> None:
    with pytest.raises(EvaluationError, match="not bool"):
        compile_expression(source).evaluate(activation())


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("params.amountMinor <=", "Syntax error"),
        ("(true", "Syntax error"),
        ("parms.amountMinor > 1", "undeclared reference to parms"),
        ("request.amount > 1", "undeclared reference to request"),
        ("sise(params) > 1", "unknown function sise"),
        ("params.name.lowerAscii() == 'x'", "unknown function lowerAscii"),
        ("", "empty"),
        ("   ", "empty"),
        ("true && " * 1000 + "true", "longer than"),
    ],
)
def test_compile_refusals_carry_path_and_message(source: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        compile_expression(source, path="actions[0].rules[1].when")
    assert info.value.code == "POLICY_EXPRESSION_INVALID"
    assert info.value.path == "actions[0].rules[1].when"
    assert str(info.value).startswith("actions[0].rules[1].when: ")
    assert fragment in str(info.value)


def test_syntax_error_message_points_at_the_column() -> None:
    with pytest.raises(PolicyError) as info:
        compile_expression("params.amountMinor <=", path="p")
    assert "1:22" in str(info.value)


def test_comprehension_variables_are_allowed_only_where_bound() -> None:
    compile_expression("params.meta.tags.map(tag, tag + '!').exists(x, x == 'a!')")
    with pytest.raises(PolicyError, match="undeclared reference to tag"):
        compile_expression("params.meta.tags.exists(t, t == 'a') && tag == 'a'")


def test_known_deviation_string_size_counts_utf8_bytes() -> None:
    # Documented in docs/cel.md: the engine's size() counts UTF-8 bytes, the specification code
    # points. If an upgrade fixes it, update the page and this test.
    expr = compile_expression("params.name.size() == 5")
    assert expr.evaluate(activation(params={"name": "é€"})) is True
