"""One way for the command line to call a running executor: URL, credential, TLS, one request.

``agentsafe status`` is a person's command against an executor's control routes. It names where
its credential comes from (a flag, else an environment variable), and this module reads it,
builds the TLS context (the executor's CA, and a client certificate for an mTLS principal) and
makes one JSON request with aiohttp's client. A failure is a
:class:`CliError` that says what to do next, never a token.

Callers: ``tools/status_cli.py``.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CliError", "Remote", "refused"]


class CliError(Exception):
    """A command cannot go on; the message says what to do next."""


@dataclass(frozen=True)
class Remote:
    """Where the executor is and how this command proves itself to it."""

    url: str | None
    token_file: str | None
    token_variable: str
    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None

    def token(self) -> str:
        if self.token_file:
            try:
                return Path(self.token_file).read_text(encoding="utf-8").strip()
            except OSError:
                raise CliError(f"cannot read the token file {self.token_file}") from None
        token = os.environ.get(self.token_variable)
        if not token:
            raise CliError(f"no credential: pass --token-file or set {self.token_variable}(_FILE)")
        return token

    def ssl_context(self) -> ssl.SSLContext | None:
        if not str(self.url).startswith("https://"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert:
            context.load_cert_chain(self.cert, self.key)
        return context

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        import aiohttp  # the server's client library, only when a request is made

        if not self.url:
            raise CliError("no executor: pass --url or set AGENTSAFE_EXECUTOR_URL")
        headers = {"authorization": f"Bearer {self.token()}"} if not self.cert else {}
        if self.cert and (self.token_file or os.environ.get(self.token_variable)):
            raise CliError("pass either a client certificate or a token, not both")
        connector = aiohttp.TCPConnector(ssl=self.ssl_context() or False)
        try:
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.request(
                    method, str(self.url).rstrip("/") + path, json=body, headers=headers
                ) as response,
            ):
                return response.status, await response.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise CliError(
                f"cannot reach the executor at {self.url} ({type(exc).__name__}): is it "
                "running, and is the URL right?"
            ) from None


def refused(status: int, payload: Any) -> CliError:
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    return CliError(f"refused ({status} {error.get('code', '?')}): {error.get('message', '')}")
