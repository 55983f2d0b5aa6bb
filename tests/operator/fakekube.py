"""An in-memory stand-in for the Kubernetes API (``agentsafe.operator.kubeapi.Kube``).

Not a Kubernetes: it stores objects by (kind, namespace, name), implements server-side apply
as "replace the fields this manager gave" at the top level of ``data`` for ConfigMaps (enough to
show that two field managers do not clear each other's keys) and as a whole-object replace
otherwise, and records every call. Like the API server it stamps ``metadata.resourceVersion``
on every write that changes an object (a status patch given an older one is a 409 Conflict) and
``metadata.generation`` on objects with a ``spec`` (moved when the spec changes), and it refuses
a status write its resource's status model does not validate, or whose conditions carry a type or
reason outside the operator's registry (:func:`check_status`). Tests that
assign into :attr:`FakeKube.objects` directly bypass both, as an edit the API never saw. The
real API server is exercised by the end-to-end suite.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from agentsafe.operator.kubeapi import ApiError
from agentsafe.operator.models import (
    AgentPolicyStatus,
    ConditionReason,
    ConditionType,
    HaltSwitchStatus,
    PrincipalStatus,
)
from agentsafe.operator.settings import FIELD_MANAGER

Key = tuple[str, str | None, str]

STATUS_MODELS: dict[str, type[BaseModel]] = {
    "AgentPolicy": AgentPolicyStatus,
    "Principal": PrincipalStatus,
    "HaltSwitch": HaltSwitchStatus,
}


def check_status(kind: str, status: Mapping[str, Any]) -> None:
    """``status`` (a whole status or a merge patch of one) is what ``kind``'s status model
    accepts, and every condition's type and reason is one the operator registers."""
    STATUS_MODELS[kind].model_validate(status)
    for condition in status.get("conditions") or []:
        assert condition["type"] in set(ConditionType), condition
        assert condition["reason"] in set(ConditionReason), condition


class FakeKube:
    """Stand-in for the API server: objects in a dict, calls in a list."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str | None, str | None]] = []
        self.fail_next: ApiError | None = None
        self.json_paths: dict[str, Any] = {}
        self._owned_keys: dict[tuple[Key, str], set[str]] = {}
        self._version = 0

    def _stamp(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._version)

    def put(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        stored = copy.deepcopy(dict(obj))
        self._stamp(stored)
        self.objects[(obj["kind"], meta.get("namespace"), meta["name"])] = stored

    def _maybe_fail(self) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        self._maybe_fail()
        meta = obj["metadata"]
        key: Key = (obj["kind"], meta.get("namespace"), meta["name"])
        self.calls.append(
            ("apply:" + field_manager, obj["kind"], meta.get("namespace"), meta["name"])
        )
        current = self.objects.get(key)
        if obj["kind"] == "ConfigMap":
            merged = (
                copy.deepcopy(current)
                if current
                else {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": meta["name"], "namespace": meta.get("namespace")},
                }
            )
            data = dict(merged.get("data") or {})
            for old_key in self._owned_keys.get((key, field_manager), set()):
                data.pop(old_key, None)
            given = dict(obj.get("data") or {})
            data.update(given)
            self._owned_keys[(key, field_manager)] = set(given)
            merged["data"] = data
            for field in ("labels", "ownerReferences"):
                if field in meta:
                    merged["metadata"][field] = copy.deepcopy(meta[field])
            stored = merged
        else:
            stored = copy.deepcopy(dict(obj))
            if current is not None and "status" in current:
                stored["status"] = current["status"]
            if "spec" in stored:
                generation = int((current or {}).get("metadata", {}).get("generation") or 0)
                if current is None or current.get("spec") != stored["spec"]:
                    generation += 1
                stored["metadata"]["generation"] = generation
        if current is not None:
            stored["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        if stored != current:
            self._stamp(stored)
        self.objects[key] = stored
        return copy.deepcopy(stored)

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        self._maybe_fail()
        self.calls.append(("get", kind, namespace, name))
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create(self, obj: Mapping[str, Any]) -> bool:
        self._maybe_fail()
        meta = obj["metadata"]
        key: Key = (obj["kind"], meta.get("namespace"), meta["name"])
        self.calls.append(("create", obj["kind"], meta.get("namespace"), meta["name"]))
        if key in self.objects:
            return False
        stored = copy.deepcopy(dict(obj))
        self._stamp(stored)
        self.objects[key] = stored
        return True

    async def list_objects(
        self, kind: str, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        self._maybe_fail()
        wanted: dict[str, str] = {}
        for part in (label_selector or "").split(","):
            if part:
                k, _, v = part.partition("=")
                wanted[k] = v
        out = []
        for (k, ns, _), obj in sorted(self.objects.items(), key=lambda kv: str(kv[0])):
            if k != kind or (namespace is not None and ns != namespace):
                continue
            labels = obj.get("metadata", {}).get("labels") or {}
            if all(labels.get(a) == b for a, b in wanted.items()):
                out.append(copy.deepcopy(obj))
        return out

    async def delete(self, kind: str, namespace: str | None, name: str) -> None:
        self._maybe_fail()
        self.calls.append(("delete", kind, namespace, name))
        self.objects.pop((kind, namespace, name), None)

    async def get_json(self, path: str) -> Any:
        self._maybe_fail()
        if path not in self.json_paths:
            raise ApiError(404, "NotFound", "no such path")
        return copy.deepcopy(self.json_paths[path])

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> None:
        self._maybe_fail()
        check_status(kind, status)
        self.calls.append(("patch_status", kind, namespace, name))
        stored = self.objects.get((kind, namespace, name))
        if stored is None:
            raise ApiError(404, "NotFound", f"{kind} {namespace}/{name} not found")
        current = stored["metadata"].get("resourceVersion")
        if resource_version is not None and resource_version != current:
            raise ApiError(409, "Conflict", "the object has been modified")
        stored.setdefault("status", {}).update(copy.deepcopy(dict(status)))
        self._stamp(stored)

    async def close(self) -> None:
        return None


class RecordingEvents:
    """Stand-in for kopf's event queue: keeps (type, reason, message)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, body: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        self.posted.append((type, reason, message))
