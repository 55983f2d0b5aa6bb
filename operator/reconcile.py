"""The reconcile: what one AgentPolicy becomes, applied, and the status it reports.

:func:`reconcile_policy` re-validates the stored AgentPolicy, checks that every Secret and
ConfigMap it references exists (with its keys), selects its Principals (resolving bearer tokens to
their SHA-256, never copying them), generates the operator's bearer token and the grant signing key
once (and the metrics token, in the operator's namespace), renders every child with the pure
``render`` package and applies them with server-side apply, prunes the agent-namespace
NetworkPolicies and the PodDisruptionBudget it no longer renders (the budget exists only with two
or more replicas), writes the halt key (``halt.sync_halt``) and decides ``Ready``
(``readiness.py``). A ``RenderError`` (invalid policy, a failing case of ``spec.tests``, missing
Secret, Principals or configuration the executor would refuse) leaves every child untouched and is
reported as ``Reconciled=False`` and ``Ready=False`` with its reason. The result is a
:class:`PolicyOutcome`: the status and the Event to post, and the warnings about the workers'
resources (``render.workload.worker_warnings``) that the stored ``Reconciled`` message does not
carry yet, each for a Warning Event of its own (so the drift timer does not repeat them).

:func:`reconcile_principal` is a Principal's side: every AgentPolicy that selected it (old
labels) or selects it (new labels) is reconciled again and its status written, and the
Principal's own status names the policies that select it.

:func:`reconcile_secret` is a watched Secret's side: every AgentPolicy that uses it
(:func:`policies_using_secret`: named in its spec, generated for it, or a selected Principal's
bearer token) is reconciled again at once and its status written.

Both sides write a policy's status only over the version of the policy they rendered from (a
409 reads it and renders again, :data:`STATUS_WRITE_ATTEMPTS`): kopf runs each Secret's and
Principal's events in tasks of their own, so a slower render that read a Secret before it was
deleted must never write ``Applied`` over the ``SecretMissing`` the delete's render wrote.

:func:`reconcile_relisted` is the Secret watch's re-list (kopf listed a namespace again and
reports no deletes): every AgentPolicy of the namespace is reconciled again.

:func:`prune_agent_policies` removes the NetworkPolicies a policy placed in agent namespaces
(owner references cannot cross namespaces; everything else is garbage-collected through them).

No kopf here: API refusals leave as :class:`~.kubeapi.ApiError`, a stored object that does not
validate as :class:`~.runtime.InvalidSpec`; ``handlers.py`` maps both to kopf's errors.

Callers: ``handlers.py`` (the handler tests drive it through the handlers).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from .conditions import set_condition, spec_invalid_status, stored_conditions
from .halt import sync_halt
from .kubeapi import ApiError, Kube
from .lostwrites import lost_writes_condition, read_lost_writes
from .models import (
    AgentPolicySpec,
    AgentPolicyStatus,
    ConditionReason,
    ConditionType,
    PrincipalSpec,
    PrincipalStatus,
)
from .readiness import executor_readiness, set_ready
from .render import (
    PolicyRef,
    RenderError,
    RenderInput,
    SelectedPrincipal,
    check_policy,
    names,
    render_authority_key_secret,
    render_children,
    render_metrics_token_secret,
    render_operator_token_secret,
)
from .render.common import OWNER_LABEL, WATCH_LABEL, WATCH_VALUE
from .render.config import OPERATOR_TOKEN_KEY
from .render.workload import worker_warnings
from .runtime import (
    EventType,
    InvalidSpec,
    Runtime,
    decode_secret_key,
    generation_of,
    parse_spec,
    policy_ref,
)

__all__ = [
    "STATUS_WRITE_ATTEMPTS",
    "PolicyOutcome",
    "policies_using_secret",
    "prune_agent_policies",
    "reconcile_policy",
    "reconcile_principal",
    "reconcile_relisted",
    "reconcile_secret",
    "referenced_keys",
]


STATUS_WRITE_ATTEMPTS: Final = 5
"""Attempts of one re-render's status write: each is conditional on the policy's version the
render read, and a 409 (the policy changed meanwhile: another re-render or kopf wrote) reads it
again and renders again."""


@dataclass(frozen=True)
class PolicyOutcome:
    """What one reconcile reports: the status to write and the Event to post."""

    status: AgentPolicyStatus
    event_type: EventType
    reason: str
    message: str
    warnings: tuple[str, ...] = ()
    """New warnings about the workers' resources: one Warning Event each
    (``render.workload.WORKERS_WARNING``)."""


def referenced_keys(spec: AgentPolicySpec) -> list[tuple[str, str, str]]:
    """Every (kind, name, key) of a Secret or ConfigMap the AgentPolicy's spec names: the
    listener's certificate, the downstream credential and CA, the store URL, the client CA."""
    wanted: list[tuple[str, str, str]] = [
        ("Secret", spec.tls.secret_name, "tls.crt"),
        ("Secret", spec.tls.secret_name, "tls.key"),
        (
            "Secret",
            spec.downstream.credential.secret_key_ref.name,
            spec.downstream.credential.secret_key_ref.key,
        ),
    ]
    if spec.store is not None:
        wanted.append(("Secret", spec.store.secret_key_ref.name, spec.store.secret_key_ref.key))
    if spec.downstream.ca is not None:
        wanted.append(("ConfigMap", spec.downstream.ca.name, spec.downstream.ca.key))
    if spec.tls.client_ca is not None:
        wanted.append(("ConfigMap", spec.tls.client_ca.name, spec.tls.client_ca.key))
    return wanted


def policies_using_secret(
    secret: str, policies: Sequence[Mapping[str, Any]], principals: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The AgentPolicies (of one namespace) whose rendering reads the Secret named ``secret``:
    one their spec names (:func:`referenced_keys`), one the operator generated for them (its
    bearer token, the grant signing key), or the bearer-token Secret of a Principal they
    select. Policies being deleted and objects that do not validate are left out (their own
    handlers report them)."""
    bearer_of: list[tuple[str, Mapping[str, str] | None]] = []
    for item in principals:
        meta = item.get("metadata") or {}
        try:
            pspec = PrincipalSpec.model_validate(item.get("spec") or {})
        except ValidationError:
            continue
        if pspec.bearer is not None and not meta.get("deletionTimestamp"):
            bearer_of.append((pspec.bearer.secret_key_ref.name, meta.get("labels")))
    using: list[Mapping[str, Any]] = []
    for policy in policies:
        if (policy.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            spec = AgentPolicySpec.model_validate(policy.get("spec") or {})
        except ValidationError:
            continue
        generated = names(policy_ref(policy))
        named = {name for kind, name, _ in referenced_keys(spec) if kind == "Secret"}
        named |= {generated.operator_token, generated.authority_key}
        if secret in named or any(
            name == secret and spec.principal_selector.matches(labels) for name, labels in bearer_of
        ):
            using.append(policy)
    return using


async def reconcile_secret(rt: Runtime, body: Mapping[str, Any]) -> list[str]:
    """A watched Secret changed (created, updated, deleted): re-render every AgentPolicy of its
    namespace that uses it (:func:`policies_using_secret`) and write their status; the names of
    the policies re-rendered. Nothing of the Secret is read here beyond its name: each reconcile
    reads what it needs itself.

    Raises ``ApiError`` for the API server's refusals."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    policies = await rt.kube.list_objects("AgentPolicy", namespace)
    if not policies:
        return []
    principals = await rt.kube.list_objects("Principal", namespace)
    using = policies_using_secret(name, policies, principals)
    for policy in using:
        await _rereconcile(rt, policy)
    return [str(policy["metadata"]["name"]) for policy in using]


async def reconcile_relisted(rt: Runtime, namespace: str) -> list[str]:
    """The Secret watch listed ``namespace`` again (``runtime.SecretListings``): a Secret may
    have been deleted, changed or created while it was not watching, and a listing reports no
    deletes. Every AgentPolicy of the namespace is re-rendered (each reads its Secrets afresh,
    so one deleted meanwhile is ``SecretMissing``) and its status written; their names.
    Policies being deleted or that do not validate are left to their own handlers.

    Raises ``ApiError`` for the API server's refusals."""
    rendered: list[str] = []
    for policy in await rt.kube.list_objects("AgentPolicy", namespace):
        if (policy.get("metadata") or {}).get("deletionTimestamp"):
            continue
        try:
            AgentPolicySpec.model_validate(policy.get("spec") or {})
        except ValidationError:
            continue
        await _rereconcile(rt, policy)
        rendered.append(str(policy["metadata"]["name"]))
    return rendered


def _note_unwatched(secret: Mapping[str, Any] | None, unwatched: list[str]) -> None:
    """Add a Secret read without the watch label to ``unwatched`` (its changes wait for the
    drift repair; the Reconciled message says so)."""
    meta = (secret or {}).get("metadata") or {}
    labels = meta.get("labels") or {}
    if secret is not None and labels.get(WATCH_LABEL) != WATCH_VALUE:
        name = str(meta.get("name"))
        if name not in unwatched:
            unwatched.append(name)


async def _check_references(
    kube: Kube, namespace: str, spec: AgentPolicySpec, unwatched: list[str]
) -> list[str]:
    """Referenced Secrets and ConfigMaps (and keys) that do not exist, by name; Secrets read
    without the watch label are added to ``unwatched``."""
    missing: list[str] = []
    wanted = referenced_keys(spec)
    cache: dict[tuple[str, str], dict[str, Any] | None] = {}
    for kind, name, key in wanted:
        if (kind, name) not in cache:
            cache[(kind, name)] = await kube.get(kind, namespace, name)
            if kind == "Secret":
                _note_unwatched(cache[(kind, name)], unwatched)
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
    kube: Kube, ref: PolicyRef, spec: AgentPolicySpec, unwatched: list[str]
) -> tuple[list[SelectedPrincipal], list[str], list[str]]:
    """(selected principals, missing references, invalid principal names); bearer Secrets
    read without the watch label are added to ``unwatched``."""
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
            _note_unwatched(secret, unwatched)
            token = decode_secret_key(secret, sref.key)
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
    token = decode_secret_key(secret, OPERATOR_TOKEN_KEY)
    if not token:
        raise RenderError(
            ConditionReason.SECRET_MISSING, f"Secret {inp.policy.namespace}/{name} has no token"
        )
    return token.decode("ascii")


async def _metrics_token_sha256(kube: Kube, inp: RenderInput) -> str:
    """The metrics principal's bearer digest, from the Secret in the operator's namespace: the
    operator creates it once (a random token) when absent, and never updates it; ``""`` when no
    metrics principal is configured."""
    settings = inp.settings
    if not settings.metrics_token_secret:
        return ""
    namespace, name = settings.operator_namespace, settings.metrics_token_secret
    secret = await kube.get("Secret", namespace, name)
    if secret is None:
        await kube.create(render_metrics_token_secret(settings, secrets.token_urlsafe(32)))
        secret = await kube.get("Secret", namespace, name)
    token = decode_secret_key(secret, OPERATOR_TOKEN_KEY)
    if not token:
        raise RenderError(ConditionReason.SECRET_MISSING, f"Secret {namespace}/{name} has no token")
    return hashlib.sha256(token).hexdigest()


async def _ensure_authority_key(kube: Kube, inp: RenderInput) -> None:
    name = names(inp.policy).authority_key
    if await kube.get("Secret", inp.policy.namespace, name) is None:
        await kube.create(render_authority_key_secret(inp, Ed25519PrivateKey.generate()))


async def prune_agent_policies(kube: Kube, ref: PolicyRef, keep: set[tuple[str, str]]) -> None:
    """Delete the policy's agent-namespace NetworkPolicies other than ``keep`` (namespace,
    name); ``keep=set()`` removes them all (the policy is being deleted)."""
    selector = f"{OWNER_LABEL}={ref.owner_key}"
    for item in await kube.list_objects("NetworkPolicy", None, label_selector=selector):
        meta = item["metadata"]
        if (meta["namespace"], meta["name"]) not in keep:
            await kube.delete("NetworkPolicy", meta["namespace"], meta["name"])


async def reconcile_policy(rt: Runtime, body: Mapping[str, Any]) -> PolicyOutcome:
    """Render and apply everything one AgentPolicy becomes; the status to write.

    Raises :class:`InvalidSpec` for a stored object that does not validate, ``ApiError`` for
    the API server's refusals. A ``RenderError`` (invalid policy, a failing case of
    ``spec.tests``, missing Secret, principals or configuration the executor would refuse)
    leaves every child untouched and is reported as ``Ready=False`` with its reason.
    """
    ref = policy_ref(body)
    previous = stored_conditions(body)
    previous_reconciled = next((c for c in previous if c.type == ConditionType.RECONCILED), None)
    spec = parse_spec(AgentPolicySpec, body)
    labels = (body.get("metadata") or {}).get("labels")
    inp = RenderInput(policy=ref, spec=spec, settings=rt.settings, jwks=rt.jwks)
    unwatched: list[str] = []
    try:
        check_policy(inp)
        missing = await _check_references(rt.kube, ref.namespace, spec, unwatched)
        selected, missing_p, invalid = await _select_principals(rt.kube, ref, spec, unwatched)
        missing += [m for m in missing_p if m not in missing]
        if missing:
            raise RenderError(ConditionReason.SECRET_MISSING, "missing: " + ", ".join(missing))
        if invalid:
            raise RenderError(
                ConditionReason.PRINCIPALS_INVALID,
                "Principals that do not validate: " + ", ".join(invalid),
            )
        inp = replace(inp, principals=tuple(selected))
        await _ensure_authority_key(rt.kube, inp)
        token = await _operator_token(rt.kube, inp)
        inp = replace(
            inp,
            operator_token_sha256=hashlib.sha256(token.encode()).hexdigest(),
            metrics_token_sha256=await _metrics_token_sha256(rt.kube, inp),
        )
        rendered = render_children(inp)
    except RenderError as exc:
        conditions = previous
        for type_ in (ConditionType.RECONCILED, ConditionType.READY):
            conditions = set_condition(
                conditions,
                type=type_,
                status=False,
                reason=exc.reason,
                message=exc.message,
                generation=ref.generation,
            )
        failed = AgentPolicyStatus(
            observed_generation=ref.generation,
            mode=spec.mode,
            replicas=spec.replicas,
            workers=inp.workers,
            audience=inp.audience,
            halted=await sync_halt(rt, ref, labels),
            conditions=conditions,
        )
        return PolicyOutcome(failed, EventType.WARNING, exc.reason, exc.message)

    keep: set[tuple[str, str]] = set()
    for obj in rendered.objects:
        await rt.kube.apply(obj)
        if obj["kind"] == "NetworkPolicy":
            keep.add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
    await prune_agent_policies(rt.kube, ref, keep)
    if not any(obj["kind"] == "PodDisruptionBudget" for obj in rendered.objects):
        # Scaled below two replicas: the budget from a larger ``replicas`` goes.
        await rt.kube.delete("PodDisruptionBudget", ref.namespace, names(ref).executor)
    halted = await sync_halt(rt, ref, labels)
    sts = await rt.kube.get("StatefulSet", ref.namespace, names(ref).executor)
    message = f"{len(rendered.objects)} objects applied; {len(rendered.principals)} principals"
    if spec.tests:
        message += f"; {len(spec.tests)} policy tests passed"
    if unwatched:
        message += (
            f"; not labelled {WATCH_LABEL}={WATCH_VALUE}, so their changes wait for the drift "
            f"repair: Secret {', '.join(unwatched)}"
        )
    warnings = worker_warnings(spec, rt.settings)
    for warning in warnings:
        message += f"; warning: {warning}"
    reported = previous_reconciled.message if previous_reconciled is not None else ""
    conditions = set_condition(
        previous,
        type=ConditionType.RECONCILED,
        status=True,
        reason=ConditionReason.APPLIED,
        message=message,
        generation=ref.generation,
    )
    if spec.store is not None:
        # Which keys the executors' database lost (an asynchronous failover): the executors
        # halted on them; the policy's status names them (docs/playbooks/store-lost-writes.md).
        conditions = lost_writes_condition(
            conditions, await read_lost_writes(rt, ref, spec), generation=ref.generation
        )
    readiness = executor_readiness(desired_replicas=spec.replicas, statefulset=sts, halted=halted)
    applied = AgentPolicyStatus(
        observed_generation=ref.generation,
        mode=spec.mode,
        replicas=spec.replicas,
        workers=inp.workers,
        audience=inp.audience,
        halted=halted,
        principals=list(rendered.principals),
        policy_digest=rendered.policy_digest,
        conditions=set_ready(conditions, readiness, generation=ref.generation),
    )
    return PolicyOutcome(
        applied,
        EventType.NORMAL,
        ConditionType.RECONCILED,
        message,
        warnings=tuple(w for w in warnings if w not in reported),
    )


async def _rereconcile(rt: Runtime, policy: Mapping[str, Any]) -> None:
    """Re-render a policy from another object's handler and write its status directly.

    Several of these run at once (kopf runs each Secret's and Principal's events in a task of
    its own), and each reads the Secrets at its own moment. The write is therefore conditional
    on the policy's ``resourceVersion`` that the render started from: a render that read a
    Secret before it was deleted, and finishes after the delete's own render wrote
    ``SecretMissing``, gets 409 instead of writing ``Applied`` over it, and reads the policy
    and renders again (up to :data:`STATUS_WRITE_ATTEMPTS`; then the 409 leaves as
    ``ApiError``). A policy gone or being deleted meanwhile is left to its own handlers."""
    current: Mapping[str, Any] = policy
    meta = policy["metadata"]
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), meta.get("uid")
    for attempt in range(1, STATUS_WRITE_ATTEMPTS + 1):
        try:
            status = (await reconcile_policy(rt, current)).status
        except InvalidSpec as exc:
            status = spec_invalid_status(AgentPolicyStatus, current, str(exc))
        try:
            await rt.kube.patch_status(
                "AgentPolicy",
                namespace,
                name,
                status.patch(),
                resource_version=(current.get("metadata") or {}).get("resourceVersion"),
            )
            return
        except ApiError as exc:
            if exc.status != 409 or attempt == STATUS_WRITE_ATTEMPTS:
                raise
        found = await rt.kube.get("AgentPolicy", namespace, name)
        found_meta = (found or {}).get("metadata") or {}
        if found is None or found_meta.get("deletionTimestamp") or found_meta.get("uid") != uid:
            return
        current = found


async def reconcile_principal(
    rt: Runtime, body: Mapping[str, Any], *, old_labels: Mapping[str, str] | None
) -> PrincipalStatus | None:
    """Reconcile every AgentPolicy that selected (``old_labels``) or selects the Principal;
    the Principal's status, or ``None`` while it is being deleted (nothing to report).

    Raises :class:`InvalidSpec` for a stored Principal that does not validate (no policy is
    touched), ``ApiError`` for the API server's refusals.
    """
    meta = body["metadata"]
    deleting = bool(meta.get("deletionTimestamp"))
    generation = generation_of(body)
    spec = parse_spec(PrincipalSpec, body)
    selecting: list[str] = []
    for policy in await rt.kube.list_objects("AgentPolicy", meta["namespace"]):
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
    if deleting:
        return None
    return PrincipalStatus(
        observed_generation=generation,
        credential=spec.credential_kind(),
        policies=len(selecting),
        selected_by=sorted(selecting),
        conditions=set_condition(
            stored_conditions(body),
            type=ConditionType.READY,
            status=True,
            reason=ConditionReason.RENDERED,
            message=f"selected by {len(selecting)} AgentPolicies",
            generation=generation,
        ),
    )
