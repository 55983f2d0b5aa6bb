"""Secrets: handles that never leak, checked files, rotation under load, refusal on reload."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.secrets import (
    SECRET_NAMES,
    SecretHandle,
    SecretStore,
    SecretUnavailable,
    inspect_sources,
    unsafe_secrets_dir,
)

VALUE = "s3cr3t-value-0123456789abcdef"
TOKEN = "EXECUTOR_CALLER_TOKEN"
TOKEN_FILE = "EXECUTOR_CALLER_TOKEN_FILE"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to other users needs root")


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.005)


async def async_wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.005)


def put(path: Path, value: str, mode: int = 0o600) -> Path:
    """Write ``value`` atomically (temporary file, then rename), as a secret volume does."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(value)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return path


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    d = tmp_path / "secrets"
    d.mkdir(mode=0o700)
    return d


def load(
    secrets_dir: Path, *, production: bool = True, security: MemorySink | None = None, **kw: object
) -> SecretStore:
    env = {TOKEN_FILE: str(secrets_dir / "token")}
    return SecretStore.load(
        env,
        production=production,
        secrets_dir=secrets_dir,
        security=security,
        **kw,  # type: ignore[arg-type]
    )


def value_of(handle: SecretHandle | None) -> str:
    assert handle is not None
    with handle.reveal() as buf:
        return buf.decode()


# -- handles ---------------------------------------------------------------------------------


def test_handle_never_becomes_its_value(caplog: pytest.LogCaptureFixture) -> None:
    h = SecretHandle(TOKEN, bytearray(VALUE.encode()))
    rendered = [
        str(h),
        repr(h),
        format(h),
        format(h, ">80"),
        f"{h}",
        f"{h!r}",
        f"{h:^60}",
        "%s" % h,  # noqa: UP031
        "%r" % (h,),  # noqa: UP031
        "{}".format(h),  # noqa: UP032
        str([h]),
        str({"k": h}),
        json.dumps({"h": h}, default=str),
    ]
    for text in rendered:
        assert VALUE not in text
    assert str(h) == repr(h) == f"<secret {TOKEN}>"
    assert f"{h:>40}".strip() == f"<secret {TOKEN}>"

    with pytest.raises(TypeError):
        json.dumps(h)
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError):
            pickle.dumps(h, protocol=proto)
    with pytest.raises(TypeError):
        copy.copy(h)
    with pytest.raises(TypeError):
        copy.deepcopy(h)
    with pytest.raises(TypeError):
        bytes(h)
    with pytest.raises(TypeError):
        vars(h)

    stream = io.StringIO()
    logger = logging.getLogger("agentsafe.test.secrets")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s %(args)s"))
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="agentsafe.test.secrets"):
            logger.info("token %s", h)
            logger.info("token %r", h)
            logger.info(h)
            logger.info("mapping %(tok)s", {"tok": h})
            try:
                raise ValueError(h)
            except ValueError:
                logger.exception("failed with")
    finally:
        logger.removeHandler(handler)
    assert VALUE not in stream.getvalue()
    assert VALUE not in caplog.text
    assert f"<secret {TOKEN}>" in stream.getvalue()


def test_reveal_hands_out_a_copy_zeroed_after_the_block() -> None:
    h = SecretHandle(TOKEN, bytearray(b"abc"))
    with h.reveal() as buf:
        assert buf == bytearray(b"abc")
        kept = buf
        buf[0] = ord("X")  # a caller scribbling on its copy does not change the secret
    assert kept == bytearray(3)
    assert value_of(h) == "abc"


def test_dispose_zeroes_the_value_and_refuses_reveal() -> None:
    raw = bytearray(b"abcdef")
    h = SecretHandle(TOKEN, raw)
    h.dispose()
    assert raw == bytearray(6)
    assert h.disposed
    with pytest.raises(SecretUnavailable) as info, h.reveal():
        pass
    assert info.value.code == "SECRET_DISPOSED"


# -- loading ---------------------------------------------------------------------------------


def test_loads_a_private_file_in_production(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE + "\n")
    store = load(secrets_dir)
    assert store.names() == (TOKEN,)
    assert value_of(store.get(TOKEN)) == VALUE  # one trailing newline dropped
    assert store.get("DOWNSTREAM_CREDENTIAL") is None
    digest = store.digests()[TOKEN]
    assert digest.startswith("sha256:")
    assert VALUE not in digest
    source = store.source(TOKEN)
    assert source is not None
    assert source.resolved == (secrets_dir / "token").resolve()
    store.close()
    assert store.get(TOKEN) is not None
    assert store.get(TOKEN).disposed


def test_every_named_secret_can_be_given() -> None:
    env = {name: f"value-of-{name}" for name in SECRET_NAMES}
    store = SecretStore.load(env, production=False)
    assert set(store.names()) == set(SECRET_NAMES)
    for name in SECRET_NAMES:
        assert value_of(store.get(name)) == f"value-of-{name}"
    assert store.reload().not_reloadable == tuple(SECRET_NAMES)
    store.close()


def refusal(env: dict[str, str], **kw: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        SecretStore.load(env, **kw)  # type: ignore[arg-type]
    assert VALUE not in str(info.value)
    return info.value


def test_variable_refused_in_production(secrets_dir: Path) -> None:
    err = refusal({TOKEN: VALUE}, production=True, secrets_dir=secrets_dir)
    assert (err.code, err.variable) == ("SECRET_IN_ENV", TOKEN)


def test_variable_and_file_together_refused(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE)
    env = {TOKEN: VALUE, TOKEN_FILE: str(secrets_dir / "token")}
    err = refusal(env, production=False, secrets_dir=secrets_dir)
    assert err.code == "SECRET_BOTH_GIVEN"


def test_world_readable_file_refused(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE, mode=0o644)
    err = refusal(
        {TOKEN_FILE: str(secrets_dir / "token")}, production=True, secrets_dir=secrets_dir
    )
    assert (err.code, err.variable) == ("SECRET_FILE_MODE", TOKEN_FILE)


@needs_root
@pytest.mark.parametrize("mode", [0o640, 0o620, 0o604, 0o700 | 0o010])
def test_any_group_or_other_bit_on_a_private_file_refused(secrets_dir: Path, mode: int) -> None:
    # (root's own 0640 root:root file is the fsGroup shape, so use an ordinary user here)
    put(secrets_dir / "token", VALUE, mode=mode)
    os.chown(secrets_dir / "token", 1000, 1000)
    env = {TOKEN_FILE: str(secrets_dir / "token")}
    err = refusal(env, production=True, secrets_dir=secrets_dir, euid=1000, gids=[1000])
    assert err.code == "SECRET_FILE_MODE"


def test_symlink_escaping_the_directory_refused(secrets_dir: Path, tmp_path: Path) -> None:
    outside = put(tmp_path / "elsewhere", VALUE)
    (secrets_dir / "token").symlink_to(outside)
    err = refusal(
        {TOKEN_FILE: str(secrets_dir / "token")}, production=True, secrets_dir=secrets_dir
    )
    assert (err.code, err.variable) == ("SECRET_FILE_OUTSIDE_DIR", TOKEN_FILE)


def test_file_named_outside_the_directory_refused(secrets_dir: Path, tmp_path: Path) -> None:
    outside = put(tmp_path / "elsewhere", VALUE)
    err = refusal({TOKEN_FILE: str(outside)}, production=True, secrets_dir=secrets_dir)
    assert err.code == "SECRET_FILE_OUTSIDE_DIR"
    err = refusal(
        {TOKEN_FILE: str(secrets_dir / ".." / "elsewhere")},
        production=True,
        secrets_dir=secrets_dir,
    )
    assert err.code == "SECRET_FILE_OUTSIDE_DIR"


def kubernetes_volume(secrets_dir: Path, value: str, generation: str) -> None:
    """The layout a Secret volume has: key -> ..data/key, ..data -> ..<timestamp>/."""
    gen = secrets_dir / generation
    gen.mkdir()
    put(gen / "token", value)
    tmp_link = secrets_dir / "..data_tmp"
    tmp_link.symlink_to(generation)
    os.replace(tmp_link, secrets_dir / "..data")
    if not (secrets_dir / "token").is_symlink():
        (secrets_dir / "token").symlink_to("..data/token")


def test_kubernetes_data_links_are_followed_and_rotated(secrets_dir: Path) -> None:
    kubernetes_volume(secrets_dir, "first", "..2026_01_01")
    security = MemorySink()
    store = load(secrets_dir, security=security, grace_seconds=0)
    assert value_of(store.get(TOKEN)) == "first"
    kubernetes_volume(secrets_dir, "second", "..2026_01_02")
    assert store.changed_files() == (TOKEN,)
    report = store.reload()
    assert report.rotated == (TOKEN,)
    assert value_of(store.get(TOKEN)) == "second"
    assert security.named("SECRET_ROTATED") == [{"secret": TOKEN, "version": 2}]
    store.close()


def test_production_file_without_a_directory_refused(tmp_path: Path) -> None:
    put(tmp_path / "token", VALUE)
    err = refusal({TOKEN_FILE: str(tmp_path / "token")}, production=True)
    assert (err.code, err.variable) == ("SECRET_DIR_REQUIRED", "EXECUTOR_SECRETS_DIR")


def test_outside_production_without_a_directory_only_the_file_is_checked(tmp_path: Path) -> None:
    put(tmp_path / "token", VALUE)
    store = SecretStore.load({TOKEN_FILE: str(tmp_path / "token")}, production=False)
    assert value_of(store.get(TOKEN)) == VALUE
    store.close()
    os.chmod(tmp_path / "token", 0o644)
    err = refusal({TOKEN_FILE: str(tmp_path / "token")}, production=False)
    assert err.code == "SECRET_FILE_MODE"


def test_directory_taken_from_the_environment(secrets_dir: Path, tmp_path: Path) -> None:
    outside = put(tmp_path / "elsewhere", VALUE)
    env = {TOKEN_FILE: str(outside), "EXECUTOR_SECRETS_DIR": str(secrets_dir)}
    assert refusal(env, production=True).code == "SECRET_FILE_OUTSIDE_DIR"


def test_not_a_regular_file_refused(secrets_dir: Path) -> None:
    os.mkfifo(secrets_dir / "token", 0o600)
    err = refusal(
        {TOKEN_FILE: str(secrets_dir / "token")}, production=True, secrets_dir=secrets_dir
    )
    assert err.code == "SECRET_FILE_MODE"
    (secrets_dir / "dir").mkdir(mode=0o700)
    err = refusal({TOKEN_FILE: str(secrets_dir / "dir")}, production=True, secrets_dir=secrets_dir)
    assert err.code == "SECRET_FILE_MODE"


def test_missing_empty_and_oversized_files_refused(secrets_dir: Path) -> None:
    env = {TOKEN_FILE: str(secrets_dir / "token")}
    assert refusal(env, production=True, secrets_dir=secrets_dir).code == "SECRET_FILE_UNREADABLE"
    put(secrets_dir / "token", "\n")
    assert refusal(env, production=True, secrets_dir=secrets_dir).code == "SECRET_EMPTY"
    put(secrets_dir / "token", "x" * (1024 * 1024 + 1))
    assert refusal(env, production=True, secrets_dir=secrets_dir).code == "SECRET_FILE_TOO_LARGE"


@needs_root
def test_file_owned_by_another_user_refused(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE)
    os.chown(secrets_dir / "token", 12345, 12345)
    err = refusal(
        {TOKEN_FILE: str(secrets_dir / "token")}, production=True, secrets_dir=secrets_dir
    )
    assert (err.code, err.variable) == ("SECRET_FILE_OWNER", TOKEN_FILE)


@needs_root
def test_root_owned_group_readable_file_accepted_for_a_member(secrets_dir: Path) -> None:
    # a Secret volume with fsGroup: root:2000 0440, read by uid 1000 in group 2000
    put(secrets_dir / "token", VALUE, mode=0o440)
    os.chown(secrets_dir / "token", 0, 2000)
    env = {TOKEN_FILE: str(secrets_dir / "token")}
    store = SecretStore.load(
        env, production=True, secrets_dir=secrets_dir, euid=1000, gids=[1000, 2000]
    )
    assert value_of(store.get(TOKEN)) == VALUE
    store.close()
    # not in the group: the owner is wrong for this process
    err = refusal(env, production=True, secrets_dir=secrets_dir, euid=1000, gids=[1000])
    assert err.code == "SECRET_FILE_OWNER"
    # group-writable, or readable by others: the mode is wrong
    for mode in (0o460, 0o444, 0o450):
        os.chmod(secrets_dir / "token", mode)
        err = refusal(env, production=True, secrets_dir=secrets_dir, euid=1000, gids=[2000])
        assert err.code == "SECRET_FILE_MODE", oct(mode)


@needs_root
def test_file_private_to_another_non_root_user_refused_for_this_one(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE, mode=0o600)
    os.chown(secrets_dir / "token", 1000, 1000)
    env = {TOKEN_FILE: str(secrets_dir / "token")}
    store = SecretStore.load(env, production=True, secrets_dir=secrets_dir, euid=1000, gids=[1000])
    store.close()
    err = refusal(env, production=True, secrets_dir=secrets_dir, euid=1001, gids=[1000])
    assert err.code == "SECRET_FILE_OWNER"


def test_inspection_reports_every_problem_without_reading(
    secrets_dir: Path, tmp_path: Path
) -> None:
    put(secrets_dir / "token", VALUE, mode=0o644)
    put(tmp_path / "key", VALUE)
    env = {
        TOKEN_FILE: str(secrets_dir / "token"),
        "EXECUTOR_TLS_KEY_FILE": str(tmp_path / "key"),
        "DOWNSTREAM_CREDENTIAL": VALUE,
    }
    found = inspect_sources(env, production=True, secrets_dir=secrets_dir).findings
    assert {(f.variable, f.code) for f in found} == {
        (TOKEN_FILE, "SECRET_FILE_MODE"),
        ("EXECUTOR_TLS_KEY_FILE", "SECRET_FILE_OUTSIDE_DIR"),
        ("DOWNSTREAM_CREDENTIAL", "SECRET_IN_ENV"),
    }
    assert all(VALUE not in f.problem for f in found)


# -- rotation --------------------------------------------------------------------------------


def test_rotation_swaps_the_handle_and_zeroes_the_old_after_the_grace(secrets_dir: Path) -> None:
    put(secrets_dir / "token", "old-value")
    security = MemorySink()
    store = load(secrets_dir, security=security, grace_seconds=0.05)
    changes: list[tuple[str, SecretHandle]] = []
    store.on_change(lambda name, handle: changes.append((name, handle)))
    old = store.get(TOKEN)
    assert old is not None
    old_digest = store.digests()[TOKEN]
    put(secrets_dir / "token", "new-value")
    report = store.reload()
    assert report.rotated == (TOKEN,)
    assert report.refused == ()
    assert value_of(store.get(TOKEN)) == "new-value"  # the next request admits the new value
    assert store.rotation_counts() == {TOKEN: 1}
    assert store.digests()[TOKEN] != old_digest
    assert changes == [(TOKEN, store.get(TOKEN))]
    assert security.named("SECRET_ROTATED") == [{"secret": TOKEN, "version": 2}]
    wait_for(lambda: old.disposed)  # the old value is zeroed once the grace has run
    with pytest.raises(SecretUnavailable), old.reveal():
        pass
    events = json.dumps(security.events)
    assert "old-value" not in events
    assert "new-value" not in events
    assert "old-value" not in json.dumps(report.as_dict())
    # an unchanged file is not a rotation
    assert store.reload().unchanged == (TOKEN,)
    assert store.rotation_counts() == {TOKEN: 1}
    store.close()


def test_old_handle_still_usable_within_the_grace(secrets_dir: Path) -> None:
    put(secrets_dir / "token", "old-value")
    store = load(secrets_dir, grace_seconds=3600)
    in_flight = store.get(TOKEN)
    put(secrets_dir / "token", "new-value")
    store.reload()
    assert value_of(in_flight) == "old-value"  # a request in flight keeps the value it took
    store.close()  # close zeroes retiring handles at once
    assert in_flight is not None
    assert in_flight.disposed


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda p, tmp: os.chmod(p, 0o644), "SECRET_FILE_MODE"),
        (lambda p, tmp: put(p, "new-but-world-readable", mode=0o604), "SECRET_FILE_MODE"),
        (
            lambda p, tmp: (os.remove(p), p.symlink_to(put(tmp / "x", "evil"))),
            "SECRET_FILE_OUTSIDE_DIR",
        ),
        (lambda p, tmp: os.remove(p), "SECRET_FILE_UNREADABLE"),
        (lambda p, tmp: put(p, ""), "SECRET_EMPTY"),
    ],
)
def test_reload_refusal_keeps_the_old_value(
    secrets_dir: Path,
    tmp_path: Path,
    change: Callable[[Path, Path], object],
    code: str,
) -> None:
    put(secrets_dir / "token", "good-value")
    security = MemorySink()
    store = load(secrets_dir, security=security, grace_seconds=0)
    before = store.get(TOKEN)
    change(secrets_dir / "token", tmp_path)
    report = store.reload()
    assert report.rotated == ()
    assert [(r.secret, r.variable, r.code) for r in report.refused] == [(TOKEN, TOKEN_FILE, code)]
    assert store.get(TOKEN) is before
    assert value_of(before) == "good-value"
    refused = security.named("SECRET_RELOAD_REFUSED")
    assert refused == [
        {"secret": TOKEN, "variable": TOKEN_FILE, "file": str(secrets_dir / "token"), "code": code}
    ]
    assert security.named("SECRET_ROTATED") == []
    store.close()


async def test_rotation_under_concurrent_readers(secrets_dir: Path) -> None:
    # Each version is long and uniform, so a torn read would show as a mixed value.
    versions = [chr(ord("a") + i) * 64 * 1024 for i in range(12)]
    put(secrets_dir / "token", versions[0])
    store = load(secrets_dir, grace_seconds=5)
    seen: set[str] = set()
    bad: list[str] = []
    stop = threading.Event()

    def rotate() -> None:
        for value in versions[1:]:
            put(secrets_dir / "token", value)
            store.reload()
        stop.set()

    async def reader() -> None:
        while not stop.is_set():
            handle = store.get(TOKEN)
            assert handle is not None
            with handle.reveal() as buf:
                text = buf.decode()
            if text not in versions:
                bad.append(text[:8] + "...")
            seen.add(text[0])
            await asyncio.sleep(0)

    readers = [asyncio.create_task(reader()) for _ in range(16)]
    writer = asyncio.to_thread(rotate)
    await asyncio.gather(writer, *readers)
    assert bad == []
    assert value_of(store.get(TOKEN)) == versions[-1]
    assert store.rotation_counts()[TOKEN] == len(versions) - 1
    assert len(seen) > 1  # the readers really ran across rotations
    store.close()


async def test_watch_follows_changes_and_refusals(secrets_dir: Path) -> None:
    put(secrets_dir / "token", "first-value")
    security = MemorySink()
    store = load(secrets_dir, security=security, grace_seconds=0)
    task = asyncio.create_task(store.watch(0.01))
    try:
        put(secrets_dir / "token", "second-value")
        await async_wait_for(lambda: bool(security.named("SECRET_ROTATED")))
        assert value_of(store.get(TOKEN)) == "second-value"
        # a permission change alone (no new content) is noticed and refused
        os.chmod(secrets_dir / "token", 0o644)
        await async_wait_for(lambda: bool(security.named("SECRET_RELOAD_REFUSED")))
        assert value_of(store.get(TOKEN)) == "second-value"
        assert security.named("SECRET_RELOAD_REFUSED")[0]["code"] == "SECRET_FILE_MODE"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        store.close()


def test_a_current_secret_follows_every_rotation_and_never_leaks(secrets_dir: Path) -> None:
    path = put(secrets_dir / "token", "first-value-0123456789")
    store = load(secrets_dir, grace_seconds=60.0)
    name = store.names()[0]
    current = store.current(name)
    kept = store.get(name)
    with current.reveal() as value:
        assert bytes(value) == b"first-value-0123456789"
    put(path, "second-value-9876543210")
    store.reload()
    with current.reveal() as value:
        assert bytes(value) == b"second-value-9876543210"
    assert value_of(kept) == "first-value-0123456789", "a kept handle is the old version"
    for text in (repr(current), str(current), f"{current}", f"{current:>40}"):
        assert "value" not in text
    with pytest.raises(TypeError):
        pickle.dumps(current)
    missing = store.current("DOWNSTREAM_SIGNING_KEY")
    with pytest.raises(SecretUnavailable), missing.reveal():
        pass
    store.close()


# -- an unsafe EXECUTOR_SECRETS_DIR (issue 16 item 16) --------------------------------------


@pytest.mark.parametrize("root", ["/", "/etc", "/usr", "/var", "/tmp", "/home", "/root", "/run"])
def test_the_root_and_system_directories_are_refused_as_the_secrets_dir(root: str) -> None:
    """EXECUTOR_SECRETS_DIR=/ made every file on the host "inside the directory": a containment
    check that holds for /etc/shadow checks nothing."""
    err = refusal({"EXECUTOR_SECRETS_DIR": root}, production=True)
    assert (err.code, err.variable) == ("SECRET_DIR_UNSAFE", "EXECUTOR_SECRETS_DIR")
    assert root not in str(err).replace("EXECUTOR_SECRETS_DIR", "")  # names no value


def test_a_symlink_to_the_root_is_refused_as_what_it_resolves_to(tmp_path: Path) -> None:
    (tmp_path / "innocent").symlink_to("/")
    err = refusal({"EXECUTOR_SECRETS_DIR": str(tmp_path / "innocent")}, production=False)
    assert err.code == "SECRET_DIR_UNSAFE"


@pytest.mark.parametrize("tree", ["/proc/self", "/sys/kernel", "/dev/shm"])
def test_pseudo_filesystems_are_refused_at_any_depth(tree: str) -> None:
    assert unsafe_secrets_dir(tree) is not None


def test_a_directory_others_may_write_is_refused(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE)
    os.chmod(secrets_dir, 0o777)
    env = {TOKEN_FILE: str(secrets_dir / "token")}
    err = refusal(env, production=True, secrets_dir=secrets_dir)
    assert (err.code, err.variable) == ("SECRET_DIR_UNSAFE", "EXECUTOR_SECRETS_DIR")
    os.chmod(secrets_dir, 0o770)
    assert unsafe_secrets_dir(str(secrets_dir)) is not None  # group-writable too
    os.chmod(secrets_dir, 0o750)
    assert unsafe_secrets_dir(str(secrets_dir)) is None


@pytest.mark.parametrize("variable", ["EXECUTOR_STATE_DIR", "EXECUTOR_JOURNAL_DIR"])
def test_a_directory_overlapping_what_the_executor_writes_is_refused(
    tmp_path: Path, variable: str
) -> None:
    """Files the executor wrote itself pass the owner and mode checks: never secrets."""
    base = tmp_path / "base"
    (base / "state").mkdir(parents=True, mode=0o700)
    os.chmod(base, 0o700)
    put(base / "token", VALUE)
    env = {TOKEN_FILE: str(base / "token"), variable: str(base / "state")}
    err = refusal(env, production=True, secrets_dir=base)  # holds the writable directory
    assert err.code == "SECRET_DIR_UNSAFE"
    err = refusal({variable: str(base)}, production=True, secrets_dir=base / "state")  # inside
    assert err.code == "SECRET_DIR_UNSAFE"


def test_a_private_mount_directory_is_accepted(secrets_dir: Path) -> None:
    put(secrets_dir / "token", VALUE)
    store = load(secrets_dir)
    assert value_of(store.get(TOKEN)) == VALUE
    store.close()
