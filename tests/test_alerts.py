"""The alert rules as data (``charts/agentsafe/files/alerts.yaml``): every rule names only
metrics the executor or the operator really exports, links a playbook that exists, and every
playbook is linked by an alert and carries the commands it promises."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from agentsafe.executor.dispatch.seam import Outcome
from agentsafe.executor.host.metrics import ExecutorMetrics
from agentsafe.executor.policy.policy import Verdict
from agentsafe.operator.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "charts" / "agentsafe" / "files" / "alerts.yaml"
PLAYBOOKS = ROOT / "docs" / "playbooks"
_METRIC = re.compile(r"\bagentsafe_[a-z0-9_]+")
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
}


def _exported(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry can expose (labelled families included, used or not)."""
    return {
        family.name + suffix for family in registry.collect() for suffix in _SUFFIXES[family.type]
    }


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_alert_names_only_exported_metrics() -> None:
    exported = _exported(ExecutorMetrics(verdicts=Verdict, outcomes=Outcome).registry)
    exported |= _exported(OperatorMetrics().registry)
    rules = _rules()
    assert len(rules) >= 6
    for rule in rules:
        names = set(_METRIC.findall(rule["expr"]))
        assert names, rule["alert"]
        assert names <= exported, (rule["alert"], names - exported)


def test_every_alert_links_a_playbook_that_exists_and_every_playbook_is_linked() -> None:
    linked = set()
    for rule in _rules():
        assert re.fullmatch(r"Agentsafe[A-Za-z]+", rule["alert"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"]
        playbook = rule["annotations"]["playbook"]
        assert (PLAYBOOKS / f"{playbook}.md").is_file(), (rule["alert"], playbook)
        linked.add(playbook)
    pages = {p.stem for p in PLAYBOOKS.glob("*.md")} - {"README"}
    assert pages == linked
    assert len(pages) == 7


def test_every_playbook_names_its_alerts_and_gives_commands() -> None:
    by_playbook: dict[str, list[str]] = {}
    for rule in _rules():
        by_playbook.setdefault(rule["annotations"]["playbook"], []).append(rule["alert"])
    for playbook, alerts in by_playbook.items():
        text = (PLAYBOOKS / f"{playbook}.md").read_text()
        for alert in alerts:
            assert alert in text, (playbook, alert)
        blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
        commands = "\n".join(blocks)
        assert re.search(r"^kubectl ", commands, flags=re.M), playbook
        assert re.search(r"(^|\s)agentsafe (status|verify|policy|store)\b", commands), playbook
    index = (PLAYBOOKS / "README.md").read_text()
    for playbook in by_playbook:
        assert f"({playbook}.md)" in index, playbook
