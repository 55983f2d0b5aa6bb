"""What the SYNTHETIC provider demands of a caller: one downstream credential kind, checked.

Role: with a requirement, the synthetic provider (``tools/synthetic.py``) refuses every payout and
every lookup that does not prove the executor, the way a system of record does, so a test can show
that dispatch *and reconciliation* work under each ``DOWNSTREAM_CREDENTIAL_KIND`` against a
provider that checks:

==================  ==========================================================================
kind                what is checked
==================  ==========================================================================
STATIC_HEADER       the configured header carries exactly the configured value
PRIVATE_KEY_JWT     ``POST /oauth/token`` takes a ``private_key_jwt`` client assertion (ES256 or
                    PS256 under the client's public key; ``iss`` = ``sub`` = the client id,
                    ``aud`` the token URL, ``exp`` in the future) and issues a bearer that every
                    later request must carry
SIGNED_REQUEST      :func:`agentsafe.executor.provider.verify_provider_request`: a payout must
                    cover the dispatch components (and verify the attestation when it carries
                    one, against ``authority_jwks``); a lookup must cover the five components
                    every signed request covers, and its ``idempotency-key`` must be the key it
                    asks about
==================  ==========================================================================

A requirement is a JSON document (``--require-credential FILE`` on the command line):
``{"kind": "STATIC_HEADER", "header": ..., "value": ...}``, ``{"kind": "PRIVATE_KEY_JWT",
"client_id": ..., "public_key_pem": ...}`` or ``{"kind": "SIGNED_REQUEST", "keys": {keyid: JWK},
"authority_jwks": {...}}`` (an ``OKP`` JWK for ed25519, an ``oct`` JWK for hmac-sha256).

The client assertion check is written here rather than with a JOSE library on purpose: this is a
test double of a provider, and it must not share code with what it checks (the executor's own JWS
code); it verifies only the two algorithms the executor signs with.

Callers: ``tools/synthetic.py``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ..egress.httpsig import BASE_COMPONENTS, DISPATCH_COMPONENTS
from ..provider import MemorySeenStore, verify_provider_request

__all__ = ["KINDS", "CredentialRequirement", "Refusal"]

KINDS = ("STATIC_HEADER", "PRIVATE_KEY_JWT", "SIGNED_REQUEST")
TOKEN_PATH = "/oauth/token"
TOKEN_LIFETIME_S = 300
_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: the provider answers ``status`` with ``{"code": code}``."""

    status: int
    code: str


@dataclass
class CredentialRequirement:
    """One credential kind the provider demands (see the module docstring)."""

    kind: str
    header: str = "authorization"
    value: str = ""
    client_id: str = ""
    public_key_pem: str = ""
    keys: Mapping[str, Any] = field(default_factory=dict)
    authority_jwks: Mapping[str, Any] = field(default_factory=dict)
    issued: dict[str, float] = field(default_factory=dict, repr=False)
    seen: MemorySeenStore = field(default_factory=MemorySeenStore, repr=False)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> CredentialRequirement:
        kind = document.get("kind")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        requirement = cls(
            kind=str(kind),
            header=str(document.get("header", "authorization")).lower(),
            value=str(document.get("value", "")),
            client_id=str(document.get("client_id", "")),
            public_key_pem=str(document.get("public_key_pem", "")),
            keys=dict(document.get("keys", {})),
            authority_jwks=dict(document.get("authority_jwks", {})),
        )
        if kind == "STATIC_HEADER" and not requirement.value:
            raise ValueError("STATIC_HEADER needs a value")
        if kind == "PRIVATE_KEY_JWT" and not (requirement.client_id and requirement.public_key_pem):
            raise ValueError("PRIVATE_KEY_JWT needs client_id and public_key_pem")
        if kind == "SIGNED_REQUEST" and not requirement.keys:
            raise ValueError("SIGNED_REQUEST needs keys")
        return requirement

    # -- requests -----------------------------------------------------------------------------
    def check(
        self,
        *,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        lookup_key: str | None = None,
    ) -> Refusal | None:
        """``None`` if the request proves the executor; a payout when ``lookup_key`` is None."""
        lowered = [(name.lower(), value) for name, value in headers]
        if self.kind == "STATIC_HEADER":
            values = [value for name, value in lowered if name == self.header]
            if len(values) != 1 or not hmac.compare_digest(values[0], self.value):
                return Refusal(401, "CREDENTIAL_REFUSED")
            return None
        if self.kind == "PRIVATE_KEY_JWT":
            values = [value for name, value in lowered if name == "authorization"]
            token = values[0].removeprefix("Bearer ") if len(values) == 1 else ""
            expiry = self.issued.get(token)
            if expiry is None or expiry < time.time():
                return Refusal(401, "ACCESS_TOKEN_REFUSED")
            return None
        required = (
            BASE_COMPONENTS if lookup_key is not None else BASE_COMPONENTS + DISPATCH_COMPONENTS
        )
        verdict = verify_provider_request(
            method=method,
            path=path,
            headers=headers,
            body=body,
            keys=self.keys,
            authority_jwks=self.authority_jwks,
            now=time.time(),
            seen_store=self.seen,
            required_components=required,
        )
        if not verdict.accepted:
            return Refusal(401, verdict.code)
        if lookup_key is not None:
            keys = [value for name, value in lowered if name == "idempotency-key"]
            if keys != [lookup_key]:
                return Refusal(401, "LOOKUP_KEY_NOT_SIGNED")
        return None

    # -- the token endpoint -------------------------------------------------------------------
    def issue_token(self, form: Mapping[str, str], token_url: str) -> tuple[int, dict[str, Any]]:
        """Answer ``POST /oauth/token`` (client credentials with a ``private_key_jwt``)."""
        if self.kind != "PRIVATE_KEY_JWT":
            return 404, {"code": "NOT_FOUND"}
        if (
            form.get("grant_type") != "client_credentials"
            or form.get("client_assertion_type") != _ASSERTION_TYPE
            or form.get("client_id") != self.client_id
        ):
            return 400, {"error": "invalid_request"}
        if not self._assertion_valid(form.get("client_assertion", ""), token_url):
            return 401, {"error": "invalid_client"}
        token = secrets.token_urlsafe(32)
        self.issued[token] = time.time() + TOKEN_LIFETIME_S
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": TOKEN_LIFETIME_S}

    def _assertion_valid(self, assertion: str, token_url: str) -> bool:
        parts = assertion.split(".")
        if len(parts) != 3:
            return False
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except (ValueError, binascii.Error):
            return False
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return False
        signed = f"{parts[0]}.{parts[1]}".encode("ascii")
        key = serialization.load_pem_public_key(self.public_key_pem.encode("ascii"))
        try:
            if header.get("alg") == "ES256" and isinstance(key, ec.EllipticCurvePublicKey):
                if len(signature) != 64:
                    return False
                der = encode_dss_signature(
                    int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
                )
                key.verify(der, signed, ec.ECDSA(hashes.SHA256()))
            elif header.get("alg") == "PS256" and isinstance(key, rsa.RSAPublicKey):
                key.verify(
                    signature,
                    signed,
                    padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32),
                    hashes.SHA256(),
                )
            else:
                return False
        except InvalidSignature:
            return False
        now = time.time()
        exp = claims.get("exp")
        return (
            claims.get("iss") == self.client_id
            and claims.get("sub") == self.client_id
            and claims.get("aud") == token_url
            and isinstance(exp, int)
            and exp > now
        )


def _unb64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
