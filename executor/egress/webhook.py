"""Notifying a webhook of a pending escalation, through the egress guard, Slack-compatible.

With ``EXECUTOR_APPROVAL_WEBHOOK_URL`` every new approval request is POSTed once, as JSON that a
Slack (or Mattermost, or Teams workflow) incoming webhook accepts: ``text`` (the fallback line,
which holds no agent text) and ``blocks``. The message names the request, the action, the amount
at its currency's scale, the rule that escalated, the intent hash, the approvers, the expiry and
the ``approval_url``. The parameters themselves are not sent.

Agent-controlled text (the action, the target, the amount's currency) is kept apart from the
executor's own, so that it can make no link, mention, emoji or formatting (Slack's "Formatting
text for app surfaces"; issue 30):

- the executor's own lines (labels, rule, reason codes, approvers, ids, expiry, the link to the
  page) are one ``mrkdwn`` section with ``verbatim: true``, so Slack neither auto-links nor
  parses mentions or channel names in it;
- agent text goes only into ``plain_text`` sections with ``emoji: false`` (never formatted), shown
  inert (:mod:`~agentsafe.executor.display`: JSON-quoted, invisible characters and look-alikes
  escaped, warnings named) and then *defanged* (:func:`defang`), the convention of security
  notices: ``&``, ``<`` and ``>`` are escaped as Slack requires, ``://`` is written ``[:]//``, a
  ``.`` between two word characters ``[.]``, and every ``@``, ``#`` and ``!`` as ``[@]``, ``[#]``
  and ``[!]``, so no client can make a URL, a bare domain, a user, channel or ``!here`` mention
  of it even where it would parse plain text. The page and ``agentsafe approvals`` show the text
  exactly; the notification only points there;
- a text longer than Slack's section limit is shown as head and tail with the number of
  characters left out between them, never cut at the end;
- ``unfurl_links`` and ``unfurl_media`` are false.

The request goes through the one guarded client (``egress/guard.py``): the webhook's origin and
path are a destination of their own, with ``EXECUTOR_APPROVAL_WEBHOOK_CA_FILE`` as its trust anchor.
Notification never holds up the proposer's answer: it runs as a task after the request is stored,
bounded by :data:`TIMEOUT_SECONDS`; a failure is one ``APPROVAL_NOTIFY_FAILED`` line on the
security stream with the request id, the code (the guard's or APPROVAL_NOTIFY_FAILED) and the
webhook's status when it answered (the request itself stays pending and visible in
the page, the API and ``agentsafe approvals``). A success is ``APPROVAL_NOTIFIED`` on the evidence
stream.

Callers: ``assembly.py`` (builds it, hands :meth:`ApprovalWebhook.notify` to the pipeline),
``plane.py`` (closes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any, Final

from ..clock import format_ms
from ..codes import Code
from ..display import amount_text, field_warnings, inert_value
from ..errors import AgentSafeError
from ..events import Streams
from ..state.records import ApprovalRequest
from .transport import Transport

__all__ = ["TIMEOUT_SECONDS", "ApprovalWebhook", "defang", "slack_message"]

log = logging.getLogger(__name__)

TIMEOUT_SECONDS: Final = 10.0
SECTION_LIMIT: Final = 2900
"""Characters of agent text in one section (Slack refuses a section text above 3000)."""

_DOT = re.compile(r"(?<=\w)\.(?=\w)")
_SIGILS = re.compile(r"[@#!]")


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def defang(text: str) -> str:
    """Agent text as no Slack client can turn into a link, a mention or a channel name."""
    text = text.replace("://", "[:]//")
    text = _DOT.sub("[.]", text)
    text = _SIGILS.sub(lambda m: f"[{m.group()}]", text)
    return _slack_escape(text)


_UNIT = re.compile(r"&amp;|&lt;|&gt;|\[:\]//|\[\.\]|\[[@#!]\]|.", re.DOTALL)
"""What :func:`defang` writes, in pieces a cut must not split."""


def _clip(text: str, limit: int = SECTION_LIMIT) -> str:
    """Defanged ``text`` within ``limit``: head and tail kept whole, never a split escape, and the
    number of characters left out said between them."""
    if len(text) <= limit:
        return text
    units = _UNIT.findall(text)
    budget = (limit - 80) // 2
    head: list[str] = []
    tail: list[str] = []
    for unit in units:
        if sum(map(len, head)) + len(unit) > budget:
            break
        head.append(unit)
    for unit in reversed(units[len(head) :]):
        if sum(map(len, tail)) + len(unit) > budget:
            break
        tail.append(unit)
    hidden = sum(map(len, units[len(head) : len(units) - len(tail)]))
    return (
        "".join(head)
        + f" [… {hidden} characters not shown here: the page shows them …] "
        + "".join(reversed(tail))
    )


def _plain(label: str, agent_text: str, *, digits: bool = False) -> dict[str, Any]:
    """One ``plain_text`` section; ``digits`` for :func:`~agentsafe.executor.display.amount_text`
    (digits, ``,`` and ``.`` and three capital letters: it can spell neither a link nor a
    mention, so its decimal point stays a point)."""
    shown = _slack_escape(agent_text) if digits else defang(agent_text)
    text = f"{label}: " + _clip(shown, SECTION_LIMIT - len(label) - 2)
    return {"type": "section", "text": {"type": "plain_text", "emoji": False, "text": text}}


def slack_message(request: ApprovalRequest, approval_url: str) -> dict[str, Any]:
    """The Slack-compatible body for one pending request."""
    action = request.intent.get("action") or {}
    parameters = action.get("parameters")
    amount = amount_text(parameters) if isinstance(parameters, dict) else None
    link = (
        f"<{_slack_escape(approval_url)}|open the approval page>"
        if approval_url.startswith("https://")
        else f"`{_slack_escape(approval_url)}`"
    )
    own = [
        "*Approval needed*",
        f"*Rule*: {_slack_escape(str(request.rule))}  *Reason*: "
        + _slack_escape(", ".join(request.reason_codes)),
        f"*Verification*: {request.verification.value}",
        f"*Approvers*: {_slack_escape(', '.join(request.approvers))}",
        f"*Request*: `{request.request_id}`  *Intent*: `{request.intent_hash}`",
        f"*Expires*: {format_ms(request.expires_at)}",
        f"*Decide*: {link}",
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "verbatim": True, "text": "\n".join(own)}},
        _plain("Action", inert_value(action.get("type"))),
        _plain("Target", inert_value(action.get("resource"))),
    ]
    if amount:
        blocks.append(_plain("Amount", amount, digits=True))
    warnings = field_warnings({"action": action.get("type"), "target": action.get("resource")})
    if warnings:
        blocks.append(_plain("\u26a0 Look closely", "; ".join(warnings)))
    fallback = f"Approval needed: request {request.request_id}, decide at {approval_url}"
    return {
        "text": _slack_escape(fallback),
        "unfurl_links": False,
        "unfurl_media": False,
        "blocks": blocks,
    }


class ApprovalWebhook:
    """Posts :func:`slack_message` for every new approval request; see the module docstring."""

    def __init__(self, *, url: str, transport: Transport, streams: Streams) -> None:
        self._url = url
        self._transport = transport
        self._streams = streams
        self._tasks: set[asyncio.Task[None]] = set()

    def notify(self, request: ApprovalRequest, approval_url: str) -> None:
        """Schedule one notification (the caller is answered without waiting for it)."""
        task = asyncio.get_running_loop().create_task(self._send(request, approval_url))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, request: ApprovalRequest, approval_url: str) -> None:
        body = json.dumps(slack_message(request, approval_url), ensure_ascii=False).encode()
        code: str | None = None
        status: int | None = None
        try:
            response = await self._transport.request(
                "POST",
                self._url,
                headers={"content-type": "application/json"},
                body=body,
                timeout=TIMEOUT_SECONDS,
            )
            if not 200 <= response.status < 300:
                code, status = Code.APPROVAL_NOTIFY_FAILED, response.status
        except AgentSafeError as exc:
            code = str(exc.code)
        except Exception:  # a notification must never take the executor down
            log.exception("the approval webhook failed")
            code = Code.APPROVAL_NOTIFY_FAILED
        if code is None:
            self._streams.evidence.emit("APPROVAL_NOTIFIED", {"request_id": request.request_id})
        else:
            fields: dict[str, Any] = {"request_id": request.request_id, "code": code}
            if status is not None:
                fields["status"] = status
            self._streams.security.emit("APPROVAL_NOTIFY_FAILED", fields)

    async def aclose(self, timeout: float = TIMEOUT_SECONDS) -> None:
        """Let notifications in flight finish (bounded), then cancel what is left."""
        if not self._tasks:
            return
        pending = set(self._tasks)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout)
        for task in pending:
            task.cancel()
