"""The work gate reads the posture monitor's and the halt's verdicts as they keep them
(``degraded``, ``halted``, set as they change) and, under ``EXECUTOR_WORKERS``, syncs the group's
shared halt on every request: a halt answered on one worker refuses the very next request on
another, with no poll in between (two states over one runtime directory stand in for two
workers, as in ``test_workers_link.py``)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.codes import Code
from agentsafe.executor.config import PostureMode
from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.halt import HaltCause, HaltState
from agentsafe.executor.host.posture import PostureInputs, PostureMonitor
from agentsafe.executor.host.workers import WorkerLink
from agentsafe.executor.host.workgate import StoreHealth, WorkGate


def _monitor(tmp_path: Path, environ: dict[str, str]) -> PostureMonitor:
    inputs = PostureInputs(
        mode=PostureMode.ENFORCED,
        production=True,
        environ=environ,
        guard_results={},
        root_path=tmp_path,
        cwd=tmp_path,
        sa_token_path=tmp_path / "no-such-token",
        proc_status_path=tmp_path / "no-status",
        euid=1000,
    )
    return PostureMonitor(inputs, security=MemorySink(), interval=60, checks=("PROXY_ENV",))


def _halt() -> HaltState:
    return HaltState(clock=ManualClock(1_772_445_600.0), security=MemorySink())


def test_the_gate_follows_the_posture_monitors_verdict(tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    monitor = _monitor(tmp_path, environ)
    gate = WorkGate(_halt(), monitor)
    monitor.check_now()
    assert (monitor.degraded, gate.refusal()) == (False, None)
    environ["HTTPS_PROXY"] = "http://proxy.test"
    monitor.check_now()
    assert (monitor.degraded, monitor.is_degraded()) == (True, True)
    assert gate.refusal() == Code.POSTURE_DEGRADED
    del environ["HTTPS_PROXY"]
    monitor.check_now()
    assert (monitor.degraded, gate.refusal()) == (False, None)


def test_halted_is_kept_with_the_causes_and_the_gate_reads_it(tmp_path: Path) -> None:
    halt = _halt()
    store = StoreHealth()
    gate = WorkGate(halt, _monitor(tmp_path, {}), store)
    assert (halt.halted, gate.refusal()) == (False, None)
    halt.journal_failed()
    assert (halt.halted, gate.refusal()) == (True, Code.EXECUTOR_HALTED)
    halt.chain_heads_failed()
    halt.journal_recovered()  # one cause lifted, one stands
    assert (halt.halted, gate.refusal()) == (True, Code.EXECUTOR_HALTED)
    halt.chain_heads_recovered()
    assert (halt.halted, gate.refusal()) == (False, None)
    halt.halt(HaltCause.OPERATOR, reason="incident", by="ops")
    assert (halt.halted, gate.refusal()) == (True, Code.EXECUTOR_HALTED)
    halt.resume(reason="clear", by="ops")
    assert (halt.halted, gate.refusal()) == (False, None)
    store.available = False
    assert gate.refusal() == Code.STORE_UNAVAILABLE


def test_halted_matches_the_causes_when_threads_halt_and_lift() -> None:
    halt = _halt()

    def churn() -> None:
        for _ in range(200):
            halt.journal_failed()
            halt.journal_recovered()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert halt.halted is bool(halt.causes) is False
    halt.chain_heads_failed()
    assert halt.halted is bool(halt.causes) is True


def test_a_halt_answered_on_one_worker_refuses_the_next_request_on_another(
    tmp_path: Path,
) -> None:
    first, second = _halt(), _halt()
    first.share(WorkerLink(0, 2, tmp_path).shared_halt())
    second.share(WorkerLink(1, 2, tmp_path).shared_halt())
    gate = WorkGate(second, _monitor(tmp_path, {}))
    assert gate.refusal() is None
    first.halt(HaltCause.OPERATOR, reason="incident", by="ops")
    assert gate.refusal() == Code.EXECUTOR_HALTED  # no poll, no check_shared in between
    first.resume(reason="clear", by="ops")
    assert gate.refusal() is None


def test_a_single_process_gate_does_not_sync_a_shared_halt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    halt = _halt()

    def unexpected() -> None:
        raise AssertionError("a single process has no shared halt to sync")

    monkeypatch.setattr(halt, "sync_shared", unexpected)
    assert WorkGate(halt, _monitor(tmp_path, {})).refusal() is None
