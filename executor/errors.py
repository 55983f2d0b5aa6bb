"""The executor's exception hierarchy: one root, and a stable code on every error.

Every error agentsafe raises on purpose derives from :class:`AgentSafeError` and carries a
stable, machine-readable ``code`` from the one registry, :class:`~agentsafe.executor.codes.Code`
(``codes.py``: code -> HTTP status and meaning). Domain code raises by code and never chooses an
HTTP status: the HTTP edge (``routes/``) answers a :class:`RequestRejected` with the status the
registry gives its code. Messages never contain request data or secret values.

    AgentSafeError                  root; ``code`` is stable
    ├── ConfigError                 a configuration value is missing or invalid (exit status 78)
    │   └── PrincipalsFileError     the principals file is refused (door/principals_file.py)
    ├── CanonicalizationError       a value cannot be expressed as RFC 8785 canonical JSON
    │   └── DuplicateKeyError       a JSON text names a key twice in one object (canonical.py)
    ├── RequestRejected             a request refused with a code; the edge gives the status
    ├── UndeclaredRefusal           a route answered what its row does not declare; also a
    │                               RuntimeWarning (routes/contract.py)
    ├── PolicyError                 the policy document cannot be loaded or compiled
    ├── EvaluationError             a policy rule did not evaluate (policy/celexpr.py)
    ├── StoreError                  the use store could not answer; the caller fails closed
    │   └── ApprovalError           an escalation approval operation refused (state/usestore.py)
    ├── JournalError                the attempt journal could not take a record
    ├── HandlerError                a handler broke its contract
    ├── DispatchRefused             dispatch would not start (dispatch/seam.py)
    ├── ProviderRefused             the provider refused deterministically (dispatch/seam.py)
    ├── TokenRefused                a compact JWS failed verification; also a ValueError
    │                               (jws.py, re-exported by grants.py)
    ├── NotCanonical                not the canonical base64 spelling of any bytes; also a
    │                               ValueError (base64url.py)
    ├── GrantRefused                a grant that must not execute (policy/authority.py)
    ├── JwtRefused                  a workload token is refused (door/workload.py)
    ├── TransportError              an outbound request failed (egress/transport.py)
    ├── CredentialUnavailable       a downstream credential produced no headers
    │                               (egress/credentials.py)
    ├── SignatureError              an RFC 9421 signature is malformed; also a ValueError
    │                               (egress/httpsig.py)
    ├── SecretUnavailable           a secret handle cannot be revealed (host/secrets.py)
    ├── PostureRefused              the host does not hold the posture (host/posture.py)
    ├── GuardError                  the process guard cannot be installed (host/audithook.py)
    ├── GuardRefused                an operation the process guard forbids; also a
    │                               PermissionError (host/audithook.py)
    ├── ChainError                  an evidence chain cannot continue (evidence/chain.py)
    ├── BundleError                 an incident bundle cannot be written (evidence/bundle.py)
    └── AgentSafetyError            a refusal of the plan boundary (plans/errors.py)
        ├── AgentSafetyAborted      the caller's abort event fired
        └── AgentExecutionError     a step ran (or may have) and a receipt was signed for it

Callers: every module that raises; ``routes/app.py`` answers :class:`RequestRejected` (the
plan routes answer the plan boundary's errors); ``serve.py`` turns a :class:`ConfigError` into
exit status 78.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

from .codes import Code

__all__ = [
    "AgentSafeError",
    "CanonicalizationError",
    "ConfigError",
    "HandlerError",
    "JournalError",
    "PolicyError",
    "RequestRejected",
    "StoreError",
]


class AgentSafeError(Exception):
    """Root of every error agentsafe raises deliberately; ``code`` is stable.

    ``code`` is a :class:`Code` member, except on an :class:`AgentExecutionError` whose failure
    is a host step executor's own code (the plan boundary passes it through)."""

    code: str = Code.AGENTSAFE_ERROR

    def __init__(self, message: str, *, code: Code | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(AgentSafeError):
    """A configuration variable is missing or invalid; names the variable, never its value."""

    code = Code.CONFIG_INVALID
    exit_status = 78

    def __init__(self, variable: str, problem: str, *, code: Code | None = None) -> None:
        super().__init__(f"{variable}: {problem}", code=code)
        self.variable = variable
        self.problem = problem


class CanonicalizationError(AgentSafeError):
    code = Code.CANONICALIZATION_FAILED


class RequestRejected(AgentSafeError):
    """A request refused with a stable code (the wire's error body). The HTTP edge answers it
    with ``code.status``; every code raised this way has a status in the registry."""

    code: Code

    def __init__(
        self,
        code: Code,
        message: str,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.code = code
        self.headers = dict(headers or {})


class PolicyError(AgentSafeError):
    """A policy (or policy test file) refused. ``public`` is what may be said of it where the
    document's author is not the reader (the operator's admission refusals and conditions):
    words that hold no value of the document; :attr:`public_message` prefixes the path."""

    code = Code.POLICY_INVALID

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        code: Code | None = None,
        public: str | None = None,
    ) -> None:
        super().__init__(f"{path}: {message}" if path else message, code=code)
        self.path = path
        self.public = public

    @property
    def public_message(self) -> str:
        """The path and :attr:`public` (else the code's meaning): never a value of the
        document (a CEL expression, a pattern, a name)."""
        code = self.code
        words = self.public or (code.meaning if isinstance(code, Code) else "the policy is invalid")
        return f"{self.path}: {words}" if self.path else words


class StoreError(AgentSafeError):
    code = Code.STORE_UNAVAILABLE


class JournalError(AgentSafeError):
    code = Code.JOURNAL_UNAVAILABLE


class HandlerError(AgentSafeError):
    code = Code.HANDLER_CONTRACT_VIOLATED
