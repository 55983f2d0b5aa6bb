"""Fuzz targets: one per parser that takes untrusted input (issue 23).

Each target takes the fuzzer's bytes, feeds them to one parser exactly as the executor would,
and lets through only the parser's documented refusal (``RequestRejected``, ``TokenRefused``,
``JwtRefused``, ``SignatureError``, ``PrincipalsFileError``, ``PolicyError``, ``JournalError``,
``CITATION_REFUSED``). Anything else (a crash, a ``KeyError``, a ``RecursionError``) is a
finding, and so is a broken invariant (a canonical form that does not round-trip, a citation
whose canonical form canonicalises to something else). ``tests/fuzz/run.py`` drives them under
atheris; ``tests/fuzz/test_corpus.py`` replays ``tests/fuzz/corpus/<target>/`` in the suite.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TARGETS"]

Target = Callable[[bytes], None]
_SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None  # file-backed targets: use memory


def _scratch(prefix: str) -> Path:
    """A directory for a file-backed target, removed when the process ends."""
    directory = Path(tempfile.mkdtemp(dir=_SCRATCH, prefix=prefix))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


# -- the request body reader and strict schema -----------------------------------------------


def body(data: bytes) -> None:
    """``routes/app.parse_body`` (what ``read_json`` does with a body once it is read whole,
    under its deadline) on the body, then each route's strict schema: only ``RequestRejected``
    (``REQUEST_INVALID`` for a schema refusal). The models are the body models of the route
    table's ``POST`` rows (``routes/app.py``, ``routes/approvals.py``). aiohttp's own header
    and framing parsing is not ours to fuzz."""
    from pydantic import ValidationError

    from agentsafe.executor.errors import RequestRejected
    from agentsafe.executor.routes import app
    from agentsafe.executor.routes.approvals import DecisionRequest

    try:
        value = app.parse_body(data)
    except RequestRejected:
        return
    models = (app.ActionRequest, app.RecoveryRequest, app.EscalationRequest, DecisionRequest)
    for model in models:
        try:
            model.model_validate(value)
        except ValidationError as exc:
            refusal = app._schema_error(exc)
            if refusal.code != "REQUEST_INVALID":
                raise AssertionError(refusal.code) from exc


# -- RFC 8785 --------------------------------------------------------------------------------


def canonical(data: bytes) -> None:
    """``canonical_json`` of any JSON value: refuses only with its own error, and its output
    parses back to the same value and is its own canonical form."""
    from agentsafe.executor.canonical import canonical_json
    from agentsafe.executor.errors import CanonicalizationError

    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        out = canonical_json(value)
    except CanonicalizationError:
        return
    # Read the output as an RFC 8785 consumer does: every number is a double, so an integer
    # text beyond 2**53 (1e20 is written 100000000000000000000) is that double again.
    again = json.loads(out, parse_int=_as_double_if_inexact)
    assert canonical_json(again) == out
    assert _same_json(again, value)


def _as_double_if_inexact(text: str) -> int | float:
    number = int(text)
    return number if abs(number) <= 2**53 else float(number)


def _same_json(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


# -- compact JWS (grants and hand-outs) and JWT (workload identity) --------------------------

_jws_state: dict[str, Any] = {}


def jws(data: bytes) -> None:
    """``grants.verify_jws`` under a fixed key: only ``TokenRefused``, and never a payload
    from a token the key did not sign."""
    from agentsafe.executor.grants import KeySet, SigningKey, TokenRefused, verify_jws

    if not _jws_state:
        key = SigningKey.generate()
        _jws_state.update(keys=KeySet((key,)))
    try:
        verify_jws(_text(data), typ="agentsafe-grant+jwt", keys=_jws_state["keys"])
    except TokenRefused:
        return
    raise AssertionError("a token nobody signed verified")


_jwt_state: dict[str, Any] = {}


def jwt(data: bytes) -> None:
    """``door/workload.WorkloadVerifier.verify``: only ``JwtRefused``."""
    from agentsafe.executor.clock import ManualClock
    from agentsafe.executor.door.principals_file import parse_principals
    from agentsafe.executor.door.workload import JwksSource, JwtRefused, WorkloadVerifier

    if not _jwt_state:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        public = (
            Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        )
        x = base64.urlsafe_b64encode(public).rstrip(b"=").decode()
        jwks = {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "k1", "alg": "EdDSA"}]}
        directory = _scratch("agentsafe-fuzz-jwt-")
        (directory / "jwks.json").write_text(json.dumps(jwks))
        principals = parse_principals(
            {
                "version": "agent-safe.principals/1",
                "principals": [
                    {
                        "id": "agent",
                        "role": "PROPOSER",
                        "tenant_id": "7c0e5f2a-4d1b-4c3e-9f60-2b8a1d9e0c11",
                        "actor": {"id": "a", "type": "ai_agent"},
                        "allowed_actions": ["create_payout"],
                        "credential": {
                            "kind": "WORKLOAD_JWT",
                            "issuer": "https://kubernetes.default.svc",
                            "subject": "system:serviceaccount:agents:agent",
                        },
                    }
                ],
            },
            registered_actions=("create_payout",),
            jwt_configured=True,
            client_ca_configured=False,
        )
        verifier = WorkloadVerifier(
            JwksSource(directory / "jwks.json"), audience="agentsafe", clock=ManualClock()
        )
        _jwt_state.update(verifier=verifier, principals=principals)
    try:
        _jwt_state["verifier"].verify(_text(data), _jwt_state["principals"])
    except JwtRefused:
        return
    raise AssertionError("a token nobody signed verified")


# -- structured fields and signature input (RFC 8941 / RFC 9421) -----------------------------


def signature_input(data: bytes) -> None:
    """``egress/httpsig`` header parsers: only ``SignatureError``."""
    from agentsafe.executor.egress.httpsig import (
        SignatureError,
        parse_content_digest,
        parse_signature,
        parse_signature_input,
    )

    text = _text(data)
    for parse in (parse_signature_input, parse_signature, parse_content_digest):
        with contextlib.suppress(SignatureError):
            parse(text)  # type: ignore[operator]


# -- the principals file ---------------------------------------------------------------------


def principals(data: bytes) -> None:
    """``parse_principals`` on a file's bytes: only ``PrincipalsFileError``."""
    from agentsafe.executor.door.principals_file import PrincipalsFileError, parse_principals

    for jwt_configured in (False, True):
        with contextlib.suppress(PrincipalsFileError):
            parse_principals(
                data,
                registered_actions=("create_payout",),
                jwt_configured=jwt_configured,
                client_ca_configured=jwt_configured,
            )


# -- the policy document ---------------------------------------------------------------------

_policy_dir: list[Path] = []


def policy(data: bytes) -> None:
    """``load_policy`` then ``compile_policy`` on a file's bytes (as ``.yaml`` or ``.json``): only
    ``PolicyError``."""
    from agentsafe.executor.errors import PolicyError
    from agentsafe.executor.policy.policy import compile_policy, load_policy

    if not _policy_dir:
        _policy_dir.append(_scratch("agentsafe-fuzz-policy-"))
    # The last byte picks the reader, so both the YAML and the strict JSON path see every shape
    # of input at half the cost per input.
    name = "policy.json" if data and data[-1] % 2 else "policy.yaml"
    path = _policy_dir[0] / name
    path.write_bytes(data)
    with contextlib.suppress(PolicyError):
        compile_policy(load_policy(path))


# -- journal recovery ------------------------------------------------------------------------

_journal_dir: list[Path] = []
_JOURNAL_NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def journal(data: bytes) -> None:
    """``scan_journal`` (startup recovery) over a day file holding the input: only
    ``JournalError``."""
    from agentsafe.executor.errors import JournalError
    from agentsafe.executor.state.journal import ATTEMPTS_DIR, scan_journal

    if not _journal_dir:
        root = _scratch("agentsafe-fuzz-journal-")
        (root / ATTEMPTS_DIR).mkdir()
        _journal_dir.append(root)
    root = _journal_dir[0]
    (root / ATTEMPTS_DIR / "2026-01-01.jsonl").write_bytes(data)
    try:
        scan = scan_journal(root, retain_days=2, now=_JOURNAL_NOW)
    except JournalError:
        return
    for attempt in scan.open_attempts:
        assert attempt.attempt_id


# -- citation URLs ---------------------------------------------------------------------------


def citations(data: bytes) -> None:
    """``plans/citations``: only ``CITATION_REFUSED``; a canonical citation is a fixed point."""
    from agentsafe.executor.plans.citations import (
        canonical_citation,
        canonical_origin,
        canonical_resource_prefix,
        citation_allowed,
    )
    from agentsafe.executor.plans.errors import AgentSafetyError

    text = _text(data)
    try:
        url, origin, path = canonical_citation(text)
    except AgentSafetyError as exc:
        _expect_code(exc, "CITATION_REFUSED")
    else:
        assert canonical_citation(url) == (url, origin, path)
        assert citation_allowed(origin, path, origins=[origin], prefixes=["/"])
    for parse in (canonical_origin, canonical_resource_prefix):
        try:
            parse(text)
        except AgentSafetyError as exc:
            _expect_code(exc, "CITATION_REFUSED")


def _expect_code(exc: Exception, code: str) -> None:
    if getattr(exc, "code", None) != code:
        raise AssertionError(f"refused with {getattr(exc, 'code', None)}, not {code}") from exc


TARGETS: dict[str, Target] = {
    "body": body,
    "canonical": canonical,
    "jws": jws,
    "jwt": jwt,
    "signature_input": signature_input,
    "principals": principals,
    "policy": policy,
    "journal": journal,
    "citations": citations,
}
