"""``docs/configuration.md``'s variables' tables stay generated from ``executor/config/table.py``.

The region between the page's markers is exactly what ``tools/config_docs.py`` renders from the
table's rows; the prose around it is hand-written and left alone. Regenerate it after changing a
row: ``AGENTSAFE_WRITE_CONFIG_DOCS=1 .venv/bin/pytest tests/test_config_docs.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentsafe.executor.config import CONFIG_KEYS, SECRET_NAMES, ExecutorConfig
from agentsafe.executor.config.table import ROWS
from agentsafe.executor.tools.config_docs import BEGIN, END, render_variables, update_document

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_the_committed_page_is_the_generated_one() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text, f"{DOC} lost its generated-variables markers"
    assert END in text, f"{DOC} lost its generated-variables markers"
    expected = update_document(text)
    if os.environ.get("AGENTSAFE_WRITE_CONFIG_DOCS") == "1":
        DOC.write_text(expected, encoding="utf-8")
        text = expected
    assert text == expected, (
        "docs/configuration.md differs from executor/config/table.py; regenerate it with "
        "AGENTSAFE_WRITE_CONFIG_DOCS=1 .venv/bin/pytest tests/test_config_docs.py"
    )


def test_a_changed_row_makes_the_page_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a row's words changed in the table show up as a stale page."""
    import agentsafe.executor.tools.config_docs as config_docs

    text = DOC.read_text(encoding="utf-8")
    row = next(r for r in ROWS if r.name == "EXECUTOR_INTENT_TTL_SECONDS")
    changed = tuple(
        r if r is not row else type(r)(**{**vars(r), "doc": "changed meaning"}) for r in ROWS
    )
    monkeypatch.setattr(config_docs, "ROWS", changed)
    assert "| changed meaning |" in render_variables()
    assert update_document(text) != text


def test_every_variable_is_one_row_and_documented_once() -> None:
    """The key list, the secrets and the model's fields are the table's rows, each in the page's
    generated region once (a secret with its ``_FILE`` form)."""
    region = DOC.read_text(encoding="utf-8").split(BEGIN, 1)[1].split(END, 1)[0]
    assert [row.attribute for row in ROWS] == list(ExecutorConfig.model_fields)
    assert {row.name for row in ROWS if row.secret is not None} == set(SECRET_NAMES)
    for key in CONFIG_KEYS:
        assert region.count(f"| `{key}` |") == 1, key
    assert len(CONFIG_KEYS) == len(ROWS) + len(SECRET_NAMES)


def test_the_page_keeps_its_prose() -> None:
    text = DOC.read_text(encoding="utf-8")
    for heading in ("## How values are read", "## Secrets", "## Rules between variables"):
        assert heading in text
