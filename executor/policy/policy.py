"""The policy document: what may run, with which parameters, under which rules.

The document is modelled once here, in pydantic, and is exactly what a Kubernetes ``AgentPolicy``
carries in ``spec.policy`` (the operator imports :class:`PolicyDocument` to generate the CRD
schema and :func:`compile_policy` to refuse an invalid policy before rendering anything)::

    actions:
      - name: create_payout            # the proposal's action
        handler: forward_request       # the registered handler that runs it
        parameters: {type: object, ...}  # JSON Schema (Draft 2020-12)
        rules:                         # first match wins; no match -> BLOCK POLICY_NO_MATCH
          - {name: small, when: "params.amountMinor <= 5000", verdict: ALLOW}
          - {name: medium, when: "params.amountMinor <= 50000", verdict: ESCALATE,
             approvers: [treasury-lead],
             approval: {verification: WEBAUTHN}}   # optional: how strongly they are verified
          - {name: large, when: "true", verdict: BLOCK, reasonCode: AMOUNT_ABOVE_POLICY}

:func:`load_policy` reads YAML or JSON (duplicate keys refused); :func:`compile_policy` checks
every parameter schema and compiles every CEL ``when`` so that evaluation is pure and fast. Every
refusal is a :class:`~agentsafe.executor.errors.PolicyError` whose message starts with the path of
the offending field (``actions[0].rules[1].when``).

Each parameter schema is also compiled with ``jsonschema-rs``
(:func:`~agentsafe.executor.schema.build_fast_validator`, where the walk that decides when it
judges as the reference does lives) for the authority's check of every request. The schema's own
checks (strictness, meta-schema, ECMA-262 patterns) stay
:func:`build_validator`'s, the same for ``serve``, ``doctor``, ``policy lint`` and admission.

Callers: ``assembly.py`` (``EXECUTOR_POLICY_FILE``), ``authority.py``, the operator.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Final

import jsonschema
import yaml
from jsonschema.protocols import Validator
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..canonical import DuplicateKeyError, parse_json, sha256_digest
from ..codes import Code
from ..errors import CanonicalizationError, PolicyError
from ..plans.policy import PlanPolicy
from ..principals import Verification
from ..schema import (
    DRAFT_2020_12,
    EcmaValidator,
    build_fast_validator,
    check_schema,
    is_strict,
)
from .celexpr import Expression, compile_expression

__all__ = [
    "FORWARD_HANDLER",
    "MAX_POLICY_BYTES",
    "ActionPolicy",
    "CompiledAction",
    "CompiledPolicy",
    "CompiledRule",
    "PolicyDocument",
    "ProviderKey",
    "Rule",
    "RuleApproval",
    "Verdict",
    "build_fast_validator",
    "build_validator",
    "check_strict_schemas",
    "compile_policy",
    "load_policy",
    "parse_policy",
    "read_document",
]

MAX_POLICY_BYTES = 1024 * 1024

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
_REASON_CODE = r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$"

Name = Annotated[str, Field(pattern=_NAME)]


class Verdict(StrEnum):
    ALLOW = "ALLOW"
    BLOCK = "BLOCK"
    ESCALATE = "ESCALATE"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class RuleApproval(_Model):
    """What an ESCALATE rule asks of the person who decides it."""

    verification: Verification = Field(
        default=Verification.CREDENTIAL,
        description="the least verification of the approver's decision: CREDENTIAL (the "
        "approver's own credential) or WEBAUTHN (a passkey assertion with user verification)",
    )


class Rule(_Model):
    """One rule of an action: when ``when`` is true, the verdict is ``verdict``."""

    name: Name
    """the rule's name, reported with its verdict"""
    when: str = Field(min_length=1, max_length=4096, description="CEL; must evaluate to a bool")
    verdict: Verdict
    """ALLOW, BLOCK or ESCALATE when the rule matches"""
    reason_code: str | None = Field(
        default=None,
        alias="reasonCode",
        pattern=_REASON_CODE,
        max_length=64,
        description="UPPER_SNAKE code reported with the verdict",
    )
    approvers: tuple[Name, ...] = Field(
        default=(), max_length=50, description="principal ids that may approve (ESCALATE only)"
    )
    approval: RuleApproval | None = Field(
        default=None, description="what the approval requires (ESCALATE only)"
    )

    @model_validator(mode="after")
    def _approvers_match_verdict(self) -> Rule:
        if self.verdict is Verdict.ESCALATE and not self.approvers:
            raise ValueError("an ESCALATE rule names at least one approver")
        if self.verdict is not Verdict.ESCALATE and self.approvers:
            raise ValueError("only an ESCALATE rule has approvers")
        if len(set(self.approvers)) != len(self.approvers):
            raise ValueError("approvers are listed twice")
        if self.verdict is not Verdict.ESCALATE and self.approval is not None:
            raise ValueError("only an ESCALATE rule has approval")
        return self

    @property
    def verification(self) -> Verification:
        return self.approval.verification if self.approval else Verification.CREDENTIAL


class ActionPolicy(_Model):
    """An action the executor may run: its handler, its parameter schema and its rules."""

    name: Name
    """the action's name, as agents propose it"""
    handler: Name
    """the registered handler that executes the action"""
    parameters: dict[str, Any] = Field(description="JSON Schema (Draft 2020-12) of the parameters")
    rules: tuple[Rule, ...] = Field(min_length=1, max_length=100)
    """rules evaluated in order; the first that matches decides"""

    @model_validator(mode="after")
    def _unique_rule_names(self) -> ActionPolicy:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError("a rule name is used twice")
            seen.add(rule.name)
        return self


class ProviderKey(_Model):
    """A provider's effect-receipt key, registered with the built-in authority (VP-3)."""

    kid: Name
    """the key id a receipt names in its JWS header"""
    issuer: str = Field(min_length=1, max_length=256, description="the receipt's iss")
    public_key: str = Field(
        alias="publicKey",
        pattern=r"^[A-Za-z0-9_-]{43}$",
        description="the raw 32-byte Ed25519 public key, unpadded base64url (a JWK's x)",
    )


class PolicyDocument(_Model):
    """``spec.policy`` of an AgentPolicy; the executor's ``EXECUTOR_POLICY_FILE``."""

    actions: tuple[ActionPolicy, ...] = Field(min_length=1, max_length=200)
    """the actions agents may propose"""
    provider_keys: tuple[ProviderKey, ...] | None = Field(
        default=None,
        alias="providerKeys",
        max_length=50,
        description="providers' effect-receipt keys (docs/execution-outcomes.md)",
    )
    plans: PlanPolicy | None = Field(
        default=None,
        description="multi-step plans: tools, effects, sources and ceilings (docs/plans.md)",
    )

    @model_validator(mode="after")
    def _unique_action_names(self) -> PolicyDocument:
        seen: set[str] = set()
        for action in self.actions:
            if action.name in seen:
                raise ValueError("an action name is used twice")
            seen.add(action.name)
        return self

    def as_json(self) -> dict[str, Any]:
        """The document as plain JSON with its wire (camelCase) names."""
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return data


@dataclass(frozen=True)
class CompiledRule:
    name: str
    path: str
    expression: Expression
    verdict: Verdict
    reason_code: str | None
    approvers: tuple[str, ...]
    verification: Verification = Verification.CREDENTIAL


@dataclass(frozen=True)
class CompiledAction:
    name: str
    handler: str
    validator: Validator
    rules: tuple[CompiledRule, ...]
    variables: frozenset[str] = frozenset()
    """Every variable any of the rules refers to: what one evaluation converts for CEL."""
    fast_validator: Any = None
    """The schema compiled by ``jsonschema-rs`` (:func:`build_fast_validator`), or ``None`` when
    the schema uses a keyword outside what it is known to judge as :attr:`validator` does. Only
    its "valid" is final; the authority asks :attr:`validator` about anything else."""


@dataclass(frozen=True)
class CompiledPolicy:
    """A policy ready to evaluate: schemas built and expressions compiled, once."""

    document: PolicyDocument
    actions: Mapping[str, CompiledAction]
    digest: str

    @property
    def handlers(self) -> frozenset[str]:
        return frozenset(action.handler for action in self.actions.values())


def parse_policy(data: Any) -> PolicyDocument:
    """Validate a parsed document; refuses with the path of the first problem."""
    _check_json_types(data, "")
    try:
        return PolicyDocument.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        path = _format_path(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        raise PolicyError(message, path=path or "policy", code=Code.POLICY_INVALID) from None


FORWARD_HANDLER: Final = "forward_request"
"""The reference handler (``dispatch/forward.py``): it sends the parameters the policy's own
schema accepts, so an action it runs must have a strict schema (:func:`build_validator`)."""


_NOT_STRICT: Final = (
    "the parameter schema must set additionalProperties: false (or be anyOf such schemas), so"
    " that no parameter the policy does not name reaches a handler"
)


def check_strict_schemas(doc: PolicyDocument) -> None:
    """The strictness part of :func:`compile_policy` alone (``SCHEMA_NOT_STRICT`` with the
    action's path), for the assembly to ask before it registers :data:`FORWARD_HANDLER` with
    the policy's schemas, so ``serve`` refuses with the same words as every other judge."""
    for index, action in enumerate(doc.actions):
        if action.handler == FORWARD_HANDLER and not is_strict(action.parameters):
            raise PolicyError(
                _NOT_STRICT,
                path=f"actions[{index}].parameters",
                code=Code.SCHEMA_NOT_STRICT,
                public=_NOT_STRICT,
            )


def load_policy(path: str | Path) -> PolicyDocument:
    """Read a policy from a YAML or JSON file (``.json`` parsed strictly as JSON)."""
    return parse_policy(read_document(path, code=Code.POLICY_INVALID, what="policy file"))


def read_document(path: str | Path, *, code: Code, what: str) -> Any:
    """Read one YAML or JSON document the way a policy is read (at most
    :data:`MAX_POLICY_BYTES`, UTF-8, duplicate keys refused, ``.json`` parsed strictly as JSON);
    refusals carry ``code`` (``policy/trial.py`` reads test files with it)."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_POLICY_BYTES + 1)
    except OSError:
        raise PolicyError(
            f"cannot read {what} {file.name}", code=Code.POLICY_FILE_UNREADABLE
        ) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"{what} is larger than {MAX_POLICY_BYTES} bytes", code=code)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{what} is not UTF-8", code=code) from None
    try:
        data = _load_json(text) if file.suffix.lower() == ".json" else _load_yaml(text)
        _check_json_types(data, "")
    except PolicyError as exc:
        if exc.code == code:
            raise
        refusal = PolicyError(str(exc), code=code)
        refusal.path = exc.path
        raise refusal from None
    return data


def compile_policy(
    doc: PolicyDocument, *, registered_handlers: set[str] | frozenset[str] | None = None
) -> CompiledPolicy:
    """Check every parameter schema and compile every rule; refuses with the field's path.

    With ``registered_handlers``, an action whose handler is not among them is refused as well
    (the operator compiles without it; the executor with its sealed registry's names).
    """
    actions: dict[str, CompiledAction] = {}
    for index, action in enumerate(doc.actions):
        base = f"actions[{index}]"
        if registered_handlers is not None and action.handler not in registered_handlers:
            raise PolicyError(
                f"no registered handler is named {action.handler!r}",
                path=f"{base}.handler",
                code=Code.POLICY_HANDLER_UNKNOWN,
                public="no registered handler has this name",
            )
        validator = build_validator(
            action.parameters,
            path=f"{base}.parameters",
            strict=action.handler == FORWARD_HANDLER,
        )
        rules = tuple(
            CompiledRule(
                name=rule.name,
                path=f"{base}.rules[{position}]",
                expression=compile_expression(rule.when, path=f"{base}.rules[{position}].when"),
                verdict=rule.verdict,
                reason_code=rule.reason_code,
                approvers=rule.approvers,
                verification=rule.verification,
            )
            for position, rule in enumerate(action.rules)
        )
        actions[action.name] = CompiledAction(
            name=action.name,
            handler=action.handler,
            validator=validator,
            rules=rules,
            variables=frozenset().union(*(rule.expression.variables for rule in rules)),
            fast_validator=build_fast_validator(action.parameters),
        )
    return CompiledPolicy(document=doc, actions=actions, digest=sha256_digest(doc.as_json()))


def build_validator(schema: Mapping[str, Any], *, path: str, strict: bool = False) -> Validator:
    """The parameter schema's validator: Draft 2020-12, formats asserted, and every regular
    expression ECMA-262 as JSON Schema specifies (:mod:`agentsafe.executor.schema`).

    ``strict``: the schema is also the handler's own (:data:`FORWARD_HANDLER`'s), so it must be
    strict (:func:`~agentsafe.executor.schema.is_strict`), as the seam requires of every
    handler's schema (``SCHEMA_NOT_STRICT``, with the action's path)."""
    declared = schema.get("$schema")
    if declared is not None and declared != DRAFT_2020_12:
        raise PolicyError(
            "parameter schemas are JSON Schema Draft 2020-12",
            path=path,
            code=Code.POLICY_INVALID,
            public="parameter schemas are JSON Schema Draft 2020-12",
        )
    if schema.get("type") != "object":
        raise PolicyError(
            "the parameter schema must declare type: object",
            path=path,
            code=Code.POLICY_INVALID,
            public="the parameter schema must declare type: object",
        )
    if strict and not is_strict(schema):
        raise PolicyError(_NOT_STRICT, path=path, code=Code.SCHEMA_NOT_STRICT, public=_NOT_STRICT)
    try:
        check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = _format_path(tuple(exc.absolute_path))
        detail = f" at {where}" if where else ""
        raise PolicyError(
            f"invalid JSON Schema{detail}: {exc.message}",
            path=path,
            code=Code.POLICY_INVALID,
            public=f"invalid JSON Schema{detail}",
        ) from None
    except (OverflowError, RecursionError, MemoryError):
        # A pattern or a nesting beyond what can be compiled (found by fuzzing).
        raise PolicyError(
            "invalid JSON Schema: a pattern or nesting is beyond what can be compiled",
            path=path,
            code=Code.POLICY_INVALID,
            public="invalid JSON Schema: a pattern or nesting is beyond what can be compiled",
        ) from None
    validator: Validator = EcmaValidator(schema, format_checker=EcmaValidator.FORMAT_CHECKER)
    return validator


def _format_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _check_json_types(value: Any, path: str) -> None:
    """Refuse what YAML can express and JSON cannot (dates, non-string keys, NaN)."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyError("numbers must be finite", path=path or "policy")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_types(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PolicyError("keys must be strings", path=path or "policy")
            _check_json_types(item, f"{path}.{key}" if path else key)
        return
    raise PolicyError(
        f"a {type(value).__name__} value has no JSON form (quote it)", path=path or "policy"
    )


def _load_json(text: str) -> Any:
    try:
        return parse_json(text)
    except DuplicateKeyError as exc:
        raise PolicyError(f"key {exc.key!r} appears twice", code=Code.POLICY_INVALID) from None
    except CanonicalizationError as exc:
        problem = "numbers must be finite" if exc.code == Code.NUMBER_NOT_FINITE else exc.message
        raise PolicyError(problem, code=Code.POLICY_INVALID) from None
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"not valid JSON (line {exc.lineno}, column {exc.colno})", code=Code.POLICY_INVALID
        ) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool | None):  # [1]: x, {a: 1}: x
            raise PolicyError(
                f"keys must be strings (line {key_node.start_mark.line + 1})",
                code=Code.POLICY_INVALID,
            )
        if key in out:
            raise PolicyError(
                f"key {key!r} appears twice (line {key_node.start_mark.line + 1})",
                code=Code.POLICY_INVALID,
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise PolicyError(f"not valid YAML{where}", code=Code.POLICY_INVALID) from None
    except (ValueError, OverflowError):  # a scalar YAML resolves but cannot build: 2001-13-01
        raise PolicyError(
            "not valid YAML (a value cannot be read)", code=Code.POLICY_INVALID
        ) from None
    except RecursionError:
        raise PolicyError("not valid YAML (nested too deeply)", code=Code.POLICY_INVALID) from None
