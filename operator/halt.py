"""HaltSwitch enforcement: the durable halt key and the immediate control call, applied.

A halt reaches an executor twice. Durably: :func:`sync_halt` applies the policy's halt key
(``render/halt.py`` decides it from the namespace's HaltSwitches) under its own field manager,
so a pod that restarts starts halted and the executor refuses to resume while the key exists.
At once: :func:`enforce_halt` calls halt or resume on every executor of each policy the switch
selects (``control.py``), then refreshes each policy's ``Ready``/``halted``
(:func:`~.readiness.refresh_ready`) after every control call, so that a halt never waits on
bookkeeping. A resume is not sent to a policy another HaltSwitch still holds.

:func:`halt_acknowledged` tells the retry timer when there is nothing left to retry.

No kopf here (``handlers.py`` is the boundary).

Callers: ``handlers.py``, ``reconcile.py`` (:func:`sync_halt`), ``lostwrites.py``
(:func:`control_target`), the tests.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .conditions import now_rfc3339, set_condition, stored_conditions
from .control import ControlResult, Endpoint, executor_endpoints, trust_context
from .kubeapi import ApiError
from .models import (
    AgentPolicySpec,
    ConditionReason,
    ConditionType,
    HaltPodStatus,
    HaltSwitchSpec,
    HaltSwitchStatus,
)
from .readiness import refresh_ready
from .render import PolicyRef, names
from .render.config import OPERATOR_TOKEN_KEY
from .render.halt import halt_document, render_halt_configmap, switches_halting
from .runtime import Runtime, decode_secret_key, generation_of, parse_spec, policy_ref
from .settings import HALT_FIELD_MANAGER

__all__ = ["ControlTarget", "control_target", "enforce_halt", "halt_acknowledged", "sync_halt"]


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
class ControlTarget:
    """How to reach a policy's executors as the operator: their endpoints and, when the
    operator token and the executor's certificate exist, the credentials (else ``missing``)."""

    endpoints: list[Endpoint]
    token: str = ""
    context: ssl.SSLContext | None = None
    server_hostname: str = ""

    @property
    def missing(self) -> bool:
        return not self.token or self.context is None


async def control_target(rt: Runtime, ref: PolicyRef, spec: AgentPolicySpec) -> ControlTarget:
    """The executor endpoints of ``ref`` and the operator's credentials for their control
    routes (the halt's calls, and ``lostwrites.py``'s status reads)."""
    n = names(ref)
    slices = await rt.kube.list_objects(
        "EndpointSlice", ref.namespace, label_selector=f"kubernetes.io/service-name={n.service}"
    )
    endpoints = executor_endpoints(slices)
    if not endpoints:
        return ControlTarget([])
    token_secret = await rt.kube.get("Secret", ref.namespace, n.operator_token)
    tls_secret = await rt.kube.get("Secret", ref.namespace, spec.tls.secret_name)
    token = decode_secret_key(token_secret, OPERATOR_TOKEN_KEY)
    ca = decode_secret_key(tls_secret, "ca.crt")
    cert = decode_secret_key(tls_secret, "tls.crt")
    if not token or not (ca or cert):
        return ControlTarget(endpoints)
    context = trust_context(
        ca_pem=ca.decode() if ca else None, certificate_pem=cert.decode() if cert else None
    )
    return ControlTarget(
        endpoints, token.decode("ascii"), context, f"{n.service}.{ref.namespace}.svc"
    )


async def _control_policy(
    rt: Runtime, ref: PolicyRef, spec: AgentPolicySpec, *, action: str, reason: str
) -> list[ControlResult]:
    target = await control_target(rt, ref, spec)
    if not target.endpoints:
        return []
    if target.missing or target.context is None:
        return [
            ControlResult(e.pod, False, "operator token or executor certificate missing")
            for e in target.endpoints
        ]
    return await rt.control.call_all(
        target.endpoints,
        action=action,
        reason=reason,
        token=target.token,
        port=rt.settings.port,
        server_hostname=target.server_hostname,
        context=target.context,
    )


async def enforce_halt(
    rt: Runtime, body: Mapping[str, Any], *, deleting: bool = False
) -> HaltSwitchStatus:
    """Write every policy's halt key from the namespace's HaltSwitches, then call halt or
    resume on each selected policy's executors; returns the HaltSwitch's status.

    Raises :class:`~.runtime.InvalidSpec` for a stored HaltSwitch that does not validate,
    ``ApiError`` for the API server's refusals (a failed ``Ready`` refresh is not one: the
    policy's timer repairs it).
    """
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    generation = generation_of(body)
    spec = parse_spec(HaltSwitchSpec, body)
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
    pods: list[HaltPodStatus] = []
    selected: list[str] = []
    at = now_rfc3339()
    halted_now: list[tuple[PolicyRef, bool]] = []
    for policy in await rt.kube.list_objects("AgentPolicy", namespace):
        ref = policy_ref(policy)
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
            pods.append(
                HaltPodStatus(
                    policy=ref.name,
                    pod=result.pod,
                    acknowledged=result.acknowledged,
                    at=at if result.acknowledged else None,
                    error=result.error or None,
                )
            )
    # After every control call (a halt must not wait on bookkeeping): each policy's Ready and
    # Halted now, not at its next reconcile. Best effort: the policy's timer repairs it.
    for ref, still_halted in halted_now:
        with contextlib.suppress(ApiError):
            await refresh_ready(rt, ref.namespace, ref.name, uid=ref.uid, halted=still_halted)
    acked = sum(1 for p in pods if p.acknowledged)
    all_acked = acked == len(pods)
    done = ConditionReason.HALTED if halting_action else ConditionReason.RELEASED
    return HaltSwitchStatus(
        observed_generation=generation,
        halted=halting_action,
        policies=sorted(selected),
        pods=pods,
        acknowledged=f"{acked}/{len(pods)}",
        conditions=set_condition(
            stored_conditions(body),
            type=ConditionType.READY,
            status=all_acked,
            reason=done if all_acked else ConditionReason.PENDING,
            message=f"{acked}/{len(pods)} executor pods acknowledged {action}",
            generation=generation,
        ),
    )


def halt_acknowledged(body: Mapping[str, Any]) -> bool:
    """Every pod acknowledged the switch's current generation: nothing for the timer to retry
    (new pods start halted from the halt key regardless)."""
    try:
        status = HaltSwitchStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return False  # enforce again: the write replaces it
    return status.observed_generation == generation_of(body) and all(
        p.acknowledged for p in status.pods
    )
