"""The checked-in CRDs are exactly what the models generate (CI fails when they are stale)."""

from __future__ import annotations

from pathlib import Path

import yaml

from agentsafe.operator.crds import CHART_CRD_TEMPLATES, render_crd_files, stale_crds, write_crds

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_crds_are_fresh() -> None:
    stale = stale_crds(ROOT)
    assert stale == [], f"stale CRDs {stale}: run `agentsafe crds generate`"


def test_a_stale_file_is_named(tmp_path: Path) -> None:
    write_crds(tmp_path)
    assert stale_crds(tmp_path) == []
    victim = tmp_path / "crds" / "haltswitches.agentsafe.io.yaml"
    victim.write_text(victim.read_text().replace("Halted", "Stopped"))
    assert stale_crds(tmp_path) == ["crds/haltswitches.agentsafe.io.yaml"]


def test_the_chart_templates_wrap_the_same_crds() -> None:
    files = render_crd_files()
    for relative, text in files.items():
        if not relative.startswith(CHART_CRD_TEMPLATES):
            continue
        plain = yaml.safe_load(files["crds/" + relative.rsplit("/", 1)[1]])
        lines = text.splitlines()
        assert lines[1] == "{{- if .Values.crds.enabled }}"
        assert lines[-1] == "{{- end }}"
        # Without the template lines (gate and keep annotation), the same manifest.
        body = "\n".join(
            line for line in lines if "{{" not in line and "resource-policy" not in line
        )
        body = body.replace("metadata:\n  annotations:\n", "metadata:\n")
        assert yaml.safe_load(body) == plain
