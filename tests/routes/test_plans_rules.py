"""The executor's own rules on the plan routes, unit by unit (issue 16, item 5); the attacks
against a real process are in ``tests/integration/test_plans_process.py``."""

from __future__ import annotations

from typing import Any

import pytest

from agentsafe.executor.plans.errors import AgentSafetyError
from agentsafe.executor.principals import Principal, Role
from agentsafe.executor.routes.plans import _check_actor

ME = Principal(id="treasury-workflow", role=Role.PROPOSER, tenant_id="t-1")


@pytest.mark.parametrize(
    ("plan", "strict", "refused"),
    [
        ({"actor": "treasury-workflow"}, True, False),
        ({"actor": "treasury-workflow"}, False, False),
        ({"actor": "other-tenant-agent"}, False, True),
        ({"actor": "other-tenant-agent"}, True, True),
        ({"actor": "Treasury-Workflow"}, True, True),  # exact, never case-folded
        ({}, False, False),  # a dry run's malformed plan is the library's to refuse
        ({}, True, True),  # a step's dry run must name its proposer
        (None, True, True),
        ({"actor": ["treasury-workflow"]}, True, True),
    ],
)
def test_a_plan_is_its_proposers_own(plan: Any, strict: bool, refused: bool) -> None:
    if refused:
        with pytest.raises(AgentSafetyError) as info:
            _check_actor(plan, ME, strict=strict)
        assert info.value.code == "PLAN_PRINCIPAL_MISMATCH"
    else:
        _check_actor(plan, ME, strict=strict)
