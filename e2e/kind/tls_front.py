"""A TLS front for a loopback-only service in the same pod (test-only, kind backend).

Role: the kind scenario's downstream is agentsafe's SYNTHETIC provider
(``python -m agentsafe.executor.tools.synthetic``), which binds loopback only by design and moves no
money. In the provider pod of ``e2e/kind/provider.yaml`` it keeps doing exactly that — it binds
the pod's own ``127.0.0.1`` — and this script, the pod's second container, terminates TLS on
the pod's address with a certificate the test made, and relays each connection's bytes to the
loopback port. Executors run in production posture and refuse plain ``http`` downstreams, so
this is what lets a real executor pod reach the synthetic provider over verified TLS.

The upstream is always ``127.0.0.1`` (there is no option to relay anywhere else): it fronts a
service of its own pod and nothing more. Standard library only, so it runs with the agentsafe
image's interpreter from a ConfigMap.

Usage: ``python tls_front.py --cert C --key K --listen-port 8443 --upstream-port 8080
[--listen-host 0.0.0.0]``; prints ``listening on HOST:PORT`` once it accepts connections.
Callers: ``e2e/kind/provider.yaml``, ``e2e/test_kind_provider.py`` (runs it locally).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import ssl
import sys

UPSTREAM_HOST = "127.0.0.1"
CHUNK = 64 * 1024


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:  # a reset, or a TLS alert: this relay is over either way
        pass
    finally:
        if not writer.can_write_eof():
            writer.close()


async def _handle(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    *,
    upstream_port: int,
) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            UPSTREAM_HOST, upstream_port
        )
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            _relay(client_reader, upstream_writer),
            _relay(upstream_reader, client_writer),
        )
    finally:
        for writer in (upstream_writer, client_writer):
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _serve(args: argparse.Namespace) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.cert, args.key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _handle(reader, writer, upstream_port=args.upstream_port)

    server = await asyncio.start_server(
        handle, args.listen_host, args.listen_port, ssl=context, ssl_handshake_timeout=10
    )
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port} -> {UPSTREAM_HOST}:{args.upstream_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cert", required=True, help="PEM certificate chain")
    parser.add_argument("--key", required=True, help="PEM private key")
    parser.add_argument("--listen-host", default="0.0.0.0", help="address to accept TLS on")
    parser.add_argument("--listen-port", type=int, required=True, help="0 picks a free port")
    parser.add_argument(
        "--upstream-port", type=int, required=True, help=f"the service on {UPSTREAM_HOST}"
    )
    args = parser.parse_args(argv)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
