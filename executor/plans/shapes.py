"""Small strict readers over snapshots: exact keys, bounded strings, identifiers, digests and
canonical timestamps. Each refusal names the path of our own field names, never the value.

Callers: ``dryrun.py``, ``approval.py``, ``receipts.py``, ``execute.py``.
Also imported by ``service.py``, ``signing.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..clock import format_ms, parse_ms
from ..codes import Code
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS as HARD
from .snapshot import FrozenDict

__all__ = [
    "DIGEST_PATTERN",
    "digest",
    "identifier",
    "integer",
    "obj",
    "optional",
    "seq",
    "text",
    "timestamp",
]

DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
_IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$")


def obj(
    value: Any,
    where: str,
    *,
    code: Code,
    required: frozenset[str],
    optional: frozenset[str] = frozenset(),
) -> FrozenDict:
    """An object with exactly the ``required`` keys and any of the ``optional`` ones."""
    if type(value) is not FrozenDict:
        raise AgentSafetyError(f"{where} must be an object", code=code)
    keys = set(value)
    if not required <= keys:
        raise AgentSafetyError(f"{where} is missing a required property", code=code)
    if not keys <= required | optional:
        raise AgentSafetyError(f"{where} has an unknown property", code=code)
    return value


def optional(value: Mapping[str, Any], key: str) -> Any:
    return value.get(key)


def seq(
    value: Any, where: str, *, code: Code, min_length: int = 0, max_length: int
) -> tuple[Any, ...]:
    if type(value) is not tuple:
        raise AgentSafetyError(f"{where} must be an array", code=code)
    if not min_length <= len(value) <= max_length:
        raise AgentSafetyError(f"{where} has a length outside its bounds", code=code)
    return value


def text(value: Any, where: str, *, code: Code, max_length: int = HARD["maxTextLength"]) -> str:
    if type(value) is not str or not value or len(value) > max_length:
        raise AgentSafetyError(f"{where} must be a non-empty bounded string", code=code)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise AgentSafetyError(f"{where} contains control characters", code=code)
    return value


def identifier(value: Any, where: str, *, code: Code) -> str:
    if type(value) is not str or not _IDENTIFIER.match(value):
        raise AgentSafetyError(f"{where} must be an identifier", code=code)
    return value


def digest(value: Any, where: str, *, code: Code) -> str:
    if type(value) is not str or not DIGEST_PATTERN.match(value):
        raise AgentSafetyError(f"{where} must be a sha256 digest", code=code)
    return value


def integer(value: Any, where: str, *, code: Code, minimum: int, maximum: int) -> int:
    if type(value) is not int:
        raise AgentSafetyError(f"{where} must be an integer", code=code)
    if not minimum <= value <= maximum:
        raise AgentSafetyError(f"{where} is outside its bounds", code=code)
    return value


def timestamp(value: Any, where: str, *, code: Code) -> float:
    """A canonical millisecond UTC timestamp (``2026-07-10T20:00:00.000Z``) in epoch seconds."""
    if type(value) is not str:
        raise AgentSafetyError(f"{where} must be a timestamp", code=code)
    try:
        seconds = parse_ms(value)
    except ValueError:
        raise AgentSafetyError(f"{where} is not a canonical timestamp", code=code) from None
    if format_ms(seconds) != value:
        raise AgentSafetyError(f"{where} is not a canonical timestamp", code=code)
    return seconds


def now_text(now: object) -> tuple[float, str]:
    """Accept ``now`` as a canonical timestamp string or finite epoch seconds."""
    if type(now) is str:
        seconds = timestamp(now, "now", code=Code.TIME_INVALID)
        return seconds, now
    if type(now) in (int, float):
        assert isinstance(now, int | float)
        if now != now or now in (float("inf"), float("-inf")) or now < 0:
            raise AgentSafetyError("now is not a finite time", code=Code.TIME_INVALID)
        text_form = format_ms(float(now))
        return parse_ms(text_form), text_form
    raise AgentSafetyError("now must be a timestamp or epoch seconds", code=Code.TIME_INVALID)
