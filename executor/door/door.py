"""The door: who is calling, and may they call this route.

:class:`Door` authenticates one request in the specification's fixed, fail-closed order and
either returns the :class:`~agentsafe.executor.principals.Principal` or raises
:class:`~agentsafe.executor.errors.RequestRejected`:

1. the window for failed unauthenticated attempts from this source (429 ``RATE_LIMITED``);
2. a client certificate together with a bearer (401 ``AUTH_AMBIGUOUS``);
3. the certificate, by SAN URI and optional pin;
4. the bearer, by digest across every bearer principal in constant time, then as a workload
   token (401 ``AUTH_FAILED`` or the ``JWT_*`` code);
5. the principal's lock (423 ``PRINCIPAL_LOCKED``, only once the credential proved the
   principal, so a lock is never an existence oracle);
6. the principal's own ``rate_limit`` (429 ``RATE_LIMITED``);
7. the route's role (403 ``ROLE_FORBIDDEN``);
8. the route's scope (403 ``SCOPE_FORBIDDEN``).

No credential at all is 401 ``AUTH_REQUIRED``. Every refusal is exactly one ``AUTH_FAILED`` line
on the security stream with ``method`` (bearer | workload | mtls | none) and ``code`` and nothing
else, one count in the metrics, and one call of the ``on_refusal`` hook (the halt's spike
detector). Failures that never became a principal count in the unauthenticated window; failures
of a proven identity (a workload token with the wrong audience, claim or times, a certificate
whose pin does not match) count towards that principal's lockout, and placing a lock is one
``PRINCIPAL_LOCKED`` line.

Legacy mode (:class:`LegacyCaller`): one PROPOSER ``legacy-caller`` whose bearer is the caller
token, read from its secret handle on every request (so a rotated token applies from the next
request) and compared as SHA-256 digests in constant time. With a client CA configured, legacy
mode requires a certificate (verified by the TLS handshake) together with the token.

Also here, the request-time check of an authenticated principal before any intent is captured:
:func:`check_action`. The checks on a captured intent (owner, separation of duties) are in
``intent.py``: the door runs before any intent exists and never imports it.

Callers: ``assembly.py`` (builds it), ``routes/door.py`` (adapts it to aiohttp for every
non-public route).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from ..clock import Clock
from ..codes import Code
from ..errors import RequestRejected
from ..events import EventSink
from ..host.metrics import ExecutorMetrics
from ..host.tlsctx import certificate_sha256, peer_san_uris
from ..principals import Principal, Role, Scope
from ..windows import DoorWindows, RateRule
from .principals_file import MtlsCredential, PrincipalRecord, PrincipalSet
from .workload import JwtRefused, WorkloadVerifier, looks_like_jwt

__all__ = [
    "Door",
    "LegacyCaller",
    "TokenHandle",
    "check_action",
]


class TokenHandle(Protocol):
    """What the door needs of a secret handle (``secrets.SecretHandle`` satisfies it)."""

    name: str

    def reveal(self) -> AbstractContextManager[bytearray]: ...


@dataclass(frozen=True)
class LegacyCaller:
    """Legacy mode: the one PROPOSER and the handle of its caller token."""

    principal: Principal
    token: TokenHandle
    require_client_certificate: bool = False


@dataclass
class _Attempt:
    method: str
    principal_id: str | None = None


class _Refusal(Exception):
    def __init__(self, code: Code, message: str, *, retry_after: int | None = None):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


class Door:
    """Authenticates and authorizes one request; see the module docstring for the order."""

    def __init__(
        self,
        principals: PrincipalSet | LegacyCaller,
        *,
        windows: DoorWindows,
        clock: Clock,
        security: EventSink,
        workload: WorkloadVerifier | None = None,
        metrics: ExecutorMetrics | None = None,
        on_refusal: Callable[[], None] | None = None,
    ) -> None:
        self._principals = principals
        self._windows = windows
        self._clock = clock
        self._security = security
        self._workload = workload
        self._metrics = metrics
        self._on_refusal = on_refusal

    @property
    def principals(self) -> PrincipalSet | LegacyCaller:
        return self._principals

    def replace_principals(self, principals: PrincipalSet | LegacyCaller) -> None:
        """Swap in a reloaded principals file; the next request sees only the new set."""
        self._principals = principals

    def authenticate(
        self,
        *,
        authorization_header: str | None,
        peer_cert_der: bytes | None,
        route_role: Role,
        route_scope: Scope | None = None,
        source: str = "",
    ) -> Principal:
        """The principal behind this request, or :class:`RequestRejected` (one AUTH_FAILED)."""
        attempt = _Attempt(method=_method_hint(authorization_header, peer_cert_der))
        try:
            return self._authenticate(
                attempt, authorization_header, peer_cert_der, route_role, route_scope, source
            )
        except _Refusal as refusal:
            self._refused(attempt, refusal.code)
            headers = {"Retry-After": str(refusal.retry_after)} if refusal.retry_after else None
            raise RequestRejected(refusal.code, str(refusal), headers=headers) from None

    def record_refusal(self, principal: Principal, code: Code) -> None:
        """A refusal made after the door (an action this principal may not propose, another
        principal's intent): one AUTH_FAILED line, one count and one spike hit, like the door's."""
        method = _CREDENTIAL_METHODS.get(principal.credential_kind, "bearer")
        self._refused(_Attempt(method=method), code)

    def _refused(self, attempt: _Attempt, code: Code) -> None:
        self._security.emit("AUTH_FAILED", {"method": attempt.method, "code": code})
        if self._metrics is not None:
            self._metrics.door_refusals.inc(method=attempt.method, code=code)
        if self._on_refusal is not None:
            self._on_refusal()

    def _authenticate(
        self,
        attempt: _Attempt,
        authorization: str | None,
        cert_der: bytes | None,
        route_role: Role,
        route_scope: Scope | None,
        source: str,
    ) -> Principal:
        unauth = self._windows.unauthenticated
        if unauth.full(source):
            raise _Refusal(
                Code.RATE_LIMITED,
                "too many failed attempts",
                retry_after=unauth.retry_after(source),
            )
        try:
            record, rate_rule = self._identify(attempt, authorization, cert_der)
        except _Refusal as refusal:
            if attempt.principal_id is None:
                unauth.hit(source)
            elif self._windows.lockout.record_failure(attempt.principal_id):
                self._security.emit(
                    "PRINCIPAL_LOCKED",
                    {
                        "principal": attempt.principal_id,
                        "lock_seconds": self._windows.lockout.rule.lock_seconds,
                    },
                )
                if self._metrics is not None:
                    self._metrics.principals_locked.inc()
            raise refusal
        principal = record
        if self._windows.lockout.locked(principal.id):
            raise _Refusal(Code.PRINCIPAL_LOCKED, "the principal is locked")
        if rate_rule is not None:
            window = self._windows.principal_window(principal.id, rate_rule)
            if not window.admit("requests"):
                raise _Refusal(
                    Code.RATE_LIMITED,
                    "the principal's rate limit is reached",
                    retry_after=window.retry_after("requests"),
                )
        if principal.role is not route_role:
            raise _Refusal(Code.ROLE_FORBIDDEN, "this route is not for the caller's role")
        if route_scope is not None and route_scope not in principal.scopes:
            raise _Refusal(Code.SCOPE_FORBIDDEN, "the caller lacks this route's scope")
        return principal

    def _identify(
        self, attempt: _Attempt, authorization: str | None, cert_der: bytes | None
    ) -> tuple[Principal, RateRule | None]:
        token = _bearer_token(authorization) if authorization is not None else None
        if authorization is not None and token is None:
            raise _Refusal(Code.AUTH_FAILED, "the credential is not accepted")
        principals = self._principals
        if isinstance(principals, LegacyCaller):
            return self._identify_legacy(attempt, principals, token, cert_der), None
        if cert_der is not None and token is not None:
            raise _Refusal(Code.AUTH_AMBIGUOUS, "present one credential, not two")
        if cert_der is not None:
            record = self._by_certificate(attempt, principals, cert_der)
            return record.principal, record.rate_limit
        if token is None:
            raise _Refusal(Code.AUTH_REQUIRED, "a credential is required")
        record_or_none = principals.match_bearer(token)
        if record_or_none is not None:
            return record_or_none.principal, record_or_none.rate_limit
        if self._workload is not None and principals.has_workloads and looks_like_jwt(token):
            attempt.method = "workload"
            try:
                record = self._workload.verify(token, principals)
            except JwtRefused as refused:
                attempt.principal_id = refused.principal_id
                code = refused.code if refused.code != Code.JWT_MALFORMED else Code.AUTH_FAILED
                raise _Refusal(code, "the workload token is not accepted") from None
            return record.principal, record.rate_limit
        raise _Refusal(Code.AUTH_FAILED, "the credential is not accepted")

    def _by_certificate(
        self, attempt: _Attempt, principals: PrincipalSet, cert_der: bytes
    ) -> PrincipalRecord:
        try:
            uris = peer_san_uris(cert_der)
        except ValueError:
            raise _Refusal(Code.AUTH_FAILED, "the certificate is not accepted") from None
        matches = {r.id: r for r in (principals.by_san_uri(u) for u in uris) if r is not None}
        if len(matches) > 1:
            raise _Refusal(Code.AUTH_AMBIGUOUS, "the certificate names more than one principal")
        if not matches:
            raise _Refusal(Code.AUTH_FAILED, "the certificate is not accepted")
        record = next(iter(matches.values()))
        credential = record.credential
        assert isinstance(credential, MtlsCredential)
        if credential.cert_sha256 is not None and not hmac.compare_digest(
            certificate_sha256(cert_der), credential.cert_sha256
        ):
            attempt.principal_id = record.id
            raise _Refusal(Code.AUTH_FAILED, "the certificate is not accepted")
        return record

    def _identify_legacy(
        self,
        attempt: _Attempt,
        legacy: LegacyCaller,
        token: str | None,
        cert_der: bytes | None,
    ) -> Principal:
        if legacy.require_client_certificate and cert_der is None:
            attempt.method = "mtls" if token is None else attempt.method
            raise _Refusal(Code.AUTH_REQUIRED, "a client certificate and the token are required")
        if token is None:
            raise _Refusal(Code.AUTH_REQUIRED, "a credential is required")
        presented = hashlib.sha256(token.encode("utf-8")).digest()
        with legacy.token.reveal() as value:
            expected = hashlib.sha256(value).digest()
        if not hmac.compare_digest(presented, expected):
            raise _Refusal(Code.AUTH_FAILED, "the credential is not accepted")
        return legacy.principal


_CREDENTIAL_METHODS = {"BEARER": "bearer", "WORKLOAD_JWT": "workload", "MTLS": "mtls"}


def _method_hint(authorization: str | None, cert_der: bytes | None) -> str:
    if cert_der is not None:
        return "mtls"
    if authorization is not None:
        return "bearer"
    return "none"


def _bearer_token(header: str) -> str | None:
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 16 * 1024:
        return None
    if any(c.isspace() or not c.isprintable() for c in token):
        return None
    return token


def check_action(principal: Principal, action: str) -> None:
    """Before capture: may this principal propose ``action``? (403 otherwise)."""
    if not principal.may_propose(action):
        raise RequestRejected(
            Code.ACTION_NOT_PERMITTED_FOR_PRINCIPAL,
            "the caller may not propose this action",
        )
