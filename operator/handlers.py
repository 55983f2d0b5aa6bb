"""kopf handlers: thin wrappers that parse, render, apply and report.

Each handler re-validates the stored object through the models (a stored object that does not
validate is a ``kopf.PermanentError`` with a ``Ready=False``/``SpecInvalid`` condition), calls
the pure ``render_*`` functions, applies the result with server-side apply, writes status
conditions and posts Events. API errors become ``kopf.TemporaryError`` (409, 429, 5xx) or
``kopf.PermanentError`` (other refusals), through :func:`~.apply.to_kopf_error`.

- AgentPolicy: create/update/resume and a timer (drift repair) run :func:`reconcile_policy`;
  delete removes the NetworkPolicies it placed in agent namespaces (owner references cannot
  cross namespaces; everything else is garbage-collected through them).
- Principal: any change re-renders the AgentPolicies that select it (before and after).
- HaltSwitch: create/update/resume/delete run :func:`enforce_halt` (which also refreshes the
  selected policies' ``Ready``/``halted``); a timer retries pods that did not acknowledge.
- Executor StatefulSets (the ones the renderer labels): every watch event runs
  :func:`refresh_ready`, which recomputes the owning AgentPolicy's ``Ready`` with the same
  decision as the reconcile (``readiness.py``) and patches only that; it never renders or
  applies (the timer repairs drift).

Everything the handlers need lives in one :class:`Runtime` in kopf's ``memo``; tests build one
with an in-memory API stand-in and call the handler functions directly.

Callers: ``cli.py`` (through :func:`build_registry`), the tests.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import kopf
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from .apply import ApiError, Kube, to_kopf_error
from .conditions import now_rfc3339, set_condition
from .halt import (
    ControlClient,
    ControlResult,
    executor_endpoints,
    halt_document,
    render_halt_configmap,
    switches_halting,
    trust_context,
)
from .models import GROUP, VERSION, AgentPolicySpec, HaltSwitchSpec, PrincipalSpec
from .readiness import executor_readiness, owning_policy, readiness_status, set_ready
from .render import (
    PolicyRef,
    RenderError,
    RenderInput,
    SelectedPrincipal,
    check_policy,
    names,
    render_authority_key_secret,
    render_children,
    render_operator_token_secret,
)
from .render.common import EXECUTOR_COMPONENT, MANAGED_BY, OWNER_LABEL
from .render.config import OPERATOR_TOKEN_KEY
from .settings import HALT_FIELD_MANAGER, OperatorSettings

__all__ = [
    "EventPoster",
    "KopfEvents",
    "Runtime",
    "build_registry",
    "enforce_halt",
    "reconcile_policy",
    "refresh_jwks",
    "refresh_ready",
    "statefulset_handler",
]


class EventPoster(Protocol):
    def post(self, body: Mapping[str, Any], *, type: str, reason: str, message: str) -> None: ...


class KopfEvents:
    """Posts Kubernetes Events through kopf's queue (only inside a running operator)."""

    def post(self, body: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
        raw: Any = dict(body)
        kopf.event(kopf.Body(raw), type=type, reason=reason, message=message[:1024])


@dataclass
class Runtime:
    kube: Kube
    settings: OperatorSettings
    events: EventPoster = field(default_factory=KopfEvents)
    control: ControlClient = field(default_factory=ControlClient)
    jwks: dict[str, Any] = field(default_factory=lambda: {"keys": []})


class InvalidSpec(Exception):
    """A stored object that does not validate against the model."""


def _ref(body: Mapping[str, Any]) -> PolicyRef:
    meta = body["metadata"]
    return PolicyRef(
        name=str(meta["name"]),
        namespace=str(meta["namespace"]),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 1),
    )


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "spec"
    return f"spec.{where}: {first['msg']}"


def _parse(model: type[Any], body: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        raise InvalidSpec(_validation_message(exc)) from None


def _decode(secret: Mapping[str, Any], key: str) -> bytes | None:
    value = (secret.get("data") or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# AgentPolicy


async def _check_references(kube: Kube, namespace: str, spec: AgentPolicySpec) -> list[str]:
    """Referenced Secrets and ConfigMaps (and keys) that do not exist, by name."""
    missing: list[str] = []
    wanted: list[tuple[str, str, str]] = [
        ("Secret", spec.tls.secret_name, "tls.crt"),
        ("Secret", spec.tls.secret_name, "tls.key"),
        (
            "Secret",
            spec.downstream.credential.secret_key_ref.name,
            spec.downstream.credential.secret_key_ref.key,
        ),
    ]
    if spec.downstream.ca is not None:
        wanted.append(("ConfigMap", spec.downstream.ca.name, spec.downstream.ca.key))
    if spec.tls.client_ca is not None:
        wanted.append(("ConfigMap", spec.tls.client_ca.name, spec.tls.client_ca.key))
    cache: dict[tuple[str, str], dict[str, Any] | None] = {}
    for kind, name, key in wanted:
        if (kind, name) not in cache:
            cache[(kind, name)] = await kube.get(kind, namespace, name)
        found = cache[(kind, name)]
        if found is None:
            text = f"{kind} {namespace}/{name}"
        elif key not in (found.get("data") or {}):
            text = f"{kind} {namespace}/{name} (key {key})"
        else:
            continue
        if text not in missing:
            missing.append(text)
    return missing


async def _select_principals(
    kube: Kube, ref: PolicyRef, spec: AgentPolicySpec
) -> tuple[list[SelectedPrincipal], list[str], list[str]]:
    """(selected principals, missing references, invalid principal names)."""
    selected: list[SelectedPrincipal] = []
    missing: list[str] = []
    invalid: list[str] = []
    for item in await kube.list_objects("Principal", ref.namespace):
        meta = item.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if not spec.principal_selector.matches(meta.get("labels")):
            continue
        name = str(meta["name"])
        try:
            pspec = PrincipalSpec.model_validate(item.get("spec") or {})
        except ValidationError:
            invalid.append(name)
            continue
        digest: str | None = None
        if pspec.bearer is not None:
            sref = pspec.bearer.secret_key_ref
            secret = await kube.get("Secret", ref.namespace, sref.name)
            token = _decode(secret, sref.key) if secret is not None else None
            if not token:
                missing.append(f"Secret {ref.namespace}/{sref.name} (key {sref.key})")
                continue
            digest = hashlib.sha256(token).hexdigest()
        selected.append(SelectedPrincipal(name=name, spec=pspec, token_sha256=digest))
    return selected, missing, invalid


async def _operator_token(kube: Kube, inp: RenderInput) -> str:
    """The operator's bearer token for this policy: generated once, then read back."""
    name = names(inp.policy).operator_token
    secret = await kube.get("Secret", inp.policy.namespace, name)
    if secret is None:
        await kube.create(render_operator_token_secret(inp, secrets.token_urlsafe(32)))
        secret = await kube.get("Secret", inp.policy.namespace, name)
    token = _decode(secret, OPERATOR_TOKEN_KEY) if secret is not None else None
    if not token:
        raise RenderError("SecretMissing", f"Secret {inp.policy.namespace}/{name} has no token")
    return token.decode("ascii")


async def _ensure_authority_key(kube: Kube, inp: RenderInput) -> None:
    name = names(inp.policy).authority_key
    if await kube.get("Secret", inp.policy.namespace, name) is None:
        await kube.create(render_authority_key_secret(inp, Ed25519PrivateKey.generate()))


async def _prune_agent_policies(kube: Kube, ref: PolicyRef, keep: set[tuple[str, str]]) -> None:
    selector = f"{OWNER_LABEL}={ref.owner_key}"
    for item in await kube.list_objects("NetworkPolicy", None, label_selector=selector):
        meta = item["metadata"]
        if (meta["namespace"], meta["name"]) not in keep:
            await kube.delete("NetworkPolicy", meta["namespace"], meta["name"])


async def sync_halt(
    rt: Runtime,
    ref: PolicyRef,
    labels: Mapping[str, str] | None,
    *,
    switches: list[dict[str, Any]] | None = None,
) -> bool:
    """Apply (or remove) the policy's halt key from the HaltSwitches; returns halted."""
    if switches is None:
        switches = await rt.kube.list_objects("HaltSwitch", ref.namespace)
    halting = switches_halting(switches, labels)
    await rt.kube.apply(
        render_halt_configmap(ref, halt_document(halting)), field_manager=HALT_FIELD_MANAGER
    )
    return bool(halting)


@dataclass(frozen=True)
class PolicyOutcome:
    status: dict[str, Any]
    event_type: str
    reason: str
    message: str


async def reconcile_policy(rt: Runtime, body: Mapping[str, Any]) -> PolicyOutcome:
    """Render and apply everything one AgentPolicy becomes; the status to write.

    Raises :class:`InvalidSpec` for a stored object that does not validate, ``ApiError`` for
    the API server's refusals. A ``RenderError`` (invalid policy, missing Secret, principals
    or configuration the executor would refuse) leaves every child untouched and is reported
    as ``Ready=False`` with its reason.
    """
    ref = _ref(body)
    previous = list((body.get("status") or {}).get("conditions") or [])
    spec: AgentPolicySpec = _parse(AgentPolicySpec, body)
    labels = (body.get("metadata") or {}).get("labels")
    inp = RenderInput(policy=ref, spec=spec, settings=rt.settings, jwks=rt.jwks)
    status: dict[str, Any] = {
        "observedGeneration": ref.generation,
        "mode": spec.mode.value,
        "replicas": spec.replicas,
        "audience": inp.audience,
    }
    try:
        check_policy(inp)
        missing = await _check_references(rt.kube, ref.namespace, spec)
        selected, missing_p, invalid = await _select_principals(rt.kube, ref, spec)
        missing += [m for m in missing_p if m not in missing]
        if missing:
            raise RenderError("SecretMissing", "missing: " + ", ".join(missing))
        if invalid:
            raise RenderError(
                "PrincipalsInvalid", "Principals that do not validate: " + ", ".join(invalid)
            )
        inp = replace(inp, principals=tuple(selected))
        await _ensure_authority_key(rt.kube, inp)
        token = await _operator_token(rt.kube, inp)
        inp = replace(inp, operator_token_sha256=hashlib.sha256(token.encode()).hexdigest())
        rendered = render_children(inp)
    except RenderError as exc:
        status["halted"] = await sync_halt(rt, ref, labels)
        conditions = set_condition(
            previous,
            type="Reconciled",
            status=False,
            reason=exc.reason,
            message=exc.message,
            generation=ref.generation,
        )
        status["conditions"] = set_condition(
            conditions,
            type="Ready",
            status=False,
            reason=exc.reason,
            message=exc.message,
            generation=ref.generation,
        )
        return PolicyOutcome(status, "Warning", exc.reason, exc.message)

    keep: set[tuple[str, str]] = set()
    for obj in rendered.objects:
        await rt.kube.apply(obj)
        if obj["kind"] == "NetworkPolicy":
            keep.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
    await _prune_agent_policies(rt.kube, ref, keep)
    halted = await sync_halt(rt, ref, labels)
    sts = await rt.kube.get("StatefulSet", ref.namespace, names(ref).executor)
    message = f"{len(rendered.objects)} objects applied; {len(rendered.principals)} principals"
    conditions = set_condition(
        previous,
        type="Reconciled",
        status=True,
        reason="Applied",
        message=message,
        generation=ref.generation,
    )
    readiness = executor_readiness(desired_replicas=spec.replicas, statefulset=sts, halted=halted)
    status.update(
        halted=halted,
        principals=list(rendered.principals),
        policyDigest=rendered.policy_digest,
        conditions=set_ready(conditions, readiness, generation=ref.generation),
    )
    return PolicyOutcome(status, "Normal", "Reconciled", message)


READY_PATCH_ATTEMPTS = 3
"""Optimistic-concurrency retries of one readiness patch (409: the policy changed meanwhile)."""


async def refresh_ready(
    rt: Runtime,
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    halted: bool | None = None,
) -> bool:
    """Recompute one AgentPolicy's ``Ready`` (and ``halted``) from its executor StatefulSet and
    the HaltSwitches, and patch only those status fields; ``True`` when it patched.

    Never renders or applies anything: a policy whose children were not applied for its
    current generation is left to its own handlers (see :func:`.readiness_status`). ``uid``
    (from a child's owner reference) skips a policy recreated under the same name; ``halted``
    is given by the HaltSwitch handler, which already knows it. The patch carries the policy's
    ``resourceVersion``, so it never overwrites a status written meanwhile: on 409 everything
    is read again.
    """
    for attempt in range(READY_PATCH_ATTEMPTS):
        policy = await rt.kube.get("AgentPolicy", namespace, name)
        if policy is None or (uid is not None and policy["metadata"].get("uid") != uid):
            return False
        try:
            spec = AgentPolicySpec.model_validate(policy.get("spec") or {})
        except ValidationError:
            return False  # its own handler reports SpecInvalid
        ref = _ref(policy)
        if halted is None:
            switches = await rt.kube.list_objects("HaltSwitch", namespace)
            halting = bool(switches_halting(switches, policy["metadata"].get("labels")))
        else:
            halting = halted
        sts = await rt.kube.get("StatefulSet", namespace, names(ref).executor)
        readiness = executor_readiness(
            desired_replicas=spec.replicas, statefulset=sts, halted=halting
        )
        status = readiness_status(policy, readiness)
        if status is None:
            return False
        try:
            await rt.kube.patch_status(
                "AgentPolicy",
                namespace,
                name,
                status,
                resource_version=policy["metadata"].get("resourceVersion"),
            )
        except ApiError as exc:
            if exc.status == 409 and attempt + 1 < READY_PATCH_ATTEMPTS:
                continue
            raise
        if _changed(policy, status):
            rt.events.post(
                policy,
                type="Normal" if readiness.ready else "Warning",
                reason=readiness.reason,
                message=readiness.message,
            )
        return True
    return False  # pragma: no cover - the loop returns or raises


async def statefulset_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Any event of an executor StatefulSet (status included) refreshes its owner's Ready."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    owner = owning_policy(data)
    namespace = (data.get("metadata") or {}).get("namespace")
    if owner is None or not namespace:
        return
    try:
        await refresh_ready(rt, str(namespace), owner.name, uid=owner.uid)
    except ApiError as exc:
        raise to_kopf_error(exc) from None


def _invalid_status(body: Mapping[str, Any], message: str) -> dict[str, Any]:
    generation = int((body.get("metadata") or {}).get("generation") or 1)
    previous = list((body.get("status") or {}).get("conditions") or [])
    return {
        "observedGeneration": generation,
        "conditions": set_condition(
            previous,
            type="Ready",
            status=False,
            reason="SpecInvalid",
            message=message,
            generation=generation,
        ),
    }


async def policy_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """create / update / resume / timer of an AgentPolicy."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    try:
        outcome = await reconcile_policy(rt, data)
    except InvalidSpec as exc:
        patch.status.update(_invalid_status(data, str(exc)))
        rt.events.post(data, type="Warning", reason="SpecInvalid", message=str(exc))
        raise kopf.PermanentError(str(exc)) from None
    except ApiError as exc:
        raise to_kopf_error(exc) from None
    patch.status.update(outcome.status)
    if outcome.event_type == "Warning" or _changed(data, outcome.status):
        rt.events.post(
            data, type=outcome.event_type, reason=outcome.reason, message=outcome.message
        )


def _changed(body: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Post a Normal event only when the Ready condition moves (the timer runs every minute)."""

    def ready(conditions: Any) -> Any:
        return next((c.get("status") for c in conditions or [] if c.get("type") == "Ready"), None)

    old = ready((body.get("status") or {}).get("conditions"))
    return bool(old != ready(status.get("conditions")))


async def policy_delete_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Remove what owner references cannot reach: agent-namespace NetworkPolicies."""
    rt: Runtime = memo["runtime"]
    try:
        await _prune_agent_policies(rt.kube, _ref(dict(body)), keep=set())
    except ApiError as exc:
        raise to_kopf_error(exc) from None


async def _rereconcile(rt: Runtime, policy: Mapping[str, Any]) -> None:
    """Re-render a policy from another object's handler and write its status directly."""
    try:
        outcome = await reconcile_policy(rt, policy)
        status = outcome.status
    except InvalidSpec as exc:
        status = _invalid_status(policy, str(exc))
    meta = policy["metadata"]
    await rt.kube.patch_status("AgentPolicy", meta["namespace"], meta["name"], status)


# --------------------------------------------------------------------------------------------
# Principal


async def principal_handler(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, old: Any = None, **_: Any
) -> None:
    """Any change of a Principal re-renders every AgentPolicy that selected or selects it."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    meta = data["metadata"]
    deleting = bool(meta.get("deletionTimestamp"))
    generation = int(meta.get("generation") or 1)
    try:
        spec: PrincipalSpec = _parse(PrincipalSpec, data)
    except InvalidSpec as exc:
        patch.status.update(_invalid_status(data, str(exc)))
        rt.events.post(data, type="Warning", reason="SpecInvalid", message=str(exc))
        raise kopf.PermanentError(str(exc)) from None
    old_labels = (
        ((old or {}).get("metadata") or {}).get("labels") if isinstance(old, Mapping) else None
    )
    try:
        policies = await rt.kube.list_objects("AgentPolicy", meta["namespace"])
        selecting: list[str] = []
        for policy in policies:
            try:
                pspec = AgentPolicySpec.model_validate(policy.get("spec") or {})
            except ValidationError:
                continue
            now_selected = pspec.principal_selector.matches(meta.get("labels"))
            was_selected = old_labels is not None and pspec.principal_selector.matches(old_labels)
            if now_selected and not deleting:
                selecting.append(policy["metadata"]["name"])
            if now_selected or was_selected:
                await _rereconcile(rt, policy)
    except ApiError as exc:
        raise to_kopf_error(exc) from None
    if deleting:
        return
    previous = list((data.get("status") or {}).get("conditions") or [])
    patch.status.update(
        {
            "observedGeneration": generation,
            "credential": spec.credential_kind(),
            "policies": len(selecting),
            "selectedBy": sorted(selecting),
            "conditions": set_condition(
                previous,
                type="Ready",
                status=True,
                reason="Rendered",
                message=f"selected by {len(selecting)} AgentPolicies",
                generation=generation,
            ),
        }
    )


# --------------------------------------------------------------------------------------------
# HaltSwitch


async def _control_policy(
    rt: Runtime, ref: PolicyRef, spec: AgentPolicySpec, *, action: str, reason: str
) -> list[ControlResult]:
    n = names(ref)
    slices = await rt.kube.list_objects(
        "EndpointSlice", ref.namespace, label_selector=f"kubernetes.io/service-name={n.service}"
    )
    endpoints = executor_endpoints(slices)
    if not endpoints:
        return []
    token_secret = await rt.kube.get("Secret", ref.namespace, n.operator_token)
    tls_secret = await rt.kube.get("Secret", ref.namespace, spec.tls.secret_name)
    token = _decode(token_secret, OPERATOR_TOKEN_KEY) if token_secret else None
    ca = _decode(tls_secret, "ca.crt") if tls_secret else None
    cert = _decode(tls_secret, "tls.crt") if tls_secret else None
    if not token or not (ca or cert):
        return [
            ControlResult(e.pod, False, "operator token or executor certificate missing")
            for e in endpoints
        ]
    context = trust_context(
        ca_pem=ca.decode() if ca else None, certificate_pem=cert.decode() if cert else None
    )
    return await rt.control.call_all(
        endpoints,
        action=action,
        reason=reason,
        token=token.decode("ascii"),
        port=rt.settings.port,
        server_hostname=f"{n.service}.{ref.namespace}.svc",
        context=context,
    )


async def enforce_halt(
    rt: Runtime, body: Mapping[str, Any], *, deleting: bool = False
) -> dict[str, Any]:
    """Write every policy's halt key from the namespace's HaltSwitches, then call halt or
    resume on each selected policy's executors; returns the HaltSwitch's status."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    generation = int(meta.get("generation") or 1)
    spec: HaltSwitchSpec = _parse(HaltSwitchSpec, body)
    switches = [
        s
        for s in await rt.kube.list_objects("HaltSwitch", namespace)
        if s["metadata"]["name"] != name
    ]
    if not deleting:
        switches.append(dict(body))
    halting_action = spec.halted and not deleting
    action = "halt" if halting_action else "resume"
    reason = spec.reason or f"HaltSwitch {name} released"
    pods: list[dict[str, Any]] = []
    selected: list[str] = []
    at = now_rfc3339()
    halted_now: list[tuple[PolicyRef, bool]] = []
    for policy in await rt.kube.list_objects("AgentPolicy", namespace):
        ref = _ref(policy)
        labels = policy["metadata"].get("labels")
        still_halted = await sync_halt(rt, ref, labels, switches=switches)
        halted_now.append((ref, still_halted))
        if not spec.policy_selector.matches(labels):
            continue
        selected.append(ref.name)
        try:
            pspec = AgentPolicySpec.model_validate(policy.get("spec") or {})
        except ValidationError:
            continue
        if not halting_action and still_halted:
            continue  # another HaltSwitch still holds this policy: no resume
        for result in await _control_policy(rt, ref, pspec, action=action, reason=reason):
            entry: dict[str, Any] = {
                "policy": ref.name,
                "pod": result.pod,
                "acknowledged": result.acknowledged,
            }
            if result.acknowledged:
                entry["at"] = at
            if result.error:
                entry["error"] = result.error
            pods.append(entry)
    # After every control call (a halt must not wait on bookkeeping): each policy's Ready and
    # Halted now, not at its next reconcile. Best effort: the policy's timer repairs it.
    for ref, still_halted in halted_now:
        with contextlib.suppress(ApiError):
            await refresh_ready(rt, ref.namespace, ref.name, uid=ref.uid, halted=still_halted)
    acked = sum(1 for p in pods if p["acknowledged"])
    previous = list((body.get("status") or {}).get("conditions") or [])
    all_acked = acked == len(pods)
    return {
        "observedGeneration": generation,
        "halted": halting_action,
        "policies": sorted(selected),
        "pods": pods,
        "acknowledged": f"{acked}/{len(pods)}",
        "conditions": set_condition(
            previous,
            type="Ready",
            status=all_acked,
            reason=("Halted" if halting_action else "Released") if all_acked else "Pending",
            message=f"{acked}/{len(pods)} executor pods acknowledged {action}",
            generation=generation,
        ),
    }


async def halt_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo["runtime"]
    data = dict(body)
    deleting = bool(data["metadata"].get("deletionTimestamp"))
    try:
        status = await enforce_halt(rt, data, deleting=deleting)
    except InvalidSpec as exc:
        patch.status.update(_invalid_status(data, str(exc)))
        rt.events.post(data, type="Warning", reason="SpecInvalid", message=str(exc))
        raise kopf.PermanentError(str(exc)) from None
    except ApiError as exc:
        raise to_kopf_error(exc) from None
    if not deleting:
        patch.status.update(status)
    reason = "Halted" if status["halted"] else "Released"
    rt.events.post(
        data,
        type="Warning" if status["halted"] else "Normal",
        reason=reason,
        message=f"{status['acknowledged']} executor pods acknowledged",
    )


async def halt_retry_timer(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Retry the control call while a pod has not acknowledged (new pods start halted from
    the halt file regardless)."""
    status = dict(body.get("status") or {})
    pods = status.get("pods") or []
    generation = int(body["metadata"].get("generation") or 1)
    if status.get("observedGeneration") == generation and all(p.get("acknowledged") for p in pods):
        return
    await halt_handler(body=body, patch=patch, memo=memo)


# --------------------------------------------------------------------------------------------
# Cluster JWKS, startup, registry


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


EXECUTOR_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/name": EXECUTOR_COMPONENT,
    "app.kubernetes.io/managed-by": MANAGED_BY,
}
"""Labels of every executor StatefulSet the operator renders (``render.common.policy_labels``)."""


def build_registry(
    *, reconcile_interval: float = 60.0, halt_retry: float = 5.0
) -> kopf.OperatorRegistry:
    """A registry with every handler (kept out of kopf's global registry so that importing
    this module registers nothing)."""
    registry = kopf.OperatorRegistry()
    for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
        on(GROUP, VERSION, "agentpolicies", registry=registry, id="reconcile")(policy_handler)
        on(GROUP, VERSION, "principals", registry=registry, id="render")(principal_handler)
        on(GROUP, VERSION, "haltswitches", registry=registry, id="enforce")(halt_handler)
    kopf.timer(
        GROUP,
        VERSION,
        "agentpolicies",
        registry=registry,
        id="drift",
        interval=reconcile_interval,
        initial_delay=reconcile_interval,
    )(policy_handler)
    kopf.on.delete(GROUP, VERSION, "agentpolicies", registry=registry, id="cleanup")(
        policy_delete_handler
    )
    kopf.on.delete(GROUP, VERSION, "principals", registry=registry, id="revoke")(principal_handler)
    kopf.on.delete(GROUP, VERSION, "haltswitches", registry=registry, id="release")(halt_handler)
    # Executor readiness: every event of a StatefulSet the operator rendered (label filter;
    # the owner reference names the policy). Stateless: no finalizer, no annotations.
    kopf.on.event(
        "apps",
        "v1",
        "statefulsets",
        registry=registry,
        id="readiness",
        labels=EXECUTOR_LABELS,
    )(statefulset_handler)
    kopf.timer(
        GROUP,
        VERSION,
        "haltswitches",
        registry=registry,
        id="retry",
        interval=halt_retry,
        initial_delay=halt_retry,
    )(halt_retry_timer)
    return registry
