"""Downstream credentials: how this process proves itself to the downstream, per request.

Role: ``DOWNSTREAM_CREDENTIAL_KIND`` selects one :class:`DownstreamCredential`; a handler asks it
for headers at the moment of dispatch (before the point of no return) and never holds a value.

* STATIC_HEADER: :class:`StaticHeaderCredential`, one header (``DOWNSTREAM_CREDENTIAL_HEADER``)
  whose value is read from a secret handle at the moment it is asked for.
* PRIVATE_KEY_JWT: :class:`PrivateKeyJwtCredential`, OAuth 2.0 client credentials with a
  ``private_key_jwt`` client assertion (ES256 or PS256) posted through the egress guard; the
  access token is held in a secret handle until thirty seconds before it expires, one refresh in
  flight at a time; ``on_token`` hears of each new token (the process registers it with its
  redactor, so a provider that reflects it is caught as a known secret).
* SIGNED_REQUEST: :class:`SignedRequestCredential`, an RFC 9421 signature (label ``agentsafe``)
  with an RFC 9530 ``content-digest`` over method, path, body, idempotency key, intent hash and,
  on a dispatch, grant, decision and the authority's claim attestation.

:mod:`agentsafe.executor.headers` lists the headers the executor writes itself; the static header
credential may name none of them.

A credential that cannot produce headers raises :class:`CredentialUnavailable`; the handler maps it
to FAILED_BEFORE_DISPATCH (nothing was sent). Callers: ``assembly.py`` (construction from the
configuration), ``dispatch/forward.py`` (the :class:`DownstreamCredential` contract and
``headers_for`` at dispatch).
Also imported by ``banking/registration.py``, ``banking/transport.py``,
``dispatch/registration.py``, ``gateway/forward.py``.
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol
from urllib.parse import urlencode

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from yarl import URL

from ..canonical import canonical_json, parse_json
from ..clock import Clock, SystemClock
from ..codes import Code
from ..errors import AgentSafeError, CanonicalizationError, ConfigError, HandlerError
from ..headers import HEADER_NAME, is_reserved
from ..host.secrets import SecretHandle as HeldSecret
from ..jws import sign_compact
from .httpsig import (
    SignatureError,
    SignatureParams,
    components_for,
    content_digest,
    sign_base,
    signature_base,
)
from .transport import Transport, TransportError

__all__ = [
    "CLIENT_ASSERTION_TYPE",
    "CredentialUnavailable",
    "DownstreamCredential",
    "PrivateKeyJwtCredential",
    "SignedRequestCredential",
    "StaticHeaderCredential",
]

CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_LIFETIME_S = 60
REFRESH_MARGIN_S = 30
_TOKEN68 = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
_MAX_TOKEN_LENGTH = 8192
_UNSAFE_VALUE = re.compile(r"[\r\n\x00]")
"""What a static header's value may not hold (CR, LF, NUL); a pattern rather than a generator,
which would re-enter this module once the secret is read (issue 32)."""


class SecretHandle(Protocol):
    """The ``secrets.py`` handle contract, restated structurally so this module stands alone."""

    name: str

    def reveal(self) -> AbstractContextManager[bytearray]: ...


class DownstreamCredential(Protocol):
    async def headers_for(
        self,
        *,
        method: str,
        url: str,
        body: bytes,
        idempotency_key: str,
        intent_hash: str,
        grant_id: str | None = None,
        decision_id: str | None = None,
        attestation: str | None = None,
    ) -> dict[str, str]: ...


class StaticHeaderCredential:
    """One fixed header (``DOWNSTREAM_CREDENTIAL_HEADER``) carrying a secret's value."""

    def __init__(self, header: str, secret: SecretHandle) -> None:
        if not HEADER_NAME.fullmatch(header) or is_reserved(header):
            raise ConfigError("DOWNSTREAM_CREDENTIAL_HEADER", "not a usable header name")
        self._header = header.lower()
        self._secret = secret

    def __repr__(self) -> str:
        return f"StaticHeaderCredential(header={self._header!r})"

    async def headers_for(
        self,
        *,
        method: str,
        url: str,
        body: bytes,
        idempotency_key: str,
        intent_hash: str,
        grant_id: str | None = None,
        decision_id: str | None = None,
        attestation: str | None = None,
    ) -> dict[str, str]:
        with self._secret.reveal() as value:
            try:
                text = bytes(value).decode("ascii")
            except UnicodeDecodeError:
                text = ""
        if not text or _UNSAFE_VALUE.search(text) or text != text.strip():
            raise HandlerError(
                "the downstream credential is unusable", code=Code.CREDENTIAL_INVALID
            )
        return {self._header: text}


class CredentialUnavailable(AgentSafeError):
    """The credential could not produce headers; nothing was sent (FAILED_BEFORE_DISPATCH)."""

    code = Code.DOWNSTREAM_CREDENTIAL_UNAVAILABLE


def _load_private_key(secret: SecretHandle, variable: str) -> Any:
    with secret.reveal() as pem:
        try:
            return serialization.load_pem_private_key(bytes(pem), password=None)
        except (ValueError, TypeError):
            raise ConfigError(variable, "not an unencrypted PKCS#8 PEM private key") from None
        except Exception:  # cryptography's UnsupportedAlgorithm
            raise ConfigError(variable, "unsupported private key") from None


class PrivateKeyJwtCredential:
    """OAuth 2.0 client credentials authenticated by a ``private_key_jwt`` assertion.

    The assertion: ``iss`` = ``sub`` = ``client_id``, ``aud`` = ``audience`` or the token URL,
    a fresh ``jti``, ``iat`` now and ``exp`` sixty seconds later, signed ES256 (P-256) or PS256
    (RSA) with ``DOWNSTREAM_PRIVATE_KEY``. The key is checked against the algorithm at
    construction and read from its handle only while signing.
    """

    def __init__(
        self,
        *,
        client_id: str,
        token_url: str,
        private_key: SecretHandle,
        transport: Transport,
        algorithm: Literal["ES256", "PS256"] = "ES256",
        audience: str | None = None,
        key_id: str | None = None,
        scope: str | None = None,
        clock: Clock | None = None,
        timeout_s: float = 10.0,
        on_token: Callable[[bytes], None] | None = None,
    ) -> None:
        if not client_id:
            raise ConfigError("DOWNSTREAM_CLIENT_ID", "must be set")
        if algorithm not in ("ES256", "PS256"):
            raise ConfigError("DOWNSTREAM_SIGNING_ALGORITHM", "must be ES256 or PS256")
        key = _load_private_key(private_key, "DOWNSTREAM_PRIVATE_KEY")
        if algorithm == "ES256" and not (
            isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
        ):
            raise ConfigError("DOWNSTREAM_PRIVATE_KEY", "ES256 needs a P-256 key")
        if algorithm == "PS256" and not (
            isinstance(key, rsa.RSAPrivateKey) and key.key_size >= 2048
        ):
            raise ConfigError("DOWNSTREAM_PRIVATE_KEY", "PS256 needs an RSA key of 2048+ bits")
        del key
        self._client_id = client_id
        self._token_url = token_url
        self._audience = audience or token_url
        self._secret = private_key
        self._transport = transport
        self._algorithm = algorithm
        self._key_id = key_id
        self._scope = scope
        self._clock = clock or SystemClock()
        self._timeout_s = timeout_s
        self._token: HeldSecret | None = None
        self._token_expires_at = 0.0
        self._lock = asyncio.Lock()
        self._on_token = on_token
        self.token_requests = 0

    def __repr__(self) -> str:
        return f"PrivateKeyJwtCredential(client_id={self._client_id!r}, alg={self._algorithm})"

    def client_assertion(self) -> str:
        """A fresh signed assertion (exposed for tests and diagnostics; never logged)."""
        now = int(self._clock.now())
        header: dict[str, Any] = {"alg": self._algorithm, "typ": "JWT"}
        if self._key_id:
            header["kid"] = self._key_id
        claims = {
            "iss": self._client_id,
            "sub": self._client_id,
            "aud": self._audience,
            "jti": str(uuid.uuid4()),
            "iat": now,
            "exp": now + ASSERTION_LIFETIME_S,
        }
        key = _load_private_key(self._secret, "DOWNSTREAM_PRIVATE_KEY")
        return sign_compact(header, canonical_json(claims), key)

    def _current(self) -> str | None:
        if self._token is None or self._clock.now() >= self._token_expires_at - REFRESH_MARGIN_S:
            return None
        with self._token.reveal() as value:
            return bytes(value).decode("ascii")

    async def access_token(self) -> str:
        """The cached token, or a new one; one request in flight however many callers wait."""
        token = self._current()
        if token is not None:
            return token
        async with self._lock:
            token = self._current()
            if token is not None:
                return token
            return await self._refresh()

    async def _refresh(self) -> str:
        form: dict[str, str] = {
            "grant_type": "client_credentials",
            "client_id": self._client_id,
            "client_assertion_type": CLIENT_ASSERTION_TYPE,
            "client_assertion": self.client_assertion(),
        }
        if self._scope:
            form["scope"] = self._scope
        self.token_requests += 1
        try:
            response = await self._transport.request(
                "POST",
                self._token_url,
                headers={
                    "content-type": "application/x-www-form-urlencoded",
                    "accept": "application/json",
                },
                body=urlencode(form).encode("ascii"),
                timeout=self._timeout_s,
            )
        except TransportError as exc:
            raise CredentialUnavailable(
                "the token endpoint could not be reached", code=Code.DOWNSTREAM_TOKEN_UNAVAILABLE
            ) from exc
        token, lifetime = _parse_token_response(response.status, response.body)
        issued = self._clock.now()
        old, self._token = (
            self._token,
            HeldSecret("downstream-access-token", bytearray(token, "ascii")),
        )
        self._token_expires_at = issued + lifetime
        if old is not None:
            old.dispose()
        if self._on_token is not None:
            self._on_token(token.encode("ascii"))
        return token

    async def headers_for(
        self,
        *,
        method: str,
        url: str,
        body: bytes,
        idempotency_key: str,
        intent_hash: str,
        grant_id: str | None = None,
        decision_id: str | None = None,
        attestation: str | None = None,
    ) -> dict[str, str]:
        return {"authorization": "Bearer " + await self.access_token()}


def _parse_token_response(status: int, body: bytes) -> tuple[str, float]:
    def refused(problem: str) -> CredentialUnavailable:
        return CredentialUnavailable(
            f"the token endpoint's answer is unusable: {problem}",
            code=Code.DOWNSTREAM_TOKEN_UNAVAILABLE,
        )

    if status != 200:
        raise refused(f"status {status}")
    try:
        document = parse_json(body)
    except (ValueError, CanonicalizationError, RecursionError):
        raise refused("not JSON") from None
    if not isinstance(document, dict):
        raise refused("not an object")
    token = document.get("access_token")
    token_type = document.get("token_type")
    expires_in = document.get("expires_in")
    if not isinstance(token, str) or not token or len(token) > _MAX_TOKEN_LENGTH:
        raise refused("no access_token")
    if not _TOKEN68.match(token):
        raise refused("access_token is not a bearer token")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise refused("token_type is not Bearer")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or expires_in <= 0:
        raise refused("expires_in missing or not positive")
    return token, float(expires_in)


class SignedRequestCredential:
    """RFC 9421 request signatures (``ed25519`` or ``hmac-sha256``) under ``key_id``.

    ``signing_key`` holds ``DOWNSTREAM_SIGNING_KEY``: a PKCS#8 PEM Ed25519 private key for
    ``ed25519``, at least 32 raw bytes for ``hmac-sha256``. ``headers_for`` returns every covered
    header beside ``signature-input`` and ``signature``; the handler must send them unchanged.
    """

    def __init__(
        self,
        *,
        key_id: str,
        signing_key: SecretHandle,
        algorithm: Literal["ed25519", "hmac-sha256"] = "ed25519",
        clock: Clock | None = None,
    ) -> None:
        if not key_id or not re.fullmatch(r"[\x21\x23-\x5b\x5d-\x7e]{1,128}", key_id):
            raise ConfigError("DOWNSTREAM_SIGNING_KEY_ID", "must be 1-128 visible ASCII characters")
        if algorithm == "ed25519":
            if not isinstance(
                _load_private_key(signing_key, "DOWNSTREAM_SIGNING_KEY"), Ed25519PrivateKey
            ):
                raise ConfigError("DOWNSTREAM_SIGNING_KEY", "ed25519 needs an Ed25519 key")
        elif algorithm == "hmac-sha256":
            with signing_key.reveal() as value:
                if len(value) < 32:
                    raise ConfigError("DOWNSTREAM_SIGNING_KEY", "hmac-sha256 needs 32+ bytes")
        else:
            raise ConfigError("DOWNSTREAM_SIGNING_ALGORITHM", "must be ed25519 or hmac-sha256")
        self._key_id = key_id
        self._secret = signing_key
        self._algorithm = algorithm
        self._clock = clock or SystemClock()

    def __repr__(self) -> str:
        return f"SignedRequestCredential(key_id={self._key_id!r}, alg={self._algorithm})"

    async def headers_for(
        self,
        *,
        method: str,
        url: str,
        body: bytes,
        idempotency_key: str,
        intent_hash: str,
        grant_id: str | None = None,
        decision_id: str | None = None,
        attestation: str | None = None,
    ) -> dict[str, str]:
        if (grant_id is None) != (decision_id is None):
            raise CredentialUnavailable(
                "a dispatch names both the grant and the decision",
                code=Code.SIGNATURE_INPUT_INVALID,
            )
        if attestation is not None and grant_id is None:
            raise CredentialUnavailable(
                "an attestation belongs to a dispatch", code=Code.SIGNATURE_INPUT_INVALID
            )
        covered: dict[str, str] = {
            "content-digest": content_digest(body),
            "idempotency-key": idempotency_key,
            "x-agent-safe-intent-hash": intent_hash,
        }
        if grant_id is not None and decision_id is not None:
            covered["x-agent-safe-grant-id"] = grant_id
            covered["x-agent-safe-decision-id"] = decision_id
        if attestation is not None:
            covered["x-agent-safe-claim-attestation"] = attestation
        params = SignatureParams(
            components=components_for(
                dispatch=grant_id is not None, attested=attestation is not None
            ),
            created=int(self._clock.now()),
            keyid=self._key_id,
            alg=self._algorithm,
        )
        try:
            path = URL(url, encoded=True).raw_path
            base = signature_base(params, method=method, path=path, headers=covered)
            signature = self._sign(base)
        except (SignatureError, ValueError, TypeError):
            raise CredentialUnavailable(
                "the request cannot be signed as given", code=Code.SIGNATURE_INPUT_INVALID
            ) from None
        return {
            **covered,
            "signature-input": f"agentsafe={params.serialize()}",
            "signature": "agentsafe=:" + base64.b64encode(signature).decode("ascii") + ":",
        }

    def _sign(self, base: bytes) -> bytes:
        if self._algorithm == "ed25519":
            key = _load_private_key(self._secret, "DOWNSTREAM_SIGNING_KEY")
            assert isinstance(key, Ed25519PrivateKey)
            return sign_base("ed25519", key, base)
        with self._secret.reveal() as value:
            return sign_base("hmac-sha256", bytes(value), base)
