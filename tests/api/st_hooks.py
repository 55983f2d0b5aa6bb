"""schemathesis hooks for ``make api-test``: who calls each route, and the refusal contract.

Loaded by the ``st`` process through ``SCHEMATHESIS_HOOKS=st_hooks`` with this directory (never the
repository root) on ``PYTHONPATH``; ``tests/api/test_schemathesis.py`` starts it.

- :class:`RoleAuth` authenticates each operation as a principal of the role its
  ``x-agentsafe-role`` names, one holding the scope its ``x-agentsafe-scope`` names (tokens from
  ``AGENTSAFE_API_TOKENS``, a JSON file of role, or ``"ROLE scope"``, -> token).
- :func:`flatmap_case` replaces the body of one positive case in four (every positive case of the
  stateful phase), for the operations ``AGENTSAFE_API_SEEDS`` (a JSON file of ``"METHOD /path"``
  -> bodies) names, with one of those valid bodies: chains start where random data never would
  (a proposal the policy escalates, a plan whose digests hold), and the stateful phase follows
  the links from their answers, which put the live values (a request id, an escalation, a dry
  run, an approval, a receipt) into the next call.
- :func:`refusal_contract` is the custom check: every answer carries the four security headers
  and ``Cache-Control: no-store``; every refusal is exactly ``{"error": {"code", "message"}}``
  (the plan routes may add the ``receipt`` of a step that ran), with an UPPER_SNAKE code whose
  registry status is the answer's status, ``Retry-After`` on 429 and on a 503 refusal, and a
  message that echoes nothing the request carried (no string of 6 or more characters from the
  body, query, path or credential that the OpenAPI document does not spell itself). A 503 that
  is not a refusal is the fail-closed verdict (``verdict`` BLOCK, ``executed`` false) or a
  readiness answer.
- :func:`valid_is_read` is the other custom check (issue 31): a request the document calls valid
  (a positive case) on a route whose body the document states in full (``/v1/actions``,
  ``/v1/reconciliations``, ``/v1/escalations``, ``/v1/escalations/cancel``, the plan routes) is
  never refused with REQUEST_INVALID, the code for "the request does not match the route's
  schema": the bounds and shapes the server checks are in the document.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from functools import cache
from typing import Any

import schemathesis
from hypothesis import strategies as st
from schemathesis.generation.meta import TestPhase

from agentsafe.executor.clock import format_ms
from agentsafe.executor.codes import Code
from agentsafe.executor.routes.refusals import code_for_http_error, status_of

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}
_CODE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ECHO_MIN = 6


def _tokens() -> dict[str, str]:
    with open(os.environ["AGENTSAFE_API_TOKENS"], encoding="utf-8") as handle:
        tokens: dict[str, str] = json.load(handle)
    return tokens


def _document() -> str:
    with open(os.environ["AGENTSAFE_API_SPEC"], encoding="utf-8") as handle:
        return handle.read()


@cache
def _seeds() -> dict[str, list[Any]]:
    path = os.environ.get("AGENTSAFE_API_SEEDS")
    if not path:
        return {}
    with open(path, encoding="utf-8") as handle:
        seeds: dict[str, list[Any]] = json.load(handle)
    return seeds


@schemathesis.auth(refresh_interval=None)
class RoleAuth:
    def get(self, case: Any, ctx: Any) -> dict[str, str]:
        return _tokens()

    def set(self, case: Any, data: dict[str, str], ctx: Any) -> None:
        raw = case.operation.definition.raw
        role = raw.get("x-agentsafe-role", "anyone")
        scoped = f"{role} {raw.get('x-agentsafe-scope')}"
        token = data.get(scoped, data.get(role))
        if token is not None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}


_FRESH = itertools.count(1)


def _seeded(case: Any, body: Any) -> Any:
    """``case`` with a copy of the valid ``body``, made fresh where the server wants it fresh:
    a new idempotency key (a new proposal), an approval issued now (within the clock skew), a
    new execution id (a step runs once per approval)."""
    body = copy.deepcopy(body)
    label = case.operation.label
    if label == "POST /v1/actions":
        body["idempotency_key"] = f"chain-{next(_FRESH)}"
    elif label == "POST /v1/plans/approvals":
        now = time.time()
        body["request"]["issuedAt"] = format_ms(now - 1)
        body["request"]["expiresAt"] = format_ms(now + 1200)
    elif label == "POST /v1/plans/steps":
        body["executionId"] = f"exec-{next(_FRESH)}"
    case.body = body
    return case


@schemathesis.hook
def flatmap_case(ctx: Any, case: Any) -> Any:
    """One positive case in four, or every one in the stateful phase (whose chains are the point;
    the other phases fuzz these operations), gets a seeded body."""
    seeds = _seeds().get(ctx.operation.label) if ctx.operation is not None else None
    meta = case.meta
    if not seeds or meta is None or not meta.generation.mode.is_positive:
        return st.just(case)
    seeded = st.sampled_from(seeds).map(lambda body: _seeded(case, body))
    if meta.phase.name is TestPhase.STATEFUL:
        return seeded
    return st.integers(0, 3).flatmap(lambda n: seeded if n == 0 else st.just(case))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _header(headers: dict[str, list[str]], name: str) -> str | None:
    for key, values in headers.items():
        if key.lower() == name:
            return values[0] if values else ""
    return None


def _sent(case: Any) -> set[str]:
    sent: set[str] = set()
    for part in (case.body, case.query, case.path_parameters):
        if part is not None and not isinstance(part, (bytes, bytearray)):
            sent.update(s for s in _strings(part) if len(s) >= _ECHO_MIN)
    for value in (case.headers or {}).values():
        if isinstance(value, str) and len(value) >= _ECHO_MIN:
            sent.add(value)
            sent.update(p for p in value.split() if len(p) >= _ECHO_MIN)
    return sent


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def _own_words(code: str, case: Any) -> set[str]:
    """Words a message may spell whatever was sent: the code, anything the OpenAPI document
    spells (field names, enum values, patterns), and the field names of the valid bodies of the
    operation (the plan routes' shapes are the plan library's, which the document does not
    spell: ``issuedAt is too far from now`` names a field, it echoes no value)."""
    label = getattr(case.operation, "label", None)
    return {code, _document(), *_keys(_seeds().get(label, []) if label else [])}


def _page(case: Any) -> bool:
    return str(case.path).startswith("/approve/")


@schemathesis.check
def refusal_contract(ctx: Any, response: Any, case: Any) -> bool | None:
    headers = response.headers
    for name, value in SECURITY_HEADERS.items():
        got = _header(headers, name)
        if name == "content-security-policy" and got is not None and _page(case):
            # The approval page's own policy (nonces for its script and style) keeps both.
            directives = {d.strip() for d in got.split(";")}
            if {"default-src 'none'", "frame-ancestors 'none'"} <= directives:
                continue
        if got != value:
            raise AssertionError(f"the answer lacks {name}: {value} (has {got!r})")
    status = response.status_code
    if status < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"a {status} answer is not JSON") from None
    if not isinstance(body, dict):
        raise AssertionError(f"a {status} answer is not a JSON object")
    if status == 503 and "error" not in body:
        if "verdict" in body:
            if (body["verdict"], body["executed"], body["fail_closed"]) != ("BLOCK", False, True):
                raise AssertionError("a 503 verdict that is not a fail-closed BLOCK")
            return None
        if "ready" in body and body["ready"] is False:
            return None
        raise AssertionError("a 503 that is neither a refusal, a BLOCK nor a readiness answer")
    extra = set(body) - {"error", "receipt"}
    if "error" not in body or extra:
        raise AssertionError(f"a {status} refusal is not {{'error': {{code, message}}}}")
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"code", "message"}:
        raise AssertionError("a refusal's error is not exactly {code, message}")
    code, message = error["code"], error["message"]
    if not isinstance(code, str) or not _CODE.match(code):
        raise AssertionError("a refusal's code is not a stable UPPER_SNAKE code")
    if not isinstance(message, str) or not message.strip():
        raise AssertionError(f"{code}: the message is empty")
    if "receipt" in body and not case.path.startswith("/v1/plans/"):
        raise AssertionError(f"{code}: only a plan step's refusal carries a receipt")
    expected = status_of(code)
    if code == Code.REQUEST_REFUSED or code_for_http_error(status) == code:
        expected = status  # aiohttp's own refusal keeps aiohttp's status
    if status != expected:
        raise AssertionError(f"{code} answered {status}; the registry says {expected}")
    if status == 429 or code == Code.STORE_UNAVAILABLE:
        retry = _header(headers, "retry-after")
        if retry is None or not retry.isdigit():
            raise AssertionError(f"{code} without a Retry-After of whole seconds")
    own = _own_words(code, case)
    for sent in _sent(case):
        if sent in message and not any(sent in word for word in own):
            raise AssertionError(f"{code}: the message echoes what the request sent")
    return None


SCHEMA_STATED = re.compile(r"^/v1/(actions|reconciliations|escalations(/cancel)?|plans/.+)$")
"""The routes whose every REQUEST_INVALID the document states (``routes/schemas.py``)."""


@schemathesis.check
def valid_is_read(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code != 400 or not SCHEMA_STATED.match(str(case.operation.path)):
        return None
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return None  # refusal_contract says what is wrong with the shape
    if isinstance(error, dict) and error.get("code") == Code.REQUEST_INVALID:
        message = error.get("message")
        raise AssertionError(f"a body the document calls valid was refused: {message!r}")
    return None
