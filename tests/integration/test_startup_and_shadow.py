"""Start-up refusals that name their source, the shadow report at stop, and clock skew."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.assembly import assemble
from agentsafe.executor.clock import ManualClock
from agentsafe.executor.errors import ConfigError
from agentsafe.executor.events import MemorySink, Streams
from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port
from agentsafe.executor.tools.synthetic import SyntheticProvider

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env
from .conftest import Factory

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")
EXAMPLE = Path(__file__).parents[2] / "examples" / "policy.yaml"


def test_an_invalid_policy_expression_refuses_to_start_naming_the_rule(tmp_path: Path) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["actions"][0]["rules"][1]["when"] = "params.amountMinor <= "
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    env = Workspace(tmp_path / "ws").environment(
        provider_url="http://127.0.0.1:9", port=free_port(), policy_file=policy
    )
    result = subprocess.run(
        [AGENTSAFE, "serve"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert result.returncode == 78
    refusal = [line for line in result.stderr.splitlines() if "refused to start" in line]
    assert len(refusal) == 1
    assert "actions[0].rules[1].when" in refusal[0]


@pytest.mark.slow
async def test_shadow_prints_its_report_when_it_stops(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    env = Workspace(tmp_path / "ws").environment(
        provider_url=provider.url, port=free_port(), mode="SHADOW"
    )
    executor = ExecutorProcess(env, tmp_path, "shadow")
    try:
        await executor.start()
        async with aiohttp.ClientSession() as session:
            for amount, key in ((100, "a"), (900000, "b")):
                status, body = await executor.propose(session, amount=amount, key=key)
                assert status == 200
                assert body["outcome"] == "OBSERVED"
        assert executor.terminate() == 0
    finally:
        provider.terminate()
    report = executor.stderr_path.read_text()
    assert "create_payout" in report
    assert "EXECUTOR_MODE=ENFORCEMENT" in report


async def test_an_authority_clock_beyond_the_skew_bound_halts(
    running: Factory, tmp_path: Path
) -> None:
    run = await running()
    # A real authority whose clock runs five seconds ahead of this host's.
    ahead = ManualClock(start=run.executor.clock.now() + 5.0)
    run.executor.authority._clock = ahead
    status, body = await run.propose(100, key="skewed")
    assert status == 503
    assert body["reason_codes"] == ["AUTHORITY_UNAVAILABLE"]
    assert run.executor.halt.halted
    assert [c.cause.value for c in run.executor.halt.causes] == ["CLOCK_SKEW"]
    assert run.security.named("CLOCK_SKEW_EXCEEDED")
    status, body = await run.propose(100, key="after")
    assert status == 503
    assert body["reason_codes"] == ["EXECUTOR_HALTED"]
    assert run.provider.received == []


async def test_assemble_refuses_a_plans_section_without_a_journal(tmp_path: Path) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["plans"] = {"allowedTools": ["query"]}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    env = Workspace(tmp_path / "ws").environment(
        provider_url="http://127.0.0.1:9", port=free_port(), mode="SHADOW", policy_file=policy
    )
    with pytest.raises(ConfigError) as info:
        await assemble(env, streams=Streams(evidence=MemorySink(), security=MemorySink()))
    assert info.value.variable == "EXECUTOR_JOURNAL_DIR"


async def test_posture_drift_degrades_until_it_is_restored(tmp_path: Path) -> None:

    provider = SyntheticProvider()
    await provider.start()
    principals = BearerPrincipals()
    env = principals_env(
        Workspace(tmp_path / "ws").environment(provider_url=provider.base_url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
    )
    security = MemorySink()
    executor = await assemble(env, streams=Streams(evidence=MemorySink(), security=security))
    await executor.reconcile_at_start()
    await executor.listen()
    url = f"http://127.0.0.1:{executor.port}"
    proposal = {
        "proposal": {
            "action": "create_payout",
            "target": "payout:drift",
            "parameters": {"amountMinor": 100, "currency": "EUR"},
        },
        "idempotency_key": "drift-1",
    }
    proposer = {"authorization": f"Bearer {principals.token('treasury-workflow')}"}
    operator = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    try:
        async with aiohttp.ClientSession() as session:
            # TLS verification switched off in the process's environment while it runs:
            # a check the development posture never waives.
            env["PYTHONHTTPSVERIFY"] = "0"
            assert await executor.check_posture_now() == ("TLS_VERIFY_DISABLED",)
            assert security.named("POSTURE_DRIFT") == [
                {
                    "check": "TLS_VERIFY_DISABLED",
                    "detail": security.named("POSTURE_DRIFT")[0]["detail"],
                }
            ]
            async with session.post(url + "/v1/actions", json=proposal, headers=proposer) as r:
                assert r.status == 503
                assert (await r.json())["reason_codes"] == ["POSTURE_DEGRADED"]
            async with session.post(
                url + "/v1/control/resume", json={"reason": "try"}, headers=operator
            ) as r:
                assert r.status == 409
                assert (await r.json())["error"]["code"] == "HALT_CAUSE_PERSISTS"
            del env["PYTHONHTTPSVERIFY"]
            assert await executor.check_posture_now() == ()
            assert [e["check"] for e in security.named("POSTURE_RESTORED")] == [
                "TLS_VERIFY_DISABLED"
            ]
            # Restored is not resumed: the halt the drift caused stays until an operator acts.
            async with session.post(url + "/v1/actions", json=proposal, headers=proposer) as r:
                assert (await r.json())["reason_codes"] == ["EXECUTOR_HALTED"]
            async with session.post(
                url + "/v1/control/resume", json={"reason": "verified the host"}, headers=operator
            ) as r:
                assert r.status == 200
            async with session.post(url + "/v1/actions", json=proposal, headers=proposer) as r:
                assert (await r.json())["outcome"] == "COMPLETED"
    finally:
        await executor.close()
        await provider.stop()


async def test_a_rotated_authority_key_signs_from_then_on_and_the_old_one_still_verifies(
    running: Factory,
) -> None:
    run = await running()
    async with run.session.get(run.url + "/.well-known/agentsafe-grant-jwks.json") as r:
        [old] = (await r.json())["keys"]
    run.provider.set_mode("reset")  # acts, then drops the connection
    _, unknown = await run.propose(100, key="before-rotation")
    recovery = unknown["recovery"]
    key_file = run.workspace.secrets_dir / "authority-signing-key.pem"
    staged = key_file.with_name(".rotating")
    staged.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    staged.chmod(0o600)
    staged.replace(key_file)
    await run.executor.reload_secrets()
    [rotated] = run.security.named("AUTHORITY_KEY_ROTATED")
    assert rotated["kid"] != old["kid"]
    async with run.session.get(run.url + "/.well-known/agentsafe-grant-jwks.json") as r:
        kids = [k["kid"] for k in (await r.json())["keys"]]
    assert kids == [rotated["kid"], old["kid"]]
    # A recovery reference signed by the old key still verifies; new work is signed by the new.
    status, answer, _ = await run.post("/v1/reconciliations", {"recovery": recovery})
    assert status == 200
    assert answer["status"] == "COMPLETED"
    run.provider.set_mode("normal")
    _, done = await run.propose(100, key="after-rotation")
    assert done["outcome"] == "COMPLETED"
    assert "PRIVATE KEY" not in json.dumps(run.security.events)
