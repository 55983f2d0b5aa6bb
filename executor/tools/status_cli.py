"""``agentsafe status``: ask a running executor what it is doing, as an OPERATOR.

It calls ``GET /v1/control/status`` with an OPERATOR credential that carries the ``status``
scope (a bearer token from ``--token-file`` or ``AGENTSAFE_OPERATOR_TOKEN(_FILE)``, or a client
certificate for an mTLS principal) and prints the mode, the halt and its causes, readiness (ready
or not, and its code), the open attempts, the chain heads and the posture; in shadow it ends
with the shadow report by action and the switch that turns enforcement on
(``lifecycle/shadow.py`` renders it from the route's own JSON, so the terminal and ``-o json``
say the same thing). ``-o json`` prints the route's JSON unchanged.

The executor's URL is ``--url`` or ``AGENTSAFE_EXECUTOR_URL``. Exit statuses: 0 the executor
answered, 1 it answered but is halted, 2 it could not be asked (the message says why).

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from ..lifecycle.shadow import render_report
from .remote import CliError, Remote, refused

__all__ = ["add_parser", "render_status"]

TOKEN_VARIABLE = "AGENTSAFE_OPERATOR_TOKEN"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "status",
        help="ask a running executor for its mode, halt, open attempts and shadow report",
        description="Ask a running executor, through GET /v1/control/status with an OPERATOR "
        "credential that has the 'status' scope, for its mode, halt, open attempts and chain "
        "heads; in shadow, its shadow report by action and the switch that turns enforcement "
        "on. The credential: --token-file, AGENTSAFE_OPERATOR_TOKEN_FILE or "
        "AGENTSAFE_OPERATOR_TOKEN, or --cert/--key for an mTLS operator.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("AGENTSAFE_EXECUTOR_URL"),
        help="the executor's base URL (default: AGENTSAFE_EXECUTOR_URL)",
    )
    parser.add_argument(
        "--token-file",
        default=os.environ.get(TOKEN_VARIABLE + "_FILE"),
        help="file holding the operator's bearer token",
    )
    parser.add_argument("--ca-file", default=os.environ.get("AGENTSAFE_CA_FILE"))
    parser.add_argument("--cert", default=os.environ.get("AGENTSAFE_CLIENT_CERT"))
    parser.add_argument("--key", default=os.environ.get("AGENTSAFE_CLIENT_KEY"))
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.set_defaults(run=run)


def _heads(heads: Mapping[str, Any] | None) -> list[str]:
    if not heads:
        return ["chain heads   (this process writes no chained streams)"]
    out = []
    for name, head in heads.items():
        if head is None:
            out.append(f"chain head    {name}: (no line yet)")
        else:
            out.append(f"chain head    {name}: seq {head['seq']} {head['hash']}")
    return out


def render_status(status: Mapping[str, Any], url: str) -> str:
    """The status route's JSON as the lines a person reads, ending with the shadow report."""
    halt = status.get("halt", {})
    lines = [f"executor      {url}", f"mode          {status.get('mode')}"]
    if halt.get("halted"):
        causes = ", ".join(str(c.get("cause", "?")) for c in halt.get("causes", []))
        lines.append(f"halt          HALTED ({causes}); resume with POST /v1/control/resume")
    else:
        lines.append("halt          not halted")
    readiness = status.get("readiness")
    if readiness:  # what anonymous /ready only answers as ready and one code (issue 22)
        answer = "yes" if readiness.get("ready") else "no"
        lines.append(f"ready         {answer} ({readiness.get('code')})")
    attempts = status.get("open_attempts", [])
    lines.append(f"open attempts {len(attempts)}")
    for attempt in attempts:
        lines.append(
            f"  {attempt.get('attempt_id')} {attempt.get('action')} {attempt.get('state')} "
            f"(the proposer reconciles it: POST /v1/reconciliations)"
        )
    lines.extend(_heads(status.get("chain_heads")))
    posture = status.get("posture", {})
    lines.append(
        f"posture       {posture.get('mode')} ({'held' if posture.get('held') else 'NOT held'})"
    )
    lines.append(f"actions       {', '.join(status.get('actions', []))}")
    lines.append("")
    report = status.get("shadow_report")
    if report is not None:
        lines.append(render_report(report).rstrip("\n"))
    else:
        lines.append("Enforcing: EXECUTOR_MODE=ENFORCEMENT (no shadow report).")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    remote = Remote(
        url=args.url,
        token_file=args.token_file,
        token_variable=TOKEN_VARIABLE,
        ca_file=args.ca_file,
        cert=args.cert,
        key=args.key,
    )
    try:
        status, payload = asyncio.run(remote.request("GET", "/v1/control/status"))
        if status != 200:
            raise refused(status, payload)
    except CliError as exc:
        sys.stderr.write(f"agentsafe status: {exc}\n")
        return 2
    if args.output == "json":
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_status(payload, str(args.url)))
    return 1 if payload.get("halt", {}).get("halted") else 0
