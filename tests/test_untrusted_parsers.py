"""Untrusted JSON (a JWKS, a token endpoint's answer, a provider's body) is read by the one
strict reader, ``canonical.parse_json``, with the same refusal each parser always gave.

A key named twice, a number that is not finite, a lone surrogate or nesting past the
interpreter's limit is not JSON to agentsafe, wherever it arrives: the JWKS is refused
(``ValueError``), the token endpoint's answer is DOWNSTREAM_TOKEN_UNAVAILABLE, and a provider's
body yields no reason code and no reference (the fallbacks). Pure functions, no I/O.
"""

from __future__ import annotations

import pytest

from agentsafe.executor.banking import transport as banking_transport
from agentsafe.executor.codes import Code
from agentsafe.executor.dispatch import forward
from agentsafe.executor.door.workload import parse_jwks
from agentsafe.executor.egress import credentials
from agentsafe.executor.egress.credentials import CredentialUnavailable

DEEP = b"[" * 100_000 + b"]" * 100_000
NOT_FINITE = b'{"x": NaN}'
LONE_SURROGATE = b'{"x": "\\ud800"}'


def _bad(duplicate: bytes) -> list[bytes]:
    """A key that matters named twice, then what is bad for every parser alike."""
    return [duplicate, NOT_FINITE, LONE_SURROGATE, DEEP]


@pytest.mark.parametrize("body", _bad(b'{"keys": [], "keys": []}'))
def test_a_jwks_that_is_not_i_json_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        parse_jwks(body)


_TOKEN = b'"access_token": "abc", "token_type": "Bearer", "expires_in": 60'


@pytest.mark.parametrize("body", _bad(b"{" + _TOKEN + b', "access_token": "other"}'))
def test_a_token_answer_that_is_not_i_json_is_unavailable(body: bytes) -> None:
    with pytest.raises(CredentialUnavailable) as caught:
        credentials._parse_token_response(200, body)
    assert caught.value.code == Code.DOWNSTREAM_TOKEN_UNAVAILABLE
    assert "abc" not in caught.value.message


def test_a_good_token_answer_still_reads() -> None:
    assert credentials._parse_token_response(200, b"{" + _TOKEN + b"}") == ("abc", 60.0)


@pytest.mark.parametrize("body", _bad(b'{"code": "FIRST", "code": "SECOND"}'))
def test_a_provider_refusal_that_is_not_i_json_has_no_reason(body: bytes) -> None:
    assert forward.provider_reason(422, body) == "PROVIDER_REFUSED_422"


@pytest.mark.parametrize("body", _bad(b'{"reference": "r-1", "reference": "r-2"}'))
def test_a_provider_answer_that_is_not_i_json_has_no_reference(body: bytes) -> None:
    assert forward._reference(body) is None


@pytest.mark.parametrize("body", _bad(b'{"status": "POSTED", "status": "REJECTED"}'))
def test_a_banking_answer_that_is_not_i_json_is_no_object(body: bytes) -> None:
    assert banking_transport._json_object(body) is None


def test_good_provider_bodies_still_read() -> None:
    assert forward.provider_reason(422, b'{"code": "insufficient-funds"}') == "INSUFFICIENT_FUNDS"
    assert forward._reference(b'{"reference": "r-1"}') == "r-1"
    assert banking_transport._json_object(b'{"status": "POSTED"}') == {"status": "POSTED"}
