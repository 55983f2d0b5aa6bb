"""``agentsafe approvals list|show|approve|deny`` and ``agentsafe approvers enrol|cancel``.

``approvals`` is the person's command line for escalations. It reads the executor's URL and the
approver's credential from flags or the environment (``AGENTSAFE_EXECUTOR_URL``,
``AGENTSAFE_APPROVER_TOKEN_FILE`` or ``AGENTSAFE_APPROVER_TOKEN``, ``AGENTSAFE_CA_FILE``, and for
mTLS ``AGENTSAFE_CLIENT_CERT``/``AGENTSAFE_CLIENT_KEY``), shows the exact intent it would release
and asks to confirm before it decides anything. ``--yes`` skips the question for scripts.

Everything the agent wrote is printed inert (:mod:`~agentsafe.executor.display`): as JSON, with
every character that would not print as itself escaped, and through ``rich`` with markup and
highlighting off, so ``[conceal]…[/conceal]`` or an ANSI escape in a target shows literally
instead of hiding text from the person deciding. Look-alikes, mixed scripts and invisible
characters are escaped and named on ``warning`` lines (``show``) and under the table (``list``);
the table folds every cell, so a long target is shown whole, tail included (issue 30). A
request whose rule or approver requires a passkey cannot be decided here (403
APPROVAL_VERIFICATION_REQUIRED): the command prints its ``approval_url``.

``approvers`` is the OPERATOR's (scope ``approvers``; ``AGENTSAFE_OPERATOR_TOKEN_FILE`` or
``AGENTSAFE_OPERATOR_TOKEN``): ``enrol PRINCIPAL_ID`` issues a one-time passkey enrolment token
and prints the enrolment link to hand to that person; ``cancel REQUEST_ID --reason`` cancels a
pending escalation. ``-o json`` prints the executor's JSON answer.

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..codes import Code
from ..display import amount_text, field_warnings, inert, inert_json, inert_value

__all__ = ["add_approvers_parser", "add_parser", "render_request"]


class CliError(Exception):
    pass


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
        "--state",
        default="PENDING",
        choices=["PENDING", "APPROVED", "DENIED", "EXPIRED", "CANCELLED"],
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(action=_run_list)
    show = actions.add_parser("show", help="one request, its exact intent shown inert")
    show.add_argument("request_id")
    show.add_argument("-o", "--output", choices=["text", "json"], default="text")
    show.set_defaults(action=_run_show)
    for verb, decision in (("approve", "APPROVE"), ("deny", "DENY")):
        decide = actions.add_parser(verb, help=f"{verb} one request (shows it first)")
        decide.add_argument("request_id")
        decide.add_argument("--reason", required=True, help="why; recorded with the decision")
        decide.add_argument("--yes", action="store_true", help="do not ask to confirm")
        decide.set_defaults(action=_run_decide, decision=decision)


def add_approvers_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "approvers",
        help="as an OPERATOR: passkey enrolment tokens for approvers, cancel escalations",
        description="Issue a one-time passkey enrolment token for an APPROVER principal (hand "
        "the printed link to that person; it works once and expires), or cancel a pending "
        "escalation. Needs an OPERATOR credential with the 'approvers' scope: --token-file or "
        "AGENTSAFE_OPERATOR_TOKEN_FILE / AGENTSAFE_OPERATOR_TOKEN; the executor from --url or "
        "AGENTSAFE_EXECUTOR_URL.",
    )
    parser.add_argument("--url", default=os.environ.get("AGENTSAFE_EXECUTOR_URL"))
    parser.add_argument(
        "--token-file",
        default=os.environ.get("AGENTSAFE_OPERATOR_TOKEN_FILE"),
        help="file holding the operator's bearer token",
    )
    parser.add_argument("--ca-file", default=os.environ.get("AGENTSAFE_CA_FILE"))
    parser.add_argument("--cert", default=os.environ.get("AGENTSAFE_CLIENT_CERT"))
    parser.add_argument("--key", default=os.environ.get("AGENTSAFE_CLIENT_KEY"))
    parser.set_defaults(run=run, token_variable="AGENTSAFE_OPERATOR_TOKEN")
    actions = parser.add_subparsers(dest="approvers_command", metavar="ACTION", required=True)
    enrol = actions.add_parser("enrol", help="a one-time passkey enrolment link for an APPROVER")
    enrol.add_argument("principal_id", help="the APPROVER principal's id (principals file)")
    enrol.add_argument(
        "--ttl-seconds", type=int, default=None, help="lifetime (60..604800; default 900)"
    )
    enrol.add_argument("-o", "--output", choices=["text", "json"], default="text")
    enrol.set_defaults(action=_run_enrol)
    cancel = actions.add_parser("cancel", help="cancel a pending escalation")
    cancel.add_argument("request_id")
    cancel.add_argument("--reason", required=True, help="why; recorded with the cancellation")
    cancel.add_argument("-o", "--output", choices=["text", "json"], default="text")
    cancel.set_defaults(action=_run_cancel)


def _token(args: argparse.Namespace) -> str:
    variable = getattr(args, "token_variable", "AGENTSAFE_APPROVER_TOKEN")
    if args.token_file:
        try:
            return Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError:
            raise CliError(f"cannot read the token file {args.token_file}") from None
    token = os.environ.get(variable)
    if not token:
        raise CliError(f"no credential: pass --token-file or set {variable}(_FILE)")
    return token


def _ssl(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not str(args.url).startswith("https://"):
        return None
    context = ssl.create_default_context(cafile=args.ca_file)
    if args.cert:
        context.load_cert_chain(args.cert, args.key)
    return context


async def _request(
    args: argparse.Namespace, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    import aiohttp  # the server's client library, only when a request is made

    if not args.url:
        raise CliError("no executor: pass --url or set AGENTSAFE_EXECUTOR_URL")
    headers = {"authorization": f"Bearer {_token(args)}"}
    connector = aiohttp.TCPConnector(ssl=_ssl(args) or False)
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.request(
                method, str(args.url).rstrip("/") + path, json=body, headers=headers
            ) as response,
        ):
            return response.status, await response.json(content_type=None)
    except aiohttp.ClientError as exc:
        raise CliError(f"cannot reach the executor: {type(exc).__name__}") from None


def _refused(status: int, payload: Any) -> CliError:
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    return CliError(
        inert(f"refused ({status} {error.get('code', '?')}): {error.get('message', '')}")
    )


def render_request(item: dict[str, Any]) -> list[Text]:
    """The lines a person reads before deciding, every agent-written value inert. The labels
    are the only styled text; values are plain :class:`~rich.text.Text`, never markup."""
    intent = item.get("intent") or {}
    parameters = intent.get("parameters")
    amount = amount_text(parameters) if isinstance(parameters, dict) else None
    verification = item.get("verification") or {}
    rows = [
        ("request", inert(f"{item.get('request_id')} ({item.get('state')})")),
        ("action", inert_value(intent.get("action"))),
        ("target", inert_value(intent.get("target"))),
        ("amount", amount or "(no amountMinor/currency)"),
        ("parameters", inert_value(parameters)),
        ("proposer", inert_value(item.get("proposer"))),
        ("rule", inert_value(item.get("rule"))),
        ("reason", inert_value(item.get("reason_codes"))),
        ("intent hash", inert(str(intent.get("intent_hash")))),
        ("expires", inert(str(item.get("expires_at")))),
        ("verification", inert(str(verification.get("required", "CREDENTIAL")))),
        ("decide at", inert(str(item.get("approval_url")))),
    ]
    lines = []
    for label, value in rows:
        line = Text(f"{label:<13}", style="bold")
        line.append(value)
        lines.append(line)
    for warning in _warnings(item):
        line = Text(f"{'warning':<13}", style="bold red")
        line.append("\u26a0 " + warning)
        lines.append(line)
    raw = intent.get("binding")
    if isinstance(raw, dict):
        lines.append(Text("exact intent", style="bold"))
        lines.append(Text(inert_json(raw)))
    return lines


def _warnings(item: dict[str, Any]) -> list[str]:
    """Look-alikes, mixed scripts and invisible characters in what the agent wrote, named
    (computed here from the intent, so an older executor's answer is checked too)."""
    intent = item.get("intent") or {}
    return field_warnings(
        {
            "action": intent.get("action"),
            "target": intent.get("target"),
            "parameters": intent.get("parameters"),
            "proposer": item.get("proposer"),
        }
    )


def _print(console: Console, text: Text | str) -> None:
    console.print(text, markup=False, highlight=False, emoji=False)


def _show(console: Console, item: dict[str, Any]) -> None:
    for line in render_request(item):
        _print(console, line)


def _run_list(args: argparse.Namespace, console: Console) -> int:
    status, payload = asyncio.run(_request(args, "GET", f"/v1/approvals?state={args.state}"))
    if status != 200:
        raise _refused(status, payload)
    items = payload["approvals"]
    if args.json:
        sys.stdout.write(json.dumps(items, indent=2) + "\n")
        return 0
    table = Table(title=f"{args.state.lower()} approval requests you may decide", highlight=False)
    # Every cell folds onto as many lines as it needs: nothing is cut with "…", least of all
    # the tail of a target, where an attacker's account would sit (issue 30).
    for column in ("request", "action", "target", "amount", "proposer", "expires"):
        table.add_column(column, overflow="fold", no_wrap=False)
    warned: list[Text] = []
    for item in items:
        for warning in _warnings(item):
            line = Text("\u26a0 ", style="bold red")
            line.append(inert(str(item["request_id"])) + " " + warning)
            warned.append(line)
        intent = item["intent"]
        parameters = intent.get("parameters")
        amount = amount_text(parameters) if isinstance(parameters, dict) else None
        table.add_row(
            Text(inert(str(item["request_id"]))),
            Text(inert_value(intent.get("action"))),
            Text(inert_value(intent.get("target"))),
            Text(amount or inert_value(parameters)),
            Text(inert_value(item["proposer"]["principal"])),
            Text(inert(str(item["expires_at"]))),
        )
    console.print(table)
    for line in warned:
        _print(console, line)
    return 0


def _run_show(args: argparse.Namespace, console: Console) -> int:
    status, item = asyncio.run(_request(args, "GET", f"/v1/approvals/{args.request_id}"))
    if status != 200:
        raise _refused(status, item)
    if args.output == "json":
        sys.stdout.write(json.dumps(item, indent=2) + "\n")
        return 0
    _show(console, item)
    return 0


def _run_enrol(args: argparse.Namespace, console: Console) -> int:
    body: dict[str, Any] = {}
    if args.ttl_seconds is not None:
        body["ttl_seconds"] = args.ttl_seconds
    path = f"/v1/control/approvers/{args.principal_id}/enrolment-tokens"
    status, issued = asyncio.run(_request(args, "POST", path, body))
    if status != 201:
        raise _refused(status, issued)
    if args.output == "json":
        sys.stdout.write(json.dumps(issued, indent=2) + "\n")
        return 0
    until = issued["expires_at"]
    _print(console, f"enrolment link for {issued['principal']} (works once, until {until}):")
    _print(console, str(issued["enrolment_url"]))
    _print(console, "hand it to that person only; they sign in with their own credential.")
    return 0


def _run_cancel(args: argparse.Namespace, console: Console) -> int:
    path = f"/v1/control/approvals/{args.request_id}/cancel"
    status, cancelled = asyncio.run(_request(args, "POST", path, {"reason": args.reason}))
    if status != 200:
        raise _refused(status, cancelled)
    if args.output == "json":
        sys.stdout.write(json.dumps(cancelled, indent=2) + "\n")
        return 0
    _print(console, f"{cancelled['request_id']} CANCELLED by {cancelled['cancelled_by']}")
    return 0


def _run_decide(args: argparse.Namespace, console: Console) -> int:
    status, item = asyncio.run(_request(args, "GET", f"/v1/approvals/{args.request_id}"))
    if status != 200:
        raise _refused(status, item)
    _show(console, item)
    if not args.yes:
        if not sys.stdin.isatty() and not sys.stdin.readable():
            raise CliError("cannot ask to confirm without a terminal: pass --yes")
        console.print(f"{args.decision} this request? [y/N] ", end="", markup=False)
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
        error = decided.get("error", {}) if isinstance(decided, dict) else {}
        if error.get("code") == Code.APPROVAL_VERIFICATION_REQUIRED:
            raise CliError(
                "this request needs a passkey: decide it on the approval page, "
                + inert(str(item.get("approval_url")))
            )
        raise _refused(status, decided)
    _print(console, Text(f"{decided['state']} by {decided['decided_by']}", style="green"))
    return 0


def run(args: argparse.Namespace) -> int:
    console = Console()
    try:
        code: int = args.action(args, console)
        return code
    except CliError as exc:
        line = Text("agentsafe: ", style="red")
        line.append(str(exc))
        Console(stderr=True).print(line, markup=False, highlight=False)
        return 2
