"""The custom resources state the executor's rules, not copies of them.

Each bound the CRD schema gives a field that is rendered into the executor is compared with the
rule the executor itself enforces: its configuration model's field (what ``load_config``
refuses), its principals-file model, its roles and operator scopes. A literal typed again on
either side, and later changed on one, fails here.
"""

from __future__ import annotations

from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from agentsafe.executor.config import WORKERS_DEFAULT, WORKERS_MAX, ExecutorConfig
from agentsafe.executor.door.principals_file import PrincipalEntry
from agentsafe.executor.host.halt import MAX_REASON_CHARS
from agentsafe.executor.principals import Role, Scope
from agentsafe.operator.crds import structural_schema
from agentsafe.operator.models import AgentPolicySpec, HaltSwitchSpec, PrincipalSpec
from agentsafe.operator.settings import OperatorSettings


def _executor_bounds(attribute: str) -> tuple[Any, Any, Any]:
    """(minimum, maximum, default) of one executor configuration field."""
    field = ExecutorConfig.model_fields[attribute]
    low = next(m.ge for m in field.metadata if isinstance(m, annotated_types.Ge))
    high = next(m.le for m in field.metadata if isinstance(m, annotated_types.Le))
    return low, high, field.default


def _node(model: type[BaseModel], path: str) -> dict[str, Any]:
    node = structural_schema(model)
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


@pytest.mark.parametrize(
    ("path", "attribute"),
    [
        ("intentTTLSeconds", "executor_intent_ttl_seconds"),
        ("downstream.timeoutMs", "downstream_timeout_ms"),
        ("hostCeilings.windowSeconds", "executor_hard_limit_window_seconds"),
        ("hostCeilings.windowCount", "executor_hard_limit_window_count"),
        ("hostCeilings.windowSumMinor", "executor_hard_limit_window_sum_minor"),
    ],
)
def test_agentpolicy_ranges_are_the_executors(path: str, attribute: str) -> None:
    node = _node(AgentPolicySpec, path)
    low, high, default = _executor_bounds(attribute)
    assert (node["minimum"], node["maximum"]) == (low, high)
    assert node.get("default") == default


def test_a_single_ceiling_is_bounded_as_the_executor_bounds_a_sum() -> None:
    single = _node(AgentPolicySpec, "hostCeilings.single")["additionalProperties"]
    low, high, _ = _executor_bounds("executor_hard_limit_window_sum_minor")
    assert (single["minimum"], single["maximum"]) == (low, high)


def test_roles_and_scopes_are_the_executors() -> None:
    assert _node(PrincipalSpec, "role")["enum"] == [role.value for role in Role]
    assert set(_node(PrincipalSpec, "scopes.[]")["enum"]) == set(Scope)
    executor = PrincipalEntry.model_json_schema()
    entry = executor["properties"]
    for name, camel in (("allowed_actions", "allowedActions"), ("scopes", "scopes")):
        assert _node(PrincipalSpec, camel)["maxItems"] == entry[name]["anyOf"][0]["maxItems"]


def test_an_mtls_principal_is_checked_as_the_executor_checks_it() -> None:
    mtls = _node(PrincipalSpec, "mtls")["properties"]
    executor = PrincipalEntry.model_json_schema()["$defs"]["MtlsCredential"]["properties"]
    for key in ("minLength", "maxLength", "pattern"):
        assert mtls["sanURI"][key] == executor["san_uri"][key]
    assert mtls["certSHA256"]["pattern"] == executor["cert_sha256"]["anyOf"][0]["pattern"]


def test_the_worker_count_is_bounded_as_the_executor_bounds_it() -> None:
    """spec.workers states the executor's bounds of EXECUTOR_WORKERS (config.WORKERS_MAX), and
    has no default of its own: unset, the operator's default applies (itself WORKERS_DEFAULT
    unless --executor-workers says otherwise)."""
    node = _node(AgentPolicySpec, "workers")
    assert (node["minimum"], node["maximum"]) == (1, WORKERS_MAX)
    assert "default" not in node
    assert OperatorSettings().executor_workers == WORKERS_DEFAULT


def test_a_halt_reason_fits_the_executors_control_route() -> None:
    assert _node(HaltSwitchSpec, "reason")["maxLength"] == MAX_REASON_CHARS


def test_an_unknown_scope_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="must be one of approvers, evidence, halt"):
        PrincipalSpec.model_validate(
            {
                "role": "OPERATOR",
                "scopes": ["root"],
                "bearer": {"secretKeyRef": {"name": "a", "key": "b"}},
            }
        )
