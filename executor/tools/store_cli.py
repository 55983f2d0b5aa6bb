"""``agentsafe store migrate``: bring the shared PostgreSQL store's schema up to this version.

The URL comes from the executor's own variables: ``EXECUTOR_STORE_URL_FILE`` (a mounted secret;
the only form under ``AGENTSAFE_ENV=production``) or ``EXECUTOR_STORE_URL``, checked by the same
secret rules as ``agentsafe serve``. The migrations are the ones ``serve`` runs at start, under
the same advisory lock, so running this while replicas start is safe. Prints what it did
(``-o json`` for scripts); exit 0 when the schema is current, 1 when the database could not be
reached or is newer than this agentsafe, 78 when the configuration is invalid.

Callers: ``cli.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "store",
        help="the shared PostgreSQL store (EXECUTOR_STORE_URL)",
        description="Operate on the shared store every replica uses.",
    )
    ssub = parser.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    migrate = ssub.add_parser(
        "migrate",
        help="apply the schema migrations (the same ones 'serve' applies at start)",
        description="Apply every migration this agentsafe knows to the database named by "
        "EXECUTOR_STORE_URL_FILE (or EXECUTOR_STORE_URL outside production), under an advisory "
        "lock. A schema newer than this agentsafe is refused: upgrade agentsafe first.",
    )
    migrate.add_argument("-o", "--output", choices=("text", "json"), default="text")
    migrate.set_defaults(run=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    from ..config import is_production
    from ..errors import ConfigError, StoreError
    from ..host.secrets import SecretStore
    from ..state.pgconn import check_store_url, migrate_url

    environ = os.environ
    try:
        secrets_dir = environ.get("EXECUTOR_SECRETS_DIR")
        secrets = SecretStore.load(
            environ,
            production=is_production(environ),
            secrets_dir=Path(secrets_dir) if secrets_dir else None,
            names=("EXECUTOR_STORE_URL",),
        )
        handle = secrets.get("EXECUTOR_STORE_URL")
        if handle is None:
            raise ConfigError(
                "EXECUTOR_STORE_URL_FILE", "is required (the file holding the postgresql:// URL)"
            )
        with handle.reveal() as value:
            url = check_store_url(bytes(value).decode("utf-8", errors="replace").strip())
        secrets.close()
    except ConfigError as exc:
        print(f"agentsafe store migrate: configuration invalid: {exc}", file=sys.stderr)
        return exc.exit_status
    try:
        before, after = asyncio.run(migrate_url(url))
    except StoreError as exc:
        _report(args.output, {"ok": False, "code": exc.code, "message": exc.message})
        return 1
    _report(args.output, {"ok": True, "schema_version_before": before, "schema_version": after})
    return 0


def _report(output: str, result: dict[str, Any]) -> None:
    if output == "json":
        print(json.dumps(result, sort_keys=True))
    elif result["ok"]:
        before, after = result["schema_version_before"], result["schema_version"]
        if before == after:
            print(f"the store's schema is current (version {after})")
        else:
            print(f"migrated the store's schema from version {before} to {after}")
    else:
        print(f"agentsafe store migrate: {result['code']}: {result['message']}", file=sys.stderr)
