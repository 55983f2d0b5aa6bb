"""A tiny process that writes chained evidence, for tests/evidence/test_chain_process.py.

Usage: chain_child.py <journal_dir> <count> <checkpoint_lines> <then>
Writes <count> events on the evidence stream (stdout) and, every fifth, one on the security stream
(stderr), through open_chained_streams with the journal directory. <then> is ``close`` (a clean
stop: heads persisted clean) or ``hang`` (block on stdin until the test kills the process).
"""

from __future__ import annotations

import sys

from agentsafe.executor.clock import SystemClock
from agentsafe.executor.evidence.chain import open_chained_streams


def main() -> int:
    journal_dir, count, checkpoint_lines, then = sys.argv[1:5]
    streams = open_chained_streams(
        evidence_out=sys.stdout,
        security_out=sys.stderr,
        clock=SystemClock(),
        journal_dir=journal_dir,
        checkpoint_lines=int(checkpoint_lines),
    )
    for i in range(int(count)):
        streams.evidence.emit("PROPOSAL_RECEIVED", {"n": i, "intent_id": f"intent-{i}"})
        if i % 5 == 0:
            streams.security.emit("AUTH_FAILED", {"n": i})
    if then == "close":
        streams.close()
        return 0
    sys.stdin.read()  # the test SIGKILLs us here
    return 3


if __name__ == "__main__":
    raise SystemExit(main())
