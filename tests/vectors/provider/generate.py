"""Regenerate the verifying-provider test vectors: ``python tests/vectors/provider/generate.py``.

Every key here is a TEST KEY derived from a fixed, published seed so the vectors are byte-for-byte
reproducible (Ed25519 and HMAC signatures are deterministic). Never use them for anything else.

Each vector is one received request (method, path, headers, body), the keys the provider issued
to the executor (public JWKs; the HMAC one is an ``oct`` JWK), the authority's JWKS, the
provider's clock (``now``), the components it requires, the grant ids it has already seen, and
the expected verdict and code. ``tests/test_provider.py`` runs them all; so does
``agentsafe verify provider-request <vector>``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.canonical import canonical_json, sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.egress.credentials import SignedRequestCredential
from agentsafe.executor.grants import SigningKey, b64url_encode
from agentsafe.executor.policy.attestation import issue_claim_attestation
from agentsafe.executor.provider import ALL_COMPONENTS

HERE = Path(__file__).resolve().parent
NOW = 1_800_000_000
PATH = "/v1/payments"
PARAMS = {"account": "acct-42", "amount": 1250, "currency": "EUR", "memo": "invoice 7"}
BODY = canonical_json(PARAMS)
INTENT_HASH = "sha256:" + hashlib.sha256(b"test intent").hexdigest()
GRANT_ID = "grt_01TESTVECTOR0000000000001"
DECISION_ID = "dec_01TESTVECTOR0000000000001"
IDEMPOTENCY_KEY = "idem-7f3c2a"
BASE_COMPONENTS = list(ALL_COMPONENTS[:5])


def _seed(label: str) -> bytes:
    return hashlib.sha256(b"agentsafe TEST KEY, never use: " + label.encode()).digest()


EXECUTOR_KEY = Ed25519PrivateKey.from_private_bytes(_seed("executor ed25519"))
HMAC_KEY = _seed("executor hmac-sha256")
AUTHORITY_KEY = SigningKey(Ed25519PrivateKey.from_private_bytes(_seed("authority")))
OTHER_AUTHORITY_KEY = SigningKey(Ed25519PrivateKey.from_private_bytes(_seed("rogue authority")))


@dataclass
class _Handle:
    """A stand-in secret handle holding a test key."""

    name: str
    value: bytes

    @contextlib.contextmanager
    def reveal(self) -> Iterator[bytearray]:
        yield bytearray(self.value)


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _okp(key: Ed25519PrivateKey) -> dict[str, str]:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": b64url_encode(raw)}


KEYS = {
    "executor-ed25519-test": _okp(EXECUTOR_KEY),
    "executor-hmac-test": {"kty": "oct", "k": b64url_encode(HMAC_KEY)},
}
AUTHORITY_JWKS = {"keys": [AUTHORITY_KEY.public_jwk()]}


@dataclass(frozen=True)
class _Claim:
    grant_id: str = GRANT_ID
    decision_id: str = DECISION_ID
    expires_at: float = NOW + 120
    intent_hash: str = INTENT_HASH
    execution_payload_digest: str = sha256_digest(PARAMS)


def attestation(claim: _Claim | None = None, *, key: SigningKey = AUTHORITY_KEY) -> str:
    return issue_claim_attestation(
        claim or _Claim(),
        claim_token_digest="sha256:" + hashlib.sha256(b"test grant token").hexdigest(),
        key=key,
        now=NOW - 5,
    )


def forged_attestation(header: dict[str, Any]) -> str:
    payload = json.loads(base64.urlsafe_b64decode(attestation().split(".")[1] + "=="))
    signing_input = (
        b64url_encode(canonical_json(header)) + "." + b64url_encode(canonical_json(payload))
    )
    return signing_input + "." + b64url_encode(AUTHORITY_KEY.sign(signing_input.encode("ascii")))


def signed(
    *,
    alg: str = "ed25519",
    keyid: str = "executor-ed25519-test",
    created: int = NOW - 2,
    body: bytes = BODY,
    method: str = "POST",
    path: str = PATH,
    dispatch: bool = True,
    attest: str | None = "default",
) -> dict[str, Any]:
    secret = _Handle("signing", _pem(EXECUTOR_KEY) if alg == "ed25519" else HMAC_KEY)
    credential = SignedRequestCredential(
        key_id=keyid,
        signing_key=secret,
        algorithm=alg,
        clock=ManualClock(created),  # type: ignore[arg-type]
    )
    headers = asyncio.run(
        credential.headers_for(
            method=method,
            url="https://provider.test" + path,
            body=body,
            idempotency_key=IDEMPOTENCY_KEY,
            intent_hash=INTENT_HASH,
            grant_id=GRANT_ID if dispatch else None,
            decision_id=DECISION_ID if dispatch else None,
            attestation=(attestation() if attest == "default" else attest) if dispatch else None,
        )
    )
    return {"method": method, "path": path, "headers": headers, "body": body.decode("utf-8")}


def vector(
    name: str, description: str, request: dict[str, Any], verdict: str, code: str, **extra: Any
) -> dict[str, Any]:
    out = {
        "name": name,
        "description": description,
        "note": "TEST KEYS from fixed published seeds; never use them for anything else.",
        "request": request,
        "keys": KEYS,
        "authority_jwks": AUTHORITY_JWKS,
        "now": NOW,
        "clock_window_s": 300,
        "required_components": list(ALL_COMPONENTS),
        "seen": [],
        "expected": {"verdict": verdict, "code": code},
    }
    out.update(extra)
    return out


def tamper(request: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(request)
    for key, value in changes.items():
        if key.startswith("h_"):
            out["headers"][key[2:].replace("_", "-")] = value
        else:
            out[key] = value
    return out


def build() -> list[dict[str, Any]]:
    good = signed()
    hmac_good = signed(alg="hmac-sha256", keyid="executor-hmac-test")
    base_only = signed(dispatch=False)
    vectors = [
        vector(
            "valid-ed25519-dispatch",
            "A dispatch signed with Ed25519, attested by the authority.",
            good,
            "ACCEPT",
            "VERIFIED",
        ),
        vector(
            "valid-hmac-dispatch",
            "The same dispatch signed with HMAC-SHA256.",
            hmac_good,
            "ACCEPT",
            "VERIFIED",
        ),
        vector(
            "valid-base-components",
            "A lookup (no dispatch), for a provider requiring only the five base components.",
            base_only,
            "ACCEPT",
            "VERIFIED",
            required_components=BASE_COMPONENTS,
        ),
        vector(
            "tamper-body",
            "The body was changed after signing.",
            tamper(good, body=BODY.decode().replace("1250", "9250")),
            "REFUSE",
            "CONTENT_DIGEST_MISMATCH",
        ),
        vector(
            "tamper-body-and-digest",
            "The body and its content-digest were both replaced.",
            tamper(
                good,
                body="{}",
                h_content_digest="sha-256=:"
                + base64.b64encode(hashlib.sha256(b"{}").digest()).decode()
                + ":",
            ),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-path",
            "The request was sent to another path.",
            tamper(good, path="/v1/refunds"),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-method",
            "The method was changed.",
            tamper(good, method="PUT"),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-idempotency-key",
            "The idempotency key was changed.",
            tamper(good, h_idempotency_key="idem-other"),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-intent-hash",
            "The intent hash header was changed.",
            tamper(good, h_x_agent_safe_intent_hash="sha256:" + "0" * 64),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-grant-id",
            "The grant id header was changed.",
            tamper(good, h_x_agent_safe_grant_id="grt_other"),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-decision-id",
            "The decision id header was changed.",
            tamper(good, h_x_agent_safe_decision_id="dec_other"),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "tamper-attestation",
            "Another (valid) attestation was swapped in after signing.",
            tamper(good, h_x_agent_safe_claim_attestation=attestation(_Claim(expires_at=NOW + 60))),
            "REFUSE",
            "SIGNATURE_INVALID",
        ),
        vector(
            "stale-created",
            "Signed ten minutes before the provider's clock.",
            signed(created=NOW - 600),
            "REFUSE",
            "CREATED_OUT_OF_WINDOW",
        ),
        vector(
            "unknown-keyid",
            "Signed under a key id the provider never issued.",
            signed(keyid="executor-unknown"),
            "REFUSE",
            "KEY_UNKNOWN",
        ),
        vector(
            "algorithm-mismatch",
            "Claims ed25519 under the key id of the HMAC key.",
            signed(keyid="executor-hmac-test"),
            "REFUSE",
            "SIGNATURE_ALGORITHM_MISMATCH",
        ),
        vector(
            "missing-covered-header",
            "A covered header is absent.",
            {
                **good,
                "headers": {k: v for k, v in good["headers"].items() if k != "idempotency-key"},
            },
            "REFUSE",
            "HEADER_MISSING",
        ),
        vector(
            "missing-signature",
            "No signature at all.",
            {
                **good,
                "headers": {
                    k: v for k, v in good["headers"].items() if not k.startswith("signature")
                },
            },
            "REFUSE",
            "SIGNATURE_MISSING",
        ),
        vector(
            "component-not-covered",
            "A lookup signature presented to a system of record that requires all eight.",
            base_only,
            "REFUSE",
            "COMPONENT_NOT_COVERED",
        ),
        vector(
            "replayed-attestation",
            "The grant was already presented within its lease.",
            good,
            "REFUSE",
            "ATTESTATION_REPLAYED",
            seen=[GRANT_ID],
        ),
        vector(
            "attestation-expired",
            "The attestation's lease ended before the provider's clock.",
            signed(attest=attestation(_Claim(expires_at=NOW - 1))),
            "REFUSE",
            "ATTESTATION_EXPIRED",
        ),
        vector(
            "attestation-unknown-authority",
            "Attested by a key absent from the authority's JWKS.",
            signed(attest=attestation(key=OTHER_AUTHORITY_KEY)),
            "REFUSE",
            "ATTESTATION_KEY_UNKNOWN",
        ),
        vector(
            "attestation-wrong-type",
            "The attestation header names another token type.",
            signed(
                attest=forged_attestation(
                    {"alg": "EdDSA", "typ": "agentsafe-grant+jwt", "kid": AUTHORITY_KEY.kid}
                )
            ),
            "REFUSE",
            "ATTESTATION_TYPE_INVALID",
        ),
        vector(
            "attestation-wrong-algorithm",
            "The attestation header names another algorithm.",
            signed(
                attest=forged_attestation(
                    {
                        "alg": "ES256",
                        "typ": "agentsafe-claim-attestation+jwt",
                        "kid": AUTHORITY_KEY.kid,
                    }
                )
            ),
            "REFUSE",
            "ATTESTATION_ALGORITHM_INVALID",
        ),
        vector(
            "attestation-other-grant",
            "The attestation is for another grant.",
            signed(attest=attestation(_Claim(grant_id="grt_other"))),
            "REFUSE",
            "ATTESTATION_GRANT_MISMATCH",
        ),
        vector(
            "attestation-other-decision",
            "The attestation is for another decision.",
            signed(attest=attestation(_Claim(decision_id="dec_other"))),
            "REFUSE",
            "ATTESTATION_DECISION_MISMATCH",
        ),
        vector(
            "attestation-other-intent",
            "The attestation binds another intent.",
            signed(attest=attestation(_Claim(intent_hash="sha256:" + "1" * 64))),
            "REFUSE",
            "ATTESTATION_INTENT_MISMATCH",
        ),
        vector(
            "attestation-other-payload",
            "The executor signed a body other than the one the authority claimed.",
            signed(
                attest=attestation(
                    _Claim(execution_payload_digest=sha256_digest({**PARAMS, "amount": 9250}))
                )
            ),
            "REFUSE",
            "ATTESTATION_PAYLOAD_MISMATCH",
        ),
    ]
    return vectors


def main() -> None:
    for old in HERE.glob("*.json"):
        old.unlink()
    for item in build():
        (HERE / f"{item['name']}.json").write_text(
            json.dumps(item, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )


if __name__ == "__main__":
    main()
