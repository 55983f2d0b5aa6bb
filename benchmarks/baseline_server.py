"""The baseline for benchmarks/lifecycle.py: a raw aiohttp JSON endpoint, nothing else."""

from __future__ import annotations

import sys

from aiohttp import web


async def handle(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"ok": True, "keys": len(body)})


def main() -> None:
    app = web.Application()
    app.router.add_post("/v1/actions", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
