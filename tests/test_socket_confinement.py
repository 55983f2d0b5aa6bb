"""The repository's lint rule that confines network APIs to the modules that may use them.

The specification asks for "a lint rule in the repository that confines socket modules to the
directories that may open one". This test is that rule: it parses (``ast``, nothing is imported)
every module under ``executor/`` and ``operator/`` and fails when a module uses a network API
that :data:`ALLOWED` does not grant it, or when :data:`ALLOWED` grants something a module no
longer uses (so the list never drifts into a blanket permission).

It is a review control, not a runtime guarantee. It reads source; it cannot see a connection
opened through a C extension, ``ctypes``, a third-party library that connects on its own, a name
built at run time for ``importlib``, or a subprocess. The runtime guarantee in the executor
process is the audit hook in ``executor/host/audithook.py`` (every ``socket.connect`` outside the
guarded client's ``allowed_egress`` is refused), and below it the container's network policy.
What this rule buys is that a second outbound client cannot be added to the product by accident:
anyone who needs one must add a line here, with a reason, where a reviewer sees it. The modules
allowed a client because they run "outside the executor process" are checked to be so: none of
them is reachable by imports from ``executor/serve.py``.

The kinds of use, each matched by the names below wherever they appear in a module:

* ``socket``: importing ``socket`` (or ``_socket``) at all.
* ``tls``: TLS on a socket of one's own (``wrap_socket``, ``wrap_bio``,
  ``get_server_certificate``). Building an ``SSLContext`` is not network use.
* ``http-client``: an HTTP client: ``http.client``, ``urllib.request``, ``requests``, ``httpx``,
  ``urllib3``, ``pycurl``, ``websockets``, and aiohttp's client (``ClientSession``, the
  connectors, ``aiohttp.request``, ``ws_connect``, the ``aiohttp.client``/``connector`` modules).
  ``aiohttp.web`` (the server) is not a client.
* ``connect``: asyncio's and the loop's connection calls (``open_connection``,
  ``create_connection``, ``sock_connect``, their Unix and datagram forms).
* ``listen``: opening a listening socket (``start_server``, ``create_server``, aiohttp's
  ``TCPSite``/``UnixSite``/``SockSite``, ``run_app``, prometheus_client's
  ``start_http_server``/``start_wsgi_server``, importing ``uvicorn``).
* ``resolve``: name resolution, which is egress too (``getaddrinfo``, ``gethostbyname``...,
  aiohttp's concrete resolvers).
* ``kube``: a Kubernetes client library (``kopf``, ``kubernetes``, ``kubernetes_asyncio``); the
  executor must never run one.
* ``database``: a network database client (``psycopg``, ``psycopg_pool``, ``asyncpg``). libpq
  connects from native code, which the audit hook cannot see: only the shared store may.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("executor", "operator")

SOCKET, TLS, HTTP_CLIENT, CONNECT, LISTEN, RESOLVE, KUBE, DATABASE = (
    "socket",
    "tls",
    "http-client",
    "connect",
    "listen",
    "resolve",
    "kube",
    "database",
)

# module name (or dotted prefix) -> kind, for ``import x`` / ``from x import ...``
_MODULES: dict[str, str] = {
    "socket": SOCKET,
    "_socket": SOCKET,
    "http.client": HTTP_CLIENT,
    "urllib.request": HTTP_CLIENT,
    "requests": HTTP_CLIENT,
    "httpx": HTTP_CLIENT,
    "urllib3": HTTP_CLIENT,
    "pycurl": HTTP_CLIENT,
    "websockets": HTTP_CLIENT,
    "aiohttp.client": HTTP_CLIENT,
    "aiohttp.connector": HTTP_CLIENT,
    "uvicorn": LISTEN,
    "kopf": KUBE,
    "kubernetes": KUBE,
    "kubernetes_asyncio": KUBE,
    "psycopg": DATABASE,
    "psycopg_pool": DATABASE,
    "asyncpg": DATABASE,
}
# ``from package import name`` where the name is itself one of the modules above
_SUBMODULES: dict[tuple[str, str], str] = {
    ("http", "client"): HTTP_CLIENT,
    ("urllib", "request"): HTTP_CLIENT,
}
# names of aiohttp's client, whether imported from aiohttp or reached as ``aiohttp.<name>``
_AIOHTTP_CLIENT = frozenset(
    {
        "ClientSession",
        "TCPConnector",
        "UnixConnector",
        "NamedPipeConnector",
        "BaseConnector",
        "request",
        "ws_connect",
    }
)
_AIOHTTP_RESOLVERS = frozenset({"ThreadedResolver", "AsyncResolver", "DefaultResolver"})
# attribute or function names that are network use wherever they appear
_NAMES: dict[str, str] = {
    "wrap_socket": TLS,
    "wrap_bio": TLS,
    "get_server_certificate": TLS,
    "open_connection": CONNECT,
    "open_unix_connection": CONNECT,
    "create_connection": CONNECT,
    "create_unix_connection": CONNECT,
    "create_datagram_endpoint": CONNECT,
    "sock_connect": CONNECT,
    "start_server": LISTEN,
    "start_unix_server": LISTEN,
    "create_server": LISTEN,
    "create_unix_server": LISTEN,
    "TCPSite": LISTEN,
    "UnixSite": LISTEN,
    "SockSite": LISTEN,
    "run_app": LISTEN,
    "start_http_server": LISTEN,
    "start_wsgi_server": LISTEN,
    "getaddrinfo": RESOLVE,
    "getnameinfo": RESOLVE,
    "gethostbyname": RESOLVE,
    "gethostbyname_ex": RESOLVE,
    "gethostbyaddr": RESOLVE,
    **dict.fromkeys(_AIOHTTP_RESOLVERS, RESOLVE),
}


@dataclass(frozen=True)
class Allowance:
    kinds: frozenset[str]
    reason: str


def allow(*kinds: str, reason: str) -> Allowance:
    return Allowance(frozenset(kinds), reason)


ALLOWED: dict[str, Allowance] = {
    # -- the executor process -------------------------------------------------------------
    "executor/egress/guard.py": allow(
        SOCKET,
        HTTP_CLIENT,
        RESOLVE,
        reason="the guarded client: the executor's one outbound path (connects inside "
        "allowed_egress, resolves once per request, pins the answer)",
    ),
    "executor/host/audithook.py": allow(
        SOCKET,
        CONNECT,
        reason="the audit hook's self-test probe: a connect to a closed loopback port that the "
        "installed hook must refuse (posture check SOCKET_GUARD_ABSENT)",
    ),
    "executor/state/pgconn.py": allow(
        DATABASE,
        reason="the shared store (EXECUTOR_STORE_URL): the pool of connections to the one "
        "PostgreSQL database; libpq connects natively, so the NetworkPolicy's egress to the "
        "database is what binds it",
    ),
    "executor/state/pgstore.py": allow(
        DATABASE,
        reason="the shared store's use store and window: statements on connections pgconn.py's "
        "pool opened; it opens none of its own",
    ),
    "executor/state/pgattempts.py": allow(
        DATABASE,
        reason="the shared store's attempts (issue 29): statements on connections pgconn.py's "
        "pool opened; it opens none of its own",
    ),
    "executor/state/pgschema.py": allow(
        DATABASE,
        reason="the shared store's migrations, run on a connection pgconn.py opened",
    ),
    "executor/state/lostwrites.py": allow(
        DATABASE,
        reason="the lost-writes check (issue 29): statements on a connection pgconn.py's pool "
        "opened and hands it (the server's identity, the grant claims it should hold); it opens "
        "none of its own",
    ),
    "executor/routes/listener.py": allow(
        LISTEN,
        reason="the executor's listener, and `agentsafe proxy`'s gateway behind it (server "
        "side, accepts only; no outbound connection)",
    ),
    "executor/supervisor.py": allow(
        SOCKET,
        reason="EXECUTOR_WORKERS' supervisor binds one SO_REUSEPORT socket (never listening, "
        "never connecting) that holds PORT=0's port for its workers' restarts; it serves nothing",
    ),
    # Not listed because they use none of the APIs: routes/app.py (builds the aiohttp application;
    # routes/listener.py binds it for plane.py), host/tlsctx.py and host/posture.py (build and
    # inspect SSLContexts only).
    # -- outside the executor process -----------------------------------------------------
    "executor/tools/synthetic.py": allow(
        LISTEN,
        reason="the synthetic provider: a test double that listens on loopback only, in tests "
        "or its own process, never inside the executor",
    ),
    "executor/tools/synthetic_bank.py": allow(
        LISTEN,
        reason="the synthetic core bank: a test double that listens on loopback only, in its "
        "own process, never inside the executor",
    ),
    "executor/tools/harness.py": allow(
        SOCKET,
        HTTP_CLIENT,
        reason="developer tooling that starts and drives provider and executor subprocesses "
        "on loopback (free ports, readiness polls); not part of the executor process",
    ),
    "executor/tools/demo.py": allow(
        HTTP_CLIENT,
        reason="`agentsafe demo`: drives loopback subprocesses as a caller would; not part of "
        "the executor process",
    ),
    "executor/client/_client.py": allow(
        HTTP_CLIENT,
        reason="agentsafe.client: the agent-side library an agent host imports to call the "
        "executor; its own package (pyproject package-dir), never imported by the server",
    ),
    "executor/tools/mcp_bridge.py": allow(
        LISTEN,
        reason="`agentsafe mcp --transport http`: the MCP bridge's own listener (uvicorn), its "
        "own process in front of an executor; every call goes out through agentsafe.client",
    ),
    "executor/tools/selftest.py": allow(
        HTTP_CLIENT,
        reason="`agentsafe test`: an agent calling a synthetic loopback target directly and "
        "through an executor it assembles on loopback; a command of its own, never in serve",
    ),
    "executor/tools/approvals_cli.py": allow(
        HTTP_CLIENT,
        reason="a person's command line calling an executor's approval routes; runs in its "
        "own short-lived process, not in the executor",
    ),
    "executor/tools/remote.py": allow(
        HTTP_CLIENT,
        reason="a person's command line (agentsafe status) calling an executor's control "
        "routes; runs in its own short-lived process, not in the executor",
    ),
    # -- the operator: its own process, which talks to the API server and to executors ----
    "operator/kubeapi.py": allow(
        KUBE,
        reason="the operator's Kubernetes API client (kubernetes_asyncio) and the login it "
        "shares with kopf; the operator's own process",
    ),
    "operator/control.py": allow(
        HTTP_CLIENT,
        reason="the operator's calls to executors' halt endpoints over TLS pinned to each "
        "executor's certificate",
    ),
    "operator/cli.py": allow(
        SOCKET,
        KUBE,
        reason="`agentsafe operator`: runs kopf (its watch connections) and reads "
        "socket.gethostname() for its peering identity",
    ),
    "operator/handlers.py": allow(
        KUBE,
        reason="kopf handlers; kopf posts their Events and patches to the API server",
    ),
    "operator/metrics.py": allow(
        LISTEN,
        reason="the operator's own /metrics (prometheus_client's server, accepts only; the "
        "chart's NetworkPolicy admits only the scraper to that port)",
    ),
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} ({self.kind})"


def _module_kind(name: str) -> str | None:
    for module, kind in _MODULES.items():
        if name == module or name.startswith(module + "."):
            return kind
    return None


_NAMED_FROM = ("asyncio", "ssl", "prometheus_client", "prometheus_client.exposition")
"""Modules whose network functions are matched when imported by name."""


def scan_source(source: str, path: str = "<source>") -> list[Finding]:
    """Every network use in ``source`` (see the module docstring for the kinds)."""
    tree = ast.parse(source, filename=path)
    found: list[Finding] = []
    aiohttp_names: set[str] = set()  # local names bound to the aiohttp module

    def note(node: ast.AST, kind: str, what: str) -> None:
        found.append(Finding(path, getattr(node, "lineno", 0), kind, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "aiohttp":
                    aiohttp_names.add(alias.asname or "aiohttp")
                kind = _module_kind(alias.name)
                if kind is not None:
                    note(node, kind, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            kind = _module_kind(node.module)
            if kind is not None:
                note(node, kind, f"from {node.module} import ...")
                continue
            for alias in node.names:
                sub = _SUBMODULES.get((node.module, alias.name))
                if sub is None and node.module == "aiohttp":
                    if alias.name in _AIOHTTP_CLIENT or alias.name in ("client", "connector"):
                        sub = HTTP_CLIENT
                    elif alias.name in _AIOHTTP_RESOLVERS:
                        sub = RESOLVE
                if sub is None and alias.name in _NAMES and node.module in _NAMED_FROM:
                    sub = _NAMES[alias.name]
                if sub is not None:
                    note(node, sub, f"from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (
                isinstance(base, ast.Name)
                and base.id in aiohttp_names
                and node.attr in _AIOHTTP_CLIENT
            ):
                note(node, HTTP_CLIENT, f"{base.id}.{node.attr}")
            elif node.attr in _NAMES:
                note(node, _NAMES[node.attr], f".{node.attr}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
                isinstance(func, ast.Attribute) and func.attr == "import_module"
            )
            first = node.args[0]
            if dynamic and isinstance(first, ast.Constant) and isinstance(first.value, str):
                kind = _module_kind(first.value)
                if kind is not None:
                    note(node, kind, f"dynamic import of {first.value}")
    return found


def modules() -> Iterator[Path]:
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


@functools.cache  # four tests read it; parsing every module once is enough
def findings_by_module() -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for path in modules():
        relative = path.relative_to(ROOT).as_posix()
        out[relative] = scan_source(path.read_text(encoding="utf-8"), relative)
    return out


OUTSIDE_THE_EXECUTOR = frozenset(
    {
        "executor/tools/synthetic.py",
        "executor/tools/synthetic_bank.py",
        "executor/tools/harness.py",
        "executor/tools/demo.py",
        "executor/tools/remote.py",
        "executor/tools/approvals_cli.py",
        "executor/tools/selftest.py",
        "executor/tools/mcp_bridge.py",
        "executor/client/_client.py",
    }
)
"""Modules of the executor package that never run inside ``agentsafe serve`` (checked below)."""


def _resolve_module(dotted: str) -> str | None:
    """``executor/x.py`` (or ``.../__init__.py``) for a module of this repository, else None."""
    parts = dotted.split(".")
    if parts[:1] == ["agentsafe"]:
        parts = parts[1:]
    if not parts or parts[0] not in SCANNED:
        return None
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(ROOT).as_posix()
    return None


def _imports_of(relative: str) -> set[str]:
    path = ROOT / relative
    package = relative.split("/")[:-1]  # the package a relative import starts from
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            found = _resolve_module(name)
            if found is not None:
                targets.add(found)
    return targets


def import_closure(start: str) -> set[str]:
    """Every repository module ``start`` can import, with the packages on the way."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        parts = current.split("/")
        for depth in range(1, len(parts)):
            init = "/".join(parts[:depth]) + "/__init__.py"
            if (ROOT / init).is_file():
                todo.append(init)
        todo.extend(_imports_of(current) - seen)
    return seen


# -- the rule --------------------------------------------------------------------------------


def test_network_use_is_confined_to_the_allowed_modules() -> None:
    violations = [
        str(finding)
        for path, found in findings_by_module().items()
        for finding in found
        if finding.kind not in ALLOWED.get(path, Allowance(frozenset(), "")).kinds
    ]
    assert violations == [], (
        "network use outside the allowed modules (route outbound HTTP through "
        "executor/egress/guard.py's GuardedClient, or add an entry to ALLOWED with a reason):\n"
        + "\n".join(violations)
    )


def test_every_allowance_is_still_needed() -> None:
    found = findings_by_module()
    stale = []
    for path, allowance in ALLOWED.items():
        used = {finding.kind for finding in found.get(path, [])}
        if path not in found:
            stale.append(f"{path}: no such module")
        elif allowance.kinds - used:
            stale.append(f"{path}: {sorted(allowance.kinds - used)} no longer used")
    assert stale == [], "remove what ALLOWED grants and nobody uses:\n" + "\n".join(stale)


def test_every_allowance_says_why() -> None:
    for path, allowance in ALLOWED.items():
        assert allowance.kinds, path
        assert len(allowance.reason) > 20, path


def test_the_executor_process_has_one_outbound_client() -> None:
    """What ``agentsafe serve`` can load reaches the network out only through the guard.

    The modules granted a client "outside the executor process" must really be outside it: none
    is reachable from ``executor/serve.py`` by its imports (lazy ones included).
    """
    loaded = import_closure("executor/serve.py")
    assert {
        "executor/egress/guard.py",
        "executor/host/audithook.py",
        "executor/routes/app.py",
    } <= loaded
    assert sorted(OUTSIDE_THE_EXECUTOR & loaded) == []
    found = findings_by_module()
    outbound = {
        path: sorted({f.kind for f in found[path]} & {HTTP_CLIENT, CONNECT, TLS, RESOLVE, KUBE})
        for path in sorted(loaded)
    }
    assert {path: kinds for path, kinds in outbound.items() if kinds} == {
        "executor/egress/guard.py": [HTTP_CLIENT, RESOLVE],
        "executor/host/audithook.py": [CONNECT],  # the probe the installed hook must refuse
    }


def test_every_client_outside_the_guard_is_outside_the_executor() -> None:
    for path, allowance in ALLOWED.items():
        if allowance.kinds & {HTTP_CLIENT, RESOLVE, KUBE} and path != "executor/egress/guard.py":
            assert path in OUTSIDE_THE_EXECUTOR or path.startswith("operator/"), path


def test_every_module_is_scanned() -> None:
    scanned = set(findings_by_module())
    assert "executor/egress/guard.py" in scanned
    assert "executor/plans/execute.py" in scanned  # subpackages too
    assert "operator/render/network.py" in scanned
    assert len(scanned) > 50


# -- the scanner itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("import socket", SOCKET),
        ("import socket as s", SOCKET),
        ("from socket import create_connection", SOCKET),
        ("import _socket", SOCKET),
        ("import http.client", HTTP_CLIENT),
        ("from http import client", HTTP_CLIENT),
        ("from http.client import HTTPSConnection", HTTP_CLIENT),
        ("import urllib.request", HTTP_CLIENT),
        ("from urllib import request", HTTP_CLIENT),
        ("from urllib.request import urlopen", HTTP_CLIENT),
        ("import requests", HTTP_CLIENT),
        ("import httpx", HTTP_CLIENT),
        ("from httpx import AsyncClient", HTTP_CLIENT),
        ("import urllib3", HTTP_CLIENT),
        ("import aiohttp\naiohttp.ClientSession()", HTTP_CLIENT),
        ("import aiohttp as a\na.TCPConnector()", HTTP_CLIENT),
        ("import aiohttp\naiohttp.request('GET', 'http://x')", HTTP_CLIENT),
        ("from aiohttp import ClientSession", HTTP_CLIENT),
        ("from aiohttp import client", HTTP_CLIENT),
        ("from aiohttp.client import ClientSession", HTTP_CLIENT),
        ("from aiohttp.connector import TCPConnector", HTTP_CLIENT),
        ("import asyncio\nasyncio.open_connection('h', 1)", CONNECT),
        ("from asyncio import open_connection", CONNECT),
        ("from prometheus_client import start_http_server", LISTEN),
        ("from prometheus_client.exposition import start_wsgi_server", LISTEN),
        ("import prometheus_client\nprometheus_client.start_http_server(9090)", LISTEN),
        ("loop.create_connection(f, 'h', 1)", CONNECT),
        ("loop.sock_connect(s, ('h', 1))", CONNECT),
        ("ctx.wrap_socket(sock)", TLS),
        ("import ssl\nssl.get_server_certificate(('h', 443))", TLS),
        ("asyncio.start_server(cb, 'h', 1)", LISTEN),
        ("web.TCPSite(runner, 'h', 1)", LISTEN),
        ("loop.getaddrinfo('h', 1)", RESOLVE),
        ("from aiohttp import ThreadedResolver", RESOLVE),
        ("import kopf", KUBE),
        ("from kubernetes_asyncio import client", KUBE),
        ("import importlib\nimportlib.import_module('httpx')", HTTP_CLIENT),
        ("__import__('socket')", SOCKET),
        ("def f():\n    import requests", HTTP_CLIENT),
    ],
)
def test_the_scanner_finds(source: str, kind: str) -> None:
    assert kind in {finding.kind for finding in scan_source(source)}


@pytest.mark.parametrize(
    "source",
    [
        "from aiohttp import web",
        "import aiohttp\naiohttp.ClientTimeout(total=1)",
        "from aiohttp.abc import AbstractResolver",
        "import ssl\nssl.create_default_context()",
        "from urllib.parse import quote",
        "import asyncio\nasyncio.sleep(0)",
        "import http\nhttp.HTTPStatus.OK",
        "from . import socket_names",
        "from .egress import GuardedClient",
        "client.request('GET', url)",
    ],
)
def test_the_scanner_passes(source: str) -> None:
    assert scan_source(source) == []
