"""Build the node's container images with buildah, from a debootstrap base and no registry.

Role: give the one-node cluster (:mod:`node`) every image its pods run, as docker archives
that containerd imports. Callers: :mod:`node` (``make cluster-up``) and ``python
e2e/cluster/images.py`` (``make image``: the agentsafe image only).

* The base: ``debootstrap --variant=minbase --include=python3,python3-venv bookworm``, cached
  as a tarball under ``~/.cache/agentsafe/base/`` (keyed by suite and package list). It is
  tagged locally under the two base names the Dockerfile uses:

  - ``docker.io/library/debian:12-slim`` (the build stage): the whole minbase tree;
  - ``gcr.io/distroless/python3-debian12:nonroot`` (the runtime stage): only what the
    interpreter needs. The files of the Debian packages in the dependency closure of
    ``python3.11`` (and ``python3-minimal``'s ``/usr/bin/python3``), the CA bundle and a
    ``nonroot`` user (65532), as distroless ships. No shell, no package manager, no dpkg
    database. Debian's own package metadata decides the closure, with ``dpkg``, ``debconf``
    and ``perl-base`` left out: they only run maintainer scripts.

* ``agentsafe:dev``: ``buildah bud --isolation chroot --pull=never`` of the repository's
  Dockerfile. pip in the build stage reaches PyPI through this machine's TLS-inspecting proxy,
  so the host CA bundle (``PIP_CERT`` or the system bundle) is passed as a build secret: it is
  mounted for that one RUN step and never written to a layer of either stage.
* the pause image (``/pause`` built by :mod:`node_build`) and the CoreDNS image (the static
  ``coredns`` binary): ``FROM scratch`` plus one file.

Every build prints a progress line per step; the images land in buildah's local store
(``/var/lib/containers/storage``), which doubles as the warm cache. A build of the Dockerfile
then prunes the untagged images earlier builds of it left there (:func:`prune_superseded`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from .build import cache_root
except ImportError:  # run as a script: python e2e/cluster/images.py
    from build import cache_root  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
INCLUDE = ("python3", "python3-venv")
BUILD_BASE = "docker.io/library/debian:12-slim"
RUNTIME_BASE = "gcr.io/distroless/python3-debian12:nonroot"
AGENTSAFE_IMAGE = "agentsafe:dev"
RUNTIME_ROOTS = ("python3-minimal", "python3.11", "libpython3.11-stdlib", "tzdata")
RUNTIME_EXCLUDED = frozenset({"dpkg", "debconf", "debconf-2.0", "perl-base", "mime-support"})
NONROOT = 65532
BASE_LOCK = Path(__file__).resolve().parent / "base-packages.lock"
"""Every Debian package of the debootstrap tree, ``name version`` per line: the pin."""
LOCK = REPO / "image-requirements.txt"
BUILD_LABEL = "io.agentsafe.base.build-digest"
"""A label every stage of the Dockerfile's build carries (``base_labels``): how a build finds
the images earlier builds left."""
PRUNE_AGE = 600.0
"""How much older than a build an untagged image must be for that build to prune it, so that a
build running at the same time in another clone keeps its stages' images."""


class ImageError(RuntimeError):
    """An image could not be built; the message says which step and shows its output."""


def _log(message: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], *, what: str, input: bytes | None = None) -> str:
    """Run one step with a heartbeat every 30 s; raise :class:`ImageError` with its tail."""
    _log(f"{what} ...")
    started = time.monotonic()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        if input is not None and process.stdin is not None:
            process.stdin.write(input)
            process.stdin.close()
        while True:
            try:
                process.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                _log(f"{what}: still running ({time.monotonic() - started:.0f} s)")
        output.seek(0)
        text = output.read().decode(errors="replace")
    if process.returncode != 0:
        tail = "\n".join(text.splitlines()[-30:])
        raise ImageError(f"{what} failed (exit {process.returncode}):\n{tail}")
    _log(f"{what}: done in {time.monotonic() - started:.0f} s")
    return text


def _nice() -> list[str]:
    return ["nice", "-n", "10"] if shutil.which("nice") else []


def missing_tools() -> list[str]:
    return [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]


# --- the debootstrap base --------------------------------------------------------------------


def base_key() -> str:
    return hashlib.sha256(f"{SUITE} {MIRROR} {' '.join(INCLUDE)}".encode()).hexdigest()[:12]


def base_tarball() -> Path:
    return cache_root() / "base" / f"{SUITE}-minbase-{base_key()}.tar"


def ensure_base_tarball(*, check: bool = True) -> Path:
    """The debootstrap minbase tree as a tarball, built once (about 3.5 min cold), its
    packages checked against :data:`BASE_LOCK` before it is kept."""
    target = base_tarball()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentsafe-debootstrap-") as work:
        rootfs = Path(work) / "rootfs"
        _run(
            [
                *_nice(),
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(INCLUDE)}",
                SUITE,
                str(rootfs),
                MIRROR,
            ],
            what=f"debootstrap {SUITE} minbase (+{','.join(INCLUDE)})",
        )
        if check:
            check_base_pin(rootfs)
        partial = target.with_suffix(".partial")
        _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], what="archive the base tree")
        partial.replace(target)
    return target


def installed_packages(rootfs: Path) -> str:
    """``name version`` of every Debian package installed in ``rootfs``, sorted, one a line."""
    result = subprocess.run(
        ["chroot", str(rootfs), "dpkg-query", "-W", "-f=${Package} ${Version}\\n"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(f"dpkg-query -W in the base tree: {result.stderr.strip()}")
    return "".join(f"{line}\n" for line in sorted(result.stdout.splitlines()) if line)


def check_base_pin(rootfs: Path) -> None:
    """Refuse a base tree whose packages differ from :data:`BASE_LOCK`.

    debootstrap installs what the suite holds today and cannot be told a version, so the pin is
    checked after the fact: a Debian point release that changed a package stops the build here,
    naming the packages, instead of changing the image silently. Accept a new release with
    ``python e2e/cluster/images.py --write-base-lock`` and commit the file."""
    found = installed_packages(rootfs)
    pinned = BASE_LOCK.read_text()
    if found == pinned:
        return
    changed = sorted(set(found.splitlines()) ^ set(pinned.splitlines()))
    raise ImageError(
        f"the {SUITE} base differs from {BASE_LOCK.name} ({len(changed)} lines: "
        f"{', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}); review, then "
        "python e2e/cluster/images.py --write-base-lock and commit it"
    )


def write_base_lock() -> Path:
    """Record the packages of the cached base tarball (built first if absent) in BASE_LOCK."""
    tarball = ensure_base_tarball(check=False)
    with tempfile.TemporaryDirectory(prefix="agentsafe-base-") as work:
        rootfs = Path(work)
        _run(["tar", "-C", str(rootfs), "-xpf", str(tarball)], what="unpack the base tree")
        BASE_LOCK.write_text(installed_packages(rootfs))
    _log(f"wrote {BASE_LOCK}")
    return BASE_LOCK


def _depends(rootfs: Path, package: str) -> list[str]:
    result = subprocess.run(
        ["chroot", str(rootfs), "dpkg-query", "-W", "-f=${Pre-Depends}, ${Depends}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(f"dpkg-query {package} in the base tree: {result.stderr.strip()}")
    names = []
    for clause in result.stdout.split(","):
        first = clause.split("|")[0].strip()
        name = re.split(r"[\s(:]", first, maxsplit=1)[0]
        if name:
            names.append(name)
    return names


def runtime_packages(rootfs: Path) -> list[str]:
    """The dependency closure of :data:`RUNTIME_ROOTS` in ``rootfs``, per Debian's metadata."""
    seen: set[str] = set()
    pending = list(RUNTIME_ROOTS)
    while pending:
        package = pending.pop()
        if package in seen or package in RUNTIME_EXCLUDED:
            continue
        seen.add(package)
        pending.extend(_depends(rootfs, package))
    return sorted(seen)


def _package_files(rootfs: Path, packages: Iterable[str]) -> list[str]:
    result = subprocess.run(
        ["chroot", str(rootfs), "dpkg-query", "-L", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(f"dpkg-query -L in the base tree: {result.stderr.strip()}")
    return [line for line in result.stdout.splitlines() if line.startswith("/")]


def _copy_into(rootfs: Path, target: Path, path: str) -> None:
    """Copy ``path`` of ``rootfs`` to the same place in ``target``, through the base's own
    directory symlinks (merged /usr: ``/lib`` is ``usr/lib``) so they stay symlinks."""
    source = rootfs / path.strip("/")
    if source == rootfs or (not source.is_symlink() and not source.exists()):
        return
    parent = Path(os.path.realpath(source.parent)).relative_to(os.path.realpath(rootfs))
    destination = target / parent / source.name
    if source.is_dir() and not source.is_symlink():
        destination.mkdir(parents=True, exist_ok=True)
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists() or destination.is_symlink():
        return
    shutil.copy2(source, destination, follow_symlinks=False)


def make_runtime_tree(rootfs: Path, target: Path) -> list[str]:
    """Fill ``target`` with the distroless-like runtime tree; return the packages it holds."""
    for link in ("bin", "sbin", "lib", "lib64"):
        source = rootfs / link
        if source.is_symlink():
            (target / link).symlink_to(os.readlink(source))
    packages = runtime_packages(rootfs)
    for path in _package_files(rootfs, packages):
        _copy_into(rootfs, target, path)
    shutil.copytree(
        rootfs / "etc" / "ssl", target / "etc" / "ssl", symlinks=True, dirs_exist_ok=True
    )
    shutil.copytree(
        rootfs / "usr" / "share" / "ca-certificates",
        target / "usr" / "share" / "ca-certificates",
        symlinks=True,
        dirs_exist_ok=True,
    )
    for name in ("os-release",):
        _copy_into(rootfs, target, f"/usr/lib/{name}")
        (target / "etc" / name).unlink(missing_ok=True)
        (target / "etc" / name).symlink_to(f"../usr/lib/{name}")
    (target / "etc" / "passwd").write_text(
        f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
    )
    (target / "etc" / "group").write_text(f"root:x:0:\nnonroot:x:{NONROOT}:\n")
    for directory, mode in (("tmp", 0o1777), ("root", 0o700), ("home/nonroot", 0o700)):
        (target / directory).mkdir(parents=True, exist_ok=True)
        (target / directory).chmod(mode)
    os.chown(target / "home" / "nonroot", NONROOT, NONROOT)
    return packages


# --- buildah ---------------------------------------------------------------------------------


def image_exists(name: str) -> bool:
    return (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", name], capture_output=True, check=False
        ).returncode
        == 0
    )


def _commit_tree(tree: Path, name: str, *, config: Sequence[str] = ()) -> None:
    """A one-layer image holding ``tree``: buildah from scratch, copy, commit."""
    container = _run(["buildah", "from", "scratch"], what=f"new container for {name}").strip()
    try:
        mount = _run(["buildah", "mount", container], what=f"mount {name}").strip().splitlines()[-1]
        _run(
            ["sh", "-c", f"tar -C {tree} -cf - . | tar -C {mount} -xpf -"],
            what=f"copy the tree into {name}",
        )
        if config:
            _run(["buildah", "config", *config, container], what=f"configure {name}")
        _run(["buildah", "commit", "--rm", container, name], what=f"commit {name}")
    except BaseException:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise


def ensure_base_images() -> None:
    """Tag the debootstrap base under the Dockerfile's two base names (once per cache)."""
    if image_exists(BUILD_BASE) and image_exists(RUNTIME_BASE):
        _log(f"base images present: {BUILD_BASE}, {RUNTIME_BASE}")
        return
    tarball = ensure_base_tarball()
    with tempfile.TemporaryDirectory(prefix="agentsafe-base-") as work:
        rootfs = Path(work) / "rootfs"
        rootfs.mkdir()
        _run(["tar", "-C", str(rootfs), "-xpf", str(tarball)], what="unpack the base tree")
        check_base_pin(rootfs)
        if not image_exists(BUILD_BASE):
            _commit_tree(rootfs, BUILD_BASE, config=["--cmd", "/bin/bash"])
        if not image_exists(RUNTIME_BASE):
            runtime = Path(work) / "runtime"
            runtime.mkdir()
            packages = make_runtime_tree(rootfs, runtime)
            _log(f"runtime base: {len(packages)} packages ({', '.join(packages)})")
            _commit_tree(
                runtime,
                RUNTIME_BASE,
                config=["--user", f"{NONROOT}:{NONROOT}", "--entrypoint", '["/usr/bin/python3"]'],
            )


def host_ca_bundle() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def image_digest(name: str) -> str:
    """The ``sha256:`` digest of a local image's manifest."""
    return _run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageDigest}}", name],
        what=f"digest of {name}",
    ).strip()


def base_labels() -> list[str]:
    """Labels that record the bases by digest (they are built here, never pulled, so the digest
    is the record a reader checks the image against) and the Debian release and package pin they
    came from. buildah itself writes the OCI annotations ``org.opencontainers.image.base.name``
    and ``.base.digest`` into the manifest (the digest of the base's OCI manifest); these labels
    carry the digests of the manifests as buildah's store holds them (``buildah images
    --digests``), for both stages."""
    return [
        f"io.agentsafe.base.runtime-digest={image_digest(RUNTIME_BASE)}",
        f"{BUILD_LABEL}={image_digest(BUILD_BASE)}",
        f"io.agentsafe.base.debian={SUITE} {MIRROR}",
        f"io.agentsafe.base.packages-sha256={_sha256(BASE_LOCK.read_bytes())}",
    ]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_agentsafe(tag: str = AGENTSAFE_IMAGE) -> None:
    """``buildah bud`` the repository's Dockerfile into ``tag`` (layers cached by buildah)."""
    ensure_base_images()
    argv = [*_nice(), "buildah", "bud", "--isolation", "chroot", "--pull=never", "--layers"]
    for label in base_labels():
        argv += ["--label", label]
    ca = host_ca_bundle()
    if ca is not None:
        argv += ["--secret", f"id=pip_cert,src={ca}"]
    argv += ["-t", tag, "-f", str(REPO / "Dockerfile"), str(REPO)]
    started = time.time()
    _run(argv, what=f"buildah bud {tag} from the Dockerfile")
    prune_superseded(tag, started)


def superseded(images: Sequence[Mapping[str, Any]], *, tag: str, started: float) -> list[str]:
    """The IDs to prune among ``buildah images --json`` entries of this Dockerfile's builds.

    None unless the build that started at ``started`` made a new image for ``tag``: a build
    buildah answered wholly from its cache added nothing, and the untagged image of its build
    stage, however old, is that cache. After a build that made one, the untagged images created
    ``PRUNE_AGE`` seconds or more before it started (its new build stage is younger)."""
    names = {tag, f"localhost/{tag}"}
    made = any(
        names & set(image.get("names") or ()) and float(image.get("created", 0)) >= started
        for image in images
    )
    if not made:
        return []
    return [
        str(image["id"])
        for image in images
        if not image.get("names") and float(image.get("created", started)) <= started - PRUNE_AGE
    ]


def prune_superseded(tag: str, started: float) -> None:
    """Remove the images earlier builds of the Dockerfile left untagged: each build that changes
    the image leaves its two stages' images (0.9 GB, much of it shared layers) in buildah's
    store, and a day of builds left 26 of them (6 GiB) on a machine whose free disk is what its
    host leaves. Layers the new build reused are kept (they are its parents); images still
    tagged or used by a container are kept; a failure here never fails the build."""
    listing = subprocess.run(
        ["buildah", "images", "--json", "--filter", f"label={BUILD_LABEL}"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        old = superseded(json.loads(listing.stdout or "[]"), tag=tag, started=started)
    except (ValueError, TypeError, KeyError):
        return
    if not old:
        return
    removed = subprocess.run(["buildah", "rmi", *old], capture_output=True, check=False)
    kept = "" if removed.returncode == 0 else " (some are in use and were kept)"
    _log(f"pruned {len(old)} untagged image(s) of earlier builds{kept}")


def _lock_names() -> set[str]:
    names = set()
    for line in LOCK.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and "==" in line:
            names.add(_normal(line.split("==", 1)[0]))
    return names


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_INSTALLED = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({d.metadata['Name']: d.version for d in m.distributions()}.items())))"
)


def verify_agentsafe(tag: str = AGENTSAFE_IMAGE) -> dict[str, object]:
    """Prove what the image carries, in the image (``buildah run``): exactly the lock's
    distributions plus agentsafe (no development-only package, no pip or setuptools); an SBOM
    naming each of them at its version; and the example policy's lint and tests passing in the
    image (CEL compiles and evaluates there). Raises :class:`ImageError`."""
    import json

    container = _run(["buildah", "from", "--pull=never", tag], what=f"container of {tag}").strip()
    container = container.splitlines()[-1]
    try:

        def run(*argv: str, volume: str | None = None) -> str:
            extra = ["--volume", volume] if volume else []
            return _run(
                ["buildah", "run", "--isolation", "chroot", *extra, container, "--", *argv],
                what=f"in {tag}: {' '.join(argv)[:60]}",
            )

        installed = dict(json.loads(run("/opt/agentsafe/bin/python", "-c", _INSTALLED)))
        names = {_normal(name) for name in installed}
        expected = _lock_names() - {"pip", "setuptools", "wheel"} | {"agentsafe"}
        if names != expected:
            raise ImageError(
                f"{tag} carries {sorted(names - expected)} beyond the lock and lacks "
                f"{sorted(expected - names)}"
            )
        forbidden = names & {"pip", "setuptools", "wheel", *_dev_packages()}
        if forbidden:
            raise ImageError(f"{tag} carries development-only packages: {sorted(forbidden)}")
        mount = _run(["buildah", "mount", container], what=f"mount {tag}").strip().splitlines()[-1]
        sbom = json.loads((Path(mount) / "usr/share/doc/agentsafe/sbom.cdx.json").read_text())
        listed = {_normal(c["name"]): c.get("version") for c in sbom.get("components", [])}
        listed[_normal(sbom["metadata"]["component"]["name"])] = sbom["metadata"]["component"].get(
            "version"
        )
        missing = {
            name: version
            for name, version in installed.items()
            if listed.get(_normal(name)) != version
        }
        if sbom.get("bomFormat") != "CycloneDX" or missing:
            raise ImageError(f"the SBOM in {tag} does not list {missing}")
        examples = REPO / "examples"
        run(
            "agentsafe",
            "policy",
            "lint",
            "/examples/policy.yaml",
            volume=f"{examples}:/examples:ro",
        )
        run("agentsafe", "policy", "test", "/examples", volume=f"{examples}:/examples:ro")
        report = {
            "distributions": len(installed),
            "sbom_components": len(sbom.get("components", [])),
            "sbom_spec": sbom.get("specVersion"),
        }
        _log(f"verified {tag}: {report}")
        return report
    finally:
        subprocess.run(["buildah", "umount", container], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def _dev_packages() -> set[str]:
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dev = extras["optional-dependencies"]["dev"]
    return {_normal(re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]) for spec in dev}


def build_single_binary(name: str, binary: Path, *, args: Sequence[str] = ()) -> None:
    """``FROM scratch`` + ``/<binary>`` as entrypoint, running as :data:`NONROOT`."""
    if image_exists(name):
        return
    with tempfile.TemporaryDirectory(prefix="agentsafe-image-") as work:
        tree = Path(work)
        shutil.copy2(binary, tree / binary.name)
        entrypoint = '["/' + binary.name + '"' + "".join(f', "{arg}"' for arg in args) + "]"
        _commit_tree(tree, name, config=["--entrypoint", entrypoint])


def export_archive(name: str, target: Path) -> Path:
    """A docker archive of ``name`` that ``ctr images import`` loads under the same name."""
    target.unlink(missing_ok=True)
    _run(
        ["buildah", "push", "--quiet", name, f"docker-archive:{target}:{name}"],
        what=f"export {name}",
    )
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tag", default=AGENTSAFE_IMAGE, help="the image name (agentsafe:dev)")
    parser.add_argument("--archive", type=Path, help="also write a docker archive here")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="after the build, check in the image: only the lock's packages, the SBOM, CEL",
    )
    parser.add_argument(
        "--write-base-lock",
        action="store_true",
        help=f"record the cached base tree's Debian packages in {BASE_LOCK.name} and exit",
    )
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        _log(f"needs {', '.join(missing)}: apt-get install -y {' '.join(missing)}")
        return 2
    try:
        if args.write_base_lock:
            write_base_lock()
            return 0
        build_agentsafe(args.tag)
        if args.verify:
            verify_agentsafe(args.tag)
        if args.archive:
            export_archive(args.tag, args.archive)
    except ImageError as error:
        _log(str(error))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
