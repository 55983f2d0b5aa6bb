"""Which handler runs a policy action: the one lookup the pipeline and reconciliation share.

:class:`PolicyCatalog` answers with the handler a compiled policy names for an action, only when
that handler is registered in this process (``None`` otherwise: the caller refuses with
ACTION_NOT_REGISTERED). :class:`ActionReconciler` is the read path startup reconciliation uses:
a journaled action's handler, asked what the provider did with an idempotency key.

Callers: ``assembly.py`` (the pipeline's catalog, which the pipeline sees through its
``ActionCatalog`` protocol) and ``plane.py`` (startup reconciliation).
"""

from __future__ import annotations

from ..codes import Code
from ..dispatch.seam import ReconcileResult, ReconcileStatus, Registry
from ..policy.policy import CompiledPolicy

__all__ = ["ActionReconciler", "PolicyCatalog"]


class PolicyCatalog:
    """A policy's actions, each with the registered handler that runs it."""

    def __init__(self, policy: CompiledPolicy, registry: Registry) -> None:
        self._policy = policy
        self._registry = registry

    def handler_for(self, action: str) -> str | None:
        compiled = self._policy.actions.get(action)
        if compiled is None or compiled.handler not in self._registry:
            return None
        return compiled.handler


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
