"""The operator's Kubernetes API client, over the official async client ``kubernetes_asyncio``.

Role: every call the reconcile steps make to the API server (server-side apply, get,
create-once, list, delete, status patches, the issuer's discovery documents) goes through
:class:`KubeClient`; :class:`Login` finds the operator's credentials for it and for kopf's own
watches (``cli.py`` turns them into a ``kopf.ConnectionInfo`` with :func:`connection_fields`).

Why ``kubernetes_asyncio`` (and not the ``kubernetes`` client with kopf's ``login_via_client``):
kopf's handlers are coroutines on kopf's event loop, and so are the calls they make. The sync
client would block that loop on every request (or need a thread per call), and
``login_via_client`` only hands kopf the token the sync client loaded once; it does nothing for
the operator's own calls. ``kubernetes_asyncio`` is the same project's loaders on an aiohttp
transport on the same loop: in a pod the projected service-account token (re-read from its
file), elsewhere the kubeconfig with everything kubectl's loader knows (``token``,
``tokenFile``, client certificates, ``exec`` credential plugins, the ``oidc`` auth-provider and
its refresh). What this module adds is one rule the library lacks: an answer 401 means the
credentials may have rotated (a projected token replaced by the kubelet, an exec plugin's token
expired), so :class:`KubeClient` loads them again through :class:`Login` (the token file read
again, the exec plugin run again) and retries that call once. A second 401, or credentials
that no longer load, is the caller's (``ApiError`` 401), and the next call tries a fresh login
again; never the same token forever.

Paths still come from ``resources.py`` (``ApiClient.call_api`` with the table's path), so the
resources the client can reach and the RBAC generated from the same table cannot disagree;
the typed per-kind API classes would be a second list of the same resources.

Server-side apply: ``PATCH`` with ``application/apply-patch+yaml``, the one field manager
(``settings.FIELD_MANAGER``, or the halt's own) and ``force=true``, as before.

Errors: an answer other than 2xx is :class:`ApiError` (status, reason, the API server's message,
never the request); ``handlers.to_kopf_error`` maps it to kopf's errors at the handler boundary.
:class:`CredentialsMissing` is a :class:`Login` that found nothing to load.

:class:`Kube` is the protocol the reconcile steps depend on; tests pass an in-memory stand-in.

Callers: ``cli.py`` (:class:`Login`, :class:`KubeClient`, :func:`connection_fields`),
``runtime.py`` and ``reconcile.py`` (:class:`Kube`), ``handlers.py``, ``halt.py`` and
``readiness.py`` (:class:`ApiError`), the tests.
Also imported by ``webhook_tls.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_HOST_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)
from kubernetes_asyncio.config.kube_config import load_kube_config

from .errors import OperatorError
from .resources import resource_for
from .settings import FIELD_MANAGER

__all__ = [
    "ApiError",
    "CredentialsMissing",
    "Kube",
    "KubeClient",
    "LoadedCredentials",
    "Login",
    "LoginFailed",
    "connection_fields",
]

REQUEST_TIMEOUT_SECONDS = 30.0
# /openid/v1/jwks answers 406 unless its own media type is acceptable.
_ACCEPT = "application/json, application/jwk-set+json"


class ApiError(OperatorError):
    """The API server refused a call (or answered something that is not JSON)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class LoginFailed(OperatorError):
    """The operator's credentials did not load: an exec plugin that fails, a kubeconfig that
    does not parse or lacks its context, an empty token file (the library's message, which
    names the file or plugin, never a credential).

    Hierarchy: :class:`CredentialsMissing` (nothing to load at all) is one.
    """


class CredentialsMissing(LoginFailed):
    """Neither a service account (in a pod) nor a kubeconfig to load credentials from."""


class Kube(Protocol):
    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]: ...

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...

    async def create(self, obj: Mapping[str, Any]) -> bool:
        """Create ``obj``; ``False`` (and nothing changed) when it already exists."""
        ...

    async def list_objects(
        self, kind: str, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]: ...

    async def delete(self, kind: str, namespace: str | None, name: str) -> None: ...

    async def get_json(self, path: str) -> Any: ...

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> None:
        """Merge-patch ``status``; with ``resource_version``, only over that version (else
        ``ApiError`` 409)."""
        ...


@dataclass(frozen=True)
class LoadedCredentials:
    """One load of the credentials: the client configuration, where it came from, and when an
    exec plugin said its token expires (``None``: not said)."""

    configuration: Any  # kubernetes_asyncio.client.Configuration
    source: str
    expires: datetime | None = None


@dataclass(frozen=True)
class Login:
    """Where the operator's credentials come from; :meth:`load` reads them afresh each call.

    In a pod (``KUBERNETES_SERVICE_HOST`` set and the token file present): the projected
    service-account token and CA at ``token_file``/``ca_file``. Elsewhere: ``kubeconfig``
    (``KUBECONFIG``, a list of paths merged as ``kubectl`` merges them, else
    ``~/.kube/config``) and its ``context`` (default: the current context).
    """

    environ: Mapping[str, str]
    token_file: Path = Path(SERVICE_TOKEN_FILENAME)
    ca_file: Path = Path(SERVICE_CERT_FILENAME)
    kubeconfig: str | None = None
    context: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Login:
        env = dict(os.environ if environ is None else environ)
        return cls(environ=env, kubeconfig=env.get("KUBECONFIG") or None)

    def in_cluster(self) -> bool:
        return bool(self.environ.get(SERVICE_HOST_ENV_NAME)) and self.token_file.is_file()

    def kubeconfig_paths(self) -> str | None:
        """The kubeconfig path(s) to load (``KUBECONFIG``'s list, or ``~/.kube/config``), or
        ``None`` when there is none."""
        if self.kubeconfig:
            return self.kubeconfig
        home = self.environ.get("HOME")
        default = (Path(home) if home else Path.home()) / ".kube" / "config"
        return str(default) if default.is_file() else None

    async def load(self) -> LoadedCredentials:
        """A fresh client configuration; :class:`CredentialsMissing` when there is nothing to
        load, :class:`LoginFailed` when what is there does not load."""
        try:
            return await self._load()
        except (ConfigException, yaml.YAMLError, OSError, ValueError, KeyError) as exc:
            # The library's own error, a kubeconfig that does not parse or lacks a key, a file
            # that went away: named by type and message (paths and keys, never a credential).
            raise LoginFailed(
                f"Kubernetes credentials did not load: {type(exc).__name__}: {exc}"
            ) from None

    async def _load(self) -> LoadedCredentials:
        configuration = Configuration()
        if self.in_cluster():
            InClusterConfigLoader(
                token_filename=str(self.token_file),
                cert_filename=str(self.ca_file),
                environ=dict(self.environ),
            ).load_and_set(configuration)
            return LoadedCredentials(configuration, "service account")
        paths = self.kubeconfig_paths()
        if paths is None:
            raise CredentialsMissing(
                "no Kubernetes credentials: run in a pod with a service account, "
                "or set KUBECONFIG (or ~/.kube/config)"
            )
        loader = await load_kube_config(
            config_file=paths, context=self.context, client_configuration=configuration
        )
        expires = getattr(loader, "exec_plugin_expiry", None)
        return LoadedCredentials(
            configuration, "kubeconfig", expires if isinstance(expires, datetime) else None
        )


def connection_fields(loaded: LoadedCredentials) -> dict[str, Any]:
    """The keyword arguments of ``kopf.ConnectionInfo`` for one load (this module does not
    import kopf; ``cli.py`` builds the object). The authorization header's scheme and token are
    split as kopf's own ``login_via_client`` does; ``expiration`` lets kopf log in again before
    an exec plugin's token expires (it also does after any 401)."""
    config = loaded.configuration
    header = str(config.api_key.get("BearerToken") or "")
    scheme, _, token = header.partition(" ") if " " in header else ("Bearer", "", header)
    return {
        "server": str(config.host),
        "ca_path": config.ssl_ca_cert or None,
        "insecure": not config.verify_ssl,
        "scheme": scheme if token else None,
        "token": token or None,
        "certificate_path": config.cert_file or None,
        "private_key_path": config.key_file or None,
        "expiration": loaded.expires,
    }


def _api_error(exc: ApiException) -> ApiError:
    status = int(exc.status or 0)
    reason, message = str(exc.reason or ""), ""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    if isinstance(body, str):
        message = body[:500]
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if isinstance(answer, dict):
            reason = str(answer.get("reason") or reason)
            message = str(answer.get("message") or message)[:500]
    return ApiError(status, reason, message)


class KubeClient:
    """The real client: one ``kubernetes_asyncio`` ``ApiClient`` for the credentials of the
    last login (close it with :meth:`close`). Build it with :meth:`connect`."""

    def __init__(self, login: Login, loaded: LoadedCredentials) -> None:
        self._login = login
        self._api = ApiClient(configuration=loaded.configuration)
        self._retired: list[Any] = []
        self._lock = asyncio.Lock()
        self.logins = 1
        """How many times credentials were loaded (1 at connect; +1 per 401 that reloaded)."""

    @classmethod
    async def connect(cls, login: Login) -> KubeClient:
        return cls(login, await login.load())

    async def close(self) -> None:
        for api in (*self._retired, self._api):
            await api.close()
        self._retired.clear()

    async def _relogin(self, failed: Any) -> None:
        """Load the credentials again after ``failed`` (the client that got the 401), unless
        another call already did. The previous client is closed at the next login (its calls
        have long finished by then: every call has a timeout) or at :meth:`close`."""
        async with self._lock:
            if self._api is not failed:
                return
            loaded = await self._login.load()
            for api in self._retired:
                await api.close()
            self._retired = [self._api]
            self._api = ApiClient(configuration=loaded.configuration)
            self.logins += 1

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> Any:
        for attempt in (1, 2):
            api = self._api
            try:
                headers = {"Accept": _ACCEPT}
                if body is not None:
                    headers["Content-Type"] = content_type
                return await api.call_api(
                    path,
                    method,
                    query_params=list((params or {}).items()),
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                    response_types_map={200: "object", 201: "object", 202: "object"},
                    _return_http_data_only=True,
                    _request_timeout=REQUEST_TIMEOUT_SECONDS,
                )
            except ApiException as exc:
                if exc.status == 404 and missing_ok:
                    return None
                if exc.status == 401 and attempt == 1:
                    try:
                        await self._relogin(api)
                    except LoginFailed as failed:
                        # Still a refusal for the steps (their one error type): kopf retries.
                        raise ApiError(401, "Unauthorized", str(failed)[:500]) from None
                    continue
                raise _api_error(exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _path(kind: str, namespace: str | None, name: str | None = None) -> str:
        return resource_for(kind).path(namespace, quote(name, safe="") if name else None)

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        path = self._path(obj["kind"], meta.get("namespace"), meta["name"])
        result: dict[str, Any] = await self._call(
            "PATCH",
            path,
            body=dict(obj),
            params={"fieldManager": field_manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )
        return result

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = await self._call(
            "GET", self._path(kind, namespace, name), missing_ok=True
        )
        return found

    async def create(self, obj: Mapping[str, Any]) -> bool:
        try:
            await self._call(
                "POST", self._path(obj["kind"], obj["metadata"].get("namespace")), body=dict(obj)
            )
        except ApiError as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return False
            raise
        return True

    async def list_objects(
        self, kind: str, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        found = await self._call("GET", self._path(kind, namespace), params=params)
        items: list[dict[str, Any]] = found.get("items") or [] if found else []
        return items

    async def delete(self, kind: str, namespace: str | None, name: str) -> None:
        await self._call("DELETE", self._path(kind, namespace, name), missing_ok=True)

    async def get_json(self, path: str) -> Any:
        return await self._call("GET", path)

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> None:
        """Merge-patch the status subresource (for status written outside the object's own
        handler, e.g. an AgentPolicy re-rendered because a Principal changed). A
        ``resource_version`` in the patch makes it conditional: the API server answers 409
        when the object changed since that version."""
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        await self._call(
            "PATCH",
            self._path(kind, namespace, name) + "/status",
            body=body,
            content_type="application/merge-patch+json",
        )
