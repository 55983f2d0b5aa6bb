"""Replay every fuzz target's corpus (seeds and the inputs fuzzing found) in the suite.

The corpus lives in ``tests/fuzz/corpus/<target>/``; ``tests/fuzz/run.py`` fuzzes a target
with atheris from it (``make fuzz-smoke`` briefly, in ``make test``; ``make fuzz`` at length).
Replaying needs no atheris: a regression in a parser fails here on the input that found it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS

CORPUS = Path(__file__).resolve().parent / "corpus"


def _inputs() -> list[tuple[str, Path]]:
    return [
        (name, path)
        for name in TARGETS
        for path in sorted((CORPUS / name).iterdir())
        if path.is_file()
    ]


def test_every_target_has_a_corpus() -> None:
    for name in TARGETS:
        assert any((CORPUS / name).iterdir()), f"tests/fuzz/corpus/{name}/ is empty"


@pytest.mark.parametrize(("target", "path"), _inputs(), ids=[f"{n}/{p.name}" for n, p in _inputs()])
def test_corpus_input_is_handled(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())
