"""``make release`` for real: a TLS registry on loopback, a generated key, stock cosign verifying.

Role: prove the release path of docs/release.md end to end (issue 33 part 2). Caller: ``make
release-test`` (a stage of ``make test``, after ``e2e``, whose node run has built the image, so
buildah's layer cache makes the release's build cheap). The registry (distribution) and cosign
are the binaries ``make e2e-build`` built from the Go module proxy; nothing is mocked. The
registry serves TLS on 127.0.0.1 with a throwaway CA (trusted through ``RELEASE_REGISTRY_CA``
by the release and ``SSL_CERT_FILE`` by the verifying cosign; no insecure-registry flag).
No transparency log exists here: the release runs with ``RELEASE_TLOG=0`` and verification
with ``--insecure-ignore-tlog=true`` (docs/release.md says what changes with Rekor).

What must verify: the signature, the CycloneDX SBOM attestation (the SBOM the image carries)
and the SLSA provenance attestation (its subject is the pushed digest). What must not: another
image pushed over the release's tag, the right image checked with a wrong key, and an image
pushed without signing.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster.build import COSIGN, REGISTRY, e2e_required, go_tool_binary
from cluster.control_plane import free_port
from cluster.pki import issue_serving_pair
from cluster.polling import poll

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "release-test-password"
TAG = "v0.0.0-test"

pytestmark = pytest.mark.timeout(1500)


def _unavailable(message: str) -> None:
    if e2e_required():
        pytest.fail(f"AGENTSAFE_E2E=require and {message}", pytrace=False)
    pytest.skip(f"release test skipped: {message}")


@pytest.fixture(scope="module")
def cosign() -> Path:
    found = go_tool_binary(COSIGN)
    if found is None:
        _unavailable(f"no cosign {COSIGN.version} in the cache: run `make e2e-build` first")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A distribution registry serving TLS on 127.0.0.1; yields (host:port, CA file)."""
    binary = go_tool_binary(REGISTRY)
    if binary is None:
        _unavailable(f"no registry {REGISTRY.version} in the cache: run `make e2e-build` first")
    for tool in ("buildah", "make"):
        if shutil.which(tool) is None:
            _unavailable(f"no {tool} on PATH")
    assert binary is not None
    root = tmp_path_factory.mktemp("registry")
    pair = issue_serving_pair(
        common_name="release-test-registry", dns_names=["localhost"], ip_addresses=["127.0.0.1"]
    )
    (root / "ca.pem").write_bytes(pair.ca_pem)
    (root / "tls.crt").write_bytes(pair.cert_pem)
    (root / "tls.key").write_bytes(pair.key_pem)
    port = free_port()
    (root / "config.yml").write_text(
        json.dumps(
            {
                "version": "0.1",
                "log": {"level": "info"},
                "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
                "http": {
                    "addr": f"127.0.0.1:{port}",
                    "tls": {"certificate": str(root / "tls.crt"), "key": str(root / "tls.key")},
                },
            }
        )
    )
    log = (root / "registry.log").open("wb")
    process = subprocess.Popen(
        [str(binary), "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        import ssl
        import urllib.request

        context = ssl.create_default_context(cafile=str(root / "ca.pem"))

        def answers() -> bool | None:
            if process.poll() is not None:
                raise AssertionError(f"registry exited: {(root / 'registry.log').read_text()}")
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/v2/", context=context, timeout=2
                ) as response:
                    return True if response.status == 200 else None
            except OSError:
                return None

        poll("the registry's /v2/ over TLS", answers, deadline=60)
        yield f"127.0.0.1:{port}", root / "ca.pem"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def keys(cosign: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two cosign key pairs: ``release.*`` signs, ``other.*`` is the wrong key."""
    directory = tmp_path_factory.mktemp("keys")
    for prefix in ("release", "other"):
        subprocess.run(
            [str(cosign), "generate-key-pair", "--output-key-prefix", prefix],
            cwd=directory,
            env={**os.environ, "COSIGN_PASSWORD": PASSWORD},
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
    return directory


def _cosign_env(ca: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "COSIGN_PASSWORD"}
    env["SSL_CERT_FILE"] = str(ca)
    return env


def _empty_root(ca: Path) -> Path:
    """A Sigstore trusted root that trusts no log and no CA: verification by key alone, and
    cosign does not fetch the public one (no network here; nothing but the registry is reached)."""
    path = ca.with_name("trusted_root.json")
    if not path.exists():
        path.write_text(
            json.dumps({"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"})
        )
    return path


def _verify(cosign: Path, ca: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cosign), *argv, "--insecure-ignore-tlog=true", f"--trusted-root={_empty_root(ca)}"],
        env=_cosign_env(ca),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _payloads(output: str) -> list[dict[str, Any]]:
    """The in-toto statements of ``cosign verify-attestation`` (one DSSE envelope a line)."""
    statements = []
    for line in output.splitlines():
        if line.startswith("{"):
            envelope = json.loads(line)
            statements.append(json.loads(base64.b64decode(envelope["payload"])))
    return statements


def _push_other_image(destination: str, ca: Path, work: Path) -> str:
    """Commit a one-file image from scratch and push it to ``destination``; return its digest."""
    marker = work / "marker.txt"
    marker.write_text(f"not the release {uuid.uuid4()}\n")
    local = f"localhost/release-test-other:{uuid.uuid4().hex[:12]}"
    container = subprocess.run(
        ["buildah", "from", "scratch"], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        subprocess.run(["buildah", "copy", container, str(marker), "/marker.txt"], check=True)
        subprocess.run(["buildah", "commit", "--rm", container, local], check=True)
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    certs = work / f"certs-{uuid.uuid4().hex[:8]}"
    certs.mkdir()
    shutil.copyfile(ca, certs / "ca.crt")
    digest_file = work / "other.digest"
    try:
        subprocess.run(
            [
                "buildah",
                "push",
                "--quiet",
                "--cert-dir",
                str(certs),
                "--digestfile",
                str(digest_file),
                local,
                f"docker://{destination}",
            ],
            check=True,
        )
    finally:
        subprocess.run(["buildah", "rmi", local], capture_output=True, check=False)
    return digest_file.read_text().strip()


def test_make_release_signs_and_attests_and_only_the_release_verifies(
    cosign: Path, registry: tuple[str, Path], keys: Path, tmp_path: Path
) -> None:
    host, ca = registry
    started = time.monotonic()
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "release",
            f"RELEASE_REGISTRY={host}",
            "RELEASE_REPOSITORY=agentsafe/agentsafe",
            f"RELEASE_TAG={TAG}",
            f"RELEASE_KEY={keys / 'release.key'}",
            f"RELEASE_REGISTRY_CA={ca}",
            "RELEASE_TLOG=0",
        ],
        cwd=REPO,
        env={**os.environ, "COSIGN_PASSWORD": PASSWORD},
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
        stdin=subprocess.DEVNULL,
    )
    sys.stderr.write(result.stderr[-4000:])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert PASSWORD not in result.stdout + result.stderr
    reference = result.stdout.strip().splitlines()[-1]
    repository = f"{host}/agentsafe/agentsafe"
    assert reference.startswith(f"{repository}@sha256:"), result.stdout
    digest = reference.split("@", 1)[1]
    print(f"make release took {time.monotonic() - started:.0f} s: {reference}")
    public = str(keys / "release.pub")
    by_tag = f"{repository}:{TAG}"

    # The signature verifies, by digest and through the tag.
    for ref in (reference, by_tag):
        signed = _verify(cosign, ca, "verify", "--key", public, ref)
        assert signed.returncode == 0, signed.stderr
        claims = [
            c
            for line in signed.stdout.splitlines()
            if line.startswith("[")
            for c in json.loads(line)
        ]
        assert claims, signed.stdout
        assert all(c["critical"]["image"]["docker-manifest-digest"] == digest for c in claims)

    # Offline: with a key and no transparency log, cosign reaches for nothing beyond the registry.
    assert "tuf" not in signed.stderr.lower(), signed.stderr

    # The SBOM attestation verifies and carries the image's own CycloneDX SBOM.
    sbom = _verify(
        cosign, ca, "verify-attestation", "--key", public, "--type", "cyclonedx", reference
    )
    assert sbom.returncode == 0, sbom.stderr
    (statement,) = _payloads(sbom.stdout)
    assert statement["predicateType"] == "https://cyclonedx.org/bom"
    assert statement["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    predicate = statement["predicate"]
    assert predicate["bomFormat"] == "CycloneDX"
    assert predicate["metadata"]["component"]["name"] == "agentsafe"
    assert len(predicate["components"]) > 10

    # The provenance attestation verifies: SLSA v1, the source commit, the bases by digest.
    slsa = _verify(
        cosign, ca, "verify-attestation", "--key", public, "--type", "slsaprovenance1", reference
    )
    assert slsa.returncode == 0, slsa.stderr
    (provenance,) = _payloads(slsa.stdout)
    assert provenance["predicateType"] == "https://slsa.dev/provenance/v1"
    assert provenance["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    definition = provenance["predicate"]["buildDefinition"]
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dependencies = definition["resolvedDependencies"]
    assert {"gitCommit": commit} in [d["digest"] for d in dependencies]
    assert any(d["uri"].startswith("oci://gcr.io/distroless/") for d in dependencies)

    # A wrong key: neither the signature nor an attestation verifies.
    wrong = str(keys / "other.pub")
    assert _verify(cosign, ca, "verify", "--key", wrong, reference).returncode != 0
    for kind in ("cyclonedx", "slsaprovenance1"):
        refused = _verify(
            cosign, ca, "verify-attestation", "--key", wrong, "--type", kind, reference
        )
        assert refused.returncode != 0, refused.stdout

    # An image pushed without signing does not verify.
    unsigned = _push_other_image(f"{host}/agentsafe/unsigned:{TAG}", ca, tmp_path)
    for ref in (f"{host}/agentsafe/unsigned:{TAG}", f"{host}/agentsafe/unsigned@{unsigned}"):
        refused = _verify(cosign, ca, "verify", "--key", public, ref)
        assert refused.returncode != 0, refused.stdout
    assert "no signatures found" in refused.stderr.lower() or "no matching" in refused.stderr

    # A tampered tag: another image pushed over the release's tag no longer verifies through the
    # tag (nor do its attestations); the release itself still verifies by digest.
    tampered = _push_other_image(by_tag, ca, tmp_path)
    assert tampered != digest
    assert _verify(cosign, ca, "verify", "--key", public, by_tag).returncode != 0
    refused = _verify(
        cosign, ca, "verify-attestation", "--key", public, "--type", "cyclonedx", by_tag
    )
    assert refused.returncode != 0, refused.stdout
    assert _verify(cosign, ca, "verify", "--key", public, reference).returncode == 0
