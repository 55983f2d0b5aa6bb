"""Workload tokens signed in the test with real RSA, EC and Ed25519 keys."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentsafe.executor.clock import ManualClock
from agentsafe.executor.door.principals_file import PrincipalSet, parse_principals
from agentsafe.executor.door.workload import (
    JwkSet,
    JwksSource,
    JwtRefused,
    WorkloadVerifier,
    looks_like_jwt,
    parse_jwks,
)
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import MemorySink
from tests.support.pki import TokenSigner, unsigned_token

ISSUER = "https://kubernetes.default.svc.cluster.example"
SUBJECT = "system:serviceaccount:agent-safe-agents:treasury-workflow"
AUDIENCE = "agentsafe-executor"
NOW = 1_800_000_000.0


def principals(**credential: Any) -> PrincipalSet:
    cred = {
        "kind": "WORKLOAD_JWT",
        "issuer": ISSUER,
        "subject": SUBJECT,
        "required_claims": {"kubernetes.io/namespace": "agent-safe-agents"},
        **credential,
    }
    doc = {
        "version": "agent-safe.principals/1",
        "principals": [
            {
                "id": "treasury-workflow",
                "role": "PROPOSER",
                "tenant_id": "00000000-0000-4000-8000-000000000001",
                "actor": {"id": "payout-agent", "type": "AI_AGENT"},
                "allowed_actions": ["forward_request"],
                "credential": cred,
            }
        ],
    }
    return parse_principals(
        json.dumps(doc),
        registered_actions=["forward_request"],
        jwt_configured=True,
        client_ca_configured=False,
    )


def claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "sub": SUBJECT,
        "aud": [AUDIENCE, "https://kubernetes.default.svc"],
        "iat": int(NOW) - 60,
        "exp": int(NOW) + 3600,
        "kubernetes.io": {
            "namespace": "agent-safe-agents",
            "serviceaccount": {"name": "treasury-workflow", "uid": "u-1"},
        },
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def write_jwks(path: Path, *signers: TokenSigner) -> Path:
    path.write_text(json.dumps({"keys": [s.jwk() for s in signers]}))
    return path


@pytest.fixture
def signer() -> TokenSigner:
    return TokenSigner("ES256")


@pytest.fixture
def jwks_path(tmp_path: Path, signer: TokenSigner) -> Path:
    return write_jwks(tmp_path / "jwks.json", signer)


def verifier(path: Path, clock: ManualClock | None = None, **kw: Any) -> WorkloadVerifier:
    return WorkloadVerifier(
        JwksSource(path), audience=AUDIENCE, clock=clock or ManualClock(NOW), **kw
    )


def refused(v: WorkloadVerifier, token: str, ps: PrincipalSet | None = None) -> JwtRefused:
    with pytest.raises(JwtRefused) as info:
        v.verify(token, ps or principals())
    assert token not in str(info.value)
    return info.value


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_each_accepted_algorithm_verifies(tmp_path: Path, alg: str) -> None:
    signer = TokenSigner(alg)
    v = verifier(write_jwks(tmp_path / "jwks.json", signer))
    record = v.verify(signer.sign(claims()), principals())
    assert record.id == "treasury-workflow"


def test_forged_token_signed_by_another_key(jwks_path: Path) -> None:
    other = TokenSigner("ES256")  # same kid, different key: it names a key we hold
    error = refused(verifier(jwks_path), other.sign(claims()))
    assert error.code == "JWT_SIGNATURE_INVALID"
    assert not hasattr(error, "principal_id")  # anyone can forge this: never a lock (item 20)
    stranger = TokenSigner("ES256", kid="not-ours")
    error = refused(verifier(jwks_path), stranger.sign(claims()))
    assert error.code == "JWT_SIGNATURE_INVALID"


def test_tampered_claims_break_the_signature(jwks_path: Path, signer: TokenSigner) -> None:
    head, _, sig = signer.sign(claims()).split(".")
    forged_body = signer.sign(claims(sub="system:serviceaccount:x:admin")).split(".")[1]
    error = refused(verifier(jwks_path), f"{head}.{forged_body}.{sig}")
    assert error.code == "JWT_SIGNATURE_INVALID"


def test_alg_none_is_refused(jwks_path: Path) -> None:
    token = unsigned_token({"alg": "none", "typ": "JWT"}, claims(), b"")
    assert refused(verifier(jwks_path), token).code == "JWT_ALGORITHM_REFUSED"


def test_hs256_signed_with_the_public_key_is_refused(tmp_path: Path) -> None:
    rsa_signer = TokenSigner("RS256")
    path = write_jwks(tmp_path / "jwks.json", rsa_signer)
    header = {"alg": "HS256", "typ": "JWT", "kid": rsa_signer.kid}
    unsigned = unsigned_token(header, claims(), b"x").rsplit(".", 1)[0]
    mac = hmac.new(rsa_signer.public_pem(), unsigned.encode(), hashlib.sha256).digest()
    token = unsigned_token(header, claims(), mac)
    assert refused(verifier(path), token).code == "JWT_ALGORITHM_REFUSED"


@pytest.mark.parametrize("alg", ["RS512", "ES384", "PS256", "HS512", "", None])
def test_other_algorithms_are_refused(jwks_path: Path, signer: TokenSigner, alg: Any) -> None:
    head = {"alg": alg, "kid": signer.kid}
    token = unsigned_token(head, claims(), b"\x00" * 64)
    assert refused(verifier(jwks_path), token).code == "JWT_ALGORITHM_REFUSED"


def test_es256_token_cannot_use_an_rsa_key(tmp_path: Path) -> None:
    rsa_signer = TokenSigner("RS256", kid="k")
    ec_signer = TokenSigner("ES256", kid="k")
    path = write_jwks(tmp_path / "jwks.json", rsa_signer)
    assert refused(verifier(path), ec_signer.sign(claims())).code == "JWT_SIGNATURE_INVALID"


def test_expired_token(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(iat=int(NOW) - 7200, exp=int(NOW) - 31))
    error = refused(verifier(jwks_path, clock_tolerance_seconds=30), token)
    assert error.code == "JWT_EXPIRED"


def test_clock_tolerance_admits_a_just_expired_token(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(iat=int(NOW) - 7200, exp=int(NOW) - 29))
    assert verifier(jwks_path, clock_tolerance_seconds=30).verify(token, principals())


def test_token_older_than_a_day(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(iat=int(NOW) - 86_400 - 31, exp=int(NOW) + 3600))
    assert refused(verifier(jwks_path), token).code == "JWT_EXPIRED"


def test_token_from_the_future(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(iat=int(NOW) + 600))
    assert refused(verifier(jwks_path), token).code == "JWT_EXPIRED"
    token = signer.sign(claims(nbf=int(NOW) + 600))
    assert refused(verifier(jwks_path), token).code == "JWT_EXPIRED"


@pytest.mark.parametrize("missing", ["exp", "iat"])
def test_required_times(jwks_path: Path, signer: TokenSigner, missing: str) -> None:
    token = signer.sign(claims(**{missing: None}))
    assert refused(verifier(jwks_path), token).code == "JWT_CLAIM_MISMATCH"


def test_wrong_audience(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(aud="https://kubernetes.default.svc"))
    error = refused(verifier(jwks_path), token)
    assert error.code == "JWT_AUDIENCE_MISMATCH"  # item 17
    assert refused(verifier(jwks_path), signer.sign(claims(aud=None))).code == (
        "JWT_AUDIENCE_MISMATCH"
    )


def test_the_principals_own_audience_is_accepted(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(aud="payments-boundary"))
    ps = principals(audience="payments-boundary")
    assert verifier(jwks_path).verify(token, ps).id == "treasury-workflow"
    assert refused(verifier(jwks_path), token).code == "JWT_AUDIENCE_MISMATCH"


def test_unknown_issuer_and_subject(jwks_path: Path, signer: TokenSigner) -> None:
    error = refused(verifier(jwks_path), signer.sign(claims(iss="https://evil.example")))
    assert error.code == "JWT_ISSUER_UNKNOWN"
    assert refused(verifier(jwks_path), signer.sign(claims(iss=None))).code == "JWT_ISSUER_UNKNOWN"
    other = "system:serviceaccount:agent-safe-agents:someone-else"
    error = refused(verifier(jwks_path), signer.sign(claims(sub=other)))
    assert error.code == "JWT_SUBJECT_UNKNOWN"
    assert refused(verifier(jwks_path), signer.sign(claims(sub=None))).code == (
        "JWT_SUBJECT_UNKNOWN"
    )


def test_required_claims_nested_and_flat(jwks_path: Path, signer: TokenSigner) -> None:
    v = verifier(jwks_path)
    wrong_ns = claims(**{"kubernetes.io": {"namespace": "default"}})
    error = refused(v, signer.sign(wrong_ns))
    assert error.code == "JWT_CLAIM_MISMATCH"
    assert refused(v, signer.sign(claims(**{"kubernetes.io": None}))).code == "JWT_CLAIM_MISMATCH"
    flat = claims(**{"kubernetes.io": None, "kubernetes.io/namespace": "agent-safe-agents"})
    assert v.verify(signer.sign(flat), principals()).id == "treasury-workflow"
    deep = principals(required_claims={"kubernetes.io/serviceaccount/name": "treasury-workflow"})
    assert v.verify(signer.sign(claims()), deep).id == "treasury-workflow"
    typed = principals(required_claims={"level": 1})
    assert refused(v, signer.sign(claims(level="1")), typed).code == "JWT_CLAIM_MISMATCH"
    assert refused(v, signer.sign(claims(level=True)), typed).code == "JWT_CLAIM_MISMATCH"


def test_malformed_tokens(jwks_path: Path) -> None:
    v = verifier(jwks_path)
    for token in ["a.b", "a.b.c.d", "!!.!!.!!", "e30.e30.e30", "bm90anNvbg.e30.AA"]:
        assert refused(v, token).code in ("JWT_MALFORMED", "JWT_ALGORITHM_REFUSED")
    # not I-JSON: a key twice (a parser differential), a constant, an overflowing number
    for text in ['{"alg":"EdDSA","alg":"none"}', '{"alg":"EdDSA","exp":NaN}', '{"exp":1e999}']:
        part = base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()
        assert refused(v, f"{part}.e30.AA").code == "JWT_MALFORMED"
        assert refused(v, f"e30.{part}.AA").code == "JWT_MALFORMED"
    assert not looks_like_jwt("opaque-bearer-token")
    assert looks_like_jwt("e30.e30.")
    # a str may carry lone surrogates (surrogateescape); found by fuzzing, refused not raised
    assert not looks_like_jwt("e30.e30.\udcbd")
    assert refused(v, "e30.e30.\udcbd").code == "JWT_MALFORMED"


def test_kid_selects_the_key_and_unknown_kid_fails(tmp_path: Path) -> None:
    a, b = TokenSigner("EdDSA", kid="a"), TokenSigner("EdDSA", kid="b")
    v = verifier(write_jwks(tmp_path / "jwks.json", a, b))
    assert v.verify(b.sign(claims()), principals())
    c = TokenSigner("EdDSA", kid="c")
    assert refused(v, c.sign(claims())).code == "JWT_SIGNATURE_INVALID"


def test_jwks_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    old, new = TokenSigner("ES256", kid="old"), TokenSigner("ES256", kid="new")
    path = write_jwks(tmp_path / "jwks.json", old)
    security = MemorySink()
    source = JwksSource(path, security=security)
    v = WorkloadVerifier(source, audience=AUDIENCE, clock=ManualClock(NOW))
    assert v.verify(old.sign(claims()), principals())
    tmp = tmp_path / "jwks.json.tmp"
    write_jwks(tmp, new)
    os.replace(tmp, path)  # how a mounted file is rotated: a new inode
    assert v.verify(new.sign(claims()), principals())
    assert refused(v, old.sign(claims())).code == "JWT_SIGNATURE_INVALID"
    assert security.named("JWKS_RELOADED")[-1] == {"source": "file", "keys": 1}


def test_a_broken_jwks_file_keeps_the_last_good_set(tmp_path: Path) -> None:
    signer = TokenSigner("ES256")
    path = write_jwks(tmp_path / "jwks.json", signer)
    security = MemorySink()
    source = JwksSource(path, security=security)
    path.write_text("{ half written")
    assert source.current()[0].keys[0].kid == signer.kid
    assert source.current()[0].keys[0].kid == signer.kid
    assert len(security.named("JWKS_RELOAD_REFUSED")) == 1  # once per file state
    path.unlink()
    assert len(source.current()[0].keys) == 1


def test_an_unusable_jwks_file_at_start_is_a_refusal(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        JwksSource(tmp_path / "absent.json")
    assert info.value.variable == "EXECUTOR_JWKS_FILE"
    (tmp_path / "bad.json").write_text('{"keys": "nope"}')
    with pytest.raises(ConfigError):
        JwksSource(tmp_path / "bad.json")


def test_weak_and_foreign_keys_are_ignored() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    n, e = weak.public_numbers().n, weak.public_numbers().e
    b64 = base64.urlsafe_b64encode
    keys = parse_jwks(
        json.dumps(
            {
                "keys": [
                    {
                        "kty": "RSA",
                        "n": b64(n.to_bytes(128, "big")).rstrip(b"=").decode(),
                        "e": b64(e.to_bytes(3, "big")).rstrip(b"=").decode(),
                    },
                    {"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"},
                    {"kty": "oct", "k": "c2VjcmV0"},
                    {**TokenSigner("EdDSA").jwk(), "use": "enc"},
                ]
            }
        ).encode()
    )
    assert keys == (JwkSet(None, ()),)
    with pytest.raises(ValueError) as info:
        parse_jwks(b'{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}')
    assert "AQAB" not in str(info.value)


async def test_url_refresh_adds_keys_and_keeps_the_last_good_set(tmp_path: Path) -> None:
    file_signer, url_signer = TokenSigner("ES256", kid="file"), TokenSigner("RS256", kid="url")
    path = write_jwks(tmp_path / "jwks.json", file_signer)
    answers: list[bytes | Exception] = [
        json.dumps({"keys": [url_signer.jwk()]}).encode(),
        b"not json",
        OSError("connection refused"),
    ]

    async def fetch() -> bytes:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    security = MemorySink()
    source = JwksSource(path, security=security, fetch=fetch)
    v = WorkloadVerifier(source, audience=AUDIENCE, clock=ManualClock(NOW))
    assert refused(v, url_signer.sign(claims())).code == "JWT_SIGNATURE_INVALID"
    assert await source.refresh()
    assert v.verify(url_signer.sign(claims()), principals())
    assert v.verify(file_signer.sign(claims()), principals())
    assert not await source.refresh()
    assert not await source.refresh()
    assert v.verify(url_signer.sign(claims()), principals())
    assert len(security.named("JWKS_REFRESH_FAILED")) == 2


# ----------------------------------------------------------------------------- issue 16 item 6

OTHER_ISSUER = "https://oidc.other-cluster.example"


def two_issuers() -> PrincipalSet:
    """Two workload principals of two issuers (two clusters)."""
    doc = {
        "version": "agent-safe.principals/1",
        "principals": [
            {
                "id": pid,
                "role": "PROPOSER",
                "tenant_id": "00000000-0000-4000-8000-000000000001",
                "actor": {"id": pid, "type": "AI_AGENT"},
                "allowed_actions": ["forward_request"],
                "credential": {"kind": "WORKLOAD_JWT", "issuer": iss, "subject": SUBJECT},
            }
            for pid, iss in (("a-agent", ISSUER), ("b-agent", OTHER_ISSUER))
        ],
    }
    return parse_principals(
        json.dumps(doc), registered_actions=["forward_request"], jwt_configured=True,
        client_ca_configured=False,
    )  # fmt: skip


def test_a_key_of_issuer_b_never_verifies_a_token_claiming_issuer_a(tmp_path: Path) -> None:
    a, b = TokenSigner("ES256", kid="a-1"), TokenSigner("ES256", kid="b-1")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"issuers": [
        {"issuer": ISSUER, "keys": [a.jwk()]},
        {"issuer": OTHER_ISSUER, "keys": [b.jwk()]},
    ]}))  # fmt: skip
    v = verifier(path)
    ps = two_issuers()
    assert v.verify(a.sign(claims()), ps).id == "a-agent"
    assert v.verify(b.sign(claims(iss=OTHER_ISSUER)), ps).id == "b-agent"
    # B's key signs a token that claims A's issuer (and A's principal's subject)
    error = refused(v, b.sign(claims()), ps)
    assert error.code == "JWT_SIGNATURE_INVALID"
    assert refused(v, a.sign(claims(iss=OTHER_ISSUER)), ps).code == "JWT_SIGNATURE_INVALID"


def test_a_plain_jwks_with_several_issuers_is_refused_and_verifies_nothing(
    tmp_path: Path, signer: TokenSigner
) -> None:
    path = write_jwks(tmp_path / "jwks.json", signer)
    source = JwksSource(path)
    source.check_binding([ISSUER])  # one issuer: the plain set is that issuer's
    with pytest.raises(ConfigError) as info:
        source.check_binding([ISSUER, OTHER_ISSUER])
    assert info.value.code == "JWKS_INVALID"
    v = WorkloadVerifier(source, audience=AUDIENCE, clock=ManualClock(NOW))
    assert refused(v, signer.sign(claims()), two_issuers()).code == "JWT_SIGNATURE_INVALID"
    # a plain set may name its issuer itself
    path.write_text(json.dumps({"issuer": OTHER_ISSUER, "keys": [signer.jwk()]}))
    source.check_binding([ISSUER, OTHER_ISSUER])
    assert v.verify(signer.sign(claims(iss=OTHER_ISSUER)), two_issuers()).id == "b-agent"
    assert refused(v, signer.sign(claims()), two_issuers()).code == "JWT_SIGNATURE_INVALID"


@pytest.mark.parametrize(
    "document",
    [
        {"keys": [], "issuers": []},
        {"issuers": []},
        {"issuers": [{"keys": []}]},
        {"issuers": [{"issuer": "x", "keys": []}, {"issuer": "x", "keys": []}]},
        {"issuer": 7, "keys": []},
    ],
)
def test_bound_key_set_documents_are_checked(document: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_jwks(json.dumps(document).encode())


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf"])
@pytest.mark.parametrize("constant", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_times_are_refused(
    jwks_path: Path, signer: TokenSigner, claim: str, constant: float
) -> None:
    """A validly signed token whose exp is NaN or Infinity would never expire: refused."""
    token = signer.sign(claims(**{claim: constant}))  # json.dumps writes NaN / Infinity
    assert refused(verifier(jwks_path), token).code == "JWT_MALFORMED"


def test_huge_integer_times_are_refused(jwks_path: Path, signer: TokenSigner) -> None:
    token = signer.sign(claims(exp=10**400))
    assert refused(verifier(jwks_path), token).code == "JWT_CLAIM_MISMATCH"


def test_a_flat_and_a_nested_claim_that_disagree_are_refused(
    jwks_path: Path, signer: TokenSigner
) -> None:
    v = verifier(jwks_path)
    # the nested claim (how Kubernetes carries it) says "default"; a flat one says what we want
    lying = claims(**{"kubernetes.io": {"namespace": "default"},
                      "kubernetes.io/namespace": "agent-safe-agents"})  # fmt: skip
    assert refused(v, signer.sign(lying)).code == "JWT_CLAIM_MISMATCH"
    lying_flat = claims(**{"kubernetes.io/namespace": "default"})
    assert refused(v, signer.sign(lying_flat)).code == "JWT_CLAIM_MISMATCH"
    agreeing = claims(**{"kubernetes.io/namespace": "agent-safe-agents"})
    assert v.verify(signer.sign(agreeing), principals()).id == "treasury-workflow"


def test_a_crit_header_is_refused(jwks_path: Path, signer: TokenSigner) -> None:
    token = unsigned_token({"alg": "ES256", "kid": signer.kid, "crit": ["exp"]}, claims(), b"x")
    assert refused(verifier(jwks_path), token).code == "JWT_MALFORMED"
