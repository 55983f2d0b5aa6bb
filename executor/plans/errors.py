"""The plan boundary's errors: one root with a stable ``code``, and the execution error that
carries a signed receipt.

    AgentSafeError
    └── AgentSafetyError            any refusal of the plan boundary (``code`` is stable)
        ├── AgentSafetyAborted      the caller's abort event fired (``OPERATION_ABORTED``)
        └── AgentExecutionError     a step ran (or may have) and a receipt was signed for it

Messages name the rule that failed and the path of our own field names, never request data,
identities, parameters or secrets.

Callers: every module of ``agentsafe.executor.plans``; the HTTP routes map ``code`` to a status.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..codes import Code
from ..errors import AgentSafeError

__all__ = ["AgentExecutionError", "AgentSafetyAborted", "AgentSafetyError"]


class AgentSafetyError(AgentSafeError):
    """A refusal of the plan boundary. Nothing partially validated escapes with it.

    agentsafe's own refusals carry a :class:`~agentsafe.executor.codes.Code`; a host step
    executor may raise this with its own UPPER_SNAKE code, which the boundary passes through."""

    code: str = Code.AGENT_SAFETY_REFUSED

    def __init__(self, message: str, *, code: Code | str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class AgentSafetyAborted(AgentSafetyError):
    """The caller's abort event was set; no usable approval or receipt was produced."""

    code = Code.OPERATION_ABORTED


class AgentExecutionError(AgentSafetyError):
    """A step reached its executor and a receipt was signed, but the call did not succeed:
    the executor failed, its result broke a ceiling, or the terminal audit event could not be
    written. ``receipt`` is the signed receipt so the host can reconcile."""

    code = Code.EXECUTION_FAILED

    def __init__(self, message: str, *, code: Code | str, receipt: Mapping[str, Any]) -> None:
        super().__init__(message, code=code)
        self.receipt = receipt
