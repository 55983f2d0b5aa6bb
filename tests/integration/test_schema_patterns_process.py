"""A parameter pattern is ECMA-262 in a real ``agentsafe serve`` (issue 16, item 4).

The attack: under Python's ``re.search``, ``^[A-Z]{3}$`` accepted ``"RUB\\n"``, which then missed
the CEL rule ``params.currency == "RUB"`` -> BLOCK, was ALLOWed, and reached the provider as
``"RUB\\n"``. Here the same policy runs in a real process against the synthetic provider: the
value is refused before the authority, and the provider receives nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port

pytestmark = pytest.mark.slow

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
        currency: {type: string, pattern: "^[A-Z]{3}$"}
        reference: {type: string, pattern: "^\\\\d{1,8}$"}
    rules:
      - name: sanctioned
        when: 'params.currency == "RUB"'
        verdict: BLOCK
        reasonCode: CURRENCY_SANCTIONED
      - name: small
        when: "params.amountMinor <= 5000"
        verdict: ALLOW
"""


async def _propose(
    session: aiohttp.ClientSession, executor: ExecutorProcess, key: str, params: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    body = {
        "proposal": {"action": "create_payout", "target": "payout:b-1", "parameters": params},
        "idempotency_key": key,
    }
    headers = {"authorization": f"Bearer {executor.token}"}
    async with session.post(executor.url + "/v1/actions", json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_a_trailing_newline_or_a_foreign_digit_never_passes_a_pattern(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(provider_url=provider.url, port=free_port(), policy_file=policy)
    executor = ExecutorProcess(env, tmp_path)
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            status, body = await _propose(
                session, executor, "rub", {"amountMinor": 100, "currency": "RUB"}
            )
            assert (status, body["verdict"], body["reason_codes"]) == (
                200,
                "BLOCK",
                ["CURRENCY_SANCTIONED"],
            ), body
            for key, params in (
                ("rub-newline", {"amountMinor": 100, "currency": "RUB\n"}),
                ("arabic-digits", {"amountMinor": 100, "currency": "CHF", "reference": "١٢٣"}),
                ("digits-newline", {"amountMinor": 100, "currency": "CHF", "reference": "123\n"}),
            ):
                status, body = await _propose(session, executor, key, params)
                assert (status, body["verdict"]) == (200, "BLOCK"), (key, body)
                assert body["reason_codes"] == ["PARAMETERS_INVALID"], (key, body)
                assert body["executed"] is False
                assert "RUB\n" not in str(body)  # never echoed
                assert "١٢٣" not in str(body)
            status, body = await _propose(
                session,
                executor,
                "ok",
                {"amountMinor": 100, "currency": "CHF", "reference": "123"},
            )
            assert (status, body["outcome"]) == (200, "COMPLETED"), body
        assert (await provider.received())["keys"] == ["ok"]
    finally:
        executor.terminate()
        provider.terminate()


UNPATTERNED = POLICY.replace(
    'currency: {type: string, pattern: "^[A-Z]{3}$"}', "currency: {type: string}"
)


async def test_the_host_ceilings_refuse_a_currency_with_a_trailing_newline(tmp_path: Path) -> None:
    """Without a pattern in the policy, the ceilings' own currency match is the last line: it is a
    whole-string match, so ``"RUB\\n"`` is malformed, not a currency it names no limit for."""
    assert UNPATTERNED != POLICY
    policy = tmp_path / "policy.yaml"
    policy.write_text(UNPATTERNED, encoding="utf-8")
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(
        provider_url=provider.url,
        port=free_port(),
        policy_file=policy,
        extra={"EXECUTOR_HARD_LIMIT_SINGLE_MINOR": "RUB:1000,CHF:1000"},
    )
    executor = ExecutorProcess(env, tmp_path)
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            for currency in ("RUB\n", "rub", "ＲＵＢ"):
                status, body = await _propose(
                    session,
                    executor,
                    f"c-{len(currency)}-{currency.isascii()}",
                    {"amountMinor": 100, "currency": currency},
                )
                assert (status, body["error"]["code"]) == (422, "HARD_LIMIT_AMOUNT_INVALID"), body
            status, body = await _propose(
                session, executor, "chf", {"amountMinor": 100, "currency": "CHF"}
            )
            assert (status, body["outcome"]) == (200, "COMPLETED"), body
        assert (await provider.received())["keys"] == ["chf"]
    finally:
        executor.terminate()
        provider.terminate()
