"""The kopf boundary: thin handlers over the reconcile, halt and readiness steps, and the registry.

Each handler takes what kopf passes (``body``, ``patch``, ``memo``), calls one step, writes the
status it returns into kopf's ``patch`` and posts the Event; nothing else. The steps live in
modules named for what they do and never import kopf:

- AgentPolicy: create/update/resume and a timer (drift repair) run
  :func:`~.reconcile.reconcile_policy`; delete removes the NetworkPolicies it placed in agent
  namespaces (:func:`~.reconcile.prune_agent_policies`).
- Principal: any change runs :func:`~.reconcile.reconcile_principal`, which re-renders the
  AgentPolicies that select it (before and after).
- HaltSwitch: create/update/resume/delete run :func:`~.halt.enforce_halt`; a timer retries
  while a pod has not acknowledged (:func:`~.halt.halt_acknowledged`).
- AgentPolicy admission (only when the operator serves its webhook): a create or a change of
  ``spec`` runs :func:`~.admission.review_policy`, the reconcile's own checks, before the object
  is stored; a refusal is ``kopf.AdmissionError`` (HTTP 422 to the client).
- Executor StatefulSets (the ones the renderer labels): every watch event runs
  :func:`~.readiness.refresh_ready` for the owning AgentPolicy; it never renders or applies.
- Secrets labelled ``agentsafe.io/watch: "true"`` (:data:`SECRET_LABELS`; the API server
  filters the watch by it, :func:`configure_watching`): a change runs
  :func:`~.reconcile.reconcile_secret`, which re-renders the AgentPolicies that use the Secret;
  a re-list of the watch (:class:`~.runtime.SecretListings`) runs
  :func:`~.reconcile.reconcile_relisted` for its namespace, since a listing shows no deletes.

Every async handler runs inside :func:`traced`: one span per reconcile when tracing is on
(``OTEL_*``, docs/tracing.md), configured by ``operator/cli.py``.

Errors are mapped here and only here: a stored object that does not validate
(:class:`~.runtime.InvalidSpec`) is a ``Ready=False``/``SpecInvalid`` condition, a Warning Event
and ``kopf.PermanentError``; an API refusal (:class:`~.kubeapi.ApiError`) is
``kopf.TemporaryError`` or ``kopf.PermanentError`` through :func:`to_kopf_error`. kopf never
retries an event handler (it only logs the error), so a Secret event's re-render is tried again
here after a passing refusal (409, 429, 5xx; :data:`SECRET_EVENT_ATTEMPTS`) before it is one.

Every handler run is counted and timed by its handler name and how it ended
(:class:`~.metrics.OperatorMetrics`, the operator's ``/metrics``).

Everything the handlers need lives in one :class:`~.runtime.Runtime` in kopf's ``memo``; tests
build one with an in-memory API stand-in and call the handler functions directly.

Callers: ``cli.py`` (:func:`build_registry`, :class:`KopfEvents`), the tests.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import kopf

from agentsafe.executor import telemetry

from .admission import ADMISSION_WEBHOOK_ID, AdmissionRefused, review_policy
from .conditions import spec_invalid_status
from .halt import enforce_halt, halt_acknowledged
from .kubeapi import ApiError
from .models import (
    GROUP,
    VERSION,
    AgentPolicyStatus,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    HaltSwitchStatus,
    PrincipalStatus,
    ResourceStatus,
)
from .readiness import owning_policy, ready_moved, refresh_ready
from .reconcile import (
    prune_agent_policies,
    reconcile_policy,
    reconcile_principal,
    reconcile_relisted,
    reconcile_secret,
)
from .render.common import EXECUTOR_COMPONENT, MANAGED_BY, WATCH_LABEL, WATCH_VALUE
from .render.workload import WORKERS_WARNING
from .resources import migrated_finalizers
from .runtime import EventType, InvalidSpec, Runtime, policy_ref

__all__ = [
    "EXECUTOR_LABELS",
    "SECRET_EVENT_ATTEMPTS",
    "SECRET_LABELS",
    "KopfEvents",
    "build_registry",
    "configure_watching",
    "halt_handler",
    "halt_retry_timer",
    "policy_admission_handler",
    "policy_delete_handler",
    "policy_handler",
    "principal_handler",
    "secret_handler",
    "statefulset_handler",
    "to_kopf_error",
]


class KopfEvents:
    """Posts Kubernetes Events through kopf's queue (only inside a running operator)."""

    def post(self, body: Mapping[str, Any], *, type: EventType, reason: str, message: str) -> None:
        raw: Any = dict(body)
        kopf.event(kopf.Body(raw), type=type, reason=reason, message=message[:1024])


def to_kopf_error(exc: ApiError) -> kopf.TemporaryError | kopf.PermanentError:
    """409/429/5xx: try again soon; 401/403/404: try again later (RBAC or a namespace may be
    fixed by a person); other 4xx: give up."""
    if exc.status in (409, 429) or exc.status >= 500:
        return kopf.TemporaryError(f"API server: {exc}", delay=5)
    if exc.status in (401, 403, 404):
        return kopf.TemporaryError(f"API server: {exc}", delay=60)
    return kopf.PermanentError(f"API server refused: {exc}")


def _spec_invalid(
    rt: Runtime,
    model: type[ResourceStatus],
    body: Mapping[str, Any],
    patch: kopf.Patch,
    exc: InvalidSpec,
) -> kopf.PermanentError:
    """Report a stored object that does not validate; the error for the caller to raise."""
    patch.status.update(spec_invalid_status(model, body, str(exc)).patch())
    rt.events.post(
        body, type=EventType.WARNING, reason=ConditionReason.SPEC_INVALID, message=str(exc)
    )
    return kopf.PermanentError(str(exc))


async def policy_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """create / update / resume / timer of an AgentPolicy."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    meta = data.get("metadata") or {}
    with rt.metrics.timed("agentpolicy") as run:
        try:
            outcome = await reconcile_policy(rt, data)
        except InvalidSpec as exc:
            run["result"] = "invalid"
            rt.metrics.policy_ready(str(meta.get("namespace")), str(meta.get("name")), False)
            raise _spec_invalid(rt, AgentPolicyStatus, data, patch, exc) from None
        except ApiError as exc:
            run["result"] = "api_error"
            raise to_kopf_error(exc) from None
        applied = outcome.event_type is EventType.NORMAL
        run["result"] = "applied" if applied else "not_ready"
    rt.metrics.policy_ready(
        str(meta.get("namespace")), str(meta.get("name")), _is_ready(outcome.status)
    )
    patch.status.update(outcome.status.patch())
    if outcome.event_type is EventType.WARNING or ready_moved(data, outcome.status):
        rt.events.post(
            data, type=outcome.event_type, reason=outcome.reason, message=outcome.message
        )
    for warning in outcome.warnings:
        rt.events.post(data, type=EventType.WARNING, reason=WORKERS_WARNING, message=warning)


def _is_ready(status: AgentPolicyStatus) -> bool:
    return any(
        c.type == ConditionType.READY and c.status is ConditionStatus.TRUE
        for c in status.conditions or []
    )


ADMISSION_HINT = (
    " (paths are under spec.policy; `agentsafe policy lint FILE` compiles a policy before you "
    "apply it)"
)


async def policy_admission_handler(
    body: kopf.Body,
    old: Any = None,
    operation: str | None = None,
    warnings: list[str] | None = None,
    memo: kopf.Memo | None = None,
    **_: Any,
) -> None:
    """Validating admission of an AgentPolicy: refused with the reason and message its
    condition would carry, before anything is stored; an admitted one may carry warnings
    (kopf's ``warnings`` list, which the API server hands to the client)."""
    rt: Runtime | None = memo.get("runtime") if memo is not None else None
    try:
        found = review_policy(
            operation,
            dict(body),
            dict(old) if isinstance(old, Mapping) else None,
            settings=rt.settings if rt is not None else None,
        )
    except AdmissionRefused as exc:
        hint = ADMISSION_HINT if exc.reason is ConditionReason.POLICY_INVALID else ""
        raise kopf.AdmissionError(f"AgentPolicy refused: {exc}{hint}", code=422) from None
    if warnings is not None:
        warnings.extend(found)


async def policy_delete_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Remove what owner references cannot reach: agent-namespace NetworkPolicies."""
    rt: Runtime = memo["runtime"]
    ref = policy_ref(dict(body))
    with rt.metrics.timed("agentpolicy.delete") as run:
        try:
            await prune_agent_policies(rt.kube, ref, keep=set())
        except ApiError as exc:
            run["result"] = "api_error"
            raise to_kopf_error(exc) from None
        run["result"] = "applied"
    rt.metrics.policy_ready(ref.namespace, ref.name, None)


async def statefulset_handler(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Any event of an executor StatefulSet (status included) refreshes its owner's Ready."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    owner = owning_policy(data)
    namespace = (data.get("metadata") or {}).get("namespace")
    if owner is None or not namespace:
        return
    with rt.metrics.timed("readiness") as run:
        try:
            await refresh_ready(rt, str(namespace), owner.name, uid=owner.uid)
        except ApiError as exc:
            run["result"] = "api_error"
            raise to_kopf_error(exc) from None
        run["result"] = "applied"


async def principal_handler(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, old: Any = None, **_: Any
) -> None:
    """Any change of a Principal re-renders every AgentPolicy that selected or selects it."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    old_labels = (
        ((old or {}).get("metadata") or {}).get("labels") if isinstance(old, Mapping) else None
    )
    with rt.metrics.timed("principal") as run:
        try:
            status = await reconcile_principal(rt, data, old_labels=old_labels)
        except InvalidSpec as exc:
            run["result"] = "invalid"
            raise _spec_invalid(rt, PrincipalStatus, data, patch, exc) from None
        except ApiError as exc:
            run["result"] = "api_error"
            raise to_kopf_error(exc) from None
        run["result"] = "applied"
    if status is not None:
        patch.status.update(status.patch())


async def secret_handler(
    body: kopf.Body, memo: kopf.Memo, type: str | None = None, **_: Any
) -> None:
    """A watched Secret was added, modified or deleted: re-render the policies that use it.

    A listing event (``type`` ``None``) of the first listing is skipped: at start every policy
    is reconciled by its own resume handler already. The first event of a re-list (the watch
    listed again; :class:`~.runtime.SecretListings` tells) re-renders every policy of the
    namespace instead, since a listing never shows what was deleted while nobody watched."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    if type is None:
        if not rt.secret_listings.listed(data):
            return
        namespace = str(data["metadata"]["namespace"])
        await _retried(lambda: reconcile_relisted(rt, namespace))
        return
    rt.secret_listings.watched(type, data)
    await _retried(lambda: reconcile_secret(rt, data))


SECRET_EVENT_ATTEMPTS: Final = 3
"""Attempts of one Secret event's re-render: kopf never retries an event handler (its errors
are only logged), so a passing refusal (409, 429, 5xx) would drop the event for good."""

SECRET_RETRY_SECONDS = 1.0
"""The pause before the second attempt (doubled before the third); tests set 0."""


async def _retried(step: Callable[[], Awaitable[object]]) -> None:
    """Run one Secret event's re-render, again after a passing refusal; the last refusal, or
    one a person must fix (401, 403, 404, other 4xx), leaves as kopf's error (kopf logs it)."""
    for attempt in range(1, SECRET_EVENT_ATTEMPTS + 1):
        try:
            await step()
            return
        except ApiError as exc:
            passing = exc.status in (409, 429) or exc.status >= 500
            if not passing or attempt == SECRET_EVENT_ATTEMPTS:
                raise to_kopf_error(exc) from None
        await asyncio.sleep(SECRET_RETRY_SECONDS * 2 ** (attempt - 1))  # backoff, not a sync


async def halt_handler(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """create / update / resume / delete of a HaltSwitch (and its retry timer)."""
    rt: Runtime = memo["runtime"]
    data = dict(body)
    deleting = bool(data["metadata"].get("deletionTimestamp"))
    with rt.metrics.timed("haltswitch") as run:
        try:
            status = await enforce_halt(rt, data, deleting=deleting)
        except InvalidSpec as exc:
            run["result"] = "invalid"
            raise _spec_invalid(rt, HaltSwitchStatus, data, patch, exc) from None
        except ApiError as exc:
            run["result"] = "api_error"
            raise to_kopf_error(exc) from None
        run["result"] = "applied"
    if not deleting:
        patch.status.update(status.patch())
    rt.events.post(
        data,
        type=EventType.WARNING if status.halted else EventType.NORMAL,
        reason=ConditionReason.HALTED if status.halted else ConditionReason.RELEASED,
        message=f"{status.acknowledged} executor pods acknowledged",
    )


async def halt_retry_timer(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Retry the control call while a pod has not acknowledged (new pods start halted from
    the halt key regardless)."""
    if halt_acknowledged(body):
        return
    await halt_handler(body=body, patch=patch, memo=memo)


EXECUTOR_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/name": EXECUTOR_COMPONENT,
    "app.kubernetes.io/managed-by": MANAGED_BY,
}
"""Labels of every executor StatefulSet the operator renders (``render.common.policy_labels``)."""

SECRET_LABELS: Mapping[str, str] = {WATCH_LABEL: WATCH_VALUE}
"""The Secrets the operator watches (docs/operator.md, "Secret changes")."""


def configure_watching(settings: kopf.OperatorSettings) -> None:
    """Have the API server filter the Secret watch by :data:`SECRET_LABELS` (kopf's handler
    filter alone would still receive every Secret of the watched namespaces)."""
    settings.watching.label_selectors["v1", "secrets"] = ",".join(
        f"{key}={value}" for key, value in SECRET_LABELS.items()
    )


def finalizer_migration_handler(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Objects from an operator before issue 22 carry kopf's default finalizer name; rename it
    to agentsafe.io's (or drop it from an object being deleted) so deletes are never stuck."""
    finalizers = list(body.get("metadata", {}).get("finalizers") or [])
    deleting = body.get("metadata", {}).get("deletionTimestamp") is not None
    migrated = migrated_finalizers(finalizers, deleting=deleting)
    if migrated is not None:
        patch.setdefault("metadata", {})["finalizers"] = migrated


def traced(
    handler_id: str, handler: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    """``handler`` as one span per call (``agentsafe.operator.<id>``; the outcome, or the
    exception's type, never the object's spec) when tracing is on (docs/tracing.md)."""

    @functools.wraps(handler)
    async def run(**kwargs: Any) -> Any:
        with telemetry.span(f"agentsafe.operator.{handler_id}") as current:
            result = await handler(**kwargs)
            if current is not None:
                current.set_attribute("agentsafe.outcome", "ok")
            return result

    return run


def build_registry(
    *, reconcile_interval: float = 60.0, halt_retry: float = 5.0, admission: bool = False
) -> kopf.OperatorRegistry:
    """A registry with every handler (kept out of kopf's global registry so that importing
    this module registers nothing). ``admission``: also the AgentPolicy validate handler (the
    caller configures kopf's webhook server; kopf refuses to start a validate handler without
    one)."""
    registry = kopf.OperatorRegistry()
    if admission:
        kopf.on.validate(
            GROUP,
            VERSION,
            "agentpolicies",
            registry=registry,
            id=ADMISSION_WEBHOOK_ID,
            operations=["CREATE", "UPDATE"],
        )(traced("admission", policy_admission_handler))
    for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
        on(GROUP, VERSION, "agentpolicies", registry=registry, id="reconcile")(
            traced("reconcile", policy_handler)
        )
        on(GROUP, VERSION, "principals", registry=registry, id="render")(
            traced("render", principal_handler)
        )
        on(GROUP, VERSION, "haltswitches", registry=registry, id="enforce")(
            traced("enforce", halt_handler)
        )
    kopf.timer(
        GROUP,
        VERSION,
        "agentpolicies",
        registry=registry,
        id="drift",
        interval=reconcile_interval,
        initial_delay=reconcile_interval,
    )(traced("drift", policy_handler))
    for plural in ("agentpolicies", "principals", "haltswitches"):
        kopf.on.event(GROUP, VERSION, plural, registry=registry, id="finalizer-name")(
            finalizer_migration_handler
        )
    kopf.on.delete(GROUP, VERSION, "agentpolicies", registry=registry, id="cleanup")(
        traced("cleanup", policy_delete_handler)
    )
    kopf.on.delete(GROUP, VERSION, "principals", registry=registry, id="revoke")(
        traced("revoke", principal_handler)
    )
    kopf.on.delete(GROUP, VERSION, "haltswitches", registry=registry, id="release")(
        traced("release", halt_handler)
    )
    # Executor readiness: every event of a StatefulSet the operator rendered (label filter;
    # the owner reference names the policy). Stateless: no finalizer, no annotations.
    kopf.on.event(
        "apps",
        "v1",
        "statefulsets",
        registry=registry,
        id="readiness",
        labels=EXECUTOR_LABELS,
    )(traced("readiness", statefulset_handler))
    # Secret changes: only labelled Secrets (the server-side selector of configure_watching,
    # and this filter again), stateless like the StatefulSet watch.
    kopf.on.event("v1", "secrets", registry=registry, id="references", labels=SECRET_LABELS)(
        traced("references", secret_handler)
    )
    kopf.timer(
        GROUP,
        VERSION,
        "haltswitches",
        registry=registry,
        id="retry",
        interval=halt_retry,
        initial_delay=halt_retry,
    )(traced("retry", halt_retry_timer))
    return registry
