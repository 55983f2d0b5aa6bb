"""Shared-store benchmark: the ALLOW-and-execute path on PostgreSQL beside SQLite.

In one run, with the same client, provider and policy (``benchmarks/loadclient.py``):

* ALLOW on SQLite: the embedded store (``EXECUTOR_STATE_DIR``, WAL, ``synchronous=FULL``);
* ALLOW on PostgreSQL, one replica: ``EXECUTOR_STORE_URL`` to a throwaway loopback server
  (``tools/pgserver.py``: initdb in a temporary directory) with PostgreSQL's durability ON by
  default: ``fsync=on``, ``synchronous_commit=on``, ``full_page_writes=on``, read back from the
  running server with ``SHOW`` and printed with the figures (SQLite's row is ``synchronous=FULL``,
  so only this compares like with like). ``--postgres-fsync-off`` measures the protocol alone
  (``fsync=off``), a figure that says nothing about a durable path, and says so in its title;
* ALLOW on PostgreSQL, three replicas: the same database, requests spread round-robin.

Each ALLOW claims a grant, records idempotency, journals the attempt (the file journal with
fsync, and on PostgreSQL the open-attempt row and its lease) and POSTs to a loopback synthetic
provider. Prints requests/s, p50 and p99 and the ratio to SQLite. Speed is never asserted in
tests; record the figures in docs/performance.md.

    python benchmarks/shared_store.py [--requests N] [--concurrency C] [--postgres-fsync-off]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from lifecycle import render
from loadclient import default_client, drive, proposal_template

from agentsafe.executor.tools.harness import ExecutorProcess, ProviderProcess, Workspace, free_port
from agentsafe.executor.tools.pgserver import DURABILITY_SETTINGS, postgres_server


async def _measure(
    name: str,
    envs: list[dict[str, str]],
    root: Path,
    token: str,
    requests: int,
    concurrency: int,
    client: str,
) -> dict[str, Any]:
    executors = [ExecutorProcess(env, root, f"{name}-{i}") for i, env in enumerate(envs)]
    await asyncio.gather(*(e.start() for e in executors))
    headers = {"authorization": f"Bearer {token}"}
    urls = [e.url + "/v1/actions" for e in executors]
    try:
        slug = "".join(c if c.isalnum() else "-" for c in name.lower())
        return await drive(
            client,
            name,
            urls,
            proposal_template(slug, 100),
            headers,
            requests=requests,
            concurrency=concurrency,
            warmup=max(requests // 10, concurrency),
            pids=[e.process.pid for e in executors if e.process is not None],
        )
    finally:
        for executor in executors:
            executor.terminate()


async def run(
    requests: int, concurrency: int, client: str, *, durable: bool = True
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    root = Path(tempfile.mkdtemp(prefix="agentsafe-bench-store-"))
    provider = ProviderProcess(root)
    await provider.start()
    workspace = Workspace(root / "ws")
    rows: list[dict[str, Any]] = []
    settings: dict[str, str] = {}
    try:
        sqlite_env = workspace.environment(provider_url=provider.url, port=free_port())
        rows.append(
            await _measure(
                "ALLOW on SQLite",
                [sqlite_env],
                root,
                workspace.caller_token,
                requests,
                concurrency,
                client,
            )
        )
        with postgres_server(durable=durable) as server:
            settings = server.settings(*(name for name, _ in DURABILITY_SETTINGS))
            if durable and settings != dict(DURABILITY_SETTINGS):
                raise SystemExit(f"PostgreSQL did not start durable: {settings}")
            for replicas in (1, 3):
                url = server.create_database()
                envs = []
                for i in range(replicas):
                    own = root / f"pg{replicas}-{i}"
                    for sub in ("journal", "evidence"):
                        (own / sub).mkdir(parents=True, mode=0o700)
                    env = workspace.environment(
                        provider_url=provider.url,
                        port=free_port(),
                        extra={
                            "EXECUTOR_STORE_URL": url,
                            "EXECUTOR_REPLICA_ID": f"bench-{i}",
                            "EXECUTOR_JOURNAL_DIR": str(own / "journal"),
                            "EXECUTOR_EVIDENCE_DIR": str(own / "evidence"),
                        },
                    )
                    env.pop("EXECUTOR_STATE_DIR")
                    envs.append(env)
                name = f"ALLOW on PostgreSQL, {replicas} replica{'s' if replicas > 1 else ''}"
                rows.append(
                    await _measure(
                        name, envs, root, workspace.caller_token, requests, concurrency, client
                    )
                )
    finally:
        provider.terminate()
    return rows, settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--client", choices=("go", "python"), default=default_client())
    parser.add_argument(
        "--postgres-fsync-off",
        action="store_true",
        help="run PostgreSQL with fsync=off: the protocol's cost alone, not a durable path",
    )
    args = parser.parse_args()
    before = os.getloadavg()
    rows, settings = asyncio.run(
        run(args.requests, args.concurrency, args.client, durable=not args.postgres_fsync_off)
    )
    after = os.getloadavg()
    shown = ", ".join(f"{name}={value}" for name, value in settings.items())
    durability = (
        "PostgreSQL durability OFF, not a durable path"
        if args.postgres_fsync_off
        else "PostgreSQL durability ON"
    )
    render(
        f"shared store: {args.requests} requests, concurrency {args.concurrency}, "
        f"{args.client} client, load average {before[0]:.1f} -> {after[0]:.1f}; "
        f"{durability} ({shown}); SQLite synchronous=FULL",
        rows,
        "SQLite",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
