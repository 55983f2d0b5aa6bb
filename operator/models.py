"""The custom resources, modelled once: ``AgentPolicy``, ``Principal`` and ``HaltSwitch``.

Group ``agentsafe.io``, version ``v1alpha1``, namespaced. These pydantic models are the single
description of each resource's ``spec`` and ``status``: ``crds.py`` turns their JSON schema into
the CRD's ``openAPIV3Schema`` (so the API server validates what the models validate, as far as a
structural schema can say it; the cross-field rules are CEL ``x-kubernetes-validations`` carried
on the models themselves), and the reconcile steps re-validate every stored object through them
before acting on it.

``spec.policy`` of an AgentPolicy *is* the executor's
:class:`~agentsafe.executor.policy.policy.PolicyDocument`; the enumerations, the numeric ranges
and the value rules the executor enforces on what a resource renders into are the executor's own,
imported: its configuration's (:mod:`agentsafe.executor.config`: modes, credential kinds,
intent TTL, downstream timeout, host-ceiling windows, currency codes, text length, worker
count), its principals file's (:mod:`agentsafe.executor.door.principals_file`: roles, operator
scopes, how many actions and scopes, SAN URIs, digests) and its halt's (the longest reason).
Nothing here copies them; what stays here is what only the custom resources say (replicas,
journal size, names, the executor container's default resources per worker).

Callers: ``crds.py`` (schemas); ``reconcile.py``, ``halt.py``, ``readiness.py`` and
``render/halt.py`` (parsing); ``render/*`` (rendering); ``resources.py`` and ``handlers.py`` (the
group).
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel

from agentsafe.executor.canonical import MAX_SAFE_INTEGER
from agentsafe.executor.config import (
    CURRENCY_PATTERN,
    DOWNSTREAM_TIMEOUT_MS_DEFAULT,
    DOWNSTREAM_TIMEOUT_MS_MAX,
    HARD_LIMIT_WINDOW_COUNT_MAX,
    HARD_LIMIT_WINDOW_SECONDS_MAX,
    IDEMPOTENCY_KEY_PLACEHOLDER,
    INTENT_TTL_SECONDS_DEFAULT,
    INTENT_TTL_SECONDS_MAX,
    MAX_TEXT,
    PROVIDER_REFERENCE_PLACEHOLDER,
    WORKERS_MAX,
    CredentialKind,
    EscalationMode,
    ExecutorMode,
    PrivateKeyAlgorithm,
    SigningAlgorithm,
    TlsMinVersion,
    check_downstream_url,
)
from agentsafe.executor.door.principals_file import (
    MAX_ALLOWED_ACTIONS,
    MAX_SCOPES,
    SanUri,
    Sha256Hex,
)
from agentsafe.executor.host.halt import MAX_REASON_CHARS
from agentsafe.executor.policy.policy import PolicyDocument
from agentsafe.executor.policy.trial import MAX_TEST_CASES, PolicyTestCase
from agentsafe.executor.principals import Role, Scope, Verification

__all__ = [
    "API_VERSION",
    "GROUP",
    "RESOURCES_PER_WORKER",
    "RESOURCE_QUANTITY_PATTERN",
    "VERSION",
    "WORKER_MEMORY",
    "AgentPolicySpec",
    "AgentPolicyStatus",
    "Condition",
    "ConditionReason",
    "ConditionStatus",
    "ConditionType",
    "ConfigMapKeyRef",
    "DownstreamCredentialSpec",
    "DownstreamSpec",
    "ExecutorPodSpec",
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
    "ResourceStatus",
    "SecretKeyRef",
    "StoreSpec",
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
_CURRENCY = f"^{CURRENCY_PATTERN}$"

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL)]
DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
MinorUnits = Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields refused; immutable."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        # A field's docstring is its description (`kubectl explain` reads it from the CRD).
        use_attribute_docstrings=True,
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
    """the Secret's name, in the resource's namespace"""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=_SECRET_KEY)]
    """the key inside the Secret's data"""


class ConfigMapKeyRef(_Model):
    """A key of a ConfigMap in the object's namespace (public material: CA certificates)."""

    name: DnsSubdomain
    """the ConfigMap's name, in the resource's namespace"""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=_SECRET_KEY)]
    """the key inside the ConfigMap's data"""


class LabelSelectorRequirement(_Model):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    """the label key the requirement applies to"""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In, NotIn, Exists or DoesNotExist"""
    values: list[Annotated[str, Field(max_length=63)]] = Field(default_factory=list)
    """the values for In and NotIn; empty for Exists and DoesNotExist"""


class LabelSelector(_Model):
    """A Kubernetes label selector; the empty selector selects everything."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict)
    """labels an object must carry, each with exactly this value"""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)
    """requirements an object's labels must all meet"""

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


class ConditionType(StrEnum):
    """Every ``status.conditions[].type`` the operator writes, and on which resources."""

    READY = "Ready"
    """All three: AgentPolicy (its executors serve), Principal (rendered into the policies that
    select it), HaltSwitch (every selected executor acknowledged)."""
    RECONCILED = "Reconciled"
    """AgentPolicy: every child was rendered and applied for ``observedGeneration``."""
    STORE_LOST_WRITES = "StoreLostWrites"
    """AgentPolicy with ``spec.store``: ``True`` when an executor found grant claims its
    PostgreSQL store lost (an asynchronous failover) and halted with cause
    ``STORE_LOST_WRITES``; the message names the pods and keys and the playbook."""


class ConditionReason(StrEnum):
    """Every ``status.conditions[].reason`` the operator writes, and where."""

    SPEC_INVALID = "SpecInvalid"
    """All three, ``Ready=False``: the stored ``spec`` does not validate (also a render's
    refusal of something the schema cannot say, such as a URL's port)."""
    APPLIED = "Applied"
    """AgentPolicy, ``Reconciled=True``: every child applied."""
    POLICY_INVALID = "PolicyInvalid"
    """AgentPolicy, ``Reconciled``/``Ready=False``: ``spec.policy`` does not compile."""
    POLICY_TESTS_FAILED = "PolicyTestsFailed"
    """AgentPolicy, ``Reconciled``/``Ready=False``: a case of ``spec.tests`` does not get the
    answer it expects from ``spec.policy`` (``agentsafe policy test``, docs/policy-testing.md)."""
    PRINCIPALS_INVALID = "PrincipalsInvalid"
    """AgentPolicy, ``Reconciled``/``Ready=False``: the selected Principals do not validate or
    the executor would refuse them (separation of duties, MTLS without a client CA, ...)."""
    CONFIG_INVALID = "ConfigInvalid"
    """AgentPolicy, ``Reconciled``/``Ready=False``: the executor would refuse the rendered
    environment at start."""
    SECRET_MISSING = "SecretMissing"
    """AgentPolicy, ``Reconciled``/``Ready=False``: a referenced Secret, ConfigMap or key does
    not exist."""
    EXECUTORS_READY = "ExecutorsReady"
    """AgentPolicy, ``Ready=True``: as many ready, updated executors as ``spec.replicas``."""
    EXECUTORS_NOT_READY = "ExecutorsNotReady"
    """AgentPolicy, ``Ready=False``: the StatefulSet is missing, not yet observed, short of
    ready or updated replicas, or between revisions."""
    HALTED = "Halted"
    """AgentPolicy, ``Ready=False``: a HaltSwitch halts it. HaltSwitch, ``Ready=True``: every
    selected executor acknowledged the halt."""
    RELEASED = "Released"
    """HaltSwitch, ``Ready=True``: every selected executor acknowledged the resume."""
    PENDING = "Pending"
    """HaltSwitch, ``Ready=False``: an executor has not acknowledged yet (the timer retries)."""
    RENDERED = "Rendered"
    """Principal, ``Ready=True``: rendered into every AgentPolicy that selects it."""
    LOST_WRITES_FOUND = "LostWritesFound"
    """AgentPolicy, ``StoreLostWrites=True``: an executor lists claims its store lost
    (docs/playbooks/store-lost-writes.md)."""
    NO_LOST_WRITES = "NoLostWrites"
    """AgentPolicy, ``StoreLostWrites=False``: every executor that answered lists none."""


class Condition(_Model):
    """A condition following the Kubernetes API conventions."""

    # type and reason stay free strings in the schema, as metav1.Condition's do; the operator
    # writes only ConditionType and ConditionReason values (conditions.set_condition).

    type: Annotated[str, Field(min_length=1, max_length=316)]
    """the condition's type (Ready, Rendered), unique in the list"""
    status: ConditionStatus
    """True, False or Unknown"""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]\w*$")]
    """a CamelCase reason for the last transition, stable for scripts"""
    message: Annotated[str, Field(max_length=32768)] = ""
    """what happened and what to do next, for people"""
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    """when status last changed (RFC 3339)"""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """the metadata.generation the condition was set for"""


class ResourceStatus(_Model):
    """What every resource's ``status`` starts with: the generation acted on, the conditions."""

    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="the metadata.generation this status describes"
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        # One condition per type, merged by type (server-side apply, kubectl explain).
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """the resource's conditions, one per type"""

    def patch(self) -> dict[str, Any]:
        """The fields given when this status was built, as the API server stores them: a merge
        patch that leaves every other field of the stored status as it was."""
        data: dict[str, Any] = self.model_dump(
            mode="json", by_alias=True, exclude_unset=True, exclude_none=True
        )
        return data

    def condition(self, type_: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


# --------------------------------------------------------------------------------------------
# AgentPolicy


class HostCeilingsSpec(_Model):
    """Host ceilings, enforced by the executor whatever the policy says."""

    single: dict[Annotated[str, Field(pattern=_CURRENCY)], MinorUnits] = Field(
        default_factory=dict, description="largest single amount per ISO 4217 currency (minor)"
    )
    window_seconds: Annotated[int, Field(ge=1, le=HARD_LIMIT_WINDOW_SECONDS_MAX)] | None = None
    """length of the rolling window the count and sum ceilings apply to"""
    window_count: Annotated[int, Field(ge=1, le=HARD_LIMIT_WINDOW_COUNT_MAX)] | None = None
    """most executions allowed in one window"""
    window_sum_minor: MinorUnits | None = None
    """largest total amount (minor units) allowed in one window"""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "has(self.windowSeconds) == (has(self.windowCount) || has(self.windowSumMinor))",
                "windowSeconds goes with windowCount or windowSumMinor, and only with them",
            )
        )
    )


def _downstream_url(placeholder: str | None = None) -> AfterValidator:
    """The executor's one downstream URL validation (``config.check_downstream_url``, https
    only: the operator never renders ``DOWNSTREAM_ALLOW_INSECURE_LOOPBACK``), so admission,
    the reconcile and the executor's loader refuse the same URLs, in words without the URL."""

    def check(value: str) -> str:
        check_downstream_url(value, placeholder=placeholder)
        return value

    return AfterValidator(check)


class DownstreamCredentialSpec(_Model):
    """How the executor authenticates to the downstream; the secret stays in its Secret."""

    kind: CredentialKind = CredentialKind.STATIC_HEADER
    """how the credential is presented: STATIC_HEADER, PRIVATE_KEY_JWT or SIGNED_REQUEST"""
    secret_key_ref: SecretKeyRef
    """the Secret key holding the credential (mounted, never copied)"""
    header: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="STATIC_HEADER: the header that carries the credential"
    )
    token_url: Annotated[str, Field(max_length=2048), _downstream_url()] | None = None
    """OAuth token endpoint (https), PRIVATE_KEY_JWT"""
    client_id: Text | None = None
    """OAuth client id, PRIVATE_KEY_JWT"""
    key_id: Text | None = Field(default=None, description="PRIVATE_KEY_JWT / SIGNED_REQUEST")
    private_key_algorithm: PrivateKeyAlgorithm | None = None
    """JWS algorithm of the private key (PRIVATE_KEY_JWT, SIGNED_REQUEST)"""
    signing_algorithm: SigningAlgorithm | None = None
    """the request-signing algorithm (SIGNED_REQUEST)"""
    token_audience: Text | None = None
    """audience of the client assertion (PRIVATE_KEY_JWT)"""
    token_scope: Text | None = None
    """OAuth scope requested with the token"""

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

    url: Annotated[str, Field(min_length=1, max_length=2048), _downstream_url()]
    """the downstream endpoint executions are sent to (https)"""
    lookup_url: (
        Annotated[str, Field(max_length=2048), _downstream_url(IDEMPOTENCY_KEY_PLACEHOLDER)] | None
    ) = None
    """the downstream's lookup endpoint for reconciling unknown attempts"""
    lookup_by_reference_url: (
        Annotated[str, Field(max_length=2048), _downstream_url(PROVIDER_REFERENCE_PLACEHOLDER)]
        | None
    ) = None
    """the downstream's lookup-by-reference endpoint"""
    system: Text
    """the downstream system's name, pinned into every intent"""
    operation: Text
    """the downstream operation's name, pinned into every intent"""
    timeout_ms: Annotated[int, Field(ge=1, le=DOWNSTREAM_TIMEOUT_MS_MAX)] = (
        DOWNSTREAM_TIMEOUT_MS_DEFAULT
    )
    """how long one downstream call may take, in milliseconds"""
    credential: DownstreamCredentialSpec
    """how the executor authenticates to the downstream"""
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
    """StorageClass of the journal's PersistentVolumeClaim (default: the cluster's)"""
    size: Annotated[str, Field(pattern=_QUANTITY, max_length=32)] | None = None
    """size of the journal's PersistentVolumeClaim (a Kubernetes quantity)"""
    ephemeral: bool = False
    """use an emptyDir instead of a claim (tests only: attempts do not survive the pod)"""

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
    """the lowest TLS version the executor accepts"""


class StoreSpec(_Model):
    """The shared PostgreSQL store every replica uses (``EXECUTOR_STORE_URL_FILE``).

    The Secret key holds a ``postgresql://`` URL (CloudNativePG's ``<cluster>-app`` Secret has one
    under ``uri``); the executors get egress to the database's pods (``podSelector``, in
    ``namespace`` or the policy's own) or to ``cidrs``, on ``port``, and nowhere else new.
    """

    secret_key_ref: SecretKeyRef = Field(description="the Secret key holding the URL")
    port: Annotated[int, Field(ge=1, le=65535)] = 5432
    """the database's TCP port (egress is opened to it only)"""
    pod_selector: LabelSelector | None = Field(
        default=None, description="the database's pods, e.g. cnpg.io/cluster: <name>"
    )
    namespace: DnsLabel | None = Field(
        default=None, description="where those pods run; defaults to the policy's namespace"
    )
    cidrs: list[Annotated[str, Field(min_length=3, max_length=43)]] | None = Field(
        default=None, max_length=16, description="or: the database's networks"
    )

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "has(self.podSelector) || has(self.cidrs)",
                "say where the database is: podSelector or cidrs",
            ),
            ("!has(self.namespace) || has(self.podSelector)", "namespace goes with podSelector"),
        )
    )


RESOURCE_QUANTITY_PATTERN: Final = (
    r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
"""A compute resource quantity as Kubernetes reads one (apimachinery's ``ParseQuantity``): an
optional ``+``, a decimal number (group 1: ``1``, ``1.5``, ``1.``, ``.5``) and an optional suffix
(group 2): binary (``Ki`` .. ``Ei``), decimal SI (``n``, ``u``, ``m``, ``k``, ``M`` .. ``E``) or a
decimal exponent (``e3``, ``E-3``, ``e+6``). A negative quantity parses in Kubernetes but no pod
may request one (its validation refuses it), so here it is refused at once."""
_QUANTITY_TEXT: Final = re.compile(RESOURCE_QUANTITY_PATTERN)


def _resource_quantity(value: object) -> int | str:
    """A whole number of at least 0, or a string in the quantity grammar of at most 32
    characters; anything else (a float, a boolean, a negative) is refused, never echoed."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 0:
            return value
        raise ValueError("a resource quantity cannot be negative")
    if isinstance(value, str) and len(value) <= 32 and _QUANTITY_TEXT.fullmatch(value):
        return value
    raise ValueError(
        "must be a Kubernetes quantity: a whole number, or a string such as 500m, 1.5, .5, 2Gi,"
        " 1e9 or 100u"
    )


ResourceQuantity = Annotated[
    int | str,
    PlainValidator(_resource_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "pattern": RESOURCE_QUANTITY_PATTERN,
            "maxLength": 32,
        }
    ),
]
"""An integer (``cpu: 1``) or a quantity string, as a Deployment's resources take them
(``x-kubernetes-int-or-string`` in the CRD)."""
_RESOURCE_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"
ResourceName = Annotated[str, Field(min_length=1, max_length=253, pattern=_RESOURCE_NAME)]


class Toleration(_Model):
    """A Kubernetes toleration of a node taint (``kubectl explain pod.spec.tolerations``)."""

    key: Annotated[str, Field(max_length=317)] | None = Field(
        default=None, description="the taint key; empty with operator Exists tolerates every taint"
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (the default)"
    )
    value: Annotated[str, Field(max_length=63)] | None = Field(
        default=None, description="the taint value matched with operator Equal"
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="the taint effect tolerated; empty: every effect"
    )
    toleration_seconds: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="with NoExecute: how long the pod stays once tainted"
    )


class TopologySpreadConstraint(_Model):
    """How executor pods spread over a topology (``pod.spec.topologySpreadConstraints``)."""

    max_skew: Annotated[int, Field(ge=1)] = Field(description="the largest allowed imbalance")
    topology_key: Annotated[str, Field(min_length=1, max_length=317)] = Field(
        description="the node label naming the topology domain"
    )
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="DoNotSchedule or ScheduleAnyway"
    )
    label_selector: LabelSelector | None = Field(
        default=None, description="the pods counted; empty: this AgentPolicy's executor pods"
    )


class LocalObjectReference(_Model):
    """A Secret in the AgentPolicy's namespace, by name."""

    name: DnsSubdomain = Field(description="the Secret's name")


RESOURCES_PER_WORKER: Final[Mapping[str, Mapping[str, str]]] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"memory": "512Mi"},
}
"""The executor container's resources for each worker when ``spec.pod.resources`` is unset (the
render multiplies every quantity by the workers). ``requests.memory`` is also the least memory
limit per worker an explicit ``resources`` may give before it is warned about (one executor
process holds about 115-125 MiB resident: docs/performance.md)."""
WORKER_MEMORY: Final = RESOURCES_PER_WORKER["requests"]["memory"]
_PER_WORKER_TEXT: Final = (
    f"requests cpu {RESOURCES_PER_WORKER['requests']['cpu']}, memory {WORKER_MEMORY}, "
    f"limit memory {RESOURCES_PER_WORKER['limits']['memory']}"
)


class ResourceRequirementsSpec(_Model):
    """The executor container's compute resources."""

    requests: dict[ResourceName, ResourceQuantity] = Field(
        default_factory=dict, max_length=16, description="the scheduler reserves these"
    )
    limits: dict[ResourceName, ResourceQuantity] = Field(
        default_factory=dict, max_length=16, description="the kubelet enforces these"
    )


class ExecutorPodSpec(_Model):
    """Scheduling and resources of the executor pods; every field is passed to the StatefulSet's
    pod template as Kubernetes names it."""

    node_selector: dict[
        Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]
    ] = Field(default_factory=dict, max_length=64, description="node labels the pods must run on")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="node taints the pods tolerate"
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="a Kubernetes Affinity (nodeAffinity, podAffinity, podAntiAffinity); "
        "the API server validates it when the StatefulSet is written",
    )
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None,
        max_length=8,
        description="replace the default spread (hostname and zone, from 2 replicas on)",
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None, description="the pods' PriorityClass"
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=8, description="Secrets the kubelet pulls the image with"
    )
    resources: ResourceRequirementsSpec | None = Field(
        default=None,
        description="the executor container's requests and limits; default: "
        f"{_PER_WORKER_TEXT}, each multiplied by the workers (spec.workers)",
    )


class AgentPolicySpec(_Model):
    """What an executor may do, for whom, against which downstream."""

    mode: ExecutorMode = ExecutorMode.SHADOW
    """SHADOW (decide and record, never execute) or ENFORCEMENT"""
    policy: PolicyDocument
    """the policy document: actions, their parameter schemas and CEL rules"""
    tests: list[PolicyTestCase] = Field(
        default_factory=list,
        max_length=MAX_TEST_CASES,
        description="policy test cases (agent-safe.policy-test/1); all must pass before "
        "anything is rendered (docs/policy-testing.md)",
    )
    intent_ttl_seconds: Annotated[int, Field(ge=1, le=INTENT_TTL_SECONDS_MAX)] = Field(
        default=INTENT_TTL_SECONDS_DEFAULT, alias="intentTTLSeconds"
    )
    """how long a pinned intent stays valid before it must be proposed again"""
    host_ceilings: HostCeilingsSpec | None = None
    """hard ceilings on amounts and rates the executor enforces whatever the policy says"""
    escalation: EscalationMode = EscalationMode.NONE
    """what ESCALATE does: NONE (refused) or APPROVAL (an approver decides)"""
    approval_origin: (
        Annotated[str, Field(pattern=r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?$", max_length=256)]
        | None
    ) = Field(
        default=None,
        description="EXECUTOR_APPROVAL_ORIGIN: the approval page's https origin as people reach "
        "it; makes approval_url absolute and is the passkeys' relying party (escalation APPROVAL)",
    )
    replicas: Annotated[int, Field(ge=1, le=16)] = 1
    """how many executor pods; more than one needs store"""
    workers: Annotated[int, Field(ge=1, le=WORKERS_MAX)] | None = Field(
        default=None,
        description="EXECUTOR_WORKERS: executor worker processes per pod, behind one listener "
        "and sharing the pod's store and journal volume; unset: the operator's default "
        "(--executor-workers, chart executor.workers, normally 1). Each worker is a process of "
        f"its own, using up to one CPU core and about {WORKER_MEMORY} of memory. Without "
        f"spec.pod.resources the defaults ({_PER_WORKER_TEXT}) are multiplied by the workers; "
        "with it, a CPU limit below the workers in cores (they would be throttled) or a memory "
        f"limit below {WORKER_MEMORY} per worker (they would be OOM-killed) is a warning: at "
        "admission, in the Reconciled condition's message and as an Event",
    )
    store: StoreSpec | None = Field(
        default=None, description="the shared PostgreSQL store; required for replicas > 1"
    )
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        default=None, description="defaults to the operator's configured executor image"
    )
    downstream: DownstreamSpec
    """the one system this policy's executors change, and how they reach it"""
    journal: JournalSpec
    """where the executors keep their durable journal"""
    tls: TlsSpec
    """the executor's serving certificate and client CA"""
    principal_selector: LabelSelector = Field(default_factory=LabelSelector)
    """label selector over Principals in the namespace (empty: all)"""
    agent_namespaces: list[DnsLabel] = Field(default_factory=list, max_length=64)
    """namespaces whose pods may reach the executor and must not reach the downstream"""
    pod: ExecutorPodSpec = Field(
        default_factory=ExecutorPodSpec,
        description="scheduling (nodeSelector, tolerations, affinity, topologySpreadConstraints, "
        "priorityClassName), imagePullSecrets and resources of the executor pods",
    )
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
            (
                "!has(self.approvalOrigin) || self.escalation == 'APPROVAL'",
                "approvalOrigin needs escalation APPROVAL",
            ),
            (
                "!has(self.replicas) || self.replicas <= 1 || has(self.store)",
                "replicas > 1 needs store (a shared PostgreSQL): replicas with their own stores "
                "would execute a retried idempotency key twice",
            ),
        )
    )


class AgentPolicyStatus(ResourceStatus):
    """Conditions Reconciled and Ready; what the executors run and for whom."""

    mode: ExecutorMode | None = Field(default=None, description="the executors' mode")
    halted: bool = Field(default=False, description="a HaltSwitch halts this policy's executors")
    replicas: int | None = Field(default=None, description="executors asked for")
    workers: int | None = Field(
        default=None,
        description="worker processes per executor pod: spec.workers or the operator's default",
    )
    audience: str | None = Field(
        default=None, description="the audience agents' service-account tokens must carry"
    )
    principals: list[str] = Field(
        default_factory=list, description="the Principals in the executors' principals file"
    )
    policy_digest: str | None = Field(
        default=None, description="digest of the compiled policy the executors load"
    )


# --------------------------------------------------------------------------------------------
# Principal


PrincipalRole = Role
"""A Principal's role: the executor's own :class:`~agentsafe.executor.principals.Role`."""


def _operator_scope(value: str) -> str:
    if value not in frozenset(Scope):
        raise ValueError("must be one of " + ", ".join(sorted(Scope)))
    return value


OperatorScope = Annotated[
    str,
    AfterValidator(_operator_scope),
    WithJsonSchema({"type": "string", "enum": sorted(scope.value for scope in Scope)}),
]
"""One of the executor's operator scopes (:class:`~agentsafe.executor.principals.Scope`)."""


class ActorSpec(_Model):
    id: Text
    """the actor's id, recorded in evidence"""
    type: Text
    """the actor's type (e.g. agent, service, human)"""
    runtime: Text | None = None
    """the actor's runtime (e.g. the agent framework)"""


class RateLimitSpec(_Model):
    count: Annotated[int, Field(ge=1, le=1_000_000)]
    """most requests allowed in one window"""
    seconds: Annotated[int, Field(ge=1, le=86_400)]
    """the window's length in seconds"""


class ApproverRequirementSpec(_Model):
    """An APPROVER's own requirement (issue 21): the least verification of its decisions."""

    verification: Verification = Field(
        default=Verification.CREDENTIAL,
        description="CREDENTIAL (the principal's credential) or WEBAUTHN (also a passkey "
        "assertion with user verification, enrolled with a one-time token)",
    )


class ServiceAccountRef(_Model):
    name: DnsSubdomain
    """the ServiceAccount's name"""
    namespace: DnsLabel
    """the ServiceAccount's namespace"""


class BearerSpec(_Model):
    secret_key_ref: SecretKeyRef
    """the Secret key holding the bearer token (only its hash is rendered)"""


class MtlsSpec(_Model):
    san_uri: SanUri = Field(alias="sanURI")
    """the URI subject alternative name of the client certificate"""
    cert_sha256: Sha256Hex | None = Field(default=None, alias="certSHA256")
    """optionally pin the client certificate's SHA-256 fingerprint (hex)"""


class PrincipalSpec(_Model):
    """A caller of the executors whose AgentPolicy selects it (id = the object's name)."""

    role: Role
    """PROPOSER, OPERATOR or APPROVER"""
    tenant_id: Annotated[str, Field(pattern=_UUID)] | None = None
    """the tenant (UUID) the principal acts for"""
    actor: ActorSpec | None = None
    """who the principal is, as evidence records it"""
    allowed_actions: list[Text] | None = Field(default=None, max_length=MAX_ALLOWED_ACTIONS)
    """the actions a PROPOSER may propose (empty: none)"""
    scopes: list[OperatorScope] | None = Field(default=None, max_length=MAX_SCOPES)
    """what an OPERATOR may do (halt, resume, metrics, ...)"""
    rate_limit: RateLimitSpec | None = None
    """the principal's request rate limit"""
    approval: ApproverRequirementSpec | None = None
    """an APPROVER's requirement on its own decisions"""
    service_account: ServiceAccountRef | None = None
    """authenticate by this ServiceAccount's projected token"""
    bearer: BearerSpec | None = None
    """authenticate by a bearer token held in a Secret"""
    mtls: MtlsSpec | None = None
    """authenticate by a client certificate"""

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
            (
                "self.role == 'APPROVER' || !has(self.approval)",
                "only an APPROVER carries approval",
            ),
        )
    )

    def credential_kind(self) -> str:
        if self.service_account is not None:
            return "ServiceAccount"
        if self.bearer is not None:
            return "Bearer"
        return "MTLS"


class PrincipalStatus(ResourceStatus):
    """Condition Ready; how the Principal proves itself and which policies select it."""

    credential: str | None = Field(default=None, description="ServiceAccount, Bearer or MTLS")
    policies: int = Field(default=0, description="how many AgentPolicies select it")
    selected_by: list[str] = Field(default_factory=list, description="their names")


# --------------------------------------------------------------------------------------------
# HaltSwitch


class HaltSwitchSpec(_Model):
    """Stop every selected executor: durable (the halt file) and immediate (the control route)."""

    halted: bool
    """true stops every selected executor; false resumes them"""
    reason: Annotated[str, Field(max_length=MAX_REASON_CHARS)] | None = None
    """why, recorded in evidence (required when halted)"""
    policy_selector: LabelSelector = Field(default_factory=LabelSelector)
    """label selector over AgentPolicies in the namespace (empty: all)"""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!self.halted || (has(self.reason) && size(self.reason) > 0)",
                "a reason is required when halted",
            ),
        )
    )


class HaltPodStatus(_Model):
    """One executor pod's answer to the switch's last control call."""

    policy: str
    """the AgentPolicy the pod belongs to"""
    pod: str
    """the executor pod's name"""
    acknowledged: bool
    """the pod acknowledged the switch's last call"""
    at: str | None = Field(
        default=None, description="when it acknowledged", json_schema_extra={"format": "date-time"}
    )
    error: str | None = Field(
        default=None, description="why not: the HTTP status and error code, or the failure"
    )


class HaltSwitchStatus(ResourceStatus):
    """Condition Ready; which executors acknowledged the switch's last call."""

    halted: bool = Field(default=False, description="the last call was a halt (false: resume)")
    acknowledged: str | None = Field(default=None, description="acknowledged pods / pods")
    policies: list[str] = Field(default_factory=list, description="the AgentPolicies it selects")
    pods: list[HaltPodStatus] = Field(default_factory=list)
    """each executor pod's answer"""
