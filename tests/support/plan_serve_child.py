"""``agentsafe serve`` with one plan step executor: a real process for the plan-route tests.

Run by ``tests/integration/test_plans_process.py`` as ``python plan_serve_child.py`` with the
executor's environment. It is the real ``agentsafe.executor.serve.main`` (audit hook, signals,
chained streams, the listener) with a TEST DOUBLE step executor for ``query``/``read`` handed to
``assemble``, because ``serve`` has no way yet to load a host's plan step executors. The double
answers one fixed row; the plan audit under the journal and the evidence stream show each run.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from agentsafe.executor import serve
from agentsafe.executor.assembly import assemble
from agentsafe.executor.plans import StepRequest, StepResult


class QueryDouble:
    """A host step executor bound to ``query``/``read`` (a test double; it reads nothing)."""

    tool = "query"
    effect = "read"

    async def execute(self, request: StepRequest) -> StepResult:
        value: Any = [{"OBJECTID": 1, "status": "open"}]
        return StepResult(value=value, rows=1)


if __name__ == "__main__":
    serve.assemble = functools.partial(assemble, plan_executors=[QueryDouble()])  # type: ignore[assignment]
    sys.exit(serve.main())
