"""``agentsafe policy lint``: every problem of a policy at once, and the rules that never decide.

:func:`~agentsafe.executor.policy.policy.compile_policy` stops at the first problem, which is
right for a process that must refuse to start; an author wants all of them. :func:`lint_policy`
validates the document, then builds every parameter schema and compiles every CEL ``when`` on its
own, and reports each failure as a :class:`Finding` with the field's path. On a policy that
compiles it then looks for rules that can never decide:

- ``RULE_UNREACHABLE``: an earlier rule of the same action always matches (its ``when`` is a
  constant ``true``, or is implied by the parameter schema), or the rule's own ``when`` can never
  be true (a constant ``false``, contradictory bounds, or bounds the schema rules out);
- ``RULE_SHADOWED``: whenever the rule matches, an earlier rule matches as well (the same
  ``when``, or narrower bounds on the same fields), so the earlier one always decides first.

The analysis is deliberately conservative and small (no CEL library exposes a syntax tree with a
stable API, so the fragment is read here): a ``when`` that is a conjunction (``&&``) of
comparisons between a variable path (``params.amountMinor``, ``principal.id``, ``tenant``) and a
literal (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``, ``in [...]``), or a bare boolean path, is
understood as bounds per path; anything else is only compared by its text. A finding is reported
only when it is proven, so a clean lint is not a proof that every rule is reachable.

Callers: ``tools/policy_cli.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cel

from ..codes import Code
from ..errors import PolicyError
from .celexpr import VARIABLES, compile_expression
from .policy import FORWARD_HANDLER, ActionPolicy, PolicyDocument, build_validator, parse_policy

__all__ = ["Finding", "lint_document", "lint_policy"]


@dataclass(frozen=True)
class Finding:
    """One problem: ``severity`` is ``error`` (the policy would be refused) or ``warning``."""

    severity: str
    code: str  # a Code, or the code of the PolicyError that was found
    path: str
    message: str

    def as_json(self) -> dict[str, str]:
        return {
            "severity": self.severity,
            "code": self.code,
            "path": self.path,
            "message": self.message,
        }


def lint_policy(data: Any) -> list[Finding]:
    """Findings for a parsed document (YAML/JSON already loaded); empty when clean."""
    try:
        document = parse_policy(data)
    except PolicyError as exc:
        return [Finding("error", exc.code, exc.path or "policy", _problem(exc))]
    return lint_document(document)


def lint_document(document: PolicyDocument) -> list[Finding]:
    findings: list[Finding] = []
    for index, action in enumerate(document.actions):
        base = f"actions[{index}]"
        try:
            build_validator(
                action.parameters,
                path=f"{base}.parameters",
                strict=action.handler == FORWARD_HANDLER,
            )
        except PolicyError as exc:
            findings.append(Finding("error", exc.code, exc.path or base, _problem(exc)))
        compiled = True
        for position, rule in enumerate(action.rules):
            path = f"{base}.rules[{position}].when"
            try:
                compile_expression(rule.when, path=path)
            except PolicyError as exc:
                compiled = False
                findings.append(Finding("error", exc.code, path, _problem(exc)))
        if compiled:
            findings.extend(_reachability(action, base))
    return findings


# -- reachability ----------------------------------------------------------------------------


@dataclass
class _Bounds:
    """What a conjunction says about one path: an interval, a finite set, excluded values."""

    low: float = -math.inf
    low_strict: bool = False
    high: float = math.inf
    high_strict: bool = False
    allowed: frozenset[Any] | None = None  # of (type name, value) pairs
    excluded: frozenset[Any] = field(default_factory=frozenset)

    def copy(self) -> _Bounds:
        return _Bounds(
            self.low, self.low_strict, self.high, self.high_strict, self.allowed, self.excluded
        )

    def admits(self, item: tuple[str, Any]) -> bool:
        kind, value = item
        if self.allowed is not None and item not in self.allowed:
            return False
        if item in self.excluded:
            return False
        if kind == "number":
            if value < self.low or (self.low_strict and value == self.low):
                return False
            if value > self.high or (self.high_strict and value == self.high):
                return False
        elif self.low != -math.inf or self.high != math.inf:
            return False  # an ordered comparison with a number is never true of a non-number
        return True

    def empty(self) -> bool:
        if self.allowed is not None:
            return not any(self.admits(item) for item in self.allowed)
        if self.low > self.high:
            return True
        return self.low == self.high and (self.low_strict or self.high_strict)

    def within(self, other: _Bounds) -> bool:
        """Every value these bounds admit, ``other`` admits too."""
        if self.allowed is not None:
            return all(other.admits(item) for item in self.allowed if self.admits(item))
        if other.allowed is not None:
            return False
        if not other.excluded <= self.excluded:
            return False
        low_ok = self.low > other.low or (
            self.low == other.low and (self.low_strict or not other.low_strict)
        )
        high_ok = self.high < other.high or (
            self.high == other.high and (self.high_strict or not other.high_strict)
        )
        return low_ok and high_ok


_Constraints = dict[str, _Bounds]

_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_LITERAL = r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|true|false"
_COMPARISON = re.compile(rf"^({_PATH})\s*(<=|>=|==|!=|<|>)\s*({_LITERAL})$")
_REVERSED = re.compile(rf"^({_LITERAL})\s*(<=|>=|==|!=|<|>)\s*({_PATH})$")
_MEMBERSHIP = re.compile(rf"^({_PATH})\s+in\s+\[(.*)\]$")
_BARE = re.compile(rf"^(!?)\s*({_PATH})$")
_LITERAL_ONLY = re.compile(_LITERAL)
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _reachability(action: ActionPolicy, base: str) -> list[Finding]:
    schema_bounds = _schema_constraints(action.parameters)
    understood: list[_Constraints | None] = []
    findings: list[Finding] = []
    always: str | None = None  # the first earlier rule that always matches
    for position, rule in enumerate(action.rules):
        path = f"{base}.rules[{position}]"
        constant = _constant(rule.when)
        constraints = _constraints(rule.when, schema_bounds) if constant is None else None
        if constant is True:
            constraints = {name: bounds.copy() for name, bounds in schema_bounds.items()}
        understood.append(constraints)
        if always is not None:
            findings.append(
                Finding(
                    "warning",
                    Code.RULE_UNREACHABLE,
                    path,
                    f"rule {rule.name!r} never decides: rule {always!r} before it always matches",
                )
            )
            continue
        if constant is False or (
            constraints is not None and any(b.empty() for b in constraints.values())
        ):
            findings.append(
                Finding(
                    "warning",
                    Code.RULE_UNREACHABLE,
                    path,
                    f"rule {rule.name!r} never decides: its 'when' can never be true"
                    + ("" if constant is False else " for parameters the schema accepts"),
                )
            )
            continue
        shadow = _shadowing_rule(action, position, understood)
        if shadow is not None:
            findings.append(
                Finding(
                    "warning",
                    Code.RULE_SHADOWED,
                    path,
                    f"rule {rule.name!r} never decides: whenever it matches, "
                    f"the earlier rule {shadow!r} matches too",
                )
            )
        if constraints is not None and _implies(schema_bounds, constraints):
            always = rule.name
    return findings


def _shadowing_rule(
    action: ActionPolicy, position: int, understood: list[_Constraints | None]
) -> str | None:
    rule = action.rules[position]
    mine = understood[position]
    for earlier_index in range(position):
        earlier = action.rules[earlier_index]
        if _normalise(earlier.when) == _normalise(rule.when):
            return earlier.name
        theirs = understood[earlier_index]
        if mine is not None and theirs is not None and _implies(mine, theirs):
            return earlier.name
    return None


def _implies(mine: _Constraints, theirs: _Constraints) -> bool:
    """Whenever ``mine`` holds, ``theirs`` holds (every path ``theirs`` bounds, ``mine`` bounds
    at least as tightly)."""
    return all(mine.get(path, _Bounds()).within(bounds) for path, bounds in theirs.items())


def _constant(text: str) -> bool | None:
    """The value of a ``when`` that refers to no variable (``true``, ``1 == 1``), else None."""
    try:
        program = cel.compile(text)
        if program.references()["variables"]:
            return None
        value = program.execute(cel.Context(variables={}))
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException:
        return None
    return value if value is True or value is False else None


def _constraints(text: str, schema_bounds: _Constraints) -> _Constraints | None:
    atoms = _conjuncts(text)
    if atoms is None:
        return None
    out = {name: bounds.copy() for name, bounds in schema_bounds.items()}
    for atom in atoms:
        parsed = _atom(atom)
        if parsed is None:
            return None
        path, op, value = parsed
        bounds = out.setdefault(path, _Bounds())
        if not _narrow(bounds, op, value):
            return None
    return out


def _conjuncts(text: str) -> list[str] | None:
    """Split on top-level ``&&``; None if the expression has a top-level ``||`` or ``?:``."""
    expression = _strip_parentheses(text.strip())
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    index = 0
    while index < len(expression):
        char = expression[index]
        if quote is not None:
            if char == "\\":
                index += 2
                continue
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif depth == 0 and expression.startswith("&&", index):
            parts.append(expression[start:index])
            start = index + 2
            index += 2
            continue
        elif depth == 0 and (expression.startswith("||", index) or char == "?"):
            return None
        index += 1
    parts.append(expression[start:])
    return [_strip_parentheses(part.strip()) for part in parts]


def _strip_parentheses(text: str) -> str:
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += 1 if char == "(" else -1 if char == ")" else 0
        if depth < 0:
            return False
    return depth == 0


def _atom(text: str) -> tuple[str, str, Any] | None:
    if match := _COMPARISON.match(text):
        path, op, literal = match.groups()
    elif match := _REVERSED.match(text):
        literal, op, path = match.groups()
        op = _FLIP[op]
    elif match := _MEMBERSHIP.match(text):
        path, items = match.groups()
        values = [_literal(item.strip()) for item in items.split(",")] if items.strip() else []
        if any(value is None for value in values) or not _known(path):
            return None
        return path, "in", frozenset(values)
    elif match := _BARE.match(text):
        negated, path = match.groups()
        if not _known(path):
            return None
        return path, "==", ("bool", not negated)
    else:
        return None
    value = _literal(literal)
    if value is None or not _known(path):
        return None
    return path, op, value


def _known(path: str) -> bool:
    return path.split(".", 1)[0] in VARIABLES and not path.startswith("now")


def _literal(text: str) -> tuple[str, Any] | None:
    if not _LITERAL_ONLY.fullmatch(text):
        return None
    if text in ("true", "false"):
        return ("bool", text == "true")
    if text[:1] in "'\"":
        body = text[1:-1]
        if "\\" in body:
            return None  # escapes: compare nothing rather than guess
        return ("string", body)
    try:
        number = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        return None
    return ("number", number)


def _narrow(bounds: _Bounds, op: str, value: Any) -> bool:
    if op == "in":
        bounds.allowed = value if bounds.allowed is None else bounds.allowed & value
        return True
    if op == "==":
        single = frozenset({value})
        bounds.allowed = single if bounds.allowed is None else bounds.allowed & single
        return True
    if op == "!=":
        bounds.excluded = bounds.excluded | {value}
        return True
    kind, number = value
    if kind != "number":
        return False
    if op in ("<", "<="):
        strict = op == "<"
        if number < bounds.high or (number == bounds.high and strict):
            bounds.high, bounds.high_strict = number, strict
    else:
        strict = op == ">"
        if number > bounds.low or (number == bounds.low and strict):
            bounds.low, bounds.low_strict = number, strict
    return True


def _schema_constraints(schema: Mapping[str, Any]) -> _Constraints:
    """Bounds the parameter schema guarantees for required top-level properties."""
    out: _Constraints = {}
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, dict) or not isinstance(required, list):
        return out
    for name in required:
        prop = properties.get(name)
        if not isinstance(name, str) or not isinstance(prop, dict):
            continue
        bounds = _Bounds()
        known = False
        for key, op in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        ):
            number = prop.get(key)
            if isinstance(number, int | float) and not isinstance(number, bool):
                _narrow(bounds, op, ("number", number))
                known = True
        values = prop.get("enum")
        if "const" in prop:
            values = [prop["const"]]
        if isinstance(values, list):
            items = [_json_item(value) for value in values]
            if all(item is not None for item in items):
                _narrow(bounds, "in", frozenset(items))
                known = True
        if known:
            out[f"params.{name}"] = bounds
    return out


def _json_item(value: Any) -> tuple[str, Any] | None:
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return None


def _normalise(text: str) -> str:
    return " ".join(_strip_parentheses(text.strip()).split())


def _problem(exc: PolicyError) -> str:
    text = str(exc)
    prefix = f"{exc.path}: " if exc.path else ""
    return text.removeprefix(prefix)
