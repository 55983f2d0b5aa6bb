"""Who may call the executor: principals, their roles and what they may do.

This module holds the :class:`Principal` model every other component sees, and the one
vocabulary of roles (:class:`Role`) and operator scopes (:class:`Scope`). Loading
``agent-safe.principals/1`` files lives in ``principals_file.py``; legacy mode synthesises one
PROPOSER from the ``EXECUTOR_TENANT_ID``/``EXECUTOR_ACTOR_*`` variables (:func:`legacy_principal`).

Callers: main callers; it is imported across the wings, and its importers are not listed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import regex

__all__ = [
    "LEGACY_PRINCIPAL_ID",
    "Actor",
    "Principal",
    "Role",
    "Scope",
    "Verification",
    "actor_key",
    "legacy_principal",
    "same_actor",
]

_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}+")


def actor_key(name: str) -> str:
    """The one form in which principal ids and actor ids are compared (issue 30).

    Unicode's *compatibility caseless match* (The Unicode Standard, chapter 3.13, D146):
    ``NFKD(casefold(NFKD(casefold(NFD(name)))))``, after removing every
    ``Default_Ignorable_Code_Point`` as ``NFKC_Casefold`` does. So ``Mallory@Bank.example``,
    ``mallory@bank.example``, ``ｍallory@bank.example`` (fullwidth) and
    ``mal\u00adlory@bank.example`` (a soft hyphen) are one actor. Look-alikes of other scripts
    stay distinct here; a principals file that holds two spellings of one key is refused at load
    (``PRINCIPALS_ACTOR_COLLISION``).
    """
    text = _IGNORABLE.sub("", name)
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFD", text).casefold())
    return unicodedata.normalize("NFKD", text.casefold())


def same_actor(name: str | None, others: str | Iterable[str | None] | None) -> bool:
    """Whether ``name`` is, under :func:`actor_key`, ``others`` (or one of them); None is no one.

    Used wherever a check REFUSES because two names are one actor (separation of duties): the
    principals file's rules, :func:`~agentsafe.executor.intent.check_separation`, the use store's
    ``check_decidable`` and approval listings, the authority's resolution of an approval. A check
    that ADMITS because a name matches (the intent's owner, an approver a rule names) stays
    exact: a near spelling never grants anything.
    """
    if name is None:
        return False
    candidates = (others,) if others is None or isinstance(others, str) else others
    key = actor_key(name)
    return any(other is not None and actor_key(other) == key for other in candidates)


LEGACY_PRINCIPAL_ID = "legacy-caller"


# What a principal is: every route admits one role (the door's route-role check). No docstring:
# pydantic would put it into the Principal CRD's description of ``spec.role``.
class Role(StrEnum):
    PROPOSER = "PROPOSER"
    OPERATOR = "OPERATOR"
    APPROVER = "APPROVER"


class Scope(StrEnum):
    """What an OPERATOR may do: each operator route requires one (the door's route-scope check).

    The one list of scopes: the principals file draws an OPERATOR's scopes from it, the routes
    name theirs with it, and the operator's Principal schema imports it.
    """

    HALT = "halt"
    RESUME = "resume"
    SECRETS_RELOAD = "secrets.reload"
    STATUS = "status"
    METRICS = "metrics"
    EVIDENCE = "evidence"
    APPROVERS = "approvers"


class Verification(StrEnum):
    """How strongly a person deciding an escalation was verified, weakest first.

    ``CREDENTIAL``: the door's credential alone (bearer, workload token or certificate).
    ``WEBAUTHN``: that, plus a passkey assertion with user verification whose challenge is bound
    to the request id, the intent hash and the decision (``door/passkeys.py``). An APPROVER
    principal and a policy rule (``approval: {verification: WEBAUTHN}``) can each require a level;
    a decision below the stronger of the two is refused.
    """

    CREDENTIAL = "CREDENTIAL"
    WEBAUTHN = "WEBAUTHN"

    @property
    def rank(self) -> int:
        return _VERIFICATION_ORDER.index(self)

    def meets(self, required: Verification) -> bool:
        """Whether a decision verified at this level satisfies ``required``."""
        return self.rank >= required.rank

    @classmethod
    def strongest(cls, *levels: Verification) -> Verification:
        return max(levels, key=lambda level: level.rank, default=cls.CREDENTIAL)


_VERIFICATION_ORDER = (Verification.CREDENTIAL, Verification.WEBAUTHN)


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
    scopes: frozenset[Scope] = field(default_factory=frozenset)
    credential_kind: str = "BEARER"
    verification: Verification = Verification.CREDENTIAL
    """APPROVER only: the least verification this person's decisions must carry."""

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
