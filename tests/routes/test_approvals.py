"""The approval routes refuse separation-of-duties violations with the one shared check.

``POST /v1/approvals/{request_id}`` calls :func:`~agentsafe.executor.intent.check_separation`:
an approver whose id or actor is the proposer's principal or actor never decides (422). The
route used to compare only id with principal and actor with actor, so an approver whose id was
the proposer's actor id could approve its own intent. The rows run behind a door stand-in that
answers with the approver each test names; the use store is the real SQLite one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.events import Streams
from agentsafe.executor.principals import Actor, Principal, Role, Scope, Verification
from agentsafe.executor.routes.app import build_app
from agentsafe.executor.routes.approvals import approval_routes
from agentsafe.executor.state.records import ApprovalRequest
from agentsafe.executor.state.usestore import SQLiteUseStore
from tests.support.intents import PAYOUT_PRINCIPAL, make_intent

PROPOSER_ACTOR = "agent-1"  # the actor make_intent's payout principal carries


class NamedDoor:
    """Answers every request with ``self.approver`` (the door itself is tested elsewhere)."""

    approver = Principal(id="treasury-lead", role=Role.APPROVER)

    async def authenticate(
        self, request: web.Request, *, role: Role, scope: Scope | None
    ) -> Principal:
        assert (role, scope) == (Role.APPROVER, None)
        return self.approver


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, NamedDoor, str]]:
    clock = ManualClock()
    store = await SQLiteUseStore.open(tmp_path, clock=clock)
    intent = make_intent(now=clock.now())
    request_id = str(uuid.uuid4())
    await store.approval_create(
        ApprovalRequest(
            request_id=request_id,
            intent=dict(intent.binding),
            intent_hash=intent.intent_hash,
            approvers=("treasury-lead", PROPOSER_ACTOR, "risk-officer"),
            proposer_principal=PAYOUT_PRINCIPAL.id,
            proposer_actor=PROPOSER_ACTOR,
            expires_at=intent.expires_at,
            created_at=clock.now(),
        )
    )
    door = NamedDoor()
    app = build_app(approval_routes(store=store, streams=Streams.memory(), clock=clock), door=door)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), door, request_id
    finally:
        await server.close()
        await store.close()


async def decide(url: str, request_id: str) -> tuple[int, Any]:
    body = {"decision": "APPROVE", "reason": "checked the beneficiary"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/approvals/{request_id}", json=body) as response,
    ):
        return response.status, await response.json()


async def test_an_approver_whose_id_is_the_proposers_actor_is_refused(
    served: tuple[str, NamedDoor, str],
) -> None:
    url, door, request_id = served
    door.approver = Principal(id=PROPOSER_ACTOR, role=Role.APPROVER)
    status, body = await decide(url, request_id)
    assert (status, body["error"]["code"]) == (422, "SEPARATION_OF_DUTIES_VIOLATED")


async def test_an_approver_whose_actor_is_the_proposing_principal_is_refused(
    served: tuple[str, NamedDoor, str],
) -> None:
    url, door, request_id = served
    door.approver = Principal(
        id="risk-officer", role=Role.APPROVER, actor=Actor(PAYOUT_PRINCIPAL.id, "human")
    )
    status, body = await decide(url, request_id)
    assert (status, body["error"]["code"]) == (422, "SEPARATION_OF_DUTIES_VIOLATED")


async def test_another_person_decides_once(served: tuple[str, NamedDoor, str]) -> None:
    url, _, request_id = served
    status, body = await decide(url, request_id)
    assert (status, body["state"], body["decided_by"]) == (200, "APPROVED", "treasury-lead")
    status, body = await decide(url, request_id)
    assert (status, body["error"]["code"]) == (409, "APPROVAL_ALREADY_DECIDED")


async def test_an_approver_who_requires_a_passkey_cannot_decide_with_a_credential_alone(
    served: tuple[str, NamedDoor, str],
) -> None:
    """The principal's own ``approval.verification`` counts even where the rule asks none."""
    url, door, request_id = served
    door.approver = Principal(
        id="treasury-lead", role=Role.APPROVER, verification=Verification.WEBAUTHN
    )
    status, body = await decide(url, request_id)
    assert (status, body["error"]["code"]) == (403, "APPROVAL_VERIFICATION_REQUIRED")
    door.approver = Principal(id="treasury-lead", role=Role.APPROVER)
    status, body = await decide(url, request_id)
    assert (status, body["verification"]["decided_with"]) == (200, "CREDENTIAL")
