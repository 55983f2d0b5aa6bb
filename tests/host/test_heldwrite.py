"""host/heldwrite.py (``HeldDescriptor``): a short write that cannot wait is made whole with the
GIL held; anything else writes nothing, so the caller's ordinary write waits or raises as
before."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentsafe.executor.host.heldwrite import PIPE_BUF, HeldDescriptor


def write_held(fd: int, data: bytes) -> int:
    return HeldDescriptor(fd).write(data)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    try:
        yield read, write
    finally:
        for fd in (read, write):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_a_line_is_written_whole_to_a_regular_file(tmp_path: Path) -> None:
    line = '{"event":"DECISION","note":"é ☃ 𝄞"}\n'.encode()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        assert write_held(fd, line) == len(line)
        assert write_held(fd, line) == len(line)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == line * 2


def test_a_line_is_written_whole_to_a_pipe_with_room(pipe: tuple[int, int]) -> None:
    read, write = pipe
    line = b"x" * (PIPE_BUF - 1) + b"\n"
    assert write_held(write, line) == PIPE_BUF
    assert os.read(read, 2 * PIPE_BUF) == line


def test_a_line_longer_than_pipe_buf_is_left_to_the_ordinary_write(pipe: tuple[int, int]) -> None:
    read, write = pipe
    assert write_held(write, b"x" * (PIPE_BUF + 1)) == 0
    os.set_blocking(read, False)
    with pytest.raises(BlockingIOError):  # nothing was written
        os.read(read, 1)


def test_a_full_pipe_is_never_waited_on(pipe: tuple[int, int]) -> None:
    read, write = pipe
    os.set_blocking(write, False)
    filled = 0
    while True:
        try:
            filled += os.write(write, b"y" * 1024)
        except BlockingIOError:
            break
    assert write_held(write, b"line\n") == 0
    assert len(os.read(read, filled + 1024)) <= filled  # only what filled it


def test_a_pipe_without_a_reader_is_left_to_the_ordinary_write_which_raises(
    pipe: tuple[int, int],
) -> None:
    read, write = pipe
    os.close(read)
    assert write_held(write, b"line\n") == 0
    with pytest.raises(BrokenPipeError):
        os.write(write, b"line\n")


def test_a_closed_descriptor_and_an_empty_line_write_nothing(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    assert write_held(fd, b"line\n") == 0
    read, write = os.pipe()
    try:
        assert write_held(write, b"") == 0
    finally:
        os.close(read)
        os.close(write)


def test_a_non_blocking_pipe_that_fills_mid_line_takes_only_what_fits(
    pipe: tuple[int, int],
) -> None:
    """poll says writable with one page free; a line under PIPE_BUF is then atomic: whole or, on
    a descriptor someone made non-blocking, nothing (never a torn line)."""
    _, write = pipe
    size = fcntl.fcntl(write, fcntl.F_GETPIPE_SZ)
    os.set_blocking(write, False)
    os.write(write, b"z" * (size - PIPE_BUF))  # exactly one page left
    line = b"w" * (PIPE_BUF // 2) + b"\n"
    assert write_held(write, line) in (0, len(line))


def _handoffs(write: Callable[[int, bytes], object], fd: int, lines: int) -> int:
    """How often another thread that wants the GIL got it while ``write`` ran ``lines`` times
    (a switch interval far longer than the loop, so only a release lets it in)."""
    stop = threading.Event()
    turns = [0]

    def wants_the_gil() -> None:
        while not stop.is_set():
            turns[0] += 1
            os.sched_yield()  # releases the GIL, and asks for it back at once

    interval = sys.getswitchinterval()
    thread = threading.Thread(target=wants_the_gil, daemon=True)
    sys.setswitchinterval(5.0)
    try:
        thread.start()
        while turns[0] == 0:  # it is running, and waiting for the GIL between its turns
            time.sleep(0.001)
        before = turns[0]
        for _ in range(lines):
            write(fd, b"a line of evidence\n")
        during = turns[0] - before
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        thread.join()
    return during


def test_the_gil_is_held_through_the_write(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # The method first shows that it sees a release: os.write hands the GIL over (how often
        # depends on when the other thread wakes, so it is asked again until it has, or 10 s).
        deadline = time.monotonic() + 10
        while _handoffs(os.write, fd, 2000) < 20:
            assert time.monotonic() < deadline, "os.write never let the other thread in"
        held = HeldDescriptor(fd)
        assert _handoffs(lambda _, data: held.write(data), fd, 2000) < 5
    finally:
        os.close(fd)


def test_only_pipes_and_regular_files_take_held_writes(tmp_path: Path) -> None:
    """A terminal's or a socket's room can be smaller than a line even when poll says writable:
    they, every other character device (/dev/null) and a closed descriptor are written the
    ordinary way."""
    read, write = os.pipe()
    left, right = socket.socketpair()
    regular = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_WRONLY)
    primary, secondary = pty.openpty()
    try:
        for fd in (write, regular):
            held = HeldDescriptor.open(fd)
            assert held is not None
            assert held.write(b"line\n") == 5
        assert HeldDescriptor.open(left.fileno()) is None
        assert HeldDescriptor.open(null) is None
        assert HeldDescriptor.open(secondary) is None
    finally:
        for fd in (read, write, regular, null, primary, secondary):
            os.close(fd)
        left.close()
        right.close()
    assert HeldDescriptor.open(regular) is None  # closed
