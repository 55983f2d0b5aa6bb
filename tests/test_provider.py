"""The provider's verifier: published vectors, a live signer, an independent verifier, receipts."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agentsafe.executor import provider
from agentsafe.executor.canonical import canonical_json, sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.egress.credentials import SignedRequestCredential
from agentsafe.executor.grants import KeySet, SigningKey, b64url_decode, verify_jws
from agentsafe.executor.policy.attestation import issue_claim_attestation, verify_claim_attestation
from agentsafe.executor.provider import (
    ALL_COMPONENTS,
    EFFECT_RECEIPT_TYP,
    MemorySeenStore,
    sign_effect_receipt,
    verify_provider_request,
)

VECTORS = sorted((Path(__file__).parent / "vectors" / "provider").glob("*.json"))
NOW = 1_800_000_000
PARAMS = {"to": "acct-9", "amount": 10, "note": "é ünïcode"}
BODY = canonical_json(PARAMS)


@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
def test_vector(path: Path) -> None:
    vector = json.loads(path.read_text())
    verdict = provider.run_vector(vector)
    assert verdict.as_dict()["verdict"] == vector["expected"]["verdict"]
    assert verdict.code == vector["expected"]["code"]


def test_vectors_cover_valid_and_every_tamper() -> None:
    names = {p.stem for p in VECTORS}
    assert len([n for n in names if n.startswith("valid-")]) >= 3
    for needed in (
        "tamper-body",
        "tamper-path",
        "tamper-method",
        "stale-created",
        "unknown-keyid",
        "replayed-attestation",
        "tamper-idempotency-key",
        "tamper-intent-hash",
        "tamper-grant-id",
        "tamper-decision-id",
        "tamper-attestation",
    ):
        assert needed in names


def test_vectors_are_reproducible(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "vectors" / "provider"))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    for item in generate.build():
        on_disk = json.loads((VECTORS[0].parent / f"{item['name']}.json").read_text())
        assert on_disk == json.loads(json.dumps(item)), item["name"]


def test_cli_runs_vectors(capsys: pytest.CaptureFixture[str]) -> None:
    assert provider.main(["provider-request", *map(str, VECTORS)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == len(VECTORS)
    assert all(line["as_expected"] for line in lines)


def test_cli_reports_unexpected_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vector = json.loads((VECTORS[0].parent / "valid-ed25519-dispatch.json").read_text())
    vector["expected"] = {"verdict": "REFUSE", "code": "SIGNATURE_INVALID"}
    path = tmp_path / "v.json"
    path.write_text(json.dumps(vector))
    assert provider.main([str(path)]) == 1
    assert provider.main([str(tmp_path / "absent.json")]) == 2
    assert provider.main([]) == 2


def test_importable_without_server_dependencies() -> None:
    code = (
        "import sys\n"
        "for name in ('aiohttp', 'yarl', 'multidict', 'pydantic', 'prometheus_client'):\n"
        "    sys.modules[name] = None\n"
        "import agentsafe.executor.provider as p\n"
        "assert 'aiohttp' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print(p.ALL_COMPONENTS[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "@method"


# --- a live signer against both verifiers ---------------------------------------------------


@dataclass
class StandInSecret:
    """Test stand-in for a secrets.py handle."""

    name: str
    value: bytes

    @contextlib.contextmanager
    def reveal(self) -> Iterator[bytearray]:
        yield bytearray(self.value)


@dataclass(frozen=True)
class StandInClaim:
    grant_id: str = "grt_live"
    decision_id: str = "dec_live"
    expires_at: float = NOW + 90
    intent_hash: str = "sha256:" + "ab" * 32
    execution_payload_digest: str = sha256_digest(PARAMS)


@pytest.fixture
def setup() -> dict[str, Any]:
    executor_key = Ed25519PrivateKey.generate()
    authority = SigningKey.generate()
    pem = executor_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    credential = SignedRequestCredential(
        key_id="exec-1", signing_key=StandInSecret("k", pem), clock=ManualClock(NOW)
    )
    token = issue_claim_attestation(
        StandInClaim(), claim_token_digest="sha256:" + "cd" * 32, key=authority, now=NOW
    )
    return {
        "credential": credential,
        "public": executor_key.public_key(),
        "authority": authority,
        "jwks": KeySet([authority]).jwks(),
        "attestation": token,
    }


async def _sign(setup: dict[str, Any], **overrides: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "method": "POST",
        "url": "https://bank.test/core/v1/transfers?trace=1",
        "body": BODY,
        "idempotency_key": "idem-1",
        "intent_hash": StandInClaim.intent_hash,
        "grant_id": "grt_live",
        "decision_id": "dec_live",
        "attestation": setup["attestation"],
    }
    args.update(overrides)
    headers: dict[str, str] = await setup["credential"].headers_for(**args)
    return headers


def _provider(
    setup: dict[str, Any],
    headers: dict[str, str],
    *,
    method: str = "POST",
    path: str = "/core/v1/transfers",
    body: bytes = BODY,
    store: MemorySeenStore | None = None,
    now: float = NOW,
) -> provider.ProviderVerdict:
    return verify_provider_request(
        method=method,
        path=path,
        headers=headers,
        body=body,
        keys={"exec-1": setup["public"]},
        authority_jwks=setup["jwks"],
        now=now,
        seen_store=store or MemorySeenStore(),
    )


def independent_verify(
    *,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    key: Ed25519PublicKey,
    jwks: dict[str, Any],
    now: float,
    seen: set[str],
) -> bool:
    """Written from the specification's pseudo-code alone, sharing no code with provider.py."""
    h = {k.lower(): v for k, v in headers.items()}
    params = h["signature-input"].split("agentsafe=", 1)[1]
    components = params[params.index("(") + 1 : params.index(")")].replace('"', "").split()
    created = int(params.split(";created=")[1].split(";")[0])
    keyid = params.split(';keyid="')[1].split('"')[0]
    lines = []
    for c in components:
        if c == "@method":
            lines.append('"@method": ' + method)
        elif c == "@path":
            lines.append('"@path": ' + path)
        elif c == "content-digest":
            lines.append(
                '"content-digest": sha-256=:'
                + base64.b64encode(hashlib.sha256(body).digest()).decode()
                + ":"
            )
        else:
            lines.append(f'"{c}": ' + h[c])
    base = "\n".join(lines) + "\n" + '"@signature-params": ' + params
    signature = base64.b64decode(h["signature"].split("agentsafe=:", 1)[1].rstrip(":"))
    expected_digest = "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"
    if h["content-digest"] != expected_digest or set(ALL_COMPONENTS) - set(components):
        return False
    if abs(now - created) > 300 or keyid != "exec-1":
        return False
    try:
        key.verify(signature, base.encode())
    except Exception:
        return False
    head_b64, payload_b64, sig_b64 = h["x-agent-safe-claim-attestation"].split(".")
    header = json.loads(b64url_decode(head_b64))
    payload = json.loads(b64url_decode(payload_b64))
    if header["alg"] != "EdDSA" or header["typ"] != "agentsafe-claim-attestation+jwt":
        return False
    jwk = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    try:
        Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"])).verify(
            b64url_decode(sig_b64), f"{head_b64}.{payload_b64}".encode()
        )
    except Exception:
        return False
    binding = payload["binding"]
    body_digest = "sha256:" + hashlib.sha256(canonical_json(json.loads(body))).hexdigest()
    ok = (
        payload["sub"] == h["x-agent-safe-grant-id"]
        and payload["decision_id"] == h["x-agent-safe-decision-id"]
        and binding["intent_hash"] == h["x-agent-safe-intent-hash"]
        and binding["execution_payload_canonicalization_profile"] == "RFC8785/JCS"
        and binding["execution_payload_digest"] == body_digest
        and payload["exp"] > now
        and payload["sub"] not in seen
    )
    seen.add(payload["sub"])
    return ok


def _independent(setup: dict[str, Any], headers: dict[str, str], **kw: Any) -> bool:
    args: dict[str, Any] = {
        "method": "POST",
        "path": "/core/v1/transfers",
        "body": BODY,
        "now": NOW,
        "seen": set(),
    }
    args.update(kw)
    return independent_verify(headers=headers, key=setup["public"], jwks=setup["jwks"], **args)


async def test_signed_request_verifies_both_ways(setup: dict[str, Any]) -> None:
    headers = await _sign(setup)
    assert set(headers) >= {
        "signature",
        "signature-input",
        "content-digest",
        "idempotency-key",
        "x-agent-safe-intent-hash",
        "x-agent-safe-grant-id",
        "x-agent-safe-decision-id",
        "x-agent-safe-claim-attestation",
    }
    verdict = _provider(setup, headers)
    assert verdict.accepted
    assert verdict.code == "VERIFIED"
    assert verdict.grant_id == "grt_live"
    assert verdict.components == ALL_COMPONENTS
    assert _independent(setup, headers)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"body": canonical_json({**PARAMS, "amount": 11})}, "CONTENT_DIGEST_MISMATCH"),
        ({"path": "/core/v1/other"}, "SIGNATURE_INVALID"),
        ({"method": "PUT"}, "SIGNATURE_INVALID"),
        ({"now": NOW + 301}, "CREATED_OUT_OF_WINDOW"),
        ({"now": NOW - 301}, "CREATED_OUT_OF_WINDOW"),
    ],
)
async def test_request_tamper_refused(
    setup: dict[str, Any], change: dict[str, Any], code: str
) -> None:
    headers = await _sign(setup)
    verdict = _provider(setup, headers, **change)
    assert not verdict.accepted
    assert verdict.code == code
    assert not _independent(setup, headers, **change)


@pytest.mark.parametrize(
    "header",
    [
        "idempotency-key",
        "x-agent-safe-intent-hash",
        "x-agent-safe-grant-id",
        "x-agent-safe-decision-id",
        "x-agent-safe-claim-attestation",
        "content-digest",
    ],
)
async def test_every_covered_header_tamper_refused(setup: dict[str, Any], header: str) -> None:
    headers = await _sign(setup)
    other = await _sign(
        setup,
        idempotency_key="idem-2",
        intent_hash="sha256:" + "ef" * 32,
        grant_id="grt_x",
        decision_id="dec_x",
        body=b"{}",
        attestation=issue_claim_attestation(
            StandInClaim(expires_at=NOW + 30),
            claim_token_digest="sha256:00",
            key=setup["authority"],
            now=NOW,
        ),
    )
    headers[header] = other[header]
    verdict = _provider(setup, headers)
    assert not verdict.accepted
    expected = "CONTENT_DIGEST_MISMATCH" if header == "content-digest" else "SIGNATURE_INVALID"
    assert verdict.code == expected
    assert not _independent(setup, headers)


async def test_wrong_keyid_and_replay_refused(setup: dict[str, Any]) -> None:
    headers = await _sign(setup)
    verdict = verify_provider_request(
        method="POST",
        path="/core/v1/transfers",
        headers=headers,
        body=BODY,
        keys={"exec-2": setup["public"]},
        authority_jwks=setup["jwks"],
        now=NOW,
        seen_store=MemorySeenStore(),
    )
    assert verdict.code == "KEY_UNKNOWN"
    store = MemorySeenStore()
    assert _provider(setup, headers, store=store).accepted
    assert _provider(setup, headers, store=store).code == "ATTESTATION_REPLAYED"
    seen: set[str] = set()
    assert _independent(setup, headers, seen=seen)
    assert not _independent(setup, headers, seen=seen)


async def test_refused_request_records_nothing(setup: dict[str, Any]) -> None:
    headers = await _sign(setup)
    store = MemorySeenStore()
    assert _provider(setup, headers, store=store, path="/x").code == "SIGNATURE_INVALID"
    assert _provider(setup, headers, store=store).accepted


async def test_unsigned_attestation_header_is_refused(setup: dict[str, Any]) -> None:
    headers = await _sign(setup, grant_id=None, decision_id=None, attestation=None)
    headers["x-agent-safe-claim-attestation"] = setup["attestation"]
    verdict = verify_provider_request(
        method="POST",
        path="/core/v1/transfers",
        headers=headers,
        body=BODY,
        keys={"exec-1": setup["public"]},
        authority_jwks=setup["jwks"],
        now=NOW,
        seen_store=MemorySeenStore(),
        required_components=ALL_COMPONENTS[:5],
    )
    assert verdict.code == "COMPONENT_NOT_COVERED"


async def test_duplicated_covered_header_refused(setup: dict[str, Any]) -> None:
    headers = await _sign(setup)
    pairs = [*headers.items(), ("Idempotency-Key", "idem-1")]
    verdict = verify_provider_request(
        method="POST",
        path="/core/v1/transfers",
        headers=pairs,
        body=BODY,
        keys={"exec-1": setup["public"]},
        authority_jwks=setup["jwks"],
        now=NOW,
        seen_store=MemorySeenStore(),
    )
    assert verdict.code == "HEADER_DUPLICATED"


@pytest.mark.parametrize(
    "body", [b"not json", b'{"a":1,"a":2}', b'{"n": NaN}', b'{"n": 9007199254740993}']
)
async def test_body_that_is_not_canonical_json_never_matches(
    setup: dict[str, Any], body: bytes
) -> None:
    headers = await _sign(setup, body=body)
    assert _provider(setup, headers, body=body).code == "ATTESTATION_PAYLOAD_MISMATCH"


async def test_body_in_another_serialisation_still_matches(setup: dict[str, Any]) -> None:
    body = json.dumps(PARAMS, indent=2, ensure_ascii=True).encode()
    headers = await _sign(setup, body=body)
    assert _provider(setup, headers, body=body).accepted


def test_attestation_shape(setup: dict[str, Any]) -> None:
    claims = verify_claim_attestation(setup["attestation"], keys=KeySet([setup["authority"]]))
    assert claims["sub"] == "grt_live"
    assert claims["decision_id"] == "dec_live"
    assert claims["binding"] == {
        "intent_hash": StandInClaim.intent_hash,
        "execution_payload_digest": sha256_digest(PARAMS),
        "execution_payload_canonicalization_profile": "RFC8785/JCS",
    }
    assert claims["exp"] == NOW + 90
    assert claims["claim_token_digest"] == "sha256:" + "cd" * 32
    header = json.loads(b64url_decode(setup["attestation"].split(".")[0]))
    assert header == {
        "alg": "EdDSA",
        "typ": "agentsafe-claim-attestation+jwt",
        "kid": setup["authority"].kid,
    }


async def test_effect_receipt_round_trip(setup: dict[str, Any]) -> None:
    verdict = _provider(setup, await _sign(setup))
    assert verdict.attestation is not None
    provider_key = SigningKey.generate()
    receipt = sign_effect_receipt(
        attestation=verdict.attestation,
        status="EFFECTED",
        key=provider_key._key,
        kid=provider_key.kid,
        issuer="bank.test",
        effect_digest="sha256:" + "11" * 32,
        now=NOW,
    )
    claims = verify_jws(receipt, typ=EFFECT_RECEIPT_TYP, keys=KeySet([provider_key]))
    assert claims == {
        "iss": "bank.test",
        "sub": "grt_live",
        "decision_id": "dec_live",
        "claim_token_digest": "sha256:" + "cd" * 32,
        "status": "EFFECTED",
        "effect_digest": "sha256:" + "11" * 32,
        "iat": NOW,
    }
