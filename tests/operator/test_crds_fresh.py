"""The checked-in CRDs are exactly what the models generate (CI fails when they are stale)."""

from __future__ import annotations

from pathlib import Path

from agentsafe.operator.crds import CRD_DIRECTORIES, render_crd_files, stale_crds

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crds_are_fresh() -> None:
    stale = stale_crds(ROOT)
    assert stale == [], f"stale CRDs {stale}: run `agentsafe crds generate`"


def test_a_stale_file_is_named(tmp_path: Path) -> None:
    for directory in CRD_DIRECTORIES:
        (tmp_path / directory).mkdir(parents=True)
        for name, text in render_crd_files().items():
            (tmp_path / directory / name).write_text(text)
    assert stale_crds(tmp_path) == []
    victim = tmp_path / "crds" / "haltswitches.agentsafe.io.yaml"
    victim.write_text(victim.read_text().replace("Halted", "Stopped"))
    assert stale_crds(tmp_path) == ["crds/haltswitches.agentsafe.io.yaml"]
