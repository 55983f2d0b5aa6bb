"""CEL for policy rules: compile once at load, evaluate many times, fail closed.

A thin wrapper around ``common-expression-language`` (module ``cel``, Rust bindings; see
``docs/cel.md`` for why this engine and not ``cel-python``). Policy rules are compiled when the
policy is loaded (:func:`compile_expression`), and an expression that does not parse, names a
variable the authority never provides, or calls a function the engine does not have is refused
there, with the compiler's message. Evaluation (:meth:`Expression.evaluate`) returns a ``bool`` or
raises :class:`EvaluationError`; a non-boolean result is an error too. The authority turns every
such error into ``BLOCK`` with ``POLICY_EVALUATION_ERROR``.

The variables a rule sees (:data:`VARIABLES`) are built by the authority from the captured intent:
``action`` (``{type, resource}``), ``target`` (``{system, operation, endpoint}``), ``params``,
``principal`` (``{id, role, actor}``), ``tenant`` (string), ``context`` (the intent's context
map) and ``now`` (a CEL ``timestamp``, the authority's clock). Integers are CEL ``int`` (int64).

Callers: ``policy/policy.py`` (compilation), ``policy/authority.py`` (evaluation).
Also imported by ``lint.py``.

``benchmarks/cel_engines.py`` times the two CEL engines this module could use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cel

from ..codes import Code
from ..errors import AgentSafeError, PolicyError

__all__ = [
    "FUNCTIONS",
    "VARIABLES",
    "Activation",
    "EvaluationError",
    "Expression",
    "compile_expression",
]

VARIABLES = frozenset({"action", "target", "params", "principal", "tenant", "context", "now"})
"""The names a policy expression may refer to."""

FUNCTIONS = frozenset(
    {
        "size",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "timestamp",
        "duration",
        "type",
        "dyn",
        "getFullYear",
        "getMonth",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    }
)
"""Named functions the engine provides natively (operators and macros are always allowed)."""

MAX_EXPRESSION_LENGTH = 4096

# Variables bound by a comprehension macro (``list.all(x, ...)``) appear among an expression's
# identifiers; they are allowed where they are bound.
_BINDER = re.compile(
    r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,"
)


class EvaluationError(AgentSafeError):
    """A rule could not be evaluated to a boolean; the message never carries activation values."""

    code = Code.POLICY_EVALUATION_ERROR


class Activation:
    """The variables of one evaluation, converted to CEL values once for every rule tried."""

    __slots__ = ("_context",)

    def __init__(self, variables: Mapping[str, Any]) -> None:
        # The engine converts every value when the context is built and keeps no reference to
        # the mapping, so a plain dict is handed over as it is (no copy per evaluation).
        plain = variables if type(variables) is dict else dict(variables)
        self._context = cel.Context(variables=plain)

    @property
    def context(self) -> Any:
        return self._context


@dataclass(frozen=True)
class Expression:
    """A compiled CEL expression that must evaluate to a ``bool``."""

    source: str
    _program: Any
    variables: frozenset[str] = VARIABLES
    """The authority's variables the expression refers to (the engine's own reference list);
    an evaluation binds only these, and one it missed is unbound: an error, so BLOCK."""

    def evaluate(self, activation: Mapping[str, Any] | Activation) -> bool:
        """Evaluate; raises :class:`EvaluationError` on any error or a non-boolean result."""
        context = activation.context if isinstance(activation, Activation) else dict(activation)
        try:
            result = self._program.execute(context)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # the Rust engine's panics derive from BaseException
            # The engine's message can quote activation values (request data): name the kind only.
            raise EvaluationError(
                f"evaluation failed ({type(exc).__name__})", code=Code.POLICY_EVALUATION_ERROR
            ) from None
        if result is not True and result is not False:
            raise EvaluationError(
                f"expression produced {type(result).__name__}, not bool",
                code=Code.POLICY_EVALUATION_ERROR,
            )
        return result


def compile_expression(text: str, *, path: str | None = None) -> Expression:
    """Compile ``text``; refuses it with :class:`PolicyError` (code ``POLICY_EXPRESSION_INVALID``).

    ``path`` (``actions[0].rules[1].when``) prefixes the message so an operator can find the rule.
    """
    if not isinstance(text, str) or not text.strip():
        raise PolicyError(
            "expression is empty",
            path=path,
            code=Code.POLICY_EXPRESSION_INVALID,
            public="expression is empty",
        )
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise PolicyError(
            f"expression longer than {MAX_EXPRESSION_LENGTH} characters",
            path=path,
            code=Code.POLICY_EXPRESSION_INVALID,
            public=f"expression longer than {MAX_EXPRESSION_LENGTH} characters",
        )
    try:
        program = cel.compile(text)
        references = program.references()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        raise PolicyError(
            _compiler_message(exc),
            path=path,
            code=Code.POLICY_EXPRESSION_INVALID,
            public="the expression does not compile (agentsafe policy lint shows where)",
        ) from None
    bound = set(_BINDER.findall(text))
    unknown_variables = sorted(set(references["variables"]) - VARIABLES - bound)
    if unknown_variables:
        raise PolicyError(
            f"undeclared reference to {', '.join(unknown_variables)} "
            f"(available: {', '.join(sorted(VARIABLES))})",
            path=path,
            code=Code.POLICY_EXPRESSION_INVALID,
            public=f"undeclared reference (available: {', '.join(sorted(VARIABLES))})",
        )
    unknown_functions = sorted(
        name for name in references["functions"] if not _is_operator(name) and name not in FUNCTIONS
    )
    if unknown_functions:
        raise PolicyError(
            f"unknown function {', '.join(unknown_functions)}",
            path=path,
            code=Code.POLICY_EXPRESSION_INVALID,
            public="unknown function",
        )
    variables = frozenset(references["variables"]) & VARIABLES
    return Expression(source=text, _program=program, variables=variables)


def _is_operator(name: str) -> bool:
    return name.startswith(("_", "!", "@", "-"))


def _compiler_message(exc: BaseException) -> str:
    message = str(exc).strip()
    # The engine prefixes "Failed to parse expression '<source>': "; the path names the rule.
    marker = "': "
    if message.startswith("Failed to parse expression") and marker in message:
        message = message.split(marker, 1)[1]
    return message or type(exc).__name__
