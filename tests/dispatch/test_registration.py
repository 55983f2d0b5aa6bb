"""Handler registration without patching: EXECUTOR_HANDLERS and the seam (in process)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.assembly import assemble
from agentsafe.executor.codes import Code
from agentsafe.executor.config import load_config
from agentsafe.executor.dispatch.registration import Seam
from agentsafe.executor.dispatch.seam import (
    Dispatch,
    ExecutionContext,
    ReconcileResult,
    ReconcileStatus,
)
from agentsafe.executor.errors import AgentSafeError, ConfigError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.tools.harness import Workspace, free_port
from agentsafe.executor.tools.synthetic import SyntheticProvider

POLICY = """
actions:
  - name: create_payout
    handler: forward_request
    parameters:
      type: object
      required: [amountMinor, currency]
      additionalProperties: false
      properties:
        amountMinor: {type: integer, minimum: 1}
        currency: {type: string}
    rules:
      - {name: all, when: "true", verdict: ALLOW}
  - name: stamp
    handler: stamp
    parameters:
      type: object
      required: [label]
      additionalProperties: false
      properties:
        label: {type: string}
    rules:
      - {name: all, when: "true", verdict: ALLOW}
"""

KEPT: list[Seam] = []
RAN: list[str] = []


class Stamp:
    parameters_schema: Mapping[str, Any] = {
        "type": "object",
        "required": ["label"],
        "additionalProperties": False,
        "properties": {"label": {"type": "string"}},
    }

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        async def effect(key: str) -> str:
            RAN.append(key)
            return key

        await dispatch.run(effect)
        digest = self.seam.effects.record(ctx, {"label": ctx.parameters["label"]})
        return {"stamped": True, "observation": digest}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        return ReconcileResult(ReconcileStatus.UNKNOWN)


def register_stamp(seam: Seam) -> list[str]:
    KEPT.append(seam)
    seam.registry.register("stamp", Stamp(seam))
    return ["stamp"]


async def register_async(seam: Seam) -> None:
    seam.registry.register("stamp", Stamp(seam))


def register_lying(seam: Seam) -> list[str]:
    seam.registry.register("stamp", Stamp(seam))
    return ["stamp", "other"]


def register_loose(seam: Seam) -> None:
    loose = Stamp(seam)
    loose.parameters_schema = {"type": "object"}
    seam.registry.register("stamp", loose)


def register_raises(seam: Seam) -> None:
    raise RuntimeError("secret-looking text that must not be echoed")


NOT_CALLABLE = 3
HERE = __name__


def _env(tmp_path: Path, provider_url: str, handlers: str | None) -> dict[str, str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    ws = Workspace(tmp_path / "ws")
    env = ws.environment(provider_url=provider_url, port=free_port(), policy_file=policy)
    if handlers is not None:
        env["EXECUTOR_HANDLERS"] = handlers
    return env


def test_the_variable_is_parsed_strictly(tmp_path: Path) -> None:
    env = _env(tmp_path, "http://127.0.0.1:9", f"{HERE}:register_stamp, bank_notes")
    assert load_config(env).executor_handlers == (f"{HERE}:register_stamp", "bank_notes")
    for bad in ("", "a:b,a:b", "mod:", "bad name", "a:b;c"):
        env["EXECUTOR_HANDLERS"] = bad
        with pytest.raises(ConfigError) as info:
            load_config(env)
        assert info.value.variable == "EXECUTOR_HANDLERS"
        assert bad not in str(info.value) or bad == ""


async def test_a_registered_action_runs_through_the_lifecycle(tmp_path: Path) -> None:
    provider = SyntheticProvider()
    url = await provider.start()
    evidence, security = MemorySink(), MemorySink()
    env = _env(tmp_path, url, f"{HERE}:register_stamp")
    executor = await assemble(env, streams=Streams(evidence=evidence, security=security))
    try:
        assert set(executor.registry.names()) == {"forward_request", "stamp"}
        assert any(e == "HANDLERS_REGISTERED" for e, _ in security.events)
        await executor.reconcile_at_start()
        await executor.listen()
        body = {
            "proposal": {"action": "stamp", "target": "doc:1", "parameters": {"label": "x"}},
            "idempotency_key": "stamp-1",
        }
        headers = {"authorization": f"Bearer {env['EXECUTOR_CALLER_TOKEN']}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{executor.port}/v1/actions", json=body, headers=headers
            ) as r,
        ):
            answer = await r.json()
        assert r.status == 200, answer
        assert answer["outcome"] == "COMPLETED", answer["reason_codes"]
        assert answer["result"]["stamped"] is True
        assert RAN.count("stamp-1") == 1
        observed = [f for e, f in evidence.events if e == "EFFECT_OBSERVED"]
        assert observed
        assert observed[0]["observation_digest"] == answer["result"]["observation"]
        # The seam's register is the attempt's: the observation reached the finalization.
        [outcome] = [f for e, f in evidence.events if e == "OUTCOME"]
        assert outcome["effect_report"]["effect_evidence"] == "OBSERVATION"
        assert outcome["effect_report"]["record_digest"] == observed[0]["record_digest"]
        # The seam a registration kept is sealed: nothing registers after start.
        with pytest.raises(AgentSafeError) as info:
            KEPT[-1].registry.register("late", Stamp(KEPT[-1]))
        assert info.value.code == Code.REGISTRY_SEALED
    finally:
        await executor.close()
        await provider.stop()


async def test_an_async_registration_function_is_awaited(tmp_path: Path) -> None:
    env = _env(tmp_path, "http://127.0.0.1:9", f"{HERE}:register_async")
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    try:
        assert "stamp" in executor.registry.names()
    finally:
        await executor.close()


@pytest.mark.parametrize(
    ("reference", "fragment"),
    [
        ("no_such_module_anywhere:register", "cannot be loaded"),
        (f"{HERE}:no_such_function", "cannot be loaded"),
        (f"{HERE}:NOT_CALLABLE", "not callable"),
        ("no-such-entry-point", "is not an entry point"),
        (f"{HERE}:register_lying", "returned names it did not register"),
        (f"{HERE}:register_loose", "refused to register (SCHEMA_NOT_STRICT)"),
        (f"{HERE}:register_raises", "raised RuntimeError"),
    ],
)
async def test_a_registration_that_fails_refuses_the_start(
    tmp_path: Path, reference: str, fragment: str
) -> None:
    env = _env(tmp_path, "http://127.0.0.1:9", reference)
    with pytest.raises(ConfigError) as info:
        await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    assert info.value.code == Code.HANDLER_REGISTRATION_FAILED
    assert info.value.variable == "EXECUTOR_HANDLERS"
    assert fragment in str(info.value)
    assert "secret-looking" not in str(info.value)


async def test_a_policy_naming_an_unregistered_handler_still_refuses(tmp_path: Path) -> None:
    env = _env(tmp_path, "http://127.0.0.1:9", None)
    with pytest.raises(AgentSafeError):
        await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))


MCP_SERVER = Path(__file__).parents[1] / "plans" / "mcp_incidents_server.py"


async def register_mcp_tool(seam: Seam) -> None:
    """A registration that binds a read-only tool of a real MCP server (stdio) for the plan
    routes, and closes its session when the executor stops."""
    import contextlib
    import sys

    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    stack = contextlib.AsyncExitStack()
    params = StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER)])
    read, write = await stack.enter_async_context(stdio_client(params))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    seam.on_close(stack.aclose)
    await seam.plans.register_mcp_read_tool(
        session, tool_name="list_incidents", tool="query", count_rows=lambda r: len(r["rows"])
    )


async def test_a_read_only_mcp_tool_is_configured_the_same_way(tmp_path: Path) -> None:
    import json

    import yaml

    from tests.plans import support as s

    document = yaml.safe_load(POLICY)
    document["plans"] = s.policy()
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(document))
    ws = Workspace(tmp_path / "ws")
    env = ws.environment(provider_url="http://127.0.0.1:9", port=free_port(), policy_file=policy)
    env["EXECUTOR_HANDLERS"] = f"{HERE}:register_stamp,{HERE}:register_mcp_tool"
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    try:
        assert executor.plans is not None
        bound = executor.plans._executors.get("query", "read")
        assert bound is not None
        assert type(bound).__name__ == "McpReadExecutor"
    finally:
        await executor.close()


class EarlySender:
    """A plugin handler that sends through ``seam.fetch`` before its ``dispatch.run`` (``early``)
    or from inside it (``inside``), to the configured downstream."""

    parameters_schema: Mapping[str, Any] = Stamp.parameters_schema

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    async def _send(self, key: str) -> int:
        response = await self.seam.fetch.request(
            "POST",
            self.seam.downstream.url,
            headers={"content-type": "application/json", "idempotency-key": key},
            body=b'{"amountMinor": 1, "currency": "USD"}',
            timeout=5.0,
        )
        return response.status

    async def execute(self, ctx: ExecutionContext, dispatch: Dispatch) -> Mapping[str, Any]:
        if ctx.parameters["label"] == "early":
            await self._send(ctx.idempotency_key)  # the provider must never see this
        status = await dispatch.run(self._send)
        return {"status": status}

    async def reconcile(self, idempotency_key: str, *, intent_hash: str) -> ReconcileResult:
        return ReconcileResult(ReconcileStatus.UNKNOWN)


def register_early_sender(seam: Seam) -> None:
    seam.registry.register("stamp", EarlySender(seam))


async def test_a_send_through_seam_fetch_before_dispatch_run_is_refused_unsent(
    tmp_path: Path,
) -> None:
    """Issue 30, item 16: before, the early send reached the provider and the attempt was still
    reported FAILED_BEFORE_DISPATCH, executed=false. Now it is refused before a byte leaves
    (SEND_BEFORE_DISPATCH), so that report is true; a send inside dispatch.run still goes."""
    provider = SyntheticProvider()
    url = await provider.start()
    env = _env(tmp_path, url, f"{HERE}:register_early_sender")
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    headers = {"authorization": f"Bearer {env['EXECUTOR_CALLER_TOKEN']}"}

    async def propose(session: aiohttp.ClientSession, label: str) -> dict[str, Any]:
        body = {
            "proposal": {"action": "stamp", "target": "doc:1", "parameters": {"label": label}},
            "idempotency_key": f"send-{label}",
        }
        async with session.post(
            f"http://127.0.0.1:{executor.port}/v1/actions", json=body, headers=headers
        ) as r:
            answer: dict[str, Any] = await r.json()
            return answer

    try:
        await executor.reconcile_at_start()
        await executor.listen()
        async with aiohttp.ClientSession() as session:
            early = await propose(session, "early")
            assert early["outcome"] == "FAILED_BEFORE_DISPATCH", early
            assert early["executed"] is False
            assert Code.SEND_BEFORE_DISPATCH in early["reason_codes"]
            assert provider.received == [], "nothing left before dispatch.run"
            inside = await propose(session, "inside")
            assert inside["outcome"] == "COMPLETED", inside
            assert len(provider.received) == 1
    finally:
        await executor.close()
        await provider.stop()
