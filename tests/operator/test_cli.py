"""``agentsafe operator`` and ``agentsafe crds`` register on the console script's parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agentsafe.operator.cli import default_priority, register

ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentsafe")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_subcommands_are_registered() -> None:
    parser = _parser()
    args = parser.parse_args(["operator", "--namespace", "payments", "--priority", "7"])
    assert args.namespace == ["payments"]
    assert args.priority == 7
    assert callable(args.run)
    assert callable(parser.parse_args(["crds", "check"]).run)


def test_crds_check_and_generate(tmp_path: Path) -> None:
    parser = _parser()
    check = parser.parse_args(["crds", "check", "--root", str(ROOT)])
    assert check.run(check) == 0
    stale = parser.parse_args(["crds", "check", "--root", str(tmp_path)])
    assert stale.run(stale) == 1
    generate = parser.parse_args(["crds", "generate", "--root", str(tmp_path)])
    assert generate.run(generate) == 0
    assert stale.run(stale) == 0
    assert (tmp_path / "charts/agentsafe/templates/crds/agentpolicies.agentsafe.io.yaml").is_file()


def test_default_priority_is_positive_and_bounded() -> None:
    assert 1 <= default_priority() <= 2**30


def test_reconcile_interval_is_parsed_and_refused_when_not_positive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _parser().parse_args(["operator"]).reconcile_interval == 60.0
    monkeypatch.setenv("AGENTSAFE_OPERATOR_RECONCILE_INTERVAL", "15")
    args = _parser().parse_args(["operator"])
    assert args.reconcile_interval == 15.0
    args = _parser().parse_args(["operator", "--reconcile-interval", "0"])
    with pytest.raises(SystemExit, match="--reconcile-interval must be > 0"):
        args.run(args)
