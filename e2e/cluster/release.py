"""``make release``: build the agentsafe image, push it, sign it and attest its SBOM and provenance.

Role: the release path a user's verification (docs/release.md) starts from. Callers: ``make
release`` (which first runs ``e2e/cluster/build.py --only-release-tools``) and the release test
``e2e/release/test_release.py``, which drives ``make release`` against a registry on loopback.

Steps, each printed as it runs:

1. ``buildah bud`` of the repository's Dockerfile (:func:`images.build_agentsafe`, the same build
   as ``make image``; buildah's layer cache makes a rebuild cheap).
2. The CycloneDX SBOM the image carries (``/usr/share/doc/agentsafe/sbom.cdx.json``) is read out
   of the built image, so the attested SBOM is byte for byte the one inside.
3. ``buildah push`` to ``<registry>/<repository>:<tag>``; the pushed manifest's digest is the
   release's identity from here on (every later step names the image by digest, never by tag).
4. ``cosign sign`` of that digest with the key (a ``cosign.key`` file, its password in
   ``COSIGN_PASSWORD``, or a KMS URI such as ``awskms://...``, ``gcpkms://...``,
   ``hashivault://...``, ``azurekms://...``).
5. ``cosign attest --type cyclonedx`` with the SBOM, and ``cosign attest --type slsaprovenance1``
   with an SLSA v1.0 provenance predicate (:func:`provenance`): the source commit, the
   Dockerfile, the image lock and the base images by digest, the builder and the build's times.
6. The digest reference ``<registry>/<repository>@sha256:...`` is the one line on stdout.

The transparency log: a release uploads its signature and attestations to Rekor unless
``RELEASE_TLOG=0`` (the test's setting: no log exists on this machine); docs/release.md says
what a verifier does in each case. A registry with a private CA is trusted with
``RELEASE_REGISTRY_CA`` (a PEM file), for buildah and cosign alike.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

try:
    from . import images
    from .build import COSIGN, go_tool_binary
except ImportError:  # run as a script: python e2e/cluster/release.py
    import images  # type: ignore[no-redef]
    from build import COSIGN, go_tool_binary  # type: ignore[no-redef]

REPO = images.REPO
SBOM_PATH = "usr/share/doc/agentsafe/sbom.cdx.json"
LOCAL_TAG = "localhost/agentsafe:release"
BUILD_TYPE = "https://agentsafe.io/release/buildah-bud/v1"
"""The SLSA ``buildType``: ``make release`` (buildah bud of the Dockerfile, chroot isolation)."""
BUILDER_ID = "https://agentsafe.io/release/make-release"
PREDICATE_TYPES = {
    "cyclonedx": "https://cyclonedx.org/bom",
    "slsaprovenance1": "https://slsa.dev/provenance/v1",
}


class ReleaseError(RuntimeError):
    """A release step failed; the message names the step (and never a password)."""


def _log(message: str) -> None:
    print(f"[release {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(
    argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    _log(f"{what} ...")
    started = time.monotonic()
    result = subprocess.run(
        list(argv),
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise ReleaseError(f"{what} failed (exit {result.returncode}):\n{tail}")
    _log(f"{what}: done in {time.monotonic() - started:.1f} s")
    return result


def _git(*argv: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO), *argv], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def provenance(
    *,
    reference: str,
    started: datetime.datetime,
    finished: datetime.datetime,
    base_digests: Mapping[str, str],
) -> dict[str, object]:
    """The SLSA v1.0 provenance predicate of this build (the statement's subject is added by
    ``cosign attest``: the pushed digest)."""
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    remote = _git("remote", "get-url", "origin")
    source = f"git+{remote}" if remote else f"git+file://{REPO}"
    dependencies: list[dict[str, object]] = []
    if commit:
        dependencies.append({"uri": source, "digest": {"gitCommit": commit}})
    for name, digest in sorted(base_digests.items()):
        algorithm, _, value = digest.partition(":")
        dependencies.append({"uri": f"oci://{name}", "digest": {algorithm: value}})
    for path in ("Dockerfile", "image-requirements.txt", "e2e/cluster/base-packages.lock"):
        dependencies.append(
            {"uri": f"{source}#{path}", "digest": {"sha256": _sha256_file(REPO / path)}}
        )
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "source": {"uri": source, "commit": commit},
                "dockerfile": "Dockerfile",
                "image": reference,
            },
            "internalParameters": {
                "isolation": "chroot",
                "pull": "never",
                "worktreeDirty": dirty,
                "machine": platform.machine(),
            },
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {
                "id": BUILDER_ID,
                "version": {"buildah": _tool_version("buildah"), "cosign": COSIGN.version},
            },
            "metadata": {
                "invocationId": str(uuid.uuid4()),
                "startedOn": _rfc3339(started),
                "finishedOn": _rfc3339(finished),
            },
        },
    }


def _tool_version(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        return ""
    result = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip()


def extract_sbom(tag: str, target: Path) -> Path:
    """Copy the image's own SBOM out of ``tag`` (buildah mount, read, unmount)."""
    container = _run(["buildah", "from", "--pull=never", tag], what=f"container of {tag}")
    name = container.stdout.strip().splitlines()[-1]
    try:
        mount = _run(["buildah", "mount", name], what=f"mount {tag}").stdout.strip()
        source = Path(mount.splitlines()[-1]) / SBOM_PATH
        document = json.loads(source.read_text())
        if document.get("bomFormat") != "CycloneDX":
            raise ReleaseError(f"{SBOM_PATH} in {tag} is not a CycloneDX document")
        shutil.copyfile(source, target)
    finally:
        subprocess.run(["buildah", "umount", name], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)
    _log(f"SBOM: {len(document.get('components', []))} components ({SBOM_PATH})")
    return target


def trust_environment(registry_ca: Path | None, work: Path) -> tuple[list[str], dict[str, str]]:
    """buildah's ``--cert-dir`` arguments and cosign's environment for a registry whose
    certificate a private CA signed (Go reads ``SSL_CERT_FILE``: the system bundle plus it)."""
    env = dict(os.environ)
    if registry_ca is None:
        return [], env
    cert_dir = work / "certs"
    cert_dir.mkdir()
    shutil.copyfile(registry_ca, cert_dir / "registry-ca.crt")
    bundle = work / "ca-bundle.pem"
    system = images.host_ca_bundle()
    parts = [system.read_bytes()] if system is not None else []
    bundle.write_bytes(b"\n".join([*parts, registry_ca.read_bytes()]))
    env["SSL_CERT_FILE"] = str(bundle)
    return ["--cert-dir", str(cert_dir)], env


def push(local: str, destination: str, *, cert_args: Sequence[str], work: Path) -> str:
    """``buildah push`` ``local`` to ``destination`` (a tag); return the pushed digest."""
    digest_file = work / "digest"
    _run(
        [
            "buildah",
            "push",
            "--quiet",
            "--format",
            "oci",
            *cert_args,
            "--digestfile",
            str(digest_file),
            local,
            f"docker://{destination}",
        ],
        what=f"push {destination}",
    )
    digest = digest_file.read_text().strip()
    if not digest.startswith("sha256:"):
        raise ReleaseError(f"buildah push wrote no digest for {destination}")
    return digest


def release(
    *,
    registry: str,
    repository: str,
    tag: str,
    key: str,
    registry_ca: Path | None,
    tlog: bool,
    build: bool = True,
) -> str:
    """Build, push, sign and attest; return ``<registry>/<repository>@sha256:...``."""
    cosign = go_tool_binary(COSIGN)
    if cosign is None:
        raise ReleaseError(
            f"no cosign {COSIGN.version} in the cache: make e2e-build"
            " (or e2e/cluster/build.py --only-release-tools) builds it"
        )
    if "://" not in key and not Path(key).is_file():
        raise ReleaseError("RELEASE_KEY names no key file and no KMS URI (scheme://...)")
    started = datetime.datetime.now(datetime.UTC)
    if build:
        images.build_agentsafe(LOCAL_TAG)
    base_digests = {
        images.RUNTIME_BASE: images.image_digest(images.RUNTIME_BASE),
        images.BUILD_BASE: images.image_digest(images.BUILD_BASE),
    }
    destination = f"{registry}/{repository}:{tag}"
    with tempfile.TemporaryDirectory(prefix="agentsafe-release-") as scratch:
        work = Path(scratch)
        sbom = extract_sbom(LOCAL_TAG, work / "sbom.cdx.json")
        cert_args, env = trust_environment(registry_ca, work)
        digest = push(LOCAL_TAG, destination, cert_args=cert_args, work=work)
        reference = f"{registry}/{repository}@{digest}"
        _log(f"pushed {destination}: {reference}")
        common = ["--yes", "--key", key, f"--tlog-upload={'true' if tlog else 'false'}"]
        _run([str(cosign), "sign", *common, reference], what="cosign sign", env=env)
        _run(
            [
                str(cosign),
                "attest",
                *common,
                "--type",
                "cyclonedx",
                "--predicate",
                str(sbom),
                reference,
            ],
            what="cosign attest the CycloneDX SBOM",
            env=env,
        )
        statement = provenance(
            reference=destination,
            started=started,
            finished=datetime.datetime.now(datetime.UTC),
            base_digests=base_digests,
        )
        predicate = work / "provenance.json"
        predicate.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")
        _run(
            [
                str(cosign),
                "attest",
                *common,
                "--type",
                "slsaprovenance1",
                "--predicate",
                str(predicate),
                reference,
            ],
            what="cosign attest the SLSA v1 provenance",
            env=env,
        )
    _log(f"released {reference} (signature, SBOM and provenance attached; docs/release.md)")
    return reference


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    env = os.environ.get
    parser.add_argument(
        "--registry",
        default=env("RELEASE_REGISTRY", ""),
        help="the OCI registry host[:port] (RELEASE_REGISTRY)",
    )
    parser.add_argument(
        "--repository",
        default=env("RELEASE_REPOSITORY") or "agentsafe",
        help="the repository in it (RELEASE_REPOSITORY, default agentsafe)",
    )
    parser.add_argument(
        "--tag",
        default=env("RELEASE_TAG") or _version(),
        help="the tag pushed (RELEASE_TAG, default the project's version)",
    )
    parser.add_argument(
        "--key",
        default=env("RELEASE_KEY", ""),
        help="cosign key: a cosign.key file (password in COSIGN_PASSWORD) or a KMS URI"
        " (RELEASE_KEY)",
    )
    parser.add_argument(
        "--registry-ca",
        type=Path,
        default=Path(env("RELEASE_REGISTRY_CA", "")) if env("RELEASE_REGISTRY_CA") else None,
        help="PEM CA that signed the registry's certificate (RELEASE_REGISTRY_CA)",
    )
    parser.add_argument(
        "--no-tlog",
        action="store_true",
        default=env("RELEASE_TLOG", "1") == "0",
        help="do not upload to the Rekor transparency log (RELEASE_TLOG=0)",
    )
    args = parser.parse_args(argv)
    if not args.registry or not args.key:
        _log("RELEASE_REGISTRY and RELEASE_KEY are required (docs/release.md)")
        return 2
    missing = images.missing_tools()
    if missing:
        _log(f"needs {', '.join(missing)}: apt-get install -y {' '.join(missing)}")
        return 2
    try:
        reference = release(
            registry=args.registry,
            repository=args.repository,
            tag=args.tag,
            key=args.key,
            registry_ca=args.registry_ca,
            tlog=not args.no_tlog,
        )
    except (ReleaseError, images.ImageError) as error:
        _log(str(error))
        return 1
    print(reference)
    return 0


def _version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


if __name__ == "__main__":
    raise SystemExit(main())
