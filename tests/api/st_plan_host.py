"""The host's plan step executor for ``make api-test``: ``EXECUTOR_HANDLERS=st_plan_host:register``.

``tests/api/test_schemathesis.py`` starts the real ``agentsafe serve`` with this directory (never
the repository root) on its ``PYTHONPATH``, so that the plan routes can run a step end to end in
the stateful phase (dry run -> approval -> step -> receipt verification), the way an adopter's
package registers one through the sealed seam (``docs/handlers.md``). It is a TEST DOUBLE for
``query``/``read``: one fixed row, nothing is read.
"""

from __future__ import annotations

from typing import Any

from agentsafe.executor.dispatch.registration import Seam
from agentsafe.executor.plans import StepRequest, StepResult


class QueryDouble:
    """A step executor bound to ``query``/``read`` (a test double; it reads nothing)."""

    tool = "query"
    effect = "read"

    async def execute(self, request: StepRequest) -> StepResult:
        value: Any = [{name: f"row-{name}" for name in request.fields}]
        return StepResult(value=value, rows=1)


def register(seam: Seam) -> None:
    seam.plans.register(QueryDouble())
