"""What every reconcile step shares: the :class:`Runtime` and the readers of stored objects.

One :class:`Runtime` lives in kopf's ``memo`` for the operator's life (``cli.py`` builds it at
startup): the API client (:class:`~.kubeapi.Kube`), the operator's settings, where Events go,
the control-route client and the cluster's service-account JWKS, which :func:`refresh_jwks`
reads again on a timer. Tests build one over an in-memory API stand-in.

The readers here turn a stored object into what the steps act on: :func:`policy_ref` (an
AgentPolicy's identity), :func:`parse_spec` (the ``spec`` re-validated through its model; an
object that does not validate is :class:`InvalidSpec` with the first error's path and message,
never the value) and :func:`decode_secret_key` (one key of a Secret, or ``None``).

Nothing here imports kopf: the kopf boundary (Events through kopf's queue, kopf's error types)
is ``handlers.py``.

Callers: ``handlers.py``, ``reconcile.py``, ``halt.py``, ``readiness.py``, ``cli.py``, the tests.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from .control import ControlClient
from .kubeapi import ApiError, Kube
from .metrics import OperatorMetrics
from .render import PolicyRef
from .settings import OperatorSettings

__all__ = [
    "EventPoster",
    "EventType",
    "InvalidSpec",
    "Runtime",
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


@dataclass
class Runtime:
    kube: Kube
    settings: OperatorSettings
    events: EventPoster
    control: ControlClient = field(default_factory=ControlClient)
    jwks: dict[str, Any] = field(default_factory=lambda: {"keys": []})
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)


class InvalidSpec(Exception):
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
