"""What every reconcile step shares: the :class:`Runtime` and the readers of stored objects.

One :class:`Runtime` lives in kopf's ``memo`` for the operator's life (``cli.py`` builds it at
startup): the API client (:class:`~.kubeapi.Kube`), the operator's settings, where Events go,
the control-route client, the cluster's service-account JWKS, which :func:`refresh_jwks`
reads again on a timer, and the Secret watch's :class:`SecretListings` (which tells a re-list
from the first listing). Tests build one over an in-memory API stand-in.

The readers here turn a stored object into what the steps act on: :func:`policy_ref` (an
AgentPolicy's identity), :func:`parse_spec` (the ``spec`` re-validated through its model; an
object that does not validate is :class:`InvalidSpec` with the first error's path and message,
never the value) and :func:`decode_secret_key` (one key of a Secret, or ``None``).

Nothing here imports kopf: the kopf boundary (Events through kopf's queue, kopf's error types)
is ``handlers.py``.

Callers: ``handlers.py``, ``reconcile.py``, ``halt.py``, ``readiness.py``, ``cli.py``, the tests.
Also imported by ``admission.py``, ``lostwrites.py``, ``webhook_tls.py``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from .control import ControlClient
from .errors import OperatorError
from .kubeapi import ApiError, Kube
from .metrics import OperatorMetrics
from .render import PolicyRef
from .settings import OperatorSettings

__all__ = [
    "EventPoster",
    "EventType",
    "InvalidSpec",
    "Runtime",
    "SecretListings",
    "decode_secret_key",
    "generation_of",
    "parse_spec",
    "policy_ref",
    "refresh_jwks",
]

SpecT = TypeVar("SpecT", bound=BaseModel)


class EventType(StrEnum):
    """A Kubernetes Event's ``type``."""

    NORMAL = "Normal"
    WARNING = "Warning"


class EventPoster(Protocol):
    """Posts one Kubernetes Event about ``body``; its reason is a condition reason or type, or
    ``render.workload.WORKERS_WARNING``."""

    def post(
        self, body: Mapping[str, Any], *, type: EventType, reason: str, message: str
    ) -> None: ...


class SecretListings:
    """Tells the Secret watch's re-lists from its first listing, per namespace.

    kopf hands a listing's objects to event handlers with ``type`` ``None``, both at start and
    after the watch had to list again (a ``410 Gone``, a pause by peering): it never says which,
    and never reports a Secret deleted (or changed) while it was not watching, since a listing
    has no tombstones. The first listing needs nothing (every policy is reconciled by its own
    resume handler); a re-list must have every policy of the namespace read its Secrets again.
    A re-list shows itself as a listing event of a Secret this object has already seen listed
    in the current round: that one event starts a new round (:meth:`listed` answers ``True``)
    and the rest of that listing answers ``False``. A namespace whose every watched Secret went
    while the watch was down lists nothing and shows no re-list; each AgentPolicy's generated
    Secrets (labelled, recreated by its reconcile) keep that from a namespace with policies.
    """

    def __init__(self) -> None:
        self._round: dict[str, int] = {}
        self._listed_in: dict[str, int] = {}

    @staticmethod
    def _key(body: Mapping[str, Any]) -> tuple[str, str]:
        """(namespace, the Secret's uid; its namespace/name where a body carries none)."""
        meta = body.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        return namespace, str(meta.get("uid") or f"{namespace}/{meta.get('name')}")

    def listed(self, body: Mapping[str, Any]) -> bool:
        """One listing event (``type`` ``None``); ``True`` when it begins a re-list of its
        namespace."""
        namespace, uid = self._key(body)
        current = self._round.setdefault(namespace, 0)
        seen = self._listed_in.get(uid)
        if seen is not None and seen >= current:
            self._round[namespace] = current + 1
            self._listed_in[uid] = current + 1
            return True
        self._listed_in[uid] = current
        return False

    def watched(self, kind: str, body: Mapping[str, Any]) -> None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``): the Secret counts as listed
        in the current round (the next listing of it is a re-list), or is forgotten."""
        namespace, uid = self._key(body)
        if kind == "DELETED":
            self._listed_in.pop(uid, None)
        else:
            self._listed_in[uid] = self._round.setdefault(namespace, 0)


@dataclass
class Runtime:
    kube: Kube
    settings: OperatorSettings
    events: EventPoster
    control: ControlClient = field(default_factory=ControlClient)
    jwks: dict[str, Any] = field(default_factory=lambda: {"keys": []})
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    secret_listings: SecretListings = field(default_factory=SecretListings)


class InvalidSpec(OperatorError):
    """A stored object that does not validate against the model."""


def policy_ref(body: Mapping[str, Any]) -> PolicyRef:
    """The identity of a stored AgentPolicy (name, namespace, uid, generation)."""
    meta = body["metadata"]
    return PolicyRef(
        name=str(meta["name"]),
        namespace=str(meta["namespace"]),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 1),
    )


def generation_of(body: Mapping[str, Any]) -> int:
    """``metadata.generation`` of a stored object (1 when the API server has not set one)."""
    return int((body.get("metadata") or {}).get("generation") or 1)


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "spec"
    return f"spec.{where}: {first['msg']}"


def parse_spec(model: type[SpecT], body: Mapping[str, Any]) -> SpecT:
    """``body``'s ``spec`` through ``model``; :class:`InvalidSpec` if it does not validate."""
    try:
        return model.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        raise InvalidSpec(_validation_message(exc)) from None


def decode_secret_key(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    """The decoded value of ``key`` in a Secret, or ``None`` (no Secret, no key, not base64)."""
    if secret is None:
        return None
    value = (secret.get("data") or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return None


async def refresh_jwks(rt: Runtime) -> bool:
    """Read the service-account issuer's JWKS; ``True`` when it changed."""
    try:
        jwks = await rt.kube.get_json("/openid/v1/jwks")
    except ApiError:
        return False
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
        return False
    changed = jwks != rt.jwks
    rt.jwks = jwks
    return changed
