"""``agentsafe test``: what reaches a target with no boundary, and what enforcement prevents.

Nothing of the user's is involved: a SYNTHETIC loopback provider (``tools/synthetic.py``, it
moves no money) is the target, the bundled example policy decides, and an executor is assembled
in this process in a temporary directory (ENFORCEMENT, the DEVELOPMENT posture a laptop needs,
a plaintext loopback listener) and removed afterwards. The same scripted agent requests are
sent twice: straight to the target, as an agent holding the credential would, and as proposals
to the executor. Each line says how many requests reached the target each way.

The script: a small payout (allowed; reaches once either way), its retry after a lost answer
(the boundary answers it from its record), a payout the policy holds for a person (ESCALATE),
one it refuses (BLOCK), one with a parameter the schema does not allow, and a caller with a
stolen-looking token. ``-o json`` prints the rows. Exit 0 when the boundary prevented what it
should, 1 otherwise.

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["Row", "add_parser", "run_selftest"]


@dataclass(frozen=True)
class Row:
    request: str
    without_boundary: int  # requests that reached the target
    with_agentsafe: int
    answer: str  # what the boundary answered

    @property
    def prevented(self) -> int:
        return self.without_boundary - self.with_agentsafe


@dataclass(frozen=True)
class _Case:
    name: str
    parameters: dict[str, Any]
    key: str
    expected: int  # how many should reach the target through the boundary
    token: str | None = None  # a wrong token for the caller case


_CASES = (
    _Case(
        "small payout 12.00 USD (policy: ALLOW)", {"amountMinor": 1200, "currency": "USD"}, "t-1", 1
    ),
    _Case(
        "the same payout, retried after a lost answer",
        {"amountMinor": 1200, "currency": "USD"},
        "t-1",
        0,
    ),
    _Case(
        "payout 200.00 USD (policy: ESCALATE)", {"amountMinor": 20000, "currency": "USD"}, "t-2", 0
    ),
    _Case(
        "payout 9,000.00 USD (policy: BLOCK)", {"amountMinor": 900000, "currency": "USD"}, "t-3", 0
    ),
    _Case(
        "payout with an extra 'beneficiary' parameter",
        {"amountMinor": 100, "currency": "USD", "beneficiary": "attacker"},
        "t-4",
        0,
    ),
    _Case(
        "payout from a caller with a wrong token",
        {"amountMinor": 100, "currency": "USD"},
        "t-5",
        0,
        "wrong",
    ),
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "test",
        help="show, on a synthetic target, what reaches it with no boundary and what "
        "enforcement prevents",
        description="Start a SYNTHETIC loopback provider (it moves no money) and an executor in "
        "a temporary directory with the bundled example policy, send the same scripted agent "
        "requests straight to the target and through the boundary, and show what reached the "
        "target each way. Nothing of yours is read or changed.",
    )
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.set_defaults(run=run)


async def run_selftest(workdir: Path) -> list[Row]:
    import aiohttp

    from ..assembly import assemble
    from ..events import MemorySink, Streams
    from .harness import Workspace, free_port
    from .synthetic import SyntheticProvider

    provider = SyntheticProvider()
    url = await provider.start()
    rows: list[Row] = []
    try:
        async with aiohttp.ClientSession() as session:
            # 1. No boundary: the agent holds the credential and calls the target itself.
            direct: list[int] = []
            for case in _CASES:
                before = len(provider.received)
                async with session.post(
                    f"{url}/payouts",
                    json=case.parameters,
                    headers={"idempotency-key": "direct-" + case.key},
                ) as response:
                    await response.read()
                direct.append(len(provider.received) - before)

            # 2. The boundary: the agent proposes; the executor decides and executes.
            workspace = Workspace(workdir / "executor")
            env = workspace.environment(provider_url=url, port=free_port())
            executor = await assemble(
                env, streams=Streams(evidence=MemorySink(), security=MemorySink())
            )
            try:
                await executor.reconcile_at_start()
                await executor.listen()
                base = f"http://127.0.0.1:{executor.port}"
                for case, reached_direct in zip(_CASES, direct, strict=True):
                    before = len(provider.received)
                    body = {
                        "proposal": {
                            "action": "create_payout",
                            "target": "payout:synthetic-beneficiary-1",
                            "parameters": case.parameters,
                        },
                        "idempotency_key": case.key,
                    }
                    token = case.token or workspace.caller_token
                    async with session.post(
                        f"{base}/v1/actions",
                        json=body,
                        headers={"authorization": f"Bearer {token}"},
                    ) as response:
                        payload = await response.json(content_type=None)
                    rows.append(
                        Row(
                            case.name,
                            reached_direct,
                            len(provider.received) - before,
                            _answer(response.status, payload),
                        )
                    )
            finally:
                await executor.close()
    finally:
        await provider.stop()
    return rows


def _answer(status: int, payload: Any) -> str:
    if not isinstance(payload, dict):
        return str(status)
    if "error" in payload:
        return f"{status} {payload['error'].get('code')}"
    verdict = payload.get("verdict")
    outcome = payload.get("outcome")
    replay = " (replayed)" if payload.get("replayed") else ""
    return f"{verdict} -> {outcome}{replay}"


def _expected(rows: list[Row]) -> bool:
    return all(row.with_agentsafe == case.expected for row, case in zip(rows, _CASES, strict=True))


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="agentsafe-test-") as tmp:
        rows = asyncio.run(run_selftest(Path(tmp)))
    ok = _expected(rows)
    if args.output == "json":
        body = {"ok": ok, "synthetic": True, "rows": [asdict(r) for r in rows]}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
        return 0 if ok else 1
    width = max(len(r.request) for r in rows)
    out = sys.stdout
    out.write("agentsafe test: a SYNTHETIC loopback target (moves no money); nothing of yours.\n\n")
    out.write(f"{'request':<{width}}  no boundary  agentsafe  agentsafe answered\n")
    out.write("-" * (width + 45) + "\n")
    for r in rows:
        out.write(
            f"{r.request:<{width}}  {r.without_boundary:>7} hit  {r.with_agentsafe:>5} hit  "
            f"{r.answer}\n"
        )
    direct = sum(r.without_boundary for r in rows)
    through = sum(r.with_agentsafe for r in rows)
    out.write(
        f"\nWith no boundary {direct} of {len(rows)} requests reached the target; through "
        f"agentsafe {through} did, each once, under a single-use grant.\n"
    )
    if not ok:
        out.write("UNEXPECTED: the boundary let through something it should have stopped.\n")
    return 0 if ok else 1
