"""Host posture: the checks a process can make of its own host, at start and while it runs.

Callers: ``serve`` (after the audit hook and the configuration: :func:`check_posture`, which
refuses to start under ``EXECUTOR_POSTURE=ENFORCED`` when any check fails, then a
:class:`PostureMonitor` task that repeats :data:`DRIFT_CHECKS` every
``EXECUTOR_POSTURE_INTERVAL_SECONDS``), the enforcement routes (``503 POSTURE_DEGRADED`` while
:meth:`PostureMonitor.is_degraded`), resume (refused while degraded) and ``/v1/control/status``
(:meth:`PostureReport.as_status`).
Also imported by ``assembly.py``, ``plane.py``, ``tools/doctor.py``.
Also imported by ``workgate.py``.

A process cannot create its own isolation; it can verify what it is able to observe and refuse to
run without it. Every check is named by a stable code; a detail says what was seen (a variable's
name, a path, a flag) and never a value. ``EXECUTOR_POSTURE=DEVELOPMENT`` waives the host-specific
checks (:data:`WAIVABLE_CHECKS`, ROOT_UID among them: a deliberate difference from the
specification, safe because ``AGENTSAFE_ENV=production`` is baked into the images and refuses
the development posture) and records each waiver as POSTURE_WAIVED; it never waives
SA_TOKEN_PRESENT or TLS_VERIFY_DISABLED. docs/posture.md is the table for people.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
import sys
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..codes import Code
from ..config import PostureMode
from ..errors import AgentSafeError
from ..events import EventSink
from .audithook import GUARD_CHECKS
from .secrets import (
    SECRET_FILE_MODE,
    SECRET_FILE_OUTSIDE_DIR,
    SECRET_FILE_OWNER,
    SECRET_IN_ENV,
    SecretFinding,
)

__all__ = [
    "ALL_CHECKS",
    "DRIFT_CHECKS",
    "NEVER_WAIVED",
    "SECRET_CHECKS",
    "WAIVABLE_CHECKS",
    "CheckResult",
    "PostureInputs",
    "PostureMode",
    "PostureMonitor",
    "PostureRefused",
    "PostureReport",
    "check_posture",
    "evaluate_posture",
]

SA_TOKEN_PATH: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
PROC_STATUS_PATH: Final = Path("/proc/self/status")

ALL_CHECKS: Final[tuple[str, ...]] = (
    "ROOT_UID",
    "ROOT_WRITABLE",
    "CWD_WRITABLE",
    "SA_TOKEN_PRESENT",
    "AGENTSAFE_ENV",
    "PROXY_ENV",
    "PYTHON_ENV_INJECTION",
    "EXTRA_CA",
    "KEYLOG",
    "TLS_VERIFY_DISABLED",
    "TRACER_ACTIVE",
    "USER_SITE_ENABLED",
    "NO_NEW_PRIVS_ABSENT",
    "SECCOMP_ABSENT",
    "CAPABILITIES_PRESENT",
    SECRET_IN_ENV,
    SECRET_FILE_OUTSIDE_DIR,
    SECRET_FILE_MODE,
    SECRET_FILE_OWNER,
    "PRINCIPALS_FILE_MODE",
    "PRINCIPALS_FILE_OWNER",
    *GUARD_CHECKS,
)

NEVER_WAIVED: Final[frozenset[str]] = frozenset({"SA_TOKEN_PRESENT", "TLS_VERIFY_DISABLED"})
# The secret files' checks are not waivable either: the secret store refuses such a file in every
# posture (a value another user can read is not a secret on any machine), so waiving the check
# here would only move the refusal from the posture to the store.
SECRET_CHECKS: Final[frozenset[str]] = frozenset(
    {SECRET_IN_ENV, SECRET_FILE_OUTSIDE_DIR, SECRET_FILE_MODE, SECRET_FILE_OWNER}
)
# What the development posture waives: everything else. Each is a fact about the machine the
# process runs on (its user, its mounts, the kernel's confinement, the guard, the developer's
# proxies, trust store, interpreter variables, debugger or coverage tracer) that a laptop or a
# CI runner cannot be expected to share with a hardened pod. Each waiver is logged.
WAIVABLE_CHECKS: Final[frozenset[str]] = frozenset(ALL_CHECKS) - NEVER_WAIVED - SECRET_CHECKS

# Repeated while running: everything that can change under a live process. The guard checks are
# not repeated (the hook cannot be removed), nor AGENTSAFE_ENV, USER_SITE_ENABLED and the secret
# checks (the store's watcher re-checks every secret file and refuses a bad one on reload).
_NOT_REPEATED: Final = frozenset({*GUARD_CHECKS, "AGENTSAFE_ENV", "USER_SITE_ENABLED"})
DRIFT_CHECKS: Final[tuple[str, ...]] = tuple(
    check for check in ALL_CHECKS if check not in _NOT_REPEATED | SECRET_CHECKS
)

PROXY_VARIABLES: Final = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"})
PYTHON_INJECTION_VARIABLES: Final = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "PYTHONBREAKPOINT",
    "PYTHONDEBUG",
    "PYTHONMALLOC",
    "PYTHONWARNINGS",
)
EXTRA_CA_VARIABLES: Final = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
# Modules that exist only to attach a debugger. ``pdb`` is not among them: pytest and doctest
# import it without attaching; an attached pdb shows as a trace function.
DEBUGGER_MODULES: Final = (
    "pydevd",
    "debugpy",
    "pydevd_tracing",
    "_pydevd_bundle",
    "pudb",
    "ipdb",
    "wdb",
    "rpdb",
    "remote_pdb",
    "web_pdb",
)

_SECRET_CODES: Final[Mapping[str, str]] = {
    "SECRET_IN_ENV": "SECRET_IN_ENV",
    "SECRET_FILE_OUTSIDE_DIR": "SECRET_FILE_OUTSIDE_DIR",
    "SECRET_DIR_REQUIRED": "SECRET_FILE_OUTSIDE_DIR",
    "SECRET_FILE_MODE": "SECRET_FILE_MODE",
    "SECRET_FILE_OWNER": "SECRET_FILE_OWNER",
}


class PostureRefused(AgentSafeError):
    """The host does not hold the posture; names the checks (or the variable), never a value."""

    code = Code.REFUSED_TO_START

    def __init__(self, checks: Sequence[str], *, report: PostureReport | None = None) -> None:
        named = [_with_variable(check, report) for check in checks]
        super().__init__(f"host posture not held: {', '.join(named)}")
        self.checks = tuple(checks)
        self.report = report


def _with_variable(check: str, report: PostureReport | None) -> str:
    """A secret-file check names the variable it failed for (its detail holds only names)."""
    if report is None or not check.startswith(("SECRET_", "PRINCIPALS_FILE_")):
        return check
    for result in report.results:
        if result.name == check and result.detail:
            return f"{check} ({result.detail})"
    return check


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    waived: bool = False
    detail: str = ""

    @property
    def holds(self) -> bool:
        return self.ok or self.waived

    @property
    def status(self) -> str:
        return "OK" if self.ok else "WAIVED" if self.waived else "FAILED"


@dataclass(frozen=True)
class PostureReport:
    mode: PostureMode
    results: tuple[CheckResult, ...]

    @property
    def held(self) -> bool:
        return all(r.holds for r in self.results)

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.results if not r.holds)

    @property
    def waived(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.results if r.waived)

    def result(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def as_status(self) -> dict[str, Any]:
        """The posture by check, as ``/v1/control/status`` shows it."""
        return {
            "mode": self.mode.value,
            "held": self.held,
            "checks": {r.name: {"status": r.status, "detail": r.detail} for r in self.results},
        }


@dataclass(frozen=True)
class PostureInputs:
    """Everything the checks look at; the host paths are injectable for tests.

    ``environ`` is read at each evaluation, so pass the live ``os.environ`` in ``serve``.
    ``secret_findings`` comes from :func:`agentsafe.executor.host.secrets.inspect_sources` and
    ``guard_results`` from :meth:`agentsafe.executor.host.audithook.Guard.self_test`; without guard
    results the three guard checks fail.
    """

    mode: PostureMode
    production: bool
    environ: Mapping[str, str]
    principals_file: Path | None = None
    secret_findings: Sequence[SecretFinding] = ()
    guard_results: Mapping[str, bool] | None = None
    root_path: Path = Path("/")
    cwd: Path | None = None
    sa_token_path: Path = SA_TOKEN_PATH
    proc_status_path: Path = PROC_STATUS_PATH
    euid: int | None = None
    modules: Mapping[str, object] | None = field(default=None, repr=False)


_Outcome = tuple[bool, str]


def evaluate_posture(
    inputs: PostureInputs, *, only: Collection[str] | None = None
) -> PostureReport:
    """Run the checks (all, or ``only`` those) and apply the mode's waivers; raises nothing."""
    euid = os.geteuid() if inputs.euid is None else inputs.euid
    status: dict[str, str] | None = None
    results: list[CheckResult] = []
    for name in ALL_CHECKS:
        if only is not None and name not in only:
            continue
        if name in ("NO_NEW_PRIVS_ABSENT", "SECCOMP_ABSENT", "CAPABILITIES_PRESENT"):
            if status is None:
                status = _read_proc_status(inputs.proc_status_path)
            ok, detail = _kernel_check(name, status)
        else:
            try:
                ok, detail = _CHECKS[name](inputs, euid)
            except Exception as exc:  # a check that cannot run does not hold
                ok, detail = False, f"check could not run ({type(exc).__name__})"
        waived = not ok and inputs.mode is PostureMode.DEVELOPMENT and name in WAIVABLE_CHECKS
        results.append(CheckResult(name, ok, waived, detail))
    return PostureReport(inputs.mode, tuple(results))


def check_posture(inputs: PostureInputs, *, security: EventSink) -> PostureReport:
    """The start-time check: the report, or :class:`PostureRefused` naming every failed check.

    The development posture is refused outright in production (naming ``EXECUTOR_POSTURE``).
    Each waiver is recorded as POSTURE_WAIVED on the security stream.
    """
    if inputs.mode is PostureMode.DEVELOPMENT and inputs.production:
        raise PostureRefused(("EXECUTOR_POSTURE",))
    report = evaluate_posture(inputs)
    for r in report.results:
        if r.waived:
            security.emit("POSTURE_WAIVED", {"check": r.name, "detail": r.detail})
    if not report.held:
        raise PostureRefused(report.failed, report=report)
    return report


# -- the checks ------------------------------------------------------------------------------


def _root_uid(inputs: PostureInputs, euid: int) -> _Outcome:
    return (euid != 0, "effective user is root" if euid == 0 else f"effective uid {euid}")


def _writable(path: Path) -> bool:
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK, effective_ids=effective)


def _root_writable(inputs: PostureInputs, euid: int) -> _Outcome:
    if _writable(inputs.root_path):
        return False, f"{inputs.root_path} is writable"
    return True, f"{inputs.root_path} is read-only to this process"


def _cwd_writable(inputs: PostureInputs, euid: int) -> _Outcome:
    cwd = inputs.cwd if inputs.cwd is not None else Path.cwd()
    if _writable(cwd):
        return False, f"working directory {cwd} is writable"
    return True, "working directory is read-only to this process"


def _sa_token(inputs: PostureInputs, euid: int) -> _Outcome:
    if os.path.lexists(inputs.sa_token_path):
        return False, f"service-account token mounted at {inputs.sa_token_path}"
    return True, "no service-account token mounted"


def _agentsafe_env(inputs: PostureInputs, euid: int) -> _Outcome:
    if inputs.production:
        return True, "AGENTSAFE_ENV=production"
    return False, "AGENTSAFE_ENV is not production"


def _names_set(environ: Mapping[str, str], names: Collection[str]) -> list[str]:
    return sorted(k for k in environ if k in names)


def _verdict(found: list[str], what: str) -> _Outcome:
    if found:
        return False, f"{what}: {', '.join(found)}"
    return True, f"no {what}"


def _proxy_env(inputs: PostureInputs, euid: int) -> _Outcome:
    found = sorted(k for k in inputs.environ if k.upper() in PROXY_VARIABLES)
    return _verdict(found, "proxy variables set")


def _python_env(inputs: PostureInputs, euid: int) -> _Outcome:
    return _verdict(
        _names_set(inputs.environ, PYTHON_INJECTION_VARIABLES), "interpreter variables set"
    )


def _extra_ca(inputs: PostureInputs, euid: int) -> _Outcome:
    return _verdict(_names_set(inputs.environ, EXTRA_CA_VARIABLES), "trust-store variables set")


def _keylog(inputs: PostureInputs, euid: int) -> _Outcome:
    return _verdict(_names_set(inputs.environ, ("SSLKEYLOGFILE",)), "key-log variables set")


def _tls_verify(inputs: PostureInputs, euid: int) -> _Outcome:
    if inputs.environ.get("PYTHONHTTPSVERIFY", "").strip() == "0":
        return False, "PYTHONHTTPSVERIFY=0"
    factory = getattr(ssl, "_create_default_https_context", None)
    if factory is None or factory is getattr(ssl, "_create_unverified_context", None):
        return False, "the default HTTPS context is the unverified one"
    context = factory()
    if context.verify_mode != ssl.CERT_REQUIRED or not context.check_hostname:
        return False, "the default HTTPS context does not verify certificates and host names"
    return True, "the default HTTPS context verifies"


def _tracer(inputs: PostureInputs, euid: int) -> _Outcome:
    seen: list[str] = []
    if sys.gettrace() is not None:
        seen.append("trace function")
    if sys.getprofile() is not None:
        seen.append("profile function")
    if threading.gettrace() is not None:
        seen.append("thread trace function")
    if threading.getprofile() is not None:
        seen.append("thread profile function")
    modules = sys.modules if inputs.modules is None else inputs.modules
    seen.extend(f"module {m}" for m in DEBUGGER_MODULES if m in modules)
    if sys.flags.dev_mode:
        seen.append("-X dev")
    if sys.flags.inspect:
        seen.append("-i")
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        seen.extend(f"monitoring tool {i}" for i in range(6) if monitoring.get_tool(i) is not None)
    return _verdict(seen, "tracing")


def _user_site(inputs: PostureInputs, euid: int) -> _Outcome:
    site = sys.modules.get("site")
    if site is not None and getattr(site, "ENABLE_USER_SITE", None) is True:
        return False, "the user site-packages directory is on the import path"
    return True, "user site-packages disabled"


def _secret_check(name: str) -> Callable[[PostureInputs, int], _Outcome]:
    def check(inputs: PostureInputs, euid: int) -> _Outcome:
        found = sorted(
            {f.variable for f in inputs.secret_findings if _SECRET_CODES.get(f.code) == name}
        )
        return _verdict(found, "refused for")

    return check


def _principals(name: str) -> Callable[[PostureInputs, int], _Outcome]:
    def check(inputs: PostureInputs, euid: int) -> _Outcome:
        path = inputs.principals_file
        if path is None:
            return True, "no principals file"
        try:
            st = os.stat(os.path.realpath(path, strict=True))
        except OSError:
            return False, f"{path} cannot be read"
        if name == "PRINCIPALS_FILE_MODE":
            if not stat.S_ISREG(st.st_mode):
                return False, f"{path} is not a regular file"
            if st.st_mode & 0o022:
                return False, f"{path} is writable by group or others"
            return True, "regular file, not writable by group or others"
        if st.st_uid not in (euid, 0):
            return False, f"{path} is owned by another user"
        return True, "owned by this process's user or root"

    return check


def _guard(name: str) -> Callable[[PostureInputs, int], _Outcome]:
    def check(inputs: PostureInputs, euid: int) -> _Outcome:
        if inputs.guard_results is None:
            return False, "the process guard's self-test did not run"
        if inputs.guard_results.get(name) is True:
            return True, "the process guard refused the probe"
        return False, "the probe was not refused by the process guard"

    return check


_CHECKS: Final[Mapping[str, Callable[[PostureInputs, int], _Outcome]]] = {
    "ROOT_UID": _root_uid,
    "ROOT_WRITABLE": _root_writable,
    "CWD_WRITABLE": _cwd_writable,
    "SA_TOKEN_PRESENT": _sa_token,
    "AGENTSAFE_ENV": _agentsafe_env,
    "PROXY_ENV": _proxy_env,
    "PYTHON_ENV_INJECTION": _python_env,
    "EXTRA_CA": _extra_ca,
    "KEYLOG": _keylog,
    "TLS_VERIFY_DISABLED": _tls_verify,
    "TRACER_ACTIVE": _tracer,
    "USER_SITE_ENABLED": _user_site,
    **{n: _secret_check(n) for n in _SECRET_CODES.values()},
    "PRINCIPALS_FILE_MODE": _principals("PRINCIPALS_FILE_MODE"),
    "PRINCIPALS_FILE_OWNER": _principals("PRINCIPALS_FILE_OWNER"),
    **{n: _guard(n) for n in GUARD_CHECKS},
}


def _read_proc_status(path: Path) -> dict[str, str] | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _kernel_check(name: str, status: Mapping[str, str] | None) -> _Outcome:
    if status is None:
        return False, "the kernel's view of this process is unavailable"
    try:
        if name == "NO_NEW_PRIVS_ABSENT":
            ok = int(status["NoNewPrivs"]) == 1
            return ok, "no_new_privs set" if ok else "no_new_privs not set"
        if name == "SECCOMP_ABSENT":
            mode = int(status["Seccomp"])
            return mode == 2, f"seccomp mode {mode}"
        caps = int(status["CapEff"], 16)
    except (KeyError, ValueError):
        return False, "the kernel's view of this process is unreadable"
    return caps == 0, "no effective capabilities" if caps == 0 else "effective capabilities held"


# -- drift -----------------------------------------------------------------------------------


class PostureMonitor:
    """Repeats the drift checks; a regression degrades the process until the check holds again.

    POSTURE_DRIFT and POSTURE_RESTORED (security stream) name the check. Run :meth:`run` as a
    task, or call :meth:`check_now`.
    """

    def __init__(
        self,
        inputs: PostureInputs,
        *,
        security: EventSink,
        interval: float,
        checks: Collection[str] = DRIFT_CHECKS,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self._inputs = inputs
        self._security = security
        self._interval = interval
        self._checks = tuple(c for c in ALL_CHECKS if c in checks)
        self._drifted: tuple[str, ...] = ()
        self.degraded = False
        """Whether a drift check fails now: set with the drifted checks, so the work gate reads
        it before every piece of new work without calling in."""
        self._lock = threading.Lock()

    def is_degraded(self) -> bool:
        return self.degraded

    def drifted_checks(self) -> tuple[str, ...]:
        return self._drifted

    def check_now(self) -> PostureReport:
        """Evaluate the drift checks once, emit what changed, and return the report."""
        with self._lock:
            report = evaluate_posture(self._inputs, only=self._checks)
            now = tuple(r.name for r in report.results if not r.holds)
            before = set(self._drifted)
            for r in report.results:
                if not r.holds and r.name not in before:
                    self._security.emit("POSTURE_DRIFT", {"check": r.name, "detail": r.detail})
            for name in self._drifted:
                if name not in now:
                    self._security.emit("POSTURE_RESTORED", {"check": name})
            self._drifted = now
            self.degraded = bool(now)
            return report

    async def run(self) -> None:
        """Check every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            self.check_now()
