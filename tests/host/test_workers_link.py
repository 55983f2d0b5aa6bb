"""The files a worker group shares (``host/workers.py``): the roster and the operator's halt,
followed by every worker's :class:`HaltState` (two states over one runtime directory stand in
for two workers; the process test is ``tests/integration/test_workers_process.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.halt import HaltCause, HaltState
from agentsafe.executor.host.workers import INDEX_ENV, RUNTIME_ENV, WorkerLink, write_json


def states(
    tmp_path: Path, halt_file: Path | None = None
) -> tuple[HaltState, HaltState, MemorySink]:
    clock = ManualClock(1_772_445_600.0)
    security = MemorySink()
    made = []
    for index in (0, 1):
        state = HaltState(clock=clock, security=security, halt_file=halt_file if index else None)
        state.share(WorkerLink(index, 2, tmp_path).shared_halt())
        made.append(state)
    return made[0], made[1], security


def test_an_operator_halt_on_one_worker_is_followed_by_the_other_and_so_is_resume(
    tmp_path: Path,
) -> None:
    first, second, security = states(tmp_path)
    first.halt(HaltCause.OPERATOR, reason="incident", by="ops")
    assert not second.halted
    assert second.check_shared() is True
    assert second.halted
    assert second.causes[0].by == "ops"
    assert second.check_shared() is False  # once per change
    second.resume(reason="clear", by="ops-2")
    assert first.check_shared() is True
    assert not first.halted
    assert [e for e in security.named("HALTED")] == [
        {"cause": "OPERATOR", "reason": "incident", "by": "ops"},
        {"cause": "OPERATOR", "reason": "incident", "by": "ops", "from_worker": 0},
    ]
    assert security.named("RESUMED")[-1]["from_worker"] == 1


def test_a_worker_starting_while_the_group_is_halted_starts_halted(tmp_path: Path) -> None:
    first, _, _ = states(tmp_path)
    first.halt(HaltCause.OPERATOR, reason="incident", by="ops")
    late = HaltState(clock=ManualClock(0.0), security=MemorySink())
    late.share(WorkerLink(1, 2, tmp_path).shared_halt())
    assert late.halted


def test_automatic_causes_stay_the_workers_own(tmp_path: Path) -> None:
    first, second, _ = states(tmp_path)
    first.halt(HaltCause.AUTH_SPIKE, reason="spike")
    assert second.check_shared() is False
    assert not second.halted


def test_a_resume_is_not_followed_where_a_cause_of_the_workers_own_stands(tmp_path: Path) -> None:
    halt_file = tmp_path / "halt"
    halt_file.write_text("x")
    first, second, security = states(tmp_path, halt_file=halt_file)
    assert second.halted  # the halt file
    first.halt(HaltCause.OPERATOR, reason="incident", by="ops")
    second.check_shared()
    first.resume(reason="clear", by="ops")
    assert second.check_shared() is True
    assert second.halted
    assert security.named("RESUME_NOT_FOLLOWED")
    with pytest.raises(RequestRejected):
        second.resume(reason="clear", by="ops")


def test_the_roster_merges_the_supervisors_view_with_what_each_worker_published(
    tmp_path: Path,
) -> None:
    link = WorkerLink(0, 2, tmp_path)
    write_json(
        tmp_path / "supervisor.json",
        {"workers": [{"index": 0, "pid": os.getpid(), "state": "running", "restarts": 0},
                     {"index": 1, "pid": 4242, "state": "restarting", "restarts": 3}]},
    )  # fmt: skip
    link.publish({"pid": os.getpid(), "ready": True, "halted": False, "open_attempts": 2})
    WorkerLink(1, 2, tmp_path).publish({"pid": 4141, "ready": True})  # the dead one's
    roster = link.roster()
    assert roster[0]["published"] is True
    assert roster[0]["open_attempts"] == 2
    assert roster[0]["this_worker"] is True
    assert roster[1] == {
        "index": 1,
        "pid": 4242,
        "state": "restarting",
        "restarts": 3,
        "this_worker": False,
        "published": False,
    }


def test_only_a_supervised_process_has_a_link(tmp_path: Path) -> None:
    assert WorkerLink.from_environ({}, count=2) is None
    env = {INDEX_ENV: "1", RUNTIME_ENV: str(tmp_path)}
    assert WorkerLink.from_environ(env, count=2) == WorkerLink(1, 2, tmp_path)
    assert WorkerLink.from_environ(env, count=1) is None
    assert WorkerLink.from_environ({**env, RUNTIME_ENV: "relative"}, count=2) is None
