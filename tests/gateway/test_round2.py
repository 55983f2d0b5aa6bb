"""Issue 30, items 1-8: ``agentsafe proxy`` as a real process in front of a real upstream on
loopback that echoes what it received (as httpbin's ``/anything`` does), attacked the way the
adversarial review attacked it."""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.gateway.test_proxy import (
    Proxy,
    raw,
    start_configured_gateway,
    start_proxy,
    status_and_json,
)

CREDENTIAL_HEADER = "x-agentsafe-demo-credential"  # the demo authority's downstream credential


@dataclass
class EchoUpstream:
    """A real upstream that records every request and, by the first path segment, echoes it:
    ``/body``: every request header in the JSON body (httpbin's ``/anything``); ``/header``:
    every request header value in a response header; ``/partial``: the first half of every
    request header value; ``/b64``: each value base64-encoded; ``/escaped``: the headers as
    JSON with every character ``\\u``-escaped; ``/redirect``: a 302 whose Location carries the
    values; ``/hop``: a response header its own ``Connection`` names; anything else: a plain
    answer."""

    received: list[tuple[str, str, bytes, dict[str, str]]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> None:
        async def anything(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.received.append((request.method, request.raw_path, body, headers))
            kind = request.raw_path.split("/")[1].split("?")[0]
            status = 201 if request.method == "POST" else 200
            if kind == "body":
                return web.json_response(
                    {"headers": headers, "url": request.raw_path}, status=status
                )
            if kind == "header":
                out = {f"x-echo-{n}": v for n, v in headers.items() if n.startswith("x-")}
                return web.json_response({"ok": True}, status=status, headers=out)
            if kind == "partial":
                halves = [v[: len(v) // 2 + 1] for v in headers.values()]
                return web.Response(text="seen: " + " | ".join(halves), status=status)
            if kind == "b64":
                encoded = [base64.b64encode(v.encode()).decode() for v in headers.values()]
                return web.Response(text="seen: " + " ".join(encoded), status=status)
            if kind == "escaped":
                text = (
                    "{"
                    + ",".join(
                        '"' + n + '":"' + "".join(f"\\u{ord(c):04x}" for c in v) + '"'
                        for n, v in headers.items()
                    )
                    + "}"
                )
                return web.Response(text=text, status=status, content_type="application/json")
            if kind == "redirect":
                location = "http://127.0.0.1:9/cb?" + "&".join(
                    f"{n}={v}" for n, v in headers.items()
                )
                return web.Response(status=302, headers={"Location": location})
            if kind == "hop":
                return web.json_response(
                    {"ok": True},
                    status=status,
                    headers={"Connection": "keep-alive, x-upstream-hop", "x-upstream-hop": "1"},
                )
            return web.json_response({"upstream": "real"}, status=status)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def echo() -> AsyncIterator[EchoUpstream]:
    server = EchoUpstream()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def gateway(tmp_path: Path, echo: EchoUpstream) -> AsyncIterator[Proxy]:
    proxy = await start_proxy(tmp_path, echo, "--enforce")  # type: ignore[arg-type]
    yield proxy
    proxy.stop()


def request(method: str, target: str, body: bytes = b"", *headers: str) -> bytes:
    """One request's exact bytes: what a raw client sends, unnormalised."""
    head = [f"{method} {target} HTTP/1.1", "Host: x", "Connection: close"]
    head += list(headers)
    if body or method in ("POST", "PUT", "PATCH"):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


# -- 1. the downstream credential never reaches the agent ---------------------------------------


async def test_the_downstream_credential_never_reaches_the_agent(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    kinds = ["body", "header", "partial", "b64", "escaped", "redirect"]
    for n, kind in enumerate(kinds):
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{gateway.url}/{kind}/echo", json={"amountMinor": 1}) as r,
        ):
            status = r.status
            seen = (await r.read()).decode("latin-1")
            answer_headers = "\n".join(f"{k}: {v}" for k, v in r.headers.items())
        assert len(echo.received) == n + 1, "the ALLOWed request was forwarded once"
        credential = echo.received[n][3][CREDENTIAL_HEADER]
        material = credential.removeprefix("demo-")
        everything = seen + "\n" + answer_headers
        for form in (
            credential,
            material,
            credential[: len(credential) // 2 + 1],
            base64.b64encode(credential.encode()).decode(),
        ):
            assert form not in everything, f"{kind}: the agent saw the credential"
        assert status == 502, (kind, seen)
        refused = json.loads(seen)
        if kind == "redirect":  # the egress guard never follows or relays a redirect
            assert refused["error"]["code"] == "GATEWAY_OUTCOME_UNKNOWN"
            continue
        assert refused["error"]["code"] == "GATEWAY_ANSWER_WITHHELD", kind
        assert refused["upstream_status"] == 201, "the agent learns the request was carried out"
        assert refused["intent_hash"]
    assert any("answer withheld" in line for line in gateway.lines())


async def test_in_shadow_the_processs_redactor_screens_what_is_passed_through(
    tmp_path: Path, echo: EchoUpstream
) -> None:
    proxy = await start_proxy(tmp_path, echo)  # type: ignore[arg-type]
    try:
        async with aiohttp.ClientSession() as session:
            for send in (session.post, session.get):
                async with send(
                    f"{proxy.url}/body/echo",
                    headers={"authorization": "Bearer abcdefghijklmnopqrstuvwxyz012345"},
                ) as r:
                    assert r.status == 502
                    seen = await r.text()
                assert "abcdefghijklmnop" not in seen
                assert json.loads(seen)["error"]["code"] == "GATEWAY_ANSWER_WITHHELD"
    finally:
        proxy.stop()
    assert len(echo.received) == 2, "in shadow both were carried out as before"


async def test_an_answer_without_a_credential_is_relayed_untouched(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/plain", json={"amountMinor": 1}) as r,
    ):
        assert r.status == 201
        assert await r.json() == {"upstream": "real"}


# -- 2. one path: what the policy judges is what is forwarded -----------------------------------


async def test_an_encoded_path_is_judged_as_the_path_the_upstream_routes(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    status, body = status_and_json(
        await raw(gateway.port, request("POST", "/%61dmin/users", b"{}"))
    )
    assert (status, body["error"]["code"]) == (403, "GATEWAY_BLOCKED")
    assert body["reason_codes"] == ["DEMO_ADMIN_PATH"]
    assert echo.received == []
    # an escape of an unreserved character is decoded, others are upper-cased: forwarded as judged
    status, _ = status_and_json(
        await raw(gateway.port, request("POST", "/p%7eay/caf%c3%a9", b"{}"))
    )
    assert status == 201
    assert [p for _, p, _, _ in echo.received] == ["/p~ay/caf%C3%A9"]


AMBIGUOUS = [
    "//a",
    "/./a",
    "/x/../a",
    "/%2e/a",
    "/%2E%2E/admin",
    "/x%2f..%2fa",
    "/a%2Fb",
    "/a%5cb",
    "/a\\b",
    "/a%25/b",
    "/a%00b",
    "/a%zz",
    "/admin;x/users",
    "/..;/admin",
    "http://elsewhere/pay",
]


async def test_an_ambiguous_path_is_refused_with_a_code(gateway: Proxy, echo: EchoUpstream) -> None:
    for target in AMBIGUOUS:
        for method in ("POST", "GET"):
            body = b"{}" if method == "POST" else b""
            data = await raw(gateway.port, request(method, target, body))
            status, answer = status_and_json(data)
            assert (status, answer["error"]["code"]) == (400, "GATEWAY_PATH_AMBIGUOUS"), target
            assert target.encode() not in data, "nothing of the request is echoed"
    assert echo.received == []


# -- 5. no anonymous client can halt the gateway ------------------------------------------------


async def test_paths_and_answers_the_outbound_guard_refuses_never_halt_the_gateway(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    for _ in range(2):
        for target in ("//a", "/./a", "/x/../a", "/%2e/a", "/x%2f..%2fa"):
            for method in ("POST", "GET"):
                body = b"{}" if method == "POST" else b""
                await raw(gateway.port, request(method, target, body))
    # An upstream's redirect is refused by the guard (never followed, never relayed), whoever
    # asked for it: the client chose the path, so it does not count towards a halt either.
    for _ in range(7):
        await raw(gateway.port, request("POST", "/redirect/x", b"{}"))
        await raw(gateway.port, request("GET", "/redirect/x"))
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/pay", json={"amountMinor": 1}) as r,
    ):
        assert r.status == 201, await r.text()
    async with aiohttp.ClientSession() as session, session.get(f"{gateway.url}/pay") as r:
        assert r.status == 200, await r.text()


# -- 3. method overrides -------------------------------------------------------------------------


OVERRIDES = [
    ("POST", "/accounts/7/close", b"{}", ("X-HTTP-Method-Override: DELETE",)),
    ("GET", "/accounts/7", b'{"why": "x"}', ("X-HTTP-Method: DELETE",)),
    ("POST", "/accounts/7", b"{}", ("X-Method-Override: DELETE",)),
    ("POST", "/accounts/7", b"{}", ("x-http-method-override: delete",)),
    ("POST", "/accounts/7?_method=DELETE", b"{}", ()),
    ("POST", "/accounts/7?%5Fmethod=DELETE", b"{}", ()),
    ("POST", "/accounts/7", b'{"_method": "DELETE"}', ("Content-Type: application/json",)),
    ("GET", "/accounts/7?_method=DELETE", b"", ()),
]


async def test_a_method_override_is_refused(gateway: Proxy, echo: EchoUpstream) -> None:
    for method, target, body, headers in OVERRIDES:
        data = await raw(gateway.port, request(method, target, body, *headers))
        status, answer = status_and_json(data)
        assert (status, answer["error"]["code"]) == (400, "GATEWAY_METHOD_OVERRIDE_REFUSED"), (
            method,
            target,
            headers,
        )
    assert echo.received == []


async def test_a_read_that_passes_unbound_may_not_carry_a_body(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    status, answer = status_and_json(
        await raw(gateway.port, request("GET", "/accounts/7", b'{"close": true}'))
    )
    assert (status, answer["error"]["code"]) == (400, "GATEWAY_READ_BODY_REFUSED")
    assert echo.received == []


# -- 4. a body the policy cannot read is never allowed unread ------------------------------------


async def test_json_sent_as_another_media_type_is_read_by_the_policy(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    for media in ("text/plain", "application/octet-stream", "application/json; charset=utf-8"):
        status, answer = status_and_json(
            await raw(
                gateway.port,
                request("POST", "/pay", b'{"amountMinor": 900000}', f"Content-Type: {media}"),
            )
        )
        assert (status, answer["error"]["code"]) == (403, "GATEWAY_BLOCKED"), media
        assert answer["reason_codes"] == ["DEMO_AMOUNT_ABOVE_LIMIT"]
    assert echo.received == []


UNREADABLE = [
    (b"amountMinor=900000", "application/x-www-form-urlencoded"),
    (b'{"amountMinor": 900000}', "application/x-www-form-urlencoded"),
    (b'"x&amountMinor=900000&y"', "application/x-www-form-urlencoded; charset=utf-8"),
    (b'{"amountMinor": 900000}', "multipart/form-data; boundary=x"),
    (b'{"amountMinor": 1e400}', "application/json"),
    (b'{"amountMinor": 90000000000000000000000}', "application/json"),
    (b'{"amountMinor": 9e99999}', "application/json"),
    (b'{"amountMinor": NaN}', "application/json"),
    (b'{"amountMinor": 1, "amountMinor": 900000}', "application/json"),
    (b'{"amountMinor": 900000', "application/json"),
    (b"\xff\xfe{}", "application/json"),
    (b"amount 900000", "text/plain"),
]


async def test_a_body_the_policy_cannot_read_is_refused(gateway: Proxy, echo: EchoUpstream) -> None:
    for body, media in UNREADABLE:
        status, answer = status_and_json(
            await raw(gateway.port, request("POST", "/pay", body, f"Content-Type: {media}"))
        )
        assert (status, answer["error"]["code"]) == (422, "GATEWAY_BODY_UNREADABLE"), body
        assert b"900000" not in json.dumps(answer).encode(), "nothing of the body is echoed"
    assert echo.received == []


# -- 7. hop-by-hop -------------------------------------------------------------------------------


async def test_headers_named_in_connection_are_not_forwarded_either_way(
    gateway: Proxy, echo: EchoUpstream
) -> None:
    data = await raw(
        gateway.port,
        request(
            "POST",
            "/hop",
            b"{}",
            "X-Drop-Me: 1",
            "X-Also-Dropped: 2",
            "Keep-Alive: timeout=5",
            "Proxy-Authorization: Basic Zm9vOmJhcg==",
            "X-Kept: 3",
        ).replace(b"Connection: close", b"Connection: close, X-Drop-Me,x-also-dropped"),
    )
    assert data.startswith(b"HTTP/1.1 201"), data
    seen = echo.received[0][3]
    assert "x-drop-me" not in seen
    assert "x-also-dropped" not in seen
    assert "keep-alive" not in seen
    assert "proxy-authorization" not in seen
    assert seen["x-kept"] == "3"
    head = data.partition(b"\r\n\r\n")[0].lower()
    assert b"x-upstream-hop" not in head, "the upstream's own hop-by-hop header is not relayed"


# -- 6. a held request is immutable --------------------------------------------------------------


async def test_a_held_request_cannot_be_swapped_and_is_forwarded_as_the_approver_saw_it(
    tmp_path: Path, echo: EchoUpstream
) -> None:
    from agentsafe.executor.gateway.demo import DEMO_POLICY

    policy = DEMO_POLICY.replace("approvers: [demo-approver]", "approvers: [treasury-lead]")
    process, port, control_port, principals = await start_configured_gateway(
        tmp_path,
        echo,  # type: ignore[arg-type]
        mode="ENFORCEMENT",
        policy_text=policy,
        EXECUTOR_ESCALATION="APPROVAL",
    )
    routes = f"http://127.0.0.1:{control_port}"
    gateway_url = f"http://127.0.0.1:{port}/plain/accounts/7"

    def bearer(principal: str) -> dict[str, str]:
        return {"authorization": f"Bearer {principals.token(principal)}"}

    key = {"Idempotency-Key": "close-account-7"}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.delete(
                gateway_url, json={"why": "closing"}, headers={**key, "x-note": "seen"}
            ) as r:
                assert r.status == 202
                escalation = (await r.json())["escalation"]

            async def swap(headers: dict[str, str], body: Any) -> None:
                async with session.delete(gateway_url, json=body, headers={**key, **headers}) as r:
                    assert r.status == 409, await r.text()
                    answer = await r.json()
                    assert answer["error"]["code"] == "GATEWAY_HELD_REQUEST_CONFLICT"

            await swap({"x-note": "swapped", "x-extra": "1"}, {"why": "closing"})
            await swap({"x-note": "seen"}, {"why": "other"})
            async with session.post(
                f"{routes}/v1/approvals/{escalation['request_id']}",
                json={"decision": "APPROVE", "reason": "the account owner asked"},
                headers=bearer("treasury-lead"),
            ) as r:
                assert r.status == 200, await r.text()
            await swap({"x-note": "swapped after approval"}, {"why": "closing"})
            assert echo.received == [], "nothing forwarded by a conflicting re-send"
            async with session.post(
                f"{routes}/v1/escalations",
                json={"escalation": escalation},
                headers=bearer("treasury-workflow"),
            ) as r:
                assert r.status == 200, await r.text()
                resumed = await r.json()
        assert resumed["outcome"] == "COMPLETED", resumed
        assert len(echo.received) == 1
        method, _, body, headers = echo.received[0]
        assert (method, body) == ("DELETE", b'{"why": "closing"}')
        assert headers["x-note"] == "seen", "forwarded exactly as held"
        assert "x-extra" not in headers
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
