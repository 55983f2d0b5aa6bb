"""Notifying a webhook of a pending escalation, through the egress guard, Slack-compatible.

With ``EXECUTOR_APPROVAL_WEBHOOK_URL`` every new approval request is POSTed once, as JSON that a
Slack (or Mattermost, or Teams workflow) incoming webhook accepts: ``text`` (the fallback line)
and ``blocks`` (one ``section`` in ``mrkdwn``). The message names the request, the action, the
amount at its currency's scale, the rule that escalated, the intent hash, the approvers, the
expiry and the ``approval_url``. Agent-controlled text (the action, the target) is shown inert
(:mod:`~agentsafe.executor.display`) and with ``&``, ``<`` and ``>`` escaped as Slack requires, so
it cannot become a link, a mention or formatting. The parameters themselves are not sent.

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
from typing import Any, Final

from ..clock import format_ms
from ..codes import Code
from ..display import amount_text, inert_value
from ..errors import AgentSafeError
from ..events import Streams
from ..state.usestore import ApprovalRequest
from .transport import Transport

__all__ = ["TIMEOUT_SECONDS", "ApprovalWebhook", "slack_message"]

log = logging.getLogger(__name__)

TIMEOUT_SECONDS: Final = 10.0


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(request: ApprovalRequest, approval_url: str) -> dict[str, Any]:
    """The Slack-compatible body for one pending request."""
    action = request.intent.get("action") or {}
    parameters = action.get("parameters")
    amount = amount_text(parameters) if isinstance(parameters, dict) else None
    lines = [
        f"*Approval needed*: {_slack_escape(inert_value(action.get('type')))}"
        + (f" for {_slack_escape(amount)}" if amount else ""),
        f"*Target*: {_slack_escape(inert_value(action.get('resource')))}",
        f"*Rule*: {_slack_escape(str(request.rule))}  *Reason*: "
        + _slack_escape(", ".join(request.reason_codes)),
        f"*Verification*: {request.verification.value}",
        f"*Approvers*: {_slack_escape(', '.join(request.approvers))}",
        f"*Request*: `{request.request_id}`  *Intent*: `{request.intent_hash}`",
        f"*Expires*: {format_ms(request.expires_at)}",
        f"*Decide*: {_slack_escape(approval_url)}",
    ]
    fallback = (
        f"Approval needed: request {request.request_id} ({inert_value(action.get('type'))}),"
        f" decide at {approval_url}"
    )
    return {
        "text": _slack_escape(fallback),
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}],
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
