"""The policy ConfigMap, the principals file in it, and the Secrets the operator generates.

The ConfigMap ``<policy>-executor-config`` holds ``policy.json`` (the executor's
:class:`~agentsafe.executor.policy.policy.PolicyDocument`, exactly ``spec.policy``),
``principals.json`` (an ``agent-safe.principals/1``
:class:`~agentsafe.executor.door.principals_file.PrincipalsDocument` built from the selected
Principals plus the operator's own OPERATOR principal and the metrics principal, an OPERATOR
with the ``metrics`` scope alone that a scraper presents) and ``jwks.json`` (the cluster's
service-account JWKS). The halt key is not rendered here: it is rendered by ``render/halt.py``
and applied by ``operator/halt.py`` under its own field manager. No Secret value is ever
rendered: a bearer Principal contributes the SHA-256 of its token, resolved by ``reconcile.py``.

The principals document is checked with the executor's own rules
(:func:`~agentsafe.executor.door.principals_file.build_principal_set`) before anything is applied.

Callers: ``render/children.py``, ``render/workload.py``, ``render/halt.py``, ``reconcile.py``
and ``operator/halt.py`` (the key names), the tests.
Also imported by ``__init__.py``.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agentsafe.executor.canonical import canonical_json
from agentsafe.executor.door.principals_file import (
    ActorModel,
    ApproverRequirement,
    BearerCredential,
    MtlsCredential,
    PrincipalEntry,
    PrincipalsDocument,
    PrincipalsFileError,
    WorkloadJwtCredential,
    build_principal_set,
    render_principals_file,
)
from agentsafe.executor.principals import Role, Scope

from ..models import ConditionReason, PrincipalSpec
from ..settings import OperatorSettings
from .common import (
    MANAGED_BY,
    WATCH_LABEL,
    WATCH_VALUE,
    RenderError,
    RenderInput,
    child_meta,
    names,
)

__all__ = [
    "AUTHORITY_KEY_KEY",
    "HALT_KEY",
    "JWKS_KEY",
    "METRICS_PRINCIPAL_SCOPES",
    "OPERATOR_PRINCIPAL_SCOPES",
    "OPERATOR_TOKEN_KEY",
    "POLICY_KEY",
    "PRINCIPALS_KEY",
    "render_authority_key_secret",
    "render_configmap",
    "render_metrics_token_secret",
    "render_operator_token_secret",
    "render_principals_document",
]

POLICY_KEY: Final = "policy.json"
PRINCIPALS_KEY: Final = "principals.json"
JWKS_KEY: Final = "jwks.json"
HALT_KEY: Final = "halt"
OPERATOR_TOKEN_KEY: Final = "token"
AUTHORITY_KEY_KEY: Final = "signing-key.pem"
OPERATOR_PRINCIPAL_SCOPES: Final = (Scope.HALT, Scope.RESUME, Scope.STATUS)
"""What the operator's own principal may do on its executors (of the executor's scopes, the
ones a HaltSwitch needs and the status read)."""
METRICS_PRINCIPAL_SCOPES: Final = (Scope.METRICS,)
"""What the metrics principal may do: read ``GET /metrics``, nothing else (no status, no halt)."""


def _entry(
    principal_name: str, spec: PrincipalSpec, *, issuer: str, token_sha256: str | None
) -> PrincipalEntry:
    credential: BearerCredential | WorkloadJwtCredential | MtlsCredential
    if spec.service_account is not None:
        sa = spec.service_account
        credential = WorkloadJwtCredential(
            kind="WORKLOAD_JWT",
            issuer=issuer,
            subject=f"system:serviceaccount:{sa.namespace}:{sa.name}",
        )
    elif spec.bearer is not None:
        if token_sha256 is None:
            raise RenderError(
                ConditionReason.SECRET_MISSING,
                f"Principal {principal_name}: its bearer token was not resolved",
            )
        credential = BearerCredential(kind="BEARER", token_sha256=token_sha256)
    else:
        assert spec.mtls is not None
        credential = MtlsCredential(
            kind="MTLS", san_uri=spec.mtls.san_uri, cert_sha256=spec.mtls.cert_sha256
        )
    actor = (
        ActorModel(id=spec.actor.id, type=spec.actor.type, runtime=spec.actor.runtime)
        if spec.actor is not None
        else None
    )
    rate = f"{spec.rate_limit.count}/{spec.rate_limit.seconds}" if spec.rate_limit else None
    return PrincipalEntry(
        id=principal_name,
        role=spec.role,
        tenant_id=spec.tenant_id,
        actor=actor,
        allowed_actions=list(spec.allowed_actions) if spec.allowed_actions is not None else None,
        scopes=list(spec.scopes) if spec.scopes is not None else None,
        credential=credential,
        rate_limit=rate,
        approval=(
            ApproverRequirement(verification=spec.approval.verification)
            if spec.approval is not None
            else None
        ),
    )


def _bearer_operator(
    principal_id: str, scopes: tuple[Scope, ...], token_sha256: str
) -> PrincipalEntry:
    """An OPERATOR principal of the operator's own making: a bearer digest and its scopes."""
    return PrincipalEntry(
        id=principal_id,
        role=Role.OPERATOR,
        scopes=[scope.value for scope in scopes],
        credential=BearerCredential(kind="BEARER", token_sha256=token_sha256),
    )


def render_principals_document(inp: RenderInput) -> PrincipalsDocument:
    """The selected Principals (by name) plus the operator's OPERATOR principal and, with a
    metrics token, the metrics principal, checked with the executor's own rules; refuses with
    ``PrincipalsInvalid``."""
    if not inp.operator_token_sha256:
        raise RenderError(
            ConditionReason.SECRET_MISSING, "the operator's bearer token was not resolved"
        )
    entries = [
        _entry(p.name, p.spec, issuer=inp.settings.issuer, token_sha256=p.token_sha256)
        for p in sorted(inp.principals, key=lambda p: p.name)
    ]
    entries.append(
        _bearer_operator(
            inp.settings.operator_principal_id, OPERATOR_PRINCIPAL_SCOPES, inp.operator_token_sha256
        )
    )
    if inp.metrics_token_sha256:
        entries.append(
            _bearer_operator(
                inp.settings.metrics_principal_id,
                METRICS_PRINCIPAL_SCOPES,
                inp.metrics_token_sha256,
            )
        )
    try:
        document = PrincipalsDocument(version="agent-safe.principals/1", principals=entries)
        build_principal_set(
            document,
            registered_actions=[action.name for action in inp.spec.policy.actions],
            jwt_configured=True,
            client_ca_configured=inp.spec.tls.client_ca is not None,
        )
    except PrincipalsFileError as exc:
        raise RenderError(ConditionReason.PRINCIPALS_INVALID, str(exc)) from None
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise RenderError(
            ConditionReason.PRINCIPALS_INVALID, f"principals do not validate: {exc}"
        ) from None
    return document


def render_configmap(inp: RenderInput) -> dict[str, Any]:
    """The ConfigMap the executor's files come from (everything but the halt key)."""
    document = render_principals_document(inp)
    policy_text = json.dumps(inp.spec.policy.as_json(), indent=2, sort_keys=True) + "\n"
    jwks_text = canonical_json(dict(inp.jwks)).decode("utf-8") + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_meta(inp.policy, names(inp.policy).config),
        "data": {
            POLICY_KEY: policy_text,
            PRINCIPALS_KEY: render_principals_file(document),
            JWKS_KEY: jwks_text,
        },
    }


def _watched(meta: dict[str, Any]) -> dict[str, Any]:
    """A generated Secret's metadata with the watch label: deleting it re-renders at once."""
    meta["labels"] = {**meta["labels"], WATCH_LABEL: WATCH_VALUE}
    return meta


def render_operator_token_secret(inp: RenderInput, token: str) -> dict[str, Any]:
    """The operator's bearer token for this policy's executors: created once, never updated,
    never mounted into an executor (which holds only its SHA-256)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _watched(child_meta(inp.policy, names(inp.policy).operator_token)),
        "data": {OPERATOR_TOKEN_KEY: base64.b64encode(token.encode("ascii")).decode("ascii")},
    }


def render_metrics_token_secret(settings: OperatorSettings, token: str) -> dict[str, Any]:
    """The metrics principal's bearer token, in the operator's namespace (where the chart's
    ServiceMonitor reads it): created once, never updated, never mounted into an executor."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": settings.metrics_token_secret,
            "namespace": settings.operator_namespace,
            "labels": {
                "app.kubernetes.io/name": "agentsafe-metrics",
                "app.kubernetes.io/managed-by": MANAGED_BY,
                "app.kubernetes.io/part-of": "agentsafe",
            },
        },
        "data": {OPERATOR_TOKEN_KEY: base64.b64encode(token.encode("ascii")).decode("ascii")},
    }


def render_authority_key_secret(inp: RenderInput, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The executor's grant signing key (Ed25519, PKCS#8 PEM): created once, never updated."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _watched(child_meta(inp.policy, names(inp.policy).authority_key)),
        "data": {AUTHORITY_KEY_KEY: base64.b64encode(pem).decode("ascii")},
    }
