"""docs/index.md lists every document in ``docs/`` and links nothing that is gone; the README
links the index. Reads files only."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
_LINK = re.compile(r"\]\(([^)#\s]+)\)")


def _documents() -> set[str]:
    return {
        path.relative_to(DOCS).as_posix()
        for path in DOCS.rglob("*")
        if path.is_file() and path.suffix in {".md", ".json"} and path.name != "index.md"
    }


def _linked() -> set[str]:
    return set(_LINK.findall((DOCS / "index.md").read_text(encoding="utf-8")))


def test_the_index_lists_every_document() -> None:
    missing = _documents() - _linked()
    assert missing == set(), f"docs/index.md does not list {sorted(missing)}"


def test_the_index_links_only_documents_that_exist() -> None:
    gone = {link for link in _linked() if not (DOCS / link).is_file()}
    assert gone == set()


def test_the_documents_are_found() -> None:
    assert {"architecture.md", "playbooks/README.md", "openapi.json"} <= _documents()


def test_the_readme_links_the_index() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/index.md)" in readme
    assert readme.splitlines()[3].startswith("make demo")
    assert readme.splitlines()[4].startswith("make test")
