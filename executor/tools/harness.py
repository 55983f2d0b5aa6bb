"""Real processes on loopback: a synthetic provider and an executor, started and stopped.

The demo, the crash tests and the benchmarks all need the same thing: a provider subprocess and
an ``agentsafe serve`` subprocess with a clean environment, a private working directory, and a way
to wait for readiness (polling with a deadline, never sleeping blindly), SIGKILL and restart.

Callers: ``tools/demo.py``, tests, ``benchmarks/lifecycle.py``.
Also imported by ``pgserver.py``, ``selftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..banking.actions import ACTIONS

__all__ = [
    "DEMO_TENANT",
    "EXAMPLE_POLICY",
    "ExecutorProcess",
    "ProviderProcess",
    "Workspace",
    "banking_environment",
    "banking_policy",
    "free_port",
    "wait_until",
]

DEMO_TENANT = "00000000-0000-4000-8000-000000000001"
_CLEAN_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
EXAMPLE_POLICY = Path(__file__).resolve().parents[1] / "examples" / "policy.yaml"


def banking_policy(path: Path, *, provider_key: str | None = None) -> Path:
    """Write a policy that runs every banking action (ALLOW all), with ``provider_key`` (the
    synthetic core bank's raw Ed25519 public key, base64url) registered for its receipts."""
    policy: dict[str, Any] = {
        "actions": [
            {
                "name": name.removeprefix("banking.").replace(".", "_"),
                "handler": name,
                "parameters": kind.schema,
                "rules": [{"name": "all", "when": "true", "verdict": "ALLOW"}],
            }
            for name, kind in ACTIONS.items()
        ]
    }
    if provider_key is not None:
        policy["providerKeys"] = [
            {"kid": "synthetic-bank-1", "issuer": "synthetic-bank", "publicKey": provider_key}
        ]
    path.write_text(json.dumps(policy, indent=2), encoding="utf-8")
    return path


def banking_environment(bank_url: str) -> dict[str, str]:
    """The downstream settings that point an executor at the synthetic core bank."""
    return {
        "DOWNSTREAM_URL": f"{bank_url}/payments",
        "DOWNSTREAM_LOOKUP_URL": f"{bank_url}/payments/{{idempotency_key}}",
        "DOWNSTREAM_LOOKUP_BY_REFERENCE_URL": (
            f"{bank_url}/payments/by-reference/{{provider_reference}}"
        ),
        "DOWNSTREAM_SYSTEM": "synthetic-core-bank",
        "DOWNSTREAM_OPERATION": "payments",
    }


_PORT_FLOOR = 20000
"""The lowest port :func:`free_port` hands out."""
_PORT_CLAIM_SECONDS = 120.0
"""How long a port handed out stays claimed for this machine's other processes: far longer than
any child takes to bind it."""
_PORT_CLAIMS = Path(tempfile.gettempdir()) / "agentsafe-ports"


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _claim_port(port: int) -> bool:
    """Claim ``port`` for this process with an exclusive file, so that a parallel test worker
    does not hand the same port out before the first child has bound it. A claim older than
    ``_PORT_CLAIM_SECONDS`` is stale and is taken over."""
    claim = _PORT_CLAIMS / str(port)
    try:
        _PORT_CLAIMS.mkdir(mode=0o700, exist_ok=True)
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        try:
            if time.time() - claim.stat().st_mtime < _PORT_CLAIM_SECONDS:
                return False
            os.utime(claim)
        except OSError:
            return False
        return True
    except OSError:
        return True  # no claims here (another user's directory): the bind probe still decides


def free_port(*, avoid: range = range(0)) -> int:
    """A loopback TCP port that nothing holds now, for a child process to bind; never one in
    ``avoid`` (the end-to-end node keeps its host listeners off the NodePort range).

    Not the kernel's ``bind(0)``: that port comes from the ephemeral range, the range the kernel
    also uses for the local end of every outgoing connection. Between the probe's close and the
    child's bind, any client socket on the machine could take it, and the child then fails with
    EADDRINUSE (it did, once, in CI). So the port comes from below that range, is claimed
    against parallel workers (``_claim_port``), and is probed by a bind without SO_REUSEADDR,
    which also fails on a port in TIME_WAIT.
    """
    low, _high = _ephemeral_ports()
    if low - _PORT_FLOOR >= 1000:
        for _ in range(500):
            port = _PORT_FLOOR + secrets.randbelow(low - _PORT_FLOOR)
            if port in avoid or not _claim_port(port):
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            chosen: int = sock.getsockname()[1]
        if chosen not in avoid:
            return chosen
    raise OSError(f"no free loopback port outside {avoid.start}-{avoid.stop - 1}")


async def wait_until(
    predicate: Any, *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll ``await predicate()`` until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class Workspace:
    """A private directory tree for one executor: state, journal, secrets, evidence."""

    root: Path
    caller_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    downstream_credential: str = field(default_factory=lambda: "Bearer " + secrets.token_hex(16))

    def __post_init__(self) -> None:
        for name in ("state", "journal", "secrets", "evidence"):
            (self.root / name).mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.root / name, 0o700)
        key_file = self.secrets_dir / "authority-signing-key.pem"
        if not key_file.exists():
            pem = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(pem)

    @property
    def secrets_dir(self) -> Path:
        return self.root / "secrets"

    def environment(
        self,
        *,
        provider_url: str,
        port: int,
        mode: str = "ENFORCEMENT",
        policy_file: Path | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        env = {key: os.environ[key] for key in _CLEAN_ENV_KEYS if key in os.environ}
        env.update(
            {
                "AGENTSAFE_ENV": "development",
                "EXECUTOR_MODE": mode,
                "EXECUTOR_POSTURE": "DEVELOPMENT",
                "EXECUTOR_BIND_ADDRESS": "127.0.0.1",
                "PORT": str(port),
                "EXECUTOR_ALLOW_PLAINTEXT_LISTENER": "true",
                "EXECUTOR_POLICY_FILE": str(policy_file or EXAMPLE_POLICY),
                "EXECUTOR_STATE_DIR": str(self.root / "state"),
                "EXECUTOR_JOURNAL_DIR": str(self.root / "journal"),
                "EXECUTOR_EVIDENCE_DIR": str(self.root / "evidence"),
                "EXECUTOR_SECRETS_DIR": str(self.secrets_dir),
                "EXECUTOR_AUTHORITY_SIGNING_KEY_FILE": str(
                    self.secrets_dir / "authority-signing-key.pem"
                ),
                "EXECUTOR_TENANT_ID": DEMO_TENANT,
                "EXECUTOR_ACTOR_ID": "synthetic-payout-agent",
                "EXECUTOR_ACTOR_TYPE": "AI_AGENT",
                "EXECUTOR_ACTOR_RUNTIME": "agentsafe-demo",
                "EXECUTOR_CALLER_TOKEN": self.caller_token,
                "EXECUTOR_INTENT_TTL_SECONDS": "60",
                "DOWNSTREAM_URL": f"{provider_url}/payouts",
                "DOWNSTREAM_LOOKUP_URL": f"{provider_url}/payouts/{{idempotency_key}}",
                "DOWNSTREAM_ALLOW_INSECURE_LOOPBACK": "true",
                "DOWNSTREAM_SYSTEM": "synthetic-bank",
                "DOWNSTREAM_OPERATION": "payout",
                "DOWNSTREAM_CREDENTIAL_KIND": "STATIC_HEADER",
                "DOWNSTREAM_CREDENTIAL_HEADER": "authorization",
                "DOWNSTREAM_CREDENTIAL": self.downstream_credential,
                "DOWNSTREAM_TIMEOUT_MS": "5000",
            }
        )
        if mode == "SHADOW":
            env.pop("EXECUTOR_JOURNAL_DIR")
        env.update(extra or {})
        return env


class _Process:
    def __init__(self, argv: list[str], env: Mapping[str, str], log_dir: Path, name: str) -> None:
        self.argv = argv
        self.env = dict(env)
        self.name = name
        self.stdout_path = log_dir / f"{name}.stdout.jsonl"
        self.stderr_path = log_dir / f"{name}.stderr.jsonl"
        self.process: subprocess.Popen[bytes] | None = None
        self._files: list[IO[bytes]] = []

    def spawn(self) -> None:
        out = open(self.stdout_path, "ab")  # noqa: SIM115 - closed in _close_files
        err = open(self.stderr_path, "ab")  # noqa: SIM115
        self._files = [out, err]
        # Run from the log directory: never from a source checkout, where a directory named
        # like a standard-library module could shadow it for ``python -m``.
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=self.stdout_path.parent,
        )

    def _close_files(self) -> None:
        for handle in self._files:
            handle.close()
        self._files = []

    async def _await_up(self, up: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
        """Wait for ``up``; when the process never comes up, stop it, close its log files and
        say what its stderr last said (a test's temporary directory may be gone by the time
        anyone reads the file)."""
        try:
            await wait_until(up, timeout=timeout, what=what)
        except BaseException as exc:
            if self.process is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=30)
            self._close_files()
            tail = ""
            with contextlib.suppress(OSError):
                tail = self.stderr_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            if isinstance(exc, Exception) and tail:
                exc.add_note(f"--- {self.name} stderr (last lines) ---\n{tail}")
            raise

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up, no chance to journal or checkpoint."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self._close_files()

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait for a clean exit; returns the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._close_files()
        return self.process.returncode

    def stdout_events(self) -> list[dict[str, Any]]:
        return _read_events(self.stdout_path)

    def stderr_events(self) -> list[dict[str, Any]]:
        return _read_events(self.stderr_path)


def _read_events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line)
            if isinstance(value, dict):
                events.append(value)
    return events


class ProviderProcess(_Process):
    """``python -m agentsafe.executor.tools.synthetic`` (or ``module``: the synthetic core
    bank, ``tools/synthetic_bank.py``) on a loopback port."""

    def __init__(
        self,
        log_dir: Path,
        port: int | None = None,
        *,
        require_credential: Path | None = None,
        module: str = "agentsafe.executor.tools.synthetic",
        args: tuple[str, ...] = (),
        name: str = "provider",
    ) -> None:
        self.port = port or free_port()
        env = {key: os.environ[key] for key in _CLEAN_ENV_KEYS if key in os.environ}
        argv = [sys.executable, "-m", module, "--port", str(self.port), *args]
        if require_credential is not None:
            argv += ["--require-credential", str(require_credential)]
        super().__init__(argv, env, log_dir, name)
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 30.0) -> None:
        self.spawn()

        async def up() -> bool:
            if not self.running:
                raise RuntimeError("the synthetic provider exited; see " + str(self.stderr_path))
            try:
                async with aiohttp.ClientSession() as session, session.get(self.url + "/") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await self._await_up(up, timeout, "the synthetic provider")

    async def set_mode(self, mode: str) -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + "/_control/mode", json={"mode": mode}) as r,
        ):
            r.raise_for_status()

    async def set_lookups(self, *, available: bool) -> None:
        """Switch the provider's lookups off (every one answers 503) or on again."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + "/_control/lookups", json={"available": available}) as r,
        ):
            r.raise_for_status()

    async def set_lookup(self, mode: str) -> None:
        """``normal``, ``lag`` (404 for everything) or ``hold`` (until :meth:`release`)."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + "/_control/lookup", json={"mode": mode}) as r,
        ):
            r.raise_for_status()

    async def release(self) -> None:
        """Let every held payout request and lookup answer."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + "/_control/release") as r,
        ):
            r.raise_for_status()

    async def received(self) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url + "/_control/received") as r,
        ):
            value: dict[str, Any] = await r.json()
            return value


class ExecutorProcess(_Process):
    """``agentsafe serve`` with the environment a workspace renders."""

    def __init__(self, env: Mapping[str, str], log_dir: Path, name: str = "executor") -> None:
        argv = [sys.executable, "-m", "agentsafe.executor.cli", "serve"]
        super().__init__(argv, env, log_dir, name)
        self.port = int(env["PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = env.get("EXECUTOR_CALLER_TOKEN", "")

    async def start(self, timeout: float = 60.0, *, expect_ready: bool = True) -> None:
        self.spawn()

        async def up() -> bool:
            if not self.running:
                status = self.process.returncode if self.process else None
                raise RuntimeError(f"the executor exited ({status}); see {self.stderr_path}")
            try:
                async with aiohttp.ClientSession() as session:
                    path = "/ready" if expect_ready else "/health"
                    async with session.get(self.url + path) as r:
                        return r.status == 200
            except aiohttp.ClientError:
                return False

        await self._await_up(up, timeout, f"{self.name} to become ready")

    async def propose(
        self,
        session: aiohttp.ClientSession,
        *,
        amount: int,
        key: str,
        currency: str = "USD",
        target: str = "payout:synthetic-beneficiary-1",
        action: str = "create_payout",
    ) -> tuple[int, dict[str, Any]]:
        body = {
            "proposal": {
                "action": action,
                "target": target,
                "parameters": {"amountMinor": amount, "currency": currency},
            },
            "idempotency_key": key,
            "correlation_id": "demo-run",
        }
        headers = {"authorization": f"Bearer {self.token}"}
        async with session.post(self.url + "/v1/actions", json=body, headers=headers) as r:
            payload: dict[str, Any] = await r.json()
            return r.status, payload

    async def get_json(self, session: aiohttp.ClientSession, path: str) -> tuple[int, Any]:
        async with session.get(self.url + path) as r:
            return r.status, await r.json()
