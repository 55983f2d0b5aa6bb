"""Who may call the executor: principals, their roles and what they may do.

This module holds the :class:`Principal` model every other component sees. Loading
``agent-safe.principals/1`` files lives in ``principals_file.py``; legacy mode synthesises one
PROPOSER from the ``EXECUTOR_TENANT_ID``/``EXECUTOR_ACTOR_*`` variables (:func:`legacy_principal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["LEGACY_PRINCIPAL_ID", "Actor", "Principal", "Role", "legacy_principal"]

LEGACY_PRINCIPAL_ID = "legacy-caller"


class Role(StrEnum):
    PROPOSER = "PROPOSER"
    OPERATOR = "OPERATOR"
    APPROVER = "APPROVER"


@dataclass(frozen=True)
class Actor:
    id: str
    type: str
    runtime: str | None = None

    def as_binding(self) -> dict[str, str]:
        out = {"id": self.id, "type": self.type}
        if self.runtime is not None:
            out["runtime"] = self.runtime
        return out


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. ``allowed_actions`` of ``None`` means every registered action."""

    id: str
    role: Role
    tenant_id: str | None = None
    actor: Actor | None = None
    allowed_actions: frozenset[str] | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)
    credential_kind: str = "BEARER"

    def may_propose(self, action: str) -> bool:
        if self.role is not Role.PROPOSER:
            return False
        return self.allowed_actions is None or action in self.allowed_actions

    def view(self) -> dict[str, str | None]:
        """What policy expressions see as ``principal``."""
        return {
            "id": self.id,
            "role": self.role.value,
            "actor": self.actor.id if self.actor else None,
        }


def legacy_principal(*, tenant_id: str, actor: Actor) -> Principal:
    """The one PROPOSER of legacy mode, allowed every registered action."""
    return Principal(
        id=LEGACY_PRINCIPAL_ID,
        role=Role.PROPOSER,
        tenant_id=tenant_id,
        actor=actor,
        allowed_actions=None,
    )
