"""benchmarks/split.py: what one load split over two processes costs per request.

The figures are a record (docs/performance.md), never asserted; these tests check what the
script computes from them and that each of its shapes measures the processes it names: the
floor's two independent servers each serve their half of the load (a shape that sent it all to
one would read as one process, the fault goals.py's shared-port row had until 2026-12-05).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from types import ModuleType

import pytest

from .scripts import load_split


@pytest.fixture(scope="module")
def split() -> ModuleType:
    return load_split()


def test_the_summary_is_each_shapes_median_and_its_ratio_to_one(split: ModuleType) -> None:
    readings = {
        "one": [[1.0], [0.9], [1.1]],
        "one-half": [[1.2], [1.1], [1.3]],
        "two": [[0.6, 0.6], [0.5, 0.6], [0.7, 0.6]],
        "two-double": [[0.5, 0.5], [0.4, 0.5], [0.5, 0.6]],
    }
    out = split.summary(readings)
    assert out["cpu_ms"] == pytest.approx(
        {"one": 1.0, "one-half": 1.2, "two": 1.2, "two-double": 1.0}
    )
    assert out["rounds"]["two"] == pytest.approx([1.2, 1.1, 1.3])
    assert out["parts"] is readings
    assert out["ratios"] == pytest.approx({"one-half": 1.2, "two": 1.2, "two-double": 1.0})


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--requests", "0"], ["--concurrency", "1"]])
def test_arguments_out_of_range_are_refused(split: ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        split.main(argv)
    assert refused.value.code == 2


def test_the_floors_two_servers_each_serve_half_the_load(split: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(
        requests=40, concurrency=4, rounds=1, skip_executor=True, client="python"
    )
    result = asyncio.run(split.run(args, tmp_path))
    floor = result["floor"]
    assert set(floor["cpu_ms"]) == set(split.SHAPES)
    for shape in ("two", "two-double"):
        (parts,) = floor["parts"][shape]
        assert len(parts) == 2
        assert all(part > 0 for part in parts), (shape, parts)
    (one,) = floor["parts"]["one"]
    assert len(one) == 1
    assert "executor" not in result
