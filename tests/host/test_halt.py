"""The halt: its causes, the resume rules, the halt file and the spike detectors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.codes import Code
from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.errors import RequestRejected
from agentsafe.executor.events import MemorySink
from agentsafe.executor.evidence.chain import ChainError
from agentsafe.executor.host.halt import MAX_REASON_CHARS, HaltCause, HaltState
from agentsafe.executor.host.metrics import ExecutorMetrics
from agentsafe.executor.policy.policy import Verdict
from agentsafe.executor.routes.refusals import status_of
from agentsafe.executor.windows import RateRule


def make(tmp_path: Path, **kw: object) -> tuple[HaltState, MemorySink, ExecutorMetrics]:
    security = MemorySink()
    metrics = ExecutorMetrics(verdicts=Verdict, outcomes=Outcome)
    state = HaltState(
        clock=ManualClock(),
        security=security,
        halt_file=tmp_path / "HALT",
        metrics=metrics,
        **kw,  # type: ignore[arg-type]
    )
    return state, security, metrics


def test_operator_halts_and_resumes_with_reasons(tmp_path: Path) -> None:
    state, security, metrics = make(tmp_path)
    changes: list[bool] = []
    state.add_listener(changes.append)
    assert not state.halted
    assert state.halt(HaltCause.OPERATOR, reason="incident 42", by="ops-oncall")
    assert state.halted
    assert not state.halt(HaltCause.OPERATOR, reason="again", by="ops-oncall")
    status = state.status()
    assert status["halted"] is True
    assert status["causes"][0]["cause"] == "OPERATOR"
    assert status["causes"][0]["reason"] == "incident 42"
    assert status["causes"][0]["by"] == "ops-oncall"
    state.resume(reason="fixed", by="ops-oncall")
    assert not state.halted
    assert changes == [True, False]
    assert security.named("HALTED") == [
        {"cause": "OPERATOR", "reason": "incident 42", "by": "ops-oncall"}
    ]
    assert security.named("RESUMED") == [
        {"reason": "fixed", "by": "ops-oncall", "causes": ["OPERATOR"]}
    ]
    assert metrics.halts.value(cause="OPERATOR") == 1


def test_reasons_are_required_and_bounded(tmp_path: Path) -> None:
    state, security, _ = make(tmp_path)
    with pytest.raises(RequestRejected) as info:
        state.halt(HaltCause.OPERATOR, reason="  ", by="ops")
    assert (status_of(info.value.code), info.value.code) == (422, "REASON_REQUIRED")
    assert not state.halted
    state.halt(HaltCause.OPERATOR, reason="x" * 5000 + "\x1b[31m", by="ops")
    assert len(security.named("HALTED")[0]["reason"]) == MAX_REASON_CHARS
    with pytest.raises(RequestRejected) as info:
        state.resume(reason="", by="ops")
    assert info.value.code == "REASON_REQUIRED"
    assert state.halted


def test_halt_file_halts_and_resume_is_refused_while_it_exists(tmp_path: Path) -> None:
    state, security, _ = make(tmp_path)
    assert not state.check_file()
    (tmp_path / "HALT").touch()
    assert state.check_file()
    assert state.halted
    assert not state.check_file()  # one HALTED line, not one per poll
    with pytest.raises(RequestRejected) as info:
        state.resume(reason="try", by="ops")
    assert (status_of(info.value.code), info.value.code) == (409, "HALT_CAUSE_PERSISTS")
    assert state.halted
    (tmp_path / "HALT").unlink()
    assert state.halted  # removing the file does not resume by itself
    state.resume(reason="file removed", by="ops")
    assert not state.halted
    assert [e["cause"] for e in security.named("HALTED")] == ["FILE"]


def test_a_process_that_starts_with_the_halt_file_starts_halted(tmp_path: Path) -> None:
    (tmp_path / "HALT").touch()
    state, security, _ = make(tmp_path)
    assert state.halted
    assert state.status()["halt_file_present"] is True
    assert security.named("HALTED")[0]["cause"] == "FILE"


async def test_the_watcher_notices_the_file(tmp_path: Path) -> None:
    state, _, _ = make(tmp_path)
    task = asyncio.create_task(state.watch(interval=0.01))
    try:
        (tmp_path / "HALT").touch()
        deadline = asyncio.get_running_loop().time() + 10
        while not state.halted:
            assert asyncio.get_running_loop().time() < deadline, "the watcher never halted"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_auth_spike_halts_on_the_threshold(tmp_path: Path) -> None:
    state, _security, metrics = make(tmp_path, auth_spike=RateRule(5, 60))
    for _ in range(4):
        state.record_auth_refusal()
    assert not state.halted
    state.record_auth_refusal()
    assert state.halted
    assert state.causes[0].cause is HaltCause.AUTH_SPIKE
    assert metrics.halts.value(cause="AUTH_SPIKE") == 1
    state.resume(reason="flood stopped", by="ops")
    for _ in range(4):
        state.record_auth_refusal()
    assert not state.halted  # the detector re-armed from zero
    state.record_auth_refusal()
    assert state.halted


def test_egress_spike_and_clock_skew_halt(tmp_path: Path) -> None:
    state, _, _ = make(tmp_path, egress_spike=RateRule(2, 60))
    state.record_egress_refusal()
    state.record_egress_refusal()
    state.clock_skew(2500)
    assert {c.cause for c in state.causes} == {HaltCause.EGRESS_SPIKE, HaltCause.CLOCK_SKEW}
    state.resume(reason="checked", by="ops")
    assert not state.halted


def test_spikes_can_be_disabled(tmp_path: Path) -> None:
    state, _, _ = make(tmp_path, auth_spike=None)
    for _ in range(1000):
        state.record_auth_refusal()
    assert not state.halted


def test_posture_drift_blocks_resume_until_restored(tmp_path: Path) -> None:
    state, _, _ = make(tmp_path)
    state.posture_drift("ROOT_WRITABLE")
    assert state.halted
    with pytest.raises(RequestRejected) as info:
        state.resume(reason="now", by="ops")
    assert info.value.code == "HALT_CAUSE_PERSISTS"
    state.posture_restored("ROOT_WRITABLE")
    assert state.halted  # restoring the posture does not resume
    state.resume(reason="posture holds", by="ops")
    assert not state.halted


def test_resume_when_not_halted_is_quiet(tmp_path: Path) -> None:
    state, security, _ = make(tmp_path)
    state.resume(reason="nothing", by="ops")
    assert security.events == []


def test_chain_heads_halt_with_their_own_cause_and_lift_by_themselves(tmp_path: Path) -> None:
    state, security, _metrics = make(tmp_path)
    assert state.chain_heads_failed() is True
    assert state.chain_heads_failed() is False  # one cause, one HALTED line
    assert state.halted
    assert state.has_cause(HaltCause.CHAIN_HEADS)
    assert [e for e, _ in security.events] == ["HALTED"]
    state.journal_failed()
    state.chain_heads_recovered()  # the journal's cause still stands
    assert state.halted
    assert not state.has_cause(HaltCause.CHAIN_HEADS)
    state.journal_recovered()
    assert not state.halted
    names = [e for e, _ in security.events]
    assert names == ["HALTED", "HALTED", "HALT_CAUSE_LIFTED", "HALT_CAUSE_LIFTED", "RESUMED"]
    assert security.events[2][1]["cause"] == "CHAIN_HEADS"
    assert security.events[4][1]["causes"] == ["JOURNAL"]


class RefusingSink:
    """A security stream that refuses every line, as a chain past its bound does."""

    def emit(self, event: str, fields: object = None) -> None:
        raise ChainError("the chain refuses the line", code=Code.CHAIN_JOURNAL)


def test_a_halt_stands_when_the_security_stream_refuses_its_line(tmp_path: Path) -> None:
    seen: list[bool] = []
    state = HaltState(clock=ManualClock(), security=RefusingSink(), halt_file=tmp_path / "HALT")
    state.add_listener(seen.append)
    assert state.chain_heads_failed() is True
    assert state.halted
    assert seen == [True]
    state.chain_heads_recovered()
    assert not state.halted
    assert seen == [True, False]
