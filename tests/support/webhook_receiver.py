"""A webhook receiver in its own process: HTTPS on loopback, one JSON line per POST on stdout.

Run as ``python tests/support/webhook_receiver.py CERT KEY``: it listens on 127.0.0.1 on a port
the kernel picks, prints ``listening PORT``, and then, for every POST to ``/hooks/approvals``,
one line ``{"path", "content_type", "body"}`` (the body parsed as JSON), answering 200. It stops
on SIGTERM or when stdin closes (its parent is gone). Used by the webhook tests of
``tests/integration/test_approvals.py`` as the Slack-compatible endpoint a notification reaches.
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import sys

from aiohttp import web


async def main(cert: str, key: str) -> None:
    async def hook(request: web.Request) -> web.Response:
        line = {
            "path": request.path,
            "content_type": request.headers.get("content-type"),
            "body": await request.json(),
        }
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hooks/approvals", hook)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sys.stdout.write(f"listening {port}\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.read(1) else None)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
