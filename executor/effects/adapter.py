"""The adapter contract, its bridge to the handler registry, and the effect record.

An adapter is how a family of consequential actions reaches a provider: four small methods,
three of them pure.

================  ===============================================================================
``prepare``       what the action asks for and what its effect should be (:class:`Prepared`);
                  reaches nothing; refuses a malformed action (``RequestRejected``)
``execute``       the side effect, once, inside the ``dispatch.run`` the pipeline opened; answers a
                  :class:`ProviderResult` (committed or refused), or raises when the provider
                  neither committed nor refused, so the outcome is UNKNOWN, never guessed
``observe_effect`` the provider's account (its answer, or a read-back) in the family's projection;
                  pure
``reconcile``     what the provider did with an idempotency key; read only, always
================  ===============================================================================

:class:`AdapterHandler` makes any adapter a registry handler: ``prepare``, then ``execute``
inside the dispatch (the transport is given ``ctx.remaining()``, so never more than the grant has
left), then ``observe_effect``, then the field-by-field comparison against what was authorised,
the receipt comparison (``receipts.py``), and the :class:`EffectRecord`, registered in the one
effect register (``dispatch/effects.py``) under the grant id: the attempt takes it after the
registry returns and hands it to the authority's finalization, with the receipt verbatim (in the
result, or on the refusal's ``ProviderRefused``).
A refusal is registered before :class:`~agentsafe.executor.dispatch.seam.ProviderRefused` is
raised, so its observation reaches the finalization and the evidence although the answer has no
effect block.
:meth:`AdapterHandler.admit` is ``prepare`` before the authority is asked: the derived target must
be the proposal's, and the family's amount projection is what the host ceilings read.

Confirmation states (``docs/execution-outcomes.md``):

==============  ==================================================================================
CONFIRMED       posted, read back by the provider's reference, and the read-back matched
ACKNOWLEDGED    the provider took the request; it has not posted it yet
UNCONFIRMED     posted, but the read-back could not be made; reconciliation may confirm it later
UNKNOWN         two accounts disagree (the observation, or the receipt): EFFECT_MISMATCH
NOT_EFFECTED    the provider refused deterministically
==============  ==================================================================================

The effect block (:meth:`EffectRecord.block`) holds the outcome, confirmation, comparison, the
names of the fields that differ, the observation method, both effect digests, the response
digest, the provider's reference, the receipt comparison and the record's digest: never a
provider body, a parameter value or a credential.

Callers: families (``agentsafe.executor.banking``); ``lifecycle/attempt.py`` (reads the
record it takes from the register); the pipeline reaches ``admit`` through the registry.
Also imported by ``banking/actions.py``, ``banking/registration.py``, ``banking/transport.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ..canonical import sha256_digest
from ..codes import Code
from ..dispatch.effects import EffectRegister
from ..dispatch.seam import (
    Dispatch,
    ExecutionContext,
    ProviderRefused,
    ReconcileResult,
)
from ..errors import RequestRejected
from ..jws import TokenRefused, split_compact
from .receipts import ProviderKeys, ReceiptComparison, ReceiptReading

__all__ = [
    "Adapter",
    "AdapterHandler",
    "Comparison",
    "Confirmation",
    "EffectRecord",
    "ObservationMethod",
    "Prepared",
    "ProviderOutcome",
    "ProviderResult",
    "compare_effects",
]


class ProviderOutcome(StrEnum):
    COMMITTED = "COMMITTED"
    REFUSED = "REFUSED"


class Confirmation(StrEnum):
    CONFIRMED = "CONFIRMED"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    UNCONFIRMED = "UNCONFIRMED"
    UNKNOWN = "UNKNOWN"
    NOT_EFFECTED = "NOT_EFFECTED"


class Comparison(StrEnum):
    MATCH = "MATCH"
    MISMATCH = "MISMATCH"
    NOT_COMPARED = "NOT_COMPARED"


class ObservationMethod(StrEnum):
    RESPONSE = "RESPONSE"  # the provider's answer to the request
    READ_BACK = "READ_BACK"  # a read-only lookup by the provider's reference
    NONE = "NONE"  # the provider stated nothing comparable


@dataclass(frozen=True)
class Prepared:
    """What an action asks for: the transport's action and target, derived from the action
    itself, and the authorised effect in the family's projection."""

    transport_action: str
    target: str
    expected: Mapping[str, Any]
    ceiling: Mapping[str, Any] | None = None  # ``{"amountMinor", "currency"}`` for the ceilings


@dataclass(frozen=True)
class ProviderResult:
    """What the transport learned, without a body: the provider's own account is ``reported``
    (the answer's or the read-back's fields), reduced to the projection by ``observe_effect``."""

    outcome: ProviderOutcome
    status: int
    response_digest: str
    provider_reference: str | None = None
    reported: Mapping[str, Any] | None = None
    method: ObservationMethod = ObservationMethod.NONE
    posted: bool = False
    read_back_failed: bool = False
    receipt: str | None = None
    reason: str | None = None  # the refusal's reason code


class Adapter(Protocol):
    """The contract a family implements (see the module docstring)."""

    @property
    def adapter_id(self) -> str: ...

    @property
    def adapter_version(self) -> str: ...

    @property
    def parameters_schema(self) -> Mapping[str, Any]: ...

    def prepare(self, parameters: Mapping[str, Any]) -> Prepared: ...

    async def execute(
        self, prepared: Prepared, ctx: ExecutionContext, dispatch: Dispatch
    ) -> ProviderResult: ...

    def observe_effect(
        self, prepared: Prepared, result: ProviderResult
    ) -> Mapping[str, Any] | None: ...

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult: ...


def compare_effects(
    expected: Mapping[str, Any], observed: Mapping[str, Any] | None
) -> tuple[Comparison, tuple[str, ...]]:
    """Field by field: every authorised field must be observed with the same value."""
    if observed is None:
        return Comparison.NOT_COMPARED, ()
    differing = tuple(
        sorted(name for name, value in expected.items() if observed.get(name) != value)
    )
    return (Comparison.MISMATCH if differing else Comparison.MATCH), differing


@dataclass(frozen=True)
class EffectRecord:
    """What the adapter observed for one authorization (see the module docstring)."""

    grant_id: str
    observer: Mapping[str, str]
    outcome: ProviderOutcome
    confirmation: Confirmation
    comparison: Comparison
    differing_fields: tuple[str, ...]
    observation_method: ObservationMethod
    authorised_effect_digest: str
    observed_effect_digest: str | None
    response_digest: str
    provider_reference: str | None
    receipt: ReceiptReading = field(
        default_factory=lambda: ReceiptReading(ReceiptComparison.ABSENT)
    )

    @property
    def mismatch(self) -> bool:
        return (
            self.comparison is Comparison.MISMATCH
            or self.receipt.comparison is ReceiptComparison.MISMATCH
        )

    def _fields(self) -> dict[str, Any]:
        return {
            "grant_id": self.grant_id,
            "observer": dict(self.observer),
            "outcome": self.outcome.value,
            "confirmation": self.confirmation.value,
            "comparison": self.comparison.value,
            "differing_fields": list(self.differing_fields),
            "observation_method": self.observation_method.value,
            "authorised_effect_digest": self.authorised_effect_digest,
            "observed_effect_digest": self.observed_effect_digest,
            "response_digest": self.response_digest,
            "provider_reference": self.provider_reference,
            "receipt_comparison": self.receipt.comparison.value,
            "receipt_digest": self.receipt.digest,
            "receipt_status": self.receipt.status,
        }

    @property
    def digest(self) -> str:
        return sha256_digest(self._fields())

    def block(self) -> dict[str, Any]:
        """The answer's ``effect`` block, the evidence line's fields and what the authority's
        finalization carries."""
        return {**self._fields(), "record_digest": self.digest}

    def evidence(self) -> dict[str, Any]:
        """The register's view (``dispatch/effects.py``): the block."""
        return self.block()


def _claim_token_digest(attestation: str | None) -> str | None:
    if attestation is None:
        return None
    try:
        value = split_compact(attestation).payload.get("claim_token_digest")
    except TokenRefused:
        return None
    return value if isinstance(value, str) else None


class AdapterHandler:
    """Any adapter as a registry handler (see the module docstring)."""

    def __init__(
        self,
        adapter: Adapter,
        *,
        register: EffectRegister,
        receipts: ProviderKeys | None = None,
    ) -> None:
        self._adapter = adapter
        self._register = register
        self._receipts = receipts or ProviderKeys()

    def __repr__(self) -> str:
        return f"AdapterHandler({self._adapter.adapter_id})"

    @property
    def parameters_schema(self) -> Mapping[str, Any]:
        return self._adapter.parameters_schema

    def admit(self, target: str, parameters: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Before the authority: prepare (refusing a malformed action), the derived target must
        be the proposal's; returns the projection the host ceilings read."""
        prepared = self._adapter.prepare(parameters)
        if prepared.target != target:
            raise RequestRejected(
                Code.ACTION_TARGET_MISMATCH,
                "the proposal's target is not the one its action names; propose the derived one",
            )
        return prepared.ceiling

    def ceiling_view(self, parameters: Mapping[str, Any]) -> Mapping[str, Any] | None:
        return self._adapter.prepare(parameters).ceiling

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        prepared = self._adapter.prepare(ctx.parameters)
        result = await self._adapter.execute(prepared, ctx, dispatch)
        observed = self._adapter.observe_effect(prepared, result)
        comparison, differing = compare_effects(prepared.expected, observed)
        authorised = sha256_digest(dict(prepared.expected))
        observed_digest = sha256_digest(dict(observed)) if observed is not None else None
        committed = result.outcome is ProviderOutcome.COMMITTED
        receipt = self._receipts.compare(
            result.receipt,
            grant_id=ctx.authorization.grant_id,
            claim_token_digest=_claim_token_digest(ctx.attestation),
            provider_committed=committed,
            authorised_digest=authorised,
            observed_digest=observed_digest,
        )
        if not committed:
            confirmation = Confirmation.NOT_EFFECTED
        elif comparison is Comparison.MISMATCH or receipt.comparison is ReceiptComparison.MISMATCH:
            confirmation = Confirmation.UNKNOWN
        elif result.posted and result.method is ObservationMethod.READ_BACK:
            confirmation = Confirmation.CONFIRMED
        elif result.posted:
            confirmation = Confirmation.UNCONFIRMED
        else:
            confirmation = Confirmation.ACKNOWLEDGED
        record = EffectRecord(
            grant_id=ctx.authorization.grant_id,
            observer={
                "id": self._adapter.adapter_id,
                "version": self._adapter.adapter_version,
            },
            outcome=result.outcome,
            confirmation=confirmation,
            comparison=comparison,
            differing_fields=differing,
            observation_method=result.method,
            authorised_effect_digest=authorised,
            observed_effect_digest=observed_digest,
            response_digest=result.response_digest,
            provider_reference=result.provider_reference,
            receipt=receipt,
        )
        self._register.put(record)
        if not committed:
            raise ProviderRefused(
                result.reason or Code.PROVIDER_REFUSED, status=result.status, receipt=result.receipt
            )
        answer: dict[str, Any] = {"status": result.status, "accepted": True}
        if result.provider_reference is not None:
            answer["provider_reference"] = result.provider_reference
        if result.receipt is not None:
            answer["effect_receipt"] = result.receipt
        return answer

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        """The adapter's read-only lookup by key (``intent_hash``: the lost attempt's intent)."""
        return await self._adapter.reconcile(idempotency_key, intent_hash=intent_hash)
