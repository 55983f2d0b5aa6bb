"""The AgentPolicy admission review refuses what the reconcile would report, with the same words.

``review_policy`` is driven with the objects the API server would send; the kopf handler is
called as kopf's webhook server calls it. ``e2e/test_webhook_admission.py`` proves the same with
a real kube-apiserver calling the operator's webhook over TLS.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import kopf
import pytest

from agentsafe.executor.config import WORKERS_MAX
from agentsafe.operator.admission import ADMISSION_WEBHOOK_ID, AdmissionRefused, review_policy
from agentsafe.operator.handlers import build_registry, policy_admission_handler, policy_handler
from agentsafe.operator.runtime import Runtime
from agentsafe.operator.settings import OperatorSettings

from .conftest import memo_for

BROKEN_WHEN = "params.amountMinor <<< 1"


def _broken(policy_body: dict[str, Any], rule: int = 1, when: str = BROKEN_WHEN) -> dict[str, Any]:
    broken = copy.deepcopy(policy_body)
    broken["spec"]["policy"]["actions"][0]["rules"][rule]["when"] = when
    return broken


def _refusal(operation: str, body: dict[str, Any], old: dict[str, Any] | None = None) -> Any:
    with pytest.raises(AdmissionRefused) as info:
        review_policy(operation, body, old)
    return info.value


def test_a_valid_policy_is_admitted(policy_body: dict[str, Any]) -> None:
    review_policy("CREATE", policy_body)
    changed = copy.deepcopy(policy_body)
    changed["spec"]["policy"]["actions"][0]["rules"][0]["when"] = "params.amountMinor <= 100"
    review_policy("UPDATE", changed, policy_body)


def test_a_rule_that_does_not_compile_is_refused_by_path(policy_body: dict[str, Any]) -> None:
    refused = _refusal("CREATE", _broken(policy_body))
    assert refused.reason == "PolicyInvalid"
    assert refused.message.startswith("actions[0].rules[1].when: ")
    # An update that breaks a rule is refused too.
    refused = _refusal("UPDATE", _broken(policy_body, rule=2), policy_body)
    assert refused.message.startswith("actions[0].rules[2].when: ")


@pytest.mark.parametrize(
    ("when", "words"),
    [
        ("principal.role == secret", "undeclared reference"),
        ("sha256(params.iban) == 'x'", "unknown function"),
        ("   ", "expression is empty"),
    ],
)
def test_the_authoritys_own_compiler_decides(
    policy_body: dict[str, Any], when: str, words: str
) -> None:
    refused = _refusal("CREATE", _broken(policy_body, rule=0, when=when))
    assert refused.message.startswith("actions[0].rules[0].when: ")
    assert words in refused.message
    # The words say what is wrong, never what the object holds (issue 30, item 18).
    assert "secret" not in refused.message.removeprefix("actions[0].rules[0].when: ")
    assert "sha256" not in refused.message


@pytest.mark.parametrize(
    "when",
    [
        "params.amountMinor ^ SECRET_MARKER_7",  # cel-python quotes the source with a caret
        "params.amountMinor <<< SECRET_MARKER_7",
        "SECRET_MARKER_7 == 1",
        "SECRET_MARKER_7(params.amountMinor)",
    ],
)
def test_a_refused_expression_is_never_echoed(policy_body: dict[str, Any], when: str) -> None:
    """Issue 30, item 18: the refusal quoted the expression (the compiler's caret excerpt)."""
    refused = _refusal("CREATE", _broken(policy_body, rule=0, when=when))
    assert refused.reason == "PolicyInvalid"
    assert refused.message.startswith("actions[0].rules[0].when: ")
    assert "SECRET_MARKER_7" not in refused.message
    assert "^" not in refused.message


def test_a_refused_schema_pattern_is_never_echoed(policy_body: dict[str, Any]) -> None:
    """Issue 30, item 18: the refusal quoted the parameter schema's ``pattern``."""
    broken = copy.deepcopy(policy_body)
    schema = broken["spec"]["policy"]["actions"][0]["parameters"]
    schema.setdefault("properties", {})["memo"] = {"type": "string", "pattern": "SECRET_MARKER_7(("}
    refused = _refusal("CREATE", broken)
    assert refused.reason == "PolicyInvalid"
    assert refused.message.startswith("actions[0].parameters: invalid JSON Schema")
    assert "SECRET_MARKER_7" not in refused.message


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("url", "ftp://SECRET-HOST.example/payouts"),
        ("url", "https://SECRET-HOST.example:99999/payouts"),
        ("url", "https://user:SECRET-PASSWORD@bank.example/payouts"),
        ("url", "http://SECRET-HOST.example/payouts"),
        ("url", "https://bank.example/payouts#SECRET-FRAGMENT"),
        ("lookupUrl", "https://bank.example/payouts/SECRET-NO-PLACEHOLDER"),
    ],
)
def test_admission_refuses_the_downstream_urls_the_executor_refuses(
    policy_body: dict[str, Any], field: str, url: str
) -> None:
    """Issue 30, item 18: admission accepted URLs the reconcile and the executor's loader
    refuse. One validation (``config.check_downstream_url``) now decides for all three, and
    the refusal never holds the URL."""
    broken = copy.deepcopy(policy_body)
    broken["spec"]["downstream"][field] = url
    refused = _refusal("CREATE", broken)
    assert refused.reason == "SpecInvalid"
    assert refused.message.startswith(f"spec.downstream.{field}")
    assert "SECRET" not in refused.message
    # The executor's own loader refuses the same URL.
    from agentsafe.executor.config import check_downstream_url

    with pytest.raises(ValueError):
        check_downstream_url(url, placeholder="{idempotency_key}" if field == "lookupUrl" else None)


def test_a_parameter_schema_that_does_not_compile_is_refused(policy_body: dict[str, Any]) -> None:
    broken = copy.deepcopy(policy_body)
    broken["spec"]["policy"]["actions"][0]["parameters"] = {"type": "no-such-type"}
    refused = _refusal("CREATE", broken)
    assert refused.reason == "PolicyInvalid"
    assert refused.message.startswith("actions[0].parameters")


def test_a_loose_schema_serve_would_refuse_is_refused_by_path(policy_body: dict[str, Any]) -> None:
    """The same check as serve, config, doctor and policy lint (issue 31): an action the
    reference handler runs needs additionalProperties: false."""
    loose = copy.deepcopy(policy_body)
    assert loose["spec"]["policy"]["actions"][0]["handler"] == "forward_request"
    loose["spec"]["policy"]["actions"][0]["parameters"].pop("additionalProperties")
    refused = _refusal("CREATE", loose)
    assert refused.reason == "PolicyInvalid"
    assert refused.message.startswith("actions[0].parameters: ")
    assert "additionalProperties: false" in refused.message


def test_a_spec_the_model_refuses_is_spec_invalid_without_its_value(
    policy_body: dict[str, Any],
) -> None:
    broken = copy.deepcopy(policy_body)
    rule = broken["spec"]["policy"]["actions"][0]["rules"][1]
    rule["approvers"] = []
    refused = _refusal("CREATE", broken)
    assert refused.reason == "SpecInvalid"
    assert "approver" in refused.message
    broken = copy.deepcopy(policy_body)
    broken["spec"]["downstream"]["baseUrl"] = "https://secret-host.invalid:99999/x?token=hunter2"
    refused = _refusal("CREATE", broken)
    assert "hunter2" not in str(refused)
    assert "secret-host" not in str(refused)


def test_only_a_change_of_spec_is_reviewed(policy_body: dict[str, Any]) -> None:
    """An object stored before the webhook existed can still lose its finalizer and be
    deleted: metadata-only updates and deletions are admitted."""
    stored = _broken(policy_body)
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["finalizers"] = []
    review_policy("UPDATE", relabelled, stored)
    deleting = _broken(policy_body, rule=2)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    review_policy("UPDATE", deleting, stored)
    review_policy("DELETE", stored, stored)
    review_policy("CONNECT", stored)


async def test_the_refusal_is_the_condition_the_reconcile_reports(
    runtime: Runtime, policy_body: dict[str, Any]
) -> None:
    broken = _broken(policy_body)
    refused = _refusal("CREATE", broken)
    patch = kopf.Patch()
    await policy_handler(body=kopf.Body(broken), patch=patch, memo=memo_for(runtime))
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == (refused.reason, refused.message)


async def test_the_kopf_handler_answers_422_with_reason_and_path(
    policy_body: dict[str, Any],
) -> None:
    with pytest.raises(kopf.AdmissionError) as info:
        await policy_admission_handler(body=kopf.Body(_broken(policy_body)), operation="CREATE")
    assert info.value.code == 422
    text = str(info.value)
    assert text.startswith("AgentPolicy refused: PolicyInvalid: actions[0].rules[1].when: ")
    assert "spec.policy" in text
    assert "agentsafe policy lint" in text
    await policy_admission_handler(body=kopf.Body(policy_body), operation="CREATE")
    await policy_admission_handler(
        body=kopf.Body(_broken(policy_body)), old=_broken(policy_body), operation="UPDATE"
    )


def test_workers_over_their_limits_are_admitted_with_a_warning(
    policy_body: dict[str, Any],
) -> None:
    assert review_policy("CREATE", policy_body) == []
    tight = copy.deepcopy(policy_body)
    tight["spec"]["workers"] = 4
    tight["spec"]["pod"] = {"resources": {"limits": {"cpu": "1", "memory": "256Mi"}}}
    cpu, memory = review_policy("CREATE", tight)
    assert cpu.startswith("4 workers (spec.workers) share a CPU limit of 1:")
    assert memory.startswith("4 workers (spec.workers) share a memory limit of 256Mi:")
    # Unset, the operator's default counts: the one the webhook's operator runs with.
    unset = copy.deepcopy(tight)
    del unset["spec"]["workers"]
    assert review_policy("UPDATE", unset, tight) == []
    (cpu,) = review_policy("UPDATE", unset, tight, settings=OperatorSettings(executor_workers=2))
    assert cpu.startswith("2 workers (the operator's --executor-workers) share a CPU limit")
    # Out of range is refused before it is stored, as the CRD would.
    wrong = copy.deepcopy(policy_body)
    wrong["spec"]["workers"] = WORKERS_MAX + 1
    refused = _refusal("CREATE", wrong)
    assert refused.reason == "SpecInvalid"
    assert refused.message.startswith("spec.workers: ")


async def test_the_kopf_handler_hands_the_warnings_to_the_api_server(
    runtime: Runtime, policy_body: dict[str, Any]
) -> None:
    tight = copy.deepcopy(policy_body)
    tight["spec"]["pod"] = {"resources": {"limits": {"cpu": "500m"}}}
    rt = dataclasses.replace(
        runtime, settings=dataclasses.replace(runtime.settings, executor_workers=3)
    )
    warnings: list[str] = []
    await policy_admission_handler(
        body=kopf.Body(tight), operation="CREATE", warnings=warnings, memo=memo_for(rt)
    )
    (warning,) = warnings
    assert warning.startswith("3 workers (the operator's --executor-workers) share a CPU limit")
    warnings.clear()
    await policy_admission_handler(
        body=kopf.Body(policy_body), operation="CREATE", warnings=warnings, memo=memo_for(rt)
    )
    assert warnings == []


def test_the_validate_handler_is_registered_only_with_a_webhook() -> None:
    assert not build_registry()._webhooks.get_all_handlers()
    (handler,) = build_registry(admission=True)._webhooks.get_all_handlers()
    assert handler.id == ADMISSION_WEBHOOK_ID
    assert set(handler.operations or ()) == {"CREATE", "UPDATE"}
