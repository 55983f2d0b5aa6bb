"""The supervisor's pieces that need no worker process: whole lines only, a torn last line never
forwarded (the process tests are ``tests/integration/test_workers_process.py``), and which
journal directories refuse a start."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.clock import SystemClock
from agentsafe.executor.config import load_config
from agentsafe.executor.state.journal import AttemptJournal
from agentsafe.executor.supervisor import Supervisor, _Worker, unsettled_journals

from .test_config import legacy_env


class Captured:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def line(self, data: bytes) -> None:
        self.lines.append(data if data.endswith(b"\n") else data + b"\n")


async def test_whole_lines_are_forwarded_and_a_torn_last_line_is_reported_not_forwarded(
    tmp_path: Path,
) -> None:
    config = load_config(
        legacy_env(EXECUTOR_WORKERS="2", EXECUTOR_JOURNAL_DIR=str(tmp_path / "journal"))
    )
    supervisor = Supervisor({}, config)
    out, err = Captured(), Captured()
    supervisor.stdout, supervisor.stderr = out, err  # type: ignore[assignment]
    reader = asyncio.StreamReader()
    long_line = b'{"seq":2,"x":"' + b"y" * 200_000 + b'"}'
    reader.feed_data(b'{"seq":1}\n' + long_line[:70_000])
    reader.feed_data(long_line[70_000:] + b'\n{"seq":3,"torn')
    reader.feed_eof()
    await supervisor._pump(_Worker(1, {}), reader, out)  # type: ignore[arg-type]
    assert out.lines == [b'{"seq":1}\n', long_line + b"\n"]
    said = [json.loads(line) for line in err.lines]
    assert [(s["event"], s["worker"], s["bytes"]) for s in said] == [("WORKER_TORN_LINE", 1, 14)]
    assert b"torn" not in b"".join(err.lines)  # never the fragment itself


async def test_journals_no_worker_opens_refuse_only_while_they_hold_work(tmp_path: Path) -> None:
    base = tmp_path / "journal"
    clock = SystemClock()

    def config(workers: int):  # type: ignore[no-untyped-def]
        return load_config(
            legacy_env(EXECUTOR_WORKERS=str(workers), EXECUTOR_JOURNAL_DIR=str(base))
        )

    assert await unsettled_journals(config(1)) == []
    # worker-2 took a record and holds an open attempt: N=2 and N=1 would never read it.
    journal = await AttemptJournal.open(base / "worker-2", retain_days=30, clock=clock)
    binding = {"action": "create_payout", "parameters": {"amountMinor": 1}}
    await journal.opened(
        attempt_id="a-1", intent_id="i-1", intent_hash=sha256_digest(binding),
        decision_id="d-1", dossier_id="s-1", caller="p", action="create_payout",
        binding=binding, grant_id="g-1",
    )  # fmt: skip
    await journal.close()
    assert await unsettled_journals(config(3)) == []  # worker-2 is one of three
    assert await unsettled_journals(config(2)) == [(base / "worker-2", 3)]
    assert await unsettled_journals(config(1)) == [(base / "worker-2", 3)]
    # An empty worker directory (never a record) holds nothing.
    (base / "worker-5" / "attempts").mkdir(parents=True)
    assert await unsettled_journals(config(2)) == [(base / "worker-2", 3)]
