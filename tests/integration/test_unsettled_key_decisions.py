"""Issue 29: an OPERATOR's decision for a key listed ``JOURNAL_RECORD_MISSING``, in process.

Real components: the assembled executor (``assemble``), its SQLite use store and its attempt
journal on disk; the use store's state directory is a real, size-limited **tmpfs** (we are root)
that the test fills to ENOSPC, so the decision is journaled but the store refuses it. The keys
are left in flight the way a crash leaves them (begun IN_PROGRESS with the attempt id they would
journal, owned by the journal), and the day file that would hold their attempts is deleted; the
process test (``test_unsettled_key_and_chain_heads.py``) does the same with a real SIGKILL.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.assembly import assemble
from agentsafe.executor.codes import Code
from agentsafe.executor.errors import RequestRejected, StoreError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.principals import Principal, Role
from agentsafe.executor.state.records import IdempotencyKind
from agentsafe.executor.tools.harness import Workspace

pytestmark = pytest.mark.slow

OPERATOR = Principal(id="ops-oncall", role=Role.OPERATOR)
SCOPE = {"tenant": "t-1", "principal": "treasury-workflow"}


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    """A workspace whose ``state`` (the use store) is a real 2 MiB tmpfs of its own."""
    workspace = Workspace(tmp_path / "ws")
    state = workspace.root / "state"
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(state)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + result.stderr.decode(errors="replace"))
    try:
        yield workspace
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def fill(mount: Path) -> Path:
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


async def start(workspace: Workspace) -> tuple[Executor, MemorySink]:
    env = workspace.environment(provider_url="http://127.0.0.1:9", port=0)
    security = MemorySink()
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=security))
    await executor.reconcile_at_start()
    return executor, security


async def replay(executor: Executor, key: str) -> dict[str, Any] | None:
    """The key's recorded answer (``None``: still in flight)."""
    state = await executor.store.idempotency_begin(
        **SCOPE, key=key, payload_digest="sha256:p", now=executor.clock.now()
    )
    if state.kind is IdempotencyKind.IN_PROGRESS:
        return None
    assert state.kind is IdempotencyKind.REPLAY, state
    assert state.response is not None
    body: dict[str, Any] = state.response["body"]
    return body


async def test_decisions_for_keys_whose_journal_record_is_missing(workspace: Workspace) -> None:
    first, _ = await start(workspace)
    assert first.journal is not None
    for key in ("not-run", "ran"):
        state = await first.store.idempotency_begin(
            **SCOPE,
            key=key,
            payload_digest="sha256:p",
            now=first.clock.now(),
            attempt_id=f"att-{key}",
            owner=first.journal_identity(),
        )
        assert state.kind is IdempotencyKind.NEW
    await first.journal.reconciled(attempt_id="att-other", status="UNCLAIMED", by="RESTART")
    await first.close()
    for day in (workspace.root / "journal" / "attempts").glob("*.jsonl"):
        day.unlink()

    second, security = await start(workspace)
    try:
        listed = {a["attempt_id"]: a["state"] for a in await second.open_attempts()}
        assert listed == {
            "att-not-run": "JOURNAL_RECORD_MISSING",
            "att-ran": "JOURNAL_RECORD_MISSING",
        }
        assert second.unknown_attempts == 2

        # executed=false: the key's answer is "definitely not executed".
        decided = await second.decide_attempt(
            attempt_id="att-not-run", executed=False, reason="not in the ledger", principal=OPERATOR
        )
        assert decided == {"attempt_id": "att-not-run", "status": "NOT_EXECUTED", "by": "OPERATOR"}
        body = await replay(second, "not-run")
        assert body is not None
        assert (body["outcome"], body["executed"]) == ("DEFINITELY_NOT_EXECUTED", False)

        # executed=true while the use store's disk is full: journaled, not stored, still listed.
        filler = fill(workspace.root / "state")
        with pytest.raises(StoreError):
            await second.decide_attempt(
                attempt_id="att-ran", executed=True, reason="in the ledger", principal=OPERATOR
            )
        assert [a["attempt_id"] for a in await second.open_attempts()] == ["att-ran"]
        with pytest.raises(RequestRejected) as refused:  # never turned into "not executed"
            await second.decide_attempt(
                attempt_id="att-ran", executed=False, reason="changed my mind", principal=OPERATOR
            )
        assert refused.value.code == Code.ATTEMPT_ALREADY_DECIDED
        assert await second.open_attempts() == [
            {
                "attempt_id": "att-ran",
                "principal": "treasury-workflow",
                "grant_claimed": None,
                "state": "JOURNAL_RECORD_MISSING",
            }
        ]
        filler.unlink()
    finally:
        await second.close()
    decisions = security.named("ATTEMPT_DECIDED")
    assert [(d["attempt_id"], d["status"], d["by"]) for d in decisions] == [
        ("att-not-run", "NOT_EXECUTED", "ops-oncall")
    ]

    # The next start settles the key from the journaled decision: executed.
    third, _ = await start(workspace)
    try:
        assert await third.open_attempts() == []
        body = await replay(third, "ran")
        assert body is not None
        assert (body["outcome"], body["executed"]) == ("COMPLETED", True)
        body = await replay(third, "not-run")
        assert body is not None
        assert body["outcome"] == "DEFINITELY_NOT_EXECUTED"
    finally:
        await third.close()
