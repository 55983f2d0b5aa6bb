"""The benchmark scripts, loaded by path for their tests.

``benchmarks/`` is not a package, and the repository root must never reach ``sys.path``
(``operator/`` would shadow the standard library), so each test loads the script it tests from
its file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(script: str, name: str | None = None) -> ModuleType:
    """``benchmarks/<script>.py`` as a new module named ``name`` (default: ``script``)."""
    spec = importlib.util.spec_from_file_location(name or script, BENCHMARKS / f"{script}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imported_by_name(*scripts: str) -> None:
    """Load each of ``scripts`` under its own name, once: the scripts import one another by
    name (``from goals import ...``), as they do when run from ``benchmarks/``."""
    for script in scripts:
        if script not in sys.modules:
            sys.modules[script] = load(script)


def load_goals(name: str = "agentsafe_bench_goals") -> ModuleType:
    """``benchmarks/goals.py``, with the scripts it imports by name loaded first (once)."""
    _imported_by_name("loadclient", "lifecycle", "floor")
    return load("goals", name)


def load_split() -> ModuleType:
    """``benchmarks/split.py``, with ``goals`` and the scripts it imports loaded first (once)."""
    _imported_by_name("loadclient", "lifecycle", "floor", "goals")
    return load("split", "agentsafe_bench_split")
