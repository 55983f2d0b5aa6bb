"""host/durable.py: every byte written even when os.write writes fewer; directories synced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentsafe.executor.host import durable


def test_write_all_writes_every_byte_through_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    calls: list[int] = []

    def one_byte(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:1]))

    monkeypatch.setattr(durable.os, "write", one_byte)
    key = bytearray(b"key material")
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        durable.write_all(fd, key)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"key material"
    assert len(calls) == len(key)
    key[:] = bytes(len(key))  # no view is left holding the buffer: it can be wiped and resized
    key.clear()


def test_write_all_raises_what_os_write_raises(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError):
            durable.write_all(fd, b"x")
    finally:
        os.close(fd)


def test_fsync_directory_syncs_a_directory_and_refuses_a_file(tmp_path: Path) -> None:
    durable.fsync_directory(tmp_path)
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        durable.fsync_directory(tmp_path / "f")
