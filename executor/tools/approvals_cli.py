"""``agentsafe approvals list|approve|deny``: the person's command line for escalations.

It reads the executor's URL and the approver's credential from flags or the environment
(``AGENTSAFE_EXECUTOR_URL``, ``AGENTSAFE_APPROVER_TOKEN_FILE`` or ``AGENTSAFE_APPROVER_TOKEN``,
``AGENTSAFE_CA_FILE``, and for mTLS ``AGENTSAFE_CLIENT_CERT``/``AGENTSAFE_CLIENT_KEY``), shows
the intent it would release (action, target, parameters, proposer) and asks to confirm before it
decides anything. ``--yes`` skips the question for scripts.

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from .remote import CliError, Remote, refused

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "approvals",
        help="list and decide escalations as an APPROVER",
        description="List pending escalations you may decide, and approve or deny one. The "
        "intent is shown before anything is decided. Credentials come from flags or "
        "AGENTSAFE_APPROVER_TOKEN_FILE / AGENTSAFE_APPROVER_TOKEN; the executor from --url or "
        "AGENTSAFE_EXECUTOR_URL.",
    )
    parser.add_argument("--url", default=os.environ.get("AGENTSAFE_EXECUTOR_URL"))
    parser.add_argument(
        "--token-file",
        default=os.environ.get("AGENTSAFE_APPROVER_TOKEN_FILE"),
        help="file holding the approver's bearer token",
    )
    parser.add_argument("--ca-file", default=os.environ.get("AGENTSAFE_CA_FILE"))
    parser.add_argument("--cert", default=os.environ.get("AGENTSAFE_CLIENT_CERT"))
    parser.add_argument("--key", default=os.environ.get("AGENTSAFE_CLIENT_KEY"))
    parser.set_defaults(run=run)
    actions = parser.add_subparsers(dest="approvals_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="requests you may decide")
    listing.add_argument(
        "--state", default="PENDING", choices=["PENDING", "APPROVED", "DENIED", "EXPIRED"]
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(action=_run_list)
    for verb, decision in (("approve", "APPROVE"), ("deny", "DENY")):
        decide = actions.add_parser(verb, help=f"{verb} one request (shows it first)")
        decide.add_argument("request_id")
        decide.add_argument("--reason", required=True, help="why; recorded with the decision")
        decide.add_argument("--yes", action="store_true", help="do not ask to confirm")
        decide.set_defaults(action=_run_decide, decision=decision)


def _remote(args: argparse.Namespace) -> Remote:
    return Remote(
        url=args.url,
        token_file=args.token_file,
        token_variable="AGENTSAFE_APPROVER_TOKEN",
        ca_file=args.ca_file,
        cert=args.cert,
        key=args.key,
    )


async def _request(
    args: argparse.Namespace, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    return await _remote(args).request(method, path, body)


def _show(console: Console, item: dict[str, Any]) -> None:
    intent = item["intent"]
    console.print(f"[bold]request[/bold]    {item['request_id']}  ({item['state']})")
    console.print(f"[bold]action[/bold]     {intent['action']}")
    console.print(f"[bold]target[/bold]     {intent['target']}")
    console.print("[bold]parameters[/bold] " + json.dumps(intent["parameters"], sort_keys=True))
    proposer = item["proposer"]
    console.print(f"[bold]proposer[/bold]   {proposer['principal']} (actor {proposer['actor']})")
    console.print(f"[bold]intent[/bold]     {intent['intent_hash']}")
    console.print(f"[bold]expires[/bold]    {item['expires_at']}")


def _run_list(args: argparse.Namespace, console: Console) -> int:
    status, payload = asyncio.run(_request(args, "GET", f"/v1/approvals?state={args.state}"))
    if status != 200:
        raise refused(status, payload)
    items = payload["approvals"]
    if args.json:
        sys.stdout.write(json.dumps(items, indent=2) + "\n")
        return 0
    table = Table(title=f"{args.state.lower()} approval requests you may decide")
    for column in ("request", "action", "target", "parameters", "proposer", "expires"):
        table.add_column(column)
    for item in items:
        intent = item["intent"]
        table.add_row(
            item["request_id"],
            str(intent["action"]),
            str(intent["target"]),
            json.dumps(intent["parameters"], sort_keys=True),
            item["proposer"]["principal"],
            item["expires_at"],
        )
    console.print(table)
    return 0


def _run_decide(args: argparse.Namespace, console: Console) -> int:
    status, item = asyncio.run(_request(args, "GET", f"/v1/approvals/{args.request_id}"))
    if status != 200:
        raise refused(status, item)
    _show(console, item)
    if not args.yes:
        if not sys.stdin.isatty() and not sys.stdin.readable():
            raise CliError("cannot ask to confirm without a terminal: pass --yes")
        console.print(f"{args.decision} this request? [y/N] ", end="")
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            console.print("nothing decided.")
            return 1
    status, decided = asyncio.run(
        _request(
            args,
            "POST",
            f"/v1/approvals/{args.request_id}",
            {"decision": args.decision, "reason": args.reason},
        )
    )
    if status != 200:
        raise refused(status, decided)
    console.print(f"[green]{decided['state']}[/green] by {decided['decided_by']}")
    return 0


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        code: int = args.action(args, console)
        return code
    except CliError as exc:
        Console(stderr=True).print(f"[red]agentsafe approvals:[/red] {exc}")
        return 2
