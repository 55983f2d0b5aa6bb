"""docs/chart-values.md is generated from the comments in charts/agentsafe/values.yaml."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generate_values_reference", ROOT / "charts" / "generate_values_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_values_reference_is_fresh() -> None:
    generator = _generator()
    text = generator.render(generator.VALUES.read_text(encoding="utf-8"))
    current = generator.TARGET.read_text(encoding="utf-8")
    assert current == text, "stale: run .venv/bin/python charts/generate_values_reference.py"


def test_every_value_is_described() -> None:
    generator = _generator()
    text = generator.render(generator.VALUES.read_text(encoding="utf-8"))
    assert "| `crds.keep` | `true` |" in text
    assert "| `operator.podSecurityContext` |" in text


def test_an_undescribed_value_is_named() -> None:
    generator = _generator()
    with pytest.raises(ValueError, match=r"a\.b"):
        generator.render("a:\n  # described\n  c: 1\n  b: 2\n")
