"""Base64 with one strictness rule: the canonical spelling of the bytes, and nothing else.

Role: every base64 value agentsafe *verifies* is decoded here, so the executor and a provider (or
any two verifiers in this code base) never disagree on whether a value is well formed. Decoding
is strict in the same way for both alphabets:

* :func:`decode` (base64url, RFC 4648 section 5, unpadded, as JOSE uses it): only
  ``A-Z a-z 0-9 - _``, no ``=``, a length that is not ``1 (mod 4)``;
* :func:`decode_standard` (base64, section 4, padded, as RFC 8941 byte sequences and SPKI pins
  use it): only ``A-Z a-z 0-9 + /``, exactly the padding the length needs;
* and for both, the encoding of the decoded bytes must be the input again: non-zero trailing
  bits (``...Q`` where ``...Q`` and ``...R`` decode to the same bytes) are a second spelling of the
  same value, and are refused.

Why refuse the second spelling: two verifiers that differ on it differ on what was presented (a
replay cache keyed on the header string, a signature compared as text), and the differential
test (``tests/test_verifier_agreement.py``) found exactly that between the provider's verifier
and the executor's. RFC 8941 says a parser SHOULD NOT fail on non-zero pad bits; agentsafe and
its signers never produce them, and we choose agreement over that leniency.

Not for recognising: the redactor decodes leniently on purpose (``evidence/redact.py``), because
recognising a credential is not accepting one.

The standard library's decoders do the arithmetic; this module adds the rule the library leaves
out (``binascii`` accepts non-canonical trailing bits), and nothing else, so it is hand-written.

Ground floor: imports only the registry of codes and the root error. Callers: ``jws.py`` (every
JWS segment and JWK member: the grants, the provider's verifier and the workload door read
through it), ``egress/httpsig.py`` (byte sequences), ``evidence/bundle.py`` (the manifest
signature), ``config/parsing.py`` (SPKI pins).
"""

from __future__ import annotations

import base64
import binascii
import re

from .codes import Code
from .errors import AgentSafeError

__all__ = ["NotCanonical", "decode", "decode_standard", "encode", "encode_standard"]

_URL = re.compile(r"[A-Za-z0-9_-]*")
_STANDARD = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


class NotCanonical(AgentSafeError, ValueError):
    """The text is not the canonical base64 (or base64url) spelling of any bytes; also a
    ``ValueError``, so a parser's caller may treat it as malformed input."""

    code = Code.BASE64_NOT_CANONICAL

    def __init__(self, message: str) -> None:
        super().__init__(message, code=Code.BASE64_NOT_CANONICAL)


def encode(data: bytes) -> str:
    """Unpadded base64url."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def encode_standard(data: bytes) -> str:
    """Padded standard base64."""
    return base64.b64encode(data).decode("ascii")


def decode(text: str) -> bytes:
    """Unpadded base64url in its canonical spelling (see the module docstring)."""
    if not isinstance(text, str) or not _URL.fullmatch(text) or len(text) % 4 == 1:
        raise NotCanonical("not unpadded base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise NotCanonical("not base64url") from None
    if encode(data) != text:
        raise NotCanonical("not the canonical base64url spelling (non-zero trailing bits)")
    return data


def decode_standard(text: str) -> bytes:
    """Padded standard base64 in its canonical spelling (see the module docstring)."""
    if not isinstance(text, str) or not _STANDARD.fullmatch(text):
        raise NotCanonical("not padded base64")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise NotCanonical("not base64") from None
    if encode_standard(data) != text:
        raise NotCanonical("not the canonical base64 spelling (non-zero trailing bits)")
    return data
