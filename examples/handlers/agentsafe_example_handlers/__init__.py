"""An adopter's own handlers for agentsafe, registered through the seam (docs/handlers.md).

``register(seam)`` is the registration function the ``agentsafe.handlers`` entry point names. It
registers:

* the action handler ``post_ledger_note``: the verified ``{"account", "note"}`` parameters are
  POSTed as JSON to the configured downstream through ``seam.fetch`` (the guarded client), with
  the credential's headers asked for at the moment of dispatch, inside ``dispatch.run``. A 2xx is
  the result; a 4xx with a body is a deterministic refusal; anything else is left unknown for
  reconciliation, which only reads ``seam.downstream.lookup_url``;
* the plan step executor for tool ``query`` with effect ``read``: it answers one synthetic row
  with the approved fields (a real deployment would read its own system here).

It returns the action names in the order it registered them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from agentsafe.executor.handlers import (
    Dispatch,
    ExecutionContext,
    ProviderRefused,
    ReconcileResult,
    ReconcileStatus,
    Seam,
    StepRequest,
    StepResult,
)

__all__ = ["LedgerNoteHandler", "SyntheticQueryExecutor", "register"]

NOTE_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["account", "note"],
    "additionalProperties": False,
    "properties": {
        "account": {"type": "string", "pattern": "^[A-Z0-9-]{4,34}$"},
        "note": {"type": "string", "minLength": 1, "maxLength": 280},
    },
}


class LedgerNoteHandler:
    """POST one note to the downstream; reconcile by idempotency key, read-only."""

    parameters_schema = NOTE_SCHEMA
    description = "Append a note to a ledger account (adds, never changes or removes)."
    destructive = False  # additive: GET /v1/actions (and agentsafe mcp) say so

    def __init__(self, seam: Seam) -> None:
        self._seam = seam

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        seam = self._seam
        url = seam.downstream.url
        body = json.dumps({"kind": "ledger_note", **dict(ctx.parameters)}).encode()
        headers = {
            "content-type": "application/json",
            "idempotency-key": ctx.idempotency_key,
            "x-agent-safe-intent-hash": ctx.intent.intent_hash,
            "x-agent-safe-dossier-id": ctx.authorization.dossier_id,
            "x-agent-safe-grant-id": ctx.authorization.grant_id,
        }
        if seam.credential is not None:
            extra = await seam.credential.headers_for(
                method="POST",
                url=url,
                body=body,
                idempotency_key=ctx.idempotency_key,
                intent_hash=ctx.intent.intent_hash,
                grant_id=ctx.authorization.grant_id,
                decision_id=ctx.authorization.decision_id,
            )
            headers.update({k.lower(): v for k, v in extra.items()})

        async def send(key: str) -> Any:
            timeout = min(seam.downstream.timeout_ms / 1000, ctx.remaining())
            return await seam.fetch.request(
                "POST", url, headers={**headers, "idempotency-key": key}, body=body, timeout=timeout
            )

        response = await dispatch.run(send)
        if 200 <= response.status < 300:
            observation = {"status": response.status, "account": ctx.parameters["account"]}
            digest = seam.effects.record(ctx, observation)
            return {"status": response.status, "accepted": True, "observation": digest}
        if 400 <= response.status < 500 and response.body.strip():
            raise ProviderRefused(f"LEDGER_REFUSED_{response.status}", status=response.status)
        raise RuntimeError("the ledger's answer does not say what happened")

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        lookup = self._seam.downstream.lookup_url
        if lookup is None:
            return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code="LOOKUP_NOT_CONFIGURED")
        url = lookup.replace("{idempotency_key}", quote(idempotency_key, safe=""))
        headers = {"idempotency-key": idempotency_key, "x-agent-safe-intent-hash": intent_hash}
        response = await self._seam.fetch.request(
            "GET", url, headers=headers, body=None, timeout=5.0
        )
        if response.status == 404:
            return ReconcileResult(ReconcileStatus.NOT_EXECUTED)
        if 200 <= response.status < 300:
            return ReconcileResult(ReconcileStatus.COMPLETED)
        return ReconcileResult(ReconcileStatus.UNKNOWN, reason_code="LOOKUP_UNKNOWN")


class SyntheticQueryExecutor:
    """The plan step executor for ``query``/``read``: one synthetic row of the approved fields."""

    tool = "query"
    effect = "read"

    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, request: StepRequest) -> StepResult:
        self.calls += 1
        row = {name: f"synthetic-{name}" for name in request.fields}
        return StepResult(value=[row], rows=1)


def register(seam: Seam) -> list[str]:
    seam.registry.register("post_ledger_note", LedgerNoteHandler(seam))
    seam.plans.register(SyntheticQueryExecutor())
    return ["post_ledger_note"]
