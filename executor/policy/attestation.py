"""The authority's claim attestation: its signed statement that a grant was claimed for an intent.

Role: when the authority claims a grant it can attest the claim, and the ``SIGNED_REQUEST``
credential covers the attestation in ``x-agent-safe-claim-attestation`` so a downstream can
refuse an instruction the authority never claimed (``provider.verify_provider_request`` checks
it). The attestation is a compact EdDSA JWS, ``typ: agentsafe-claim-attestation+jwt``, signed
with the grant signing key (``grants.sign_jws``) and verifiable against the authority's JWKS::

    {"sub": <grant id>, "decision_id": ..., "iat": ..., "exp": <the claim's lease end>,
     "claim_token_digest": "sha256:<hex>",
     "binding": {"intent_hash": ..., "execution_payload_digest": ...,
                 "execution_payload_canonicalization_profile": "RFC8785/JCS"}}

Callers: ``policy/authority.py`` (issuing, in ``LocalAuthority.claim``), tests (verifying).

A provider verifies it with ``provider.py``, which stands alone.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from ..grants import KeySet, SigningKey, sign_jws, verify_jws

__all__ = [
    "ATTESTATION_TYP",
    "CANONICALIZATION_PROFILE",
    "ClaimLike",
    "claim_token_digest",
    "issue_claim_attestation",
    "verify_claim_attestation",
]

ATTESTATION_TYP = "agentsafe-claim-attestation+jwt"
CANONICALIZATION_PROFILE = "RFC8785/JCS"


class ClaimLike(Protocol):
    """The fields of ``authority.Claim`` an attestation states."""

    @property
    def grant_id(self) -> str: ...
    @property
    def decision_id(self) -> str: ...
    @property
    def expires_at(self) -> float: ...
    @property
    def intent_hash(self) -> str: ...
    @property
    def execution_payload_digest(self) -> str: ...


def claim_token_digest(grant_token: str) -> str:
    """``sha256:<hex>`` of the claimed grant token's ASCII form: names the claim without it."""
    return "sha256:" + hashlib.sha256(grant_token.encode("ascii")).hexdigest()


def issue_claim_attestation(
    claim: ClaimLike, *, claim_token_digest: str, key: SigningKey, now: float
) -> str:
    """Sign the attestation of ``claim``; it expires when the claim's lease does."""
    payload: dict[str, Any] = {
        "sub": claim.grant_id,
        "decision_id": claim.decision_id,
        "iat": int(now),
        "exp": int(claim.expires_at),
        "claim_token_digest": claim_token_digest,
        "binding": {
            "intent_hash": claim.intent_hash,
            "execution_payload_digest": claim.execution_payload_digest,
            "execution_payload_canonicalization_profile": CANONICALIZATION_PROFILE,
        },
    }
    return sign_jws(payload, typ=ATTESTATION_TYP, key=key)


def verify_claim_attestation(token: str, *, keys: KeySet) -> dict[str, Any]:
    """Signature, algorithm and type only (``grants.TokenRefused`` otherwise); the binding
    checks against a request are ``provider.verify_provider_request``'s."""
    return verify_jws(token, typ=ATTESTATION_TYP, keys=keys)
