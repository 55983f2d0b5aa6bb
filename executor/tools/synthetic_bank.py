"""A SYNTHETIC loopback core-banking provider, for the demo and the tests. It moves no money.

It speaks the reference core-banking transport's protocol (``banking/transport.py``) and can be
told to misbehave in every way the effect plane must notice:

* ``POST /payments`` takes a canonical banking action (JSON) and an ``idempotency-key``; a
  repeated key gets its first answer again. Its behaviour is the current mode
  (``POST /_control/mode`` ``{"mode": ...}``), overridden per request by a ``mode`` query
  parameter:

  =======  ====================================================================================
  mode     what it does
  =======  ====================================================================================
  post     books the action and answers ``201 {"status": "POSTED", "reference"}``
  take     records the action without booking it: ``202 {"status": "ACCEPTED", "reference"}``
  refuse   ``422 {"code": "INSUFFICIENT_FUNDS"}``; nothing is booked
  timeout  books the action and never answers (the executor's timeout ends the call)
  lie      books ten times the amount and says POSTED; the read-back shows the booked amount
  =======  ====================================================================================

* ``GET /payments/by-reference/{reference}``: the booked record (``type``, ``amountMinor`` as a
  string of digits, ``currency``, the parties, ``status``), or ``404``: the read-back.
* ``GET /payments/{idempotency_key}``: ``200 {"reference", "status"}`` for a key it acted on,
  ``404`` otherwise: the reconciliation lookup.
* With ``--receipt-key FILE`` (an Ed25519 PKCS#8 PEM) it signs an effect receipt for every
  answer (``x-agent-safe-effect-receipt``, ``provider.sign_effect_receipt``) naming the grant,
  the claim (from ``x-agent-safe-claim-attestation`` when the request carried one) and the digest
  of the effect it booked (in ``lie`` mode, the lie; ``--receipt-lie`` makes an honest booking's
  receipt state another digest).
* ``POST /_control/receipt-form`` ``{"form"}``: send receipts signed (the default) or malformed
  (:data:`RECEIPT_FORMS`).
* ``GET /_control/received``: how many requests arrived and in which modes.

Run it alone with ``python -m agentsafe.executor.tools.synthetic_bank --port N``; it binds loopback
only and prints its base URL once it is listening.

Callers: the tests (``tests/banking``) and the demo run it as its own process, through the
harness's ``ProviderProcess(module="agentsafe.executor.tools.synthetic_bank")``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..banking.actions import ACTIONS, prepare_action
from ..canonical import sha256_digest
from ..egress.transport import is_loopback_host
from ..errors import RequestRejected
from ..jws import TokenRefused, b64url_encode, split_compact
from ..provider import EFFECT_RECEIPT_TYP, sign_effect_receipt

__all__ = ["BANK_MODES", "RECEIPT_FORMS", "SyntheticBank", "main"]

BANK_MODES = ("post", "take", "refuse", "timeout", "lie")
RECEIPT_FORMS = ("signed", "none-alg", "garbage", "oversized")
"""How the receipt header is sent (``POST /_control/receipt-form``): signed (the default), or
malformed: ``alg: none`` with an empty signature, garbage, or the signed receipt with its payload
padded past 9 KB (beyond the shape the executor reads)."""
_BANNER = "agentsafe SYNTHETIC core bank: loopback only, moves no money, for demos and tests"
_KINDS = {kind.type: kind for kind in ACTIONS.values()}


@dataclass
class _Booking:
    reference: str
    record: dict[str, Any]
    booked: bool
    answer: tuple[int, dict[str, Any]] | None
    receipt: str | None


class SyntheticBank:
    """The provider (see the module docstring)."""

    def __init__(
        self,
        *,
        receipt_key: Ed25519PrivateKey | None = None,
        receipt_kid: str = "synthetic-bank-1",
        issuer: str = "synthetic-bank",
        receipt_lie: bool = False,
    ) -> None:
        self.mode = "post"
        self._bookings: dict[str, _Booking] = {}
        self._by_reference: dict[str, _Booking] = {}
        self._received: list[str] = []
        self._key = receipt_key
        self._kid = receipt_kid
        self._issuer = issuer
        self._receipt_lie = receipt_lie
        self.receipt_form = "signed"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._banner)
        app.router.add_post("/payments", self._pay)
        app.router.add_get("/payments/by-reference/{reference}", self._read_back)
        app.router.add_get("/payments/{key}", self._lookup)
        app.router.add_post("/_control/mode", self._set_mode)
        app.router.add_post("/_control/receipt-form", self._set_receipt_form)
        app.router.add_get("/_control/received", self._received_view)
        return app

    async def _banner(self, request: web.Request) -> web.Response:
        return web.json_response({"synthetic": True, "about": _BANNER})

    async def _set_mode(self, request: web.Request) -> web.Response:
        mode = (await request.json()).get("mode")
        if mode not in BANK_MODES:
            return web.json_response({"code": "MODE_UNKNOWN"}, status=400)
        self.mode = mode
        return web.json_response({"mode": mode})

    async def _set_receipt_form(self, request: web.Request) -> web.Response:
        form = (await request.json()).get("form")
        if form not in RECEIPT_FORMS:
            return web.json_response({"code": "FORM_UNKNOWN"}, status=400)
        self.receipt_form = form
        return web.json_response({"form": form})

    async def _received_view(self, request: web.Request) -> web.Response:
        return web.json_response({"count": len(self._received), "modes": self._received})

    async def _pay(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("idempotency-key")
        body = await request.read()
        mode = request.query.get("mode", self.mode)
        self._received.append(mode)
        if not key:
            return web.json_response({"code": "IDEMPOTENCY_KEY_MISSING"}, status=400)
        seen = self._bookings.get(key)
        if seen is not None:
            return self._answer(seen)
        try:
            action = json.loads(body)
            kind = _KINDS[action["type"]]
            expected = dict(prepare_action(kind, action).expected)
        except (ValueError, KeyError, TypeError, RequestRejected):
            return web.json_response({"code": "ACTION_NOT_UNDERSTOOD"}, status=422)
        reference = "bank_" + uuid.uuid4().hex[:16]
        if mode == "refuse":
            booking = _Booking(reference, {}, False, (422, {"code": "INSUFFICIENT_FUNDS"}), None)
            booking.receipt = self._receipt(request, "REFUSED", None)
            self._bookings[key] = booking
            return self._answer(booking)
        record = dict(expected)
        if mode == "lie" and "amountMinor" in record:
            record["amountMinor"] = record["amountMinor"] * 10
        booked = mode != "take"
        status, said = (202, "ACCEPTED") if mode == "take" else (201, "POSTED")
        stated = record if not self._receipt_lie else {**record, "lie": True}
        booking = _Booking(
            reference,
            record,
            booked,
            None if mode == "timeout" else (status, {"status": said, "reference": reference}),
            self._receipt(request, said, sha256_digest(stated)),
        )
        self._bookings[key] = booking
        self._by_reference[reference] = booking
        if booking.answer is None:
            await asyncio.Event().wait()  # booked, and never answers
        return self._answer(booking)

    def _answer(self, booking: _Booking) -> web.Response:
        if booking.answer is None:
            return web.Response(status=504)
        status, payload = booking.answer
        headers = {"x-agent-safe-effect-receipt": booking.receipt} if booking.receipt else {}
        return web.json_response(payload, status=status, headers=headers)

    def _receipt(self, request: web.Request, status: str, digest: str | None) -> str | None:
        if self._key is None:
            return None
        attestation: dict[str, Any] = {
            "sub": request.headers.get("x-agent-safe-grant-id", ""),
            "decision_id": request.headers.get("x-agent-safe-decision-id"),
        }
        presented = request.headers.get("x-agent-safe-claim-attestation")
        if presented:
            with contextlib.suppress(TokenRefused):
                claim = split_compact(presented).payload.get("claim_token_digest")
                attestation["claim_token_digest"] = claim
        signed = sign_effect_receipt(
            attestation=attestation,
            status="EFFECTED" if status == "POSTED" else status,
            key=self._key,
            kid=self._kid,
            issuer=self._issuer,
            effect_digest=digest,
        )
        header, payload, signature = signed.split(".")
        if self.receipt_form == "none-alg":
            none = b64url_encode(json.dumps({"alg": "none", "typ": EFFECT_RECEIPT_TYP}).encode())
            return f"{none}.{payload}."
        if self.receipt_form == "garbage":
            return "not a receipt at all"
        if self.receipt_form == "oversized":
            return f"{header}.{payload}{'A' * 9216}.{signature}"
        return signed

    async def _read_back(self, request: web.Request) -> web.Response:
        booking = self._by_reference.get(request.match_info["reference"])
        if booking is None or not booking.booked:
            return web.json_response({"code": "NOT_FOUND"}, status=404)
        record = dict(booking.record)
        if "amountMinor" in record:
            record["amountMinor"] = str(record["amountMinor"])
        record.pop("exponent", None)
        return web.json_response({**record, "status": "POSTED", "reference": booking.reference})

    async def _lookup(self, request: web.Request) -> web.Response:
        booking = self._bookings.get(request.match_info["key"])
        if booking is None or (booking.answer is not None and booking.answer[0] >= 400):
            return web.json_response({"code": "NOT_FOUND"}, status=404)
        return web.json_response(
            {"reference": booking.reference, "status": "POSTED" if booking.booked else "ACCEPTED"}
        )


def _load_key(path: str | None) -> Ed25519PrivateKey | None:
    if path is None:
        return None
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SystemExit("--receipt-key must be an Ed25519 PKCS#8 PEM key")
    return key


async def _serve(args: argparse.Namespace) -> None:
    bank = SyntheticBank(
        receipt_key=_load_key(args.receipt_key),
        receipt_kid=args.receipt_kid,
        issuer=args.issuer,
        receipt_lie=args.receipt_lie,
    )
    bank.mode = args.mode
    runner = web.AppRunner(bank.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    print(f"http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentsafe.executor.tools.synthetic_bank", description=_BANNER
    )
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address (the default)")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--mode", choices=BANK_MODES, default="post", help="the initial mode")
    parser.add_argument("--receipt-key", help="Ed25519 PKCS#8 PEM: sign effect receipts")
    parser.add_argument("--receipt-kid", default="synthetic-bank-1", help="the receipt key id")
    parser.add_argument("--issuer", default="synthetic-bank", help="the receipts' iss")
    parser.add_argument(
        "--receipt-lie", action="store_true", help="receipts state a digest it did not book"
    )
    args = parser.parse_args(argv)
    if not is_loopback_host(args.host):
        print("the synthetic core bank binds loopback only", file=sys.stderr)
        return 2
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
