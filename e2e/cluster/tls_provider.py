"""Serve the executor's synthetic loopback provider over TLS, as a separate process.

Role: the downstream of the end-to-end scenario. An AgentPolicy's downstream is ``https``
(the operator renders a production environment, which refuses plain ``http``), so the
synthetic provider's own application (:class:`agentsafe.executor.tools.synthetic.SyntheticProvider`)
is served here behind a certificate for ``127.0.0.1`` made by the scenario. It moves no money.

Usage: ``python tls_provider.py --cert C --key K --port-file F``; writes the port to ``F`` once
listening; ``GET /_control/received`` tells what arrived. Caller: ``e2e/test_scenario.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from pathlib import Path

from aiohttp import web

from agentsafe.executor.tools.synthetic import SyntheticProvider


async def _serve(cert: Path, key: Path, port_file: Path) -> None:
    provider = SyntheticProvider()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    runner = web.AppRunner(provider.app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = int(runner.addresses[0][1])
    staging = port_file.with_suffix(".tmp")
    staging.write_text(str(port))
    staging.replace(port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.cert, args.key, args.port_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
