"""Start order and refusals of a real ``agentsafe serve`` (issue 9).

Each test starts the executor as a subprocess with an environment rendered by
:class:`~agentsafe.executor.tools.harness.Workspace` and one thing wrong, and checks what the
process says: a non-zero exit, exactly one human line naming the variable or the check (never a
value), and the security lines said before the refusal kept on stderr rather than lost. The order of
the steps is observable: a host that fails its posture is reported as such even when the journal
directory is also unusable, because posture comes first.

We run as root on this machine, which is itself a real condition: ``EXECUTOR_POSTURE=ENFORCED``
must refuse with ROOT_UID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.host.audithook import GUARD_CHECKS
from agentsafe.executor.tools.harness import Workspace, free_port

pytestmark = pytest.mark.slow

REFUSAL_PREFIX = "agentsafe: refused to start: "
SERVE = [sys.executable, "-m", "agentsafe.executor.cli", "serve"]


@dataclass(frozen=True)
class Refusal:
    """What a refused start left behind: its exit status, its one line, its security lines."""

    status: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every line parsed: standard error is JSON lines only (issue 22), so a line that is
        not a JSON object fails the test here."""
        records = []
        for line in self.lines:
            value = json.loads(line)
            assert isinstance(value, dict), line
            records.append(value)
        return records

    @property
    def refusals(self) -> list[str]:
        """The message of each REFUSED_TO_START line: the refusal must be exactly one."""
        return [
            str(r["message"])
            for r in self.records
            if r.get("event") == "REFUSED_TO_START" and r.get("level") == "ERROR"
        ]

    @property
    def line(self) -> str:
        assert len(self.refusals) == 1, self.stderr
        return self.refusals[0]

    @property
    def last(self) -> str:
        """The message of the last line written (the refusal comes after what start-up said)."""
        return str(self.records[-1].get("message"))

    @property
    def security(self) -> list[dict[str, Any]]:
        """The security lines start-up said before it refused (the refusal itself left out)."""
        return [r for r in self.records if r.get("event") != "REFUSED_TO_START"]


def serve(env: Mapping[str, str], cwd: Path) -> Refusal:
    """Run ``agentsafe serve`` expecting a refusal (bounded: a start that serves fails the test)."""
    try:
        done = subprocess.run(
            SERVE, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run killed it
        raise AssertionError("agentsafe serve started instead of refusing") from exc
    return Refusal(done.returncode, done.stdout, done.stderr)


@dataclass
class Setup:
    workspace: Workspace
    env: dict[str, str]
    cwd: Path

    @property
    def secrets_dir(self) -> Path:
        return self.workspace.secrets_dir

    def values(self) -> list[str]:
        """Every secret value the environment or the secret files hold (none may be echoed)."""
        found = [self.workspace.caller_token, self.workspace.downstream_credential]
        for path in self.secrets_dir.iterdir():
            if path.is_file() and not path.is_symlink():
                found.append(path.read_text().strip())
        return [v for v in found if v]

    def caller_token_file(self, mode: int = 0o600) -> Path:
        """Move the caller token from the environment into a secret file of ``mode``."""
        return self.to_file("EXECUTOR_CALLER_TOKEN", mode)

    def to_file(self, name: str, mode: int = 0o600) -> Path:
        """Move the secret ``name`` from the environment into a secret file of ``mode``."""
        path = self.secrets_dir / name.lower().replace("_", "-")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.env.pop(name) + "\n")
        os.chmod(path, mode)
        self.env[f"{name}_FILE"] = str(path)
        return path


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    workspace = Workspace(tmp_path / "ws")
    # Nothing listens here: every start in this file must refuse before it dispatches anything.
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=free_port())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return Setup(workspace, env, cwd)


def assert_no_value_escaped(setup: Setup, refusal: Refusal) -> None:
    for value in setup.values():
        assert value not in refusal.stderr
        assert value not in refusal.stdout


def waived_checks(refusal: Refusal) -> list[str]:
    return [e["check"] for e in refusal.security if e.get("event") == "POSTURE_WAIVED"]


# ----------------------------------------------------------------------------- posture


@pytest.mark.skipif(os.geteuid() != 0, reason="the condition under test is running as root")
def test_enforced_posture_as_root_refuses_naming_root_uid(setup: Setup) -> None:
    setup.env["EXECUTOR_POSTURE"] = "ENFORCED"
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.stdout == ""
    line = refusal.line
    assert line.startswith(REFUSAL_PREFIX + "REFUSED_TO_START: ")
    named = line.split(": host posture not held: ", 1)[1].split(", ")
    assert "ROOT_UID" in named
    # Names the checks, never what was seen: no uid, no path, no value.
    assert all(name.isupper() and name.replace("_", "").isalpha() for name in named), line
    assert "uid" not in line.lower().replace("root_uid", "")
    # ENFORCED waives nothing, so there is nothing else on stderr.
    assert refusal.security == []
    assert_no_value_escaped(setup, refusal)


def test_development_posture_is_refused_under_production(setup: Setup) -> None:
    setup.env.update({"AGENTSAFE_ENV": "production", "EXECUTOR_POSTURE": "DEVELOPMENT"})
    # Production refuses the development allowances before it reaches the posture's own switch.
    for name in ("EXECUTOR_ALLOW_PLAINTEXT_LISTENER", "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK"):
        setup.env.pop(name)
    for secret in ("EXECUTOR_CALLER_TOKEN", "DOWNSTREAM_CREDENTIAL"):
        setup.to_file(secret)
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.line.startswith(REFUSAL_PREFIX)
    assert "EXECUTOR_POSTURE" in refusal.line
    assert waived_checks(refusal) == [], "nothing is waived in production"
    assert_no_value_escaped(setup, refusal)


# ----------------------------------------------------------------------------- secrets


def test_a_world_readable_secret_file_is_refused_naming_secret_file_mode(setup: Setup) -> None:
    setup.caller_token_file(mode=0o644)
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.line.startswith(REFUSAL_PREFIX)
    assert "SECRET_FILE_MODE" in refusal.line
    assert_no_value_escaped(setup, refusal)
    # The waivers said before the refusal are on stderr, before the one line.
    assert "ROOT_UID" in waived_checks(refusal) or os.geteuid() != 0
    assert refusal.last == refusal.line


def test_a_world_readable_secret_file_refusal_names_the_variable(setup: Setup) -> None:
    setup.caller_token_file(mode=0o644)
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert "SECRET_FILE_MODE" in refusal.line
    assert "EXECUTOR_CALLER_TOKEN_FILE" in refusal.line


def test_a_symlink_escaping_the_secrets_dir_is_refused(setup: Setup, tmp_path: Path) -> None:
    outside = tmp_path / "outside-token"
    fd = os.open(outside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(setup.workspace.caller_token)
    link = setup.secrets_dir / "caller-token"
    link.symlink_to(outside)
    setup.env.pop("EXECUTOR_CALLER_TOKEN")
    setup.env["EXECUTOR_CALLER_TOKEN_FILE"] = str(link)
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.line.startswith(REFUSAL_PREFIX)
    assert "SECRET_FILE_OUTSIDE_DIR" in refusal.line
    assert str(outside) not in refusal.stderr, "the resolved target is not reported"
    assert_no_value_escaped(setup, refusal)


def test_a_symlink_escaping_the_secrets_dir_refusal_names_the_variable(
    setup: Setup, tmp_path: Path
) -> None:
    outside = tmp_path / "outside-token"
    outside.write_text(setup.workspace.caller_token)
    outside.chmod(0o600)
    link = setup.secrets_dir / "caller-token"
    link.symlink_to(outside)
    setup.env.pop("EXECUTOR_CALLER_TOKEN")
    setup.env["EXECUTOR_CALLER_TOKEN_FILE"] = str(link)
    refusal = serve(setup.env, setup.cwd)
    assert "EXECUTOR_CALLER_TOKEN_FILE" in refusal.line


def test_a_secret_given_both_as_value_and_file_is_refused(setup: Setup) -> None:
    path = setup.caller_token_file()
    setup.env["EXECUTOR_CALLER_TOKEN"] = setup.workspace.caller_token
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    line = refusal.line
    assert line.startswith(REFUSAL_PREFIX)
    assert "EXECUTOR_CALLER_TOKEN" in line
    assert "EXECUTOR_CALLER_TOKEN_FILE" in line
    assert str(path) not in line
    assert_no_value_escaped(setup, refusal)


def test_a_secret_file_of_another_credential_kind_is_refused_naming_the_variable(
    setup: Setup,
) -> None:
    key = setup.secrets_dir / "downstream-signing-key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("not-used-" + "k" * 32)
    setup.env["DOWNSTREAM_SIGNING_KEY_FILE"] = str(key)  # the kind chosen is STATIC_HEADER
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.line.startswith(REFUSAL_PREFIX)
    assert "DOWNSTREAM_SIGNING_KEY_FILE" in refusal.line
    assert_no_value_escaped(setup, refusal)


# ----------------------------------------------------------------------------- start order


@pytest.mark.skipif(os.geteuid() != 0, reason="the posture must fail; as root ROOT_UID does")
def test_posture_is_reported_before_an_unusable_journal_directory(
    setup: Setup, tmp_path: Path
) -> None:
    not_a_directory = tmp_path / "journal-is-a-file"
    not_a_directory.write_text("")
    setup.env.update({"EXECUTOR_POSTURE": "ENFORCED", "EXECUTOR_JOURNAL_DIR": str(not_a_directory)})
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.line.startswith(REFUSAL_PREFIX + "REFUSED_TO_START: ")
    assert "ROOT_UID" in refusal.line
    assert "JOURNAL" not in refusal.line


def test_an_unusable_journal_directory_is_refused_after_the_posture_waivers(
    setup: Setup, tmp_path: Path
) -> None:
    not_a_directory = tmp_path / "journal-is-a-file"
    not_a_directory.write_text("")
    setup.env["EXECUTOR_JOURNAL_DIR"] = str(not_a_directory)
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert refusal.line == (
        REFUSAL_PREFIX + "JOURNAL_UNAVAILABLE: EXECUTOR_JOURNAL_DIR: cannot be opened for appending"
    )
    # The security lines the start said before refusing are kept, in order, before the line.
    assert refusal.last == refusal.line
    events = refusal.security
    assert events, "the waivers were lost"
    assert {e["schema"] for e in events} == {"agent-safe.security/1"}
    assert {e["event"] for e in events} == {"POSTURE_WAIVED"}
    for event in events:
        assert set(event) == {"schema", "event", "at", "level", "check", "detail"}
    waived = waived_checks(refusal)
    if os.geteuid() == 0:
        assert "ROOT_UID" in waived
    # The guard was installed before configuration and its self-test passed: never waived.
    assert not set(waived) & set(GUARD_CHECKS)
    assert_no_value_escaped(setup, refusal)


def test_a_bad_secret_file_is_refused_before_the_journal_directory(
    setup: Setup, tmp_path: Path
) -> None:
    not_a_directory = tmp_path / "journal-is-a-file"
    not_a_directory.write_text("")
    setup.env["EXECUTOR_JOURNAL_DIR"] = str(not_a_directory)
    setup.caller_token_file(mode=0o604)
    refusal = serve(setup.env, setup.cwd)
    assert refusal.status != 0
    assert "SECRET_FILE_MODE" in refusal.line
    assert "JOURNAL" not in refusal.line
