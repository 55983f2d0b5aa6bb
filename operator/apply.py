"""A small Kubernetes API client: server-side apply, get, create-once, list, delete.

Why not ``kubernetes_asyncio``: the operator needs seven verbs on a handful of resources, kopf
already knows how to log in (``kopf.login_with_service_account`` /
``kopf.login_with_kubeconfig`` give a :class:`kopf.ConnectionInfo`), and aiohttp is already a
dependency. :class:`KubeClient` is that: one ``aiohttp.ClientSession`` with the credentials kopf
found, paths from ``resources.py`` (so RBAC and the client cannot disagree), JSON in and out.
It takes the login as :class:`Credentials`, the fields of ``kopf.ConnectionInfo`` it reads, so
this module does not import kopf (``cli.py`` logs in, ``handlers.py`` is the kopf boundary).

Errors: an answer other than 2xx is :class:`ApiError` (status, reason, the API server's
message); ``handlers.to_kopf_error`` maps it to kopf's errors at the handler boundary.

:class:`Kube` is the protocol the reconcile steps depend on; tests pass an in-memory stand-in.

Callers: ``cli.py`` (:class:`KubeClient`), ``runtime.py`` and ``reconcile.py`` (:class:`Kube`),
``handlers.py``, ``halt.py`` and ``readiness.py`` (:class:`ApiError`), the tests.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import aiohttp

from .resources import resource_for

if TYPE_CHECKING:
    from _typeshed import StrOrBytesPath
from .settings import FIELD_MANAGER

__all__ = ["ApiError", "Credentials", "Kube", "KubeClient"]


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


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


class Credentials(Protocol):
    """What the client reads of a login; ``kopf.ConnectionInfo`` is one."""

    @property
    def server(self) -> str: ...
    @property
    def scheme(self) -> str | None: ...
    @property
    def token(self) -> str | None: ...
    @property
    def username(self) -> str | None: ...
    @property
    def password(self) -> str | None: ...
    @property
    def insecure(self) -> bool | None: ...
    @property
    def ca_path(self) -> StrOrBytesPath | None: ...
    @property
    def ca_data(self) -> str | bytes | None: ...
    @property
    def certificate_path(self) -> StrOrBytesPath | None: ...
    @property
    def private_key_path(self) -> StrOrBytesPath | None: ...


class KubeClient:
    """The real client over one aiohttp session (close it with :meth:`close`)."""

    def __init__(self, info: Credentials) -> None:
        self._server = info.server.rstrip("/")
        # /openid/v1/jwks answers 406 unless its own media type is acceptable.
        headers = {"Accept": "application/json, application/jwk-set+json"}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        context = ssl.create_default_context()
        if info.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if info.ca_path:
            context.load_verify_locations(cafile=info.ca_path)
        if info.ca_data:
            data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
            context.load_verify_locations(cadata=data)
        if info.certificate_path and info.private_key_path:
            context.load_cert_chain(info.certificate_path, info.private_key_path)
        auth = (
            aiohttp.BasicAuth(info.username, info.password or "")
            if info.username and not info.token
            else None
        )
        self._session = aiohttp.ClientSession(
            headers=headers,
            auth=auth,
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self._session.close()

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
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._session.request(
            method, self._server + path, data=data, params=params, headers=headers
        ) as response:
            text = await response.text()
            if response.status == 404 and missing_ok:
                return None
            if response.status >= 400:
                reason, message = response.reason or "", text[:500]
                try:
                    status = json.loads(text)
                    reason = str(status.get("reason", reason))
                    message = str(status.get("message", message))[:500]
                except ValueError:
                    pass
                raise ApiError(response.status, reason, message)
            return json.loads(text) if text else None

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
            body=obj,
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
                "POST", self._path(obj["kind"], obj["metadata"].get("namespace")), body=obj
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
        items: list[dict[str, Any]] = found.get("items", []) if found else []
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
