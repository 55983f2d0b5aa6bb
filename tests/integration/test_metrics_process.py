"""``GET /metrics`` of a real ``agentsafe serve`` over TLS, parsed with prometheus_client's parser.

One executor subprocess (TLS listener, principals file, a real synthetic provider) is driven
through an ALLOW, a BLOCK, a refusal at the door, an ALLOW the provider fails (unknown after
dispatch) and an operator's halt; then it is scraped and every monitoring promise is checked on
the exposition itself: the latency histogram by route template and outcome (never a raw path),
its buckets, the state gauges (halted, open and unknown attempts, journal bytes, the serving
certificate's seconds to ``notAfter``, the store), ``agentsafe_build_info``, and that a scrape is
counted rather than written as a chained line.
"""

from __future__ import annotations

import platform
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agentsafe.executor import __version__
from agentsafe.executor.host.metrics import DURATION_BUCKETS
from agentsafe.executor.tools.harness import (
    ExecutorProcess,
    ProviderProcess,
    Workspace,
    free_port,
    wait_until,
)
from tests.support.pki import TestCA

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env
from .estate import write_private

pytestmark = pytest.mark.slow

Samples = list[tuple[str, dict[str, str], float]]


@pytest.fixture
async def synthetic(tmp_path: Path) -> AsyncIterator[ProviderProcess]:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    try:
        yield provider
    finally:
        provider.terminate()


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """Each family's type, and every sample (name, labels, value)."""
    types: dict[str, str] = {}
    samples: Samples = []
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        samples.extend((s.name, dict(s.labels), s.value) for s in family.samples)
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for n, got, v in samples if n == name and got == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def proposal(key: str, amount: int) -> dict[str, Any]:
    return {
        "proposal": {
            "action": "create_payout",
            "target": "payout:synthetic-beneficiary-1",
            "parameters": {"amountMinor": amount, "currency": "USD"},
        },
        "idempotency_key": key,
    }


async def test_a_scrape_of_a_real_serve_shows_latency_state_and_build(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    ca = TestCA("agentsafe metrics test CA")
    server = ca.issue_server()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    cert_file = workspace.root / "listener.crt"
    key_file = workspace.secrets_dir / "listener.key"
    write_private(cert_file, server.cert_pem, mode=0o644)
    write_private(key_file, server.key_pem)
    env = principals_env(
        workspace.environment(provider_url=synthetic.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
    )
    env.pop("EXECUTOR_ALLOW_PLAINTEXT_LISTENER")
    env.update({"EXECUTOR_TLS_CERT_FILE": str(cert_file), "EXECUTOR_TLS_KEY_FILE": str(key_file)})
    executor = ExecutorProcess(env, tmp_path)
    https = f"https://127.0.0.1:{executor.port}"
    trusting = ssl.create_default_context(cadata=ca.cert_pem.decode())
    agent = {"authorization": f"Bearer {principals.token('treasury-workflow')}"}
    ops = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
    try:
        executor.spawn()
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                assert executor.running, f"serve exited; see {executor.stderr_path}"
                try:
                    async with session.get(https + "/ready", ssl=trusting) as r:
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await wait_until(ready, timeout=60, what="the TLS listener to be ready")

            async def post(body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
                async with session.post(
                    https + "/v1/actions", json=body, headers=headers, ssl=trusting
                ) as r:
                    answer: dict[str, Any] = await r.json()
                    return answer

            assert (await post(proposal("m-allow", 5000), agent))["outcome"] == "COMPLETED"
            assert (await post(proposal("m-block", 900000), agent))["outcome"] == "BLOCKED"
            refused = await post(proposal("m-anon", 5000), {})
            assert refused["error"]["code"] == "AUTH_REQUIRED"
            await synthetic.set_mode("error")
            unknown = await post(proposal("m-unknown", 5000), agent)
            assert unknown["outcome"] == "UNKNOWN_AFTER_DISPATCH"
            async with session.post(
                https + "/v1/control/halt", json={"reason": "drill"}, headers=ops, ssl=trusting
            ) as r:
                assert r.status == 200

            async def scrape() -> str:
                async with session.get(
                    https + "/metrics",
                    headers={**ops, "accept": "application/openmetrics-text; version=1.0.0"},
                    ssl=trusting,
                ) as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                    return await r.text()

            text = await scrape()
            scraped_at = time.time()
            types, samples = parse(text)
            journal_bytes = sum(
                p.stat().st_size for p in (workspace.root / "journal" / "attempts").glob("*.jsonl")
            )
            second = parse(await scrape())[1]
    finally:
        status = executor.terminate()
    assert status == 0

    # Latency by route template and outcome: the decision's verdict, else the answer's class.
    assert types["agentsafe_request_duration_seconds"] == "histogram"
    count = "agentsafe_request_duration_seconds_count"
    actions = {"route": "/v1/actions", "method": "POST"}
    assert value(samples, count, **actions, outcome="ALLOW") == 2
    assert value(samples, count, **actions, outcome="BLOCK") == 1
    assert value(samples, count, **actions, outcome="refused") == 1
    halt = {"route": "/v1/control/halt", "method": "POST"}
    assert value(samples, count, **halt, outcome="ok") == 1
    assert value(samples, count, route="/ready", method="GET", outcome="ok") >= 1
    routes = {got["route"] for n, got, _ in samples if n == count}
    assert routes <= {"/v1/actions", "/v1/control/halt", "/ready", "/metrics", "/health"}
    buckets = [
        got["le"]
        for n, got, _ in samples
        if n == "agentsafe_request_duration_seconds_bucket"
        and got | {"le": ""} == {**actions, "outcome": "BLOCK", "le": ""}
    ]
    assert [float(b) for b in buckets] == [*DURATION_BUCKETS, float("inf")]
    total = value(samples, "agentsafe_request_duration_seconds_sum", **actions, outcome="ALLOW")
    assert 0 < total < 60

    # State at the scrape.
    assert value(samples, "agentsafe_halted") == 1
    assert value(samples, "agentsafe_unknown_attempts") == 1
    assert value(samples, "agentsafe_open_attempts") == 1
    assert value(samples, "agentsafe_pending_escalations") == 0
    assert value(samples, "agentsafe_store_available") == 1
    assert journal_bytes > 0
    assert value(samples, "agentsafe_journal_bytes") == journal_bytes
    expiry = value(samples, "agentsafe_tls_certificate_expiry_seconds", certificate="serving")
    expected = server.cert.not_valid_after_utc.timestamp() - scraped_at
    assert abs(expiry - expected) < 120, (expiry, expected)
    assert not [got for n, got, _ in samples if got.get("certificate") == "client_ca"]

    # The build.
    assert (
        value(
            samples,
            "agentsafe_build_info",
            version=__version__,
            python=platform.python_version(),
            commit="unknown",
        )
        == 1
    )

    # A scrape is counted, and never written as a chained line.
    assert value(samples, "agentsafe_metrics_scrapes_total") == 1
    assert value(second, "agentsafe_metrics_scrapes_total") == 2
    actions_logged = [
        e["action"] for e in executor.stderr_events() if e["event"] == "OPERATOR_ACTION"
    ]
    assert actions_logged == ["halt"]
    # Nothing from a request in the exposition.
    for secret in (*principals.tokens.values(), "m-allow", "drill"):
        assert secret not in text


async def test_a_restart_after_sigkill_counts_the_chain_gap_of_both_streams(
    tmp_path: Path, synthetic: ProviderProcess
) -> None:
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=synthetic.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
    )
    ops = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}

    async def findings(executor: ExecutorProcess) -> dict[str, float]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                executor.url + "/metrics",
                headers={**ops, "accept": "application/openmetrics-text; version=1.0.0"},
            ) as r,
        ):
            assert r.status == 200
            _, samples = parse(await r.text())
        return {
            got["finding"]: v
            for n, got, v in samples
            if n == "agentsafe_evidence_integrity_findings_total"
        }

    first = ExecutorProcess(env, tmp_path, name="first")
    try:
        await first.start()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                first.url + "/v1/actions",
                json=proposal("gap-1", 5000),
                headers={"authorization": f"Bearer {principals.token('treasury-workflow')}"},
            ) as r,
        ):
            assert (await r.json())["outcome"] == "COMPLETED"  # both streams have lines now
        assert await findings(first) == {
            "CHAIN_GAP": 0,
            "JOURNAL_DAY_FILE_MISSING": 0,
            "JOURNAL_TORN_LINE": 0,
        }
    finally:
        first.kill()
    second = ExecutorProcess(env, tmp_path, name="second")
    try:
        await second.start()
        counted = await findings(second)
    finally:
        assert second.terminate() == 0
    # Both streams resumed past what the killed process may have written: each is one gap.
    assert counted["CHAIN_GAP"] == 2
    resumed = [e for e in second.stderr_events() if e["event"] == "CHAIN_RESUMED"]
    assert resumed
    assert all(e.get("gap", e.get("resumption", {}).get("gap")) for e in resumed)
