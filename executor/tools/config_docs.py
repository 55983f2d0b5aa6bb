"""The variables' tables of ``docs/configuration.md``, generated from the configuration's table.

Role: :func:`render_variables` writes one section per group of ``config/table.py`` (its title,
its prose, and a table of its variables: name, type or range, default, meaning; a secret's
``<NAME>_FILE`` follows it), and :func:`update_document` puts that text between the page's
markers, leaving the hand-written prose around them alone. What a row does not say itself is
derived: the range from its bounds, the enumeration's values, the default as the variable would
be written.

Callers: ``tests/test_config_docs.py`` (fails when the committed page is stale; with
``AGENTSAFE_WRITE_CONFIG_DOCS=1`` it rewrites it).
"""

from __future__ import annotations

import textwrap
import typing
from enum import Enum
from typing import Final

from ..config import ExecutorConfig, LockoutRule, RateRule, SecretSource
from ..config.parsing import Kind
from ..config.table import GROUPS, ROWS, Row
from ..config.values import rule_text

__all__ = ["BEGIN", "END", "render_variables", "update_document"]

BEGIN: Final = (
    "<!-- BEGIN variables: generated from executor/config/table.py by tests/test_config_docs.py -->"
)
END: Final = "<!-- END variables -->"

_HEADER: Final = "| Variable | Type / range | Default | Meaning |\n| --- | --- | --- | --- |"
_FILE_DOC: Final = "The same, as a mounted file"
_WIDTH: Final = 100  # the page's prose is wrapped at this width
# How each kind is written when its row does not say (integers and enumerations are derived).
_SHAPES: Final[dict[Kind, str]] = {
    Kind.DOWNSTREAM_URL: "https URL",
    Kind.LOOKUP_URL: "https URL containing `{idempotency_key}`",
    Kind.REFERENCE_URL: "https URL containing `{provider_reference}`",
    Kind.RATE_RULE: "`<count>/<seconds>`",
    Kind.LOCKOUT_RULE: "`<failures>/<seconds>/<lock seconds>`",
}


def _shape(row: Row) -> str:
    if row.shape is not None:
        return row.shape
    if row.kind is Kind.INT:
        return f"{row.ge}..{row.le}"
    if row.kind is Kind.ENUM:
        annotation = ExecutorConfig.model_fields[row.attribute].annotation
        members = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        enum = members[0]
        assert isinstance(enum, type)
        assert issubclass(enum, Enum)
        return " \\| ".join(f"`{member.value}`" for member in enum)
    return _SHAPES.get(row.kind, row.kind.value)


def _default(row: Row) -> str:
    if row.default_doc is not None:
        return row.default_doc
    if row.required:
        return "required"
    value = row.default
    if value is None or value == () or value == {}:
        return "—"
    if isinstance(value, SecretSource):
        return "—"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, RateRule | LockoutRule):
        return f"`{rule_text(value)}`"
    return f"`{value}`"


def _prose(text: str) -> str:
    return textwrap.fill(text, width=_WIDTH, break_long_words=False, break_on_hyphens=False)


def render_variables() -> str:
    """The generated region: one ``###`` section per group, in the table's order."""
    sections: list[str] = []
    for group in GROUPS:
        lines = [f"### {group.title}", ""]
        if group.intro:
            lines += [_prose(group.intro), ""]
        lines.append(_HEADER)
        for row in ROWS:
            if row.group is not group:
                continue
            lines.append(f"| `{row.name}` | {_shape(row)} | {_default(row)} | {row.doc} |")
            if row.file_key is not None:
                lines.append(f"| `{row.file_key}` | path | — | {row.file_doc or _FILE_DOC} |")
        if group.outro:
            lines += ["", _prose(group.outro)]
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def update_document(text: str) -> str:
    """``text`` (docs/configuration.md) with the region between the markers regenerated."""
    head, sep, rest = text.partition(BEGIN)
    _table, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError("docs/configuration.md lost its generated-variables markers")
    return f"{head}{BEGIN}\n\n{render_variables()}\n\n{END}{tail}"
