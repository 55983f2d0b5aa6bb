"""Evidence bundles: the five files, never overwritten, nothing secret inside; the offline
verifier rejects one flipped byte in any file, a dropped file, swapped heads and a foreign key,
naming the file and the check."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.canonical import sha256_digest
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.door.refusal_lines import RefusalEvent
from agentsafe.executor.evidence import bundle as b
from agentsafe.executor.evidence.chain import ChainedStreams, open_chained_streams
from agentsafe.executor.evidence.redact import Redactor

SECRET = b"tok-9f8e7d6c5b4a39281706"


def make_streams(clock: ManualClock, redactor: Redactor | None = None) -> ChainedStreams:
    streams = open_chained_streams(
        evidence_out=io.StringIO(),
        security_out=io.StringIO(),
        clock=clock,
        window_lines=50,
        redactor=redactor,
    )
    for i in range(70):
        streams.evidence.emit("DECISION", {"intent_id": f"i-{i}", "verdict": "ALLOW"})
        if i % 7 == 0:
            streams.security.emit("AUTH_FAILED", {"principal": f"p-{i}"})
    return streams


def export(
    tmp_path: Path,
    clock: ManualClock,
    *,
    key: Ed25519PrivateKey | None = None,
    streams: ChainedStreams | None = None,
    redactor: Redactor | None = None,
) -> b.Manifest:
    streams = streams or make_streams(clock)
    return b.export_bundle(
        evidence_dir=tmp_path,
        reason="on-call took a bundle",
        streams=streams.sinks(),
        open_attempts=[
            {
                "attempt_id": "a-1",
                "intent_hash": sha256_digest({"x": 1}),
                "state": "GRANT_CLAIMED",
                "parameters": {"amount": 100, "iban": "DE89370400440532013000"},
                "intent": {"parameters": {"to": "someone"}},
            }
        ],
        posture={"ROOT_UID": {"ok": True}, "READ_ONLY_ROOT": {"ok": False, "waived": True}},
        config_digest=sha256_digest({"EXECUTOR_MODE": "ENFORCE"}),
        image_digest="sha256:" + "ab" * 32,
        secret_rotations={"DOWNSTREAM_CREDENTIAL": 2, "EXECUTOR_AUTH_TOKEN": 0},
        signing_key=key,
        clock=clock,
        redactor=redactor,
    )


def test_export_writes_five_files_into_a_new_directory_named_by_the_instant(
    tmp_path: Path,
) -> None:
    clock = ManualClock(1_772_445_600.0)  # 2026-03-02T10:00:00Z
    first = export(tmp_path, clock)
    second = export(tmp_path, clock)
    assert first.name == "2026-03-02T10-00-00-000Z"
    assert second.name == "2026-03-02T10-00-00-000Z-1"
    assert sorted(p.name for p in first.directory.iterdir()) == sorted(b.BUNDLE_FILES)
    manifest = json.loads((first.directory / "manifest.json").read_text())
    assert manifest == first.document
    assert manifest["image"] == {"digest": "sha256:" + "ab" * 32, "self_verified": False}
    assert manifest["secrets"] == [
        {"name": "DOWNSTREAM_CREDENTIAL", "rotations": 2},
        {"name": "EXECUTOR_AUTH_TOKEN", "rotations": 0},
    ]
    assert manifest["chains"]["evidence"]["lines"] == 50
    assert manifest["chains"]["evidence"]["head"]["seq"] == 70
    assert manifest["reason"] == "on-call took a bundle"
    assert "signature" not in manifest
    attempts = json.loads((first.directory / "open-attempts.json").read_text())
    assert attempts == {
        "open_attempts": [
            {"attempt_id": "a-1", "intent_hash": sha256_digest({"x": 1}), "state": "GRANT_CLAIMED"}
        ]
    }
    everything = b"".join(p.read_bytes() for p in first.directory.iterdir())
    assert b"DE89370400440532013000" not in everything
    assert b"someone" not in everything
    report = b.verify_bundle(first.directory, public_key=None)
    assert report.ok, report.problems
    assert report.level == b.INTERNAL_CONSISTENCY


def test_a_bundle_holds_no_secret_nor_its_digest(tmp_path: Path) -> None:
    clock = ManualClock()
    redactor = Redactor()
    redactor.set_secret("DOWNSTREAM_CREDENTIAL", SECRET)
    streams = make_streams(clock, redactor)
    streams.evidence.emit("OUTCOME", {"note": f"provider said {SECRET.decode()}"})
    manifest = export(tmp_path, clock, streams=streams, redactor=redactor)
    everything = b"".join(p.read_bytes() for p in manifest.directory.iterdir())
    assert SECRET not in everything
    for digest in (sha256_digest(SECRET.decode()), sha256_digest({"v": SECRET.decode()})):
        assert digest.encode() not in everything
    assert hashlib.sha256(SECRET).hexdigest().encode() not in everything
    assert b.verify_bundle(manifest.directory, public_key=None).ok


def test_signed_bundle_reaches_origin_only_with_the_readers_key(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    manifest = export(tmp_path, ManualClock(), key=key)
    assert manifest.document["signature"]["alg"] == "Ed25519"
    report = b.verify_bundle(manifest.directory, public_key=key.public_key())
    assert report.ok
    assert report.level == b.ORIGIN_AND_CONSISTENCY
    unsigned_view = b.verify_bundle(manifest.directory, public_key=None)
    assert unsigned_view.level == b.INTERNAL_CONSISTENCY
    other = Ed25519PrivateKey.generate().public_key()
    rejected = b.verify_bundle(manifest.directory, public_key=other)
    assert not rejected.ok
    assert [(p.file, p.check) for p in rejected.problems] == [("manifest.json", "SIGNATURE")]


def test_a_bundle_signed_by_another_key_is_rejected(tmp_path: Path) -> None:
    ours = Ed25519PrivateKey.generate()
    theirs = Ed25519PrivateKey.generate()
    manifest = export(tmp_path, ManualClock(), key=theirs)
    report = b.verify_bundle(manifest.directory, public_key=ours.public_key())
    assert [(p.file, p.check) for p in report.problems] == [("manifest.json", "SIGNATURE")]
    unsigned = export(tmp_path, ManualClock(), key=None)
    report = b.verify_bundle(unsigned.directory, public_key=ours.public_key())
    assert [(p.file, p.check) for p in report.problems] == [("manifest.json", "SIGNATURE")]


@pytest.mark.parametrize("filename", b.BUNDLE_FILES)
def test_one_flipped_byte_in_any_file_is_rejected_naming_the_file(
    tmp_path: Path, filename: str
) -> None:
    key = Ed25519PrivateKey.generate()
    manifest = export(tmp_path, ManualClock(), key=key)
    path = manifest.directory / filename
    original = path.read_bytes()
    for position in range(0, len(original), max(1, len(original) // 25)):
        data = bytearray(original)
        data[position] ^= 0x01
        path.write_bytes(bytes(data))
        report = b.verify_bundle(manifest.directory, public_key=None)
        assert not report.ok, (filename, position)
        assert filename in {p.file for p in report.problems}, (position, report.problems)
        signed = b.verify_bundle(manifest.directory, public_key=key.public_key())
        assert not signed.ok
    path.write_bytes(original)
    assert b.verify_bundle(manifest.directory, public_key=key.public_key()).ok


@pytest.mark.parametrize("filename", b.BUNDLE_FILES)
def test_a_dropped_file_is_rejected(tmp_path: Path, filename: str) -> None:
    manifest = export(tmp_path, ManualClock())
    (manifest.directory / filename).unlink()
    report = b.verify_bundle(manifest.directory, public_key=None)
    assert not report.ok
    assert (filename, "FILE_PRESENT") in {(p.file, p.check) for p in report.problems}


def rewrite_manifest(directory: Path, change: Any, key: Ed25519PrivateKey | None = None) -> None:
    """What a forger without our key can do: edit and recompute every unkeyed digest."""
    path = directory / "manifest.json"
    document = json.loads(path.read_text())
    document.pop("signature", None)
    document.pop("manifest_digest")
    change(document)
    if key is not None:
        document["signature"] = b._sign(document, key)
    document["manifest_digest"] = sha256_digest(document)
    path.write_bytes(b._manifest_bytes(document))


def test_swapped_heads_are_rejected_by_the_head_check(tmp_path: Path) -> None:
    manifest = export(tmp_path, ManualClock())

    def swap(document: dict[str, Any]) -> None:
        chains = document["chains"]
        chains["evidence"]["head"], chains["security"]["head"] = (
            chains["security"]["head"],
            chains["evidence"]["head"],
        )

    rewrite_manifest(manifest.directory, swap)
    report = b.verify_bundle(manifest.directory, public_key=None)
    assert {(p.file, p.check) for p in report.problems} == {
        ("evidence.jsonl", "HEAD"),
        ("security.jsonl", "HEAD"),
    }


def test_a_removed_tail_line_with_a_recomputed_digest_fails_the_head_check(
    tmp_path: Path,
) -> None:
    manifest = export(tmp_path, ManualClock())
    path = manifest.directory / "evidence.jsonl"
    shortened = b"".join(path.read_bytes().splitlines(keepends=True)[:-1])
    path.write_bytes(shortened)

    def refresh(document: dict[str, Any]) -> None:
        document["files"]["evidence.jsonl"] = {
            "sha256": "sha256:" + hashlib.sha256(shortened).hexdigest(),
            "bytes": len(shortened),
        }

    rewrite_manifest(manifest.directory, refresh)
    report = b.verify_bundle(manifest.directory, public_key=None)
    assert [(p.file, p.check) for p in report.problems] == [("evidence.jsonl", "HEAD")]


def test_an_extra_file_and_a_foreign_schema_are_rejected(tmp_path: Path) -> None:
    manifest = export(tmp_path, ManualClock())
    (manifest.directory / "public-key.pem").write_text("not trusted")
    report = b.verify_bundle(manifest.directory, public_key=None)
    assert [(p.file, p.check) for p in report.problems] == [("public-key.pem", "UNLISTED_FILE")]


def test_export_refusals(tmp_path: Path) -> None:
    clock = ManualClock()
    streams = make_streams(clock)
    common: dict[str, Any] = {
        "streams": streams.sinks(),
        "open_attempts": [],
        "posture": {},
        "config_digest": "sha256:" + "0" * 64,
        "image_digest": None,
        "secret_rotations": {},
        "signing_key": None,
        "clock": clock,
    }
    with pytest.raises(b.BundleError) as info:
        b.export_bundle(evidence_dir=tmp_path, reason="", **common)
    assert info.value.code == "EVIDENCE_REASON_INVALID"
    occupied = tmp_path / "a-file"
    occupied.write_text("")
    with pytest.raises(b.BundleError) as info:
        b.export_bundle(evidence_dir=occupied, reason="x", **common)
    assert info.value.code == "EVIDENCE_DIR"
    assert list(tmp_path.iterdir()) == [occupied]


def test_export_creates_a_missing_evidence_directory(tmp_path: Path) -> None:
    """A fresh volume (the operator renders EXECUTOR_EVIDENCE_DIR on the data volume) has no
    evidence directory yet: the first export creates it, owner-only (issue 22)."""
    clock = ManualClock()
    root = tmp_path / "data" / "evidence"
    bundle = b.export_bundle(
        evidence_dir=root,
        reason="incident 7",
        streams=make_streams(clock).sinks(),
        open_attempts=[],
        posture={},
        config_digest="sha256:" + "0" * 64,
        image_digest=None,
        secret_rotations={},
        signing_key=None,
        clock=clock,
    )
    assert root.is_dir()
    assert root.stat().st_mode & 0o777 == 0o700
    assert bundle.directory.parent == root


def test_cli_reads_the_key_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = Ed25519PrivateKey.generate()
    manifest = export(tmp_path, ManualClock(), key=key)
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    for value in (
        pem.decode(),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    ):
        assert b.main([str(manifest.directory)], {b.PUBLIC_KEY_ENV: value}) == 0
        assert capsys.readouterr().out.startswith("ORIGIN_AND_CONSISTENCY")
    assert b.main([str(manifest.directory)], {}) == 0
    assert capsys.readouterr().out.startswith("INTERNAL_CONSISTENCY")
    other = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    assert (
        b.main([str(manifest.directory)], {b.PUBLIC_KEY_ENV: base64.b64encode(other).decode()}) == 1
    )
    out = capsys.readouterr().out
    assert "REJECTED" in out
    assert "manifest.json: SIGNATURE" in out
    assert b.main([str(manifest.directory)], {b.PUBLIC_KEY_ENV: "not a key"}) == 2
    assert b.main([], {}) == 2


# ----------------------------------------------------------------------------- issue 16 item 9


def flooded_streams(clock: ManualClock) -> ChainedStreams:
    """An operator's halt, then a flood of door refusals ten times the window."""
    streams = open_chained_streams(
        evidence_out=io.StringIO(), security_out=io.StringIO(), clock=clock, window_lines=100,
        routine_security_events=frozenset(RefusalEvent),
    )  # fmt: skip
    streams.security.emit("PRINCIPAL_LOCKED", {"principal": "agent", "lock_seconds": 300})
    streams.security.emit("HALTED", {"cause": "OPERATOR", "reason": "incident 42"})
    for _ in range(1000):
        streams.security.emit("AUTH_FAILED", {"method": "bearer", "code": "AUTH_FAILED"})
    streams.security.emit("RESUMED", {"principal": "ops", "reason": "fixed"})
    for _ in range(10):
        streams.security.emit("AUTH_FAILED", {"method": "none", "code": "AUTH_REQUIRED"})
    return streams


def test_a_flood_of_refusals_never_evicts_the_operators_lines(tmp_path: Path) -> None:
    clock = ManualClock(1_772_445_600.0)
    manifest = export(tmp_path, clock, streams=flooded_streams(clock))
    lines = [json.loads(x) for x in (manifest.directory / "security.jsonl").read_text().split("\n")
             if x]  # fmt: skip
    events = [line["event"] for line in lines]
    assert events[:2] == ["PRINCIPAL_LOCKED", "HALTED"]
    assert "RESUMED" in events
    assert events.count("AUTH_FAILED") == 100  # the routine window, never more
    chain = manifest.document["chains"]["security"]
    assert chain["elided"] == [[3, 912]]
    assert chain["head"]["seq"] == 1013
    report = b.verify_bundle(manifest.directory, public_key=None)
    assert report.ok, report.problems
    kinds = {f.kind for f in report.chains["security"].findings}
    assert kinds == {"ELIDED"}


def test_an_undeclared_or_a_tampered_elision_is_caught(tmp_path: Path) -> None:
    clock = ManualClock(1_772_445_600.0)
    manifest = export(tmp_path, clock, streams=flooded_streams(clock))
    path = manifest.directory / "manifest.json"
    document = json.loads(path.read_text())
    for elided, check in (([], "CHAIN"), ([[3, 911]], "CHAIN"), ("3-912", "MANIFEST_CHAINS")):
        document["chains"]["security"]["elided"] = elided
        body = {k: v for k, v in document.items() if k != "manifest_digest"}
        document["manifest_digest"] = sha256_digest(body)
        path.write_bytes(b._manifest_bytes(document))
        report = b.verify_bundle(manifest.directory, public_key=None)
        assert not report.ok
        assert check in {p.check for p in report.problems}
