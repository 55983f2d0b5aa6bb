"""The adversarial review's door attacks (issue 16), each against a real ``agentsafe serve``.

Each test starts the executor as its own process on a free loopback port, in principals-file
mode, and attacks it the way the review did. Different sources are different loopback
addresses: the client binds ``127.0.0.2``, ``127.0.0.3``... (all of ``127/8`` is loopback on
Linux), so the executor sees them as different peers.

- item 1: a flood of bad tokens from one source fills only that source's window; a request that
  proves a principal (an operator's status, halt and resume) is never refused by it; one source
  cannot reach the AUTH_SPIKE threshold, while several sources still can (the fail-closed
  choice), and the operator resumes under the flood;
- item 2: an authenticated agent's ROLE_FORBIDDEN refusals and its own rate-limit 429s never halt
  the boundary; they lock (or limit) that principal;
- item 6: workload tokens: a key of issuer B never verifies a token claiming issuer A, NaN and
  Infinity times are refused, a flat claim that contradicts the nested one is refused;
- item 9: an anonymous flood leaves the operator's HALTED line in the bundle window, the bundle
  verifies offline, and the flood writes a bounded number of lines;
- item 10: two Authorization headers are AUTH_AMBIGUOUS;
- item 17: a stranger replaying the principal's token for another audience cannot lock it out;
  nor, since issue 30 item 20, can a bad signature for a known key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.door.refusal_lines import BURST
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from tests.support.pki import TokenSigner

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

pytestmark = pytest.mark.slow

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")
AUDIENCE = "agentsafe-executor"
ISSUER_A = "https://oidc.cluster-a.example"
ISSUER_B = "https://oidc.cluster-b.example"
SUBJECT = "system:serviceaccount:agents:payout-agent"
AGENT = "treasury-workflow"


@dataclass
class Target:
    """One running executor and the credentials of its principals."""

    executor: ExecutorProcess
    principals: BearerPrincipals
    workspace: Workspace
    signers: dict[str, TokenSigner] = field(default_factory=dict)
    sessions: dict[str, aiohttp.ClientSession] = field(default_factory=dict)

    def token(self, principal_id: str) -> str:
        return self.principals.token(principal_id)

    def session(self, source: str = "127.0.0.1") -> aiohttp.ClientSession:
        if source not in self.sessions:
            connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
            self.sessions[source] = aiohttp.ClientSession(connector=connector)
        return self.sessions[source]

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: Any = None,
        source: str = "127.0.0.1",
        authorization: str | None = None,
    ) -> tuple[int, Any]:
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if authorization is not None:
            headers["Authorization"] = authorization
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["json"] = body
        url = self.executor.url + path
        async with self.session(source).request(method, url, **kwargs) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text

    async def code(self, method: str, path: str, **kwargs: Any) -> tuple[int, str | None]:
        status, body = await self.call(method, path, **kwargs)
        error = body.get("error") if isinstance(body, dict) else None
        return status, error.get("code") if isinstance(error, dict) else None

    async def halted(self) -> bool:
        status, body = await self.call("GET", "/ready")
        assert status in (200, 503), body
        return bool(body["code"] == "EXECUTOR_HALTED")

    def security(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.executor.stderr_events() if e.get("event") == event]


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    workloads: bool = False,
    plain_jwks: bool = False,
    start: bool = True,
    extra_principals: list[dict[str, Any]] | None = None,
) -> AsyncIterator[Target]:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    document = principals.document()
    document["principals"].extend(extra_principals or [])
    signers: dict[str, TokenSigner] = {}
    extra = dict(env or {})
    if workloads:
        signers = {"a": TokenSigner("ES256", kid="a-1"), "b": TokenSigner("ES256", kid="b-1")}
        jwks = tmp_path / "jwks.json"
        if plain_jwks:  # one set holding both clusters' keys, bound to no issuer
            jwks.write_text(json.dumps({"keys": [signers["a"].jwk(), signers["b"].jwk()]}))
        else:
            jwks.write_text(json.dumps({"issuers": [
                {"issuer": ISSUER_A, "keys": [signers["a"].jwk()]},
                {"issuer": ISSUER_B, "keys": [signers["b"].jwk()]},
            ]}))  # fmt: skip
        for pid, issuer in (("workload-a", ISSUER_A), ("workload-b", ISSUER_B)):
            document["principals"].append({
                "id": pid,
                "role": "PROPOSER",
                "tenant_id": document["principals"][0]["tenant_id"],
                "actor": {"id": pid, "type": "AI_AGENT"},
                "allowed_actions": ["create_payout"],
                "credential": {
                    "kind": "WORKLOAD_JWT", "issuer": issuer, "subject": SUBJECT,
                    "required_claims": {"kubernetes.io/namespace": "agents"},
                },
            })  # fmt: skip
        extra.update({"EXECUTOR_JWKS_FILE": str(jwks), "EXECUTOR_JWT_AUDIENCE": AUDIENCE})
    principals_file = tmp_path / "principals.json"
    principals_file.write_text(json.dumps(document))
    principals_file.chmod(0o600)
    workspace = Workspace(tmp_path / "ws")
    environment = principals_env(
        workspace.environment(provider_url=provider.url, port=free_port()), principals_file,
        **extra,
    )  # fmt: skip
    executor = ExecutorProcess(environment, tmp_path)
    target = Target(executor, principals, workspace, signers)
    try:
        if start:
            await executor.start()
        yield target
    finally:
        for session in target.sessions.values():
            await session.close()
        executor.terminate()
        provider.terminate()


def workload_claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISSUER_A,
        "sub": SUBJECT,
        "aud": [AUDIENCE],
        "iat": now - 5,
        "exp": now + 600,
        "kubernetes.io": {"namespace": "agents"},
    }
    claims.update(overrides)
    return claims


async def flood(
    target: Target, count: int, *, source: str, token: str | None = "not-a-token"
) -> None:
    """``count`` refused requests from ``source`` (a bad bearer, or none), 20 at a time."""

    async def one(_: int) -> None:
        await target.call("GET", "/v1/control/status", token=token, source=source)

    for start in range(0, count, 20):
        await asyncio.gather(*(one(i) for i in range(start, min(count, start + 20))))


# ----------------------------------------------------------------------------- item 1


async def test_a_flood_from_one_source_neither_halts_nor_keeps_anyone_out(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path) as target:
        ops = target.token(OPERATOR_ID)
        await flood(target, 300, source="127.0.0.2")
        # the flooding source is limited...
        assert await target.code("GET", "/v1/control/status", token="x", source="127.0.0.2") == (
            429,
            "RATE_LIMITED",
        )
        # ...but a request from it that proves a principal is never refused by its window
        status, body = await target.call("GET", "/v1/control/status", token=ops,
                                         source="127.0.0.2")  # fmt: skip
        assert status == 200, body
        # another source has its own window
        assert await target.code("GET", "/v1/control/status", token="x", source="127.0.0.3") == (
            401,
            "AUTH_FAILED",
        )
        # one source adds at most its window (20) to the spike (50): no halt
        assert await target.halted() is False
        assert target.security("HALTED") == []


async def test_several_sources_still_halt_and_the_operator_resumes_under_the_flood(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path) as target:
        ops = target.token(OPERATOR_ID)
        # three sources x the window's 20 failures cross the default 50/60: fail closed
        await asyncio.gather(*(flood(target, 40, source=f"127.0.0.{n}") for n in (4, 5, 6)))
        assert await target.halted() is True
        assert [e["cause"] for e in target.security("HALTED")] == ["AUTH_SPIKE"]

        stop = asyncio.Event()

        async def keep_flooding() -> None:  # one bad request after another, as in the review
            while not stop.is_set():
                await target.call("POST", "/v1/control/resume", token="bad", source="127.0.0.4",
                                  body={"reason": "x"})  # fmt: skip

        flooding = asyncio.create_task(keep_flooding())
        try:
            status, body = await target.call(
                "POST", "/v1/control/resume", token=ops, source="127.0.0.4",
                body={"reason": "spike investigated"},
            )  # fmt: skip
            assert status == 200, body
            assert await target.halted() is False
            for _ in range(20):  # the flood's 429s never count towards a new spike
                await target.call("GET", "/v1/control/status", token="bad", source="127.0.0.5")
            assert await target.halted() is False
        finally:
            stop.set()
            await flooding


# ----------------------------------------------------------------------------- item 2


async def test_an_agents_own_refusals_lock_or_limit_it_and_never_halt(tmp_path: Path) -> None:
    chatty = {
        "id": "chatty-agent",
        "role": "PROPOSER",
        "tenant_id": "00000000-0000-4000-8000-000000000001",
        "actor": {"id": "chatty", "type": "AI_AGENT"},
        "allowed_actions": ["create_payout"],
        "rate_limit": "2/60",
        "credential": {"kind": "BEARER", "token_sha256": _sha("chatty-" + "c" * 30)},
    }
    env = {"EXECUTOR_HALT_ON_AUTH_FAILURES": "5/60"}
    async with serve(tmp_path, env=env, extra_principals=[chatty]) as target:
        agent = target.token(AGENT)
        codes = [
            (await target.code("GET", "/v1/control/status", token=agent))[1] for _ in range(12)
        ]
        assert codes == ["ROLE_FORBIDDEN"] * 10 + ["PRINCIPAL_LOCKED"] * 2
        assert [e["principal"] for e in target.security("PRINCIPAL_LOCKED")] == [AGENT]
        for _ in range(30):  # its own rate limit: 429, never a spike
            await target.call("GET", "/v1/control/status", token="chatty-" + "c" * 30)
        assert await target.code("GET", "/v1/control/status", token="chatty-" + "c" * 30) == (
            429,
            "RATE_LIMITED",
        )
        assert await target.halted() is False
        assert target.security("HALTED") == []
        # the halt threshold is live: five anonymous failures still halt (fail closed)
        await flood(target, 5, source="127.0.0.7")
        assert await target.halted() is True


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- item 10


async def test_two_authorization_headers_are_ambiguous(tmp_path: Path) -> None:
    async with serve(tmp_path) as target:
        ops = target.token(OPERATOR_ID)
        for second in (ops, "someone-else"):
            reader, writer = await asyncio.open_connection("127.0.0.1", target.executor.port)
            writer.write(
                (
                    "GET /v1/control/status HTTP/1.1\r\nHost: executor\r\n"
                    f"Authorization: Bearer {ops}\r\nAuthorization: Bearer {second}\r\n"
                    "Connection: close\r\n\r\n"
                ).encode()
            )
            await writer.drain()
            response = await reader.read()
            writer.close()
            head, _, body = response.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"401", head
            assert json.loads(body)["error"]["code"] == "AUTH_AMBIGUOUS"
            assert ops.encode() not in response
        assert (await target.call("GET", "/v1/control/status", token=ops))[0] == 200


# ----------------------------------------------------------------------------- items 6 and 17


async def test_workload_tokens_bind_keys_to_issuers_and_refuse_constants(tmp_path: Path) -> None:
    async with serve(tmp_path, workloads=True) as target:
        a, b = target.signers["a"], target.signers["b"]

        async def propose(token: str, key: str) -> tuple[int, str | None]:
            body = {
                "proposal": {
                    "action": "create_payout",
                    "target": "payout:beneficiary-1",
                    "parameters": {"amountMinor": 100, "currency": "USD"},
                },
                "idempotency_key": key,
            }
            status, answer = await target.call("POST", "/v1/actions", token=token, body=body)
            error = answer.get("error") if isinstance(answer, dict) else None
            return status, error.get("code") if isinstance(error, dict) else None

        assert (await propose(a.sign(workload_claims()), "wl-a"))[0] == 200
        assert (await propose(b.sign(workload_claims(iss=ISSUER_B)), "wl-b"))[0] == 200
        # issuer B's key, a token claiming issuer A (and A's principal's subject)
        assert await propose(b.sign(workload_claims()), "wl-x") == (401, "JWT_SIGNATURE_INVALID")
        for constant in (float("nan"), float("inf")):
            forged = a.sign(workload_claims(exp=constant))  # never expires, if accepted
            assert await propose(forged, "wl-c") == (401, "AUTH_FAILED")
        lying = workload_claims(**{"kubernetes.io": {"namespace": "default"},
                                   "kubernetes.io/namespace": "agents"})  # fmt: skip
        assert await propose(a.sign(lying), "wl-l") == (401, "JWT_CLAIM_MISMATCH")


async def test_a_key_set_bound_to_no_issuer_is_refused_at_start(tmp_path: Path) -> None:
    """One plain JWKS with the keys of two clusters whose principals name two issuers: which
    issuer a key speaks for is unknown, so B's key could verify a token claiming A. Refused."""
    async with serve(tmp_path, workloads=True, plain_jwks=True, start=False) as target:
        target.executor.spawn()
        popen = target.executor.process
        assert popen is not None

        async def exited() -> bool:
            return popen.poll() is not None

        await wait_until(exited, timeout=60, what="the executor to refuse to start")
        assert target.executor.terminate() == 78
        refusal = target.executor.stderr_path.read_text()
        assert "JWKS_INVALID" in refusal
        assert "EXECUTOR_JWKS_FILE" in refusal


async def test_a_stranger_replaying_a_token_for_another_audience_cannot_lock_it_out(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workloads=True) as target:
        a = target.signers["a"]
        replayed = a.sign(workload_claims(aud=["https://payments.other.example"]))
        for n in range(15):  # from several sources, beyond the lockout's 10
            source = f"127.0.0.{10 + n % 3}"
            assert await target.code("GET", "/v1/control/status", token=replayed,
                                     source=source) == (401, "JWT_AUDIENCE_MISMATCH")  # fmt: skip
        assert target.security("PRINCIPAL_LOCKED") == []
        genuine = a.sign(workload_claims())
        assert await target.code("GET", "/v1/control/status", token=genuine) == (
            403,
            "ROLE_FORBIDDEN",
        )  # proven, not locked (a proposer on an operator route)
        # Issue 30, item 20: a token naming the real kid and subject, signed with the forger's
        # own key, is anyone's to make: it counts in its source's window, never towards the
        # principal's lock (before, ten of them locked the principal for 300 s).
        forger = TokenSigner("ES256", kid=a.kid)
        for n in range(15):
            assert await target.code("GET", "/v1/control/status",
                                     token=forger.sign(workload_claims()),
                                     source=f"127.0.0.{20 + n % 3}") == (
                401, "JWT_SIGNATURE_INVALID")  # fmt: skip
        assert target.security("PRINCIPAL_LOCKED") == []
        assert await target.code("GET", "/v1/control/status", token=genuine) == (
            403,
            "ROLE_FORBIDDEN",
        )  # still proven, never locked


# ----------------------------------------------------------------------------- item 9


async def test_an_anonymous_flood_leaves_the_halt_in_the_bundle_window(tmp_path: Path) -> None:
    env = {"EXECUTOR_EVIDENCE_WINDOW_LINES": "100", "EXECUTOR_HALT_ON_AUTH_FAILURES": "1000/60"}
    async with serve(tmp_path, env=env) as target:
        ops = target.token(OPERATOR_ID)
        status, body = await target.call("POST", "/v1/control/halt", token=ops,
                                         body={"reason": "incident 42"})  # fmt: skip
        assert status == 200, body
        started = time.monotonic()
        await asyncio.gather(
            *(flood(target, 80, source=f"127.0.1.{n}") for n in range(1, 6)),
            *(flood(target, 10, source=f"127.0.2.{n}", token=None) for n in range(1, 6)),
        )
        elapsed = time.monotonic() - started
        status, manifest = await target.call("POST", "/v1/control/evidence-export", token=ops,
                                             body={"reason": "after the flood"})  # fmt: skip
        assert status == 200, manifest
        bundles = [p for p in (target.workspace.root / "evidence").iterdir() if p.is_dir()]
        assert len(bundles) == 1
        lines = [json.loads(x) for x in (bundles[0] / "security.jsonl").read_text().splitlines()]
        halted = [x for x in lines if x["event"] == "HALTED"]
        assert [(x["cause"], x["reason"]) for x in halted] == [("OPERATOR", "incident 42")]
        assert sum(x["event"] == "AUTH_FAILED" for x in lines) <= 100
        argv = [AGENTSAFE, "verify", "bundle", str(bundles[0])]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        # 450 refusals; the lines they wrote are bounded by their kinds, not their number
        written = len(target.security("AUTH_FAILED"))
        kinds = {(e["method"], e["code"]) for e in target.security("AUTH_FAILED")}
        intervals = int(elapsed // 10) + 2
        assert written <= len(kinds) * BURST * intervals < 450
