"""A provider that reflects the credential, against a real ``agentsafe serve`` (issue 16, item 12).

The attack: the provider answers ``422 {"code": <the Authorization header it received>}``. The
forward handler reduced that to UPPER_SNAKE (``BEARER_<HEX>``), a case-folded form the redactor
did not know, so the credential reached the agent as a reason code and the evidence as a field.
A second provider hands it back base64url-encoded as its ``reference``.

Here neither the answer, nor the evidence, nor the security stream, nor the operational logs
hold the credential in any of the forms (as sent, case-folded, UPPER_SNAKE, squashed, base64url),
and the security stream names the withheld field.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import aiohttp
import pytest

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port

pytestmark = pytest.mark.slow


def _forms(credential: str) -> list[str]:
    token = credential.split(" ", 1)[1]
    snake = re.sub(r"[^A-Z0-9]+", "_", credential.upper()).strip("_")
    encoded = base64.urlsafe_b64encode(credential.encode()).rstrip(b"=").decode()
    return [credential, token, token.upper(), snake, snake.lower(), encoded]


async def test_a_reflected_credential_reaches_neither_the_agent_nor_the_evidence(
    tmp_path: Path,
) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    workspace = Workspace(tmp_path / "ws")
    env = workspace.environment(provider_url=provider.url, port=free_port())
    executor = ExecutorProcess(env, tmp_path)
    forms = _forms(workspace.downstream_credential)
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            await provider.set_mode("reflect")
            status, refused = await executor.propose(session, amount=1200, key="reflect-1")
            assert status == 200, refused
            assert refused["outcome"] == "DEFINITELY_NOT_EXECUTED", refused
            assert refused["reason_codes"] == ["POLICY_ALLOWED", "PROVIDER_REASON_WITHHELD"], (
                refused
            )

            await provider.set_mode("reflect-reference")
            status, done = await executor.propose(session, amount=1300, key="reflect-2")
            assert status == 200, done
            assert done["outcome"] == "COMPLETED", done
            assert done["result"]["provider_reference"] == "[REDACTED:SECRET]", done
        for answer in (refused, done):
            for form in forms:
                assert form.casefold() not in str(answer).casefold()
    finally:
        assert executor.terminate() == 0
        provider.terminate()
    logs = executor.stdout_path.read_text() + executor.stderr_path.read_text()
    for form in forms:
        assert form.casefold() not in logs.casefold(), form
    withheld = [e for e in executor.stderr_events() if e.get("event") == "PROVIDER_STRING_WITHHELD"]
    assert [e.get("field") for e in withheld] == ["reason_code", "provider_reference"], withheld
