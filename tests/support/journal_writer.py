"""A process that appends to the attempt journal until it is killed (tests/state/test_journal.py).

Usage: ``python journal_writer.py JOURNAL_DIR``. Appends ATTEMPT_OPENED and GRANT_CLAIMED records
four at a time, concurrently, forever; after each append *returns* it prints ``ACK <attempt_id>
<record>`` so the parent knows exactly which records were acknowledged when it sends SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agentsafe.executor.clock import SystemClock
from agentsafe.executor.intent import DownstreamTarget, capture_intent
from agentsafe.executor.principals import Actor, legacy_principal
from agentsafe.executor.state.journal import AttemptJournal


async def main(directory: Path) -> None:
    clock = SystemClock()
    journal = await AttemptJournal.open(directory, retain_days=2, clock=clock)
    principal = legacy_principal(tenant_id="tenant-1", actor=Actor("agent-1", "ai_agent"))
    target = DownstreamTarget("synthetic", "payouts.create", "http://127.0.0.1/payouts")

    async def attempt(number: int) -> None:
        attempt_id = f"attempt-{number}"
        intent = capture_intent(
            principal=principal,
            action="create_payout",
            resource="payout:1",
            parameters={"amountMinor": number + 1, "currency": "USD"},
            idempotency_key=f"key-{number}",
            target=target,
            now=clock.now(),
            ttl_seconds=60,
        )
        await journal.opened(
            attempt_id=attempt_id,
            intent_id=intent.intent_id,
            intent_hash=intent.intent_hash,
            decision_id=f"dec-{number}",
            dossier_id=f"dos-{number}",
            caller=principal.id,
            action=intent.action,
            binding=intent.binding,
        )
        print(f"ACK {attempt_id} ATTEMPT_OPENED", flush=True)
        await journal.grant_claimed(
            attempt_id=attempt_id,
            grant_id=f"grant-{number}",
            expires_at=clock.now() + 30,
            payload_digest=intent.payload_digest,
        )
        print(f"ACK {attempt_id} GRANT_CLAIMED", flush=True)

    number = 0
    while True:
        await asyncio.gather(*(attempt(number + i) for i in range(4)))
        number += 4


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
