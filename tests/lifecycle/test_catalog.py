"""lifecycle/catalog.py: which handler runs a policy action, asked of a sealed registry once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agentsafe.executor.dispatch.seam import Registry
from agentsafe.executor.lifecycle.catalog import PolicyCatalog
from tests.dispatch.test_seam import ScriptedHandler


def _policy(**handlers: str) -> Any:
    """A compiled policy as the catalog reads it: each action names its handler."""
    return SimpleNamespace(
        actions={action: SimpleNamespace(handler=name) for action, name in handlers.items()}
    )


def test_an_action_runs_by_its_handler_only_when_that_handler_is_registered() -> None:
    registry = Registry()
    registry.register("payouts", ScriptedHandler("ok"))
    registry.seal()
    catalog = PolicyCatalog(_policy(create_payout="payouts", refund="refunds"), registry)
    assert catalog.handler_for("create_payout") == "payouts"
    assert catalog.handler_for("refund") is None  # named by the policy, registered nowhere
    assert catalog.handler_for("unknown") is None


def test_a_sealed_registry_is_not_asked_again_and_an_unsealed_one_is() -> None:
    class Counting(Registry):
        asked = 0

        def __contains__(self, name: object) -> bool:
            Counting.asked += 1
            return super().__contains__(name)

    sealed = Counting()
    sealed.register("payouts", ScriptedHandler("ok"))
    sealed.seal()
    catalog = PolicyCatalog(_policy(create_payout="payouts"), sealed)
    for _ in range(3):
        assert catalog.handler_for("create_payout") == "payouts"
    assert Counting.asked == 0  # the names were taken when the catalog was made

    open_registry = Counting()
    live = PolicyCatalog(_policy(create_payout="payouts"), open_registry)
    assert live.handler_for("create_payout") is None
    open_registry.register("payouts", ScriptedHandler("ok"))
    assert live.handler_for("create_payout") == "payouts"  # registered later: seen
    assert Counting.asked == 2
