"""Which handler runs a policy action: the one lookup the pipeline and reconciliation share.

:class:`PolicyCatalog` answers with the handler a compiled policy names for an action, only when
that handler is registered in this process (``None`` otherwise: the caller refuses with
ACTION_NOT_REGISTERED). :class:`ActionReconciler` is the read path startup reconciliation uses:
a journaled action's handler, asked what the provider did with an idempotency key.
:meth:`PolicyCatalog.describe` is what ``GET /v1/actions`` answers a proposer (the MCP bridge
turns it into tools): the actions this principal may propose, each with its parameter schema and
its handler's hints (``destructive``: a handler that only adds, never changes or removes, says
``destructive = False``; every other action is destructive).

Callers: ``assembly.py`` (the pipeline's catalog, which the pipeline sees through its
``ActionCatalog`` protocol) and ``plane.py`` (the reconciler of startup reconciliation, the
action catalog route).
Also imported by ``recovery.py``.
"""

from __future__ import annotations

from typing import Any

from ..codes import Code
from ..dispatch.seam import ReconcileResult, ReconcileStatus, Registry
from ..policy.policy import CompiledPolicy
from ..principals import Principal

__all__ = ["ActionReconciler", "PolicyCatalog"]


class PolicyCatalog:
    """A policy's actions, each with the registered handler that runs it."""

    def __init__(self, policy: CompiledPolicy, registry: Registry) -> None:
        self._policy = policy
        self._registry = registry
        # A sealed registry's names never change: taken once, the lookup on every proposal
        # asks nothing of the seam (issue 32). An unsealed one is asked each time.
        self._sealed_names = frozenset(registry.names()) if registry.sealed else None

    def handler_for(self, action: str) -> str | None:
        compiled = self._policy.actions.get(action)
        if compiled is None:
            return None
        names = self._sealed_names
        registered = (
            compiled.handler in names if names is not None else compiled.handler in self._registry
        )
        return compiled.handler if registered else None

    def describe(self, principal: Principal) -> list[dict[str, Any]]:
        """The actions ``principal`` may propose that this process can run (name order)."""
        out: list[dict[str, Any]] = []
        for action in self._policy.document.actions:
            handler_name = self.handler_for(action.name)
            if handler_name is None or not principal.may_propose(action.name):
                continue
            handler = self._registry.get(handler_name)
            description = getattr(handler, "description", None)
            out.append(
                {
                    "name": action.name,
                    "description": description if isinstance(description, str) else None,
                    "parameters": dict(action.parameters),
                    "destructive": getattr(handler, "destructive", True) is not False,
                }
            )
        return sorted(out, key=lambda entry: str(entry["name"]))


class ActionReconciler:
    """The read path for startup reconciliation: a policy action's handler, asked by key."""

    def __init__(self, catalog: PolicyCatalog, registry: Registry) -> None:
        self._catalog = catalog
        self._registry = registry

    async def reconcile(
        self, action: str, idempotency_key: str, *, intent_hash: str
    ) -> ReconcileResult:
        handler = self._catalog.handler_for(action)
        if handler is None:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code=Code.ACTION_NOT_REGISTERED)
        return await self._registry.reconcile(handler, idempotency_key, intent_hash=intent_hash)
