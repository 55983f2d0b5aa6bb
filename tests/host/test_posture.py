"""Host posture: each check tripped by a real condition, waivers, refusal, drift and recovery.

We run as root on this machine, so ENFORCED refuses with ROOT_UID for real; for the other checks
the effective uid is injected as an ordinary user so that one condition at a time is observed.
Conditions a test process must not take on (a trace function, a swapped HTTPS context, ``-X
dev``, the process guard) are created in subprocesses (tests/support/posture_child.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import site
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.posture import (
    ALL_CHECKS,
    NEVER_WAIVED,
    WAIVABLE_CHECKS,
    PostureInputs,
    PostureMode,
    PostureMonitor,
    PostureRefused,
    check_posture,
    evaluate_posture,
)
from agentsafe.executor.host.secrets import inspect_sources

CHILD = Path(__file__).resolve().parents[1] / "support" / "posture_child.py"
VALUE = "do-not-echo-3f9a"
GUARD_OK = {
    "SOCKET_GUARD_ABSENT": True,
    "CHILD_PROCESS_ALLOWED": True,
    "FS_WRITE_OUTSIDE_STATE": True,
}
CONFINED = "Name:\tpython\nNoNewPrivs:\t1\nSeccomp:\t2\nCapEff:\t0000000000000000\n"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def read_only_dir() -> Path:
    """A directory this process (root) cannot write: procfs's sysctl tree is mounted read-only."""
    candidate = Path("/proc/sys")
    if os.access(candidate, os.W_OK):
        pytest.skip("no read-only directory available on this host")
    return candidate


@pytest.fixture
def clean(tmp_path: Path, read_only_dir: Path) -> PostureInputs:
    """A host that holds every check, except for whatever a test changes."""
    status = tmp_path / "status"
    status.write_text(CONFINED)
    return PostureInputs(
        mode=PostureMode.ENFORCED,
        production=True,
        environ={},
        guard_results=GUARD_OK,
        root_path=read_only_dir,
        cwd=read_only_dir,
        sa_token_path=tmp_path / "no-such-token",
        proc_status_path=status,
        euid=1000,
    )


def refused(inputs: PostureInputs) -> PostureRefused:
    with pytest.raises(PostureRefused) as info:
        check_posture(inputs, security=MemorySink())
    err = info.value
    assert err.code == "REFUSED_TO_START"
    assert VALUE not in str(err)
    if err.report is not None:
        assert VALUE not in json.dumps(err.report.as_status())
    return err


def test_clean_host_holds(clean: PostureInputs) -> None:
    security = MemorySink()
    report = check_posture(clean, security=security)
    assert report.held
    assert [r.name for r in report.results] == list(ALL_CHECKS)
    status = report.as_status()
    assert status["mode"] == "ENFORCED"
    assert {c["status"] for c in status["checks"].values()} == {"OK"}
    assert security.events == []


@needs_root
def test_enforced_as_root_refuses_with_root_uid(clean: PostureInputs) -> None:
    err = refused(replace(clean, euid=None))  # the real effective uid: we are root
    assert err.checks == ("ROOT_UID",)
    assert "ROOT_UID" in str(err)


def test_writable_root_and_working_directory(clean: PostureInputs, tmp_path: Path) -> None:
    assert refused(replace(clean, root_path=tmp_path)).checks == ("ROOT_WRITABLE",)
    assert refused(replace(clean, cwd=tmp_path)).checks == ("CWD_WRITABLE",)


def test_service_account_token_mounted(clean: PostureInputs, tmp_path: Path) -> None:
    token = tmp_path / "serviceaccount" / "token"
    token.parent.mkdir()
    token.write_text(VALUE)
    inputs = replace(clean, sa_token_path=token)
    assert refused(inputs).checks == ("SA_TOKEN_PRESENT",)
    # never waived, not even in development
    dev = replace(inputs, mode=PostureMode.DEVELOPMENT, production=False)
    assert refused(dev).checks == ("SA_TOKEN_PRESENT",)


def test_not_production(clean: PostureInputs) -> None:
    assert refused(replace(clean, production=False)).checks == ("AGENTSAFE_ENV",)


@pytest.mark.parametrize(
    ("variable", "check"),
    [
        ("HTTP_PROXY", "PROXY_ENV"),
        ("https_proxy", "PROXY_ENV"),
        ("All_Proxy", "PROXY_ENV"),
        ("no_proxy", "PROXY_ENV"),
        ("PYTHONPATH", "PYTHON_ENV_INJECTION"),
        ("PYTHONHOME", "PYTHON_ENV_INJECTION"),
        ("PYTHONSTARTUP", "PYTHON_ENV_INJECTION"),
        ("PYTHONINSPECT", "PYTHON_ENV_INJECTION"),
        ("PYTHONUSERBASE", "PYTHON_ENV_INJECTION"),
        ("PYTHONBREAKPOINT", "PYTHON_ENV_INJECTION"),
        ("PYTHONDEBUG", "PYTHON_ENV_INJECTION"),
        ("PYTHONMALLOC", "PYTHON_ENV_INJECTION"),
        ("PYTHONWARNINGS", "PYTHON_ENV_INJECTION"),
        ("SSL_CERT_FILE", "EXTRA_CA"),
        ("SSL_CERT_DIR", "EXTRA_CA"),
        ("REQUESTS_CA_BUNDLE", "EXTRA_CA"),
        ("CURL_CA_BUNDLE", "EXTRA_CA"),
        ("SSLKEYLOGFILE", "KEYLOG"),
    ],
)
def test_environment_variables(clean: PostureInputs, variable: str, check: str) -> None:
    err = refused(replace(clean, environ={variable: VALUE}))
    assert err.checks == (check,)
    assert err.report is not None
    assert variable in err.report.result(check).detail  # the name, never the value


def test_tls_verification_disabled_by_variable(clean: PostureInputs) -> None:
    inputs = replace(clean, environ={"PYTHONHTTPSVERIFY": "0"})
    assert refused(inputs).checks == ("TLS_VERIFY_DISABLED",)
    dev = replace(inputs, mode=PostureMode.DEVELOPMENT, production=False)
    assert refused(dev).checks == ("TLS_VERIFY_DISABLED",)
    assert check_posture(replace(clean, environ={"PYTHONHTTPSVERIFY": "1"}), security=MemorySink())


def test_kernel_view(clean: PostureInputs, tmp_path: Path) -> None:
    status = tmp_path / "status"
    cases = {
        "NO_NEW_PRIVS_ABSENT": CONFINED.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0"),
        "SECCOMP_ABSENT": CONFINED.replace("Seccomp:\t2", "Seccomp:\t1"),
        "CAPABILITIES_PRESENT": CONFINED.replace("0000000000000000", "0000000000000400"),
    }
    for check, text in cases.items():
        status.write_text(text)
        assert refused(clean).checks == (check,)
    # unreadable is not held
    missing = replace(clean, proc_status_path=tmp_path / "absent")
    assert refused(missing).checks == (
        "NO_NEW_PRIVS_ABSENT",
        "SECCOMP_ABSENT",
        "CAPABILITIES_PRESENT",
    )


def test_kernel_view_of_this_unconfined_process(clean: PostureInputs) -> None:
    real = Path("/proc/self/status")
    text = real.read_text()
    if "Seccomp:\t2" in text or "NoNewPrivs:\t1" in text:
        pytest.skip("this test process is confined")
    checks = refused(replace(clean, proc_status_path=real)).checks
    assert {"NO_NEW_PRIVS_ABSENT", "SECCOMP_ABSENT"} <= set(checks)


def test_user_site(clean: PostureInputs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    assert refused(clean).checks == ("USER_SITE_ENABLED",)


def test_secret_file_findings(clean: PostureInputs, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    readable = secrets / "token"
    readable.write_text(VALUE)
    readable.chmod(0o644)
    outside = tmp_path / "key"
    outside.write_text(VALUE)
    outside.chmod(0o600)
    (secrets / "key").symlink_to(outside)
    env = {
        "EXECUTOR_CALLER_TOKEN_FILE": str(readable),
        "EXECUTOR_TLS_KEY_FILE": str(secrets / "key"),
        "DOWNSTREAM_CREDENTIAL": VALUE,
    }
    findings = inspect_sources(env, production=True, secrets_dir=secrets).findings
    err = refused(replace(clean, secret_findings=findings))
    assert err.checks == ("SECRET_IN_ENV", "SECRET_FILE_OUTSIDE_DIR", "SECRET_FILE_MODE")
    assert err.report is not None
    assert "EXECUTOR_TLS_KEY_FILE" in err.report.result("SECRET_FILE_OUTSIDE_DIR").detail
    # the secret checks are not waived in development either
    dev_findings = inspect_sources(
        {k: v for k, v in env.items() if k.endswith("_FILE")}, production=False, secrets_dir=secrets
    ).findings
    dev = replace(clean, mode=PostureMode.DEVELOPMENT, production=False)
    assert refused(replace(dev, secret_findings=dev_findings)).checks == (
        "SECRET_FILE_OUTSIDE_DIR",
        "SECRET_FILE_MODE",
    )


@needs_root
def test_secret_file_owned_by_someone_else(clean: PostureInputs, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    token = secrets / "token"
    token.write_text(VALUE)
    token.chmod(0o600)
    os.chown(token, 12345, 12345)
    env = {"EXECUTOR_CALLER_TOKEN_FILE": str(token)}
    findings = inspect_sources(env, production=True, secrets_dir=secrets).findings
    assert refused(replace(clean, secret_findings=findings)).checks == ("SECRET_FILE_OWNER",)


@needs_root
def test_principals_file(clean: PostureInputs, tmp_path: Path) -> None:
    principals = tmp_path / "principals.yaml"
    principals.write_text("principals: []\n")
    principals.chmod(0o644)
    os.chown(principals, 1000, 1000)  # the process's (injected) user
    assert check_posture(replace(clean, principals_file=principals), security=MemorySink()).held
    os.chown(principals, 0, 0)
    assert check_posture(replace(clean, principals_file=principals), security=MemorySink()).held
    principals.chmod(0o664)
    assert refused(replace(clean, principals_file=principals)).checks == ("PRINCIPALS_FILE_MODE",)
    principals.chmod(0o644)
    os.chown(principals, 12345, 12345)
    assert refused(replace(clean, principals_file=principals)).checks == ("PRINCIPALS_FILE_OWNER",)
    assert refused(replace(clean, principals_file=tmp_path)).checks == ("PRINCIPALS_FILE_MODE",)


def test_guard_self_test_results(clean: PostureInputs) -> None:
    assert refused(replace(clean, guard_results=None)).checks == (
        "SOCKET_GUARD_ABSENT",
        "CHILD_PROCESS_ALLOWED",
        "FS_WRITE_OUTSIDE_STATE",
    )
    partial = {**GUARD_OK, "CHILD_PROCESS_ALLOWED": False}
    assert refused(replace(clean, guard_results=partial)).checks == ("CHILD_PROCESS_ALLOWED",)


def run_child(scenario: str, *flags: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, *flags, str(CHILD), scenario],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.mark.parametrize("scenario", ["trace", "profile", "thread-trace", "debugger"])
def test_tracer_active_in_a_subprocess(scenario: str) -> None:
    result = run_child(scenario)
    assert result["TRACER_ACTIVE"]["ok"] is False
    assert result["TLS_VERIFY_DISABLED"]["ok"] is True


def test_no_tracer_in_a_plain_subprocess() -> None:
    assert run_child("plain")["TRACER_ACTIVE"]["ok"] is True


def test_dev_mode_is_a_tracer() -> None:
    result = run_child("plain", "-X", "dev")
    assert result["TRACER_ACTIVE"]["ok"] is False
    assert "-X dev" in result["TRACER_ACTIVE"]["detail"]


def test_unverified_default_https_context() -> None:
    result = run_child("unverified-tls")
    assert result["TLS_VERIFY_DISABLED"]["ok"] is False


@needs_root
def test_installed_guard_holds_its_checks() -> None:
    # a real guard in a real process: the guard checks hold; the host's own failures remain
    result = run_child("guarded")
    assert "ROOT_UID" in result["refused"]
    assert not {"SOCKET_GUARD_ABSENT", "CHILD_PROCESS_ALLOWED", "FS_WRITE_OUTSIDE_STATE"} & set(
        result["refused"]
    )


# -- development ------------------------------------------------------------------------------


@needs_root
def test_development_waives_host_checks_and_records_each(
    clean: PostureInputs, tmp_path: Path
) -> None:
    inputs = replace(
        clean,
        mode=PostureMode.DEVELOPMENT,
        production=False,
        euid=None,  # root, for real
        root_path=tmp_path,
        cwd=tmp_path,
        proc_status_path=Path("/proc/self/status"),
        guard_results=None,
        environ={"HTTPS_PROXY": VALUE, "SSL_CERT_FILE": VALUE},
    )
    security = MemorySink()
    report = check_posture(inputs, security=security)
    assert report.held
    waived = set(report.waived)
    assert {
        "ROOT_UID",
        "ROOT_WRITABLE",
        "CWD_WRITABLE",
        "AGENTSAFE_ENV",
        "PROXY_ENV",
        "EXTRA_CA",
        "SOCKET_GUARD_ABSENT",
        "CHILD_PROCESS_ALLOWED",
        "FS_WRITE_OUTSIDE_STATE",
    } <= waived
    assert [f["check"] for f in security.named("POSTURE_WAIVED")] == list(report.waived)
    assert VALUE not in json.dumps(security.events)
    assert report.as_status()["checks"]["ROOT_UID"]["status"] == "WAIVED"
    # a check that holds is not waived
    assert report.result("SA_TOKEN_PRESENT").status == "OK"


def test_waivable_set_excludes_the_never_waived() -> None:
    assert not NEVER_WAIVED & WAIVABLE_CHECKS
    assert "ROOT_UID" in WAIVABLE_CHECKS
    assert set(ALL_CHECKS) >= WAIVABLE_CHECKS


def test_development_refused_in_production(clean: PostureInputs) -> None:
    err = refused(replace(clean, mode=PostureMode.DEVELOPMENT, production=True))
    assert err.checks == ("EXECUTOR_POSTURE",)


# -- drift ------------------------------------------------------------------------------------


def test_drift_degrades_and_recovery_restores(clean: PostureInputs, tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    token = tmp_path / "token"
    inputs = replace(clean, environ=environ, sa_token_path=token)
    security = MemorySink()
    monitor = PostureMonitor(inputs, security=security, interval=60)
    monitor.check_now()
    assert not monitor.is_degraded()
    assert security.events == []

    environ["HTTPS_PROXY"] = VALUE
    monitor.check_now()
    assert monitor.is_degraded()
    assert monitor.drifted_checks() == ("PROXY_ENV",)
    token.write_text(VALUE)
    monitor.check_now()
    assert monitor.drifted_checks() == ("SA_TOKEN_PRESENT", "PROXY_ENV")
    assert [f["check"] for f in security.named("POSTURE_DRIFT")] == [
        "PROXY_ENV",
        "SA_TOKEN_PRESENT",
    ]
    monitor.check_now()  # still drifted: no repeated event
    assert len(security.named("POSTURE_DRIFT")) == 2

    del environ["HTTPS_PROXY"]
    monitor.check_now()
    assert monitor.drifted_checks() == ("SA_TOKEN_PRESENT",)
    assert monitor.is_degraded()
    token.unlink()
    monitor.check_now()
    assert not monitor.is_degraded()
    assert [f["check"] for f in security.named("POSTURE_RESTORED")] == [
        "PROXY_ENV",
        "SA_TOKEN_PRESENT",
    ]
    assert VALUE not in json.dumps(security.events)


@needs_root
def test_development_monitor_does_not_drift_on_waived_checks(clean: PostureInputs) -> None:
    inputs = replace(clean, mode=PostureMode.DEVELOPMENT, production=False, euid=None)
    security = MemorySink()
    monitor = PostureMonitor(inputs, security=security, interval=60)
    monitor.check_now()
    assert not monitor.is_degraded()  # root, waived


async def test_monitor_task_detects_drift(clean: PostureInputs) -> None:
    environ: dict[str, str] = {}
    security = MemorySink()
    monitor = PostureMonitor(replace(clean, environ=environ), security=security, interval=0.01)
    task = asyncio.create_task(monitor.run())
    try:
        environ["SSLKEYLOGFILE"] = VALUE
        await until(monitor.is_degraded)
        assert monitor.drifted_checks() == ("KEYLOG",)
        del environ["SSLKEYLOGFILE"]
        await until(lambda: not monitor.is_degraded())
        assert security.named("POSTURE_RESTORED") == [{"check": "KEYLOG"}]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.005)


def test_evaluate_never_raises_and_reports_only_what_was_asked(clean: PostureInputs) -> None:
    report = evaluate_posture(replace(clean, euid=0), only=("ROOT_UID", "KEYLOG"))
    assert [r.name for r in report.results] == ["ROOT_UID", "KEYLOG"]
    assert report.failed == ("ROOT_UID",)
