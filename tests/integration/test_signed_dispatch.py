"""SIGNED_REQUEST end to end: a strict provider verifies every dispatch and attestation.

The provider here is written against nothing but the public procedure
(``agentsafe.executor.provider.verify_provider_request``), the executor's published grant JWKS
and the public key it issued to the executor. It refuses anything that does not verify and
answers with its own signed effect receipt, which the executor carries into its evidence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.assembly import assemble
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.provider import (
    MemorySeenStore,
    sign_effect_receipt,
    verify_provider_request,
)
from agentsafe.executor.tools.harness import Workspace, free_port


class StrictProvider:
    def __init__(self, signing_public: Any) -> None:
        self.keys = {"executor-1": signing_public}
        self.jwks: dict[str, Any] = {}
        self.seen = MemorySeenStore()
        self.receipt_key = Ed25519PrivateKey.generate()
        self.verdicts: list[str] = []
        self.last: dict[str, Any] = {}
        self.effected: list[str] = []
        app = web.Application()
        app.router.add_post("/payouts", self.payout)
        self.runner = web.AppRunner(app, access_log=None)
        self.url = ""

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def payout(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.last = {
            "path": request.raw_path,
            "headers": list(request.headers.items()),
            "body": body,
        }
        verdict = verify_provider_request(
            method=request.method,
            path=request.raw_path,
            headers=list(request.headers.items()),
            body=body,
            keys=self.keys,
            authority_jwks=self.jwks,
            now=time.time(),
            seen_store=self.seen,
        )
        self.verdicts.append(verdict.code)
        if not verdict.accepted:
            return web.json_response({"code": verdict.code}, status=401)
        assert verdict.attestation is not None
        self.effected.append(request.headers["idempotency-key"])
        receipt = sign_effect_receipt(
            attestation=verdict.attestation,
            status="EFFECTED",
            key=self.receipt_key,
            kid="provider-1",
            issuer="synthetic-strict-provider",
        )
        return web.json_response(
            {"reference": "strict-1"},
            status=202,
            headers={"x-agent-safe-effect-receipt": receipt},
        )


@pytest.fixture
async def strict(tmp_path: Path) -> AsyncIterator[tuple[StrictProvider, Any, MemorySink]]:
    signing = Ed25519PrivateKey.generate()
    provider = StrictProvider(signing.public_key())
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    key_file = workspace.secrets_dir / "downstream-signing-key.pem"
    key_file.write_bytes(
        signing.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    env = workspace.environment(provider_url=provider.url, port=free_port())
    for name in ("DOWNSTREAM_CREDENTIAL", "DOWNSTREAM_CREDENTIAL_HEADER", "DOWNSTREAM_LOOKUP_URL"):
        env.pop(name, None)
    env.update(
        DOWNSTREAM_CREDENTIAL_KIND="SIGNED_REQUEST",
        DOWNSTREAM_SIGNING_KEY_FILE=str(key_file),
        DOWNSTREAM_SIGNING_KEY_ID="executor-1",
        DOWNSTREAM_SIGNING_ALGORITHM="ed25519",
    )
    evidence = MemorySink()
    executor = await assemble(env, streams=Streams(evidence=evidence, security=MemorySink()))
    await executor.reconcile_at_start()
    await executor.listen()
    url = f"http://127.0.0.1:{executor.port}"
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/.well-known/agentsafe-grant-jwks.json") as r:
            provider.jwks = await r.json()
        yield provider, (session, url, workspace.caller_token), evidence
    await executor.close()
    await provider.runner.cleanup()


async def test_signed_dispatch_is_verified_by_the_provider(
    strict: tuple[StrictProvider, Any, MemorySink],
) -> None:
    provider, (session, url, token), evidence = strict
    body = {
        "proposal": {
            "action": "create_payout",
            "target": "payout:strict",
            "parameters": {"amountMinor": 4200, "currency": "CHF"},
        },
        "idempotency_key": "signed-1",
    }
    headers = {"authorization": f"Bearer {token}"}
    async with session.post(url + "/v1/actions", json=body, headers=headers) as r:
        answer = await r.json()
    assert answer["outcome"] == "COMPLETED", (answer, provider.verdicts)
    assert provider.verdicts == ["VERIFIED"]
    assert provider.effected == ["signed-1"]
    [outcome] = evidence.named("OUTCOME")
    receipt = outcome["effect_receipt"]
    assert receipt.count(".") == 2


async def test_a_copied_request_cannot_be_replayed_at_the_provider(
    strict: tuple[StrictProvider, Any, MemorySink],
) -> None:
    provider, (session, url, token), _ = strict
    body = {
        "proposal": {
            "action": "create_payout",
            "target": "payout:strict",
            "parameters": {"amountMinor": 100, "currency": "CHF"},
        },
        "idempotency_key": "signed-2",
    }
    async with session.post(
        url + "/v1/actions", json=body, headers={"authorization": f"Bearer {token}"}
    ) as r:
        assert (await r.json())["outcome"] == "COMPLETED"
    captured = provider.last
    replay = verify_provider_request(
        method="POST",
        path=captured["path"],
        headers=captured["headers"],
        body=captured["body"],
        keys=provider.keys,
        authority_jwks=provider.jwks,
        now=time.time(),
        seen_store=provider.seen,
    )
    assert not replay.accepted
    assert replay.code.startswith("ATTESTATION")
    tampered = verify_provider_request(
        method="POST",
        path=captured["path"],
        headers=captured["headers"],
        body=captured["body"].replace(b"100", b"999"),
        keys=provider.keys,
        authority_jwks=provider.jwks,
        now=time.time(),
        seen_store=MemorySeenStore(),
    )
    assert not tampered.accepted
