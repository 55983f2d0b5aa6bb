"""``agentsafe verify intent`` through the real console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

VECTORS = Path(__file__).resolve().parents[1] / "conformance" / "agent-safe-intent"
AGENTSAFE = str(Path(sys.executable).parent / "agentsafe")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTSAFE, *args], capture_output=True, text=True, timeout=60)


def test_all_vectors_pass() -> None:
    result = run("verify", "intent", str(VECTORS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 match, 0 differ" in result.stdout


def test_a_tampered_vector_fails(tmp_path: Path) -> None:
    for path in VECTORS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    target = tmp_path / "agent-safe-intent-v1.json"
    vector = json.loads(target.read_text())
    vector["binding"]["action"]["parameters"]["amountMinor"] = 35001
    target.write_text(json.dumps(vector))
    result = run("verify", "intent", str(tmp_path))
    assert result.returncode == 1
    assert "FAIL" in result.stdout


def test_a_plain_binding_prints_canonical_bytes_and_hash(tmp_path: Path) -> None:
    binding = tmp_path / "mine.json"
    binding.write_text('{"b": 1, "a": [1.0, "\\u00e9"]}')
    result = run("verify", "intent", str(binding))
    assert result.returncode == 0
    assert 'canonical_json: {"a":[1,"é"],"b":1}' in result.stdout
    expected = "sha256:8717ac25ea6b88548fae92fcf938c6f0764f85913ba025812e1859bf0166f5d8"
    assert expected in result.stdout


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    assert run("verify", "intent", str(tmp_path / "nope")).returncode == 2


def test_help_explains_every_subcommand() -> None:
    result = run("--help")
    assert result.returncode == 0
    for word in ("serve", "demo", "config", "verify"):
        assert word in result.stdout
