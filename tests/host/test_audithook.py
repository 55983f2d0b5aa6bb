"""The process guard (PEP 578 audit hook), exercised only in real subprocesses.

The hook is permanent for the process that installs it, so it is never installed here: each test
runs tests/support/audithook_child.py, which installs it, tries every forbidden and allowed
operation once, and reports what happened.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.host import audithook

CHILD = Path(__file__).resolve().parents[1] / "support" / "audithook_child.py"
CONNECT = "refused:GUARD_CONNECT_REFUSED"
CHILD_PROC = "refused:GUARD_CHILD_PROCESS_REFUSED"
WRITE = "refused:GUARD_FS_WRITE_REFUSED"


def run_child(scenario: str, outside: Path, *allowed: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(CHILD), scenario, str(outside), *map(str, allowed)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ResourceWarning" not in proc.stderr, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    base = tmp_path_factory.mktemp("guard")
    outside, journal, state, evidence = (base / n for n in ("outside", "journal", "state", "ev"))
    for d in (outside, journal, state, evidence):
        d.mkdir()
    (outside / "existing.txt").write_text("untouched")
    return run_child("guard", outside, journal, state, evidence), base


def test_self_test_observes_every_refusal(guarded: tuple[dict[str, Any], Path]) -> None:
    results, _ = guarded
    assert json.loads(results["self_test"]) == {
        "SOCKET_GUARD_ABSENT": True,
        "CHILD_PROCESS_ALLOWED": True,
        "FS_WRITE_OUTSIDE_STATE": True,
    }


def test_installing_twice_is_refused(guarded: tuple[dict[str, Any], Path]) -> None:
    results, _ = guarded
    assert results["second_install_guard_error"] == "True"


def test_connect_refused_outside_the_egress_allowance(
    guarded: tuple[dict[str, Any], Path],
) -> None:
    results, _ = guarded
    for probe in ("raw_connect", "connect_after", "connect_ex", "unix_connect"):
        assert results[probe] == CONNECT, probe
    assert results["connect_inside"] == "ok"
    assert results["socketpair"] == "ok"


def test_sends_that_name_an_address_are_refused(guarded: tuple[dict[str, Any], Path]) -> None:
    """UDP sendto/sendmsg and TCP Fast Open reach an address without a connect (issue 16)."""
    results, _ = guarded
    for probe in ("udp_sendto", "udp_sendmsg", "tcp_fast_open"):
        assert results[probe] == CONNECT, probe
    # inside the allowance the datagram is sent and arrives; nothing else ever arrived
    assert results["udp_sendto_inside"] == "ok"
    assert results["udp_received_outside"] == "nothing"


def test_asyncio_and_aiohttp_under_the_guard(guarded: tuple[dict[str, Any], Path]) -> None:
    results, _ = guarded
    # the event loop (socketpair self-pipe) and an aiohttp server accepting connections work;
    # a client connects only inside allowed_egress(), and tasks started there inherit it
    assert results["aiohttp_outside"] == CONNECT
    assert results["aiohttp_inside"] == "ok:200:hello"
    assert results["task_started_inside"] == "ok"
    assert results["loop_socket_outside"] == CONNECT


def test_every_way_to_start_a_program_is_refused(guarded: tuple[dict[str, Any], Path]) -> None:
    results, _ = guarded
    for probe in ("subprocess_run", "os_system", "os_fork", "os_posix_spawn", "os_execv"):
        assert results[probe] == CHILD_PROC, probe


def test_writes_inside_the_allowed_directories_work(guarded: tuple[dict[str, Any], Path]) -> None:
    results, base = guarded
    for probe in (
        "write_allowed_0",
        "write_allowed_1",
        "write_allowed_2",
        "mkdir_allowed",
        "write_allowed_nested_after_mkdir",
        "rename_inside",
        "remove_inside",
        "sqlite_inside",
        "sqlite_memory",
        "sqlite_uri_memory",
        "sqlite_uri_inside",
        "dev_null",
        "read_outside",
        "os_open_read_outside",
    ):
        assert results[probe] == "ok", probe
    assert (base / "journal" / "inside.txt").read_text() == "x"
    assert (base / "journal" / "db.sqlite").exists()


def test_writes_outside_the_allowed_directories_are_refused(
    guarded: tuple[dict[str, Any], Path],
) -> None:
    results, base = guarded
    for probe in (
        "write_outside",
        "append_outside",
        "os_open_outside",
        "dotdot_escape",
        "symlink_escape",
        "rename_out",
        "remove_outside",
        "mkdir_outside",
        "chmod_outside",
        "sqlite_outside",
        "sqlite_uri_fake_memory",
        "sqlite_uri_encoded_path",
        "sqlite_uri_last_mode_wins",
        "sqlite_uri_vfs",
        "sqlite_uri_localhost",
    ):
        assert results[probe] == WRITE, probe
    # nothing was created, changed or removed outside
    assert json.loads(results["outside_files_after"]) == ["existing.txt"]
    assert (base / "outside" / "existing.txt").read_text() == "untouched"
    assert not (base / "escaped.txt").exists()
    assert (base / "outside" / "existing.txt").stat().st_mode & 0o777 != 0o777


def test_self_test_fails_without_the_guard(tmp_path: Path) -> None:
    (tmp_path / "allowed").mkdir()
    results = run_child("no-guard", tmp_path, tmp_path / "allowed")
    assert results == {
        "SOCKET_GUARD_ABSENT": False,
        "CHILD_PROCESS_ALLOWED": False,
        "FS_WRITE_OUTSIDE_STATE": False,
    }


def test_install_refuses_the_filesystem_root_as_writable() -> None:
    # refused before anything is installed, so this is safe in the test process
    with pytest.raises(audithook.GuardError):
        audithook.install_guard(writable_dirs=[Path("/")])
    assert audithook.installed_guard() is None
