"""Run in a subprocess by tests/host/test_audithook.py: install the process guard, try everything.

The guard is permanent for the process that installs it, so it must never be installed in the
pytest process. Usage: ``python audithook_child.py <scenario> <outside_dir> <allowed_dir>...``;
prints one JSON object mapping each probe to ``ok``, ``refused:<code>`` or ``error:<type>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agentsafe.executor.host import audithook
from agentsafe.executor.host.audithook import (
    GuardError,
    GuardRefused,
    allowed_egress,
    install_guard,
)


def attempt(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except GuardRefused as exc:
        return f"refused:{exc.code}"
    except Exception as exc:
        return f"error:{type(exc).__name__}"
    return "ok"


def write(path: Path) -> None:
    with open(path, "w") as f:
        f.write("x")


def os_open_create(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))


def connect(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def connect_with(family: int, address: Any) -> None:
    with socket.socket(family) as s:
        s.connect_ex(address) if family == socket.AF_INET else s.connect(address)


def _sendto_inside(address: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender, allowed_egress():
        sender.sendto(b"ok", address)


def sqlite_uri(uri: str) -> None:
    con = sqlite3.connect(uri, uri=True)
    try:
        con.execute("create table if not exists t (x)")
        con.commit()
    finally:
        con.close()


def sqlite_touch(path: Path) -> None:
    con = sqlite3.connect(path)
    try:
        con.execute("create table if not exists t (x)")
        con.commit()
    finally:
        con.close()


async def http_probes(results: dict[str, str]) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}/"
    try:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(url) as resp:
                    await resp.read()
                results["aiohttp_outside"] = "ok"
            except aiohttp.ClientConnectorError as exc:
                cause = exc.os_error
                results["aiohttp_outside"] = (
                    f"refused:{cause.code}" if isinstance(cause, GuardRefused) else "error"
                )
        with allowed_egress():
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                results["aiohttp_inside"] = f"ok:{resp.status}:{await resp.text()}"
        # Context flows into tasks created inside the allowance, and not out of it.
        with allowed_egress():
            task = asyncio.create_task(asyncio.to_thread(connect, port))
        await task
        results["task_started_inside"] = "ok"
        results["loop_socket_outside"] = await _loop_connect(port)
    finally:
        await runner.cleanup()


async def _loop_connect(port: int) -> str:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except GuardRefused as exc:
        return f"refused:{exc.code}"
    writer.close()
    await writer.wait_closed()
    return "ok"


def main() -> None:
    scenario, outside = sys.argv[1], Path(sys.argv[2])
    allowed = [Path(p) for p in sys.argv[3:]]
    results: dict[str, str] = {}
    if scenario == "no-guard":
        results.update(audithook.run_self_test(allowed))
        print(json.dumps(results))
        return
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    guard = install_guard(writable_dirs=allowed)
    results["second_install"] = attempt(lambda: install_guard(writable_dirs=allowed))
    results["second_install_guard_error"] = str(
        isinstance(_catch(lambda: install_guard(writable_dirs=allowed)), GuardError)
    )
    results["self_test"] = json.dumps(guard.self_test(), sort_keys=True)
    # network
    results["raw_connect"] = attempt(lambda: connect(port))

    def connect_inside() -> None:
        with allowed_egress():
            connect(port)

    results["connect_inside"] = attempt(connect_inside)
    results["connect_after"] = attempt(lambda: connect(port))
    results["connect_ex"] = attempt(lambda: connect_with(socket.AF_INET, ("127.0.0.1", port)))
    results["unix_connect"] = attempt(lambda: connect_with(socket.AF_UNIX, "/nowhere"))
    results["socketpair"] = attempt(lambda: [s.close() for s in socket.socketpair()])
    # sends that name their own destination (issue 16 item 15), to a UDP socket the test
    # listens on: none may leave
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    udp_address = udp.getsockname()

    def datagram(send: Callable[[socket.socket], Any]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            send(sender)

    results["udp_sendto"] = attempt(lambda: datagram(lambda s: s.sendto(b"x", udp_address)))
    results["udp_sendmsg"] = attempt(
        lambda: datagram(lambda s: s.sendmsg([b"x"], [], 0, udp_address))
    )

    def fast_open() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.sendto(b"GET / HTTP/1.0\r\n\r\n", socket.MSG_FASTOPEN, ("127.0.0.1", port))

    results["tcp_fast_open"] = attempt(fast_open)

    results["udp_sendto_inside"] = attempt(
        lambda: (_sendto_inside(udp_address), udp.recv(16))  # the one datagram allowed
    )
    try:
        results["udp_received_outside"] = repr(udp.recv(16))
    except TimeoutError:
        results["udp_received_outside"] = "nothing"
    udp.close()
    # child processes
    results["subprocess_run"] = attempt(lambda: subprocess.run(["true"], check=False))
    results["os_system"] = attempt(lambda: os.system("true"))
    results["os_fork"] = attempt(os.fork)
    results["os_posix_spawn"] = attempt(lambda: os.posix_spawn("/bin/true", ["true"], {}))
    results["os_execv"] = attempt(lambda: os.execv("/bin/true", ["true"]))
    # files
    for i, d in enumerate(allowed):
        results[f"write_allowed_{i}"] = attempt(lambda d=d: write(d / "inside.txt"))
    results["mkdir_allowed"] = attempt(lambda: (allowed[0] / "sub").mkdir())
    results["write_allowed_nested_after_mkdir"] = attempt(
        lambda: write(allowed[0] / "sub" / "x.txt")
    )
    results["rename_inside"] = attempt(
        lambda: os.replace(allowed[0] / "sub" / "x.txt", allowed[0] / "y.txt")
    )
    results["remove_inside"] = attempt(lambda: os.remove(allowed[0] / "y.txt"))
    results["sqlite_inside"] = attempt(lambda: sqlite_touch(allowed[0] / "db.sqlite"))
    results["write_outside"] = attempt(lambda: write(outside / "new.txt"))
    results["append_outside"] = attempt(lambda: open(outside / "existing.txt", "a").close())
    results["read_outside"] = attempt(lambda: (outside / "existing.txt").read_text())
    results["os_open_outside"] = attempt(lambda: os_open_create(outside / "osopen.txt"))
    results["os_open_read_outside"] = attempt(
        lambda: os.close(os.open(outside / "existing.txt", os.O_RDONLY))
    )
    results["dotdot_escape"] = attempt(lambda: write(allowed[0] / ".." / "escaped.txt"))
    os.symlink(outside / "linked.txt", allowed[0] / "link")
    results["symlink_escape"] = attempt(lambda: write(allowed[0] / "link"))
    results["rename_out"] = attempt(
        lambda: os.rename(allowed[0] / "inside.txt", outside / "moved.txt")
    )
    results["remove_outside"] = attempt(lambda: os.remove(outside / "existing.txt"))
    results["mkdir_outside"] = attempt(lambda: os.mkdir(outside / "d"))
    results["chmod_outside"] = attempt(lambda: os.chmod(outside / "existing.txt", 0o777))
    results["sqlite_outside"] = attempt(lambda: sqlite_touch(outside / "db.sqlite"))
    results["sqlite_memory"] = attempt(lambda: sqlite3.connect(":memory:").close())
    # a parameter named x whose value spells mode=memory is not an in-memory database
    results["sqlite_uri_fake_memory"] = attempt(
        lambda: sqlite_uri(f"file:{outside / 'fake-memory.db'}?x=mode=memory")
    )
    results["sqlite_uri_encoded_path"] = attempt(
        lambda: sqlite_uri("file:" + str(outside / "enc.db").replace("/", "%2F"))
    )
    results["sqlite_uri_last_mode_wins"] = attempt(
        lambda: sqlite_uri(f"file:{outside / 'last.db'}?mode=memory&mode=rwc")
    )
    results["sqlite_uri_vfs"] = attempt(
        lambda: sqlite_uri(f"file:{outside / 'vfs.db'}?vfs=unix-none")
    )
    results["sqlite_uri_localhost"] = attempt(
        lambda: sqlite_uri(f"file://localhost{outside / 'host.db'}")
    )
    results["sqlite_uri_memory"] = attempt(lambda: sqlite_uri("file:shared?mode=memory"))
    results["sqlite_uri_inside"] = attempt(
        lambda: sqlite_uri(f"file:{allowed[0] / 'uri.db'}?mode=rwc")
    )
    results["dev_null"] = attempt(lambda: open(os.devnull, "w").close())
    # asyncio: the loop's self-pipe is a socketpair; aiohttp only inside the allowance
    asyncio.run(http_probes(results))
    results["outside_files_after"] = json.dumps(sorted(p.name for p in outside.iterdir()))
    listener.close()
    print(json.dumps(results))


def _catch(fn: Callable[[], Any]) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


if __name__ == "__main__":
    main()
