"""The public face for adopters' handlers: every name a handler package imports from agentsafe.

Role: one stable import path, ``agentsafe.executor.handlers``, for the registration function
and the handlers and plan step executors it registers (``docs/handlers.md``,
``examples/handlers``). The names live in private homes (``dispatch/registration.py``,
``dispatch/seam.py``, ``plans/execute.py``, ``egress/transport.py``) and are re-exported here
unchanged (the same objects), so the homes may move without breaking an adopter; a name that
is not in :data:`__all__` is internal. ``tests/test_handlers_face.py`` keeps the documentation
and the example package on this face.

Callers: adopters' handler packages (``examples/handlers``); docs/handlers.md; no module of
agentsafe (it is a face, not a dependency).
"""

from __future__ import annotations

from .dispatch.registration import Downstream, Seam
from .dispatch.seam import (
    Dispatch,
    DispatchRefused,
    ExecutionContext,
    Handler,
    Outcome,
    ProviderRefused,
    ReconcileResult,
    ReconcileStatus,
)
from .egress.transport import TransportError
from .plans.execute import StepExecutor, StepRequest, StepResult

__all__ = [
    "Dispatch",
    "DispatchRefused",
    "Downstream",
    "ExecutionContext",
    "Handler",
    "Outcome",
    "ProviderRefused",
    "ReconcileResult",
    "ReconcileStatus",
    "Seam",
    "StepExecutor",
    "StepRequest",
    "StepResult",
    "TransportError",
]
