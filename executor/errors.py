"""The executor's exception hierarchy.

Every error the executor raises on purpose derives from :class:`AgentSafeError` and carries a
stable, machine-readable ``code`` that operators script against. Messages never contain request
data or secret values.

    AgentSafeError
    ├── ConfigError            a configuration value is missing or invalid (exit status 78)
    ├── CanonicalizationError  a value cannot be expressed as RFC 8785 canonical JSON
    ├── RequestRejected        an HTTP request refused with a status and a code
    ├── PolicyError            the policy document cannot be loaded or compiled
    ├── StoreError             the use store could not answer; the caller fails closed
    ├── JournalError           the attempt journal could not take a record
    └── HandlerError           a handler broke its contract
"""

from __future__ import annotations


class AgentSafeError(Exception):
    """Root of every error agentsafe raises deliberately; ``code`` is stable."""

    code: str = "AGENTSAFE_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(AgentSafeError):
    """A configuration variable is missing or invalid; names the variable, never its value."""

    code = "CONFIG_INVALID"
    exit_status = 78

    def __init__(self, variable: str, problem: str, *, code: str | None = None) -> None:
        super().__init__(f"{variable}: {problem}", code=code)
        self.variable = variable
        self.problem = problem


class CanonicalizationError(AgentSafeError):
    code = "CANONICALIZATION_FAILED"


class RequestRejected(AgentSafeError):
    """A request refused with an HTTP status and a stable code (the wire's error body)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.headers = dict(headers or {})


class PolicyError(AgentSafeError):
    code = "POLICY_INVALID"

    def __init__(self, message: str, *, path: str | None = None, code: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message, code=code)
        self.path = path


class StoreError(AgentSafeError):
    code = "STORE_UNAVAILABLE"


class JournalError(AgentSafeError):
    code = "JOURNAL_UNAVAILABLE"


class HandlerError(AgentSafeError):
    code = "HANDLER_CONTRACT_VIOLATED"
