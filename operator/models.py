"""The custom resources, modelled once: ``AgentPolicy``, ``Principal`` and ``HaltSwitch``.

Group ``agentsafe.io``, version ``v1alpha1``, namespaced. These pydantic models are the single
description of each resource's ``spec`` and ``status``: ``crds.py`` turns their JSON schema into
the CRD's ``openAPIV3Schema`` (so the API server validates what the models validate, as far as a
structural schema can say it; the cross-field rules are CEL ``x-kubernetes-validations`` carried
on the models themselves), and the handlers re-validate every stored object through them before
acting on it.

``spec.policy`` of an AgentPolicy *is* the executor's
:class:`~agentsafe.executor.policy.policy.PolicyDocument`; the enumerations are the executor's own
(:mod:`agentsafe.executor.config`). Nothing here copies them.

Callers: ``crds.py`` (schemas), ``handlers.py`` (parsing), ``render/*`` (rendering).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentsafe.executor.config import (
    CredentialKind,
    EscalationMode,
    ExecutorMode,
    PrivateKeyAlgorithm,
    SigningAlgorithm,
    TlsMinVersion,
)
from agentsafe.executor.policy.policy import PolicyDocument

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "AgentPolicySpec",
    "AgentPolicyStatus",
    "Condition",
    "ConfigMapKeyRef",
    "DownstreamCredentialSpec",
    "DownstreamSpec",
    "HaltPodStatus",
    "HaltSwitchSpec",
    "HaltSwitchStatus",
    "HostCeilingsSpec",
    "JournalSpec",
    "LabelSelector",
    "LabelSelectorRequirement",
    "PrincipalRole",
    "PrincipalSpec",
    "PrincipalStatus",
    "SecretKeyRef",
    "TlsSpec",
]

GROUP: Final = "agentsafe.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_CURRENCY = r"^[A-Z]{3}$"

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL)]
DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)]
Text = Annotated[str, Field(min_length=1, max_length=512)]


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields refused; immutable."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals left out)."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return data


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """``x-kubernetes-validations`` for a model's schema: (CEL rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


# --------------------------------------------------------------------------------------------
# Shared pieces


class SecretKeyRef(_Model):
    """A key of a Secret in the object's namespace. The operator never copies its value."""

    name: DnsSubdomain
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=_SECRET_KEY)]


class ConfigMapKeyRef(_Model):
    """A key of a ConfigMap in the object's namespace (public material: CA certificates)."""

    name: DnsSubdomain
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=_SECRET_KEY)]


class LabelSelectorRequirement(_Model):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[Annotated[str, Field(max_length=63)]] = Field(default_factory=list)


class LabelSelector(_Model):
    """A Kubernetes label selector; the empty selector selects everything."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        have = labels or {}
        for key, wanted in self.match_labels.items():
            if have.get(key) != wanted:
                return False
        for req in self.match_expressions:
            value = have.get(req.key)
            if req.operator == "In" and (value is None or value not in req.values):
                return False
            if req.operator == "NotIn" and value is not None and value in req.values:
                return False
            if req.operator == "Exists" and req.key not in have:
                return False
            if req.operator == "DoesNotExist" and req.key in have:
                return False
        return True


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    """A condition following the Kubernetes API conventions."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    status: ConditionStatus
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]\w*$")]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: str
    observed_generation: Annotated[int, Field(ge=0)] | None = None


# --------------------------------------------------------------------------------------------
# AgentPolicy


class HostCeilingsSpec(_Model):
    """Host ceilings, enforced by the executor whatever the policy says."""

    single: dict[Annotated[str, Field(pattern=_CURRENCY)], Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="largest single amount per ISO 4217 currency (minor)"
    )
    window_seconds: Annotated[int, Field(ge=1, le=2_592_000)] | None = None
    window_count: Annotated[int, Field(ge=1, le=1_000_000_000)] | None = None
    window_sum_minor: Annotated[int, Field(ge=1, le=9_007_199_254_740_991)] | None = None

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "has(self.windowSeconds) == (has(self.windowCount) || has(self.windowSumMinor))",
                "windowSeconds goes with windowCount or windowSumMinor, and only with them",
            )
        )
    )


class DownstreamCredentialSpec(_Model):
    """How the executor authenticates to the downstream; the secret stays in its Secret."""

    kind: CredentialKind = CredentialKind.STATIC_HEADER
    secret_key_ref: SecretKeyRef
    header: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="STATIC_HEADER: the header that carries the credential"
    )
    token_url: Annotated[str, Field(max_length=2048)] | None = None
    client_id: Text | None = None
    key_id: Text | None = Field(default=None, description="PRIVATE_KEY_JWT / SIGNED_REQUEST")
    private_key_algorithm: PrivateKeyAlgorithm | None = None
    signing_algorithm: SigningAlgorithm | None = None
    token_audience: Text | None = None
    token_scope: Text | None = None

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.kind != 'STATIC_HEADER' || has(self.header)", "STATIC_HEADER needs header"),
            (
                "self.kind != 'PRIVATE_KEY_JWT' || (has(self.tokenUrl) && has(self.clientId))",
                "PRIVATE_KEY_JWT needs tokenUrl and clientId",
            ),
            ("self.kind != 'SIGNED_REQUEST' || has(self.keyId)", "SIGNED_REQUEST needs keyId"),
        )
    )


class DownstreamSpec(_Model):
    """The system the executor changes, and the network it lives in."""

    url: Annotated[str, Field(min_length=1, max_length=2048)]
    lookup_url: Annotated[str, Field(max_length=2048)] | None = None
    lookup_by_reference_url: Annotated[str, Field(max_length=2048)] | None = None
    system: Text
    operation: Text
    environment: Text | None = None
    timeout_ms: Annotated[int, Field(ge=1, le=15_000)] = 10_000
    credential: DownstreamCredentialSpec
    ca: ConfigMapKeyRef | None = Field(
        default=None, description="CA bundle (PEM) to trust for the downstream"
    )
    spki_pins: list[Annotated[str, Field(max_length=128)]] | None = Field(
        default=None, description="sha256/<base64> pins, a current and a backup"
    )
    cidrs: list[Annotated[str, Field(min_length=3, max_length=43)]] = Field(
        min_length=1,
        max_length=64,
        description="where the downstream lives: the only egress the executor gets, "
        "and what agents' pods may not reach",
    )


class JournalSpec(_Model):
    """One journal volume per replica, or ``ephemeral: true`` (development only)."""

    storage_class_name: DnsSubdomain | None = None
    size: Annotated[str, Field(pattern=_QUANTITY, max_length=32)] | None = None
    ephemeral: bool = False

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.ephemeral != has(self.size)", "give either size or ephemeral: true"),
            (
                "!self.ephemeral || !has(self.storageClassName)",
                "an ephemeral journal has no storageClassName",
            ),
        )
    )


class TlsSpec(_Model):
    """The executor's listener: a ``kubernetes.io/tls`` Secret, optionally a client CA."""

    secret_name: DnsSubdomain = Field(description="Secret with tls.crt and tls.key")
    client_ca: ConfigMapKeyRef | None = Field(
        default=None,
        alias="clientCA",
        description="CA (PEM) for client certificates; required by MTLS principals",
    )
    min_version: TlsMinVersion = TlsMinVersion.TLS_1_3


class AgentPolicySpec(_Model):
    """What an executor may do, for whom, against which downstream."""

    mode: ExecutorMode = ExecutorMode.SHADOW
    policy: PolicyDocument
    intent_ttl_seconds: Annotated[int, Field(ge=1, le=300)] = Field(
        default=60, alias="intentTTLSeconds"
    )
    host_ceilings: HostCeilingsSpec | None = None
    escalation: EscalationMode = EscalationMode.NONE
    replicas: Annotated[int, Field(ge=1, le=16)] = 1
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        default=None, description="defaults to the operator's configured executor image"
    )
    downstream: DownstreamSpec
    journal: JournalSpec
    tls: TlsSpec
    principal_selector: LabelSelector = Field(default_factory=LabelSelector)
    agent_namespaces: list[DnsLabel] = Field(default_factory=list, max_length=64)
    jwt_audience: Text | None = Field(
        default=None,
        alias="jwtAudience",
        description="audience agents' service-account tokens carry; "
        "defaults to agentsafe.io/<namespace>/<name>",
    )

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!(self.mode == 'SHADOW' && self.escalation == 'APPROVAL')",
                "escalation APPROVAL needs mode ENFORCEMENT (shadow never escalates)",
            ),
        )
    )


class AgentPolicyStatus(_Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    mode: ExecutorMode | None = None
    halted: bool = False
    replicas: int | None = None
    audience: str | None = None
    principals: list[str] = Field(default_factory=list)
    policy_digest: str | None = None


# --------------------------------------------------------------------------------------------
# Principal


class PrincipalRole(StrEnum):
    PROPOSER = "PROPOSER"
    OPERATOR = "OPERATOR"
    APPROVER = "APPROVER"


class ActorSpec(_Model):
    id: Text
    type: Text
    runtime: Text | None = None


class RateLimitSpec(_Model):
    count: Annotated[int, Field(ge=1, le=1_000_000)]
    seconds: Annotated[int, Field(ge=1, le=86_400)]


class ServiceAccountRef(_Model):
    name: DnsSubdomain
    namespace: DnsLabel


class BearerSpec(_Model):
    secret_key_ref: SecretKeyRef


class MtlsSpec(_Model):
    san_uri: Annotated[
        str, Field(min_length=3, max_length=2048, pattern=r"^[A-Za-z][A-Za-z0-9+.-]*:")
    ] = Field(alias="sanURI")
    cert_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        default=None, alias="certSHA256"
    )


class PrincipalSpec(_Model):
    """A caller of the executors whose AgentPolicy selects it (id = the object's name)."""

    role: PrincipalRole
    tenant_id: Annotated[str, Field(pattern=_UUID)] | None = None
    actor: ActorSpec | None = None
    allowed_actions: list[Text] | None = Field(default=None, max_length=1000)
    scopes: list[Literal["halt", "resume", "secrets.reload", "status", "metrics", "evidence"]] | (
        None
    ) = Field(default=None, max_length=16)
    rate_limit: RateLimitSpec | None = None
    service_account: ServiceAccountRef | None = None
    bearer: BearerSpec | None = None
    mtls: MtlsSpec | None = None

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "[has(self.serviceAccount), has(self.bearer), has(self.mtls)]"
                ".filter(x, x).size() == 1",
                "give exactly one credential: serviceAccount, bearer or mtls",
            ),
            (
                "self.role != 'PROPOSER' || (has(self.tenantId) && has(self.actor) "
                "&& has(self.allowedActions) && !has(self.scopes))",
                "a PROPOSER needs tenantId, actor and allowedActions, and has no scopes",
            ),
            (
                "self.role != 'OPERATOR' || (has(self.scopes) && !has(self.allowedActions) "
                "&& !has(self.tenantId))",
                "an OPERATOR needs scopes and has no tenantId or allowedActions",
            ),
            (
                "self.role != 'APPROVER' || (has(self.actor) && !has(self.scopes) "
                "&& !has(self.allowedActions) && !has(self.tenantId))",
                "an APPROVER needs an actor naming the person, and nothing else",
            ),
        )
    )

    def credential_kind(self) -> str:
        if self.service_account is not None:
            return "ServiceAccount"
        if self.bearer is not None:
            return "Bearer"
        return "MTLS"


class PrincipalStatus(_Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    credential: str | None = None
    policies: int = 0
    selected_by: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# HaltSwitch


class HaltSwitchSpec(_Model):
    """Stop every selected executor: durable (the halt file) and immediate (the control route)."""

    halted: bool
    reason: Annotated[str, Field(max_length=500)] | None = None
    policy_selector: LabelSelector = Field(default_factory=LabelSelector)

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!self.halted || (has(self.reason) && size(self.reason) > 0)",
                "a reason is required when halted",
            ),
        )
    )


class HaltPodStatus(_Model):
    policy: str
    pod: str
    acknowledged: bool
    at: str | None = None
    error: str | None = None


class HaltSwitchStatus(_Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    halted: bool = False
    acknowledged: str | None = Field(default=None, description="acknowledged pods / pods")
    policies: list[str] = Field(default_factory=list)
    pods: list[HaltPodStatus] = Field(default_factory=list)
