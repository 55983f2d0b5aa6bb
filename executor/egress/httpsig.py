"""RFC 9421 HTTP message signatures and RFC 9530 content digests, for agentsafe's component set.

Role: build and check the signature base the ``SIGNED_REQUEST`` downstream credential signs and a
provider verifies. It covers exactly what agentsafe signs, nothing more: derived components
``@method`` and ``@path``, plain header fields, the parameters ``created``, ``keyid`` and ``alg``,
algorithms ``ed25519`` and ``hmac-sha256``, and the label ``agentsafe``. The small structured-field
parser here reads only the shapes those headers take (a dictionary whose members are inner lists of
strings or byte sequences) and refuses anything else. The ``@signature-params`` line is rebuilt
in the parameter order received (:class:`SignatureParams`, ``order``), and a byte sequence must be
the canonical base64 spelling of its bytes (``base64url.decode_standard``).

Why not ``http-message-signatures``/``http-sfv``: this module is imported by
:mod:`agentsafe.executor.provider`, which must load with the standard library and ``cryptography``
only, so a provider can vendor it; see ``docs/egress.md``. The tests cross-check our bases against
the ``http-message-signatures`` package.

Callers: ``egress/credentials.py`` (``SignedRequestCredential``, signing), ``provider.py``
(``verify_provider_request``).
Also imported by ``tools/synthetic_credentials.py``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .. import base64url
from ..codes import Code
from ..errors import AgentSafeError

__all__ = [
    "ALGORITHMS",
    "BASE_COMPONENTS",
    "DISPATCH_COMPONENTS",
    "LABEL",
    "PARAMETERS",
    "SignatureError",
    "SignatureParams",
    "content_digest",
    "parse_content_digest",
    "parse_signature",
    "parse_signature_input",
    "sign_base",
    "signature_base",
    "verify_base",
]

LABEL = "agentsafe"
PARAMETERS = ("created", "keyid", "alg")
"""The signature parameters, in the order agentsafe writes them."""
ALGORITHMS = ("ed25519", "hmac-sha256")
BASE_COMPONENTS = (
    "@method",
    "@path",
    "content-digest",
    "idempotency-key",
    "x-agent-safe-intent-hash",
)
DISPATCH_COMPONENTS = ("x-agent-safe-grant-id", "x-agent-safe-decision-id")
ATTESTATION_COMPONENT = "x-agent-safe-claim-attestation"

_TOKEN_METHOD = re.compile(r"^[A-Z]{1,16}$")
_COMPONENT_NAME = re.compile(r"^@?[a-z0-9][a-z0-9-]{0,63}$")
_KEY = re.compile(r"[a-z*][a-z0-9_.*-]{0,63}")
_SF_STRING_CHARS = re.compile(
    r"^[\x20-\x21\x23-\x5b\x5d-\x7e]*$"
)  # visible ASCII and space, no " \
_INTEGER = re.compile(r"-?[0-9]{1,15}")
_VALUE_CHARS = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")


class SignatureError(AgentSafeError, ValueError):
    """A signature header, parameter or value is malformed; ``code`` says which check failed.
    Also a ``ValueError``, so a parser's caller may treat it as malformed input."""

    code: Code

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message, code=code)
        self.code = code


@dataclass(frozen=True)
class SignatureParams:
    """The covered components and parameters of one signature (the ``@signature-params`` line).

    ``order`` is the order of the three parameters as the signer wrote them. RFC 9421 makes the
    ``@signature-params`` line the serialization of the received ``signature-input`` member, and
    RFC 8941 serializes parameters in their order, so a verifier rebuilds the line in the order it
    received (``;alg=...;keyid=...;created=...`` is as conforming as ours); agentsafe signs in
    ``created, keyid, alg``."""

    components: tuple[str, ...]
    created: int
    keyid: str
    alg: str
    order: tuple[str, ...] = PARAMETERS

    def serialize(self) -> str:
        inner = " ".join(f'"{name}"' for name in self.components)
        values = {"created": str(self.created), "keyid": f'"{self.keyid}"', "alg": f'"{self.alg}"'}
        return f"({inner})" + "".join(f";{name}={values[name]}" for name in self.order)

    def validate(self) -> None:
        if not self.components:
            raise SignatureError(Code.SIGNATURE_MALFORMED, "no covered components")
        if len(set(self.components)) != len(self.components):
            raise SignatureError(Code.SIGNATURE_MALFORMED, "a component is covered twice")
        for name in self.components:
            if not _COMPONENT_NAME.match(name) or (name.startswith("@") and name not in _DERIVED):
                raise SignatureError(Code.SIGNATURE_MALFORMED, "unsupported covered component")
        if self.alg not in ALGORITHMS:
            raise SignatureError(Code.SIGNATURE_ALGORITHM_UNSUPPORTED, "unsupported algorithm")
        if not self.keyid or not _SF_STRING_CHARS.match(self.keyid):
            raise SignatureError(Code.SIGNATURE_MALFORMED, "key id is not a structured string")
        if self.created < 0:
            raise SignatureError(Code.SIGNATURE_MALFORMED, "created is negative")
        if sorted(self.order) != sorted(PARAMETERS):
            raise SignatureError(Code.SIGNATURE_MALFORMED, "parameters must be created, keyid, alg")


_DERIVED = frozenset({"@method", "@path"})


def content_digest(body: bytes) -> str:
    """The RFC 9530 ``content-digest`` value for ``body``: ``sha-256=:<base64>:``."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"


def _check_value(name: str, value: str) -> str:
    if not _VALUE_CHARS.match(value):
        raise SignatureError(
            Code.SIGNATURE_MALFORMED,
            f"value of {name} is empty or has characters a base cannot carry",
        )
    return value


def signature_base(
    params: SignatureParams, *, method: str, path: str, headers: Mapping[str, str]
) -> bytes:
    """The signature base: one ``"name": value`` line per component, then ``@signature-params``.

    ``headers`` maps lower-case field names to their (already combined, trimmed) values. A missing
    header is an error: a signer must not sign what it will not send.
    """
    params.validate()
    lines: list[str] = []
    for name in params.components:
        if name == "@method":
            if not _TOKEN_METHOD.match(method):
                raise SignatureError(Code.SIGNATURE_MALFORMED, "method is not an upper-case token")
            value = method
        elif name == "@path":
            if not path.startswith("/") or not _VALUE_CHARS.match(path) or "?" in path:
                raise SignatureError(Code.SIGNATURE_MALFORMED, "path is not an absolute path")
            value = path
        else:
            if name not in headers:
                raise SignatureError(Code.HEADER_MISSING, f"covered header {name} is absent")
            value = _check_value(name, headers[name])
        lines.append(f'"{name}": {value}')
    lines.append(f'"@signature-params": {params.serialize()}')
    return "\n".join(lines).encode("ascii")


def sign_base(alg: str, key: Ed25519PrivateKey | bytes, base: bytes) -> bytes:
    if alg == "ed25519" and isinstance(key, Ed25519PrivateKey):
        return key.sign(base)
    if alg == "hmac-sha256" and isinstance(key, bytes | bytearray):
        return hmac.new(bytes(key), base, hashlib.sha256).digest()
    raise SignatureError(Code.SIGNATURE_ALGORITHM_MISMATCH, "key does not match the algorithm")


def verify_base(alg: str, key: Ed25519PublicKey | bytes, base: bytes, signature: bytes) -> bool:
    if alg == "ed25519" and isinstance(key, Ed25519PublicKey):
        try:
            key.verify(signature, base)
        except InvalidSignature:
            return False
        return True
    if alg == "hmac-sha256" and isinstance(key, bytes | bytearray):
        expected = hmac.new(bytes(key), base, hashlib.sha256).digest()
        return hmac.compare_digest(expected, signature)
    raise SignatureError(Code.SIGNATURE_ALGORITHM_MISMATCH, "key does not match the algorithm")


# --- a strict reader for the RFC 8941 dictionaries these headers carry -----------------------

_Item = str | int | bytes | tuple[str, ...]


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def fail(self, what: str) -> SignatureError:
        return SignatureError(Code.SIGNATURE_MALFORMED, f"malformed structured field: {what}")

    def skip_ows(self) -> None:
        while self.peek() in (" ", "\t"):
            self.pos += 1

    def skip_sp(self) -> None:
        while self.peek() == " ":
            self.pos += 1

    def key(self) -> str:
        match = _KEY.match(self.text, self.pos)
        if not match:
            raise self.fail("key")
        self.pos = match.end()
        return match.group()

    def string(self) -> str:
        if self.peek() != '"':
            raise self.fail("string")
        self.pos += 1
        out = []
        while True:
            ch = self.peek()
            if not ch:
                raise self.fail("unterminated string")
            self.pos += 1
            if ch == "\\":
                nxt = self.peek()
                if nxt not in ('"', "\\"):
                    raise self.fail("escape")
                out.append(nxt)
                self.pos += 1
            elif ch == '"':
                return "".join(out)
            elif not (0x20 <= ord(ch) <= 0x7E):
                raise self.fail("string character")
            else:
                out.append(ch)

    def integer(self) -> int:
        match = _INTEGER.match(self.text, self.pos)
        if not match:
            raise self.fail("integer")
        self.pos = match.end()
        if self.peek() == ".":
            raise self.fail("decimal where an integer belongs")
        return int(match.group())

    def byte_sequence(self) -> bytes:
        if self.peek() != ":":
            raise self.fail("byte sequence")
        end = self.text.find(":", self.pos + 1)
        if end < 0:
            raise self.fail("unterminated byte sequence")
        raw = self.text[self.pos + 1 : end]
        self.pos = end + 1
        try:
            return base64url.decode_standard(raw)  # the one rule: canonical, padded
        except base64url.NotCanonical as exc:
            raise self.fail("base64") from exc

    def bare_item(self) -> str | int | bytes:
        ch = self.peek()
        if ch == '"':
            return self.string()
        if ch == ":":
            return self.byte_sequence()
        if ch == "-" or ch.isdigit():
            return self.integer()
        raise self.fail("unsupported item type")

    def parameters(self) -> dict[str, str | int | bytes]:
        params: dict[str, str | int | bytes] = {}
        while self.peek() == ";":
            self.pos += 1
            self.skip_sp()
            name = self.key()
            if self.peek() != "=":
                raise self.fail("boolean parameters are not used here")
            self.pos += 1
            if name in params:
                raise self.fail("duplicate parameter")
            params[name] = self.bare_item()
        return params

    def inner_list(self) -> tuple[str, ...]:
        if self.peek() != "(":
            raise self.fail("inner list")
        self.pos += 1
        items: list[str] = []
        while True:
            self.skip_sp()
            if self.peek() == ")":
                self.pos += 1
                return tuple(items)
            item = self.bare_item()
            if not isinstance(item, str):
                raise self.fail("component identifier is not a string")
            if self.peek() == ";":
                raise self.fail("component parameters are not supported")
            items.append(item)
            if self.peek() not in (" ", ")"):
                raise self.fail("inner list separator")

    def dictionary(self) -> dict[str, tuple[_Item, dict[str, str | int | bytes]]]:
        members: dict[str, tuple[_Item, dict[str, str | int | bytes]]] = {}
        self.skip_sp()
        while self.pos < len(self.text):
            name = self.key()
            if self.peek() != "=":
                raise self.fail("dictionary member without a value")
            self.pos += 1
            value: _Item = self.inner_list() if self.peek() == "(" else self.bare_item()
            params = self.parameters()
            if name in members:
                raise self.fail("duplicate dictionary member")
            members[name] = (value, params)
            self.skip_ows()
            if self.pos >= len(self.text):
                break
            if self.peek() != ",":
                raise self.fail("member separator")
            self.pos += 1
            self.skip_ows()
            if self.pos >= len(self.text):
                raise self.fail("trailing comma")
        return members


def parse_signature_input(value: str, label: str = LABEL) -> SignatureParams:
    """Read the member ``label`` of a ``signature-input`` header into :class:`SignatureParams`."""
    members = _Reader(value.strip()).dictionary()
    if label not in members:
        raise SignatureError(Code.SIGNATURE_MISSING, f"no {label} signature")
    inner, params = members[label]
    if not isinstance(inner, tuple):
        raise SignatureError(Code.SIGNATURE_MALFORMED, "signature input is not an inner list")
    if set(params) != {"created", "keyid", "alg"}:
        raise SignatureError(Code.SIGNATURE_MALFORMED, "parameters must be created, keyid and alg")
    created, keyid, alg = params["created"], params["keyid"], params["alg"]
    if not isinstance(created, int) or not isinstance(keyid, str) or not isinstance(alg, str):
        raise SignatureError(Code.SIGNATURE_MALFORMED, "parameter of the wrong type")
    result = SignatureParams(
        components=inner, created=created, keyid=keyid, alg=alg, order=tuple(params)
    )
    result.validate()
    return result


def parse_signature(value: str, label: str = LABEL) -> bytes:
    """The signature bytes of member ``label`` of a ``signature`` header."""
    members = _Reader(value.strip()).dictionary()
    if label not in members:
        raise SignatureError(Code.SIGNATURE_MISSING, f"no {label} signature")
    item, params = members[label]
    if not isinstance(item, bytes) or params:
        raise SignatureError(Code.SIGNATURE_MALFORMED, "signature is not a byte sequence")
    return item


def parse_content_digest(value: str) -> dict[str, bytes]:
    """The algorithm -> digest members of a ``content-digest`` header."""
    members = _Reader(value.strip()).dictionary()
    out: dict[str, bytes] = {}
    for name, (item, _params) in members.items():
        if not isinstance(item, bytes):
            raise SignatureError(Code.CONTENT_DIGEST_MALFORMED, "digest is not a byte sequence")
        out[name] = item
    return out


def components_for(*, dispatch: bool, attested: bool, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The covered components in agentsafe's order for a request of this kind."""
    names = list(BASE_COMPONENTS)
    if dispatch:
        names.extend(DISPATCH_COMPONENTS)
    if attested:
        names.append(ATTESTATION_COMPONENT)
    names.extend(extra)
    return tuple(names)
