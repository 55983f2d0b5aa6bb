"""The egress guard and downstream credentials as ``assembly.assemble`` wires them (issue 8).

The unit tests prove the guard and the credentials alone; these prove the wiring: the guarded
client built from the configured destinations is the forward handler's transport, its refusals
reach the security stream, the metrics and the halt's spike detector, and the outcome of a
proposal says whether anything could have reached the provider. The executor is built in-process
with :func:`~agentsafe.executor.assembly.assemble` from a real environment (principals file, an
OPERATOR with the ``metrics`` scope) and served on a real loopback socket; the providers and the
OAuth token endpoint are the test's own aiohttp servers.

- A provider that hangs past ``DOWNSTREAM_TIMEOUT_MS``: EGRESS_TIMEOUT after the request was
  sent, UNKNOWN_AFTER_DISPATCH, and with ``EXECUTOR_HALT_ON_EGRESS_REFUSALS=2/60`` the second
  refusal halts (503 EXECUTOR_HALTED afterwards).
- A ``DOWNSTREAM_URL`` whose name resolves to loopback while loopback is not allowed:
  EGRESS_ADDRESS_REFUSED before any socket (the listener there sees no connection),
  FAILED_BEFORE_DISPATCH.
- PRIVATE_KEY_JWT end to end: the assertion verified with the public key by an independent
  verifier written here, the bearer checked by the provider, the token fetched once and reused;
  a token endpoint that fails is FAILED_BEFORE_DISPATCH.
- The keys of a credential kind not selected are refused at start, naming the variable.
- Two of these again in a real ``agentsafe serve`` (marked slow), where the audit hook is
  installed: the token request and the dispatch pass it, and a refusal spike halts the process
  with chained EGRESS_REFUSED lines (origin and code only) on its stderr.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from agentsafe.executor.assembly import assemble
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import ExecutorProcess, Workspace, free_port

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env
from .estate import write_private

PROPOSER = "treasury-workflow"
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
CLIENT_ID = "agentsafe-executor-test"


# ----------------------------------------------------------------------------- the executor


@dataclass
class Wired:
    executor: Executor
    principals: BearerPrincipals
    evidence: MemorySink
    security: MemorySink
    session: aiohttp.ClientSession
    url: str

    async def propose(self, key: str, amount: int = 100) -> tuple[int, dict[str, Any]]:
        body = {
            "proposal": {
                "action": "create_payout",
                "target": "payout:beneficiary-1",
                "parameters": {"amountMinor": amount, "currency": "USD"},
            },
            "idempotency_key": key,
        }
        headers = {"authorization": f"Bearer {self.principals.token(PROPOSER)}"}
        async with self.session.post(self.url + "/v1/actions", json=body, headers=headers) as r:
            return r.status, await r.json()

    async def metrics(self) -> str:
        headers = {"authorization": f"Bearer {self.principals.token(OPERATOR_ID)}"}
        async with self.session.get(self.url + "/metrics", headers=headers) as r:
            assert r.status == 200
            return await r.text()

    def egress_refusals(self) -> list[dict[str, Any]]:
        refusals: list[dict[str, Any]] = self.security.named("EGRESS_REFUSED")
        return refusals

    def halted(self) -> bool:
        return bool(self.executor.halt.halted)

    def all_text(self) -> str:
        """Everything both streams said, for checks that nothing secret escaped."""
        return json.dumps([self.evidence.events, self.security.events], default=str)


def environment(
    root: Path,
    *,
    provider_url: str,
    extra: Mapping[str, str] = {},
    drop: Sequence[str] = (),
) -> tuple[dict[str, str], BearerPrincipals]:
    workspace = Workspace(root / "ws")
    principals = BearerPrincipals()
    env = principals_env(
        workspace.environment(provider_url=provider_url, port=free_port()),
        principals.write(root / "principals.json"),
        **extra,
    )
    for name in drop:
        env.pop(name, None)
    return env, principals


@contextlib.asynccontextmanager
async def wired(
    root: Path,
    *,
    provider_url: str,
    extra: Mapping[str, str] = {},
    drop: Sequence[str] = (),
) -> AsyncIterator[Wired]:
    env, principals = environment(root, provider_url=provider_url, extra=extra, drop=drop)
    evidence, security = MemorySink(), MemorySink()
    executor = await assemble(env, streams=Streams(evidence=evidence, security=security))
    try:
        await executor.reconcile_at_start()
        await executor.listen()
        async with aiohttp.ClientSession() as session:
            yield Wired(
                executor=executor,
                principals=principals,
                evidence=evidence,
                security=security,
                session=session,
                url=f"http://127.0.0.1:{executor.port}",
            )
    finally:
        await executor.close()


def metric(exposition: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the OpenMetrics text, or None when it is absent."""
    rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    wanted = f"{name}{{{rendered}}}" if labels else name
    for line in exposition.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == wanted:
            return float(value)
    return None


# ----------------------------------------------------------------------------- servers


class Server:
    """A loopback aiohttp server with routes the test adds."""

    def __init__(self) -> None:
        self.app = web.Application()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class HangingProvider(Server):
    """Reads the payout and never answers (until the test ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[str] = []
        self._release = asyncio.Event()
        self.app.router.add_post("/payouts", self._create)
        self.app.router.add_get("/payouts/{key}", self._lookup)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.arrived.append(request.headers.get("Idempotency-Key", ""))
        await self._release.wait()
        return web.json_response({"reference": "late"}, status=202)

    async def _lookup(self, request: web.Request) -> web.Response:
        return web.json_response({"code": "NOT_FOUND"}, status=404)

    async def stop(self) -> None:
        self._release.set()
        await super().stop()


@dataclass
class Issued:
    token: str
    at: float


@dataclass
class OAuthProvider:
    """A token endpoint (client_credentials + private_key_jwt) and a provider that checks the
    bearer it receives, on one loopback server."""

    public_key: ec.EllipticCurvePublicKey
    server: Server = field(default_factory=Server)
    failing: bool = False
    issued: list[Issued] = field(default_factory=list)
    assertion_problems: list[str] = field(default_factory=list)
    jtis: set[str] = field(default_factory=set)
    bearers: list[str] = field(default_factory=list)
    payouts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server.app.router.add_post("/oauth/token", self._token)
        self.server.app.router.add_post("/payouts", self._create)
        self.server.app.router.add_get("/payouts/{key}", self._lookup)

    @property
    def token_url(self) -> str:
        return self.server.url + "/oauth/token"

    async def _token(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.json_response({"error": "temporarily_unavailable"}, status=503)
        form = await request.post()
        problem = self._check(dict(form))
        if problem is not None:
            self.assertion_problems.append(problem)
            return web.json_response({"error": "invalid_client"}, status=401)
        token = "at-" + secrets.token_urlsafe(24)
        self.issued.append(Issued(token, time.time()))
        return web.json_response({"access_token": token, "token_type": "Bearer", "expires_in": 600})

    def _check(self, form: Mapping[str, Any]) -> str | None:
        """The private_key_jwt assertion, verified here independently of the executor's code."""
        if form.get("grant_type") != "client_credentials":
            return "grant_type"
        if form.get("client_assertion_type") != JWT_BEARER:
            return "client_assertion_type"
        assertion = form.get("client_assertion")
        if not isinstance(assertion, str) or assertion.count(".") != 2:
            return "client_assertion"
        head_b64, claims_b64, sig_b64 = assertion.split(".")
        header = json.loads(_unb64(head_b64))
        claims = json.loads(_unb64(claims_b64))
        if header.get("alg") != "ES256":
            return "alg"
        raw = _unb64(sig_b64)
        if len(raw) != 64:
            return "signature length"
        der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
        try:
            self.public_key.verify(
                der, f"{head_b64}.{claims_b64}".encode("ascii"), ec.ECDSA(hashes.SHA256())
            )
        except InvalidSignature:
            return "signature"
        now = time.time()
        if claims.get("iss") != CLIENT_ID or claims.get("sub") != CLIENT_ID:
            return "iss/sub"
        if claims.get("aud") != self.token_url:
            return "aud"
        if not isinstance(claims.get("exp"), int) or not now < claims["exp"] <= now + 61:
            return "exp"
        if claims["exp"] - claims.get("iat", 0) != 60:
            return "lifetime"
        jti = claims.get("jti")
        if not isinstance(jti, str) or not jti or jti in self.jtis:
            return "jti"
        self.jtis.add(jti)
        if form.get("client_id") not in (None, CLIENT_ID):
            return "client_id"
        return None

    async def _create(self, request: web.Request) -> web.Response:
        await request.read()
        presented = request.headers.get("Authorization", "")
        self.bearers.append(presented)
        valid = {f"Bearer {i.token}" for i in self.issued}
        if presented not in valid:
            return web.json_response({"code": "UNAUTHORIZED"}, status=401)
        self.payouts.append(request.headers.get("Idempotency-Key", ""))
        return web.json_response({"reference": f"oauth_{secrets.token_hex(4)}"}, status=202)

    async def _lookup(self, request: web.Request) -> web.Response:
        if request.match_info["key"] in self.payouts:
            return web.json_response({"reference": "oauth", "status": "executed"})
        return web.json_response({"code": "NOT_FOUND"}, status=404)


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ConnectionCounter:
    """A raw loopback listener that counts the connections it is offered."""

    def __init__(self) -> None:
        self.connections = 0
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self._server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


# ----------------------------------------------------------------------------- refusals


def assert_halted_answer(status: int, body: Mapping[str, Any]) -> None:
    assert status == 503, body
    assert body["outcome"] == "BLOCKED"
    assert body["reason_codes"] == ["EXECUTOR_HALTED"]


async def test_a_spike_of_egress_timeouts_after_dispatch_halts_the_executor(
    tmp_path: Path,
) -> None:
    provider = HangingProvider()
    await provider.start()
    try:
        async with wired(
            tmp_path,
            provider_url=provider.url,
            extra={"DOWNSTREAM_TIMEOUT_MS": "300", "EXECUTOR_HALT_ON_EGRESS_REFUSALS": "2/60"},
        ) as ex:
            status, body = await ex.propose("slow-1")
            assert status == 200, body
            # The request was sent: the provider may have acted on it.
            assert body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
            assert body["executed"] is None
            assert "EGRESS_TIMEOUT" in body["reason_codes"]
            assert not ex.halted()
            assert provider.arrived == ["slow-1"]

            status, body = await ex.propose("slow-2")
            assert body["outcome"] == "UNKNOWN_AFTER_DISPATCH"
            assert ex.halted()
            assert ex.security.named("HALTED") == [
                {
                    "cause": "EGRESS_SPIKE",
                    "reason": "egress refusals crossed the threshold",
                    "by": None,
                }
            ]
            assert_halted_answer(*await ex.propose("after-halt"))
            assert provider.arrived == ["slow-1", "slow-2"], "nothing is sent while halted"

            origin = f"http://127.0.0.1:{provider.port}"
            assert ex.egress_refusals() == [{"origin": origin, "code": "EGRESS_TIMEOUT"}] * 2
            exposition = await ex.metrics()
            assert metric(exposition, "agentsafe_egress_refusals_total", code="EGRESS_TIMEOUT") == 2
            assert metric(exposition, "agentsafe_halts_total", cause="EGRESS_SPIKE") == 1
            assert "/payouts" not in json.dumps(ex.egress_refusals())
    finally:
        await provider.stop()


async def test_a_name_resolving_to_a_refused_address_fails_before_any_socket(
    tmp_path: Path,
) -> None:
    listener = ConnectionCounter()
    await listener.start()
    # "localhost" resolves to 127.0.0.1 (a loopback answer); without the development allowance
    # the guard refuses that answer, so nothing may ever connect to the listener behind it.
    base = f"https://localhost:{listener.port}"
    try:
        async with wired(
            tmp_path,
            provider_url=base,
            extra={"EXECUTOR_HALT_ON_EGRESS_REFUSALS": "2/60"},
            drop=("DOWNSTREAM_ALLOW_INSECURE_LOOPBACK",),
        ) as ex:
            status, body = await ex.propose("refused-1")
            assert status == 200, body
            assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
            assert body["executed"] is False
            assert "EGRESS_ADDRESS_REFUSED" in body["reason_codes"]
            assert not ex.halted()
            assert ex.egress_refusals() == [
                {"origin": f"https://localhost:{listener.port}", "code": "EGRESS_ADDRESS_REFUSED"}
            ]

            status, body = await ex.propose("refused-2")
            assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
            assert ex.halted()
            assert_halted_answer(*await ex.propose("after-halt"))
            code = "EGRESS_ADDRESS_REFUSED"
            exposition = await ex.metrics()
            assert metric(exposition, "agentsafe_egress_refusals_total", code=code) == 2
            assert metric(exposition, "agentsafe_egress_refusals_total", code="EGRESS_TIMEOUT") is (
                None
            )
            assert metric(exposition, "agentsafe_halts_total", cause="EGRESS_SPIKE") == 1
            # Nothing was sent, so no attempt is left open or unknown.
            assert ex.executor.unknown_attempts == 0
            assert await ex.executor.open_attempts() == []
        assert listener.connections == 0
    finally:
        await listener.stop()


async def test_below_the_threshold_egress_refusals_do_not_halt(tmp_path: Path) -> None:
    listener = ConnectionCounter()
    await listener.start()
    try:
        async with wired(
            tmp_path,
            provider_url=f"https://localhost:{listener.port}",
            extra={"EXECUTOR_HALT_ON_EGRESS_REFUSALS": "3/60"},
            drop=("DOWNSTREAM_ALLOW_INSECURE_LOOPBACK",),
        ) as ex:
            for n in range(2):
                _, body = await ex.propose(f"k-{n}")
                assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
            assert not ex.halted()
            assert ex.security.named("HALTED") == []
        assert listener.connections == 0
    finally:
        await listener.stop()


# ----------------------------------------------------------------------------- private_key_jwt


@dataclass
class JwtSetup:
    provider: OAuthProvider
    key_pem: bytes
    extra: dict[str, str]
    drop: tuple[str, ...] = ("DOWNSTREAM_CREDENTIAL", "DOWNSTREAM_CREDENTIAL_HEADER")


@pytest.fixture
async def jwt_setup(tmp_path: Path) -> AsyncIterator[JwtSetup]:
    key = ec.generate_private_key(ec.SECP256R1())
    provider = OAuthProvider(key.public_key())
    await provider.server.start()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    secrets_dir = tmp_path / "ws" / "secrets"
    secrets_dir.mkdir(parents=True, mode=0o700)
    key_file = write_private(secrets_dir / "downstream-private-key.pem", key_pem)
    extra = {
        "DOWNSTREAM_CREDENTIAL_KIND": "PRIVATE_KEY_JWT",
        "DOWNSTREAM_TOKEN_URL": provider.token_url,
        "DOWNSTREAM_CLIENT_ID": CLIENT_ID,
        "DOWNSTREAM_PRIVATE_KEY_FILE": str(key_file),
    }
    try:
        yield JwtSetup(provider, key_pem, extra)
    finally:
        await provider.server.stop()


async def test_private_key_jwt_end_to_end_fetches_the_token_once_and_reuses_it(
    tmp_path: Path, jwt_setup: JwtSetup
) -> None:
    oauth = jwt_setup.provider
    async with wired(
        tmp_path, provider_url=oauth.server.url, extra=jwt_setup.extra, drop=jwt_setup.drop
    ) as ex:
        for key in ("jwt-1", "jwt-2", "jwt-3"):
            status, body = await ex.propose(key)
            assert status == 200, body
            assert (body["outcome"], body["executed"]) == ("COMPLETED", True), body
            assert body["result"]["provider_reference"].startswith("oauth_")
        assert oauth.assertion_problems == []
        assert len(oauth.jtis) == 1, "one assertion was presented and verified"
        assert len(oauth.issued) == 1, "the token is fetched once and reused"
        assert oauth.bearers == [f"Bearer {oauth.issued[0].token}"] * 3
        assert oauth.payouts == ["jwt-1", "jwt-2", "jwt-3"]
        assert ex.egress_refusals() == []
        text = ex.all_text()
        assert oauth.issued[0].token not in text
        assert "PRIVATE KEY" not in text
        for jti in oauth.jtis:
            assert jti not in text


async def test_a_failing_token_endpoint_fails_before_dispatch(
    tmp_path: Path, jwt_setup: JwtSetup
) -> None:
    oauth = jwt_setup.provider
    oauth.failing = True
    async with wired(
        tmp_path, provider_url=oauth.server.url, extra=jwt_setup.extra, drop=jwt_setup.drop
    ) as ex:
        status, body = await ex.propose("no-token")
        assert status == 200, body
        assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
        assert body["executed"] is False
        assert "DOWNSTREAM_TOKEN_UNAVAILABLE" in body["reason_codes"]
        assert oauth.bearers == [], "nothing reached the provider"
        assert await ex.executor.open_attempts() == []
        assert ex.egress_refusals() == [], "the endpoint answered; the guard refused nothing"
        # The failure is not cached: once the endpoint answers again, a token is fetched.
        oauth.failing = False
        status, body = await ex.propose("with-token")
        assert (body["outcome"], body["executed"]) == ("COMPLETED", True), body
        assert len(oauth.issued) == 1
        assert oauth.payouts == ["with-token"]


@pytest.mark.parametrize(
    ("kind", "stray", "value"),
    [
        ("PRIVATE_KEY_JWT", "DOWNSTREAM_CREDENTIAL", None),
        ("PRIVATE_KEY_JWT", "DOWNSTREAM_SIGNING_KEY_ID", "key-1"),
        ("STATIC_HEADER", "DOWNSTREAM_TOKEN_URL", "http://127.0.0.1:9/oauth/token"),
        ("STATIC_HEADER", "DOWNSTREAM_CLIENT_ID", CLIENT_ID),
    ],
)
async def test_keys_of_a_credential_kind_not_selected_are_refused_at_start(
    tmp_path: Path, jwt_setup: JwtSetup, kind: str, stray: str, value: str | None
) -> None:
    if kind == "PRIVATE_KEY_JWT":
        extra, drop = dict(jwt_setup.extra), ["DOWNSTREAM_CREDENTIAL_HEADER"]
        if stray != "DOWNSTREAM_CREDENTIAL":
            drop.append("DOWNSTREAM_CREDENTIAL")
    else:
        extra, drop = {}, []
    if value is not None:
        extra[stray] = value
    env, _ = environment(tmp_path, provider_url=jwt_setup.provider.server.url, extra=extra,
                         drop=drop)  # fmt: skip
    assert stray in env
    security = MemorySink()
    with pytest.raises(ConfigError) as caught:
        await assemble(env, streams=Streams(evidence=MemorySink(), security=security))
    assert caught.value.variable == stray
    assert "must be absent" in caught.value.problem
    if stray == "DOWNSTREAM_CREDENTIAL":
        assert env[stray] not in str(caught.value)


# ----------------------------------------------------------------------------- a real process


@pytest.mark.slow
async def test_private_key_jwt_in_a_real_serve_under_its_audit_hook(
    tmp_path: Path, jwt_setup: JwtSetup
) -> None:
    """The token request, the dispatch and the refusals all pass the installed audit hook."""
    oauth = jwt_setup.provider
    env, principals = environment(
        tmp_path, provider_url=oauth.server.url, extra=jwt_setup.extra, drop=jwt_setup.drop
    )
    process = ExecutorProcess(env, tmp_path)
    process.token = principals.token(PROPOSER)
    try:
        await process.start()
        async with aiohttp.ClientSession() as session:
            for key in ("proc-1", "proc-2"):
                status, body = await process.propose(session, amount=100, key=key)
                assert status == 200, body
                assert (body["outcome"], body["executed"]) == ("COMPLETED", True), body
            assert oauth.assertion_problems == []
            assert len(oauth.issued) == 1
            assert oauth.payouts == ["proc-1", "proc-2"]

            oauth.issued.clear()  # the provider now refuses the cached bearer
            status, body = await process.propose(session, amount=100, key="proc-3")
            assert status == 200, body
            assert body["outcome"] == "DEFINITELY_NOT_EXECUTED", body
            headers = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
            async with session.get(process.url + "/metrics", headers=headers) as r:
                exposition = await r.text()
        assert metric(exposition, "agentsafe_executions_total", outcome="COMPLETED") == 2
    finally:
        status = process.terminate()
    assert status == 0
    security = process.stderr_events()
    assert [e for e in security if e["event"] == "EGRESS_REFUSED"] == []
    text = process.stderr_path.read_text() + process.stdout_path.read_text()
    assert "PRIVATE KEY" not in text
    for bearer_value in oauth.bearers:
        assert bearer_value.removeprefix("Bearer ") not in text
    for line in text.splitlines():
        json.loads(line)  # nothing but JSON lines: no traceback, no guard refusal printed


@pytest.mark.slow
async def test_an_egress_refusal_spike_halts_a_real_serve(tmp_path: Path) -> None:
    listener = ConnectionCounter()
    await listener.start()
    env, principals = environment(
        tmp_path,
        provider_url=f"https://localhost:{listener.port}",
        extra={"EXECUTOR_HALT_ON_EGRESS_REFUSALS": "2/60"},
        drop=("DOWNSTREAM_ALLOW_INSECURE_LOOPBACK",),
    )
    process = ExecutorProcess(env, tmp_path)
    process.token = principals.token(PROPOSER)
    try:
        await process.start()
        async with aiohttp.ClientSession() as session:
            for key in ("spike-1", "spike-2"):
                status, body = await process.propose(session, amount=100, key=key)
                assert status == 200, body
                assert body["outcome"] == "FAILED_BEFORE_DISPATCH"
            status, body = await process.propose(session, amount=100, key="spike-3")
            assert_halted_answer(status, body)
            async with session.get(process.url + "/ready") as r:
                assert r.status == 503
            headers = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
            async with session.get(process.url + "/metrics", headers=headers) as r:
                exposition = await r.text()
        code = "EGRESS_ADDRESS_REFUSED"
        assert metric(exposition, "agentsafe_egress_refusals_total", code=code) == 2
        assert metric(exposition, "agentsafe_halts_total", cause="EGRESS_SPIKE") == 1
    finally:
        status = process.terminate()
        await listener.stop()
    assert status == 0
    assert listener.connections == 0
    security = process.stderr_events()
    refused = [e for e in security if e["event"] == "EGRESS_REFUSED"]
    chain_fields = {"schema", "event", "at", "level", "seq", "hash", "prev_hash"}
    assert [{k: v for k, v in e.items() if k not in chain_fields} for e in refused] == [
        {"origin": f"https://localhost:{listener.port}", "code": "EGRESS_ADDRESS_REFUSED"}
    ] * 2
    halted = [e for e in security if e["event"] == "HALTED"]
    assert [e["cause"] for e in halted] == ["EGRESS_SPIKE"]
