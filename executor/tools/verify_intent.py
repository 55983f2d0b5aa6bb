"""``agentsafe verify intent``: check conformance vectors offline, or hash a binding of your own.

A vector file holds ``binding`` and the expected ``intent_hash`` (and, for the small vectors, the
expected ``canonical_json``); every one must match for exit status 0. A file without those keys
is treated as a plain binding: its canonical bytes and hash are printed, for comparison with
another implementation's.

Callers: ``cli.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..canonical import canonical_json, sha256_digest
from ..errors import CanonicalizationError

__all__ = ["VectorResult", "check_vector", "run"]


@dataclass(frozen=True)
class VectorResult:
    path: Path
    ok: bool
    detail: str


def check_vector(path: Path, document: dict[str, Any]) -> VectorResult:
    binding = document["binding"]
    try:
        canonical = canonical_json(binding)
    except CanonicalizationError as exc:
        return VectorResult(path, False, f"cannot canonicalise: {exc.code}")
    expected_json = document.get("canonical_json")
    if expected_json is not None and canonical != str(expected_json).encode("utf-8"):
        return VectorResult(path, False, "canonical bytes differ")
    actual = sha256_digest(binding)
    if actual != document.get("intent_hash"):
        return VectorResult(path, False, f"hash differs: got {actual}")
    return VectorResult(
        path, True, "canonical bytes and hash match" if expected_json else "hash matches"
    )


def _files(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(p for p in target.glob("*.json") if p.is_file())
    return [target]


def run(target: Path, *, console: Console | None = None) -> int:
    """Check every vector under ``target``; print plain bindings' canonical form. Exit status."""
    out = console or Console()
    if not target.exists():
        out.print(f"[red]no such file or directory:[/red] {target}")
        return 2
    files = _files(target)
    if not files:
        out.print(f"[red]no .json files in[/red] {target}")
        return 2
    results: list[VectorResult] = []
    for path in files:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            results.append(VectorResult(path, False, f"not readable JSON ({type(exc).__name__})"))
            continue
        if isinstance(document, dict) and "binding" in document and "intent_hash" in document:
            results.append(check_vector(path, document))
            continue
        try:
            canonical = canonical_json(document)
        except CanonicalizationError as exc:
            results.append(VectorResult(path, False, f"cannot canonicalise: {exc.code}"))
            continue
        out.print(f"[bold]{path}[/bold]")
        out.print(
            "canonical_json: " + canonical.decode("utf-8"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        out.print(
            "intent_hash:    " + sha256_digest(document),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    vectors = results
    if vectors:
        table = Table(title="agent-safe.intent/1 vectors")
        table.add_column("file")
        table.add_column("result")
        table.add_column("detail")
        for r in vectors:
            table.add_row(
                r.path.name, "[green]PASS[/green]" if r.ok else "[red]FAIL[/red]", r.detail
            )
        out.print(table)
        passed = sum(r.ok for r in vectors)
        out.print(f"vectors: {passed} match, {len(vectors) - passed} differ")
    return 0 if all(r.ok for r in results) else 1
