"""Redaction: real secret values, bearer tokens, PEM private keys and compact JWS pushed through
the redactor, both chained streams and operational logs — none escapes, each raises
LEAK_SUSPECTED naming where and what kind, never the value."""

from __future__ import annotations

import base64
import io
import json
import logging
import secrets
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.evidence.chain import ChainedStreams, open_chained_streams
from agentsafe.executor.evidence.chainverify import verify_chain
from agentsafe.executor.evidence.redact import KIND_SECRET, RedactingLogFilter, Redaction, Redactor


def pem_keys() -> list[str]:
    keys: list[Any] = [
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec.generate_private_key(ec.SECP256R1()),
        ed25519.Ed25519PrivateKey.generate(),
    ]
    out = [
        k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        for k in keys
    ]
    out.append(
        keys[0]
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        .decode()
    )
    return out


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def compact_jws() -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    header = b64url(json.dumps({"alg": "EdDSA", "typ": "JWT", "kid": "k1"}).encode())
    payload = b64url(json.dumps({"sub": "grant-1", "exp": 1_900_000_000}).encode())
    signature = b64url(key.sign(f"{header}.{payload}".encode()))
    return f"{header}.{payload}.{signature}"


@pytest.fixture
def redactor() -> Redactor:
    r = Redactor(credential_headers=["X-Provider-Key"])
    r.set_secret("DOWNSTREAM_CREDENTIAL", b"Bearer dwn-7Hq2LmP9xV4nR8sT1kWz")
    r.set_secret("EXECUTOR_AUTH_TOKEN", secrets.token_urlsafe(32).encode())
    return r


def open_streams(redactor: Redactor) -> tuple[ChainedStreams, io.StringIO, io.StringIO]:
    ev, se = io.StringIO(), io.StringIO()
    streams = open_chained_streams(
        evidence_out=ev, security_out=se, clock=ManualClock(), redactor=redactor
    )
    return streams, ev, se


def leaks(se: io.StringIO) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in se.getvalue().splitlines()]
    return [line for line in lines if line["event"] == "LEAK_SUSPECTED"]


def test_a_registered_value_is_found_in_its_natural_forms(redactor: Redactor) -> None:
    value = "dwn-7Hq2LmP9xV4nR8sT1kWz"
    for text in (
        f"sent Authorization: Bearer {value}",
        f"token={value}&x=1",
        f'{{"auth": "{value}"}}',
        f"url https://user:{value}@host/path",
        f"{value}",
        f"  {value}\n",
        f"list [{value}, other]",
    ):
        out, found = redactor.redact(text)
        assert value not in out, text
        assert "[REDACTED:" in out
        assert found
    out, found = redactor.redact("ordinary text, sha256:" + "ab" * 32 + " 2026-03-02T10:00:00.000Z")
    assert found == ()
    assert out.startswith("ordinary text")


def test_shapes_are_found_without_knowing_the_value() -> None:
    r = Redactor(credential_headers=["X-Provider-Key"])
    jws = compact_jws()
    for pem in pem_keys():
        out, found = r.redact(f"key follows\n{pem}\nend")
        assert "PRIVATE KEY" not in out
        assert pem.splitlines()[1] not in out
        assert Redaction("PEM") in found
    out, found = r.redact(f"grant {jws} claimed")
    assert jws.split(".")[2] not in out
    assert found == (Redaction("JWS"),)
    out, found = r.redact("authorization: bearer abc.DEF-ghi_123~+/==")
    assert "abc.DEF" not in out
    assert found == (Redaction("BEARER"),)
    out, found = r.redact('headers {"x-provider-key": "k-123 456", "accept": "json"}')
    assert "k-123" not in out
    assert '"accept": "json"' in out
    assert found == (Redaction("CREDENTIAL_HEADER"),)
    assert r.redact("grant-1.v2.final and a.b.c")[1] == ()


def test_rotation_replaces_the_digest_and_keeps_no_value() -> None:
    r = Redactor()
    old, new = b"old-value-3f9a1c77e2", b"new-value-b81d0e44a6"
    r.set_secret("TOKEN", old)
    assert r.redact(old.decode())[1]
    r.set_secret("TOKEN", new)
    assert r.redact(old.decode())[1] == ()
    assert r.redact(new.decode())[0] == "[REDACTED:SECRET]"
    state = repr(vars(r)).encode()
    assert new not in state
    assert new.hex().encode() not in state
    r.remove_secret("TOKEN")
    assert r.redact(new.decode())[1] == ()
    assert r.secret_names() == ()


def test_a_passphrase_of_short_words_is_found_whatever_the_spacing() -> None:
    r = Redactor()
    r.set_secret("PASSPHRASE", b"correct horse battery staple")
    out, found = r.redact("pw is correct  horse\tbattery staple, ok")
    assert out == "pw is [REDACTED:SECRET], ok"
    assert found == (Redaction("SECRET", "PASSPHRASE"),)


def test_nothing_secret_escapes_either_chained_stream(redactor: Redactor) -> None:
    streams, ev, se = open_streams(redactor)
    token = "dwn-7Hq2LmP9xV4nR8sT1kWz"
    jws = compact_jws()
    pem = pem_keys()[0]
    streams.evidence.emit(
        "OUTCOME",
        {
            "provider_error": f"upstream rejected Bearer {token}",
            "nested": {"headers": {"X-Provider-Key": "raw-provider-key"}, "list": [jws]},
            f"weird {token}": "key carries it",
            "debug": pem,
        },
    )
    streams.security.emit("AUTH_FAILED", {"presented": f"Bearer {token}"})
    text = ev.getvalue() + se.getvalue()
    for needle in (token, "raw-provider-key", jws.split(".")[2], pem.splitlines()[1]):
        assert needle not in text
    found = {(line["stream"], line["field"], line["kind"]) for line in leaks(se)}
    assert ("evidence", "provider_error", "SECRET") in found
    assert ("evidence", "nested.headers.X-Provider-Key", "CREDENTIAL_HEADER") in found
    assert ("evidence", "nested.list[0]", "JWS") in found
    assert ("evidence", "debug", "PEM") in found
    assert ("evidence", "<key>", "SECRET") in found
    assert ("security", "presented", "SECRET") in found
    assert all(line.get("secret_name") != token for line in leaks(se))
    assert verify_chain(ev.getvalue().splitlines()).ok
    assert verify_chain(se.getvalue().splitlines()).ok


def test_a_leak_on_the_security_stream_is_reported_once(redactor: Redactor) -> None:
    streams, _, se = open_streams(redactor)
    streams.security.emit("AUTH_FAILED", {"presented": "Bearer dwn-7Hq2LmP9xV4nR8sT1kWz"})
    events = [json.loads(line)["event"] for line in se.getvalue().splitlines()]
    assert events == ["AUTH_FAILED", "LEAK_SUSPECTED"]


def test_operational_logs_are_redacted_and_raise_leak_suspected(redactor: Redactor) -> None:
    streams, _, se = open_streams(redactor)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.addFilter(RedactingLogFilter(redactor, on_redaction=streams.report_log_redactions))
    logger = logging.getLogger("agentsafe.test.redact")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    token = "dwn-7Hq2LmP9xV4nR8sT1kWz"
    pem = pem_keys()[2]
    try:
        logger.warning("provider said %s with %s", f"Bearer {token}", {"X-Provider-Key": "pk-1"})
        logger.error("loaded key %s", pem)
        try:
            raise RuntimeError(f"connect failed token={token}")
        except RuntimeError:
            logger.exception("dispatch failed")
        logger.info("nothing to hide %d", 42)
    finally:
        logger.removeHandler(handler)
        handler.close()
    text = buffer.getvalue()
    assert token not in text
    assert "pk-1" not in text
    assert pem.splitlines()[1] not in text
    assert "nothing to hide 42" in text
    assert "dispatch failed" in text
    kinds = {(line["stream"], line["kind"]) for line in leaks(se)}
    assert {("log", "SECRET"), ("log", "PEM"), ("log", "CREDENTIAL_HEADER")} <= kinds


ALPHABET = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+/")
CONTEXTS = [
    "{}",
    "token={}",
    "Authorization: Bearer {}",
    '{{"k": "{}"}}',
    "a {} b",
    "?key={}&next=1",
    "user:{}@host",
    "'{}'",
    "[{}]",
    "x,{},y",
    "line1\n{}\nline3",
    "GET https://api.example/v1/{}/items?x=1",
    "k: {}",
]


@settings(max_examples=150, deadline=None)
@given(
    value=st.text(ALPHABET, min_size=12, max_size=64),
    padding=st.sampled_from(["", "=", "=="]),
    context=st.sampled_from(CONTEXTS),
    prefix=st.text(st.sampled_from("abc xyz"), max_size=6),
)
def test_a_registered_value_never_escapes_a_chained_line(
    value: str, padding: str, context: str, prefix: str
) -> None:
    secret = value + padding
    r = Redactor()
    r.set_secret("S", secret.encode())
    streams, ev, se = open_streams(r)
    line = prefix + " " + context.format(secret)
    streams.evidence.emit("OUTCOME", {"detail": line})
    (written,) = [json.loads(text) for text in ev.getvalue().splitlines()]
    assert secret not in written["detail"]
    assert "[REDACTED:SECRET]" in written["detail"]
    for leak in leaks(se):
        assert all(secret not in str(v) for k, v in leak.items() if not k.endswith("hash"))
    assert leaks(se)


# -- transformed forms (issue 16, item 12) ---------------------------------------------------


def test_a_secret_is_found_case_folded_squashed_and_encoded(redactor: Redactor) -> None:
    from urllib.parse import quote, quote_plus

    credential = "Bearer dwn-7Hq2LmP9xV4nR8sT1kWz"
    value = "dwn-7Hq2LmP9xV4nR8sT1kWz"
    snake = "BEARER_DWN_7HQ2LMP9XV4NR8ST1KWZ"  # what the forward handler made of a reflection
    transformed = [
        value.upper(),
        value.lower(),
        credential.upper(),
        value.swapcase(),
        snake,
        snake.lower(),
        "DWN_7HQ2LMP9XV4NR8ST1KWZ",
        base64.b64encode(credential.encode()).decode(),
        base64.b64encode(value.encode()).decode().rstrip("="),
        base64.urlsafe_b64encode(credential.encode()).decode().rstrip("="),
        credential.encode().hex(),
        credential.encode().hex().upper(),
        quote(credential, safe=""),
        quote_plus(credential),
    ]
    for form in transformed:
        for text in (form, f"reason_codes: [{form}]", f'{{"code": "{form}"}}'):
            out, found = redactor.redact(text)
            assert form not in out, text
            assert Redaction(KIND_SECRET, "DOWNSTREAM_CREDENTIAL") in found, text


def test_transformations_do_not_redact_ordinary_codes(redactor: Redactor) -> None:
    for text in ("PROVIDER_REFUSED_422", "INSUFFICIENT_FUNDS", "BEARER", "dwn", "7HQ2"):
        assert redactor.redact(text) == (text, ())


def test_a_jws_can_be_left_alone_when_asked() -> None:
    r = Redactor()
    token = compact_jws()
    assert r.redact(token)[0] == "[REDACTED:JWS]"
    assert r.redact(token, jws=False) == (token, ())


def test_a_secret_with_escaped_characters_is_found_in_either_escape_case() -> None:
    from urllib.parse import quote

    r = Redactor()
    r.set_secret("DOWNSTREAM_CREDENTIAL", b"k3y/with+slash=and-more")
    upper = quote("k3y/with+slash=and-more", safe="")
    assert "%2F" in upper
    for form in (upper, upper.replace("%2F", "%2f").replace("%2B", "%2b").replace("%3D", "%3d")):
        out, found = r.redact(f"lookup?key={form}")
        assert form not in out
        assert found


# The hot path's shortcuts (redact.py) keep the exact results of the plain forms they replace.


@given(st.binary(min_size=1, max_size=64), st.binary(max_size=200))
def test_the_digest_is_hmac_sha256(key: bytes, data: bytes) -> None:
    import hashlib
    import hmac

    from agentsafe.executor.evidence.redact import _hmac_states

    redactor = Redactor()
    redactor._inner, redactor._outer = _hmac_states(key)
    assert redactor._digest(data) == hmac.new(key, data, hashlib.sha256).digest()


@given(st.text(max_size=60))
def test_squashing_is_casefold_then_letters_and_digits(text: str) -> None:
    from agentsafe.executor.evidence.redact import _squashed

    assert _squashed(text) == "".join(ch for ch in text.casefold() if ch.isalnum())


@given(st.text(max_size=40))
def test_the_whitespace_test_is_str_isspace(text: str) -> None:
    if text:
        assert (text.split() != [text]) == any(ch.isspace() for ch in text)


def test_a_text_found_clean_is_scanned_again_once_a_secret_or_header_changes() -> None:
    redactor = Redactor()
    value = "tok-" + secrets.token_hex(12)
    line = f"x-api-key: {value}"
    assert redactor.redact(value) == (value, ())
    assert redactor.redact(line) == (line, ())
    redactor.set_secret("api", value.encode())
    assert redactor.redact(value) == ("[REDACTED:SECRET]", (Redaction(KIND_SECRET, "api"),))
    redactor.remove_secret("api")
    assert redactor.redact(value) == (value, ())
    assert redactor.redact(line) == (line, ())
    redactor.set_credential_headers(["X-Api-Key"])
    assert redactor.redact(line)[0] == "x-api-key: [REDACTED:CREDENTIAL_HEADER]"


def test_the_jws_choice_is_remembered_apart() -> None:
    redactor = Redactor()
    jws = "eyJhbGciOiJFZERTQSJ9.eyJhIjoxfQ.c2lnbmF0dXJl"
    assert redactor.redact(jws, jws=False) == (jws, ())
    assert redactor.redact(jws)[0] == "[REDACTED:JWS]"
    assert redactor.redact(jws, jws=False) == (jws, ())
