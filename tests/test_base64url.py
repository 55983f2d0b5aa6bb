"""The one base64 strictness rule (issue 16): canonical spellings only, both alphabets."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsafe.executor import base64url
from agentsafe.executor.base64url import NotCanonical


@given(st.binary(max_size=80))
def test_every_value_round_trips_in_both_alphabets(data: bytes) -> None:
    assert base64url.decode(base64url.encode(data)) == data
    assert base64url.decode_standard(base64url.encode_standard(data)) == data


@pytest.mark.parametrize(
    "text",
    [
        "QR",  # "QQ" is the canonical spelling of b"A": R has a non-zero trailing bit
        "QUF",  # "QUE" spells b"AA"
        "QQ==",  # padding
        "QQ=",
        "Q",  # length 1 mod 4
        "QQ+/",  # the standard alphabet
        " QQ",
        "QQ\n",
    ],
)
def test_base64url_refuses_every_other_spelling(text: str) -> None:
    with pytest.raises(NotCanonical) as refused:
        base64url.decode(text)
    assert refused.value.code == "BASE64_NOT_CANONICAL"
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(
    "text",
    ["QR==", "QUF=", "QQ", "QUE", "QQ-_", "QQ===", "Q===", "QQ==\n", "QQ== ", "=QQ="],
)
def test_standard_base64_refuses_every_other_spelling(text: str) -> None:
    with pytest.raises(NotCanonical):
        base64url.decode_standard(text)


def test_python_alone_accepts_the_second_spelling() -> None:
    """What the rule adds: binascii decodes both spellings to the same bytes."""
    assert base64.urlsafe_b64decode("QR==") == base64.urlsafe_b64decode("QQ==") == b"A"
    assert base64.b64decode("QR==", validate=True) == b"A"
    assert base64url.decode("QQ") == b"A"
    assert base64url.decode_standard("QQ==") == b"A"
