"""The dry run: validate an untrusted plan against a policy and produce its effect budget.

Pure and deterministic: nothing here invokes a model, tool, source or executor. A plan is::

    {"id", "actor", "provider"?, "model"?, "steps": [
        {"id", "tool", "effect", "fields", "maxRows", "maxBytes", "queryPlanFingerprint",
         "parametersDigest", "operationDigest",
         "source": {"id", "schemaVersion", "sourceVersion", "authorizationScope", "dataMode",
                    "observedAt", "attribution", "citations"}}]}

Every step's ``operationDigest`` is recomputed from its visible tool, effect, source id, query
plan fingerprint, fields and parameters digest (:func:`operation_digest`), so the claims cannot
disagree. Refusals: unknown properties, non-plain values, invalid or duplicate values,
non-canonical timestamps, credentials (user info, query, fragment) in citations, conflicting
bindings of one source, unknown tools and sources, operation-input drift, disallowed effects or
fields, scope/version/data-mode drift, stale provenance, and row/byte overflow.

The dry run (an immutable snapshot) carries the normalised plan, the plan and policy digests,
one entry per step and the aggregate budget; :func:`dry_run_digest` is its identity, which an
approval signs.

Callers: ``dry_run_agent_plan`` (public), ``approval.py`` (revalidation), ``service.py``.
Also imported by ``__init__.py``, ``receipts.py``.
"""

from __future__ import annotations

from typing import Any

from ..canonical import sha256_digest
from ..clock import format_ms
from ..codes import Code
from .citations import canonical_citation, citation_allowed
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS as HARD
from .policy import Effect, LoadedPolicy, PlanPolicy, SourcePolicy, load_plan_policy
from .shapes import digest, identifier, integer, now_text, obj, seq, text, timestamp
from .snapshot import Budget, FrozenDict, envelope_budget, freeze, freeze_object

__all__ = [
    "DRY_RUN_VERSION",
    "binding_digest",
    "check_binding_fresh",
    "dry_run_agent_plan",
    "dry_run_digest",
    "evaluate_plan",
    "operation_digest",
    "read_binding",
]

DRY_RUN_VERSION = "agentsafe.plan-dry-run/1"
_PLAN = Code.PLAN_INVALID
_EFFECTS = frozenset(e.value for e in Effect)


def operation_digest(
    *,
    tool: str,
    effect: str,
    source_id: str,
    query_plan_fingerprint: str,
    fields: tuple[str, ...] | list[str],
    parameters_digest: str,
) -> str:
    """The operation-input digest, from the fields a reviewer can see."""
    return sha256_digest(
        {
            "tool": tool,
            "effect": effect,
            "sourceId": source_id,
            "queryPlanFingerprint": query_plan_fingerprint,
            "fields": list(fields),
            "parametersDigest": parameters_digest,
        }
    )


def binding_digest(binding: Any) -> str:
    return sha256_digest(binding)


def dry_run_digest(dry_run: Any) -> str:
    return sha256_digest(dry_run)


_BINDING_KEYS = frozenset(
    {
        "id",
        "schemaVersion",
        "sourceVersion",
        "authorizationScope",
        "dataMode",
        "observedAt",
        "attribution",
        "citations",
    }
)


def read_binding(
    value: Any, where: str, policy: PlanPolicy, *, code: Code
) -> tuple[FrozenDict, SourcePolicy, float]:
    """Validate one source binding against its source policy (not its freshness). Returns the
    normalised binding (canonical citations), its source policy and its observation time."""
    binding = obj(value, where, code=code, required=_BINDING_KEYS)
    source_id = identifier(binding["id"], f"{where}.id", code=code)
    source = policy.sources.get(source_id)
    if source is None:
        raise AgentSafetyError(f"{where}.id names an unknown source", code=Code.PLAN_SOURCE_UNKNOWN)
    schema_version = identifier(binding["schemaVersion"], f"{where}.schemaVersion", code=code)
    source_version = identifier(binding["sourceVersion"], f"{where}.sourceVersion", code=code)
    if schema_version not in source.schema_versions or source_version not in source.source_versions:
        raise AgentSafetyError(
            f"{where} has a version the policy does not allow", code=Code.PLAN_BINDING_DRIFT
        )
    scopes = seq(
        binding["authorizationScope"],
        f"{where}.authorizationScope",
        code=code,
        min_length=1,
        max_length=policy.max_authorization_scopes_per_source,
    )
    for index, scope in enumerate(scopes):
        identifier(scope, f"{where}.authorizationScope[{index}]", code=code)
    if len(set(scopes)) != len(scopes):
        raise AgentSafetyError(
            f"{where}.authorizationScope has duplicates", code=Code.PLAN_DUPLICATE
        )
    if not set(scopes) <= set(source.authorization_scope):
        raise AgentSafetyError(
            f"{where}.authorizationScope is outside the policy", code=Code.PLAN_BINDING_DRIFT
        )
    mode = identifier(binding["dataMode"], f"{where}.dataMode", code=code)
    if mode not in source.data_modes:
        raise AgentSafetyError(f"{where}.dataMode is not allowed", code=Code.PLAN_BINDING_DRIFT)
    observed = timestamp(binding["observedAt"], f"{where}.observedAt", code=Code.TIMESTAMP_INVALID)
    attribution = text(binding["attribution"], f"{where}.attribution", code=code)
    citations = seq(
        binding["citations"],
        f"{where}.citations",
        code=code,
        min_length=1,
        max_length=policy.max_citations_per_source,
    )
    canonical: list[str] = []
    for index, citation in enumerate(citations):
        url, origin, path = canonical_citation(citation)
        if not citation_allowed(
            origin,
            path,
            origins=source.citation_origins,
            prefixes=source.citation_resource_prefixes,
        ):
            raise AgentSafetyError(
                f"{where}.citations[{index}] is outside the allowlist", code=Code.CITATION_REFUSED
            )
        canonical.append(url)
    if len(set(canonical)) != len(canonical):
        raise AgentSafetyError(f"{where}.citations has duplicates", code=Code.PLAN_DUPLICATE)
    normalised = freeze(
        {
            "id": source_id,
            "schemaVersion": schema_version,
            "sourceVersion": source_version,
            "authorizationScope": list(scopes),
            "dataMode": mode,
            "observedAt": binding["observedAt"],
            "attribution": attribution,
            "citations": canonical,
        },
        _free(),
    )
    return normalised, source, observed


def check_binding_fresh(observed: float, source: SourcePolicy, now: float, where: str) -> None:
    if observed > now:
        raise AgentSafetyError(
            f"{where}.observedAt is in the future", code=Code.PLAN_PROVENANCE_INVALID
        )
    if round((now - observed) * 1000) > source.max_provenance_age_ms:
        raise AgentSafetyError(f"{where} provenance is stale", code=Code.PLAN_PROVENANCE_STALE)


def _free() -> Budget:
    # Normalised copies of already-budgeted input; bounded by what was spent on the input.
    big = 1 << 40
    return Budget(nodes=big, depth=HARD["maxEnvelopeDepth"], containers=big, bytes=big)


_STEP_KEYS = frozenset(
    {
        "id",
        "tool",
        "effect",
        "fields",
        "maxRows",
        "maxBytes",
        "queryPlanFingerprint",
        "parametersDigest",
        "operationDigest",
        "source",
    }
)


def evaluate_plan(plan: Any, loaded: LoadedPolicy, now: float) -> FrozenDict:
    """Validate a plan snapshot against a loaded policy at ``now``; return the dry run."""
    policy = loaded.model
    root = obj(
        plan,
        "plan",
        code=_PLAN,
        required=frozenset({"id", "actor", "steps"}),
        optional=frozenset({"provider", "model"}),
    )
    plan_id = identifier(root["id"], "plan.id", code=_PLAN)
    actor = text(root["actor"], "plan.actor", code=_PLAN)
    normalised_plan: dict[str, Any] = {"id": plan_id, "actor": actor}
    for key in ("provider", "model"):
        if key in root:
            normalised_plan[key] = text(root[key], f"plan.{key}", code=_PLAN)
    steps = seq(root["steps"], "plan.steps", code=_PLAN, min_length=1, max_length=HARD["maxSteps"])
    if len(steps) > policy.max_steps:
        raise AgentSafetyError(
            "the plan has more steps than the policy allows", code=Code.PLAN_LIMIT_EXCEEDED
        )
    allowed_tools = set(policy.allowed_tools)
    allowed_effects = {e.value for e in policy.allowed_effects}
    seen_ids: set[str] = set()
    bindings: dict[str, FrozenDict] = {}
    normalised_steps: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    total_rows = 0
    total_bytes = 0
    for index, raw in enumerate(steps):
        where = f"plan.steps[{index}]"
        step = obj(raw, where, code=_PLAN, required=_STEP_KEYS)
        step_id = identifier(step["id"], f"{where}.id", code=_PLAN)
        if step_id in seen_ids:
            raise AgentSafetyError(f"{where}.id repeats a step id", code=Code.PLAN_DUPLICATE)
        seen_ids.add(step_id)
        tool = identifier(step["tool"], f"{where}.tool", code=_PLAN)
        if tool not in allowed_tools:
            raise AgentSafetyError(f"{where}.tool is not allowed", code=Code.PLAN_TOOL_NOT_ALLOWED)
        effect = step["effect"]
        if type(effect) is not str or effect not in _EFFECTS:
            raise AgentSafetyError(f"{where}.effect is not an effect", code=_PLAN)
        if effect not in allowed_effects:
            raise AgentSafetyError(
                f"{where}.effect is not allowed", code=Code.PLAN_EFFECT_NOT_ALLOWED
            )
        binding, source, observed = read_binding(
            step["source"], f"{where}.source", policy, code=_PLAN
        )
        check_binding_fresh(observed, source, now, f"{where}.source")
        source_id = binding["id"]
        previous = bindings.get(source_id)
        if previous is not None and previous != binding:
            raise AgentSafetyError(
                f"{where}.source conflicts with an earlier binding", code=Code.PLAN_BINDING_CONFLICT
            )
        bindings[source_id] = binding
        fields = seq(
            step["fields"],
            f"{where}.fields",
            code=_PLAN,
            min_length=1,
            max_length=HARD["maxCollectionLength"],
        )
        if len(fields) > policy.max_fields_per_step:
            raise AgentSafetyError(
                f"{where}.fields exceeds the policy ceiling", code=Code.PLAN_LIMIT_EXCEEDED
            )
        for f_index, field in enumerate(fields):
            identifier(field, f"{where}.fields[{f_index}]", code=_PLAN)
        if len(set(fields)) != len(fields):
            raise AgentSafetyError(f"{where}.fields has duplicates", code=Code.PLAN_DUPLICATE)
        if not set(fields) <= set(source.fields):
            raise AgentSafetyError(
                f"{where}.fields names a field the policy does not allow",
                code=Code.PLAN_FIELD_NOT_ALLOWED,
            )
        max_rows = integer(
            step["maxRows"], f"{where}.maxRows", code=_PLAN, minimum=0, maximum=HARD["maxRows"]
        )
        max_bytes = integer(
            step["maxBytes"], f"{where}.maxBytes", code=_PLAN, minimum=1, maximum=HARD["maxBytes"]
        )
        if max_rows > policy.max_rows or max_bytes > policy.max_bytes:
            raise AgentSafetyError(
                f"{where} asks for more rows or bytes than the policy allows",
                code=Code.PLAN_LIMIT_EXCEEDED,
            )
        total_rows += max_rows
        total_bytes += max_bytes
        fingerprint = digest(
            step["queryPlanFingerprint"], f"{where}.queryPlanFingerprint", code=_PLAN
        )
        parameters = digest(step["parametersDigest"], f"{where}.parametersDigest", code=_PLAN)
        claimed = digest(step["operationDigest"], f"{where}.operationDigest", code=_PLAN)
        expected = operation_digest(
            tool=tool,
            effect=effect,
            source_id=source_id,
            query_plan_fingerprint=fingerprint,
            fields=fields,
            parameters_digest=parameters,
        )
        if claimed != expected:
            raise AgentSafetyError(
                f"{where}.operationDigest does not match its visible fields",
                code=Code.PLAN_OPERATION_DIGEST_MISMATCH,
            )
        normalised_steps.append(
            {
                "id": step_id,
                "tool": tool,
                "effect": effect,
                "fields": list(fields),
                "maxRows": max_rows,
                "maxBytes": max_bytes,
                "queryPlanFingerprint": fingerprint,
                "parametersDigest": parameters,
                "operationDigest": expected,
                "source": binding,
            }
        )
        entries.append(
            {
                "stepId": step_id,
                "tool": tool,
                "effect": effect,
                "sourceId": source_id,
                "operationDigest": expected,
                "bindingDigest": binding_digest(binding),
                "maxRows": max_rows,
                "maxBytes": max_bytes,
            }
        )
    if total_rows > policy.max_rows or total_bytes > policy.max_bytes:
        raise AgentSafetyError(
            "the plan's steps together exceed the policy's rows or bytes",
            code=Code.PLAN_LIMIT_EXCEEDED,
        )
    normalised_plan["steps"] = normalised_steps
    plan_snapshot = freeze(normalised_plan, _free())
    effects = sorted({entry["effect"] for entry in entries})
    return freeze_object(
        {
            "version": DRY_RUN_VERSION,
            "evaluatedAt": format_ms(now),
            "planDigest": sha256_digest(plan_snapshot),
            "policyDigest": loaded.digest,
            "plan": plan_snapshot,
            "steps": entries,
            "budget": {
                "steps": len(entries),
                "maxRows": total_rows,
                "maxBytes": total_bytes,
                "effects": effects,
            },
        },
        _free(),
    )


def dry_run_agent_plan(plan: object, policy: object, *, now: object) -> FrozenDict:
    """Validate ``plan`` against ``policy`` at ``now`` and return the immutable dry run.

    ``plan`` must be plain JSON data; ``policy`` a :class:`PlanPolicy` or plain JSON data;
    ``now`` a canonical timestamp or epoch seconds. Raises :class:`AgentSafetyError`.
    """
    now_s, _ = now_text(now)
    budget = envelope_budget()
    loaded = load_plan_policy(policy, budget)
    snapshot = freeze(plan, budget)
    return evaluate_plan(snapshot, loaded, now_s)
