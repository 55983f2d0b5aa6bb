"""The authority's contract: the :class:`Authority` protocol the pipeline and the attempt speak
to, the records it answers with (:class:`Decision`, :class:`Claim`, :class:`Finalization`, and
:class:`Evaluation` with its :class:`Stage` and :class:`RuleTrial` for ``policy test`` and
``explain``), and its refusal, :class:`GrantRefused`. Records only: no key, no I/O. The built-in
authority (``authority.py``) implements the protocol and re-exports every name here, so
importers keep one place to import from.

Carved out of ``authority.py`` (issue 32: no module over 800 lines), as ``state/records.py`` and
``state/protocol.py`` hold the use store's.

Callers: ``policy/authority.py`` (the only importer; everyone else imports through it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from ..codes import Code
from ..errors import AgentSafeError
from ..intent import CapturedIntent
from ..principals import Principal, Verification
from .policy import Verdict

if TYPE_CHECKING:
    from ..state.records import AttemptFence

__all__ = [
    "Authority",
    "Claim",
    "Decision",
    "EffectEvidence",
    "Evaluation",
    "Finalization",
    "Finalizer",
    "GrantRefused",
    "ReceiptChecked",
    "ReceiptVerification",
    "ReceiptVerifier",
    "RuleTrial",
    "Stage",
]


class GrantRefused(AgentSafeError):
    """A grant that must not execute. Codes: GRANT_SIGNATURE_INVALID, GRANT_EXPIRED,
    GRANT_BINDING_MISMATCH, GRANT_ALREADY_CLAIMED, GRANT_MALFORMED."""

    code = Code.GRANT_MALFORMED

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    decision_id: str
    dossier_id: str
    reason_codes: tuple[str, ...]
    rule: str | None
    approvers: tuple[str, ...]
    grant: str | None  # compact JWS, ALLOW only; never leaves the process
    grant_id: str | None
    grant_expires_at: float | None
    authority_time: float  # the authority's clock when it answered (skew measurement)
    verification: Verification = Verification.CREDENTIAL
    """ESCALATE only: the least verification the rule requires of its approvers' decisions."""

    def __repr__(self) -> str:  # keep the grant out of logs and tracebacks
        return (
            f"Decision(verdict={self.verdict.value}, decision_id={self.decision_id!r}, "
            f"reason_codes={tuple(map(str, self.reason_codes))!r}, rule={self.rule!r}, "
            f"grant_id={self.grant_id!r})"
        )


@dataclass(frozen=True)
class Claim:
    """A consumed grant."""

    grant_id: str
    decision_id: str
    dossier_id: str
    expires_at: float
    intent_hash: str
    execution_payload_digest: str
    attestation: str | None = None  # the authority's signed claim attestation (compact JWS)
    claim_token_digest: str | None = None  # the digest of the grant the claim consumed


class ReceiptChecked(Protocol):
    """One provider receipt as the verifier read it (``effects/receipts.py``'s ``ReceiptCheck``)."""

    @property
    def digest(self) -> str: ...

    @property
    def verified(self) -> bool: ...

    @property
    def effect_digest(self) -> str | None: ...

    @property
    def reason(self) -> str | None: ...


class ReceiptVerifier(Protocol):
    """The provider keys registered with this authority (the policy's ``providerKeys``): verifies
    a receipt's key, signature, issuer, grant and claim (``effects/receipts.py``'s
    ``ProviderKeys``, handed in by ``assembly.py``)."""

    def check(
        self, receipt: str, *, grant_id: str, claim_token_digest: str | None
    ) -> ReceiptChecked: ...


class EffectEvidence(StrEnum):
    """What the authority reads as the effect's evidence at finalization."""

    SIGNED_RECEIPT = "SIGNED_RECEIPT"  # a verified receipt stating the effect the attempt expected
    OBSERVATION = "OBSERVATION"  # the executor's own record of what a handler observed
    NONE = "NONE"


class ReceiptVerification(StrEnum):
    VERIFIED = "VERIFIED"
    UNVERIFIED = "UNVERIFIED"
    ABSENT = "ABSENT"


@dataclass(frozen=True)
class Finalization:
    """What the authority recorded for one claimed attempt (:meth:`Authority.finalize`).

    ``effect_report`` is what the authority made of the effect evidence it was handed:
    ``effect_evidence`` (:class:`EffectEvidence`), ``record_digest`` (the effect record's, or
    ``None``), ``receipt`` (:class:`ReceiptVerification`), ``receipt_digest`` and
    ``receipt_reason`` (why a receipt did not verify: an ``EFFECT_RECEIPT_*`` code)."""

    status: str
    outcome: str
    executed: bool | None
    effect: Mapping[str, Any] | None
    effect_receipt: str | None
    effect_report: Mapping[str, Any]


class Authority(Protocol):
    async def evaluate(
        self,
        intent: CapturedIntent,
        *,
        principal: Principal,
        approval: Mapping[str, Any] | None = None,
    ) -> Decision: ...

    async def claim(
        self, grant: str, *, intent: CapturedIntent, fence: AttemptFence | None = None
    ) -> Claim:
        """Consume ``grant`` for ``intent``; raises :class:`GrantRefused`. With ``fence`` (the
        attempt's fencing token, shared store), the claim is made only while the attempt is
        still its holder's under a live lease, in the same statement; a fenced-out claim raises
        ``StoreError(ATTEMPT_FENCED)`` and claims nothing."""
        ...

    async def finalize(
        self,
        claim: Claim,
        *,
        outcome: str,
        executed: bool | None,
        effect: Mapping[str, Any] | None = None,
        effect_receipt: str | None = None,
    ) -> Finalization:
        """Record how a claimed attempt ended, with the effect record the handler registered
        (``effect``: the record's evidence fields, digests only) and the provider's receipt
        verbatim (``effect_receipt``). A receipt is never a reason to refuse a finalization."""
        ...


Finalizer = Callable[[Claim, Finalization], Awaitable[None]]
"""Told every finalization the built-in authority records (a remote authority's hook)."""


class Stage(StrEnum):
    """Where :func:`evaluate_policy` reached its verdict (``agentsafe policy explain``)."""

    EXPIRY = "EXPIRY"
    ACTION = "ACTION"
    PARAMETERS = "PARAMETERS"
    RULES = "RULES"
    NO_MATCH = "NO_MATCH"
    APPROVAL = "APPROVAL"


@dataclass(frozen=True)
class RuleTrial:
    """One rule tried: ``matched`` is ``None`` when its expression failed to evaluate."""

    rule: str
    path: str
    when: str
    matched: bool | None


@dataclass(frozen=True)
class Evaluation:
    """The policy's answer before any grant is signed, and how it was reached."""

    verdict: Verdict
    reason_codes: tuple[str, ...]
    rule: str | None
    approvers: tuple[str, ...]
    stage: Stage
    trials: tuple[RuleTrial, ...] = ()
    verification: Verification = Verification.CREDENTIAL
    """ESCALATE only: the least verification the matched rule requires of its approvers."""
