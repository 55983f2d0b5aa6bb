"""An executor in principals-file mode for the issue-3 integration tests, and clients to call it.

The door, listener, control and halt tests all need the same estate: an in-process executor built
by ``assembly.assemble`` from a real environment (no legacy caller variables), serving TLS with a
client CA on a real loopback socket, a real synthetic provider, a principals file (mode 0600) with
BEARER, WORKLOAD_JWT and MTLS principals, a JWKS file whose key signs real workload tokens, and
an aiohttp client that can present a bearer, a client certificate, or both.

    estate = await Estate.start(tmp_path, provider=provider)
    reply = await estate.client.propose(estate.cast.agent.token, key="k-1")
    await estate.close()

Callers: ``test_door_http.py``, ``test_tls_listener.py``, ``test_control_http.py``,
``test_halt_http.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from agentsafe.executor.assembly import assemble
from agentsafe.executor.clock import Clock
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.plane import Executor
from agentsafe.executor.tools.harness import Workspace, free_port
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.support.pki import Issued, TestCA, TokenSigner

__all__ = [
    "AUDIENCE",
    "AUDIT_URI",
    "ISSUER",
    "LEGACY_VARIABLES",
    "ONCALL_URI",
    "OPERATOR_SCOPES",
    "TENANT",
    "TWO_ACTION_POLICY",
    "WORKLOAD_SUBJECT",
    "Bearer",
    "Cast",
    "Client",
    "Estate",
    "Jwks",
    "Reply",
    "Starter",
    "Tls",
    "assert_door_refusal",
    "estates",
    "write_private",
]

TENANT = "00000000-0000-4000-8000-0000000000aa"
ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIENCE = "agentsafe-executor"
WORKLOAD_SUBJECT = "system:serviceaccount:agents:payout-agent"
ONCALL_URI = "spiffe://bank.example/ns/ops/sa/oncall"
AUDIT_URI = "spiffe://bank.example/ns/ops/sa/audit"
OPERATOR_SCOPES = ("halt", "resume", "secrets.reload", "status", "metrics", "evidence")
LEGACY_VARIABLES = (
    "EXECUTOR_TENANT_ID",
    "EXECUTOR_ACTOR_ID",
    "EXECUTOR_ACTOR_TYPE",
    "EXECUTOR_ACTOR_RUNTIME",
    "EXECUTOR_CALLER_TOKEN",
)

# Two actions on the one forward handler, so a principal can be allowed one and not the other.
# (The default estate runs the bundled example policy, whose one action is create_payout.)
TWO_ACTION_POLICY = """\
actions:
  - name: create_payout
    handler: forward_request
    parameters:
      type: object
      required: [amountMinor, currency]
      additionalProperties: false
      properties:
        amountMinor: {type: integer, minimum: 1}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
    rules:
      - name: small
        when: "params.amountMinor <= 5000"
        verdict: ALLOW
      - name: medium
        when: "params.amountMinor <= 50000"
        verdict: ESCALATE
        approvers: [treasury-lead]
      - name: large
        when: "true"
        verdict: BLOCK
        reasonCode: AMOUNT_ABOVE_POLICY
  - name: create_refund
    handler: forward_request
    parameters:
      type: object
      required: [amountMinor, currency]
      additionalProperties: false
      properties:
        amountMinor: {type: integer, minimum: 1}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
    rules:
      - name: any
        when: "true"
        verdict: ALLOW
"""


def write_private(path: Path, data: bytes, *, mode: int = 0o600) -> Path:
    """Write ``data`` to ``path`` atomically (a new inode, then rename) with ``mode``."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
    return path


# ----------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Bearer:
    """A bearer token (what a caller presents) and its digest (what the file holds)."""

    token: str

    @classmethod
    def new(cls, marker: str = "tok") -> Bearer:
        return cls(f"{marker}-{secrets.token_urlsafe(24)}")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.token.encode()).hexdigest()

    def credential(self) -> dict[str, Any]:
        return {"kind": "BEARER", "token_sha256": self.sha256}


@dataclass
class Jwks:
    """A workload-token signing key and the JWKS file the executor reads it from."""

    path: Path
    signer: TokenSigner = field(default_factory=lambda: TokenSigner("ES256", kid="cluster-1"))

    def __post_init__(self) -> None:
        self.write()

    def write(self) -> None:
        write_private(self.path, json.dumps({"keys": [self.signer.jwk()]}).encode(), mode=0o644)

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "sub": WORKLOAD_SUBJECT,
            "aud": [AUDIENCE],
            "iat": now - 5,
            "exp": now + 600,
            "kubernetes.io": {"namespace": "agents"},
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, **overrides: Any) -> str:
        return self.signer.sign(self.claims(**overrides))


@dataclass
class Tls:
    """A test CA, the listener's certificate (file) and key (secret file), client certificates."""

    ca: TestCA
    server: Issued
    cert_file: Path
    key_file: Path
    ca_file: Path

    @classmethod
    def make(cls, workspace: Workspace, *, ca: TestCA | None = None) -> Tls:
        ca = ca or TestCA("agentsafe listener test CA")
        server = ca.issue_server()
        tls = cls(
            ca=ca,
            server=server,
            cert_file=workspace.root / "listener.crt",
            key_file=workspace.secrets_dir / "listener.key",
            ca_file=workspace.root / "clients-ca.crt",
        )
        tls.ca_file.write_bytes(ca.cert_pem)
        tls.install(server)
        return tls

    def install(self, server: Issued) -> None:
        """Put ``server`` in place: the key secret first, then the certificate file."""
        self.server = server
        write_private(self.key_file, server.key_pem)
        write_private(self.cert_file, server.cert_pem, mode=0o644)


@dataclass
class Cast:
    """The principals of one estate and the credentials each presents."""

    agent: Bearer = field(default_factory=lambda: Bearer.new("agent"))
    other: Bearer = field(default_factory=lambda: Bearer.new("other"))
    ops: Bearer = field(default_factory=lambda: Bearer.new("ops"))
    watcher: Bearer = field(default_factory=lambda: Bearer.new("watcher"))
    pinned_cert_sha256: str | None = None
    agent_rate_limit: str | None = None
    other_actions: tuple[str, ...] = ("create_payout",)
    revoked: frozenset[str] = frozenset()

    def entries(self) -> list[dict[str, Any]]:
        def proposer(
            pid: str, actor: str, actions: list[str], cred: dict[str, Any]
        ) -> dict[str, Any]:
            return {
                "id": pid,
                "role": "PROPOSER",
                "tenant_id": TENANT,
                "actor": {"id": actor, "type": "AI_AGENT", "runtime": "pytest"},
                "allowed_actions": actions,
                "credential": cred,
            }

        def operator(
            pid: str, person: str, scopes: Sequence[str], cred: dict[str, Any]
        ) -> dict[str, Any]:
            return {
                "id": pid,
                "role": "OPERATOR",
                "actor": {"id": person, "type": "HUMAN"},
                "scopes": list(scopes),
                "credential": cred,
            }

        agent = proposer("agent", "payout-agent", ["create_payout"], self.agent.credential())
        if self.agent_rate_limit is not None:
            agent["rate_limit"] = self.agent_rate_limit
        pinned: dict[str, Any] = {"kind": "MTLS", "san_uri": AUDIT_URI}
        if self.pinned_cert_sha256 is not None:
            pinned["cert_sha256"] = self.pinned_cert_sha256
        workload_cred = {
            "kind": "WORKLOAD_JWT",
            "issuer": ISSUER,
            "subject": WORKLOAD_SUBJECT,
            "required_claims": {"kubernetes.io/namespace": "agents"},
        }
        entries = [
            agent,
            proposer("other", "other-agent", list(self.other_actions), self.other.credential()),
            proposer("workload-agent", "k8s-agent", ["create_payout"], workload_cred),
            operator("ops", "alice", OPERATOR_SCOPES, self.ops.credential()),
            operator("watcher", "bob", ["status", "metrics"], self.watcher.credential()),
            operator("oncall", "carol", OPERATOR_SCOPES, {"kind": "MTLS", "san_uri": ONCALL_URI}),
            operator("auditor", "dave", ["status"], pinned),
        ]
        return [e for e in entries if e["id"] not in self.revoked]

    def document(self) -> bytes:
        return json.dumps({"version": "agent-safe.principals/1", "principals": self.entries()},
                          indent=2).encode()  # fmt: skip


# ----------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class Reply:
    status: int
    text: str
    headers: Mapping[str, str]

    @property
    def body(self) -> Any:
        return json.loads(self.text)

    @property
    def code(self) -> str | None:
        body = self.body
        error = body.get("error") if isinstance(body, dict) else None
        return error.get("code") if isinstance(error, dict) else None


class Client:
    """An aiohttp client for one listener; a fresh connection per request (no pooling)."""

    def __init__(self, base_url: str, *, tls: Tls | None, scratch: Path) -> None:
        self.base_url = base_url
        self._tls = tls
        self._scratch = scratch
        self._contexts: dict[str | None, ssl.SSLContext] = {}
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))

    def context(self, cert: Issued | None = None, *, ca: TestCA | None = None) -> ssl.SSLContext:
        """A client context trusting the listener's CA, presenting ``cert`` if given."""
        assert self._tls is not None
        key = None if cert is None else cert.sha256
        if key in self._contexts and ca is None:
            return self._contexts[key]
        ctx = ssl.create_default_context(cafile=str(self._tls.ca_file))
        if ca is not None:
            ctx.load_verify_locations(cadata=ca.cert_pem.decode())
        if cert is not None:
            cert_path, key_path = cert.write(self._scratch, f"client-{cert.sha256[:12]}")
            ctx.load_cert_chain(str(cert_path), str(key_path))
        if ca is None:
            self._contexts[key] = ctx
        return ctx

    async def request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        json_body: Any = None,
        cert: Issued | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        kwargs: dict[str, Any] = {"headers": hdrs}
        if json_body is not None:
            kwargs["json"] = json_body
        if self._tls is not None:
            kwargs["ssl"] = self.context(cert)
        async with self._session.request(method, self.base_url + path, **kwargs) as response:
            text = await response.text()
            return Reply(response.status, text, dict(response.headers))

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await self.request("POST", path, json_body={} if body is None else body, **kwargs)

    async def propose(
        self,
        token: str | None,
        *,
        key: str,
        amount: int = 5000,
        action: str = "create_payout",
        cert: Issued | None = None,
    ) -> Reply:
        body = {
            "proposal": {
                "action": action,
                "target": "payout:beneficiary-1",
                "parameters": {"amountMinor": amount, "currency": "USD"},
            },
            "idempotency_key": key,
        }
        return await self.post("/v1/actions", body, token=token, cert=cert)

    async def close(self) -> None:
        await self._session.close()


# ----------------------------------------------------------------------------- the estate


@dataclass
class Estate:
    """One running executor in principals-file mode and everything needed to call it."""

    executor: Executor
    provider: SyntheticProvider
    workspace: Workspace
    environ: dict[str, str]
    cast: Cast
    principals_file: Path
    jwks: Jwks
    tls: Tls | None
    client: Client
    evidence: MemorySink
    security: MemorySink

    @classmethod
    async def start(
        cls,
        root: Path,
        *,
        provider: SyntheticProvider,
        cast: Cast | None = None,
        tls: bool = True,
        background: bool = False,
        extra: Mapping[str, str] | None = None,
        drop: Sequence[str] = (),
        policy: str | None = None,
        principals_mode: int = 0o600,
        ca: TestCA | None = None,
        provider_url: str | None = None,
        clock: Clock | None = None,
    ) -> Estate:
        workspace = Workspace(root)
        cast = cast or Cast()
        policy_file: Path | None = None
        if policy is not None:
            policy_file = root / "policy.yaml"
            policy_file.write_text(policy)
        principals_file = write_private(
            root / "principals.json", cast.document(), mode=principals_mode
        )
        jwks = Jwks(root / "jwks.json")
        env = workspace.environment(
            provider_url=provider_url or provider.base_url,
            port=free_port(),
            policy_file=policy_file,
        )
        for name in LEGACY_VARIABLES:
            env.pop(name)
        env.update(
            {
                "EXECUTOR_PRINCIPALS_FILE": str(principals_file),
                "EXECUTOR_JWT_AUDIENCE": AUDIENCE,
                "EXECUTOR_JWKS_FILE": str(jwks.path),
            }
        )
        material: Tls | None = None
        if tls:
            material = Tls.make(workspace, ca=ca)
            env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
            env.update(
                {
                    "EXECUTOR_TLS_CERT_FILE": str(material.cert_file),
                    "EXECUTOR_TLS_KEY_FILE": str(material.key_file),
                    "EXECUTOR_TLS_CLIENT_CA_FILE": str(material.ca_file),
                }
            )
        env.update(extra or {})
        for name in drop:
            env.pop(name, None)
        evidence, security = MemorySink(), MemorySink()
        executor = await assemble(
            env, streams=Streams(evidence=evidence, security=security), clock=clock
        )
        try:
            await executor.reconcile_at_start()
            await executor.listen()
            if background:
                executor.start_background()
        except BaseException:
            await executor.close()
            raise
        scheme = "https" if material is not None else "http"
        scratch = root / "clients"
        scratch.mkdir(mode=0o700, exist_ok=True)
        client = Client(f"{scheme}://127.0.0.1:{executor.port}", tls=material, scratch=scratch)
        return cls(
            executor=executor,
            provider=provider,
            workspace=workspace,
            environ=env,
            cast=cast,
            principals_file=principals_file,
            jwks=jwks,
            tls=material,
            client=client,
            evidence=evidence,
            security=security,
        )

    @property
    def port(self) -> int:
        return self.executor.port

    def auth_failures(self) -> list[dict[str, Any]]:
        return self.security.named("AUTH_FAILED")

    def mark(self) -> int:
        """A position in the security stream (see :func:`assert_door_refusal`)."""
        return len(self.security.events)

    def security_since(
        self, mark: int, event: str | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        return [(n, f) for n, f in self.security.events[mark:] if event is None or n == event]

    def evidence_names(self) -> list[str]:
        return [name for name, _ in self.evidence.events]

    def rewrite_principals(self, cast: Cast) -> None:
        self.cast = cast
        write_private(self.principals_file, cast.document())

    async def close(self) -> None:
        await self.client.close()
        await self.executor.close()


def assert_door_refusal(
    estate: Estate,
    mark: int,
    reply: Reply,
    *,
    status: int,
    code: str,
    method: str,
    secrets: Sequence[str] = (),
) -> None:
    """A refusal at the door: the status and code, one AUTH_FAILED line (method and code only),
    and nothing of ``secrets`` (what the request carried) echoed in the body or headers."""
    assert (reply.status, reply.code) == (status, code), reply.text
    assert set(reply.body) == {"error"}
    assert set(reply.body["error"]) == {"code", "message"}
    lines = estate.security_since(mark, "AUTH_FAILED")
    assert [fields for _, fields in lines] == [{"method": method, "code": code}]
    for secret in secrets:
        assert secret not in reply.text
        for value in reply.headers.values():
            assert secret not in value
    if status == 401:
        # RFC 9110 §15.5.2: every 401 carries a challenge (RFC 6750 §3), "invalid_token" when
        # a credential was presented and refused.
        expected = 'Bearer realm="agentsafe"'
        if code != "AUTH_REQUIRED":
            expected += ', error="invalid_token"'
        assert reply.headers.get("WWW-Authenticate") == expected, reply.headers
    else:
        assert "WWW-Authenticate" not in reply.headers


Starter = Callable[..., Awaitable[Estate]]


@contextlib.asynccontextmanager
async def estates(root: Path) -> AsyncIterator[Starter]:
    """A synthetic provider and a factory of estates under ``root``; everything closed after."""
    provider = SyntheticProvider()
    await provider.start()
    started: list[Estate] = []

    async def start(**options: Any) -> Estate:
        estate = await Estate.start(root / f"estate{len(started)}", provider=provider, **options)
        started.append(estate)
        return estate

    try:
        yield start
    finally:
        for estate in started:
            await estate.close()
        await provider.stop()
