"""A SYNTHETIC loopback payment provider, for the demo and the tests. It moves no money.

It behaves the way a payment API does where that matters to the executor, and nothing more:

* ``POST /payouts`` takes a JSON body and an ``idempotency-key`` header. The first request with a
  key is recorded and answered; a later request with the same key and the same body gets the first
  answer again (nothing happens twice); the same key with a different body is
  ``409 {"code": "IDEMPOTENCY_KEY_REUSED"}``. A missing key is
  ``400 {"code": "IDEMPOTENCY_KEY_MISSING"}``.
* The behaviour of a new request is its mode: the provider's current mode (``POST /_control/mode``
  with ``{"mode": ...}``), overridden per request by a ``mode`` query parameter or a top-level
  ``synthetic_mode`` body field:

  ==========  ==============================================================  ==============
  mode        answer                                                          lookup says
  ==========  ==============================================================  ==============
  normal      ``202 {"reference": "syn_..."}``                                executed (200)
  refuse      ``422 {"code": "INSUFFICIENT_FUNDS"}``                          not found (404)
  error       ``500`` with no body (it failed before acting)                  not found (404)
  hang        reads the request, acts on it, never answers                    executed (200)
  reset       reads the request, acts on it, drops the connection             executed (200)
  reflect     ``422 {"code": <its authorization header>}``: a hostile         not found (404)
              provider handing the credential back as a reason code
  reflect-    ``202 {"reference": <base64url of its authorization header>}``  executed (200)
  reference   (the credential back, encoded, as the provider's reference)
  hold        acts on it, answers as ``normal`` once ``/_control/release``    executed (200)
  ==========  ==============================================================  ==============

* The lookup's behaviour is ``POST /_control/lookup`` with ``{"mode": ...}``: ``normal`` as
  above; ``lag`` answers 404 even for a key it acted on (a provider whose lookup lags its
  commit); ``hold`` waits for ``POST /_control/release`` before answering. ``release`` frees
  every held request and lookup at once.

* ``GET /payouts/{idempotency_key}``: ``200 {"reference", "status": "executed"}`` for a key it
  acted on, ``404 {"code": "NOT_FOUND"}`` otherwise; while lookups are switched off
  (``POST /_control/lookups`` with ``{"available": false}``) every lookup is
  ``503 {"code": "LOOKUP_UNAVAILABLE"}``, so a reconciliation cannot learn anything.
* ``GET /_control/received``: how many payout requests arrived and their keys, how many were
  held and how many lookups came (``held``, ``lookups``, ``lookups_waiting``), and what a
  credential requirement refused (``refusals``), so a test or the demo can assert that nothing
  reached the provider (shadow mode, refusals) or wait until a request is held.
* ``GET /``: says that this is a synthetic provider.
* With a record file (``record=`` or ``--record FILE``), every payout request is appended to it as
  one JSON line, flushed and fsynced before the provider acts on it (``"event": "received"``: the
  idempotency key, the grant id header, the mode, the body's SHA-256, whether it was ``new`` or
  a ``repeat`` of a key already seen) and again when it answers (``"event": "answered"``, the
  status). No header value but the grant id and the key is written. The nemesis harness
  (``e2e/chaos/``) checks at-most-once on this record, which survives the provider's process.
* With a credential requirement (``require=`` or ``--require-credential FILE``,
  :mod:`agentsafe.executor.tools.synthetic_credentials`), every payout and every lookup that does
  not prove the executor is ``401 {"code": ...}`` and changes nothing, and under PRIVATE_KEY_JWT
  ``POST /oauth/token`` issues the access tokens. A lookup that carries
  ``x-agent-safe-intent-hash`` for a key whose payout carried another is
  ``409 {"code": "INTENT_HASH_MISMATCH"}``.

Run it alone with ``python -m agentsafe.executor.tools.synthetic --port N``; it binds loopback only
and prints its base URL on standard output once it is listening. Tests use
:class:`SyntheticProvider` in-process (``await provider.start()``, ``await provider.stop()``).

Callers: the integration tests; the harness (so the demo, the crash tests and the benchmarks)
and the end-to-end provider pod (``e2e/kind/provider.yaml``) start it as its own process,
``python -m agentsafe.executor.tools.synthetic``.
Also imported by ``selftest.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ..egress.transport import is_loopback_host
from .synthetic_credentials import TOKEN_PATH, CredentialRequirement

__all__ = ["LOOKUP_MODES", "MODES", "ReceivedRequest", "SyntheticProvider", "main"]

MODES = ("normal", "refuse", "error", "hang", "reset", "hold", "reflect", "reflect-reference")
LOOKUP_MODES = ("normal", "lag", "hold")
_BANNER = "agentsafe SYNTHETIC provider: loopback only, moves no money, for demos and tests"


@dataclass(frozen=True)
class ReceivedRequest:
    """One payout request as it arrived (tests read headers; the control API never shows them)."""

    idempotency_key: str | None
    headers: Mapping[str, str]
    body: bytes
    mode: str


@dataclass
class _Payout:
    body: bytes
    executed: bool
    reference: str
    answer: tuple[int, bytes | None] | None  # None: it never answered (hang, reset)
    intent_hash: str | None = None


@dataclass
class _State:
    mode: str = "normal"
    lookups_available: bool = True
    lookup_mode: str = "normal"
    payouts: dict[str, _Payout] = field(default_factory=dict)
    received: list[ReceivedRequest] = field(default_factory=list)
    lookups: int = 0
    lookups_waiting: int = 0
    held: int = 0


class SyntheticProvider:
    """The synthetic provider as an object a test or the demo can start and inspect."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        require: CredentialRequirement | None = None,
        record: Path | None = None,
    ) -> None:
        if not is_loopback_host(host):
            raise ValueError("the synthetic provider binds loopback only")
        self.host = host
        self.port = port
        self.require = require
        self.record = record
        self.refusals: list[str] = []
        self.state = _State()
        self._release = asyncio.Event()
        self._held = asyncio.Event()  # set by /_control/release, renewed after
        self._runner: web.AppRunner | None = None
        self.app = self._build_app()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> str:
        self._release = asyncio.Event()
        self._runner = web.AppRunner(
            self.app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.base_url

    async def stop(self) -> None:
        self._release.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- inspection ------------------------------------------------------------------------
    @property
    def received(self) -> list[ReceivedRequest]:
        return list(self.state.received)

    def executed_keys(self) -> list[str]:
        return [key for key, payout in self.state.payouts.items() if payout.executed]

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError("unknown mode")
        self.state.mode = mode

    # -- the application -------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024)
        app.router.add_get("/", self._index)
        app.router.add_post("/payouts", self._create)
        app.router.add_get("/payouts/{key}", self._lookup)
        app.router.add_post(TOKEN_PATH, self._token)
        app.router.add_post("/_control/mode", self._set_mode)
        app.router.add_post("/_control/lookups", self._set_lookups)
        app.router.add_post("/_control/lookup", self._set_lookup)
        app.router.add_post("/_control/release", self._release_held)
        app.router.add_get("/_control/received", self._received)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, app: web.Application) -> None:
        self._release.set()
        self._held.set()

    async def _set_lookup(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _json(400, {"code": "REQUEST_INVALID"})
        mode = payload.get("mode") if isinstance(payload, dict) else None
        if mode not in LOOKUP_MODES:
            return _json(400, {"code": "MODE_UNKNOWN"})
        self.state.lookup_mode = mode
        return _json(200, {"lookup": mode})

    async def _release_held(self, request: web.Request) -> web.Response:
        held, self._held = self._held, asyncio.Event()
        held.set()
        return _json(200, {"released": True})

    async def _wait_released(self) -> None:
        await self._held.wait()

    async def _index(self, request: web.Request) -> web.Response:
        return _json(200, {"synthetic": True, "description": _BANNER, "modes": list(MODES)})

    async def _set_mode(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _json(400, {"code": "REQUEST_INVALID"})
        mode = payload.get("mode") if isinstance(payload, dict) else None
        if mode not in MODES:
            return _json(400, {"code": "MODE_UNKNOWN"})
        self.state.mode = mode
        return _json(200, {"mode": mode})

    async def _set_lookups(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _json(400, {"code": "REQUEST_INVALID"})
        available = payload.get("available") if isinstance(payload, dict) else None
        if not isinstance(available, bool):
            return _json(400, {"code": "REQUEST_INVALID"})
        self.state.lookups_available = available
        return _json(200, {"available": available})

    async def _received(self, request: web.Request) -> web.Response:
        keys = [r.idempotency_key for r in self.state.received]
        return _json(
            200,
            {
                "count": len(keys),
                "keys": keys,
                "mode": self.state.mode,
                "refusals": list(self.refusals),
                "held": self.state.held,
                "lookups": self.state.lookups,
                "lookups_waiting": self.state.lookups_waiting,
            },
        )

    def _refused(
        self, request: web.Request, body: bytes, lookup_key: str | None
    ) -> web.Response | None:
        if self.require is None:
            return None
        refusal = self.require.check(
            method=request.method,
            path=request.raw_path,
            headers=list(request.headers.items()),
            body=body,
            lookup_key=lookup_key,
        )
        if refusal is None:
            return None
        self.refusals.append(refusal.code)
        return _json(refusal.status, {"code": refusal.code})

    async def _token(self, request: web.Request) -> web.Response:
        if self.require is None:
            return _json(404, {"code": "NOT_FOUND"})
        form = await request.post()
        fields = {name: value for name, value in form.items() if isinstance(value, str)}
        token_url = str(request.url.with_query(None))
        status, answer = self.require.issue_token(fields, token_url)
        if status != 200:
            self.refusals.append(str(answer.get("error", answer.get("code"))))
        return _json(status, answer)

    async def _lookup(self, request: web.Request) -> web.Response:
        self.state.lookups += 1
        if not self.state.lookups_available:
            return _json(503, {"code": "LOOKUP_UNAVAILABLE"})
        if self.state.lookup_mode == "hold":
            self.state.lookups_waiting += 1
            try:
                await self._wait_released()
            finally:
                self.state.lookups_waiting -= 1
        if self.state.lookup_mode == "lag":
            return _json(404, {"code": "NOT_FOUND"})
        key = request.match_info["key"]
        refused = self._refused(request, await request.read(), key)
        if refused is not None:
            return refused
        payout = self.state.payouts.get(key)
        asked_for = request.headers.get("x-agent-safe-intent-hash")
        if (
            payout is not None
            and payout.intent_hash is not None
            and asked_for is not None
            and asked_for != payout.intent_hash
        ):
            self.refusals.append("INTENT_HASH_MISMATCH")
            return _json(409, {"code": "INTENT_HASH_MISMATCH"})
        if payout is None or not payout.executed:
            return _json(404, {"code": "NOT_FOUND"})
        return _json(200, {"reference": payout.reference, "status": "executed"})

    def _write_record(self, entry: Mapping[str, Any]) -> None:
        """Append one line to the record file and fsync it (a blocking write, by design: the
        line is on the disk before the provider acts)."""
        if self.record is None:
            return
        line = json.dumps({"at": time.time(), **entry}, sort_keys=True) + "\n"
        fd = os.open(self.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        key = request.headers.get("idempotency-key")
        mode = self._mode_for(request, body)
        serial = len(self.state.received)
        self._write_record(
            {
                "event": "received",
                "serial": serial,
                "key": key,
                "grant_id": request.headers.get("x-agent-safe-grant-id"),
                "mode": mode,
                "body_sha256": hashlib.sha256(body).hexdigest(),
                "first": key is not None and key not in self.state.payouts,
            }
        )
        response = await self._create_answer(request, body, key, mode)
        self._write_record(
            {"event": "answered", "serial": serial, "key": key, "status": response.status}
        )
        return response

    async def _create_answer(
        self, request: web.Request, body: bytes, key: str | None, mode: str
    ) -> web.StreamResponse:
        self.state.received.append(
            ReceivedRequest(
                idempotency_key=key,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                mode=mode,
            )
        )
        if not key:
            return _json(400, {"code": "IDEMPOTENCY_KEY_MISSING"})
        refused = self._refused(request, body, None)
        if refused is not None:
            return refused
        intent = request.headers.get("x-agent-safe-intent-hash")
        earlier = self.state.payouts.get(key)
        if earlier is not None:
            if earlier.body != body:
                return _json(409, {"code": "IDEMPOTENCY_KEY_REUSED"})
            if earlier.answer is None:  # it acted and never answered; answer now, as APIs do
                return _json(202, {"reference": earlier.reference})
            status, answer = earlier.answer
            return web.Response(status=status, body=answer, content_type=_ct(answer))
        reference = "syn_" + uuid.uuid4().hex[:20]
        reflected = request.headers.get("authorization", "")
        if mode == "reflect":
            answer = json.dumps({"code": reflected}).encode()
            self.state.payouts[key] = _Payout(body, False, reference, (422, answer), intent)
            return web.Response(status=422, body=answer, content_type="application/json")
        if mode == "reflect-reference":
            reference = base64.urlsafe_b64encode(reflected.encode()).rstrip(b"=").decode()
        if mode == "refuse":
            answer = json.dumps({"code": "INSUFFICIENT_FUNDS"}).encode()
            self.state.payouts[key] = _Payout(body, False, reference, (422, answer), intent)
            return web.Response(status=422, body=answer, content_type="application/json")
        if mode == "error":
            self.state.payouts[key] = _Payout(body, False, reference, (500, None), intent)
            return web.Response(status=500)
        self.state.payouts[key] = _Payout(body, True, reference, None, intent)
        if mode == "hang":
            await self._release.wait()
            raise web.HTTPServiceUnavailable()
        if mode == "reset":
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable()
        if mode == "hold":
            self.state.held += 1
            try:
                await self._wait_released()
            finally:
                self.state.held -= 1
        answer = json.dumps({"reference": reference}).encode()
        self.state.payouts[key].answer = (202, answer)
        return web.Response(status=202, body=answer, content_type="application/json")

    def _mode_for(self, request: web.Request, body: bytes) -> str:
        mode = request.query.get("mode")
        if mode in MODES:
            return mode
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            payload = json.loads(body)
            if isinstance(payload, dict) and payload.get("synthetic_mode") in MODES:
                return str(payload["synthetic_mode"])
        return self.state.mode


def _ct(body: bytes | None) -> str | None:
    return "application/json" if body else None


def _json(status: int, payload: Any) -> web.Response:
    return web.json_response(payload, status=status)


async def _serve(
    host: str, port: int, require: CredentialRequirement | None, record: Path | None
) -> None:
    provider = SyntheticProvider(host=host, port=port, require=require, record=record)
    url = await provider.start()
    print(url, flush=True)
    print(_BANNER, file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await provider.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentsafe.executor.tools.synthetic", description=_BANNER
    )
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--require-credential",
        metavar="FILE",
        help="a JSON credential requirement (see tools/synthetic_credentials.py): refuse any "
        "payout or lookup that does not prove the executor",
    )
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="append every payout request to FILE (JSON lines, fsynced before acting on it)",
    )
    args = parser.parse_args(argv)
    if not is_loopback_host(args.host):
        parser.error("the synthetic provider binds loopback only")
    require = None
    if args.require_credential:
        try:
            with open(args.require_credential, encoding="utf-8") as handle:
                require = CredentialRequirement.from_document(json.load(handle))
        except (OSError, ValueError) as exc:
            parser.error(f"--require-credential: {exc}")
    record = Path(args.record) if args.record else None
    asyncio.run(_serve(args.host, args.port, require, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
