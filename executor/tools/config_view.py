"""``agentsafe config``: what every configuration variable resolved to, and from where.

Role: presentation only. :func:`describe_config` loads the configuration exactly as ``serve``
does (:func:`~agentsafe.executor.config.load_config`, so it refuses exactly what ``serve``
refuses) and lists one :class:`ConfigRow` per variable; :func:`render_config_table` prints them
with rich. A secret's value is never read here and is shown only as ``<set>``.

Callers: ``cli.py`` (``agentsafe config``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from io import StringIO
from typing import TYPE_CHECKING

from ..config import CONFIG_KEYS, LockoutRule, RateRule, SecretSource, load_config
from ..config.table import FILE_KEYS
from ..config.values import rule_text

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ConfigRow", "describe_config", "render_config_table"]


@dataclass(frozen=True)
class ConfigRow:
    """One line of ``agentsafe config``: the variable, what it resolved to, and from where.

    ``source`` is ``env``, ``file:<path>`` (secrets), ``default`` or ``unset``; ``value`` is
    ``None`` when unset and ``<set>`` for every secret that was given.
    """

    key: str
    value: str | None
    source: str


def _display(value: object) -> str | None:
    """How ``agentsafe config`` shows a resolved non-secret value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, RateRule | LockoutRule):
        return rule_text(value)
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or None
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def describe_config(environ: Mapping[str, str]) -> list[ConfigRow]:
    """What resolved and from where, one row per variable (a secret's two forms are one row).

    A secret's value is never read here and is shown only as ``<set>``. Raises
    :class:`ConfigError` exactly as :func:`load_config` does.
    """
    config = load_config(environ)
    rows: list[ConfigRow] = []
    for key in CONFIG_KEYS:
        if key in FILE_KEYS:
            continue
        value = getattr(config, key.lower())
        if isinstance(value, SecretSource):
            if value.given:
                rows.append(ConfigRow(key, "<set>", value.describe()))
            else:
                rows.append(ConfigRow(key, None, "unset"))
            continue
        shown = _display(value)
        if key in environ:
            source = "env"
        elif shown is None:
            source = "unset"
        else:
            source = "default"
        rows.append(ConfigRow(key, shown, source))
    return rows


def render_config_table(rows: Iterable[ConfigRow], *, console: Console | None = None) -> str:
    """Render rows as a table with rich; print it to ``console`` too when one is given.

    Values are passed as plain ``Text`` so nothing in them is read as rich markup.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="agentsafe configuration", show_lines=False)
    table.add_column("variable", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for row in rows:
        value = Text(row.value) if row.value is not None else Text("-", style="dim")
        table.add_row(Text(row.key), value, Text(row.source))
    buffer = StringIO()
    Console(file=buffer, width=160, color_system=None, force_terminal=False).print(table)
    if console is not None:
        console.print(table)
    return buffer.getvalue()
