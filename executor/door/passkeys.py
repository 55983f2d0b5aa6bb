"""Passkey step-up for APPROVER principals: WebAuthn registration and assertions.

The ceremonies are the ``webauthn`` package's (``generate_*_options``, ``verify_*_response``:
attestation and assertion parsing, COSE keys, signature, origin, relying party, user presence and
verification flags); this module decides only what the challenges are bound to and where the
credentials live.

- **Challenges are derived, never random alone.** An assertion's challenge is the SHA-256 of the
  canonical JSON ``{typ, principal, request_id, intent_hash, decision, nonce}``; the options come
  with a ``challenge_token`` (a JWS the executor's authority key signs, valid
  :data:`CHALLENGE_TTL_SECONDS`) naming the same fields. On the way back the token's fields must
  equal the request being decided -- its id, its intent hash, the decision, the caller -- and the
  challenge is recomputed from them: an assertion made for one intent, or for APPROVE when the
  person pressed DENY, cannot decide another (WEBAUTHN_CHALLENGE_INVALID when the token names
  another request, WEBAUTHN_ASSERTION_INVALID when the signed challenge differs). Each nonce is
  consumed once in the use store, so one assertion decides once, on any replica.
- **User verification is required**, in the options and in the verification.
- **Credentials live with the principal** in the use store (``passkeys``), shared by every replica;
  a signature counter that does not grow is refused (a cloned authenticator).
- **Enrolment** is gated by a one-time token an OPERATOR issues for one APPROVER
  (``POST /v1/control/approvers/{principal_id}/enrolment-tokens``); the store keeps only its
  SHA-256, and registering a passkey uses the token up in the same transaction.

The relying party is the approval page's origin, ``EXECUTOR_APPROVAL_ORIGIN`` (its host is the RP
id); without it no passkey can be registered or asserted (WEBAUTHN_NOT_CONFIGURED).

Callers: ``routes/approvals.py`` (the decision and enrolment routes), ``plane.py`` (builds it).
Also imported by ``routes/table.py``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers.exceptions import WebAuthnException
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    AuthenticatorTransport,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from ..canonical import canonical_json
from ..clock import Clock
from ..codes import Code
from ..errors import AgentSafeError, RequestRejected, StoreError
from ..principals import Principal, Verification
from ..state.protocol import UseStore
from ..state.records import EnrolmentToken, PasskeyRecord

__all__ = [
    "ASSERTION_TYP",
    "CHALLENGE_TTL_SECONDS",
    "ENROLMENT_TTL_SECONDS",
    "REGISTRATION_TYP",
    "Enrolment",
    "Passkeys",
    "token_digest",
]

ASSERTION_TYP: Final = "agentsafe-approval-challenge+jwt"
REGISTRATION_TYP: Final = "agentsafe-passkey-enrolment+jwt"
CHALLENGE_TTL_SECONDS: Final = 300
"""How long a challenge may be answered: the time to touch the authenticator."""
ENROLMENT_TTL_SECONDS: Final = (60, 15 * 60, 7 * 24 * 3600)
"""An enrolment token's lifetime: (least, default, most) seconds."""

_CONSUMED_NAMESPACE: Final = "webauthn-challenge"
_TIMEOUT_MS: Final = CHALLENGE_TTL_SECONDS * 1000


class HandoutSigner(Protocol):
    """The authority's hand-out signer (``policy/authority.py``): JWS of the executor's key."""

    def sign_token(self, payload: Mapping[str, Any], *, typ: str) -> str: ...

    def verify_token(self, token: str, *, typ: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Enrolment:
    """A freshly issued enrolment token (shown once) and its lifetime."""

    token: str
    principal: str
    expires_at: float


def token_digest(token: str) -> str:
    """What the store keeps of an enrolment token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _challenge(fields: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(canonical_json(dict(fields))).digest()


def _assertion_fields(
    approver: Principal, request_id: str, intent_hash: str, decision: str
) -> dict[str, str]:
    """What an assertion's challenge is bound to (besides its nonce)."""
    return {
        "typ": ASSERTION_TYP,
        "principal": approver.id,
        "request_id": request_id,
        "intent_hash": intent_hash,
        "decision": decision,
    }


def _user_handle(principal_id: str) -> bytes:
    return hashlib.sha256(b"agentsafe.approver/1\x00" + principal_id.encode("utf-8")).digest()


class Passkeys:
    """The passkeys of APPROVER principals; see the module docstring."""

    def __init__(
        self,
        *,
        store: UseStore,
        signer: HandoutSigner,
        clock: Clock,
        origin: str | None,
        rp_name: str = "agentsafe approvals",
    ) -> None:
        self._store = store
        self._signer = signer
        self._clock = clock
        self._origin = origin
        self._rp_id = urlsplit(origin).hostname if origin else None
        self._rp_name = rp_name

    @property
    def configured(self) -> bool:
        return self._origin is not None

    def _relying_party(self) -> tuple[str, str]:
        if self._origin is None or self._rp_id is None:
            raise RequestRejected(
                Code.WEBAUTHN_NOT_CONFIGURED,
                "passkeys need EXECUTOR_APPROVAL_ORIGIN (the approval page's https origin)",
            )
        return self._origin, self._rp_id

    def _claims(self, token: object, typ: str, code: Code) -> dict[str, Any]:
        try:
            claims = self._signer.verify_token(str(token), typ=typ)
        except (AgentSafeError, ValueError):
            raise RequestRejected(code, "the challenge token does not verify") from None
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or self._clock.now() >= exp:
            raise RequestRejected(code, "the challenge has expired; ask for a new one")
        return claims

    async def _consume(self, nonce: str, binding: dict[str, Any], code: Code) -> None:
        consumed = await self._store.consume(
            _CONSUMED_NAMESPACE, nonce, binding=binding, now=self._clock.now()
        )
        if consumed is None:
            raise RequestRejected(code, "this challenge was answered before")

    # -- assertions (deciding an escalation) -----------------------------------------------------

    async def credentials(self, principal_id: str) -> list[PasskeyRecord]:
        return await self._store.passkey_list(principal_id)

    async def assertion_options(
        self, approver: Principal, *, request_id: str, intent_hash: str, decision: str
    ) -> dict[str, Any]:
        """The ``publicKey`` request options and the ``challenge_token`` for one decision."""
        _, rp_id = self._relying_party()
        passkeys = await self._store.passkey_list(approver.id)
        if not passkeys:
            raise RequestRejected(
                Code.WEBAUTHN_NO_CREDENTIAL,
                "no passkey is enrolled for this approver; ask an operator for an enrolment token",
            )
        fields = {
            **_assertion_fields(approver, request_id, intent_hash, decision),
            "nonce": secrets.token_urlsafe(24),
        }
        options = generate_authentication_options(
            rp_id=rp_id,
            challenge=_challenge(fields),
            timeout=_TIMEOUT_MS,
            allow_credentials=[
                PublicKeyCredentialDescriptor(
                    id=_unb64url(p.credential_id), transports=_transports(p.transports)
                )
                for p in passkeys
            ],
            user_verification=UserVerificationRequirement.REQUIRED,
        )
        token = self._signer.sign_token(
            {**fields, "exp": int(self._clock.now()) + CHALLENGE_TTL_SECONDS}, typ=ASSERTION_TYP
        )
        return {"challenge_token": token, "publicKey": json.loads(options_to_json(options))}

    async def verify_assertion(
        self,
        approver: Principal,
        *,
        request_id: str,
        intent_hash: str,
        decision: str,
        challenge_token: object,
        credential: Mapping[str, Any],
    ) -> Verification:
        """``WEBAUTHN`` when ``credential`` is this approver's passkey answering the challenge
        for exactly this request, intent and decision; a refusal otherwise."""
        origin, rp_id = self._relying_party()
        bad_challenge = Code.WEBAUTHN_CHALLENGE_INVALID
        claims = self._claims(challenge_token, ASSERTION_TYP, bad_challenge)
        fields = _assertion_fields(approver, request_id, intent_hash, decision)
        if any(claims.get(name) != value for name, value in fields.items()):
            raise RequestRejected(
                bad_challenge,
                "the challenge was issued for another request, intent, decision or approver",
            )
        nonce = claims.get("nonce")
        if not isinstance(nonce, str) or not nonce:
            raise RequestRejected(bad_challenge, "the challenge token is malformed")
        passkey = await self._passkey(approver.id, credential)
        try:
            verified = verify_authentication_response(
                credential=dict(credential),
                expected_challenge=_challenge({**fields, "nonce": nonce}),
                expected_rp_id=rp_id,
                expected_origin=origin,
                credential_public_key=passkey.public_key,
                credential_current_sign_count=passkey.sign_count,
                require_user_verification=True,
            )
        except (WebAuthnException, ValueError, TypeError, KeyError):
            raise RequestRejected(
                Code.WEBAUTHN_ASSERTION_INVALID,
                "the passkey assertion does not verify for this request",
            ) from None
        await self._consume(nonce, dict(fields), bad_challenge)
        try:
            await self._store.passkey_used(
                approver.id,
                passkey.credential_id,
                sign_count=verified.new_sign_count,
                now=self._clock.now(),
            )
        except StoreError as exc:
            if exc.code != Code.WEBAUTHN_ASSERTION_INVALID:
                raise
            raise RequestRejected(exc.code, str(exc)) from None
        return Verification.WEBAUTHN

    async def _passkey(self, principal_id: str, credential: Mapping[str, Any]) -> PasskeyRecord:
        credential_id = credential.get("id")
        for passkey in await self._store.passkey_list(principal_id):
            if passkey.credential_id == credential_id:
                return passkey
        raise RequestRejected(
            Code.WEBAUTHN_ASSERTION_INVALID,
            "the assertion is not made with this approver's passkey",
        )

    # -- enrolment ---------------------------------------------------------------------------------

    async def issue_enrolment(
        self, approver: Principal, *, issued_by: str, ttl_seconds: int | None = None
    ) -> Enrolment:
        """A one-time enrolment token for ``approver`` (an APPROVER); only its digest is kept."""
        self._relying_party()
        if approver.role.value != "APPROVER":
            raise RequestRejected(
                Code.ENROLMENT_PRINCIPAL_INVALID, "enrolment tokens are only for APPROVERs"
            )
        low, default, high = ENROLMENT_TTL_SECONDS
        ttl = default if ttl_seconds is None else ttl_seconds
        if not low <= ttl <= high:
            raise RequestRejected(
                Code.REQUEST_INVALID, f"ttl_seconds must be between {low} and {high}"
            )
        token = secrets.token_urlsafe(32)
        now = self._clock.now()
        await self._store.enrolment_issue(
            EnrolmentToken(
                token_digest=token_digest(token),
                principal=approver.id,
                issued_by=issued_by,
                issued_at=now,
                expires_at=now + ttl,
            )
        )
        return Enrolment(token=token, principal=approver.id, expires_at=now + ttl)

    async def _enrolment(self, token: str) -> EnrolmentToken:
        found = await self._store.enrolment_get(token_digest(token), now=self._clock.now())
        if found is None:
            raise RequestRejected(
                Code.ENROLMENT_TOKEN_INVALID,
                "the enrolment token is unknown, expired or used; ask an operator for a new one",
            )
        return found

    async def registration_options(self, token: str, *, display_name: str) -> dict[str, Any]:
        """The ``publicKey`` creation options for the token's approver, and their token."""
        _, rp_id = self._relying_party()
        enrolment = await self._enrolment(token)
        fields = {
            "typ": REGISTRATION_TYP,
            "principal": enrolment.principal,
            "token_digest": enrolment.token_digest,
            "nonce": secrets.token_urlsafe(24),
        }
        existing = await self._store.passkey_list(enrolment.principal)
        options = generate_registration_options(
            rp_id=rp_id,
            rp_name=self._rp_name,
            user_id=_user_handle(enrolment.principal),
            user_name=enrolment.principal,
            user_display_name=display_name,
            challenge=_challenge(fields),
            timeout=_TIMEOUT_MS,
            authenticator_selection=AuthenticatorSelectionCriteria(
                resident_key=ResidentKeyRequirement.PREFERRED,
                user_verification=UserVerificationRequirement.REQUIRED,
            ),
            exclude_credentials=[
                PublicKeyCredentialDescriptor(id=_unb64url(p.credential_id)) for p in existing
            ],
        )
        challenge_token = self._signer.sign_token(
            {**fields, "exp": int(self._clock.now()) + CHALLENGE_TTL_SECONDS},
            typ=REGISTRATION_TYP,
        )
        return {
            "principal": enrolment.principal,
            "challenge_token": challenge_token,
            "publicKey": json.loads(options_to_json(options)),
        }

    async def register(
        self,
        token: str,
        *,
        principal: Principal,
        challenge_token: object,
        credential: Mapping[str, Any],
    ) -> PasskeyRecord:
        """Verify the registration and store the passkey for ``principal`` (the approver signed
        in, who must be the one the token was issued for), using the enrolment token up."""
        origin, rp_id = self._relying_party()
        enrolment = await self._enrolment(token)
        if enrolment.principal != principal.id:
            raise RequestRejected(
                Code.ENROLMENT_TOKEN_INVALID, "this enrolment token was issued for someone else"
            )
        bad = Code.WEBAUTHN_REGISTRATION_INVALID
        claims = self._claims(challenge_token, REGISTRATION_TYP, bad)
        fields = {
            "typ": REGISTRATION_TYP,
            "principal": enrolment.principal,
            "token_digest": enrolment.token_digest,
        }
        nonce = claims.get("nonce")
        if any(claims.get(k) != v for k, v in fields.items()) or not isinstance(nonce, str):
            raise RequestRejected(bad, "the challenge was issued for another enrolment")
        try:
            verified = verify_registration_response(
                credential=dict(credential),
                expected_challenge=_challenge({**fields, "nonce": nonce}),
                expected_rp_id=rp_id,
                expected_origin=origin,
                require_user_verification=True,
            )
        except (WebAuthnException, ValueError, TypeError, KeyError):
            raise RequestRejected(bad, "the passkey registration does not verify") from None
        await self._consume(nonce, dict(fields), bad)
        response = credential.get("response")
        transports = response.get("transports") if isinstance(response, Mapping) else None
        passkey = PasskeyRecord(
            principal=enrolment.principal,
            credential_id=_b64url(verified.credential_id),
            public_key=verified.credential_public_key,
            sign_count=verified.sign_count,
            created_at=self._clock.now(),
            transports=tuple(t for t in (transports or []) if isinstance(t, str) and len(t) <= 32)[
                :8
            ],
        )
        try:
            await self._store.passkey_enrol(enrolment.token_digest, passkey, now=self._clock.now())
        except StoreError as exc:
            if exc.code not in (Code.ENROLMENT_TOKEN_INVALID, bad):
                raise
            raise RequestRejected(exc.code, str(exc)) from None
        return passkey


def _transports(names: tuple[str, ...]) -> list[AuthenticatorTransport] | None:
    known = [AuthenticatorTransport(n) for n in names if n in set(AuthenticatorTransport)]
    return known or None
