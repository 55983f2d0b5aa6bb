"""Startup reconciliation over a real journal on disk, with a reconciler test double."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import JournalError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.lifecycle.reconcile import (
    ReconcileResult,
    ReconcileStatus,
    ResolutionStatus,
    reconcile_open_attempts,
)
from agentsafe.executor.state.journal import AttemptJournal
from tests.support.intents import numbered_intent

NOW = 1_800_000_000.0
DAY = "2027-01-15"


class FakeReconcilerDouble:
    """Test double for the registry's read path: answers per idempotency key and records every
    question. It has no execute method, like the real interface."""

    def __init__(self, answers: dict[str, ReconcileResult | Exception | None]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str]] = []
        self.never = asyncio.Event()

    async def reconcile(
        self, action: str, idempotency_key: str, *, intent_hash: str
    ) -> ReconcileResult:
        self.asked.append((action, idempotency_key))
        answer = self.answers[idempotency_key]
        if answer is None:  # a provider that never answers
            await self.never.wait()
            raise AssertionError("unreachable")
        if isinstance(answer, Exception):
            raise answer
        return answer


async def write_attempt(journal: AttemptJournal, number: int, *, claimed: bool = True) -> None:
    intent = numbered_intent(number)
    await journal.opened(
        attempt_id=f"a-{number}",
        intent_id=intent.intent_id,
        intent_hash=intent.intent_hash,
        decision_id=f"dec-{number}",
        dossier_id=f"dos-{number}",
        caller="agent-1",
        action=intent.action,
        binding=intent.binding,
    )
    if claimed:
        await journal.grant_claimed(
            attempt_id=f"a-{number}",
            grant_id=f"g-{number}",
            expires_at=NOW + 30,
            payload_digest=intent.payload_digest,
        )


def rewrite(path: Path, attempt_id: str, record: str, change: Any) -> None:
    """Tamper with one record of the journal file, as an attacker with the volume could."""
    lines = []
    for raw in path.read_bytes().splitlines():
        value = json.loads(raw)
        if value["attempt_id"] == attempt_id and value["record"] == record:
            change(value)
            raw = canonical_json(value)
        lines.append(raw + b"\n")
    path.write_bytes(b"".join(lines))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def streams() -> Streams:
    return Streams.memory()


@pytest.fixture
async def journal(tmp_path: Path, clock: ManualClock) -> AsyncIterator[AttemptJournal]:
    opened = await AttemptJournal.open(tmp_path / "j", retain_days=7, clock=clock)
    yield opened
    await opened.close()


def evidence(streams: Streams) -> list[dict[str, Any]]:
    assert isinstance(streams.evidence, MemorySink)
    return streams.evidence.named("RECONCILIATION")


def security(streams: Streams, event: str) -> list[dict[str, Any]]:
    assert isinstance(streams.security, MemorySink)
    return streams.security.named(event)


async def restart(tmp_path: Path, clock: ManualClock) -> AttemptJournal:
    return await AttemptJournal.open(tmp_path / "j", retain_days=7, clock=clock)


async def test_all_five_resolutions(tmp_path: Path, clock: ManualClock, streams: Streams) -> None:
    before = await restart(tmp_path, clock)
    await write_attempt(before, 1, claimed=False)
    for number in range(2, 7):
        await write_attempt(before, number)
    await write_attempt(before, 7)
    await write_attempt(before, 8)
    await before.closed(attempt_id="a-8", outcome="COMPLETED", executed=True, finalization="OK")
    await before.close()
    rewrite(
        before.path / f"{DAY}.jsonl",
        "a-6",
        "ATTEMPT_OPENED",
        lambda r: r["intent"]["action"]["parameters"].update(amountMinor=99_999_999),
    )

    double = FakeReconcilerDouble(
        {
            "key-2": ReconcileResult(ReconcileStatus.COMPLETED, provider_reference="p-2"),
            "key-3": ReconcileResult(ReconcileStatus.NOT_EXECUTED),
            "key-4": ReconcileResult(ReconcileStatus.UNKNOWN, reason_code="LOOKUP_5XX"),
            "key-5": RuntimeError("provider unreachable"),
            "key-7": None,
        }
    )
    journal = await restart(tmp_path, clock)
    try:
        resolutions = await reconcile_open_attempts(
            journal, reconciler=double, streams=streams, timeout_s=0.05
        )
        still_open = sorted(a.attempt_id for a in await journal.open_attempts())
    finally:
        await journal.close()

    by_id = {r.attempt_id: r.resolution for r in resolutions}
    assert by_id == {
        "a-1": ResolutionStatus.UNCLAIMED,
        "a-2": ResolutionStatus.RECONCILED_COMPLETED,
        "a-3": ResolutionStatus.RECONCILED_NOT_EXECUTED,
        "a-4": ResolutionStatus.STILL_UNKNOWN,
        "a-5": ResolutionStatus.STILL_UNKNOWN,
        "a-6": ResolutionStatus.BINDING_MISMATCH,
        "a-7": ResolutionStatus.STILL_UNKNOWN,
    }
    # The provider was asked about claimed, intact attempts only, by the binding's action.
    assert double.asked == [("create_payout", f"key-{n}") for n in (2, 3, 4, 5, 7)]
    assert still_open == ["a-4", "a-5", "a-6", "a-7"]

    completed = next(r for r in resolutions if r.attempt_id == "a-2")
    assert completed.closed
    assert completed.intent_binding == numbered_intent(2).binding
    assert completed.intent_hash == numbered_intent(2).intent_hash
    assert (completed.idempotency_key, completed.principal, completed.tenant) == (
        "key-2",
        "agent-1",
        "tenant-1",
    )
    assert completed.result == ReconcileResult(ReconcileStatus.COMPLETED, provider_reference="p-2")
    assert not next(r for r in resolutions if r.attempt_id == "a-4").closed

    events = evidence(streams)
    # Lookups run concurrently: the events come in the order the answers did, one per attempt.
    assert sorted((e["attempt_id"], e["resolution"]) for e in events) == sorted(
        (r.attempt_id, r.resolution.value) for r in resolutions
    )
    assert all(e["by"] == "RESTART" for e in events)
    by_attempt = {e["attempt_id"]: e for e in events}
    assert by_attempt["a-2"]["intent_hash"] == numbered_intent(2).intent_hash
    assert by_attempt["a-4"]["reason_code"] == "LOOKUP_5XX"
    text = json.dumps(events)
    assert "amountMinor" not in text
    assert "USD" not in text
    assert [e["attempt_id"] for e in security(streams, "JOURNAL_BINDING_MISMATCH")] == ["a-6"]


async def test_a_second_start_asks_again_only_what_stayed_unknown(
    tmp_path: Path, clock: ManualClock
) -> None:
    first = await restart(tmp_path, clock)
    for number in (1, 2, 3):
        await write_attempt(first, number)
    await first.close()
    answers: dict[str, ReconcileResult | Exception | None] = {
        "key-1": ReconcileResult(ReconcileStatus.COMPLETED),
        "key-2": ReconcileResult(ReconcileStatus.UNKNOWN),
        "key-3": ReconcileResult(ReconcileStatus.NOT_EXECUTED),
    }
    for expected_asked in (["key-1", "key-2", "key-3"], ["key-2"]):
        double = FakeReconcilerDouble(answers)
        journal = await restart(tmp_path, clock)
        try:
            await reconcile_open_attempts(journal, reconciler=double, streams=Streams.memory())
        finally:
            await journal.close()
        assert [key for _, key in double.asked] == expected_asked
    answers["key-2"] = ReconcileResult(ReconcileStatus.COMPLETED)
    journal = await restart(tmp_path, clock)
    try:
        resolutions = await reconcile_open_attempts(
            journal, reconciler=FakeReconcilerDouble(answers), streams=Streams.memory()
        )
        assert [(r.attempt_id, r.resolution) for r in resolutions] == [
            ("a-2", ResolutionStatus.RECONCILED_COMPLETED)
        ]
        assert await journal.open_attempts() == []
    finally:
        await journal.close()


@pytest.mark.parametrize(
    ("record", "change"),
    [
        ("ATTEMPT_OPENED", lambda r: r.update(intent_hash="sha256:" + "0" * 64)),
        ("ATTEMPT_OPENED", lambda r: r["intent"].update(idempotency_key="key-other")),
        ("ATTEMPT_OPENED", lambda r: r.update(action="delete_everything")),
        ("ATTEMPT_OPENED", lambda r: r["intent"].pop("action")),
        ("GRANT_CLAIMED", lambda r: r.update(payload_digest="sha256:" + "1" * 64)),
    ],
)
async def test_a_tampered_journal_is_a_binding_mismatch_and_asks_nothing(
    tmp_path: Path, clock: ManualClock, streams: Streams, record: str, change: Any
) -> None:
    before = await restart(tmp_path, clock)
    await write_attempt(before, 1)
    await before.close()
    rewrite(before.path / f"{DAY}.jsonl", "a-1", record, change)

    double = FakeReconcilerDouble({})
    journal = await restart(tmp_path, clock)
    try:
        resolutions = await reconcile_open_attempts(journal, reconciler=double, streams=streams)
        assert [r.resolution for r in resolutions] == [ResolutionStatus.BINDING_MISMATCH]
        assert [a.attempt_id for a in await journal.open_attempts()] == ["a-1"]
        assert (await journal.open_attempts())[0].last_status == "BINDING_MISMATCH"
    finally:
        await journal.close()
    assert double.asked == []
    assert len(security(streams, "JOURNAL_BINDING_MISMATCH")) == 1


async def test_a_damaged_journal_line_stops_reconciliation(
    tmp_path: Path, clock: ManualClock, streams: Streams
) -> None:
    before = await restart(tmp_path, clock)
    await write_attempt(before, 1)
    await write_attempt(before, 2)
    await before.close()
    path = before.path / f"{DAY}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b"{garbage\n"
    path.write_bytes(b"".join(lines))

    double = FakeReconcilerDouble({})
    journal = await restart(tmp_path, clock)
    try:
        with pytest.raises(JournalError) as caught:
            await reconcile_open_attempts(journal, reconciler=double, streams=streams)
    finally:
        await journal.close()
    assert caught.value.code == "JOURNAL_CORRUPT"
    assert f"{DAY}.jsonl line 2" in caught.value.message
    assert double.asked == []


async def test_a_torn_line_is_reported_and_the_rest_reconciled(
    tmp_path: Path, clock: ManualClock, streams: Streams
) -> None:
    before = await restart(tmp_path, clock)
    await write_attempt(before, 1)
    await before.close()
    with (before.path / f"{DAY}.jsonl").open("ab") as handle:
        handle.write(b'{"record":"ATTEMPT_CLOSED","at"')

    double = FakeReconcilerDouble({"key-1": ReconcileResult(ReconcileStatus.NOT_EXECUTED)})
    journal = await restart(tmp_path, clock)
    try:
        resolutions = await reconcile_open_attempts(journal, reconciler=double, streams=streams)
        assert [r.resolution for r in resolutions] == [ResolutionStatus.RECONCILED_NOT_EXECUTED]
        assert await journal.open_attempts() == []
    finally:
        await journal.close()
    assert security(streams, "JOURNAL_TORN_LINE") == [
        {"file": f"attempts/{DAY}.jsonl", "line": 3, "length": 31}
    ]


async def test_a_journal_that_cannot_record_leaves_the_attempt_open(
    tmp_path: Path, clock: ManualClock, streams: Streams
) -> None:
    journal = await restart(tmp_path, clock)
    await write_attempt(journal, 1)
    await journal.close()  # scan still reads; the RECONCILED append is refused

    double = FakeReconcilerDouble({"key-1": ReconcileResult(ReconcileStatus.COMPLETED)})
    resolutions = await reconcile_open_attempts(journal, reconciler=double, streams=streams)
    assert [r.resolution for r in resolutions] == [ResolutionStatus.RECONCILED_COMPLETED]
    assert security(streams, "RECONCILIATION_NOT_RECORDED") == [
        {"attempt_id": "a-1", "code": "JOURNAL_CLOSED"}
    ]
    assert [a.attempt_id for a in await journal.open_attempts()] == ["a-1"]


async def test_nothing_open_means_nothing_asked(journal: AttemptJournal, streams: Streams) -> None:
    double = FakeReconcilerDouble({})
    assert await reconcile_open_attempts(journal, reconciler=double, streams=streams) == []
    assert double.asked == []
    assert evidence(streams) == []
