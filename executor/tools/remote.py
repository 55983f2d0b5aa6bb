"""One way for the command line to call a running executor: URL, credential, TLS, one request.

``agentsafe status`` is a person's command against an executor's control routes. It names where
its credential comes from (a flag, else an environment variable), and this module reads it,
builds the TLS context (the executor's CA, and a client certificate for an mTLS principal) and
makes one JSON request with aiohttp's client. A failure is a
:class:`CliError` that says what to do next, never a token: an answer that is not JSON, or a URL
that is an ``agentsafe proxy`` gateway port (its answers carry ``x-agentsafe-authority``; the
demo authority has no control routes at all) says which URL to use instead. That is asked first
with ``GET /ready`` and no credential, since a gateway would pass a request, credential and
all, to its upstream.

Callers: ``tools/status_cli.py``.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

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
        if self.cert and (self.token_file or os.environ.get(self.token_variable)):
            raise CliError("pass either a client certificate or a token, not both")
        connector = aiohttp.TCPConnector(ssl=self.ssl_context() or False)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                # First, with no credential: a gateway's port would pass the request, and the
                # credential with it, to its upstream.
                async with session.get(str(self.url).rstrip("/") + "/ready") as probe:
                    gateway = probe.headers.get(GATEWAY_HEADER)
                if gateway is not None:
                    raise CliError(gateway_port_message(str(self.url), gateway))
                headers = {"authorization": f"Bearer {self.token()}"} if not self.cert else {}
                async with session.request(
                    method, str(self.url).rstrip("/") + path, json=body, headers=headers
                ) as response:
                    return response.status, await _json(response, str(self.url))
        except aiohttp.ClientError as exc:
            raise CliError(
                f"cannot reach the executor at {self.url} ({type(exc).__name__}): is it "
                "running, and is the URL right?"
            ) from None


async def _json(response: aiohttp.ClientResponse, url: str) -> Any:
    try:
        return await response.json(content_type=None)
    except ValueError:
        raise CliError(
            f"{url} answered {response.status} with no agentsafe JSON: is it an executor's URL "
            "(EXECUTOR_BIND_ADDRESS:PORT)?"
        ) from None


GATEWAY_HEADER = "x-agentsafe-authority"
"""What every answer of ``agentsafe proxy``'s gateway port carries (``gateway/listener.py``)."""


def gateway_port_message(url: str, authority: str) -> str:
    """What to do when a control command was pointed at a gateway's port, not the routes."""
    if authority == "demo":
        return (
            f"{url} is an agentsafe proxy running the DEMO authority: it has no control routes "
            "(no operator principal exists). Its shadow report is printed when it stops (Ctrl-C "
            "or SIGTERM); for agentsafe status, configure the gateway (EXECUTOR_POLICY_FILE, "
            "EXECUTOR_PRINCIPALS_FILE with an OPERATOR) and start it with --serve-routes, then "
            "pass --url http://EXECUTOR_BIND_ADDRESS:PORT"
        )
    return (
        f"{url} is an agentsafe proxy's gateway port, not the executor's routes: start the "
        "gateway with --serve-routes and pass --url http://EXECUTOR_BIND_ADDRESS:PORT"
    )


def refused(status: int, payload: Any) -> CliError:
    error = payload.get("error", {}) if isinstance(payload, dict) else {}
    return CliError(f"refused ({status} {error.get('code', '?')}): {error.get('message', '')}")
