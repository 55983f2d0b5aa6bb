"""Every process of a shared-port row listens before the row is measured (benchmarks/loadclient.py
``listeners``, goals.py ``start_floors``).

Until 2026-12-05 goals.py's two-process floor row started its second process and went on as
soon as the port answered HTTP, which the first process already did. The run then began while
the second was still importing its modules: in three rounds of 3000 ALLOWs at c=16 it spent
0.03-0.06 ms per request (its start-up) against the first's 0.90-1.02, so "the floor's two
processes" was one process (docs/performance.md, 2026-12-05). The second test fails on that code.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from .scripts import load_goals


@pytest.fixture(scope="module")
def goals() -> ModuleType:
    return load_goals("agentsafe_bench_goals_listeners")


def _shared(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []
    yield made
    for sock in made:
        sock.close()


def test_each_listening_socket_on_the_port_counts_and_a_bound_one_does_not(
    goals: ModuleType, sockets: list[socket.socket]
) -> None:
    listeners = goals.listeners
    reserved = _shared()  # bound, never listening: the supervisor's reservation
    sockets.append(reserved)
    port = reserved.getsockname()[1]
    assert listeners(port) == 0
    for want in (1, 2):
        sock = _shared(port)
        sockets.append(sock)
        sock.listen()
        assert listeners(port) == want
    other = _shared()
    sockets.append(other)
    other.listen()
    assert listeners(port) == 2  # another port's listener is not this one's


async def test_two_floors_on_one_port_both_listen_when_started(
    goals: ModuleType, tmp_path: Path
) -> None:
    port = goals.free_port()
    servers = await goals.start_floors(
        ["allow", str(port), str(tmp_path), "http://127.0.0.1:9/payouts", "--reuse-port"],
        port,
        2,
        "two floors",
    )
    try:
        assert goals.listeners(port) == 2
    finally:
        for server in servers:
            server.terminate()
            await server.wait()
