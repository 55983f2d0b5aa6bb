"""The door: who is calling, and may they call this route.

:class:`Door` authenticates one request in the specification's fixed, fail-closed order and
either returns the :class:`~agentsafe.executor.principals.Principal` or raises
:class:`~agentsafe.executor.errors.RequestRejected`:

1. more than one ``Authorization`` header (401 ``AUTH_AMBIGUOUS``);
2. a client certificate together with a bearer (401 ``AUTH_AMBIGUOUS``);
3. the certificate, by SAN URI and optional pin;
4. the bearer, by digest across every bearer principal in constant time, then as a workload
   token (401 ``AUTH_FAILED`` or the ``JWT_*`` code);
5. when 1-4 failed: the window for failed attempts from this source, which answers 429
   ``RATE_LIMITED`` instead once it is full;
6. the principal's lock (423 ``PRINCIPAL_LOCKED``, only once the credential proved the
   principal, so a lock is never an existence oracle);
7. the principal's own ``rate_limit`` (429 ``RATE_LIMITED``);
8. the route's role (403 ``ROLE_FORBIDDEN``);
9. the route's scope (403 ``SCOPE_FORBIDDEN``).

No credential at all is 401 ``AUTH_REQUIRED``. Every refusal is one count in the metrics and one
``AUTH_FAILED`` line on the security stream with ``method`` (bearer | workload | mtls | none) and
``code`` and nothing else; a refusal that repeats is summarised (``door/refusal_lines.py``), so a
flood writes a bounded number of lines.

How refusals count (``docs/door.md`` states the model and why):

* The unauthenticated window (``EXECUTOR_RATE_LIMIT_UNAUTHENTICATED``) is keyed by the source
  (:func:`source_key` of the peer address) and asked only after the credentials failed: it never
  refuses a request that proves a principal, so a peer that floods keeps nobody else out, an
  operator's control routes included.
* Only authentication failures count towards the ``AUTH_SPIKE`` halt (the ``on_refusal`` hook),
  and each counts in its source's window first, so one source adds at most the window's count;
  the window's own 429s do not count. A proven principal's refusals (its lock, its rate limit,
  its role and scope, and :meth:`Door.record_refusal` after the door) never count towards the
  halt: an authorization mistake is not an authentication attack.
* A principal's lockout (``EXECUTOR_AUTH_LOCKOUT``) counts only failures an outsider cannot
  produce at will: a certificate our client CA issued for the principal's SAN that does not
  match its pin, and the proven principal's own authorization refusals. No workload token
  failure counts: a bad signature under a known ``kid`` and subject is anyone's to forge with a
  key of their own, and a genuine token replayed for another audience, or stale, is a
  stranger's to replay; both count only in their source's window, so nobody who merely knows a
  key id and a subject can lock the principal out.

Legacy mode (:class:`LegacyCaller`): one PROPOSER ``legacy-caller`` whose bearer is the caller
token, read from its secret handle on every request (so a rotated token applies from the next
request) and compared as SHA-256 digests in constant time. With a client CA configured, legacy
mode requires a certificate (verified by the TLS handshake) together with the token.

Also here, the request-time check of an authenticated principal before any intent is captured:
:func:`check_action`. The checks on a captured intent (owner, separation of duties) are in
``intent.py``: the door runs before any intent exists and never imports it.

Callers: ``assembly.py`` (builds it), ``routes/door.py`` (adapts it to aiohttp for every
non-public route).
Also imported by ``lifecycle/pipeline.py``, ``plane.py``, ``proxy.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from .. import telemetry
from ..clock import Clock
from ..codes import Code
from ..errors import RequestRejected
from ..events import EventSink
from ..host.metrics import ExecutorMetrics
from ..host.tlsctx import certificate_sha256, peer_san_uris
from ..principals import Principal, Role, Scope
from ..windows import DoorWindows, RateRule
from .principals_file import MtlsCredential, PrincipalRecord, PrincipalSet
from .refusal_lines import RefusalLines
from .workload import JwtRefused, WorkloadVerifier, looks_like_jwt

__all__ = [
    "Door",
    "LegacyCaller",
    "TokenHandle",
    "check_action",
    "source_key",
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


class _Attempt:
    def __init__(self, method: str) -> None:
        self.method = method
        #: the principal a failure of this attempt counts against (a lock), once it proved intent
        self.intent_principal: str | None = None


class _Refusal(Exception):
    """A refusal, and how it counts: ``spike`` towards ``AUTH_SPIKE`` (authentication failures
    only), ``lock`` towards this principal's lockout (a proven principal's own mistakes)."""

    def __init__(
        self,
        code: Code,
        message: str,
        *,
        retry_after: int | None = None,
        spike: bool = True,
        lock: str | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
        self.spike = spike
        self.lock = lock


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
        self._lines = RefusalLines(security, clock=clock)
        self._workload = workload
        self._metrics = metrics
        self._on_refusal = on_refusal

    @property
    def principals(self) -> PrincipalSet | LegacyCaller:
        return self._principals

    def replace_principals(self, principals: PrincipalSet | LegacyCaller) -> None:
        """Swap in a reloaded principals file; the next request sees only the new set."""
        self._principals = principals

    def flush_lines(self, *, everything: bool = False) -> None:
        """Write the summaries of repeated refusals whose interval is over (or all of them)."""
        self._lines.flush(everything=everything)

    def authenticate(
        self,
        *,
        authorization_header: str | Sequence[str] | None,
        peer_cert_der: bytes | None,
        route_role: Role,
        route_scope: Scope | None = None,
        source: str = "",
    ) -> Principal:
        """The principal behind this request, or :class:`RequestRejected` (one AUTH_FAILED).

        ``authorization_header`` is the header's value, or every value it was sent with: more
        than one is ``AUTH_AMBIGUOUS`` (a front proxy that takes another one than we would
        disagrees about who called). ``source`` keys the unauthenticated window
        (:func:`source_key` of the peer address).
        """
        values: tuple[str, ...]
        if authorization_header is None:
            values = ()
        elif isinstance(authorization_header, str):
            values = (authorization_header,)
        else:
            values = tuple(authorization_header)
        attempt = _Attempt(method=_method_hint(values[0] if values else None, peer_cert_der))
        with telemetry.span("agentsafe.door") as current:
            try:
                principal = self._authenticate(
                    attempt, values, peer_cert_der, route_role, route_scope, source
                )
            except _Refusal as refusal:
                self._refused(attempt.method, refusal)
                if current is not None:
                    current.set_attributes(
                        telemetry.safe_attributes(
                            {"agentsafe.code": str(refusal.code), "agentsafe.outcome": "REFUSED"}
                        )
                    )
                headers = {"Retry-After": str(refusal.retry_after)} if refusal.retry_after else None
                raise RequestRejected(refusal.code, str(refusal), headers=headers) from None
            if current is not None:
                current.set_attribute("agentsafe.outcome", "AUTHENTICATED")
            return principal

    def record_refusal(self, principal: Principal, code: Code) -> None:
        """A refusal made after the door (an action this principal may not propose, another
        principal's intent): one AUTH_FAILED line and one count, like the door's; it counts
        towards this principal's lockout, never towards the boundary's AUTH_SPIKE halt."""
        method = _CREDENTIAL_METHODS.get(principal.credential_kind, "bearer")
        self._refused(method, _Refusal(code, "", spike=False, lock=principal.id))

    def _refused(self, method: str, refusal: _Refusal) -> None:
        self._lines.refused(method, refusal.code)
        if self._metrics is not None:
            self._metrics.door_refusals.inc(method=method, code=refusal.code)
        if refusal.lock is not None:
            self._count_towards_lock(refusal.lock)
        if refusal.spike and self._on_refusal is not None:
            self._on_refusal()

    def _count_towards_lock(self, principal_id: str) -> None:
        lockout = self._windows.lockout
        if lockout.record_failure(principal_id):
            self._security.emit(
                "PRINCIPAL_LOCKED",
                {"principal": principal_id, "lock_seconds": lockout.rule.lock_seconds},
            )
            if self._metrics is not None:
                self._metrics.principals_locked.inc()

    def _authenticate(
        self,
        attempt: _Attempt,
        authorization: tuple[str, ...],
        cert_der: bytes | None,
        route_role: Role,
        route_scope: Scope | None,
        source: str,
    ) -> Principal:
        unauth = self._windows.unauthenticated
        # The window never refuses a request that proves a principal: it is asked only once the
        # credentials failed, so a flood from one source keeps nobody else (no operator) out.
        window_full = unauth.full(source)
        try:
            if len(authorization) > 1:
                raise _Refusal(Code.AUTH_AMBIGUOUS, "send one Authorization header, not several")
            record, rate_rule = self._identify(
                attempt, authorization[0] if authorization else None, cert_der
            )
        except _Refusal as refusal:
            if window_full:
                # The window's own refusals are not authentication failures: they count neither
                # towards AUTH_SPIKE nor, again, in the window (so its reach is bounded).
                raise _Refusal(
                    Code.RATE_LIMITED,
                    "too many failed attempts from this source",
                    retry_after=unauth.retry_after(source),
                    spike=False,
                    lock=attempt.intent_principal,
                ) from None
            unauth.hit(source)
            refusal.lock = attempt.intent_principal
            raise
        principal = record
        if self._windows.lockout.locked(principal.id):
            raise _Refusal(Code.PRINCIPAL_LOCKED, "the principal is locked", spike=False)
        if rate_rule is not None:
            window = self._windows.principal_window(principal.id, rate_rule)
            if not window.admit("requests"):
                raise _Refusal(
                    Code.RATE_LIMITED,
                    "the principal's rate limit is reached",
                    retry_after=window.retry_after("requests"),
                    spike=False,
                )
        if principal.role is not route_role:
            raise _Refusal(
                Code.ROLE_FORBIDDEN,
                "this route is not for the caller's role",
                spike=False,
                lock=principal.id,
            )
        if route_scope is not None and route_scope not in principal.scopes:
            raise _Refusal(
                Code.SCOPE_FORBIDDEN,
                "the caller lacks this route's scope",
                spike=False,
                lock=principal.id,
            )
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
            # A certificate our client CA issued for this principal's SAN, but not the pinned
            # one: that proves intent against this executor, so it counts towards a lock.
            attempt.intent_principal = record.id
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


def source_key(address: str | None) -> str:
    """The unauthenticated window's key for a peer address.

    An IPv4 address is its own key; an IPv6 address is keyed by its /64 (one host is routinely
    given a whole /64, so a finer key would let it rotate out of its window), an IPv4-mapped
    IPv6 address by its IPv4 address. Anything that is not an address (a Unix socket, no peer)
    shares one key.
    """
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


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
    # Whitespace or a character that is not printable refuses the token. The only whitespace
    # str.isprintable() admits is the ASCII space (tests/door: every code point), so the whole
    # rule is two C-level checks rather than a generator over each character (issue 34).
    if not token.isprintable() or " " in token:
        return None
    return token


def check_action(principal: Principal, action: str) -> None:
    """Before capture: may this principal propose ``action``? (403 otherwise)."""
    if not principal.may_propose(action):
        raise RequestRejected(
            Code.ACTION_NOT_PERMITTED_FOR_PRINCIPAL,
            "the caller may not propose this action",
        )
