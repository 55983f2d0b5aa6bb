"""The CEL activation built per evaluation, against how it was built before issue 34.

``authority._variables`` now takes each variable's maker from a table built once
(``_MAKERS``) instead of a dict of closures built per evaluation, and ``Activation`` no longer
copies a plain dict before the engine converts it. :func:`variables_before` is the old code, kept
as the oracle: for every subset of the variables, intents with and without context, target and
actor, the variables must be equal (and of the same types), and every rule over them must
evaluate the same. The verdicts of whole policies are ``tests/policy/test_authority.py``'s.

Checked by mutation: building ``principal`` without its actor, ``action`` from the target, or
``now`` without a time zone made these tests fail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentsafe.executor.intent import CapturedIntent, DownstreamTarget
from agentsafe.executor.policy.authority import _variables
from agentsafe.executor.policy.celexpr import VARIABLES, Activation, compile_expression
from agentsafe.executor.principals import Actor, Principal, Role
from tests.support.intents import make_intent

NOW = 1_800_000_000.25


def variables_before(
    intent: CapturedIntent, names: frozenset[str], *, principal: Principal, now: float
) -> dict[str, Any]:
    """``authority._variables`` before issue 34, verbatim (the oracle)."""
    binding = intent.binding
    makers: dict[str, Callable[[], Any]] = {
        "action": lambda: {
            "type": (binding.get("action") or {}).get("type"),
            "resource": (binding.get("action") or {}).get("resource"),
        },
        "target": lambda: dict(binding.get("downstream_target") or {}),
        "params": lambda: intent.parameters,
        "principal": principal.view,
        "tenant": lambda: intent.tenant_id,
        "context": lambda: dict(binding.get("context") or {}),
        "now": lambda: datetime.fromtimestamp(now, tz=UTC),
    }
    return {name: makers[name]() for name in VARIABLES & names}


EXPRESSIONS = [
    compile_expression(text)
    for text in [
        "action.type == 'create_payout' && action.resource.startsWith('payout:')",
        "target.system == 'bank' && target.operation == 'payout'",
        "has(target.endpoint) && target.endpoint.startsWith('https://')",
        "params.amountMinor <= 5000",
        "params.currency == 'EUR'",
        "principal.id == 'agent-1' && principal.role == 'PROPOSER'",
        "principal.actor == null || principal.actor == 'bot-1'",
        "tenant == 'acme' || tenant != ''",
        "size(context) >= 0",
        "now > timestamp('2020-01-01T00:00:00Z') && now.getFullYear() >= 2020",
        "now.getHours() < 24",
    ]
]

PRINCIPALS = st.builds(
    Principal,
    id=st.sampled_from(["agent-1", "agent-2"]),
    role=st.just(Role.PROPOSER),
    tenant_id=st.sampled_from(["acme", "t-2"]),
    actor=st.none() | st.builds(Actor, id=st.just("bot-1"), type=st.just("agent")),
)
PARAMETERS = st.fixed_dictionaries(
    {"amountMinor": st.integers(1, 10**6), "currency": st.sampled_from(["EUR", "USD", "RUB"])}
)
TARGETS = st.builds(
    DownstreamTarget,
    system=st.sampled_from(["bank", "ledger"]),
    operation=st.sampled_from(["payout", "note"]),
    endpoint=st.sampled_from(["https://bank.test/p", "http://ledger.test/n"]),
)


def _same(left: Mapping[str, Any], right: Mapping[str, Any]) -> None:
    assert left == right
    assert list(left) == list(right)  # the same order: the same dict the engine converts
    for name in left:
        assert type(left[name]) is type(right[name]), name
    if "now" in left:
        assert left["now"].tzinfo == right["now"].tzinfo


@settings(max_examples=150, deadline=None)
@given(
    names=st.frozensets(st.sampled_from(sorted(VARIABLES))),
    principal=PRINCIPALS,
    parameters=PARAMETERS,
    target=TARGETS,
    now=st.floats(1e9, 4e9) | st.just(NOW),
)
def test_the_variables_are_built_as_before(
    names: frozenset[str],
    principal: Principal,
    parameters: dict[str, Any],
    target: DownstreamTarget,
    now: float,
) -> None:
    proposer = Principal(
        id=principal.id, role=Role.PROPOSER, tenant_id="acme", actor=Actor(id="bot-1", type="agent")
    )
    intent = make_intent(now=NOW, principal=proposer, parameters=parameters, target=target)
    after = _variables(intent, names, principal=principal, now=now)
    before = variables_before(intent, names, principal=principal, now=now)
    _same(after, before)
    every = frozenset(VARIABLES)
    full_after = Activation(_variables(intent, every, principal=principal, now=now))
    full_before = Activation(variables_before(intent, every, principal=principal, now=now))
    for expression in EXPRESSIONS:
        assert expression.evaluate(full_after) is expression.evaluate(full_before)


def test_a_binding_without_context_or_target() -> None:
    principal = Principal(id="agent-1", role=Role.PROPOSER, tenant_id="acme", actor=None)
    proposer = Principal(
        id="agent-1", role=Role.PROPOSER, tenant_id="acme", actor=Actor(id="bot-1", type="agent")
    )
    intent = make_intent(now=NOW, principal=proposer)
    bare = dict(intent.binding)
    bare.pop("context", None)
    bare["downstream_target"] = None
    every = frozenset(VARIABLES)

    class Bare:
        binding = bare
        parameters = intent.parameters
        tenant_id = intent.tenant_id

    stand_in: Any = Bare()
    _same(
        _variables(stand_in, every, principal=principal, now=NOW),
        variables_before(stand_in, every, principal=principal, now=NOW),
    )


def test_activation_does_not_keep_the_mapping() -> None:
    """The engine converts when the context is built: changing the dict afterwards changes
    nothing (why ``Activation`` may hand over a plain dict uncopied)."""
    variables: dict[str, Any] = {"params": {"amountMinor": 1}}
    activation = Activation(variables)
    variables["params"]["amountMinor"] = 10**6
    assert compile_expression("params.amountMinor == 1").evaluate(activation) is True
