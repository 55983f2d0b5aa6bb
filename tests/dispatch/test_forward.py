"""forward_request through the egress guard against real loopback servers.

Every outcome path runs through the seam, ``egress.GuardedClient`` (the executor's one outbound
client, here with loopback destinations under the development/test allowance
``allow_insecure_loopback=True``) and the synthetic provider, or, for answers the synthetic
provider never gives, a small aiohttp server on loopback. The guard's own refusals (the SSRF
corpus, TLS, pins, body and redirect handling in isolation) are in ``tests/egress/test_guard.py``
and ``test_guard_ssrf.py``; here they are asserted only as the seam reports them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.dispatch.forward import (
    INVALID_RECEIPT,
    ForwardRequestHandler,
    provider_reason,
)
from agentsafe.executor.dispatch.seam import (
    Authorization,
    Dispatch,
    ExecutionContext,
    ExecutionReport,
    Outcome,
    ReconcileResult,
    ReconcileStatus,
    Registry,
)
from agentsafe.executor.egress.credentials import StaticHeaderCredential
from agentsafe.executor.egress.guard import Destination, GuardedClient
from agentsafe.executor.egress.transport import (
    HttpResponse,
    Transport,
    is_loopback_host,
)
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.headers import RESERVED_HEADERS
from agentsafe.executor.host.secrets import SecretHandle
from agentsafe.executor.tools.synthetic import SyntheticProvider
from tests.support.intents import PAYOUT_PARAMETERS, make_intent

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["amountMinor", "currency"],
    "properties": {
        "amountMinor": {"type": "integer", "minimum": 1},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "synthetic_mode": {"type": "string"},
    },
}
TOKEN = "synthetic-downstream-token-0001"
PATH = "/payouts"
LOOKUP = "/payouts/{idempotency_key}"
IH = "sha256:" + "ab" * 32  # the intent a lookup is asked on behalf of


@dataclass(frozen=True)
class Guard:
    """A guarded client, the security stream it reports to and the refusals it counted."""

    client: GuardedClient
    security: MemorySink
    refusals: list[str]


def guarded(*prefixes: str, loopback: bool = True) -> Guard:
    """A :class:`GuardedClient` allowing exactly ``prefixes`` (loopback allowance by default)."""
    streams = Streams.memory()
    refusals: list[str] = []
    client = GuardedClient(
        [Destination(p, allow_insecure_loopback=loopback) for p in prefixes],
        streams,
        on_refusal=refusals.append,
    )
    assert isinstance(streams.security, MemorySink)
    return Guard(client, streams.security, refusals)


def guard_for(base: str, *, path: str = PATH, lookup: str | None = LOOKUP) -> Guard:
    """The destinations the executor's assembly derives for this handler: each configured
    address up to its first placeholder."""
    prefixes = [base + path]
    if lookup is not None:
        prefixes.append(base + lookup.split("{", 1)[0])
    return guarded(*prefixes)


class RecordingTransport:
    """Wraps a real transport and notes the timeout each request was given."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.timeouts: list[float] = []

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        self.timeouts.append(timeout)
        return await self.inner.request(method, url, headers=headers, body=body, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture
async def provider() -> AsyncIterator[SyntheticProvider]:
    synthetic = SyntheticProvider()
    await synthetic.start()
    yield synthetic
    await synthetic.stop()


@pytest.fixture
def guard(provider: SyntheticProvider) -> Guard:
    return guard_for(provider.base_url)


async def closed_base() -> str:
    """The base URL of a synthetic provider that has stopped: its port refuses connections."""
    synthetic = SyntheticProvider()
    base = await synthetic.start()
    await synthetic.stop()
    return base


def secret(value: str = TOKEN) -> SecretHandle:
    return SecretHandle("DOWNSTREAM_CREDENTIAL", bytearray(value.encode()))


def build(
    base: str,
    transport: Transport,
    *,
    path: str = PATH,
    lookup: str | None = LOOKUP,
    timeout_ms: int = 5_000,
    handle: SecretHandle | None = None,
) -> tuple[Registry, ForwardRequestHandler]:
    handler = ForwardRequestHandler(
        url=base + path,
        lookup_url=base + lookup if lookup else None,
        timeout_ms=timeout_ms,
        transport=transport,
        credential=StaticHeaderCredential("X-Api-Key", handle or secret()),
        parameters_schema=SCHEMA,
    )
    registry = Registry()
    registry.register("create_payout", handler)
    registry.seal()
    return registry, handler


async def run(
    registry: Registry,
    key: str,
    params: Mapping[str, Any] | None = None,
    *,
    grant_seconds: float = 30.0,
) -> tuple[ExecutionReport, ExecutionContext]:
    clock = ManualClock()
    intent = make_intent(
        now=clock.now(), idempotency_key=key, parameters=params or PAYOUT_PARAMETERS
    )
    auth = Authorization("dec-1", "dos-1", "grant-" + key, expires_at=clock.now() + grant_seconds)
    ctx = ExecutionContext.create(intent=intent, authorization=auth, clock=clock)

    async def on_claimed(_: ExecutionContext) -> None:
        return None

    return await registry.execute("create_payout", ctx, on_claimed=on_claimed), ctx


# -- every outcome through the guard and the synthetic provider -----------------------------


async def test_completed_sends_the_bound_request_once(
    provider: SyntheticProvider, guard: Guard
) -> None:
    registry, _ = build(provider.base_url, guard.client)
    report, ctx = await run(registry, "payout-1-v1")
    assert report.outcome is Outcome.COMPLETED
    assert report.executed is True
    assert report.result is not None
    assert report.result["status"] == 202
    assert report.result["accepted"] is True
    assert str(report.result["provider_reference"]).startswith("syn_")
    assert set(report.result) == {"status", "accepted", "provider_reference"}
    [received] = provider.received
    assert received.body == canonical_json({"amountMinor": 5000, "currency": "USD"})
    assert received.headers["content-type"] == "application/json"
    assert received.headers["idempotency-key"] == "payout-1-v1"
    assert received.headers["x-agent-safe-intent-hash"] == ctx.intent.intent_hash
    assert received.headers["x-agent-safe-dossier-id"] == "dos-1"
    assert received.headers["x-agent-safe-grant-id"] == "grant-payout-1-v1"
    assert received.headers["x-agent-safe-decision-id"] == "dec-1"
    assert received.headers["x-api-key"] == TOKEN
    # the guard adds nothing that identifies the client library
    assert "user-agent" not in received.headers
    assert provider.executed_keys() == ["payout-1-v1"]
    assert guard.refusals == []
    assert guard.security.events == []


async def test_a_deterministic_refusal_is_definitely_not_executed(
    provider: SyntheticProvider, guard: Guard
) -> None:
    provider.set_mode("refuse")
    registry, _ = build(provider.base_url, guard.client)
    report, _ = await run(registry, "payout-2")
    assert report.outcome is Outcome.DEFINITELY_NOT_EXECUTED
    assert report.executed is False
    assert report.reason_codes == ("INSUFFICIENT_FUNDS",)
    assert report.result is None
    assert provider.executed_keys() == []


async def test_a_500_without_body_is_unknown(provider: SyntheticProvider, guard: Guard) -> None:
    registry, _ = build(provider.base_url, guard.client)
    report, _ = await run(
        registry, "payout-3", {"amountMinor": 1, "currency": "USD", "synthetic_mode": "error"}
    )
    assert report.outcome is Outcome.UNKNOWN_AFTER_DISPATCH
    assert report.executed is None
    assert report.reason_codes == ("PROVIDER_ERROR",)


async def test_a_provider_that_never_answers_is_unknown_within_the_grant(
    provider: SyntheticProvider, guard: Guard
) -> None:
    provider.set_mode("hang")
    recording = RecordingTransport(guard.client)
    registry, handler = build(provider.base_url, recording, timeout_ms=15_000)
    report, ctx = await run(registry, "payout-4", grant_seconds=0.3)
    assert report.outcome is Outcome.UNKNOWN_AFTER_DISPATCH
    assert report.dispatched is True
    assert report.reason_codes == ("EGRESS_TIMEOUT",)
    assert recording.timeouts == [pytest.approx(0.3)]  # the grant, not DOWNSTREAM_TIMEOUT_MS
    assert [r.idempotency_key for r in provider.received] == ["payout-4"]
    assert guard.refusals == ["EGRESS_TIMEOUT"]
    assert guard.security.named("EGRESS_REFUSED") == [
        {"origin": provider.base_url, "code": "EGRESS_TIMEOUT"}
    ]
    # the provider acted; its lookup says so and reconciliation reads it
    assert await handler.reconcile(
        "payout-4", intent_hash=ctx.intent.intent_hash
    ) == ReconcileResult(
        ReconcileStatus.COMPLETED, provider_reference=provider.state.payouts["payout-4"].reference
    )


async def test_a_connection_reset_after_sending_is_unknown(
    provider: SyntheticProvider, guard: Guard
) -> None:
    provider.set_mode("reset")
    registry, _ = build(provider.base_url, guard.client)
    report, _ = await run(registry, "payout-5")
    assert report.outcome is Outcome.UNKNOWN_AFTER_DISPATCH
    assert report.reason_codes == ("TRANSPORT_CONNECTION_LOST",)
    assert report.dispatched is True
    assert [r.idempotency_key for r in provider.received] == ["payout-5"]


async def test_a_refused_connection_failed_before_dispatch() -> None:
    base = await closed_base()
    guard = guard_for(base)
    registry, _ = build(base, guard.client)
    report, _ = await run(registry, "payout-6")
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.executed is False
    assert report.dispatched is False
    assert report.reason_codes == ("TRANSPORT_CONNECT_FAILED",)
    assert guard.refusals == []  # an unreachable peer is not a policy refusal


async def test_plain_http_to_an_https_destination_never_leaves(
    provider: SyntheticProvider,
) -> None:
    """Without the loopback allowance the destination is https; plain http to it is refused."""
    https_base = provider.base_url.replace("http://", "https://", 1)
    guard = guarded(https_base + PATH, loopback=False)
    registry, _ = build(provider.base_url, guard.client)
    report, _ = await run(registry, "payout-7")
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.dispatched is False
    assert report.reason_codes == ("EGRESS_SCHEME_NOT_ALLOWED",)
    assert guard.refusals == ["EGRESS_SCHEME_NOT_ALLOWED"]
    assert provider.received == []


async def test_an_address_the_guard_does_not_know_never_leaves(
    provider: SyntheticProvider,
) -> None:
    """A handler pointed at another origin, or outside the path prefix, is refused by the guard."""
    other = guarded("http://127.0.0.2:9/")
    outside = guarded(provider.base_url + "/refunds")
    for guard, code in ((other, "EGRESS_ORIGIN_NOT_ALLOWED"), (outside, "EGRESS_PATH_NOT_ALLOWED")):
        registry, _ = build(provider.base_url, guard.client)
        report, _ = await run(registry, "payout-7b")
        assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
        assert report.reason_codes == (code,)
        assert guard.refusals == [code]
        assert guard.security.named("EGRESS_REFUSED") == [
            {"origin": provider.base_url, "code": code}
        ]
    assert provider.received == []


async def test_a_disposed_credential_fails_before_dispatch(
    provider: SyntheticProvider, guard: Guard
) -> None:
    handle = secret()
    handle.dispose()
    registry, _ = build(provider.base_url, guard.client, handle=handle)
    report, _ = await run(registry, "payout-8")
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("SECRET_DISPOSED",)
    assert provider.received == []


class FixedHeaders:
    """A credential that answers with the headers it was given (a broken or hostile one)."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)

    async def headers_for(self, **_: Any) -> dict[str, str]:
        return dict(self._headers)


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/plain"},
        {"Idempotency-Key": "another-key"},
        {"x-agent-safe-grant-id": "grant-other"},
        {"x-agent-safe-anything": "1"},
        {"host": "evil.test"},
        {"connection": "close"},
    ],
)
async def test_a_credential_may_not_replace_a_reserved_header(
    provider: SyntheticProvider, guard: Guard, headers: Mapping[str, str]
) -> None:
    registry = Registry()
    registry.register(
        "create_payout",
        ForwardRequestHandler(
            url=provider.base_url + PATH,
            lookup_url=None,
            timeout_ms=5_000,
            transport=guard.client,
            credential=FixedHeaders(headers),
            parameters_schema=SCHEMA,
        ),
    )
    registry.seal()
    report, _ = await run(registry, "payout-reserved")
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("CREDENTIAL_INVALID",)
    assert provider.received == []


class _Watching:
    """A credential and a transport that note whether the dispatch had started when asked."""

    def __init__(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch
        self.seen: list[tuple[str, bool]] = []

    async def headers_for(self, **_: Any) -> dict[str, str]:
        self.seen.append(("credential", self.dispatch.started))
        return {"x-api-key": TOKEN}

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        self.seen.append(("transport", self.dispatch.started))
        assert headers["idempotency-key"] == "payout-watched"
        return HttpResponse(status=200, headers={}, body=b'{"reference": "ref-1"}')

    async def close(self) -> None:
        return None


async def test_the_point_of_no_return_is_marked_after_the_credential_before_the_send() -> None:
    clock = ManualClock()
    intent = make_intent(now=clock.now(), idempotency_key="payout-watched")
    auth = Authorization("dec-1", "dos-1", "grant-1", expires_at=clock.now() + 30)
    ctx = ExecutionContext.create(intent=intent, authorization=auth, clock=clock)
    dispatch = Dispatch(ctx)
    watching = _Watching(dispatch)
    handler = ForwardRequestHandler(
        url="https://bank.test/payouts",
        lookup_url=None,
        timeout_ms=5_000,
        transport=watching,
        credential=watching,
        parameters_schema=SCHEMA,
    )
    result = await handler.execute(ctx, dispatch)
    assert result == {"status": 200, "accepted": True, "provider_reference": "ref-1"}
    assert watching.seen == [("credential", False), ("transport", True)]


async def test_an_expired_grant_sends_nothing(provider: SyntheticProvider, guard: Guard) -> None:
    registry, _ = build(provider.base_url, guard.client)
    report, _ = await run(registry, "payout-9", grant_seconds=-1)
    assert report.outcome is Outcome.FAILED_BEFORE_DISPATCH
    assert report.reason_codes == ("GRANT_EXPIRED",)
    assert provider.received == []
    assert guard.refusals == []  # refused before the guard was asked


async def test_the_same_key_twice_executes_once_at_the_provider(
    provider: SyntheticProvider, guard: Guard
) -> None:
    registry, _ = build(provider.base_url, guard.client)
    first, _ = await run(registry, "payout-10")
    second, _ = await run(registry, "payout-10")
    assert first.result == second.result
    assert len(provider.received) == 2
    assert provider.executed_keys() == ["payout-10"]


# -- reconcile -----------------------------------------------------------------------------


async def test_reconcile_reads_what_the_provider_did(
    provider: SyntheticProvider, guard: Guard
) -> None:
    registry, handler = build(provider.base_url, guard.client)
    _, ctx = await run(registry, "payout-11")
    done = await registry.reconcile(
        "create_payout", "payout-11", intent_hash=ctx.intent.intent_hash
    )
    assert done.status is ReconcileStatus.COMPLETED
    assert done.provider_reference is not None
    never = await registry.reconcile("create_payout", "never-sent", intent_hash=IH)
    assert never == ReconcileResult(ReconcileStatus.NOT_EXECUTED)
    provider.set_mode("refuse")
    _, ctx = await run(registry, "payout-12")
    assert (
        await handler.reconcile("payout-12", intent_hash=ctx.intent.intent_hash)
    ).status is ReconcileStatus.NOT_EXECUTED
    assert len(provider.received) == 2  # reconciliation sent no payout


async def test_reconcile_without_lookup_or_reachable_provider_is_unknown() -> None:
    _, no_lookup = build("http://127.0.0.1:9", guard_for("http://127.0.0.1:9").client, lookup=None)
    assert await no_lookup.reconcile("k", intent_hash=IH) == ReconcileResult(
        ReconcileStatus.UNKNOWN, reason_code="LOOKUP_NOT_CONFIGURED"
    )
    base = await closed_base()
    _, down = build(base, guard_for(base).client)
    assert await down.reconcile("k", intent_hash=IH) == ReconcileResult(
        ReconcileStatus.UNKNOWN, reason_code="TRANSPORT_CONNECT_FAILED"
    )


async def test_a_lookup_outside_the_guard_is_unknown_not_absent(
    provider: SyntheticProvider,
) -> None:
    """Only the payout address is a destination: the lookup is refused, and a refused lookup
    must never read as "not executed"."""
    guard = guarded(provider.base_url + PATH)
    registry, handler = build(provider.base_url, guard.client, lookup="/lookups/{idempotency_key}")
    await run(registry, "payout-13")
    assert await handler.reconcile("payout-13", intent_hash=IH) == ReconcileResult(
        ReconcileStatus.UNKNOWN, reason_code="EGRESS_PATH_NOT_ALLOWED"
    )
    assert guard.refusals == ["EGRESS_PATH_NOT_ALLOWED"]


# -- answers the synthetic provider never gives --------------------------------------------


@pytest.fixture
async def odd_server() -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback server with odd answers; yields its base URL and every path it was asked."""
    paths: list[str] = []

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        paths.append(request.raw_path)
        return await handler(request)

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/payouts")

    async def choices(request: web.Request) -> web.Response:
        return web.Response(status=300)

    async def conflict(request: web.Request) -> web.Response:
        return web.json_response({"code": "IDEMPOTENCY_IN_PROGRESS"}, status=409)

    async def empty_4xx(request: web.Request) -> web.Response:
        return web.Response(status=400)

    async def odd_reason(request: web.Request) -> web.Response:
        return web.json_response({"reason": "card declined: do-not-honour!!"}, status=402)

    async def numeric_code(request: web.Request) -> web.Response:
        return web.json_response({"code": "0042"}, status=422)

    async def big(request: web.Request) -> web.Response:
        return web.Response(status=200, body=b"x" * (2 * 1024 * 1024))

    async def big_chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(40):
            await response.write(b"y" * 65536)
        await response.write_eof()
        return response

    async def lookup(request: web.Request) -> web.Response:
        return web.Response(status=500 if request.match_info["key"] == "boom" else 404)

    app = web.Application(middlewares=[record])
    app.router.add_post("/redirect", redirect)
    app.router.add_post("/choices", choices)
    app.router.add_post("/conflict", conflict)
    app.router.add_post("/empty", empty_4xx)
    app.router.add_post("/odd", odd_reason)
    app.router.add_post("/numeric", numeric_code)
    app.router.add_post("/big", big)
    app.router.add_post("/big-chunked", big_chunked)
    app.router.add_get("/lookup/{key}", lookup)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), paths
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("path", "outcome", "code"),
    [
        # a redirect is never followed: the guard refuses it after the request was sent
        ("/redirect", Outcome.UNKNOWN_AFTER_DISPATCH, "EGRESS_REDIRECT_REFUSED"),
        # a 3xx that is not a redirect reaches the handler, which infers nothing from it
        ("/choices", Outcome.UNKNOWN_AFTER_DISPATCH, "PROVIDER_REDIRECT"),
        ("/conflict", Outcome.UNKNOWN_AFTER_DISPATCH, "PROVIDER_ANSWER_INDETERMINATE"),
        ("/empty", Outcome.UNKNOWN_AFTER_DISPATCH, "PROVIDER_ANSWER_INDETERMINATE"),
        ("/odd", Outcome.DEFINITELY_NOT_EXECUTED, "CARD_DECLINED_DO_NOT_HONOUR"),
        ("/numeric", Outcome.DEFINITELY_NOT_EXECUTED, "PROVIDER_REFUSED_422"),
        ("/big", Outcome.UNKNOWN_AFTER_DISPATCH, "EGRESS_BODY_TOO_LARGE"),
        ("/big-chunked", Outcome.UNKNOWN_AFTER_DISPATCH, "EGRESS_BODY_TOO_LARGE"),
    ],
)
async def test_odd_answers_are_classified_without_inference(
    odd_server: tuple[str, list[str]],
    path: str,
    outcome: Outcome,
    code: str,
) -> None:
    base, paths = odd_server
    guard = guard_for(base, path=path, lookup=None)
    registry, _ = build(base, guard.client, path=path, lookup=None)
    report, _ = await run(registry, "odd-1")
    assert report.outcome is outcome
    assert report.reason_codes == (code,)
    assert report.dispatched is True
    assert paths == [path]  # asked once; nothing followed
    expected = [code] if code.startswith("EGRESS_") else []
    assert guard.refusals == expected


async def test_a_redirect_is_reported_with_whether_it_leaves_the_origin(
    odd_server: tuple[str, list[str]],
) -> None:
    base, _ = odd_server
    guard = guard_for(base, path="/redirect", lookup=None)
    registry, _ = build(base, guard.client, path="/redirect", lookup=None)
    await run(registry, "odd-2")
    assert guard.security.named("EGRESS_REFUSED") == [
        {"origin": base, "code": "EGRESS_REDIRECT_REFUSED", "leaves_origin": False}
    ]


async def test_reconcile_quotes_the_key_and_reads_errors_as_unknown(
    odd_server: tuple[str, list[str]],
) -> None:
    base, paths = odd_server
    lookup = "/lookup/{idempotency_key}"
    guard = guard_for(base, lookup=lookup)
    _, handler = build(base, guard.client, lookup=lookup)
    assert (
        await handler.reconcile("a b?c&d=e#f", intent_hash=IH)
    ).status is ReconcileStatus.NOT_EXECUTED
    assert paths == ["/lookup/a%20b%3Fc%26d%3De%23f"]
    assert await handler.reconcile("boom", intent_hash=IH) == ReconcileResult(
        ReconcileStatus.UNKNOWN, reason_code="LOOKUP_STATUS_500"
    )
    # A key with a separator, a percent sign or a dot segment would reach the guard as an
    # encoded separator it refuses: the handler answers unknown itself and asks nothing.
    for key in ("a/b", "50%", "a\\b", ".."):
        assert await handler.reconcile(key, intent_hash=IH) == ReconcileResult(
            ReconcileStatus.UNKNOWN, reason_code="LOOKUP_KEY_UNREPRESENTABLE"
        )
    assert paths == ["/lookup/a%20b%3Fc%26d%3De%23f", "/lookup/boom"]
    assert guard.refusals == []


# -- units -----------------------------------------------------------------------------------


def test_provider_reason_is_sanitised() -> None:
    assert provider_reason(422, b'{"code": "INSUFFICIENT_FUNDS"}') == "INSUFFICIENT_FUNDS"
    assert provider_reason(400, b'{"code": "insufficient-funds"}') == "INSUFFICIENT_FUNDS"
    # too long is replaced, never cut short (a cut secret would hide from the redactor)
    assert provider_reason(400, json.dumps({"code": "A" * 100}).encode()) == "PROVIDER_REFUSED_400"
    assert provider_reason(400, json.dumps({"code": "A" * 64}).encode()) == "A" * 64
    assert provider_reason(400, b'{"code": 7}') == "PROVIDER_REFUSED_400"
    assert provider_reason(403, b"<html>denied</html>") == "PROVIDER_REFUSED_403"
    assert provider_reason(400, b'["INSUFFICIENT_FUNDS"]') == "PROVIDER_REFUSED_400"
    assert provider_reason(400, b'{"code": "\\r\\nSet-Cookie: x"}') == "SET_COOKIE_X"


async def test_static_header_credential_reads_the_secret_only_when_asked() -> None:
    handle = secret()
    credential = StaticHeaderCredential("X-Api-Key", handle)
    assert TOKEN not in repr(credential)
    headers = await credential.headers_for(
        method="POST", url="https://p/x", body=b"{}", idempotency_key="k", intent_hash="sha256:0"
    )
    assert headers == {"x-api-key": TOKEN}
    # the one list the configuration checks DOWNSTREAM_CREDENTIAL_HEADER against, too
    unusable = [*sorted(RESERVED_HEADERS), "X-Agent-Safe-Other", "bad header", "X-Api-Key\n"]
    for reserved in unusable:
        with pytest.raises(ConfigError):
            StaticHeaderCredential(reserved, handle)
    broken = StaticHeaderCredential("X-Api-Key", secret("value\r\nX-Evil: 1"))
    with pytest.raises(Exception, match="unusable") as err:
        await broken.headers_for(
            method="POST", url="https://p/x", body=b"", idempotency_key="k", intent_hash=""
        )
    assert "Evil" not in str(err.value)


def test_handler_configuration_is_validated() -> None:
    transport = guard_for("http://127.0.0.1:1").client
    with pytest.raises(ConfigError) as err:
        build("http://127.0.0.1:1", transport, timeout_ms=15_001)
    assert err.value.variable == "DOWNSTREAM_TIMEOUT_MS"
    with pytest.raises(ConfigError) as lookup:
        build("http://127.0.0.1:1", transport, lookup="/payouts/lookup")
    assert lookup.value.variable == "DOWNSTREAM_LOOKUP_URL"


def test_loopback_hosts() -> None:
    for host in ("localhost", "LOCALHOST", "127.0.0.1", "127.8.9.10", "::1", "[::1]"):
        assert is_loopback_host(host)
    for host in ("example.com", "10.0.0.1", "0.0.0.0", "localhost.example.com", "::"):
        assert not is_loopback_host(host)


# -- signed lookups (issue 16, item 3) ---------------------------------------------------------


def _signed_credential() -> tuple[Any, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentsafe.executor.egress.credentials import SignedRequestCredential

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    handle = SecretHandle("DOWNSTREAM_SIGNING_KEY", bytearray(pem))
    return SignedRequestCredential(key_id="executor-1", signing_key=handle), key.public_key()


async def test_a_signed_lookup_covers_the_five_components_with_the_attempts_intent_hash(
    provider: SyntheticProvider, guard: Guard
) -> None:
    from agentsafe.executor.provider import MemorySeenStore, verify_provider_request
    from agentsafe.executor.tools.synthetic_credentials import CredentialRequirement

    credential, public = _signed_credential()
    handler = ForwardRequestHandler(
        url=provider.base_url + PATH,
        lookup_url=provider.base_url + LOOKUP,
        timeout_ms=5_000,
        transport=guard.client,
        credential=credential,
        parameters_schema=SCHEMA,
    )
    seen: list[tuple[str, list[tuple[str, str]]]] = []

    class Recording(CredentialRequirement):
        def check(self, **kw: Any) -> Any:
            seen.append((kw["path"], kw["headers"]))
            return super().check(**kw)

    provider.require = Recording(kind="SIGNED_REQUEST", keys={"executor-1": public})
    assert (await handler.reconcile("never-sent", intent_hash=IH)) == ReconcileResult(
        ReconcileStatus.NOT_EXECUTED
    )
    assert provider.refusals == []
    [(path, headers)] = seen
    verdict = verify_provider_request(
        method="GET",
        path=path,
        headers=headers,
        body=b"",
        keys={"executor-1": public},
        authority_jwks={},
        now=__import__("time").time(),
        seen_store=MemorySeenStore(),
        required_components=(
            "@method",
            "@path",
            "content-digest",
            "idempotency-key",
            "x-agent-safe-intent-hash",
        ),
    )
    assert verdict.accepted, verdict
    sent = {name.lower(): value for name, value in headers}
    assert sent["x-agent-safe-intent-hash"] == IH
    assert sent["idempotency-key"] == "never-sent"


async def test_a_lookup_the_credential_cannot_sign_is_reported_not_swallowed(
    provider: SyntheticProvider, guard: Guard
) -> None:
    credential, _ = _signed_credential()
    handler = ForwardRequestHandler(
        url=provider.base_url + PATH,
        lookup_url=provider.base_url + LOOKUP,
        timeout_ms=5_000,
        transport=guard.client,
        credential=credential,
        parameters_schema=SCHEMA,
    )
    security = MemorySink()
    registry = Registry(security=security)
    registry.register("create_payout", handler)
    registry.seal()
    # An empty intent hash is what the lookup used to sign; the signing module refuses it.
    answer = await registry.reconcile("create_payout", "k-1", intent_hash="")
    assert answer == ReconcileResult(ReconcileStatus.UNKNOWN, reason_code="SIGNATURE_INPUT_INVALID")
    assert security.named("RECONCILE_LOOKUP_FAILED") == [
        {"action": "create_payout", "code": "SIGNATURE_INPUT_INVALID"}
    ]
    assert provider.received == []


async def test_a_lookup_for_another_intent_is_refused_by_the_provider(
    provider: SyntheticProvider, guard: Guard
) -> None:
    registry, handler = build(provider.base_url, guard.client)
    _, ctx = await run(registry, "payout-21")
    assert (await handler.reconcile("payout-21", intent_hash=ctx.intent.intent_hash)).status is (
        ReconcileStatus.COMPLETED
    )
    assert await handler.reconcile("payout-21", intent_hash=IH) == ReconcileResult(
        ReconcileStatus.UNKNOWN, reason_code="LOOKUP_STATUS_409"
    )


class Answering:
    """A transport that answers every POST with one fixed response (no socket)."""

    def __init__(self, response: HttpResponse) -> None:
        self.response = response

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float,
    ) -> HttpResponse:
        return self.response

    async def close(self) -> None:
        return None


RECEIPT = "eyJhbGciOiJFZERTQSJ9.eyJzdGF0dXMiOiJSRUZVU0VEIn0.c2lnbmF0dXJlLWJ5dGVz"


async def test_a_refusals_receipt_is_carried_screened_to_the_report() -> None:
    refusal = HttpResponse(
        422, {"x-agent-safe-effect-receipt": RECEIPT}, b'{"code": "INSUFFICIENT_FUNDS"}'
    )
    registry, _ = build("http://127.0.0.1:9", Answering(refusal))
    report, _ = await run(registry, "refused-with-receipt")
    assert report.outcome is Outcome.DEFINITELY_NOT_EXECUTED
    assert report.effect_receipt == RECEIPT  # verbatim, for the finalization
    # Not the shape of a compact JWS: not carried, but never taken for no receipt at all
    # (issue 30, item 17): the marker stands for it and verifies as nothing.
    odd = HttpResponse(422, {"x-agent-safe-effect-receipt": "not a jws"}, b'{"code": "NO"}')
    registry, _ = build("http://127.0.0.1:9", Answering(odd))
    report, _ = await run(registry, "refused-odd-receipt")
    assert report.effect_receipt == INVALID_RECEIPT
    bare = HttpResponse(422, {}, b'{"code": "NO"}')
    registry, _ = build("http://127.0.0.1:9", Answering(bare))
    report, _ = await run(registry, "refused-no-receipt")
    assert report.effect_receipt is None
    # A receipt that reflects a secret is withheld like every provider string.
    handler = ForwardRequestHandler(
        url="http://127.0.0.1:9/payouts",
        lookup_url=None,
        timeout_ms=5_000,
        transport=Answering(refusal),
        credential=None,
        parameters_schema=SCHEMA,
    )
    security = MemorySink()
    screened = Registry(
        security=security, screen=lambda text: text.replace("c2lnbmF0dXJl", "[REDACTED]")
    )
    screened.register("create_payout", handler)
    screened.seal()
    report, _ = await run(screened, "refused-secret-receipt")
    assert report.effect_receipt is None
    assert security.named("PROVIDER_STRING_WITHHELD")[0]["field"] == "effect_receipt"
