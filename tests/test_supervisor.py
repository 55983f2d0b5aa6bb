"""The supervisor's pieces that need no worker process: whole lines only, a torn last line never
forwarded (the process tests are ``tests/integration/test_workers_process.py``), and which
journal directories refuse a start."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.clock import SystemClock
from agentsafe.executor.config import load_config
from agentsafe.executor.state.journal import AttemptJournal
from agentsafe.executor.supervisor import Supervisor, _Out, _pump, _Worker, unsettled_journals

from .test_config import legacy_env


class Captured:
    """Stands in for ``_Out``: keeps every write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def line(self, data: bytes) -> None:
        self.lines(data if data.endswith(b"\n") else data + b"\n")

    def lines(self, data: bytes) -> None:
        self.writes.append(data)

    @property
    def forwarded(self) -> list[bytes]:
        return b"".join(self.writes).splitlines(keepends=True)


def _feed(chunks: list[bytes]) -> int:
    """A pipe's read end; a thread writes ``chunks`` into it, one ``write`` each, then closes."""
    read, write = os.pipe()

    def run() -> None:
        try:
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(write, view) :]
        finally:
            os.close(write)

    threading.Thread(target=run, daemon=True).start()
    return read


async def test_whole_lines_are_forwarded_and_a_torn_last_line_is_reported_not_forwarded(
    tmp_path: Path,
) -> None:
    config = load_config(
        legacy_env(EXECUTOR_WORKERS="2", EXECUTOR_JOURNAL_DIR=str(tmp_path / "journal"))
    )
    supervisor = Supervisor({}, config)
    out, err = Captured(), Captured()
    supervisor.stdout, supervisor.stderr = out, err  # type: ignore[assignment]
    long_line = b'{"seq":2,"x":"' + b"y" * 200_000 + b'"}'
    fd = _feed([b'{"seq":1}\n' + long_line[:70_000], long_line[70_000:] + b'\n{"seq":3,"torn'])
    await supervisor._start_pump(_Worker(1, {}), fd, out)  # type: ignore[arg-type]
    assert out.forwarded == [b'{"seq":1}\n', long_line + b"\n"]
    assert all(w.endswith(b"\n") for w in out.writes)  # every write ends a line
    said = [json.loads(line) for line in err.forwarded]
    assert [(s["event"], s["worker"], s["stream"], s["bytes"]) for s in said] == [
        ("WORKER_TORN_LINE", 1, "stdout", 14)
    ]
    assert b"torn" not in b"".join(err.writes)  # never the fragment itself


def test_each_read_is_forwarded_as_its_whole_lines_in_one_write() -> None:
    out = Captured()
    chunks = [b"a\nb\nc", b"c\n", b"d", b"d", b"\ne\n"]
    read, write = os.pipe()
    for chunk in chunks:  # written before the pump reads: it may read them in any grouping
        os.write(write, chunk)
    os.close(write)
    assert _pump(read, out) == 0  # type: ignore[arg-type]
    assert out.forwarded == [b"a\n", b"b\n", b"cc\n", b"dd\n", b"e\n"]
    assert all(w.endswith(b"\n") for w in out.writes)


def test_writers_on_two_threads_never_interleave_inside_a_line(tmp_path: Path) -> None:
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    target = _Out(fd)
    lines = {n: bytes([ord("a") + n]) * 300_000 + b"\n" for n in range(4)}
    threads = [
        threading.Thread(target=lambda n=n: [target.lines(lines[n]) for _ in range(5)])
        for n in lines
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.close(fd)
    written = path.read_bytes().splitlines(keepends=True)
    assert sorted(written) == sorted(line for line in lines.values() for _ in range(5))


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
