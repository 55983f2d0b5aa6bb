"""Reconciliation under every downstream credential kind, against real processes (issue 16, item 3).

A real ``agentsafe serve`` and a real synthetic provider process that *demands* the credential
(``--require-credential``): every payout and every lookup that does not prove the executor is
refused, so a lookup the executor cannot sign, or signs with the wrong intent hash, shows here.

For each kind: a payout whose answer is lost (the provider acts and drops the connection) is
reconciled by the caller (``POST /v1/reconciliations``); then a payout in flight when the executor
is SIGKILLed is reconciled at the next start, and ``unknown_attempts`` falls to zero. The
provider refuses nothing throughout, and sent each payout once.

Before the fix a SIGNED_REQUEST lookup was signed over an empty intent hash, which the signing
module refuses; the error was swallowed into UNKNOWN and the provider was never asked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.grants import SigningKey
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)

pytestmark = pytest.mark.slow

_PKCS8 = (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8)
_STATIC_KEYS = ("DOWNSTREAM_CREDENTIAL", "DOWNSTREAM_CREDENTIAL_HEADER")


def _private(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _setup(
    kind: str, workspace: Workspace, provider_url: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The provider's requirement and the executor's environment for one credential kind."""
    secrets_dir = workspace.secrets_dir
    if kind == "STATIC_HEADER":
        requirement = {
            "kind": kind,
            "header": "authorization",
            "value": workspace.downstream_credential,
        }
        return requirement, {}
    drop = dict.fromkeys(_STATIC_KEYS, "")
    if kind == "PRIVATE_KEY_JWT":
        key = ec.generate_private_key(ec.SECP256R1())
        key_file = _private(
            secrets_dir / "downstream-private-key.pem",
            key.private_bytes(*_PKCS8, serialization.NoEncryption()),
        )
        requirement = {
            "kind": kind,
            "client_id": "executor-client",
            "public_key_pem": key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode("ascii"),
        }
        return requirement, {
            **drop,
            "DOWNSTREAM_CREDENTIAL_KIND": kind,
            "DOWNSTREAM_TOKEN_URL": f"{provider_url}/oauth/token",
            "DOWNSTREAM_CLIENT_ID": "executor-client",
            "DOWNSTREAM_PRIVATE_KEY_FILE": str(key_file),
        }
    authority = SigningKey.from_pem(
        (secrets_dir / "authority-signing-key.pem").read_bytes()
    ).public_jwk()
    alg = kind.split(":")[1]
    if alg == "ed25519":
        signing = Ed25519PrivateKey.generate()
        key_bytes = signing.private_bytes(*_PKCS8, serialization.NoEncryption())
        raw = signing.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        jwk = {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw)}
    else:
        key_bytes = b"synthetic-hmac-secret-of-32-bytes-or-more-0001"
        jwk = {"kty": "oct", "k": _b64url(key_bytes)}
    key_file = _private(secrets_dir / "downstream-signing-key", key_bytes)
    requirement = {
        "kind": "SIGNED_REQUEST",
        "keys": {"executor-1": jwk},
        "authority_jwks": {"keys": [authority]},
    }
    return requirement, {
        **drop,
        "DOWNSTREAM_CREDENTIAL_KIND": "SIGNED_REQUEST",
        "DOWNSTREAM_SIGNING_KEY_FILE": str(key_file),
        "DOWNSTREAM_SIGNING_KEY_ID": "executor-1",
        "DOWNSTREAM_SIGNING_ALGORITHM": alg,
    }


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _environment(
    workspace: Workspace, provider: ProviderProcess, extra: dict[str, str]
) -> dict[str, str]:
    env = workspace.environment(provider_url=provider.url, port=free_port())
    for name, value in extra.items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return env


@pytest.mark.parametrize(
    "kind",
    ["STATIC_HEADER", "PRIVATE_KEY_JWT", "SIGNED_REQUEST:ed25519", "SIGNED_REQUEST:hmac-sha256"],
)
async def test_reconciliation_asks_the_provider_under_every_credential_kind(
    tmp_path: Path, kind: str
) -> None:
    workspace = Workspace(tmp_path / "ws")
    provider_port = free_port()
    provider_url = f"http://127.0.0.1:{provider_port}"
    requirement, extra = _setup(kind, workspace, provider_url)
    require_file = tmp_path / "require.json"
    require_file.write_text(json.dumps(requirement), encoding="utf-8")
    provider = ProviderProcess(tmp_path, provider_port, require_credential=require_file)
    await provider.start()
    env = _environment(workspace, provider, extra)
    executor = ExecutorProcess(env, tmp_path)
    restarted: ExecutorProcess | None = None
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            # 1. the caller reconciles a payout whose answer was lost.
            await provider.set_mode("reset")
            status, body = await executor.propose(session, amount=4100, key="lost-1")
            assert status == 200, body
            assert body["outcome"] == "UNKNOWN_AFTER_DISPATCH", body
            headers = {"authorization": f"Bearer {executor.token}"}
            async with session.post(
                executor.url + "/v1/reconciliations",
                json={"recovery": body["recovery"]},
                headers=headers,
            ) as r:
                answer = await r.json()
            assert r.status == 200, answer
            assert (answer["status"], answer["executed"]) == ("COMPLETED", True), answer
            assert answer["reason_codes"] == []

            # 2. startup reconciliation after a SIGKILL mid-dispatch.
            await provider.set_mode("hang")
            pending = asyncio.ensure_future(executor.propose(session, amount=4200, key="kill-1"))

            async def arrived() -> bool:
                return int((await provider.received())["count"]) == 2

            await wait_until(arrived, timeout=30, what="the second payout to arrive")
            executor.kill()
            with contextlib.suppress(aiohttp.ClientError):
                await pending
        await provider.set_mode("normal")
        restarted = ExecutorProcess(env, tmp_path, "executor-2")
        await restarted.start()
        resolutions = [e for e in restarted.stdout_events() if e.get("event") == "RECONCILIATION"]
        assert [e["resolution"] for e in resolutions] == ["RECONCILED_COMPLETED"], resolutions
        async with aiohttp.ClientSession() as session:
            status, ready = await restarted.get_json(session, "/ready")
            assert (status, ready) == (200, {"ready": True, "code": "READY"})
        received = await provider.received()
        assert received["keys"] == ["lost-1", "kill-1"]  # each sent once, never again
        assert received["refusals"] == []  # every payout and lookup proved the executor
        assert not [
            e for e in restarted.stderr_events() if e.get("event") == "RECONCILE_LOOKUP_FAILED"
        ]
    finally:
        if restarted is not None:
            restarted.terminate()
        executor.kill()
        provider.terminate()


async def test_a_provider_demanding_a_signature_refuses_an_unsigned_lookup(tmp_path: Path) -> None:
    """The synthetic provider's check is real: a lookup without the credential is refused, and
    the executor reports LOOKUP_STATUS_401 (unknown), never "not executed"."""
    workspace = Workspace(tmp_path / "ws")
    provider_port = free_port()
    requirement, _ = _setup("SIGNED_REQUEST:ed25519", workspace, "")
    require_file = tmp_path / "require.json"
    require_file.write_text(json.dumps(requirement), encoding="utf-8")
    provider = ProviderProcess(tmp_path, provider_port, require_credential=require_file)
    await provider.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(provider.url + "/payouts/k-1", headers={"idempotency-key": "k-1"}) as r,
        ):
            assert r.status == 401
            assert (await r.json())["code"] == "CONTENT_DIGEST_MISSING"
    finally:
        provider.terminate()


async def test_the_provider_process_accepts_a_conforming_signer_in_any_parameter_order(
    tmp_path: Path,
) -> None:
    """RFC 9421: ``@signature-params`` is rebuilt in the received order, so a signer that writes
    ``alg;keyid;created`` is verified, not refused (issue 16)."""
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    requirement = {
        "kind": "SIGNED_REQUEST",
        "keys": {"other-signer": {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw)}},
    }
    require_file = tmp_path / "require.json"
    require_file.write_text(json.dumps(requirement), encoding="utf-8")
    provider = ProviderProcess(tmp_path, free_port(), require_credential=require_file)
    await provider.start()
    try:
        async with aiohttp.ClientSession() as session:
            for order in (("alg", "keyid", "created"), ("created", "keyid", "alg")):
                headers = _hand_signed_lookup(key, "k-9", order)
                async with session.get(provider.url + "/payouts/k-9", headers=headers) as r:
                    assert (r.status, (await r.json())["code"]) == (404, "NOT_FOUND"), order
        assert (await provider.received())["refusals"] == []
    finally:
        provider.terminate()


def _hand_signed_lookup(
    key: Ed25519PrivateKey, idem: str, order: tuple[str, ...]
) -> dict[str, str]:
    import time

    from agentsafe.executor.egress.httpsig import content_digest

    headers = {
        "content-digest": content_digest(b""),
        "idempotency-key": idem,
        "x-agent-safe-intent-hash": "sha256:" + "cd" * 32,
    }
    names = ("@method", "@path", *headers)
    values = {"created": str(int(time.time())), "keyid": '"other-signer"', "alg": '"ed25519"'}
    params = "(" + " ".join(f'"{n}"' for n in names) + ")"
    params += "".join(f";{name}={values[name]}" for name in order)
    lines = ['"@method": GET', f'"@path": /payouts/{idem}']
    lines += [f'"{name}": {value}' for name, value in headers.items()]
    lines.append(f'"@signature-params": {params}')
    signature = base64.b64encode(key.sign("\n".join(lines).encode())).decode()
    return {
        **headers,
        "signature-input": f"agentsafe={params}",
        "signature": f"agentsafe=:{signature}:",
    }
