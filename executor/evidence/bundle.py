"""Incident evidence bundles: ``export_bundle`` writes one, ``verify_bundle`` checks one offline.

A bundle is a new directory under ``EXECUTOR_EVIDENCE_DIR`` named by the instant
(``2026-03-02T10-00-00-000Z``, with ``-1``, ``-2``... if taken; never overwritten) holding five
files: ``evidence.jsonl`` and ``security.jsonl`` (the window of each chained stream), the open
attempts by identifier and state, the posture by check, and ``manifest.json``, which digests the
other four and carries the chain heads, the configuration digest, the platform's image digest
(``self_verified: false``), every secret's name with its rotation count, the reason and the time.
With a signing key the manifest carries an Ed25519 ``signature`` over its canonical form without
``signature`` and ``manifest_digest``; ``manifest_digest`` covers everything else, signature
included. Under ``EXECUTOR_WORKERS`` above 1 the worker that answers the export asks every other
worker for its windows (``host/workers.py``) and the bundle holds them too, as
``<stream>.worker-<j>.jsonl`` beside its own (every chain entry names its ``worker``; the
manifest's ``workers`` names the exporter and any worker that did not answer in time).

``verify_bundle`` establishes INTERNAL_CONSISTENCY, or ORIGIN_AND_CONSISTENCY when the signature
verifies against a public key the reader supplies (``AGENTSAFE_EVIDENCE_PUBLIC_KEY``) — never a key
found in the bundle. A bundle never holds a secret, a digest of a secret, a request parameter or
a provider body.

Callers: the ``/v1/control/evidence-export`` route (``export_bundle``), the CLI
(``agentsafe verify bundle`` -> :func:`main`), tests. Layout: ``docs/evidence.md``.
Also imported by ``cli.py``, ``plane.py``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .. import base64url
from ..canonical import canonical_json, parse_json, sha256_digest, sha256_hex
from ..clock import Clock, format_ms
from ..codes import Code
from ..errors import AgentSafeError, CanonicalizationError
from ..events import EVIDENCE_SCHEMA, SECURITY_SCHEMA
from ..host.durable import fsync_directory, write_all
from .chain import ChainedSink, ChainHead, ChainSnapshot
from .chainverify import ChainReport, chain_key, verify_chain
from .redact import Redactor

__all__ = [
    "BUNDLE_FILES",
    "INTERNAL_CONSISTENCY",
    "MANIFEST_SCHEMA",
    "ORIGIN_AND_CONSISTENCY",
    "PUBLIC_KEY_ENV",
    "BundleError",
    "BundleProblem",
    "BundleReport",
    "Manifest",
    "export_bundle",
    "load_public_key",
    "main",
    "verify_bundle",
]

MANIFEST_SCHEMA = "agent-safe.evidence-bundle/1"
MANIFEST = "manifest.json"
STREAM_FILES = {"evidence": "evidence.jsonl", "security": "security.jsonl"}
STREAM_SCHEMAS = {"evidence": EVIDENCE_SCHEMA, "security": SECURITY_SCHEMA}
OPEN_ATTEMPTS = "open-attempts.json"
POSTURE = "posture.json"
BUNDLE_FILES = (*STREAM_FILES.values(), OPEN_ATTEMPTS, POSTURE, MANIFEST)
INTERNAL_CONSISTENCY = "INTERNAL_CONSISTENCY"
ORIGIN_AND_CONSISTENCY = "ORIGIN_AND_CONSISTENCY"
PUBLIC_KEY_ENV = "AGENTSAFE_EVIDENCE_PUBLIC_KEY"
MAX_REASON_LENGTH = 1024

#: What an open attempt may say in a bundle: identifiers and state, never parameters.
ATTEMPT_FIELDS = frozenset(
    {
        "attempt_id",
        "intent_id",
        "intent_hash",
        "decision_id",
        "dossier_id",
        "grant_id",
        "action",
        "tenant",
        "caller_principal",
        "state",
        "status",
        "outcome",
        "opened_at",
        "claimed_at",
        "grant_expires_at",
        "execution_payload_digest",
    }
)


class BundleError(AgentSafeError):
    code: Code = Code.EVIDENCE_EXPORT_FAILED

    def __init__(self, message: str, *, code: Code | None = None) -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True)
class Manifest:
    """The manifest written, and the directory it was written to."""

    directory: Path
    document: dict[str, Any]

    @property
    def name(self) -> str:
        return self.directory.name


@dataclass(frozen=True)
class BundleProblem:
    """A failed check: which file and which check; never file content."""

    file: str
    check: str
    detail: str

    def describe(self) -> str:
        return f"{self.file}: {self.check}: {self.detail}"


@dataclass(frozen=True)
class BundleReport:
    problems: tuple[BundleProblem, ...]
    level: str | None  # INTERNAL_CONSISTENCY / ORIGIN_AND_CONSISTENCY when ok
    chains: dict[str, ChainReport]

    @property
    def ok(self) -> bool:
        return not self.problems and self.level is not None


# -- export ---------------------------------------------------------------------------------


def export_bundle(
    *,
    evidence_dir: str | os.PathLike[str],
    reason: str,
    streams: Mapping[str, ChainedSink],
    open_attempts: Sequence[Mapping[str, Any]],
    posture: Mapping[str, Any],
    config_digest: str,
    image_digest: str | None,
    secret_rotations: Mapping[str, int],
    signing_key: Ed25519PrivateKey | None,
    clock: Clock,
    redactor: Redactor | None = None,
    peers: Mapping[int, Mapping[str, ChainSnapshot]] | None = None,
    workers: Mapping[str, Any] | None = None,
) -> Manifest:
    """Write a new bundle directory; raises :class:`BundleError` and leaves no partial manifest.

    ``peers`` (``EXECUTOR_WORKERS``): the other workers' windows by worker index, each written
    as ``<stream>.worker-<j>.jsonl`` with its chain entry ``<stream>@worker-<j>``; ``workers``
    says which worker exported and which did not answer."""
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_LENGTH:
        raise BundleError("reason must be 1..1024 characters", code=Code.EVIDENCE_REASON_INVALID)
    if set(streams) != set(STREAM_FILES):
        raise BundleError("both evidence and security streams are required")
    if redactor is not None:
        reason, _ = redactor.redact(reason)
    snapshots = {name: sink.snapshot() for name, sink in streams.items()}
    now = clock.now()
    created_at = format_ms(now)
    directory = _new_directory(Path(evidence_dir), created_at)
    files: dict[str, bytes] = {}
    for name, filename in STREAM_FILES.items():
        files[filename] = "".join(line + "\n" for line in snapshots[name].lines).encode("utf-8")
    attempts = [_attempt_summary(a, redactor) for a in open_attempts]
    files[OPEN_ATTEMPTS] = _json_file({"open_attempts": attempts})
    files[POSTURE] = _json_file({"posture": _scrub(dict(posture), redactor)})
    chains: dict[str, Any] = {}
    for name, snapshot in snapshots.items():
        chains[name] = {
            "schema": STREAM_SCHEMAS[name],
            "file": STREAM_FILES[name],
            "lines": len(snapshot.lines),
            "head": _head(snapshot.head) if snapshot.lines else None,
            "elided": [list(r) for r in snapshot.elided],
        }
        worker = streams[name].worker
        if worker is not None:  # EXECUTOR_WORKERS: the chain of the worker that exported
            chains[name]["worker"] = worker
    for index, windows in sorted((peers or {}).items()):
        for name in STREAM_FILES:
            snapshot = windows[name]
            filename = peer_file(name, index)
            files[filename] = "".join(line + "\n" for line in snapshot.lines).encode("utf-8")
            chains[f"{name}@worker-{index}"] = {
                "schema": STREAM_SCHEMAS[name],
                "file": filename,
                "lines": len(snapshot.lines),
                "head": _head(snapshot.head) if snapshot.lines else None,
                "elided": [list(r) for r in snapshot.elided],
                "worker": index,
            }
    document: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "created_at": created_at,
        "reason": reason,
        "files": {
            filename: {"sha256": "sha256:" + sha256_hex(data), "bytes": len(data)}
            for filename, data in files.items()
        },
        "chains": chains,
        **({"workers": dict(workers)} if workers is not None else {}),
        "config_digest": config_digest,
        "image": {"digest": image_digest, "self_verified": False},
        "secrets": [
            {"name": name, "rotations": int(count)}
            for name, count in sorted(secret_rotations.items())
        ],
    }
    if signing_key is not None:
        document["signature"] = _sign(document, signing_key)
    # Over everything else, the signature included: a changed byte anywhere in the manifest is
    # caught even by a reader without the key (this proves integrity, not origin).
    document["manifest_digest"] = sha256_digest(document)
    try:
        for filename, data in files.items():
            _write_new(directory / filename, data)
        _write_new(directory / MANIFEST, _manifest_bytes(document))
        fsync_directory(directory)
    except OSError as exc:
        raise BundleError("the bundle could not be written") from exc
    return Manifest(directory, document)


def _new_directory(root: Path, created_at: str) -> Path:
    base = created_at.replace(":", "-").replace(".", "-")
    with contextlib.suppress(OSError):  # a fresh volume has none yet; refused below if unusable
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not root.is_dir():
        raise BundleError("the evidence directory is not a directory", code=Code.EVIDENCE_DIR)
    for attempt in range(1000):
        candidate = root / (base if attempt == 0 else f"{base}-{attempt}")
        try:
            candidate.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise BundleError(
                "the evidence directory is not writable", code=Code.EVIDENCE_DIR
            ) from exc
        return candidate
    raise BundleError("too many bundles for one instant", code=Code.EVIDENCE_DIR)


def peer_file(stream: str, worker: int) -> str:
    """The file of another worker's window of ``stream`` in a bundle (``EXECUTOR_WORKERS``)."""
    return f"{stream}.worker-{worker}.jsonl"


def _peer_chains(claimed: Any) -> dict[str, tuple[str, str, int]]:
    """The other workers' chain entries a manifest claims: name -> (stream, file, worker)."""
    out: dict[str, tuple[str, str, int]] = {}
    for key in claimed if isinstance(claimed, dict) else ():
        stream, _, tail = str(key).partition("@worker-")
        if stream in STREAM_FILES and tail.isdigit() and len(tail) <= 6:
            out[str(key)] = (stream, peer_file(stream, int(tail)), int(tail))
    return out


def _head(head: ChainHead | None) -> dict[str, Any] | None:
    return None if head is None else {"seq": head.seq, "hash": head.hash}


def _attempt_summary(attempt: Mapping[str, Any], redactor: Redactor | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(ATTEMPT_FIELDS.intersection(attempt)):
        value = attempt[key]
        if isinstance(value, bool) or value is None:
            out[key] = value
        elif isinstance(value, int | float | str):
            out[key] = _scrub(value, redactor)
    return out


def _scrub(value: Any, redactor: Redactor | None) -> Any:
    """A JSON-able copy of ``value`` with every string through the redactor."""
    if isinstance(value, str):
        return redactor.redact(value)[0] if redactor is not None else value
    if isinstance(value, Mapping):
        return {str(k): _scrub(v, redactor) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, redactor) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _scrub(str(value), redactor)


def _json_file(value: Any) -> bytes:
    try:
        return canonical_json(value) + b"\n"
    except CanonicalizationError as exc:
        raise BundleError("a bundle file has no canonical JSON form") from exc


def _manifest_bytes(document: Mapping[str, Any]) -> bytes:
    return canonical_json(document) + b"\n"


def _signed_part(document: Mapping[str, Any]) -> bytes:
    """The manifest without ``signature`` and ``manifest_digest``: what the key signs."""
    return canonical_json(
        {k: v for k, v in document.items() if k not in ("signature", "manifest_digest")}
    )


def _sign(document: Mapping[str, Any], key: Ed25519PrivateKey) -> dict[str, str]:
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return {
        "alg": "Ed25519",
        "key_id": "sha256:" + sha256_hex(public),
        "value": base64.urlsafe_b64encode(key.sign(_signed_part(document))).decode().rstrip("="),
    }


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


# -- verification ---------------------------------------------------------------------------


def verify_bundle(
    directory: str | os.PathLike[str], *, public_key: Ed25519PublicKey | None
) -> BundleReport:
    """Check a bundle offline; every failure names the file and the check."""
    root = Path(directory)
    problems: list[BundleProblem] = []
    chains: dict[str, ChainReport] = {}

    def fail(file: str, check: str, detail: str) -> BundleReport:
        problems.append(BundleProblem(file, check, detail))
        return BundleReport(tuple(problems), None, chains)

    try:
        raw_manifest = (root / MANIFEST).read_bytes()
    except FileNotFoundError:
        return fail(MANIFEST, "FILE_PRESENT", "the manifest is missing")
    except OSError:
        return fail(MANIFEST, "FILE_READABLE", "the manifest cannot be read")
    try:
        document = parse_json(raw_manifest)
    except (ValueError, CanonicalizationError, RecursionError):
        return fail(MANIFEST, "MANIFEST_PARSE", "the manifest is not JSON")
    if not isinstance(document, dict) or document.get("schema") != MANIFEST_SCHEMA:
        return fail(MANIFEST, "MANIFEST_SCHEMA", f"the manifest is not {MANIFEST_SCHEMA}")
    try:
        canonical = _manifest_bytes(document)
    except CanonicalizationError:
        canonical = b""
    if canonical != raw_manifest:
        problems.append(
            BundleProblem(MANIFEST, "MANIFEST_CANONICAL", "not in the canonical form written")
        )
    body = {k: v for k, v in document.items() if k != "manifest_digest"}
    try:
        digest_ok = sha256_digest(body) == document.get("manifest_digest")
    except CanonicalizationError:
        digest_ok = False
    if not digest_ok:
        problems.append(
            BundleProblem(MANIFEST, "MANIFEST_DIGEST", "manifest_digest does not match")
        )

    listed = document.get("files")
    peers = _peer_chains(document.get("chains"))
    peer_files = {filename for _, filename, _ in peers.values()}
    if not isinstance(listed, dict) or set(listed) != (set(BUNDLE_FILES) - {MANIFEST}) | peer_files:
        return fail(MANIFEST, "MANIFEST_FILES", "the manifest does not list the four files")
    try:
        present = {p.name for p in root.iterdir()}
    except OSError:
        return fail(".", "DIRECTORY_READABLE", "the bundle directory cannot be listed")
    for extra in sorted(present - set(BUNDLE_FILES) - peer_files):
        problems.append(BundleProblem(extra, "UNLISTED_FILE", "a file the manifest does not list"))
    contents: dict[str, bytes] = {}
    for filename in sorted(listed):
        entry = listed[filename]
        try:
            data = (root / filename).read_bytes()
        except FileNotFoundError:
            problems.append(BundleProblem(filename, "FILE_PRESENT", "the file is missing"))
            continue
        except OSError:
            problems.append(BundleProblem(filename, "FILE_READABLE", "the file cannot be read"))
            continue
        contents[filename] = data
        expected = entry.get("sha256") if isinstance(entry, dict) else None
        if "sha256:" + sha256_hex(data) != expected:
            problems.append(
                BundleProblem(filename, "FILE_DIGEST", "the digest differs from the manifest")
            )

    claimed_chains = document.get("chains")
    if not isinstance(claimed_chains, dict) or set(claimed_chains) != set(STREAM_FILES) | set(
        peers
    ):
        problems.append(BundleProblem(MANIFEST, "MANIFEST_CHAINS", "chain heads missing"))
        claimed_chains = {}
    walks: list[tuple[str, str, str, int | None]] = [
        (name, name, filename, None) for name, filename in STREAM_FILES.items()
    ]
    walks += [(key, stream, f, worker) for key, (stream, f, worker) in sorted(peers.items())]
    for key, name, filename, peer in walks:
        if filename not in contents:
            continue
        claim = claimed_chains.get(key)
        lines = contents[filename].decode("utf-8", errors="replace").split("\n")
        elided = _elided(claim)
        if elided is None:
            problems.append(BundleProblem(MANIFEST, "MANIFEST_CHAINS", "elided is malformed"))
            elided = ()
        report = verify_chain(lines, elided=elided)
        chains[key] = report
        bad = report.first_bad
        if bad is not None:
            problems.append(BundleProblem(filename, "CHAIN", f"{bad.describe()}: {bad.detail}"))
        worker = claim.get("worker") if isinstance(claim, dict) else None
        if (worker is not None and (type(worker) is not int or worker < 0)) or (
            peer is not None and worker != peer
        ):
            problems.append(BundleProblem(MANIFEST, "MANIFEST_CHAINS", "worker is malformed"))
            worker = peer
        expected = chain_key(STREAM_SCHEMAS[name], worker)
        foreign_schemas = set(report.streams) - {expected}
        if foreign_schemas or report.foreign_lines:
            problems.append(
                BundleProblem(filename, "CHAIN_SCHEMA", f"lines that are not {name} chain lines")
            )
        summary = report.streams.get(expected)
        actual = None if summary is None else {"seq": summary.last_seq, "hash": summary.last_hash}
        if not isinstance(claim, dict) or claim.get("head") != actual:
            problems.append(
                BundleProblem(filename, "HEAD", "the last line is not the head the manifest claims")
            )

    signature = document.get("signature")
    level = INTERNAL_CONSISTENCY
    if public_key is not None:
        if not isinstance(signature, dict):
            problems.append(
                BundleProblem(MANIFEST, "SIGNATURE", "a key was given; the bundle is unsigned")
            )
        elif not _signature_verifies(document, signature, public_key):
            problems.append(
                BundleProblem(MANIFEST, "SIGNATURE", "the signature does not verify with the key")
            )
        else:
            level = ORIGIN_AND_CONSISTENCY
    if problems:
        return BundleReport(tuple(problems), None, chains)
    return BundleReport((), level, chains)


def _elided(claim: Any) -> tuple[tuple[int, int], ...] | None:
    """The ranges a chain's manifest entry declares left out (``[]`` if it names none)."""
    raw = claim.get("elided", []) if isinstance(claim, dict) else []
    if not isinstance(raw, list):
        return None
    out: list[tuple[int, int]] = []
    for entry in raw:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not all(type(n) is int and n >= 1 for n in entry)
            or entry[0] > entry[1]
        ):
            return None
        out.append((entry[0], entry[1]))
    return tuple(out)


def _signature_verifies(
    document: Mapping[str, Any], signature: Mapping[str, Any], key: Ed25519PublicKey
) -> bool:
    value = signature.get("value")
    if signature.get("alg") != "Ed25519" or not isinstance(value, str):
        return False
    try:
        raw = base64url.decode(value)
        key.verify(raw, _signed_part(document))
    except (binascii.Error, ValueError, InvalidSignature, CanonicalizationError):
        return False
    return True


def load_public_key(text: str) -> Ed25519PublicKey:
    """A reader's key: PEM SubjectPublicKeyInfo, or base64 / base64url of the raw 32 bytes."""
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(stripped.encode("ascii"))
        except (ValueError, UnicodeEncodeError) as exc:
            raise ValueError("not a PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
        return key
    try:
        normalised = stripped.replace("-", "+").replace("_", "/")
        raw = base64.b64decode(normalised + "=" * (-len(normalised) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64") from exc
    if len(raw) != 32:
        raise ValueError("not 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def format_report(report: BundleReport) -> str:
    if report.ok:
        out = [report.level or ""]
        for name, chain in report.chains.items():
            for gap in chain.gaps:
                out.append(f"  {name}: {gap.describe()}: {gap.detail}")
        return "\n".join(out)
    return "\n".join(["REJECTED", *(f"  {p.describe()}" for p in report.problems)])


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``agentsafe verify bundle <dir>``: 0 consistent, 1 rejected, 2 usage or key error."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: agentsafe verify bundle <dir>", file=sys.stderr)
        return 2
    key = None
    key_text = env.get(PUBLIC_KEY_ENV)
    if key_text:
        try:
            key = load_public_key(key_text)
        except ValueError as exc:
            print(f"{PUBLIC_KEY_ENV}: {exc}", file=sys.stderr)
            return 2
    report = verify_bundle(args[0], public_key=key)
    print(format_report(report))
    return 0 if report.ok else 1
