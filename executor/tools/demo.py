"""``agentsafe demo``: the whole lifecycle, on loopback, in one command.

It starts a SYNTHETIC provider and an executor (real processes, embedded defaults, the bundled
example policy) and drives a scripted agent through the cases a platform team asks about first:

1. an ALLOW executed once;
2. the same idempotency key again: the recorded answer, nothing executed twice;
3. an amount over policy: BLOCK;
4. an amount that needs a person: ESCALATE, held;
5. the same proposals in shadow: decisions recorded, nothing reaches the provider;
6. a provider that takes the request and never answers; the executor is killed with SIGKILL,
   restarted, and its startup reconciliation resolves the attempt without sending it again;
7. the banking family against the SYNTHETIC core bank, which books ten times the authorised
   amount of a SEPA credit transfer: the read-back shows it, the answer is COMPLETED with
   EFFECT_MISMATCH, and the executor halts itself (``EXECUTOR_ON_EFFECT_MISMATCH=HALT``, the
   default): ``/ready`` answers 503 and the next proposal is refused EXECUTOR_HALTED.

Then it leaves the executor serving, prints how to call it with curl, and waits for Ctrl-C.

Callers: ``cli.py`` (``agentsafe demo``); the integration tests run that command.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..codes import Code
from ..lifecycle.reconcile import ResolutionStatus
from .harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    banking_environment,
    banking_policy,
    free_port,
    wait_until,
)

__all__ = ["main", "run_demo"]

_UNBOUNDED = 10_000


@dataclass(frozen=True)
class Step:
    case: str
    expected: str
    observed: str
    provider_requests: int
    ok: bool


async def _count(provider: ProviderProcess) -> int:
    received = await provider.received()
    return int(received.get("count", 0))


async def run_demo(
    root: Path,
    *,
    console: Console,
    keep_serving: bool,
    progress: Callable[[str], None] | None = None,
) -> list[Step]:
    say = progress or (lambda text: console.print(f"[dim]… {text}[/dim]"))
    steps: list[Step] = []
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    provider = ProviderProcess(logs)
    workspace = Workspace(root / "enforcement")
    port = free_port()
    env = workspace.environment(provider_url=provider.url, port=port)
    executor = ExecutorProcess(env, logs, "executor")
    shadow: ExecutorProcess | None = None
    try:  # from the first process on: an interrupt at any point stops what was started
        say("starting the synthetic provider")
        await provider.start()
        say("starting the executor in ENFORCEMENT (development posture, plaintext loopback)")
        await executor.start()
        async with aiohttp.ClientSession() as session:
            _status, body = await executor.propose(session, amount=5000, key="payout-1-v1")
            count = await _count(provider)
            steps.append(
                Step(
                    "ALLOW 50.00 USD",
                    "COMPLETED, executed once",
                    f"{body.get('verdict')} / {body.get('outcome')}",
                    count,
                    body.get("outcome") == "COMPLETED" and count == 1,
                )
            )
            _status, body = await executor.propose(session, amount=5000, key="payout-1-v1")
            count = await _count(provider)
            steps.append(
                Step(
                    "same idempotency key again",
                    "recorded answer, replayed, not executed again",
                    f"{body.get('outcome')} replayed={body.get('replayed')}",
                    count,
                    body.get("replayed") is True and count == 1,
                )
            )
            _status, body = await executor.propose(session, amount=900000, key="payout-2-v1")
            count = await _count(provider)
            steps.append(
                Step(
                    "9,000.00 USD (over policy)",
                    "BLOCK AMOUNT_ABOVE_POLICY",
                    f"{body.get('verdict')} {','.join(body.get('reason_codes') or [])}",
                    count,
                    body.get("verdict") == "BLOCK" and count == 1,
                )
            )
            _status, body = await executor.propose(session, amount=20000, key="payout-3-v1")
            count = await _count(provider)
            steps.append(
                Step(
                    "200.00 USD (needs a person)",
                    "ESCALATE, held",
                    f"{body.get('verdict')} / {body.get('outcome')}",
                    count,
                    body.get("outcome") == "ESCALATE_PENDING" and count == 1,
                )
            )

            say("starting a second executor in SHADOW against the same provider")
            shadow_ws = Workspace(root / "shadow")
            shadow_env = shadow_ws.environment(
                provider_url=provider.url, port=free_port(), mode="SHADOW"
            )
            shadow = ExecutorProcess(shadow_env, logs, "shadow-executor")
            await shadow.start()
            verdicts = []
            for amount, key in ((5000, "shadow-1"), (900000, "shadow-2"), (20000, "shadow-3")):
                _status, body = await shadow.propose(session, amount=amount, key=key)
                verdicts.append(f"{body.get('verdict')}:{body.get('outcome')}")
            count = await _count(provider)
            steps.append(
                Step(
                    "the same three in SHADOW",
                    "decided and recorded, nothing executed",
                    " ".join(verdicts),
                    count,
                    count == 1 and all(v.endswith(":OBSERVED") for v in verdicts),
                )
            )
            shadow.terminate()
            shadow = None

            say("the provider will now take requests and never answer")
            await provider.set_mode("hang")
            proposal = asyncio.ensure_future(
                executor.propose(session, amount=4000, key="payout-4-v1")
            )

            async def arrived() -> bool:
                return await _count(provider) == 2

            await wait_until(arrived, timeout=30, what="the provider to receive the payout")
            say("the provider has the request; killing the executor with SIGKILL")
            executor.kill()
            with contextlib.suppress(aiohttp.ClientError, asyncio.CancelledError):
                await proposal
            await provider.set_mode("normal")
            say("restarting the executor; startup reconciliation runs before it listens")
            executor = ExecutorProcess(env, logs, "executor")
            await executor.start()
            resolutions = [
                e.get("resolution")
                for e in executor.stdout_events()
                if e.get("event") == "RECONCILIATION"
            ]
            count = await _count(provider)
            steps.append(
                Step(
                    "provider never answers; SIGKILL; restart",
                    "RECONCILED_COMPLETED, not sent again",
                    ", ".join(str(r) for r in resolutions) or "no reconciliation",
                    count,
                    ResolutionStatus.RECONCILED_COMPLETED in resolutions and count == 2,
                )
            )
        say(
            "starting the synthetic core bank (it will lie about the amount) and a banking executor"
        )
        steps.append(await _effect_mismatch_case(root, logs))
        _print_table(console, steps)
        if keep_serving:
            console.print(
                "\nThe executor is serving. Try it:\n"
                f"  curl -s -X POST {executor.url}/v1/actions "
                f"-H 'authorization: Bearer {workspace.caller_token}' "
                "-H 'content-type: application/json' "
                """-d '{"proposal":{"action":"create_payout","target":"payout:b-1","""
                """"parameters":{"amountMinor":1200,"currency":"EUR"}},"idempotency_key":"try-1"}'"""
                "\nPress Ctrl-C to stop.",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
    finally:
        if shadow is not None:
            shadow.terminate()
        executor.terminate()
        provider.terminate()
    return steps


_SEPA = {
    "type": "SEPA_CREDIT_TRANSFER",
    "amountMinor": 12500,
    "currency": "EUR",
    "debtor": "iban:DE89370400440532013000",
    "creditor": "iban:FR1420041010050500013M02606",
    "creditorName": "Synthetic Supplier SA",
}


async def _effect_mismatch_case(root: Path, logs: Path) -> Step:
    """Case 7: an observed effect that is not the authorised one halts the executor."""
    bank = ProviderProcess(
        logs,
        module="agentsafe.executor.tools.synthetic_bank",
        args=("--mode", "lie"),
        name="core-bank",
    )
    await bank.start()
    workspace = Workspace(root / "banking")
    env = workspace.environment(
        provider_url=bank.url,
        port=free_port(),
        policy_file=banking_policy(root / "banking-policy.json"),
        extra=banking_environment(bank.url),
    )
    executor = ExecutorProcess(env, logs, "banking-executor")
    try:
        await executor.start()
        headers = {"authorization": f"Bearer {executor.token}"}
        proposal = {
            "proposal": {
                "action": "credit_transfer_sepa",
                "target": _SEPA["creditor"],
                "parameters": _SEPA,
            },
            "idempotency_key": "sepa-1-v1",
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(
                executor.url + "/v1/actions", json=proposal, headers=headers
            ) as r:
                body = await r.json()

            async def halted() -> bool:
                async with session.get(executor.url + "/ready") as ready:
                    return ready.status == 503

            await wait_until(halted, timeout=10, what="the executor to halt")
            proposal["idempotency_key"] = "sepa-2-v1"
            async with session.post(
                executor.url + "/v1/actions", json=proposal, headers=headers
            ) as r:
                after = await r.json()
        count = int((await bank.received()).get("count", 0))
        effect = body.get("effect") or {}
        reasons = body.get("reason_codes") or []
        ok = (
            body.get("outcome") == "COMPLETED"
            and Code.EFFECT_MISMATCH in reasons
            and effect.get("differing_fields") == ["amountMinor"]
            and after.get("reason_codes") == [Code.EXECUTOR_HALTED]
            and count == 1
        )
        observed = (
            f"{body.get('outcome')} {','.join(reasons)} "
            f"differs={','.join(effect.get('differing_fields') or [])}; "
            f"then {','.join(after.get('reason_codes') or [])}"
        )
        return Step(
            "core bank books 10x the SEPA amount",
            "COMPLETED + EFFECT_MISMATCH, executor halts",
            observed,
            count,
            ok,
        )
    finally:
        executor.terminate()
        bank.terminate()


def _print_table(console: Console, steps: list[Step]) -> None:
    table = Table(title="agentsafe demo: one scripted agent, synthetic providers")
    table.add_column("case")
    table.add_column("expected")
    table.add_column("observed")
    table.add_column("provider requests", justify="right")
    table.add_column("", justify="center")
    for step in steps:
        mark = "[green]✓[/green]" if step.ok else "[red]✗[/red]"
        table.add_row(step.case, step.expected, step.observed, str(step.provider_requests), mark)
    if console.is_terminal:
        console.print(table)
        return
    # Piped or redirected: rich would assume 80 columns and fold every cell; a file or a pager
    # has no width, so the table gets the width its cells need.
    wide = console.options.update(max_width=_UNBOUNDED)
    console.width = max(console.width, Measurement.get(console, wide, table).maximum)
    console.print(table)


def _quiet(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM outside the demo's event loop: nothing left to stop, nothing said."""


async def _stoppable(root: Path, console: Console, keep_serving: bool) -> list[Step] | None:
    """Run the demo until a SIGINT or SIGTERM: the first cancels it at its next ``await`` (never
    inside a process spawn, which a raised KeyboardInterrupt could leave half done), so
    ``run_demo``'s clean-up stops every process it started; every later signal (a second
    Ctrl-C, or ``timeout``, which signals twice) is ignored while it does. ``None``: stopped."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopping = False

    def stop() -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop)
    try:
        steps = await run_demo(root, console=console, keep_serving=keep_serving)
    except asyncio.CancelledError:
        if not stopping:
            raise
        return None
    return None if stopping else steps


def main(*, keep_serving: bool = True, workdir: Path | None = None) -> int:
    console = Console()
    root = workdir or Path(tempfile.mkdtemp(prefix="agentsafe-demo-"))
    console.print(f"[bold]agentsafe demo[/bold] (working directory {root})")
    # SIGTERM stops the demo as Ctrl-C does (``_stoppable``); before and after the event loop a
    # signal is answered by a quiet handler, so no signal ever prints a traceback. They stay so:
    # the demo is the last thing ``agentsafe demo`` does, and a signal while it exits changes
    # nothing.
    signal.signal(signal.SIGTERM, _quiet)
    signal.signal(signal.SIGINT, _quiet)
    try:
        steps = asyncio.run(_stoppable(root, console, keep_serving))
    except (RuntimeError, TimeoutError, aiohttp.ClientError) as exc:
        # a process that stopped answering: say so and where its logs are, not a traceback
        console.print(f"[red]demo failed:[/red] {exc}; logs are in {root}/logs")
        return 1
    finally:
        # the event loop's close put the default handlers back
        signal.signal(signal.SIGTERM, _quiet)
        signal.signal(signal.SIGINT, _quiet)
    if steps is None:
        console.print("stopped.")
        return 0
    ok = all(step.ok for step in steps) and len(steps) == 7
    if ok and workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    elif not ok:
        console.print(f"[red]some cases did not behave as expected; logs are in {root}/logs[/red]")
    return 0 if ok else 1
