"""``agentsafe mcp``: every action the caller may propose, as an MCP tool.

An MCP client (an agent runtime) lists the tools and calls one; the bridge turns the call into a
proposal to a running executor through ``agentsafe.client``, so every call goes through the full
lifecycle there: the door authenticates the caller's principal exactly as on every other route,
the policy decides, and on ALLOW the handler runs once under a single-use grant. The bridge
holds no credential for any downstream and decides nothing.

* The tools come from ``GET /v1/actions`` (what this principal may propose): the tool's input is
  ``{"target", "parameters", "idempotency_key"?}`` with the action's strict parameter schema, and
  its annotations say ``readOnlyHint: false`` and ``destructiveHint`` as the handler declares
  (true unless it only adds), ``openWorldHint: true``.
* The result is text a model can read plus the executor's answer as ``structuredContent``. A
  BLOCK, an ESCALATE (with the escalation object) and a completed action are ordinary results; a
  refusal (``AUTH_FAILED``, ``ACTION_NOT_PERMITTED_FOR_PRINCIPAL``...) or an unavailable executor
  is a result with ``isError: true`` naming the code. An outcome unknown after dispatch is
  reconciled once, read-only, with the recovery object the answer carried.
* A call of a tool outside the caller's catalog (``GET /v1/actions``, kept per caller for
  :data:`CATALOG_SECONDS` and read again before a name is refused) is answered by the bridge
  itself with the JSON-RPC error ``-32602`` (the MCP specification's answer to an unknown tool)
  and never sent as a proposal: a model guessing tool names would otherwise spend its
  principal's door refusals and lock it out (``423 PRINCIPAL_LOCKED``).
* Parameters outside the tool's input schema: the executor answers BLOCK ``PARAMETERS_INVALID``
  and, by design, names no value. The bridge then checks the same parameters against the same
  schema (``GET /v1/actions``, :func:`~..policy.policy.build_validator`) and answers a result with
  ``isError: true`` whose text and ``structuredContent.invalid_parameters`` name each failing
  field by JSON pointer (``/parameters/amountMinor``) and keyword (``type``, ``required``,
  ``additionalProperties``), never its value, so a model can correct its own call (MCP
  2025-11-25, tool execution errors).
* One more tool, :data:`RESUME_TOOL` (``agentsafe_resume_escalation``, input ``{"escalation"}``):
  with ``EXECUTOR_ESCALATION=APPROVAL`` an ESCALATE result carries the escalation object (in
  ``structuredContent.escalation`` and in its text) and its ``approval_url``; once an APPROVER
  decided there, calling this tool with that object presents it back (``POST /v1/escalations``,
  ``agentsafe.client``'s ``resume``): still pending, refused (BLOCK), or executed once; calling
  it again replays the same answer. The name is reserved: an action of that name is not listed.

Transports: ``stdio`` (the agent runtime starts ``agentsafe mcp`` as its child; the agent's own
executor token comes from ``--token-file``, ``AGENTSAFE_AGENT_TOKEN_FILE`` or
``AGENTSAFE_AGENT_TOKEN``), and ``http`` (MCP streamable HTTP on ``--host``/``--port`` at
``/mcp``; every request must carry ``Authorization: Bearer <the agent's executor token>``, which
is passed to the executor for its door, never kept; a request without one is 401
``AUTH_FAILED`` before MCP sees it, and so is one whose bearer the executor's door refuses (the
bridge asks ``GET /v1/actions`` with it first): 401 with ``WWW-Authenticate: Bearer
realm="agentsafe", error="invalid_token"``, so ``initialize`` never succeeds with a wrong bearer,
as the MCP HTTP transport's authorization says).

Output: JSON lines on standard error, as every other agentsafe process writes them (standard
output is the stdio transport's): with ``http``, one ``MCP_LISTENING`` line (``agent-safe.log/1``:
the endpoint and the executor it proposes to); a refusal to start (no executor URL, no ``mcp``
package, an invalid ``OTEL_*`` setting) is one ``REFUSED_TO_START`` line, level ERROR, exit 2.

Needs the ``mcp`` package (the ``plans`` extra). Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from agentsafe.client import (
    ActionInfo,
    AgentSafeClient,
    Decision,
    Outcome,
    Refused,
    Unavailable,
    Verdict,
)

from .. import telemetry
from ..codes import Code
from ..errors import AgentSafeError
from ..events import LOG_SCHEMA, SECURITY_SCHEMA, JsonLinesSink
from ..routes.refusals import challenge

__all__ = ["RESUME_TOOL", "add_parser", "build_server", "tool_input_schema"]

TOKEN_VARIABLE = "AGENTSAFE_AGENT_TOKEN"
RESUME_TOOL = "agentsafe_resume_escalation"
RESUME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["escalation"],
    "properties": {
        "escalation": {
            "type": "object",
            "description": "the escalation object an ESCALATE result carried, unchanged",
        }
    },
}
ClientFor = Callable[[Any], AgentSafeClient]
UNKNOWN_TOOL_MESSAGE = "unknown tool: not one of this caller's tools (tools/list)"
"""The JSON-RPC ``-32602`` message for a tool outside the caller's catalog (no name echoed)."""
CATALOG_SECONDS = 30.0
"""How long a caller's catalog answers a known tool name without being read again."""
CATALOG_CALLERS_MAX = 1024
"""At most this many callers' catalogs are kept (streamable HTTP serves many bearers)."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "mcp",
        help="serve every action the caller may propose as an MCP tool (stdio or HTTP)",
        description="An MCP server whose tools are the actions this caller may propose on a "
        "running executor. Calling a tool is a proposal through the executor's full lifecycle; "
        "BLOCK and ESCALATE come back as results the model reads. stdio: the agent's token from "
        "--token-file, AGENTSAFE_AGENT_TOKEN_FILE or AGENTSAFE_AGENT_TOKEN. http: each request "
        "carries Authorization: Bearer <the agent's token>, passed to the executor's door.",
    )
    parser.add_argument("--url", default=os.environ.get("AGENTSAFE_EXECUTOR_URL"))
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    parser.add_argument("--port", type=int, default=8765, help="http: the port to listen on")
    parser.add_argument("--token-file", default=os.environ.get(TOKEN_VARIABLE + "_FILE"))
    parser.add_argument("--ca-file", default=os.environ.get("AGENTSAFE_CA_FILE"))
    parser.set_defaults(run=run)


def tool_input_schema(action: ActionInfo) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["target", "parameters"],
        "properties": {
            "target": {
                "type": "string",
                "minLength": 1,
                "maxLength": 512,
                "description": "what the action is about, e.g. payout:beneficiary-1",
            },
            "parameters": dict(action.parameters),
            "idempotency_key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 255,
                "pattern": "^[A-Za-z0-9][A-Za-z0-9._~:=+-]*$",
                "description": "optional: reuse it to retry the same proposal safely",
            },
        },
    }


def _description(action: ActionInfo) -> str:
    lead = action.description or f"Propose the action {action.name}."
    return (
        f"{lead} The bank's policy decides: ALLOW runs it once, BLOCK refuses it, ESCALATE "
        "holds it for a person. You never hold the credential; the boundary does."
    )


def _text(decision: Decision) -> str:
    reasons = ", ".join(decision.reason_codes) or "none"
    if decision.outcome == Outcome.COMPLETED:
        result = json.dumps(dict(decision.result or {}), sort_keys=True)
        return f"ALLOW: executed once. Result: {result}."
    if decision.verdict == Verdict.BLOCK:
        return f"BLOCK: refused by policy ({reasons}). Nothing was executed."
    if decision.verdict == Verdict.ESCALATE:
        escalation = dict(decision.escalation or {})
        request = escalation.get("request_id")
        held = f" (approval request {request})" if request else ""
        text = f"ESCALATE: held for a person's decision{held}. Nothing was executed yet."
        if "token" in escalation:
            text += (
                f" A person decides at {escalation.get('approval_url')}; then call {RESUME_TOOL} "
                f"with this escalation object: {json.dumps(escalation, sort_keys=True)}"
            )
        return text
    if decision.mode == "SHADOW":
        return f"SHADOW: the policy would say {decision.verdict}; nothing was executed."
    executed = {True: "it executed", False: "it did not execute", None: "unknown"}
    return f"{decision.verdict}: {decision.outcome}; {executed[decision.executed]} ({reasons})."


DOOR_CHECK_SECONDS = 10.0
"""How long the HTTP transport waits for the door's word on a bearer before passing it on."""
MAX_NAMED_FIELDS = 16
"""At most this many failing fields are named in one answer."""


def _pointer(parts: Any) -> str:
    """An RFC 6901 JSON pointer under ``/parameters`` (each segment escaped, at most 64
    characters: a segment is a field's name, never a value)."""
    escaped = (str(p)[:64].replace("~", "~0").replace("/", "~1") for p in parts)
    return "/parameters" + "".join("/" + segment for segment in escaped)


def invalid_fields(
    schema: Mapping[str, Any], parameters: Mapping[str, Any]
) -> list[dict[str, str]]:
    """Where ``parameters`` fail ``schema`` (the action's parameter schema, validated as the
    executor validates it): one ``{"pointer", "keyword"}`` per failing field, the missing and the
    unexpected ones named by their own pointer; never a value. Empty when nothing can be said."""
    from jsonschema.exceptions import ValidationError as SchemaViolation

    from ..errors import AgentSafeError
    from ..policy.policy import build_validator

    try:
        validator = build_validator(schema, path="parameters")
        errors: list[SchemaViolation] = list(validator.iter_errors(dict(parameters)))
    except (AgentSafeError, RecursionError, ValueError, TypeError):
        return []
    named: dict[str, str] = {}
    for error in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path]):
        where = list(error.absolute_path)
        keyword = str(error.validator)
        instance, wanted = error.instance, error.validator_value
        if keyword == "required" and isinstance(instance, dict) and isinstance(wanted, list):
            for name in wanted:
                if name not in instance:
                    named.setdefault(_pointer([*where, name]), keyword)
        elif keyword in ("additionalProperties", "unevaluatedProperties") and isinstance(
            instance, dict
        ):
            known = set(
                (error.schema.get("properties") or {}) if isinstance(error.schema, dict) else ()
            )
            for name in sorted(k for k in instance if k not in known):
                named.setdefault(_pointer([*where, name]), keyword)
        else:
            named.setdefault(_pointer(where), keyword)
    return [{"pointer": p, "keyword": k} for p, k in sorted(named.items())[:MAX_NAMED_FIELDS]]


def _invalid_text(fields: list[dict[str, str]]) -> str:
    where = "; ".join(f"{f['pointer']} ({f['keyword']})" for f in fields)
    return (
        f"{Code.PARAMETERS_INVALID}: the arguments do not satisfy the tool's input schema"
        f"{': ' + where if where else ''}. Nothing was executed; correct them and call again."
    )


def build_server(client_for: ClientFor, caller_of: Callable[[Any], str] = lambda ctx: "") -> Any:
    """The MCP server; ``client_for(ctx)`` is the executor client for one request's caller, and
    ``caller_of(ctx)`` names that caller for the catalog cache (a digest, never a token)."""
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.shared.exceptions import MCPError
    from mcp_types import INVALID_PARAMS

    from .. import __version__

    catalogs: dict[str, tuple[float, frozenset[str]]] = {}

    def remember(ctx: Any, actions: list[ActionInfo]) -> frozenset[str]:
        if len(catalogs) >= CATALOG_CALLERS_MAX:
            catalogs.clear()
        names = frozenset(action.name for action in actions)
        catalogs[caller_of(ctx)] = (time.monotonic(), names)
        return names

    async def list_tools(ctx: Any, params: Any) -> Any:
        async with client_for(ctx) as client:
            actions = await client.actions()
        remember(ctx, actions)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=action.name,
                    description=_description(action),
                    input_schema=tool_input_schema(action),
                    annotations=types.ToolAnnotations(
                        title=action.name,
                        read_only_hint=False,
                        destructive_hint=action.destructive,
                        idempotent_hint=False,
                        open_world_hint=True,
                    ),
                )
                for action in actions
                if action.name != RESUME_TOOL
            ]
            + [
                types.Tool(
                    name=RESUME_TOOL,
                    description="Present an escalation object back once a person decided at its "
                    "approval_url: it answers still pending, BLOCK (denied, expired, cancelled) or "
                    "ALLOW executed once. Calling it again answers the same; nothing runs twice.",
                    input_schema=RESUME_SCHEMA,
                    annotations=types.ToolAnnotations(
                        title=RESUME_TOOL,
                        read_only_hint=False,
                        destructive_hint=True,
                        idempotent_hint=True,
                        open_world_hint=True,
                    ),
                )
            ]
        )

    def result(text: str, *, error: bool, structured: Any = None) -> Any:
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content=structured,
            is_error=error,
        )

    async def call_tool(ctx: Any, params: Any) -> Any:
        # one span per tool call, child of the MCP client's trace context (params._meta's
        # traceparent/tracestate) when it sent one; the client's request spans are its children
        with telemetry.span(
            "tools/call",
            {"agentsafe.action": str(params.name)},
            kind=telemetry.SpanKind.SERVER,
            context=telemetry.extract(_trace_context(params)),
        ):
            return await _call_tool(ctx, params)

    async def _call_tool(ctx: Any, params: Any) -> Any:
        arguments = params.arguments or {}
        if params.name == RESUME_TOOL:
            escalation = arguments.get("escalation")
            if not isinstance(escalation, dict):
                return result(
                    f"{Code.REQUEST_INVALID}: give escalation (the object an ESCALATE carried)",
                    error=True,
                )
            return await answer(ctx, lambda client: client.resume(escalation))
        refused = await unknown_tool(ctx, params.name)
        if refused is not None:
            return refused
        target, parameters = arguments.get("target"), arguments.get("parameters")
        if not isinstance(target, str) or not isinstance(parameters, dict):
            return result(
                f"{Code.REQUEST_INVALID}: give target (a string) and parameters (an object)",
                error=True,
            )
        key = arguments.get("idempotency_key")
        return await answer(
            ctx,
            lambda client: client.propose(
                params.name,
                target,
                parameters,
                idempotency_key=key if isinstance(key, str) else None,
            ),
            checked=(params.name, parameters),
        )

    def refused_result(refused: Refused) -> Any:
        return result(
            f"refused by the boundary: {refused.code} ({refused.status}): {refused.message}",
            error=True,
        )

    async def unknown_tool(ctx: Any, name: str) -> Any:
        """``None`` when ``name`` is in this caller's catalog (``GET /v1/actions``). A tool
        outside it is answered here with JSON-RPC ``-32602`` (the MCP specification's answer
        to an unknown tool) and never proposed: each such proposal would be a refusal the
        door counts towards the principal's lockout, so a model that guesses tool names
        would lock its own principal out. The name is not echoed. A catalog read within
        :data:`CATALOG_SECONDS` answers a known name; any other name reads it again first, so
        an action granted a moment ago is found."""
        cached = catalogs.get(caller_of(ctx))
        fresh = cached is not None and time.monotonic() - cached[0] < CATALOG_SECONDS
        if fresh and cached is not None and name in cached[1]:
            return None
        try:
            async with client_for(ctx) as client:
                names = remember(ctx, await client.actions())
        except Refused as refused:
            return refused_result(refused)
        except Unavailable as unavailable:
            return result(
                f"the boundary is unavailable ({unavailable}); nothing was proposed", error=True
            )
        if name not in names:
            raise MCPError(INVALID_PARAMS, UNKNOWN_TOOL_MESSAGE)
        return None

    async def answer(
        ctx: Any,
        call: Callable[[AgentSafeClient], Awaitable[Decision]],
        *,
        checked: tuple[str, Mapping[str, Any]] | None = None,
    ) -> Any:
        fields: list[dict[str, str]] | None = None
        try:
            async with client_for(ctx) as client:
                decision = await call(client)
                if decision.needs_reconciliation and decision.recovery is not None:
                    decision = await client.reconcile(decision.recovery)
                if checked is not None and Code.PARAMETERS_INVALID in decision.reason_codes:
                    name, parameters = checked
                    schemas = {a.name: a.parameters for a in await client.actions()}
                    fields = invalid_fields(schemas.get(name, {}), parameters)
        except Refused as refused:
            return refused_result(refused)
        except Unavailable as unavailable:
            return result(
                f"the boundary is unavailable ({unavailable}); nothing new was executed; retry "
                f"later with idempotency_key {unavailable.idempotency_key}",
                error=True,
            )
        if fields is not None:  # the model's own mistake, which it can correct
            structured = {**decision.raw, "invalid_parameters": fields}
            return result(_invalid_text(fields), error=True, structured=structured)
        return result(_text(decision), error=False, structured=dict(decision.raw))

    return Server(
        "agentsafe",
        version=__version__,
        instructions="Each tool is an action proposed to agentsafe, the execution boundary: "
        "the bank's policy decides whether it runs. Read BLOCK and ESCALATE results; do not "
        "work around them.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        return Path(args.token_file).read_text(encoding="utf-8").strip()
    token = os.environ.get(TOKEN_VARIABLE)
    if not token:
        raise SystemExit(
            f"agentsafe mcp: no credential: pass --token-file or set {TOKEN_VARIABLE}(_FILE)"
        )
    return token


async def _stdio(args: argparse.Namespace) -> None:
    from mcp.server.stdio import stdio_server

    token = _token(args)

    def client_for(ctx: Any) -> AgentSafeClient:
        return AgentSafeClient(args.url, token=token, ca_file=args.ca_file)

    server = build_server(client_for)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def _bearer(ctx: Any) -> str | None:
    request = getattr(ctx, "request", None)
    header = request.headers.get("authorization", "") if request is not None else ""
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def _http(args: argparse.Namespace) -> None:
    import uvicorn
    from starlette.responses import JSONResponse
    from starlette.types import ASGIApp, Receive, Scope, Send

    def client_for(ctx: Any) -> AgentSafeClient:
        token = _bearer(ctx)
        if token is None:  # the middleware below refuses such a request first
            raise Refused(401, Code.AUTH_FAILED, "no bearer credential")
        return AgentSafeClient(args.url, token=token, ca_file=args.ca_file)

    def caller_of(ctx: Any) -> str:
        return hashlib.sha256((_bearer(ctx) or "").encode()).hexdigest()

    server = build_server(client_for, caller_of)
    app = server.streamable_http_app(
        streamable_http_path="/mcp", json_response=True, stateless_http=True, host=args.host
    )

    async def door_refuses(token: str) -> bool:
        """Whether the executor's door refuses ``token`` (401): asked before MCP sees the
        request. Any other answer, or none, is left to the call itself to report."""
        try:
            async with (
                asyncio.timeout(DOOR_CHECK_SECONDS),
                AgentSafeClient(args.url, token=token, ca_file=args.ca_file) as client,
            ):
                await client.actions()
        except Refused as refused:
            return refused.status == 401
        except Exception:  # unavailable: the tool call says so, with isError
            return False
        return False

    def require_bearer(inner: ASGIApp) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                }
                scheme, _, value = headers.get("authorization", "").partition(" ")
                presented = scheme.lower() == "bearer" and bool(value.strip())
                if not presented or await door_refuses(value.strip()):
                    message = (
                        "the executor refused this bearer credential"
                        if presented
                        else "send Authorization: Bearer <the agent's executor token>"
                    )
                    body = {"error": {"code": Code.AUTH_FAILED, "message": message}}
                    # RFC 6750 §3: error="invalid_token" once a credential was presented.
                    code = Code.AUTH_FAILED if presented else Code.AUTH_REQUIRED
                    await JSONResponse(
                        body, status_code=401, headers={"WWW-Authenticate": challenge(code)}
                    )(scope, receive, send)
                    return
            await inner(scope, receive, send)

        return guarded

    config = uvicorn.Config(
        require_bearer(app), host=args.host, port=args.port, log_level="warning", lifespan="on"
    )
    JsonLinesSink(sys.stderr, schema=LOG_SCHEMA).emit(
        "MCP_LISTENING",
        {
            "level": "INFO",
            "message": f"agentsafe mcp: MCP over streamable HTTP at {_endpoint(args)}",
            "url": _endpoint(args),
            "executor": args.url,
        },
    )
    await uvicorn.Server(config).serve()


def _endpoint(args: argparse.Namespace) -> str:
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"http://{host}:{args.port}/mcp"


def _refused(message: str, code: str | None = None) -> int:
    """A start-up refusal: one JSON line on stderr, as ``serve`` and ``proxy`` write theirs
    (``REFUSED_TO_START``, level ERROR; ``code`` when a setting is wrong); exit status 2."""
    fields: dict[str, Any] = {"level": "ERROR", "message": f"agentsafe mcp: {message}"}
    JsonLinesSink(sys.stderr, schema=SECURITY_SCHEMA).emit(
        Code.REFUSED_TO_START, fields if code is None else {**fields, "code": code}
    )
    return 2


def _trace_context(params: Any) -> dict[str, str]:
    """``traceparent``/``tracestate`` from a request's ``_meta`` (the MCP convention), if any."""
    meta = getattr(params, "meta", None)
    if meta is None:
        return {}
    values = meta if isinstance(meta, Mapping) else (getattr(meta, "model_extra", None) or {})
    return {k: v for k in ("traceparent", "tracestate") if isinstance(v := values.get(k), str)}


def run(args: argparse.Namespace) -> int:
    try:
        # OTEL_*: off by default; on, the bridge's spans and agentsafe.client's are exported
        if telemetry.configure(os.environ, default_service_name="agentsafe-mcp"):
            telemetry.install_global()
    except AgentSafeError as exc:
        return _refused(f"{exc.code}: {exc}", exc.code)
    try:
        return _run(args)
    finally:
        telemetry.shutdown()


def _run(args: argparse.Namespace) -> int:
    if not args.url:
        return _refused("no executor: pass --url or set AGENTSAFE_EXECUTOR_URL")
    try:
        import mcp  # noqa: F401 - the plans extra
    except ImportError:
        return _refused("needs the mcp package: pip install 'agentsafe[plans]'")
    try:
        asyncio.run(_stdio(args) if args.transport == "stdio" else _http(args))
    except KeyboardInterrupt:
        return 0
    return 0
