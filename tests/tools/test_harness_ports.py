"""``harness.free_port``: the port a test hands a child process is one no client socket can take
before the child binds it, and one no parallel worker hands out at the same time."""

from __future__ import annotations

import secrets
import socket

import pytest

from agentsafe.executor.tools import harness


def test_a_free_port_lies_below_the_kernels_range_for_outgoing_connections() -> None:
    low, high = harness._ephemeral_ports()
    ports = [harness.free_port() for _ in range(50)]
    assert all(harness._PORT_FLOOR <= port < low for port in ports), (ports, low, high)


def test_a_port_handed_out_is_not_handed_out_again_while_its_claim_lasts() -> None:
    ports = [harness.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = harness._ephemeral_ports()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", harness.free_port()))
        holder.listen()
        taken = holder.getsockname()[1]
        (harness._PORT_CLAIMS / str(taken)).unlink()
        draws = [taken - harness._PORT_FLOOR] * 2
        randbelow = secrets.randbelow

        def rigged(n: int) -> int:
            return draws.pop() if draws else randbelow(n)

        monkeypatch.setattr(harness.secrets, "randbelow", rigged)
        port = harness.free_port()
        assert port != taken
        assert harness._PORT_FLOOR <= port < low


def test_a_port_in_the_range_to_avoid_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The end-to-end node keeps its host listeners off the NodePort range, which kube-router
    opens to every pod on a node address (e2e/cluster/node.py, ``NODE_PORTS``): the first draws
    land in the range and are passed over."""
    avoid = range(30000, 32768)
    draws = [avoid.start - harness._PORT_FLOOR, avoid.stop - 1 - harness._PORT_FLOOR]
    randbelow = secrets.randbelow

    def rigged(n: int) -> int:
        return draws.pop() if draws else randbelow(n)

    monkeypatch.setattr(harness.secrets, "randbelow", rigged)
    ports = [harness.free_port(avoid=avoid) for _ in range(100)]
    assert not draws, "the rigged draws were not used"
    assert not [port for port in ports if port in avoid], ports


def test_with_no_room_below_the_kernels_range_the_fallback_avoids_the_range_too() -> None:
    low, _ = harness._ephemeral_ports()
    avoid = range(harness._PORT_FLOOR, low)
    port = harness.free_port(avoid=avoid)
    assert port not in avoid
