"""Effect receipts (VP-3): a provider's own signed account of what it did, compared, never trusted.

A provider that verified the claim may answer with ``x-agent-safe-effect-receipt``: a compact
EdDSA JWS (``typ`` ``agentsafe-effect-receipt+jwt``, see ``provider.sign_effect_receipt``) under a
key the organisation registered with the built-in authority (the policy's ``providerKeys``
section: ``kid``, ``issuer`` and the raw 32-byte Ed25519 public key, base64url). It names the
grant it acted under (``sub``), the claim it answered (the attestation's ``claim_token_digest``),
a ``status`` (``EFFECTED``, ``POSTED``, ``ACCEPTED`` or ``REFUSED``) and, when it can state one,
the ``effect_digest`` of what it applied.

:meth:`ProviderKeys.compare` reads one receipt against the executor's own account and answers a
:class:`ReceiptComparison`:

=========  =================================================================================
MATCH      it verifies, names this grant and claim, and its digest is the authorised effect's
           (and the observed one's, when there is an observation)
SILENT     it verifies and names this grant and claim, but states no effect digest
ABSENT     the provider sent no receipt header at all
MISMATCH   it is not a compact JWS within the bound (the handler hands
           ``dispatch/forward.py``'s ``INVALID_RECEIPT`` for such a header: garbage, ``alg``
           none with an empty signature, oversized), it does not verify (unknown key, bad
           signature, wrong ``typ`` or issuer), names
           another grant or claim, its status contradicts the provider's answer, or its digest
           differs from the authorised or the observed effect
=========  =================================================================================

An unverifiable receipt is MISMATCH rather than ABSENT: a second witness that cannot be
authenticated is a disagreement an operator must look at, never silence. A receipt is only ever
compared: it never changes the outcome and never makes a finalization fail (the pipeline
finalizes first and reads the effect record afterwards).

The JWS is read and verified by ``jws.py``, the one JWS module; its ``typ`` is the provider
side's (``provider.py``). :meth:`ProviderKeys.check` is the one verification (key, signature,
issuer, grant, claim): the bridge compares through it, and the built-in authority's finalization
(``policy/authority.py``) verifies the receipt it is handed through it.

Callers: ``effects/adapter.py`` (the bridge compares every receipt a transport carried);
``assembly.py`` builds one :class:`ProviderKeys` from the policy for the bridge and the
authority.
Also imported by ``banking/registration.py``, ``lifecycle/attempt.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..canonical import sha256_bytes_digest
from ..codes import Code
from ..errors import ConfigError
from ..jws import TokenRefused, b64url_decode, split_compact, verify_compact

__all__ = [
    "ProviderKeys",
    "ReceiptCheck",
    "ReceiptComparison",
    "ReceiptReading",
]

EFFECT_RECEIPT_TYP = "agentsafe-effect-receipt+jwt"
"""The receipt's JWS ``typ``: the same string ``provider.py`` signs with (a provider vendors that
module, so the server keeps its own copy; ``tests/test_contracts.py`` holds them equal)."""

_COMMITTED_STATUSES = frozenset({"EFFECTED", "POSTED", "ACCEPTED"})
_REFUSED_STATUSES = frozenset({"REFUSED"})


class ReceiptComparison(StrEnum):
    MATCH = "MATCH"
    SILENT = "SILENT"
    ABSENT = "ABSENT"
    MISMATCH = "MISMATCH"


@dataclass(frozen=True)
class ReceiptReading:
    """What the effect record keeps of a receipt: never the token itself, only its digest."""

    comparison: ReceiptComparison
    status: str | None = None
    digest: str | None = None  # sha256 of the token's bytes
    effect_digest: str | None = None
    reason: str | None = None  # why MISMATCH: an EFFECT_RECEIPT_* code, for the security event


@dataclass(frozen=True)
class ReceiptCheck:
    """A receipt verified (or not) against the registered keys and its authorization."""

    digest: str  # sha256 of the token's bytes
    verified: bool
    status: str | None = None
    effect_digest: str | None = None
    reason: str | None = None  # why it did not verify: an EFFECT_RECEIPT_* code


@dataclass(frozen=True)
class _Key:
    issuer: str
    key: Ed25519PublicKey


class ProviderKeys:
    """The provider keys registered with the built-in authority, by ``kid``."""

    def __init__(self, keys: Mapping[str, tuple[str, Ed25519PublicKey]] | None = None) -> None:
        self._keys = {kid: _Key(issuer, key) for kid, (issuer, key) in (keys or {}).items()}

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, Any]]) -> ProviderKeys:
        """From the policy's ``providerKeys`` entries (``kid``, ``issuer``, ``publicKey``)."""
        keys: dict[str, tuple[str, Ed25519PublicKey]] = {}
        for entry in entries:
            kid = str(entry["kid"])
            try:
                raw = b64url_decode(str(entry["publicKey"]))
                if len(raw) != 32:
                    raise ValueError
                key = Ed25519PublicKey.from_public_bytes(raw)
            except (TokenRefused, ValueError):
                raise ConfigError(
                    "EXECUTOR_POLICY_FILE",
                    f"providerKeys {kid!r}: {Code.PROVIDER_KEY_INVALID.meaning}",
                ) from None
            keys[kid] = (str(entry["issuer"]), key)
        return cls(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, receipt: str, *, grant_id: str, claim_token_digest: str | None) -> ReceiptCheck:
        """Verify ``receipt`` against the registered keys and the authorization it must name:
        the signature under a registered ``kid``, the ``typ``, the key's issuer, the grant
        (``sub``) and, when the claim was attested, the claim (``claim_token_digest``).

        This is the one verification: the bridge's :meth:`compare` and the built-in authority's
        finalization (``policy/authority.py``) both read a receipt through it."""
        digest = sha256_bytes_digest(receipt)
        try:
            compact = split_compact(receipt)
            if compact.header.get("typ") != EFFECT_RECEIPT_TYP:
                raise TokenRefused("not an effect receipt", code=Code.JWS_TYPE_MISMATCH)
            entry = self._keys.get(str(compact.header.get("kid")))
            if entry is None:
                raise TokenRefused("no registered provider key", code=Code.JWS_KEY_UNKNOWN)
            verify_compact(compact, entry.key, algorithms=["EdDSA"])
        except TokenRefused:
            return ReceiptCheck(digest, verified=False, reason=Code.EFFECT_RECEIPT_INVALID)
        claims = compact.payload
        status = claims.get("status") if isinstance(claims.get("status"), str) else None
        effect = claims.get("effect_digest")
        effect_digest = effect if isinstance(effect, str) else None

        def refused(reason: str) -> ReceiptCheck:
            return ReceiptCheck(
                digest, verified=False, status=status, effect_digest=effect_digest, reason=reason
            )

        if claims.get("iss") != entry.issuer:
            return refused(Code.EFFECT_RECEIPT_ISSUER_MISMATCH)
        if claims.get("sub") != grant_id:
            return refused(Code.EFFECT_RECEIPT_GRANT_MISMATCH)
        if claim_token_digest is not None and claims.get("claim_token_digest") != (
            claim_token_digest
        ):
            return refused(Code.EFFECT_RECEIPT_CLAIM_MISMATCH)
        return ReceiptCheck(digest, verified=True, status=status, effect_digest=effect_digest)

    def compare(
        self,
        receipt: str | None,
        *,
        grant_id: str,
        claim_token_digest: str | None,
        provider_committed: bool,
        authorised_digest: str,
        observed_digest: str | None,
    ) -> ReceiptReading:
        """Read ``receipt`` against the executor's own account (see the module docstring)."""
        if receipt is None:
            return ReceiptReading(ReceiptComparison.ABSENT)
        checked = self.check(receipt, grant_id=grant_id, claim_token_digest=claim_token_digest)
        status, effect_digest = checked.status, checked.effect_digest

        def mismatch(reason: str) -> ReceiptReading:
            return ReceiptReading(
                ReceiptComparison.MISMATCH,
                status=status,
                digest=checked.digest,
                effect_digest=effect_digest,
                reason=reason,
            )

        if not checked.verified:
            return mismatch(checked.reason or Code.EFFECT_RECEIPT_INVALID)
        committed = status in _COMMITTED_STATUSES
        if (provider_committed and not committed) or (
            not provider_committed and status not in _REFUSED_STATUSES
        ):
            return mismatch(Code.EFFECT_RECEIPT_STATUS_MISMATCH)
        if effect_digest is None:
            return ReceiptReading(ReceiptComparison.SILENT, status=status, digest=checked.digest)
        if effect_digest != authorised_digest or (
            observed_digest is not None and effect_digest != observed_digest
        ):
            return mismatch(Code.EFFECT_RECEIPT_DIGEST_MISMATCH)
        return ReceiptReading(
            ReceiptComparison.MATCH,
            status=status,
            digest=checked.digest,
            effect_digest=effect_digest,
        )
