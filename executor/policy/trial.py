"""Policy tests: cases that say what a policy must answer, run offline through the authority.

A policy author writes the answers a policy must give next to the policy, the way ``opa test`` and
``kyverno test`` work, and runs them before anything is deployed. A test file is YAML (or JSON)
named ``<policy>.test.yaml`` beside the policy it tests (``policy.yaml`` ->
``policy.test.yaml``)::

    version: agent-safe.policy-test/1
    policy: policy.yaml          # optional, relative to this file; default: name without .test
    tests:
      - name: a small payout is allowed
        principal: &agent            # who proposes (YAML anchors let later cases reuse it)
          id: payments-agent
          tenantId: 7c0e5f2a-4d1b-4c3e-9f60-2b8a1d9e0c11
          actor: {id: agent-7, type: ai_agent}
        proposal:
          action: create_payout
          resource: payouts
          parameters: {amountMinor: 4200, currency: EUR}
        expect:
          verdict: ALLOW
          reasonCodes: [POLICY_ALLOWED]
      - name: a medium payout waits for the treasury lead, who approves it
        principal: *agent
        proposal: {action: create_payout, resource: payouts,
                   parameters: {amountMinor: 20000, currency: EUR}}
        approval: {approver: treasury-lead, decision: APPROVE}   # optional: evaluate again with it
        expect: {verdict: ALLOW, reasonCodes: [APPROVED_BY_APPROVER], rule: medium}

``expect`` always names the ``verdict``; ``reasonCodes``, ``approvers`` and ``rule`` are compared
exactly when given. A case may set ``now`` (the authority's clock, RFC 3339 UTC with
milliseconds; default :data:`DEFAULT_NOW`), ``target`` (the configured downstream target) and
``correlationId``. :class:`PolicyTestCase` is also what an AgentPolicy carries in ``spec.tests``
(the operator runs them before it renders anything).

Each case is captured into a real ``agent-safe.intent/1`` (``intent.capture_intent``) and decided
by :func:`~agentsafe.executor.policy.authority.evaluate_policy`, the code
:class:`~agentsafe.executor.policy.authority.LocalAuthority` decides with in ``agentsafe serve``;
no key, store, network or process is involved. :func:`explain_case` returns the same evaluation
with every step (``agentsafe policy explain``).

Every refusal of a test file is a :class:`~agentsafe.executor.errors.PolicyError` with the code
``POLICY_TEST_INVALID`` and the path of the offending field.

Callers: ``tools/policy_cli.py`` (``agentsafe policy test|explain``), the operator
(``spec.tests`` of an AgentPolicy).
Also imported by ``operator/models.py``, ``operator/render/children.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from ..clock import parse_ms
from ..codes import Code
from ..errors import PolicyError
from ..intent import CapturedIntent, DownstreamTarget, capture_intent
from ..principals import Actor, Principal, Role
from .authority import Evaluation, Verdict, evaluate_policy
from .policy import CompiledPolicy, compile_policy, load_policy, read_document

__all__ = [
    "DEFAULT_NOW",
    "DEFAULT_TARGET",
    "MAX_TEST_CASES",
    "TEST_FILE_SUFFIX",
    "TEST_VERSION",
    "CaseResult",
    "Expectation",
    "PolicyTestCase",
    "PolicyTestFile",
    "Proposal",
    "TestPrincipal",
    "discover_test_files",
    "explain_case",
    "load_test_file",
    "policy_for",
    "run_case",
    "run_cases",
]

TEST_VERSION = "agent-safe.policy-test/1"
TEST_FILE_SUFFIX = ".test"
MAX_TEST_CASES = 500
DEFAULT_NOW = "2026-01-01T00:00:00.000Z"
"""The authority's clock for a case that sets no ``now``: fixed, so a test never drifts."""
DEFAULT_TARGET = DownstreamTarget(
    system="policy-test", operation="policy-test", endpoint="https://downstream.invalid/"
)
_INTENT_TTL_SECONDS = 300
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$"
_CODE = r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$"
_Text = Annotated[str, Field(min_length=1, max_length=512)]


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class ActorSpec(_Model):
    id: _Text
    """the actor's id"""
    type: _Text
    """the actor's type"""
    runtime: _Text | None = None
    """the actor's runtime"""


class TestPrincipal(_Model):
    """The PROPOSER a case proposes as (what the door would have authenticated)."""

    __test__ = False  # not a pytest class

    id: Annotated[str, Field(pattern=_NAME)]
    """the principal's id"""
    tenant_id: _Text
    """the principal's tenant"""
    actor: ActorSpec
    """the principal's actor"""

    def principal(self) -> Principal:
        return Principal(
            id=self.id,
            role=Role.PROPOSER,
            tenant_id=self.tenant_id,
            actor=Actor(id=self.actor.id, type=self.actor.type, runtime=self.actor.runtime),
        )


class Proposal(_Model):
    """What the agent proposes: the body of ``POST /v1/actions`` without its envelope."""

    action: Annotated[str, Field(min_length=1, max_length=128)]
    """the proposed action's name"""
    resource: Annotated[str, Field(min_length=1, max_length=512)]
    """the resource the action changes"""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """the action's parameters"""
    correlation_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    """the caller's correlation id"""


class TargetSpec(_Model):
    system: _Text
    """the downstream system"""
    operation: _Text
    """the downstream operation"""
    endpoint: _Text
    """the downstream endpoint"""


class ApprovalSpec(_Model):
    """An approver's decision on the escalated intent; the case is evaluated again with it."""

    approver: Annotated[str, Field(pattern=_NAME)]
    """the approving principal's id"""
    decision: Literal["APPROVE", "DENY"]
    """APPROVE or DENY"""
    approver_actor: _Text | None = None
    """the approver's actor id"""


class Expectation(_Model):
    verdict: Verdict
    """the expected verdict"""
    reason_codes: tuple[Annotated[str, Field(pattern=_CODE, max_length=64)], ...] | None = None
    """the expected reason codes"""
    approvers: tuple[Annotated[str, Field(pattern=_NAME)], ...] | None = None
    """the expected approvers (ESCALATE)"""
    rule: Annotated[str, Field(pattern=_NAME)] | None = None
    """the rule expected to decide"""


class PolicyTestCase(_Model):
    """One case: who proposes what, when, and the answer the policy must give."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    """the case's name"""
    principal: TestPrincipal
    """who proposes"""
    proposal: Proposal
    """what is proposed"""
    expect: Expectation
    """the expected decision"""
    now: Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")] | None = (
        None
    )
    """the clock for the case (RFC 3339, milliseconds, UTC)"""
    target: TargetSpec | None = None
    """the downstream target (default: the policy's)"""
    approval: ApprovalSpec | None = None
    """an approver's decision, for ESCALATE cases"""


class PolicyTestFile(_Model):
    """A whole ``agent-safe.policy-test/1`` file."""

    version: Literal["agent-safe.policy-test/1"]
    policy: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    tests: tuple[PolicyTestCase, ...] = Field(min_length=1, max_length=MAX_TEST_CASES)


@dataclass(frozen=True)
class CaseResult:
    """A case run: ``failures`` is empty when the policy answered as expected."""

    name: str
    evaluation: Evaluation
    intent: CapturedIntent
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_json(self) -> dict[str, Any]:
        ev = self.evaluation
        return {
            "name": self.name,
            "passed": self.passed,
            "failures": list(self.failures),
            "verdict": ev.verdict.value,
            "reasonCodes": list(ev.reason_codes),
            "approvers": list(ev.approvers),
            "rule": ev.rule,
        }


def load_test_file(path: str | Path) -> PolicyTestFile:
    """Read and validate a test file; refuses with ``POLICY_TEST_INVALID`` and the field's path."""
    data = read_document(path, code=Code.POLICY_TEST_INVALID, what="policy test file")
    return parse_test_file(data)


def parse_test_file(data: Any) -> PolicyTestFile:
    try:
        return PolicyTestFile.model_validate(data)
    except ValidationError as exc:
        raise _refusal(exc) from None


def parse_cases(data: Any) -> tuple[PolicyTestCase, ...]:
    """Validate a list of cases (``spec.tests`` of an AgentPolicy)."""
    if not isinstance(data, list | tuple):
        raise PolicyError(
            "the tests are a list of cases", path="tests", code=Code.POLICY_TEST_INVALID
        )
    cases = []
    for index, item in enumerate(data):
        try:
            cases.append(PolicyTestCase.model_validate(item))
        except ValidationError as exc:
            raise _refusal(exc, prefix=f"tests[{index}]") from None
    return tuple(cases)


def policy_for(test_path: Path, test_file: PolicyTestFile) -> Path:
    """The policy a test file tests: its ``policy`` field, else its own name without ``.test``."""
    if test_file.policy is not None:
        return test_path.parent / test_file.policy
    stem = test_path.name
    for suffix in (".yaml", ".yml", ".json"):
        if stem.endswith(TEST_FILE_SUFFIX + suffix):
            return test_path.with_name(stem[: -len(TEST_FILE_SUFFIX + suffix)] + suffix)
    raise PolicyError(
        "cannot tell which policy this file tests: name it <policy>.test.yaml or set 'policy'",
        path="policy",
        code=Code.POLICY_TEST_INVALID,
    )


def discover_test_files(paths: Sequence[Path]) -> list[Path]:
    """Test files for each path: itself if a test file, its ``.test`` siblings if a policy, or
    every ``*.test.yaml|yml|json`` below it if a directory (sorted, so runs are reproducible)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            for pattern in ("*.test.yaml", "*.test.yml", "*.test.json"):
                found.extend(sorted(path.rglob(pattern)))
        elif _is_test_file(path):
            found.append(path)
        else:
            for suffix in (".yaml", ".yml", ".json"):
                sibling = path.with_name(path.stem + TEST_FILE_SUFFIX + suffix)
                if sibling.is_file():
                    found.append(sibling)
    unique: dict[Path, None] = dict.fromkeys(found)
    return list(unique)


def run_case(policy: CompiledPolicy, case: PolicyTestCase) -> CaseResult:
    """Capture the case's proposal into an intent, evaluate it, compare with ``expect``."""
    evaluation, intent = _evaluate(policy, case)
    return CaseResult(case.name, evaluation, intent, _compare(case.expect, evaluation))


def run_cases(policy: CompiledPolicy, cases: Sequence[PolicyTestCase]) -> list[CaseResult]:
    return [run_case(policy, case) for case in cases]


def explain_case(policy: CompiledPolicy, case: PolicyTestCase) -> dict[str, Any]:
    """Every step of the evaluation of one case, as JSON (``agentsafe policy explain``)."""
    evaluation, intent = _evaluate(policy, case)
    action = policy.actions.get(intent.action)
    steps: list[dict[str, Any]] = []
    if evaluation.stage.value != "EXPIRY":
        steps.append({"step": "action", "found": action is not None, "action": intent.action})
    if action is not None and evaluation.stage.value != "EXPIRY":
        problems = [
            {"path": _json_path(error.absolute_path), "problem": error.message}
            for error in sorted(
                action.validator.iter_errors(intent.parameters), key=lambda e: list(e.path)
            )
        ]
        steps.append({"step": "parameters", "valid": not problems, "problems": problems})
    for trial in evaluation.trials:
        steps.append(
            {
                "step": "rule",
                "rule": trial.rule,
                "path": trial.path,
                "when": trial.when,
                "result": "ERROR" if trial.matched is None else trial.matched,
            }
        )
    result = CaseResult(case.name, evaluation, intent, _compare(case.expect, evaluation))
    return {
        "case": case.name,
        "intentHash": intent.intent_hash,
        "decidedAt": evaluation.stage.value,
        "verdict": evaluation.verdict.value,
        "reasonCodes": list(evaluation.reason_codes),
        "rule": evaluation.rule,
        "approvers": list(evaluation.approvers),
        "because": _because(evaluation),
        "steps": steps,
        "expected": result.passed,
        "failures": list(result.failures),
    }


def load_compiled(policy_path: Path) -> CompiledPolicy:
    """Load and compile the policy a test file names (handlers are not checked offline)."""
    return compile_policy(load_policy(policy_path))


def _evaluate(policy: CompiledPolicy, case: PolicyTestCase) -> tuple[Evaluation, CapturedIntent]:
    now = parse_ms(case.now or DEFAULT_NOW)
    principal = case.principal.principal()
    target = (
        DownstreamTarget(case.target.system, case.target.operation, case.target.endpoint)
        if case.target is not None
        else DEFAULT_TARGET
    )
    # Fixed identifiers derived from the case, so a run is reproducible and its hash stable.
    seed = uuid.uuid5(uuid.NAMESPACE_URL, "agentsafe-policy-test:" + case.name)
    intent = capture_intent(
        principal=principal,
        action=case.proposal.action,
        resource=case.proposal.resource,
        parameters=case.proposal.parameters,
        idempotency_key=f"policy-test-{seed}",
        target=target,
        now=now,
        ttl_seconds=_INTENT_TTL_SECONDS,
        correlation_id=case.proposal.correlation_id,
        intent_id=str(uuid.UUID(bytes=seed.bytes, version=4)),
    )
    approval: Mapping[str, Any] | None = None
    if case.approval is not None:
        approval = {
            "decision": case.approval.decision,
            "approver": case.approval.approver,
            "approver_actor": case.approval.approver_actor,
            "request_id": f"policy-test-{seed}",
            "intent_hash": intent.intent_hash,
        }
    evaluation = evaluate_policy(policy, intent, principal=principal, now=now, approval=approval)
    return evaluation, intent


def _compare(expect: Expectation, got: Evaluation) -> tuple[str, ...]:
    failures: list[str] = []
    if got.verdict is not expect.verdict:
        failures.append(f"verdict: expected {expect.verdict.value}, got {got.verdict.value}")
    if expect.reason_codes is not None and tuple(expect.reason_codes) != got.reason_codes:
        failures.append(
            f"reasonCodes: expected {list(expect.reason_codes)}, "
            f"got {[str(code) for code in got.reason_codes]}"
        )
    if expect.approvers is not None and tuple(expect.approvers) != got.approvers:
        failures.append(f"approvers: expected {list(expect.approvers)}, got {list(got.approvers)}")
    if expect.rule is not None and expect.rule != got.rule:
        failures.append(f"rule: expected {expect.rule}, got {got.rule}")
    return tuple(failures)


def _because(evaluation: Evaluation) -> str:
    stage = evaluation.stage.value
    if stage == "EXPIRY":
        return "the intent had expired when the authority evaluated it"
    if stage == "ACTION":
        return "the policy has no action of that name"
    if stage == "PARAMETERS":
        return "the parameters do not satisfy the action's parameter schema"
    if stage == "NO_MATCH":
        return "no rule's 'when' was true"
    if stage == "APPROVAL":
        return f"rule {evaluation.rule} escalated, and the approval evidence decided"
    if evaluation.reason_codes == (Code.POLICY_EVALUATION_ERROR,):
        return f"rule {evaluation.rule}'s 'when' failed to evaluate (fail closed)"
    return f"rule {evaluation.rule} is the first whose 'when' is true"


def _json_path(parts: Sequence[Any]) -> str:
    out = "params"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _is_test_file(path: Path) -> bool:
    return any(path.name.endswith(TEST_FILE_SUFFIX + s) for s in (".yaml", ".yml", ".json"))


def _refusal(exc: ValidationError, *, prefix: str = "") -> PolicyError:
    error = exc.errors(include_url=False, include_input=False)[0]
    path = prefix
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    message = str(error["msg"]).removeprefix("Value error, ")
    return PolicyError(message, path=path or "test file", code=Code.POLICY_TEST_INVALID)
