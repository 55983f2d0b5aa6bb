"""Downstream credentials: private_key_jwt against a real local token endpoint; signed requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.egress.credentials import (
    CLIENT_ASSERTION_TYPE,
    CredentialUnavailable,
    PrivateKeyJwtCredential,
    SignedRequestCredential,
    StaticHeaderCredential,
)
from agentsafe.executor.egress.guard import Destination, GuardedClient
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import Streams
from agentsafe.executor.grants import b64url_decode


@dataclass
class StandInSecret:
    """Test stand-in for a secrets.py handle."""

    name: str
    value: bytes

    @contextlib.contextmanager
    def reveal(self) -> Iterator[bytearray]:
        yield bytearray(self.value)


def pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class TokenEndpoint:
    port: int
    requests: list[dict[str, list[str]]]
    release: asyncio.Event
    answers: list[dict[str, Any] | int]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/oauth/token"


@pytest.fixture
async def endpoint() -> AsyncIterator[TokenEndpoint]:
    state = TokenEndpoint(port=0, requests=[], release=asyncio.Event(), answers=[])
    state.release.set()
    counter = 0

    async def token(request: web.Request) -> web.Response:
        nonlocal counter
        form = parse_qs((await request.read()).decode())
        state.requests.append(form)
        await state.release.wait()
        answer = state.answers.pop(0) if state.answers else None
        if isinstance(answer, int):
            return web.Response(status=answer, text="no")
        counter += 1
        body = answer or {
            "access_token": f"tok-{counter}",
            "token_type": "Bearer",
            "expires_in": 300,
        }
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/oauth/token", token)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    state.port = runner.addresses[0][1]
    yield state
    await runner.cleanup()


def make(
    endpoint: TokenEndpoint, key: Any, clock: ManualClock, **kw: Any
) -> PrivateKeyJwtCredential:
    transport = GuardedClient(
        [Destination(endpoint.url, allow_insecure_loopback=True)], Streams.memory()
    )
    return PrivateKeyJwtCredential(
        client_id="agentsafe-exec",
        token_url=endpoint.url,
        private_key=StandInSecret("k", pem(key)),
        transport=transport,
        clock=clock,
        **kw,
    )


def verify_assertion(
    assertion: str, public: Any, alg: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    head_b64, payload_b64, sig_b64 = assertion.split(".")
    signing_input = f"{head_b64}.{payload_b64}".encode()
    signature = b64url_decode(sig_b64)
    if alg == "ES256":
        assert len(signature) == 64
        der = encode_dss_signature(
            int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
        )
        public.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
    else:
        public.verify(
            signature,
            signing_input,
            padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32),
            hashes.SHA256(),
        )
    return json.loads(b64url_decode(head_b64)), json.loads(b64url_decode(payload_b64))


@pytest.mark.parametrize("alg", ["ES256", "PS256"])
async def test_private_key_jwt_assertion_is_verified(endpoint: TokenEndpoint, alg: str) -> None:
    key = (
        ec.generate_private_key(ec.SECP256R1())
        if alg == "ES256"
        else rsa.generate_private_key(65537, 2048)
    )
    clock = ManualClock(1_800_000_000)
    credential = make(endpoint, key, clock, algorithm=alg, audience="https://bank.test/token")
    headers = await credential.headers_for(
        method="POST", url="https://bank.test/x", body=b"", idempotency_key="i", intent_hash="h"
    )
    assert headers == {"authorization": "Bearer tok-1"}
    [form] = endpoint.requests
    assert form["grant_type"] == ["client_credentials"]
    assert form["client_assertion_type"] == [CLIENT_ASSERTION_TYPE]
    header, claims = verify_assertion(form["client_assertion"][0], key.public_key(), alg)
    assert header["alg"] == alg
    assert claims["iss"] == claims["sub"] == "agentsafe-exec"
    assert claims["aud"] == "https://bank.test/token"
    assert claims["iat"] == 1_800_000_000
    assert claims["exp"] == 1_800_000_060
    other = json.loads(b64url_decode(credential.client_assertion().split(".")[1]))
    assert other["jti"] != claims["jti"]


async def test_token_cached_until_thirty_seconds_before_expiry(endpoint: TokenEndpoint) -> None:
    clock = ManualClock(1_800_000_000)
    credential = make(endpoint, ec.generate_private_key(ec.SECP256R1()), clock)
    assert await credential.access_token() == "tok-1"
    clock.advance(269)
    assert await credential.access_token() == "tok-1"
    clock.advance(1)  # 30 s before expiry
    assert await credential.access_token() == "tok-2"
    assert len(endpoint.requests) == 2
    claims = json.loads(b64url_decode(endpoint.requests[0]["client_assertion"][0].split(".")[1]))
    assert claims["aud"] == endpoint.url  # default audience is the token endpoint


async def test_single_flight_refresh_under_concurrency(endpoint: TokenEndpoint) -> None:
    credential = make(endpoint, ec.generate_private_key(ec.SECP256R1()), ManualClock())
    endpoint.release.clear()
    callers = [asyncio.create_task(credential.access_token()) for _ in range(20)]
    deadline = asyncio.get_running_loop().time() + 10
    while not endpoint.requests:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    endpoint.release.set()
    assert set(await asyncio.gather(*callers)) == {"tok-1"}
    assert len(endpoint.requests) == 1
    assert credential.token_requests == 1


@pytest.mark.parametrize(
    "answer",
    [
        500,
        {"token_type": "Bearer", "expires_in": 60},
        {"access_token": "SECRET VALUE", "token_type": "Bearer", "expires_in": 60},
        {"access_token": "SECRETVALUE", "token_type": "mac", "expires_in": 60},
        {"access_token": "SECRETVALUE", "token_type": "Bearer"},
        {"access_token": "SECRETVALUE", "token_type": "Bearer", "expires_in": 0},
    ],
)
async def test_unusable_token_is_failure_before_dispatch(
    endpoint: TokenEndpoint, answer: Any
) -> None:
    credential = make(endpoint, ec.generate_private_key(ec.SECP256R1()), ManualClock())
    endpoint.answers.append(answer)
    with pytest.raises(CredentialUnavailable) as info:
        await credential.access_token()
    assert info.value.code == "DOWNSTREAM_TOKEN_UNAVAILABLE"
    assert "SECRET" not in str(info.value)


async def test_unreachable_token_endpoint(endpoint: TokenEndpoint) -> None:
    transport = GuardedClient(
        [Destination("https://token.test/", allow_insecure_loopback=True)], Streams.memory()
    )
    credential = PrivateKeyJwtCredential(
        client_id="c",
        token_url=endpoint.url,  # not a sealed destination of this guard
        private_key=StandInSecret("k", pem(ec.generate_private_key(ec.SECP256R1()))),
        transport=transport,
    )
    with pytest.raises(CredentialUnavailable) as info:
        await credential.access_token()
    assert info.value.code == "DOWNSTREAM_TOKEN_UNAVAILABLE"
    assert endpoint.requests == []


def test_key_must_fit_algorithm() -> None:
    transport = GuardedClient([], Streams.memory())
    rsa_key = StandInSecret("k", pem(rsa.generate_private_key(65537, 2048)))
    ec_key = StandInSecret("k", pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(ConfigError):
        PrivateKeyJwtCredential(
            client_id="c",
            token_url="https://t/",
            private_key=rsa_key,
            transport=transport,
            algorithm="ES256",
        )
    with pytest.raises(ConfigError):
        PrivateKeyJwtCredential(
            client_id="c",
            token_url="https://t/",
            private_key=ec_key,
            transport=transport,
            algorithm="PS256",
        )
    with pytest.raises(ConfigError):
        PrivateKeyJwtCredential(
            client_id="c",
            token_url="https://t/",
            private_key=StandInSecret("k", b"junk"),
            transport=transport,
        )
    with pytest.raises(ConfigError):
        SignedRequestCredential(key_id="k", signing_key=ec_key)
    with pytest.raises(ConfigError):
        SignedRequestCredential(
            key_id="k", signing_key=StandInSecret("k", b"short"), algorithm="hmac-sha256"
        )
    with pytest.raises(ConfigError):
        SignedRequestCredential(
            key_id='bad"id', signing_key=StandInSecret("k", b"x" * 32), algorithm="hmac-sha256"
        )


async def test_signed_request_headers() -> None:
    credential = SignedRequestCredential(
        key_id="hk",
        signing_key=StandInSecret("k", b"s" * 32),
        algorithm="hmac-sha256",
        clock=ManualClock(1_800_000_000),
    )
    headers = await credential.headers_for(
        method="POST",
        url="https://bank.test/v1/t?x=1",
        body=b"{}",
        idempotency_key="i-1",
        intent_hash="sha256:ab",
    )
    assert headers["signature-input"] == (
        'agentsafe=("@method" "@path" "content-digest" "idempotency-key" '
        '"x-agent-safe-intent-hash");created=1800000000;keyid="hk";alg="hmac-sha256"'
    )
    assert headers["content-digest"] == "sha-256=:RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o=:"
    assert headers["signature"].startswith("agentsafe=:")
    assert headers["signature"].endswith(":")
    for bad in (
        {"grant_id": "g"},
        {"attestation": "a.b.c"},
        {"idempotency_key": "a\r\nb"},
        {"grant_id": "g", "decision_id": " d"},
    ):
        args: dict[str, Any] = {
            "method": "POST",
            "url": "https://bank.test/v1/t",
            "body": b"",
            "idempotency_key": "i",
            "intent_hash": "h",
            **bad,
        }
        with pytest.raises(CredentialUnavailable):
            await credential.headers_for(**args)


def test_the_credential_contract_lives_beside_the_credentials() -> None:
    """The handler uses the credential contract; the credentials never import the handler."""
    from agentsafe.executor.dispatch import forward
    from agentsafe.executor.egress import credentials

    assert StaticHeaderCredential.__module__ == "agentsafe.executor.egress.credentials"
    assert not hasattr(forward, "StaticHeaderCredential")
    assert forward.DownstreamCredential is credentials.DownstreamCredential
