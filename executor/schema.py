"""JSON Schema (Draft 2020-12) validation with ECMA-262 regular expressions, as JSON Schema says.

Role: the one validator class for parameter schemas. ``jsonschema`` applies ``pattern`` and
``patternProperties`` with Python's ``re.search``, which is not the dialect JSON Schema specifies
(ECMA-262, with the ``u`` flag). The difference is an attack, not a nicety: under Python ``$``
also matches before a trailing newline, so ``^[A-Z]{3}$`` accepts ``"RUB\\n"``, which then slips
past a CEL rule ``params.currency == "RUB"`` and reaches the provider; ``\\d`` and ``\\w`` match
any Unicode digit or letter (``"١٢٣"`` passes ``^\\d+$``); ``.`` matches ``\\r``, U+2028 and
U+2029. :data:`EcmaValidator` evaluates every pattern with ``regress`` (Python bindings of the Rust
``regress`` engine, an ECMA-262 implementation) under the ``u`` flag:

* ``pattern``, ``patternProperties``, and the ``additionalProperties`` that depends on it;
* ``format: "regex"`` (in instances, and in the meta-schema check of a schema's own patterns): a
  pattern must be valid ECMA-262, so Python-only syntax (``(?P<name>...)``, ``\\Z``) is refused
  when the schema is loaded rather than read differently later.

A schema whose ``$ref`` can lead back to itself without descending into the value
(:func:`reference_cycle`) is refused (``SchemaError``) when it is loaded: every value reaching the
cycle would recurse without end.

``unevaluatedProperties`` is refused (``SchemaError``) in a schema that also uses
``patternProperties`` (:func:`check_schema`): ``jsonschema`` decides which properties were
evaluated with Python ``re`` internally, and there is no hook to change that. Everything else is
``jsonschema``'s own Draft 2020-12 implementation, unchanged.

:func:`is_strict` is the one rule of what a parameter schema must be (``type: object`` with
``additionalProperties: false``, or ``type: object`` with ``anyOf`` such schemas): the policy's
compiler, and so ``serve``, ``agentsafe config``, ``doctor``, ``policy lint`` and the operator's
admission, apply it, and so does the seam to a handler's own schema.

Ground floor: imports nothing of agentsafe. Callers: ``policy/policy.py``
(a policy action's parameter schema), ``dispatch/seam.py`` (a handler's parameter schema).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

import jsonschema
import regress
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators

__all__ = ["EcmaValidator", "check_schema", "ecma_search", "is_strict"]

FLAGS = "u"


def is_strict(schema: Any) -> bool:
    """``type: object`` and ``additionalProperties: false``, or ``type: object`` with a
    non-empty ``anyOf`` of such schemas (one handler serving several actions): nothing the
    schema does not name reaches a handler."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return False
    if schema.get("additionalProperties") is False:
        return True
    branches = schema.get("anyOf")
    return isinstance(branches, list) and bool(branches) and all(is_strict(b) for b in branches)


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> regress.Regex:
    return regress.Regex(pattern, FLAGS)


def ecma_search(pattern: str, text: str) -> bool:
    """Whether ECMA-262 ``pattern`` (``u`` flag, unanchored, as JSON Schema applies it) matches
    somewhere in ``text``. Raises :class:`regress.RegressError` for a pattern that is not
    ECMA-262. A text that is not Unicode (a lone surrogate) matches nothing: it fails closed."""
    compiled = _compiled(pattern)
    try:
        return compiled.find(text) is not None
    except UnicodeEncodeError:
        return False


def _is_ecma_regex(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    try:
        _compiled(instance)
    except (regress.RegressError, ValueError, OverflowError):
        return False
    return True


_FORMATS = FormatChecker()
_FORMATS.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
_FORMATS.checkers["regex"] = (_is_ecma_regex, ())


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not ecma_search(pattern, instance):
        # Never the instance in the message: it is request data.
        yield ValidationError(f"the value does not match the pattern {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if ecma_search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key
        for key in instance
        if key not in properties and not any(ecma_search(p, key) for p in patterns)
    ]


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        # Names only, never values; a property name is part of the schema's vocabulary.
        count = "property is" if len(extras) == 1 else "properties are"
        yield ValidationError(f"{len(extras)} additional {count} not allowed")


EcmaValidator: Any = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
    format_checker=_FORMATS,
)
"""Draft 2020-12 with ECMA-262 patterns; construct it with ``format_checker=FORMAT_CHECKER``
to assert ``format`` as the policy does."""


def _walk(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def check_schema(schema: Mapping[str, Any]) -> None:
    """Check ``schema`` against the Draft 2020-12 meta-schema with ECMA-262 patterns.

    Raises ``jsonschema.SchemaError`` as ``jsonschema`` does; a pattern that is not ECMA-262 is
    one, and so is ``unevaluatedProperties`` beside ``patternProperties``.
    """
    # ``check_schema`` would pick the meta-schema's own class (and Python's ``re`` for
    # ``format: regex``): name the ECMA format checker explicitly.
    EcmaValidator.check_schema(schema, format_checker=_FORMATS)
    nodes = list(_walk(schema))
    if any("unevaluatedProperties" in node for node in nodes) and any(
        "patternProperties" in node for node in nodes
    ):
        raise jsonschema.SchemaError(
            "unevaluatedProperties cannot be combined with patternProperties here"
        )
    for node in nodes:
        for pattern in [node.get("pattern"), *node.get("patternProperties", {})]:
            if isinstance(pattern, str) and not _is_ecma_regex(pattern):
                raise jsonschema.SchemaError(f"the pattern {pattern!r} is not ECMA-262")
    if reference_cycle(schema):
        raise jsonschema.SchemaError("a $ref leads back to itself without descending into a value")


# Draft 2020-12's applicators: those that apply a subschema to the SAME value as the schema
# holding them, and those that descend into a property, an item or a name of it.
_IN_PLACE_ONE: Final = ("not", "if", "then", "else")
_IN_PLACE_LIST: Final = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP: Final = ("dependentSchemas",)
_DESCEND_ONE: Final = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_DESCEND_LIST: Final = ("prefixItems",)
_DESCEND_MAP: Final = ("properties", "patternProperties")


def reference_cycle(schema: Mapping[str, Any]) -> bool:
    """Whether a ``$ref`` (or ``$dynamicRef``) reachable from the root can lead back, through
    in-place applicators only (``allOf``, ``not``, ``if`` ...), to a schema already being applied
    to the same value. ``jsonschema`` then recurses until ``RecursionError`` on every value that
    gets there, and the reference resolver under it (``referencing`` over ``rpds``) can panic
    instead, which is not an ``Exception``. A recursive schema that descends (a tree whose
    ``children`` items refer to the node) is not such a cycle.

    Hand-written: no JSON Schema library reports these cycles. Only references the document
    resolves itself are followed: ``#``, a JSON pointer ``#/...`` or an ``$anchor`` /
    ``$dynamicAnchor`` name, within the resource of the nearest ``$id``, or an ``$id`` named
    exactly. Any other reference is left to the validator (unresolvable, it is refused when a
    value is checked)."""
    where: dict[int, Mapping[str, Any]] = {}  # a schema's id() -> its resource's root
    by_pointer: dict[tuple[int, str], Mapping[str, Any]] = {}
    by_anchor: dict[tuple[int, str], Mapping[str, Any]] = {}
    by_id: dict[str, Mapping[str, Any]] = {}

    def index(node: Any, resource: Mapping[str, Any], pointer: str) -> None:
        if isinstance(node, Mapping):
            if isinstance(node.get("$id"), str):
                by_id[node["$id"]] = node
                if node is not resource:
                    resource, pointer = node, ""
            where[id(node)] = resource
            by_pointer[(id(resource), pointer)] = node
            for name in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(name), str):
                    by_anchor[(id(resource), node[name])] = node
            for key, value in node.items():
                index(value, resource, f"{pointer}/{_escape(str(key))}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                index(value, resource, f"{pointer}/{i}")

    index(schema, schema, "")

    def target(node: Mapping[str, Any], ref: str) -> Mapping[str, Any] | None:
        uri, hashed, fragment = ref.partition("#")
        resource = by_id.get(uri) if uri else where.get(id(node))
        if resource is None or not hashed:
            return resource
        fragment = unquote(fragment)
        if not fragment:
            return resource
        if fragment.startswith("/"):
            return by_pointer.get((id(resource), fragment))
        return by_anchor.get((id(resource), fragment))

    def applied(node: Mapping[str, Any], *, in_place: bool) -> list[Mapping[str, Any]]:
        out: list[Mapping[str, Any]] = []
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            found = target(node, ref) if isinstance(ref, str) else None
            if found is not None:
                out.append(found)
        groups = (
            (_IN_PLACE_ONE, _IN_PLACE_LIST, _IN_PLACE_MAP)
            if in_place
            else (
                _IN_PLACE_ONE + _DESCEND_ONE,
                _IN_PLACE_LIST + _DESCEND_LIST,
                _IN_PLACE_MAP + _DESCEND_MAP,
            )
        )
        ones, lists, maps = groups
        out.extend(node[k] for k in ones if isinstance(node.get(k), Mapping))
        for k in lists:
            if isinstance(node.get(k), list):
                out.extend(item for item in node[k] if isinstance(item, Mapping))
        for k in maps:
            if isinstance(node.get(k), Mapping):
                out.extend(item for item in node[k].values() if isinstance(item, Mapping))
        return out

    # Every schema a value can reach from the root, then a cycle among them through in-place
    # applicators and references (an iterative depth-first search: no recursion limit).
    reachable: dict[int, Mapping[str, Any]] = {id(schema): schema}
    pending = [schema]
    while pending:
        for child in applied(pending.pop(), in_place=False):
            if id(child) not in reachable:
                reachable[id(child)] = child
                pending.append(child)
    done: set[int] = set()
    for start in reachable.values():
        if id(start) in done:
            continue
        on_path = {id(start)}
        stack = [(start, applied(start, in_place=True), 0)]
        while stack:
            node, children, at = stack[-1]
            if at == len(children):
                stack.pop()
                on_path.discard(id(node))
                done.add(id(node))
                continue
            stack[-1] = (node, children, at + 1)
            child = children[at]
            if id(child) in on_path:
                return True
            if id(child) not in done:
                on_path.add(id(child))
                stack.append((child, applied(child, in_place=True), 0))
    return False


def _escape(key: str) -> str:
    """A JSON pointer's reference token (RFC 6901): ``~`` as ``~0``, ``/`` as ``~1``."""
    return key.replace("~", "~0").replace("/", "~1")
