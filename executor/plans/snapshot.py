"""Snapshots of JSON-compatible structured data: the only way a value crosses the boundary.

Python's form of the "JSON-compatible structured data" precondition. Only values of *exactly*
these types are accepted: ``dict`` with ``str`` keys, ``list``, ``str``, ``int`` (never ``bool``
where a number is meant, and within the IEEE-754 exact range), finite ``float``, ``bool`` and
``None``. Subclasses, other mappings, objects with properties and everything else are refused by
``type(x) is ...`` checks, so no user code runs: exact dicts are walked with ``dict.items`` and
lengths are checked before a collection is read.

The walk copies the value into a deeply immutable snapshot (:class:`FrozenDict` over a private
dict, ``tuple`` for arrays) while spending a :class:`Budget`: nodes, depth, containers and the
cumulative UTF-8 bytes of keys and strings (numbers count their canonical text). A budget is
shared across every input and output of one public operation, so splitting data across several
arguments does not buy more room.

Callers: every public operation of ``agentsafe.executor.plans``.
These are the main callers: it is imported across the wings, and its other importers are not
listed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, final

from ..canonical import MAX_SAFE_INTEGER, format_number
from ..codes import Code
from .errors import AgentSafetyError
from .limits import AGENT_SAFETY_HARD_LIMITS

__all__ = [
    "Budget",
    "FrozenDict",
    "envelope_budget",
    "freeze",
    "freeze_object",
    "result_budget",
    "thaw",
]

_HARD = AGENT_SAFETY_HARD_LIMITS


@final
class FrozenDict(Mapping[str, Any]):
    """An immutable JSON object produced only by :func:`freeze`. Its values are snapshots too."""

    __slots__ = ("_data",)
    _data: dict[str, Any]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("FrozenDict is produced by freeze() only")

    @classmethod
    def _adopt(cls, data: dict[str, Any]) -> FrozenDict:
        self = object.__new__(cls)
        object.__setattr__(self, "_data", data)
        return self

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("a FrozenDict is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("a FrozenDict is immutable")

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __eq__(self, other: object) -> bool:
        if type(other) is FrozenDict:
            return self._data == other._data
        if type(other) is dict:
            return self._data == other
        return NotImplemented

    def __hash__(self) -> int:
        raise TypeError("a FrozenDict is not hashable")

    def __reduce__(self) -> Any:
        return (_rebuild, (thaw(self),))


def _rebuild(data: dict[str, Any]) -> FrozenDict:
    return _freeze_object(data, _unbounded(), 0)


def _unbounded() -> Budget:
    big = 1 << 62
    return Budget(nodes=big, depth=1000, containers=big, bytes=big, width=big)


@dataclass
class Budget:
    """What one public operation may still spend. Mutable on purpose: it is spent as inputs
    are snapshotted; never shared between operations."""

    nodes: int
    depth: int
    containers: int
    bytes: int
    width: int = _HARD["maxCollectionLength"]

    def spend_node(self) -> None:
        self.nodes -= 1
        if self.nodes < 0:
            raise AgentSafetyError("the value has too many nodes", code=Code.JSON_TOO_MANY_NODES)

    def spend_container(self) -> None:
        self.containers -= 1
        if self.containers < 0:
            raise AgentSafetyError(
                "the value has too many objects and arrays", code=Code.JSON_TOO_MANY_CONTAINERS
            )

    def spend_bytes(self, count: int) -> None:
        self.bytes -= count
        if self.bytes < 0:
            raise AgentSafetyError("the value is too large", code=Code.JSON_TOO_LARGE)


def envelope_budget() -> Budget:
    """The cumulative pre-signature budget of one public operation."""
    return Budget(
        nodes=_HARD["maxEnvelopeNodes"],
        depth=_HARD["maxEnvelopeDepth"],
        containers=_HARD["maxEnvelopeContainers"],
        bytes=_HARD["maxEnvelopeBytes"],
    )


def result_budget(max_bytes: int) -> Budget:
    """The budget of one executor result: bytes bounded by the approved step ceiling."""
    return Budget(
        nodes=_HARD["maxResultNodes"],
        depth=_HARD["maxResultDepth"],
        containers=_HARD["maxResultContainers"],
        bytes=max_bytes,
        width=_HARD["maxResultNodes"],
    )


def freeze(value: object, budget: Budget) -> Any:
    """Copy ``value`` into a deeply immutable snapshot, spending ``budget``; refuse anything
    that is not exact JSON-compatible data. Snapshots (:class:`FrozenDict`, ``tuple``) are
    accepted too, so a snapshot can be re-checked against a narrower budget."""
    return _freeze(value, budget, 0)


def _text_bytes(text: str, budget: Budget) -> None:
    if len(text) > budget.bytes:  # every character is at least one byte: refuse before encoding
        raise AgentSafetyError("the value is too large", code=Code.JSON_TOO_LARGE)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise AgentSafetyError("a string has no UTF-8 form", code=Code.JSON_INVALID) from None
    budget.spend_bytes(size)


def _freeze(value: object, budget: Budget, depth: int) -> Any:
    budget.spend_node()
    if type(value) is Code:  # agentsafe's own stable code: its plain string
        value = value.value
    kind = type(value)
    if value is None or kind is bool:
        budget.spend_bytes(4)
        return value
    if kind is str:
        assert isinstance(value, str)
        _text_bytes(value, budget)
        return value
    if kind is int:
        assert isinstance(value, int)
        if abs(value) > MAX_SAFE_INTEGER:
            raise AgentSafetyError("an integer is out of range", code=Code.JSON_NUMBER_INVALID)
        budget.spend_bytes(len(format_number(value)))
        return value
    if kind is float:
        assert isinstance(value, float)
        if not math.isfinite(value):
            raise AgentSafetyError("a number is not finite", code=Code.JSON_NUMBER_INVALID)
        budget.spend_bytes(len(format_number(value)))
        return value
    if kind is dict or kind is FrozenDict:
        return _freeze_object(value, budget, depth)
    if kind is list or kind is tuple:
        return _freeze_array(value, budget, depth)
    raise AgentSafetyError("a value is not plain JSON data", code=Code.JSON_TYPE_REFUSED)


def _enter(budget: Budget, depth: int, length: int) -> None:
    if depth + 1 > budget.depth:
        raise AgentSafetyError("the value is nested too deeply", code=Code.JSON_TOO_DEEP)
    budget.spend_container()
    if length > budget.width:
        raise AgentSafetyError("a collection is too long", code=Code.JSON_COLLECTION_TOO_LONG)
    if length > budget.nodes:
        raise AgentSafetyError("the value has too many nodes", code=Code.JSON_TOO_MANY_NODES)


def _freeze_object(value: object, budget: Budget, depth: int) -> FrozenDict:
    source: object = value
    if type(value) is FrozenDict:
        source = object.__getattribute__(value, "_data")
    if type(source) is not dict:
        raise AgentSafetyError("a value is not plain JSON data", code=Code.JSON_TYPE_REFUSED)
    length = dict.__len__(source)
    _enter(budget, depth, length)
    items = list(dict.items(source))
    budget.spend_bytes(2)
    copied: dict[str, Any] = {}
    for key, item in items:
        if type(key) is not str:
            raise AgentSafetyError("an object key is not a string", code=Code.JSON_TYPE_REFUSED)
        _text_bytes(key, budget)
        copied[key] = _freeze(item, budget, depth + 1)
    return FrozenDict._adopt(copied)


def _freeze_array(value: object, budget: Budget, depth: int) -> tuple[Any, ...]:
    if type(value) is list:
        length = list.__len__(value)
        _enter(budget, depth, length)
        items = tuple(list.__iter__(value))
    else:
        assert type(value) is tuple
        length = tuple.__len__(value)
        _enter(budget, depth, length)
        items = value
    budget.spend_bytes(2)
    return tuple(_freeze(item, budget, depth + 1) for item in items)


def thaw(value: Any) -> Any:
    """A plain, mutable ``dict``/``list`` copy of a snapshot (for JSON responses)."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [thaw(item) for item in value]
    return value


def freeze_object(value: object, budget: Budget) -> FrozenDict:
    """:func:`freeze` for a value that must be a JSON object."""
    frozen = freeze(value, budget)
    if type(frozen) is not FrozenDict:
        raise AgentSafetyError("the value must be an object", code=Code.JSON_TYPE_REFUSED)
    return frozen
