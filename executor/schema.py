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

Every request's check of its parameters asks a schema compiled by ``jsonschema-rs`` first
(:func:`build_fast_validator`; :class:`ParameterValidator`, :func:`fast_valid`) and takes only its
"valid"; everything else is the reference's verdict. The walk that decides where the compiled
library judges as the reference does (:func:`_fast_judges`) is hand-written: no library states
where two JSON Schema implementations agree. ``tests/policy/test_fast_validator.py`` holds it to
the reference, with formats asserted (the policy's) and without (the seam's).

Ground floor: imports nothing of agentsafe. Callers: ``policy/policy.py``
(a policy action's parameter schema), ``policy/authority.py`` (its check per request),
``dispatch/seam.py`` (a handler's parameter schema).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

import jsonschema
import jsonschema_rs
import regress
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators

__all__ = [
    "DRAFT_2020_12",
    "EcmaValidator",
    "ParameterValidator",
    "build_fast_validator",
    "check_schema",
    "ecma_search",
    "fast_valid",
    "is_strict",
]

FLAGS = "u"

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
"""The one draft parameter schemas are written in."""


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


# -- the compiled validator for each request (issue 34) ------------------------------------------
#
# ``jsonschema`` walks a schema in Python for every request (~13 us for the example's two
# properties); ``jsonschema-rs`` (Rust) judges the same schema in under 1 us. The two libraries
# are not the same implementation, so the compiled one is used only where its verdict is the
# reference's: a schema is handed to it only when every keyword is in the sets below (a walk that
# knows which keywords hold schemas, which hold maps of schemas and which hold data, so a
# property's name is never read as a keyword); ``pattern``, ``format`` and ``multipleOf`` are
# judged inside it by the reference's own keyword functions (:class:`_ReferenceKeyword`), so the
# ECMA-262 patterns, the format checkers and the float arithmetic are today's. Everything else
# (``patternProperties``, ``unevaluated*``, ``$id``, ``$anchor``, ``$dynamicRef``, a ``$ref``
# other than ``#/$defs/NAME`` to an entry without ``$ref``, ``dependentSchemas``, ``content*``,
# unknown keywords, a number past 2**53) keeps the schema on ``jsonschema`` alone.
# tests/policy/test_fast_validator.py is the differential test.

_RS_NATIVE: Final = frozenset(
    {
        "type",
        "required",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "minContains",
        "maxContains",
    }
)
"""Keywords ``jsonschema-rs`` judges itself (the differential test covers each)."""

_RS_REFERENCE: Final = frozenset({"pattern", "format", "multipleOf"})
"""Keywords judged inside ``jsonschema-rs`` by the reference's own keyword functions."""

_ANNOTATIONS: Final = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
"""Keywords neither library asserts."""

_SUBSCHEMA: Final = frozenset(
    {"additionalProperties", "items", "not", "if", "then", "else", "propertyNames", "contains"}
)
_SUBSCHEMA_LIST: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAP: Final = frozenset({"properties", "$defs"})


_LOCAL_REF: Final = re.compile(r"#/\$defs/([A-Za-z0-9_.-]+)")


def _fast_judges(schema: Any, defs: Any = None, *, root: bool = True) -> bool:
    """Whether every keyword of ``schema`` (and of its subschemas) is one ``jsonschema-rs``
    judges as the reference does (see the block comment above). ``defs``: the root's
    ``$defs``, the only target a ``$ref`` may name, and only one that holds no ``$ref`` itself
    (a cycle such as ``d -> d`` is a ``RecursionError`` in the reference, so
    ``POLICY_EVALUATION_ERROR``; the compiled library calls it valid)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    if root:
        defs = schema.get("$defs")
    for keyword, value in schema.items():
        if keyword in _RS_NATIVE or keyword in _RS_REFERENCE or keyword in _ANNOTATIONS:
            continue
        if keyword == "$schema" and root and value == DRAFT_2020_12:
            continue  # both libraries read the schema as this draft
        if keyword == "$ref" and _plain_local_ref(value, defs):
            continue
        if keyword in _SUBSCHEMA and _fast_judges(value, defs, root=False):
            continue
        if (
            keyword in _SUBSCHEMA_LIST
            and isinstance(value, list)
            and all(_fast_judges(item, defs, root=False) for item in value)
        ):
            continue
        if (
            keyword in _SUBSCHEMA_MAP
            and isinstance(value, dict)
            and all(_fast_judges(item, defs, root=False) for item in value.values())
        ):
            continue
        return False
    return True


def _plain_local_ref(value: Any, defs: Any) -> bool:
    """``#/$defs/NAME`` naming an entry of the root's ``$defs`` with no ``$ref`` anywhere in it."""
    found = _LOCAL_REF.fullmatch(value) if isinstance(value, str) else None
    if found is None or not isinstance(defs, dict) or found.group(1) not in defs:
        return False
    return "$ref" not in json.dumps(defs[found.group(1)])


_EXACT: Final = 2**53
"""Below this magnitude every integer is also an IEEE double."""


def _small_numbers(node: Any) -> bool:
    """Whether every number in the schema is below 2**53 in magnitude. ``jsonschema-rs``
    compares an integer past that with a float as doubles (``{"minimum": 2**64 + 1}`` accepts
    ``2.0**64``, ``{"const": 1e308}`` accepts ``10**308``); the reference compares exactly.
    Against a schema whose numbers are all below 2**53 the two orders agree (the differential
    test holds instances past 2**64 against such bounds)."""
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return True
    if isinstance(node, int | float):
        return abs(node) < _EXACT
    if isinstance(node, dict):
        return all(_small_numbers(value) for value in node.values())
    if isinstance(node, list):
        return all(_small_numbers(value) for value in node)
    return False


_REFERENCE: Final[Any] = EcmaValidator({}, format_checker=EcmaValidator.FORMAT_CHECKER)
"""The reference validator whose keyword functions :class:`_ReferenceKeyword` calls; the
functions read only its type checker and format checker, never its schema."""


class _ReferenceKeyword:
    """A ``jsonschema-rs`` custom keyword that runs the reference's function for it."""

    keyword: str = ""

    def __init__(self, parent_schema: dict[str, Any], value: Any, schema_path: Any) -> None:
        self._function = _REFERENCE.VALIDATORS[self.keyword]
        self._value = value
        self._parent = parent_schema

    def validate(self, instance: Any) -> None:
        # An error the function raises itself (not a ValidationError) reaches jsonschema-rs as
        # a failure; the authority then asks the reference, which raises it again.
        for _error in self._function(_REFERENCE, self._value, instance, self._parent):
            raise ValueError(self.keyword)  # never the message: it can quote request data


class _Pattern(_ReferenceKeyword):
    keyword = "pattern"


class _Format(_ReferenceKeyword):
    keyword = "format"


class _MultipleOf(_ReferenceKeyword):
    keyword = "multipleOf"


_KEYWORDS: Final[dict[str, type[jsonschema_rs.KeywordValidator]]] = {
    "pattern": _Pattern,
    "format": _Format,
    "multipleOf": _MultipleOf,
}


_KEYWORDS_WITHOUT_FORMATS: Final = {k: v for k, v in _KEYWORDS.items() if k != "format"}
"""For a reference built without a format checker, where ``format`` asserts nothing (the seam's):
``jsonschema-rs`` then reads it as an annotation too (``validate_formats=False``)."""


def build_fast_validator(schema: Mapping[str, Any], *, formats: bool = True) -> Any:
    """``schema`` compiled by ``jsonschema-rs`` for per-request validation, or ``None`` when it
    uses a keyword the compiled library is not known to judge as the reference validator does,
    or when it does not build (an unresolvable ``$ref``: the reference then refuses every
    request, as before). Call it on a schema :func:`check_schema` accepted. Offline: a ``$ref``
    is never fetched.

    ``formats``: whether the reference it stands beside asserts ``format`` (the policy's,
    ``EcmaValidator(schema, format_checker=...)``) or not (the seam's, ``EcmaValidator(schema)``).
    Both must match: a format asserted on one side only changes the verdict both ways under
    ``not``."""
    if not _fast_judges(schema) or not _small_numbers(schema):
        return None
    keywords = _KEYWORDS if formats else _KEYWORDS_WITHOUT_FORMATS
    try:
        return jsonschema_rs.Draft202012Validator(
            dict(schema), keywords=keywords, validate_formats=False, offline=True
        )
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException:  # any refusal (or a Rust panic) leaves the schema to the reference
        return None


def fast_valid(fast: Any, instance: Any) -> bool:
    """The compiled validator's "valid" (``False`` when there is none); whatever else it does (a
    string it cannot convert, a Rust panic, which is a ``BaseException``) leaves the verdict to
    the reference."""
    if fast is None:
        return False
    try:
        return fast.is_valid(instance) is True
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException:
        return False


class ParameterValidator:
    """A parameter schema's check for every request: the compiled validator's "valid" where it
    has one, else the reference's verdict (so every refusal, and every error, is the
    reference's). The seam builds one per handler (``dispatch/seam.py``,
    ``check_parameters_schema``), without asserting formats, as its reference does."""

    __slots__ = ("compiled", "reference")

    def __init__(self, reference: Any, compiled: Any) -> None:
        self.reference = reference
        self.compiled = compiled

    def is_valid(self, instance: Any) -> bool:
        if fast_valid(self.compiled, instance):
            return True
        return bool(self.reference.is_valid(instance))


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
