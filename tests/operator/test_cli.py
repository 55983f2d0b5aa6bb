"""``agentsafe operator`` and ``agentsafe crds`` register on the console script's parser."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentsafe.executor.config import WORKERS_DEFAULT, WORKERS_MAX
from agentsafe.operator.cli import credentials_source, default_priority, register
from agentsafe.operator.resources import FINALIZER, migrated_finalizers

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
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _parser().parse_args(["operator"]).reconcile_interval == 60.0
    monkeypatch.setenv("AGENTSAFE_OPERATOR_RECONCILE_INTERVAL", "15")
    args = _parser().parse_args(["operator"])
    assert args.reconcile_interval == 15.0
    for refused in ("0", "-5", "soon"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["operator", "--reconcile-interval", refused])
        assert "--reconcile-interval" in capsys.readouterr().err


def test_the_default_worker_count_is_parsed_and_refused_out_of_the_executors_range(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _parser().parse_args(["operator"]).executor_workers == WORKERS_DEFAULT
    assert _parser().parse_args(["operator", "--executor-workers", "4"]).executor_workers == 4
    monkeypatch.setenv("AGENTSAFE_OPERATOR_EXECUTOR_WORKERS", str(WORKERS_MAX))
    assert _parser().parse_args(["operator"]).executor_workers == WORKERS_MAX
    for refused in ("0", str(WORKERS_MAX + 1), "-1", "two", "1.5", ""):
        with pytest.raises(SystemExit):
            _parser().parse_args(["operator", "--executor-workers", refused])
        err = capsys.readouterr().err
        assert f"--executor-workers: must be a whole number 1..{WORKERS_MAX}" in err
    monkeypatch.setenv("AGENTSAFE_OPERATOR_EXECUTOR_WORKERS", "0")
    with pytest.raises(SystemExit):
        _parser().parse_args(["operator"])
    assert "AGENTSAFE_OPERATOR_EXECUTOR_WORKERS" in capsys.readouterr().err
    # Only the operator reads it: another subcommand parses whatever the variable says.
    assert callable(_parser().parse_args(["crds", "check"]).run)


def test_without_credentials_the_operator_says_so_in_one_json_line(tmp_path: Path) -> None:
    """No service account and no kubeconfig: one kopf-format JSON line and exit 78, not kopf's
    50-line traceback (issue 22)."""
    agentsafe = str(Path(sys.executable).parent / "agentsafe")
    result = subprocess.run(
        [agentsafe, "operator"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 78
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    record = json.loads(line)
    assert record["code"] == "KUBE_CREDENTIALS_MISSING"
    assert record["severity"] == "error"
    assert "timestamp" in record
    assert "KUBECONFIG" in record["message"]


def test_credentials_are_found_where_the_clients_look(tmp_path: Path) -> None:
    token = tmp_path / "token"
    assert credentials_source({}, token=token, home=tmp_path) is None
    token.write_text("t")
    assert credentials_source({}, token=token, home=tmp_path) is None  # not in a pod
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert credentials_source(pod, token=token, home=tmp_path) == "service account"
    assert credentials_source({"KUBECONFIG": "/x"}, token=tmp_path / "no", home=tmp_path) == (
        "KUBECONFIG"
    )
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert credentials_source({}, token=tmp_path / "no", home=tmp_path) == "~/.kube/config"


def test_the_legacy_finalizer_is_renamed_under_agentsafe_io() -> None:
    legacy = "kopf.zalando.org/KopfFinalizerMarker"
    assert FINALIZER == "agentsafe.io/finalizer"
    assert migrated_finalizers(["other", FINALIZER], deleting=False) is None
    assert migrated_finalizers(["other", legacy], deleting=False) == ["other", FINALIZER]
    assert migrated_finalizers([legacy, FINALIZER], deleting=False) == [FINALIZER]
    # being deleted: the old name only goes, so nothing holds the object forever
    assert migrated_finalizers(["other", legacy], deleting=True) == ["other"]


def test_the_migration_handler_patches_only_objects_with_the_old_name() -> None:
    import kopf

    from agentsafe.operator.handlers import build_registry, finalizer_migration_handler

    patch = kopf.Patch()
    body = kopf.Body({"metadata": {"finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]}})
    finalizer_migration_handler(body=body, patch=patch)
    assert patch == {"metadata": {"finalizers": [FINALIZER]}}
    untouched = kopf.Patch()
    finalizer_migration_handler(body=kopf.Body({"metadata": {}}), patch=untouched)
    assert untouched == {}
    ids = {h.id for h in build_registry()._watching.get_all_handlers()}
    assert "finalizer-name" in ids
