"""Evidence from a real ``agentsafe serve``: chains across restarts, bundles, no secret escapes."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port

from .bearer_principals import OPERATOR_ID, BearerPrincipals, principals_env

pytestmark = pytest.mark.slow

AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


def verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTSAFE, "verify", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


async def _propose(executor: ExecutorProcess, token: str, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body = {
                "proposal": {
                    "action": "create_payout",
                    "target": "payout:evidence",
                    "parameters": {"amountMinor": 100 + i, "currency": "EUR"},
                },
                "idempotency_key": f"ev-{executor.name}-{i}",
            }
            headers = {"authorization": f"Bearer {token}"}
            async with session.post(executor.url + "/v1/actions", json=body, headers=headers) as r:
                assert r.status == 200


async def test_clean_restart_resumes_and_sigkill_leaves_a_gap(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=provider.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_AUDIT_CHECKPOINT_LINES="5",
    )
    token = principals.token("treasury-workflow")
    try:
        first = ExecutorProcess(env, tmp_path, "executor")
        await first.start()
        await _propose(first, token, 3)
        assert first.terminate() == 0
        second = ExecutorProcess(env, tmp_path, "executor")
        await second.start()
        await _propose(second, token, 3)
        result = verify("chain", str(second.stdout_path))
        assert result.returncode == 0, result.stdout
        events = second.stdout_events()
        assert "CHAIN_RESUMED" in [e["event"] for e in events]
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, len(seqs) + 1)), "a clean stop resumes seamlessly"
        second.kill()
        third = ExecutorProcess(env, tmp_path, "executor")
        await third.start()
        await _propose(third, token, 1)
        third.terminate()
        result = verify("chain", str(third.stdout_path))
        assert result.returncode == 0, result.stdout
        assert "GAP" in result.stdout.upper()
        seqs = [e["seq"] for e in third.stdout_events()]
        assert any(b - a > 1 for a, b in itertools.pairwise(seqs))
        # Both streams, all three runs: no secret value anywhere.
        for path in (third.stdout_path, third.stderr_path):
            text = path.read_text()
            for secret in (token, workspace.downstream_credential, *principals.tokens.values()):
                assert secret not in text
        assert verify("chain", str(third.stderr_path)).returncode == 0
    finally:
        provider.terminate()


async def test_evidence_export_and_offline_bundle_verification(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    key = Ed25519PrivateKey.generate()
    key_file = workspace.secrets_dir / "evidence-signing-key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    env = principals_env(
        workspace.environment(provider_url=provider.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
        EXECUTOR_EVIDENCE_SIGNING_KEY_FILE=str(key_file),
        EXECUTOR_IMAGE_DIGEST="sha256:" + "ab" * 32,
    )
    executor = ExecutorProcess(env, tmp_path)
    try:
        await executor.start()
        await _propose(executor, principals.token("treasury-workflow"), 2)
        headers = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
        async with aiohttp.ClientSession() as session:
            manifests: list[dict[str, Any]] = []
            for _ in range(2):
                async with session.post(
                    executor.url + "/v1/control/evidence-export",
                    json={"reason": "on-call took a bundle"},
                    headers=headers,
                ) as r:
                    assert r.status == 200, await r.text()
                    manifests.append(await r.json())
            async with session.get(executor.url + "/metrics", headers=headers) as r:
                assert r.status == 200
                exposition = await r.text()
            assert 'agentsafe_chained_lines_total{stream="evidence"}' in exposition
            assert 'agentsafe_chained_lines_total{stream="security"}' in exposition
        bundles = sorted(p for p in (workspace.root / "evidence").iterdir() if p.is_dir())
        assert len(bundles) == 2, "two exports never overwrite each other"
        for bundle in bundles:
            assert sorted(p.name for p in bundle.iterdir()) == sorted(
                [
                    "evidence.jsonl",
                    "security.jsonl",
                    "open-attempts.json",
                    "posture.json",
                    "manifest.json",
                ]
            )
            text = "".join(p.read_text() for p in bundle.iterdir())
            for secret in principals.tokens.values():
                assert secret not in text
            assert "amountMinor" not in text
        result = verify("bundle", str(bundles[0]))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "INTERNAL_CONSISTENCY" in result.stdout
        public = (
            key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )
        result = verify("bundle", str(bundles[0]), env={"AGENTSAFE_EVIDENCE_PUBLIC_KEY": public})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ORIGIN_AND_CONSISTENCY" in result.stdout
        other = (
            Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        result = verify(
            "bundle", str(bundles[0]), env={"AGENTSAFE_EVIDENCE_PUBLIC_KEY": other.decode()}
        )
        assert result.returncode == 1
    finally:
        executor.terminate()
        provider.terminate()


async def test_export_is_refused_without_an_evidence_directory(tmp_path: Path) -> None:
    provider = ProviderProcess(tmp_path)
    await provider.start()
    principals = BearerPrincipals()
    workspace = Workspace(tmp_path / "ws")
    env = principals_env(
        workspace.environment(provider_url=provider.url, port=free_port()),
        principals.write(tmp_path / "principals.json"),
    )
    del env["EXECUTOR_EVIDENCE_DIR"]
    executor = ExecutorProcess(env, tmp_path)
    try:
        await executor.start()
        headers = {"authorization": f"Bearer {principals.token(OPERATOR_ID)}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                executor.url + "/v1/control/evidence-export",
                json={"reason": "nothing to write to"},
                headers=headers,
            ) as r,
        ):
            assert r.status == 409
            assert (await r.json())["error"]["code"] == "EVIDENCE_NOT_CONFIGURED"
    finally:
        executor.terminate()
        provider.terminate()
