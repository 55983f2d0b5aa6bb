"""The plan policy: which tools, effects and sources a plan may use, and its ceilings.

:class:`PlanPolicy` is the ``plans`` section of an AgentPolicy spec and of the executor's policy
document; it is modelled once here (camelCase on the wire) so the operator's CRD schema comes
from the same model. Every ceiling is bounded by
:data:`~agentsafe.executor.plans.limits.AGENT_SAFETY_HARD_LIMITS`; a policy asking for more is
refused, not clamped. ``allowedEffects`` defaults to ``["read"]``: any other effect is an explicit
opt-in.

:func:`load_plan_policy` takes either a :class:`PlanPolicy` or plain JSON data, snapshots it once
(exact JSON types only, see ``snapshot.py``) and validates the model from that snapshot, so the
digest, the revalidation and the limits all come from the same frozen copy.

Callers: every public operation; ``service.py``; the executor's policy document; the operator.
Also imported by ``__init__.py``, ``approval.py``, ``dryrun.py``, ``execute.py``,
``mcp_adapter.py``, ``receipts.py``, ``policy/policy.py``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..canonical import canonical_json, sha256_digest
from ..codes import Code
from .citations import canonical_origin, canonical_resource_prefix
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS as HARD
from .limits import DEFAULT_POLICY_LIMITS as DEFAULTS
from .snapshot import Budget, freeze

__all__ = [
    "IDENTIFIER_PATTERN",
    "Effect",
    "LoadedPolicy",
    "PlanPolicy",
    "SourcePolicy",
    "load_plan_policy",
]

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$"
Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]


class Effect(StrEnum):
    """The finite set of effects a step may declare."""

    READ = "read"
    WRITE = "write"
    PUBLISH = "publish"
    SHARE = "share"
    SUBSCRIBE = "subscribe"
    JOB = "job"


def _unique(values: list[str], what: str) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} has duplicates")
    return values


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, use_attribute_docstrings=True
    )


class SourcePolicy(_Model):
    """What a plan may read from one source and how fresh and attributable it must be."""

    fields: list[Identifier] = Field(
        min_length=1, max_length=HARD["maxCollectionLength"], description="readable fields"
    )
    authorization_scope: list[Identifier] = Field(
        alias="authorizationScope",
        min_length=1,
        max_length=HARD["maxCollectionLength"],
        description="authorization-scope identifiers a binding may carry",
    )
    schema_versions: list[Identifier] = Field(
        alias="schemaVersions", min_length=1, max_length=HARD["maxCollectionLength"]
    )
    """schema versions of the source a plan may cite"""
    source_versions: list[Identifier] = Field(
        alias="sourceVersions", min_length=1, max_length=HARD["maxCollectionLength"]
    )
    """versions of the source a plan may cite"""
    data_modes: list[Identifier] = Field(
        alias="dataModes", min_length=1, max_length=16, description="e.g. live, snapshot"
    )
    max_provenance_age_ms: int = Field(
        alias="maxProvenanceAgeMs", ge=0, le=HARD["maxProvenanceAgeMs"]
    )
    """how old a cited read may be, in milliseconds"""
    citation_origins: list[str] = Field(
        alias="citationOrigins", min_length=1, max_length=64, description="https origins"
    )
    citation_resource_prefixes: list[str] = Field(
        alias="citationResourcePrefixes",
        min_length=1,
        max_length=64,
        description="absolute path prefixes, matched segment-wise after decoding",
    )

    @field_validator("fields", "authorization_scope", "schema_versions", "source_versions")
    @classmethod
    def _no_duplicates(cls, values: list[str]) -> list[str]:
        return _unique(values, "the list")

    @field_validator("data_modes")
    @classmethod
    def _modes(cls, values: list[str]) -> list[str]:
        return _unique(values, "dataModes")

    @field_validator("citation_origins")
    @classmethod
    def _origins(cls, values: list[str]) -> list[str]:
        try:
            out = [canonical_origin(v) for v in values]
        except AgentSafetyError as exc:
            raise ValueError(exc.message) from None
        return _unique(out, "citationOrigins")

    @field_validator("citation_resource_prefixes")
    @classmethod
    def _prefixes(cls, values: list[str]) -> list[str]:
        try:
            out = [canonical_resource_prefix(v) for v in values]
        except AgentSafetyError as exc:
            raise ValueError(exc.message) from None
        return _unique(out, "citationResourcePrefixes")


def _ceiling(name: str, *, minimum: int = 1) -> Any:
    return Field(default=DEFAULTS[name], alias=name, ge=minimum, le=HARD[name])


class PlanPolicy(_Model):
    """The ``plans`` section of a policy: tools, effects, sources and ceilings."""

    allowed_tools: list[Identifier] = Field(
        default_factory=list, alias="allowedTools", max_length=HARD["maxCollectionLength"]
    )
    """tools a plan may call"""
    allowed_effects: list[Effect] = Field(
        default_factory=lambda: [Effect.READ],
        alias="allowedEffects",
        description="omitted means read only; anything else is an explicit opt-in",
    )
    sources: dict[Identifier, SourcePolicy] = Field(
        default_factory=dict, max_length=HARD["maxSources"]
    )
    """the sources a plan may read, by name"""
    max_steps: int = _ceiling("maxSteps")
    """most steps in one plan"""
    max_rows: int = _ceiling("maxRows")
    """most rows a plan may read"""
    max_bytes: int = _ceiling("maxBytes")
    """most bytes a plan may read"""
    max_fields_per_step: int = _ceiling("maxFieldsPerStep")
    """most fields one step may read"""
    max_authorization_scopes_per_source: int = _ceiling("maxAuthorizationScopesPerSource")
    """most authorization scopes per source binding"""
    max_citations_per_source: int = _ceiling("maxCitationsPerSource")
    """most citations per source"""
    max_operation_parameter_bytes: int = _ceiling("maxOperationParameterBytes", minimum=2)
    """largest operation parameters, in bytes"""
    max_operation_parameter_nodes: int = _ceiling("maxOperationParameterNodes")
    """most JSON nodes in operation parameters"""
    max_operation_parameter_depth: int = _ceiling("maxOperationParameterDepth")
    """deepest nesting of operation parameters"""
    max_approval_lifetime_ms: int = _ceiling("maxApprovalLifetimeMs")
    """how long a plan's approval stays valid, in milliseconds"""

    @field_validator("allowed_tools")
    @classmethod
    def _tools(cls, values: list[str]) -> list[str]:
        return _unique(values, "allowedTools")

    @field_validator("allowed_effects")
    @classmethod
    def _effects(cls, values: list[Effect]) -> list[Effect]:
        if len(set(values)) != len(values):
            raise ValueError("allowedEffects has duplicates")
        return values

    @model_validator(mode="after")
    def _source_ceilings(self) -> PlanPolicy:
        for source in self.sources.values():
            if len(source.fields) > HARD["maxCollectionLength"]:
                raise ValueError("a source lists too many fields")
        return self

    def document(self) -> dict[str, Any]:
        """The canonical JSON form (camelCase, defaults filled) that the digest covers."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        return data

    def digest(self) -> str:
        return sha256_digest(self.document())


class LoadedPolicy:
    """A validated policy and the digest of the snapshot it was validated from."""

    __slots__ = ("digest", "model")

    def __init__(self, model: PlanPolicy) -> None:
        self.model = model
        self.digest = model.digest()


def load_plan_policy(policy: object, budget: Budget) -> LoadedPolicy:
    """Snapshot ``policy`` once (a :class:`PlanPolicy` or plain JSON data) and validate the
    model from the snapshot. Refusals are ``POLICY_INVALID`` naming the field path only."""
    if type(policy) is PlanPolicy:
        source: object = policy.document()
    elif type(policy) is dict:
        source = policy
    else:
        raise AgentSafetyError(
            "the policy must be a PlanPolicy or a plain JSON object", code=Code.POLICY_INVALID
        )
    try:
        snapshot = freeze(source, budget)
    except AgentSafetyError as exc:
        raise AgentSafetyError(
            f"the policy is not plain bounded JSON ({exc.code})", code=Code.POLICY_INVALID
        ) from None
    try:
        model = PlanPolicy.model_validate_json(canonical_json(snapshot), strict=True)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "policy"
        raise AgentSafetyError(f"{where}: {first['msg']}", code=Code.POLICY_INVALID) from None
    return LoadedPolicy(model)
