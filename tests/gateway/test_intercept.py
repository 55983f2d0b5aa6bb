"""The gateway's pure parts: the one path, the body as read, method overrides, hop-by-hop
headers, the screens of an answer, and the held requests' immutability."""

from __future__ import annotations

import base64
import random
import string

import pytest

from agentsafe.executor.codes import Code
from agentsafe.executor.egress.transport import HttpResponse
from agentsafe.executor.evidence.redact import Redactor
from agentsafe.executor.gateway.forward import Exchange, Exchanges
from agentsafe.executor.gateway.intercept import (
    UNREADABLE,
    forwardable_headers,
    normalised_path,
    overrides_method,
    read_body,
    refusal_for,
    response_headers,
)
from agentsafe.executor.gateway.screen import (
    SCREENED_BODY_BYTES,
    _holds_half_of,
    echoes,
    withheld_field,
)

SECRET = "demo-0123456789abcdef"


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/", "/"),
        ("/pay", "/pay"),
        ("/pay/", "/pay/"),
        ("/%61dmin/users", "/admin/users"),
        ("/%41%44MIN", "/ADMIN"),
        ("/p%7eay", "/p~ay"),
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/a%20b", "/a%20b"),
        ("/pay?x=%2F..", "/pay"),
        ("/a:b@c!$&'()*+,=", "/a:b@c!$&'()*+,="),
    ],
)
def test_the_normalised_path(target: str, path: str) -> None:
    assert normalised_path(target) == path


@pytest.mark.parametrize(
    "target",
    [
        "",
        "*",
        "pay",
        "http://elsewhere/pay",
        "//a",
        "/a//b",
        "/./a",
        "/a/.",
        "/x/../a",
        "/a/..",
        "/%2e/a",
        "/%2E%2e/a",
        "/.%2e/a",
        "/x%2f..%2fa",
        "/a%2Fb",
        "/a%5cb",
        "/a\\b",
        "/a%25/b",
        "/a%252e/b",
        "/a%00b",
        "/a%0d%0ab",
        "/a%7f",
        "/a%zz",
        "/a%2",
        "/a%",
        "/admin;x/users",
        "/..;/admin",
        "/a b",
        '/a"b',
        "/a<b>",
        "/caf\u00e9",
    ],
)
def test_an_ambiguous_target_has_no_path(target: str) -> None:
    assert normalised_path(target) is None


def test_the_body_as_the_policy_reads_it() -> None:
    assert read_body(b"") is None
    assert read_body(b'{"amountMinor": 900000}') == {"amountMinor": 900000}
    assert read_body(b"[1, 2]") == [1, 2]
    assert read_body(b'{"a": 1}', "text/plain; charset=utf-8") == {"a": 1}
    assert read_body(b'"x&amountMinor=900000"', "Application/X-WWW-Form-Urlencoded") is UNREADABLE
    assert read_body(b'{"a": 1}', "multipart/form-data; boundary=b") is UNREADABLE
    assert read_body(b"", "application/x-www-form-urlencoded") is None
    for unreadable in (
        b"amountMinor=900000",
        b'{"a": 1e400}',
        b'{"a": 9007199254740992}',
        b'{"a": NaN}',
        b'{"a": 1, "a": 2}',
        b'{"a": "\\ud800"}',
        b"\xff",
        b"[" * 100_000,
    ):
        assert read_body(unreadable) is UNREADABLE, unreadable


def test_method_overrides_are_found() -> None:
    headers = [("X-HTTP-Method-Override", "DELETE")]
    assert refusal_for("POST", headers) is Code.GATEWAY_METHOD_OVERRIDE_REFUSED
    assert refusal_for("GET", [("x-http-method", "DELETE")]) is Code.GATEWAY_METHOD_OVERRIDE_REFUSED
    assert (
        refusal_for("POST", [("X-Method-Override", "PUT")]) is Code.GATEWAY_METHOD_OVERRIDE_REFUSED
    )
    assert refusal_for("POST", [("x-other", "DELETE")]) is None
    assert overrides_method("_method=DELETE", None)
    assert overrides_method("a=1&%5Fmethod=DELETE", None)
    assert overrides_method("_METHOD=DELETE", None)
    assert overrides_method("a=1;_method=DELETE", None)
    assert overrides_method("_method", None)
    assert overrides_method("%5f%6Dethod=DELETE", None)
    assert overrides_method("", {"_method": "DELETE"})
    assert not overrides_method("method=x", {"method": "x"})


def test_hop_by_hop_headers_and_those_connection_names_are_dropped() -> None:
    sent = [
        ("Connection", "keep-alive, X-Drop"),
        ("connection", "x-also"),
        ("X-Drop", "1"),
        ("X-Also", "2"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Authorization", "Basic x"),
        ("TE", "trailers"),
        ("X-Kept", "3"),
        ("Content-Type", "application/json"),
        ("X-Agent-Safe-Grant-Id", "forged"),
    ]
    assert forwardable_headers(sent) == {"x-kept": "3", "content-type": "application/json"}
    answer = {"connection": "x-up", "x-up": "1", "x-kept": "2", "transfer-encoding": "chunked"}
    assert response_headers(answer) == {"x-kept": "2"}


def test_the_callers_trace_context_passes_through_the_gateway() -> None:
    """traceparent and tracestate are headers the executor writes (headers.TRACE_HEADERS), yet
    the caller's are forwarded: with tracing off the gateway is transparent to a trace, as it
    was; with tracing on its forward replaces them with its own span's (docs/tracing.md)."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sent = [("traceparent", parent), ("Tracestate", "congo=t61rcWkgMzE"), ("X-Kept", "3")]
    assert forwardable_headers(sent) == {
        "traceparent": parent,
        "tracestate": "congo=t61rcWkgMzE",
        "x-kept": "3",
    }


def _screen() -> Redactor:
    redactor = Redactor(credential_headers=["x-agentsafe-demo-credential"])
    redactor.set_secret("DOWNSTREAM_CREDENTIAL", SECRET.encode())
    return redactor


def _withheld(headers: dict[str, str], body: bytes) -> str | None:
    redactor = _screen()
    return withheld_field(
        HttpResponse(200, headers, body), lambda t: redactor.redact(t, jws=False)[0]
    )


def test_the_redactor_screens_every_header_and_the_body() -> None:
    assert _withheld({"x-echo": SECRET}, b"") == "header:x-echo"
    assert _withheld({"location": f"http://x/cb?c={SECRET}"}, b"") == "header:location"
    assert _withheld({}, f'{{"seen": "{SECRET}"}}'.encode()) == "body"
    assert _withheld({}, base64.b64encode(SECRET.encode())) == "body"
    assert _withheld({}, b"\x00\xff" + SECRET.encode() + b"\xfe") == "body"
    escaped = "".join(f"\\u{ord(c):04x}" for c in SECRET)
    assert _withheld({}, f'{{"seen": "{escaped}"}}'.encode()) == "body"
    assert _withheld({}, b'{"Authorization": "Bearer abcdefghijklmnop"}') == "body"
    assert _withheld({}, b'{"ok": true, "id": "acct-1"}') is None
    # A challenge names its scheme: not a bearer token.
    challenge = {"www-authenticate": 'Bearer realm="api", error="invalid_token"'}
    assert _withheld(challenge, b'{"error": "unauthorized"}') is None
    # A body over the bound is left to the exact check of the values sent.
    big = b" " * SCREENED_BODY_BYTES + SECRET.encode()
    assert _withheld({}, big) is None
    assert echoes(HttpResponse(200, {}, big), [SECRET]) == "body"


def test_an_echo_of_a_value_sent_is_found_in_any_form_and_in_part() -> None:
    def found(body: bytes, headers: dict[str, str] | None = None) -> str | None:
        return echoes(HttpResponse(200, headers or {}, body), ["Bearer " + SECRET])

    half = SECRET[: len(SECRET) // 2 + 1]
    assert found(SECRET.encode()) == "body"
    assert found(f"prefix {half} suffix".encode()) == "body"
    assert found(SECRET[5:].upper().encode()) == "body"
    assert found(base64.b64encode(SECRET.encode())) == "body"
    assert found(base64.urlsafe_b64encode(SECRET.encode()).rstrip(b"=")) == "body"
    assert found(SECRET.encode().hex().upper().encode()) == "body"
    escaped = "".join(f"\\u{ord(c):04x}" for c in SECRET)
    assert found(f'["{escaped}"]'.encode()) == "body"
    assert found(b"", {"x-seen": half}) == "header:x-seen"
    assert found(SECRET[:7].encode()) is None, "a run shorter than half is not an echo"
    assert found(b"Bearer demo-") is None, "the scheme word is not the credential"
    assert echoes(HttpResponse(200, {}, SECRET.encode()), []) is None


def test_the_anchored_search_agrees_with_every_window() -> None:
    rng = random.Random(30)
    alphabet = "ab"  # a small alphabet: many near-misses
    for _ in range(400):
        form = "".join(rng.choice(alphabet) for _ in range(rng.randint(8, 40)))
        text = "".join(rng.choice(alphabet + string.digits) for _ in range(rng.randint(0, 80)))
        h = max(8, len(form) // 2)
        brute = any(form[i : i + h] in text for i in range(len(form) - h + 1))
        assert _holds_half_of(form, text) == brute, (form, text)


def _exchange(note: str = "seen", body: bytes = b"{}") -> Exchange:
    return Exchange("DELETE", "/accounts/7", "", {"x-note": note}, body)


def test_a_held_request_is_never_replaced_until_its_intent_expires() -> None:
    exchanges = Exchanges()
    held = _exchange()
    exchanges.hold("k", held, until=100.0, now=0.0)
    assert exchanges.put("k", _exchange("swapped"), now=50.0) is held
    assert exchanges.put("k", _exchange(body=b'{"other": 1}'), now=50.0) is held
    assert exchanges.get("k") is held
    assert held.same_request(_exchange())
    assert not held.same_request(_exchange("swapped"))
    in_flight = _exchange()
    assert exchanges.put("f", in_flight) is None
    assert exchanges.put("f", _exchange("other")) is in_flight
    fresh = _exchange("new")
    assert exchanges.put("k", fresh, now=100.0) is None, "an expired hold is gone"
    assert exchanges.get("k") is fresh
