"""``agentsafe demo --no-wait`` end to end, as a person runs it (real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_every_case_and_exits_cleanly() -> None:
    agentsafe = str(Path(sys.executable).parent / "agentsafe")
    result = subprocess.run(
        [agentsafe, "demo", "--no-wait"],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "160", "TERM": "dumb"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for case in (
        "ALLOW 50.00 USD",
        "same idempotency key again",
        "over policy",
        "needs a person",
        "SHADOW",
        "SIGKILL",
        "EFFECT_MISMATCH",
    ):
        assert case in out
    assert "✗" not in out
    assert out.count("✓") == 7


def _descendants(pid: int) -> set[int]:
    """Every live process under ``pid``, from /proc's children lists (Linux)."""
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                children = {int(p) for p in task.read_text().split()}
            except OSError:
                continue
            pending.extend(children - found)
            found |= children
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_sigterm_stops_the_demo_and_every_process_it_started(tmp_path: Path) -> None:
    """SIGTERM while serving: the demo exits and leaves no provider or executor running; its
    piped table is not folded at 80 columns (no COLUMNS, no terminal) (issue 22)."""
    agentsafe = str(Path(sys.executable).parent / "agentsafe")
    output = tmp_path / "demo.out"
    with output.open("wb") as out:
        demo = subprocess.Popen(
            [agentsafe, "demo"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "TERM": "dumb"},
        )
        try:
            deadline = time.monotonic() + 240
            while "Press Ctrl-C to stop." not in output.read_text(errors="replace"):
                assert demo.poll() is None, output.read_text(errors="replace")
                assert time.monotonic() < deadline, "the demo never started serving"
                time.sleep(0.2)
            children = _descendants(demo.pid)
            assert len(children) >= 2, children  # the provider and the executor at least
            demo.send_signal(signal.SIGTERM)
            assert demo.wait(timeout=60) == 0
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children):
        assert time.monotonic() < deadline, [pid for pid in children if _alive(pid)]
        time.sleep(0.1)
    text = output.read_text()
    assert "stopped." in text
    assert any(
        "provider never answers; SIGKILL; restart" in line and "✓" in line
        for line in text.splitlines()
    ), text


@pytest.mark.parametrize(
    ("when", "signals"),
    [
        ("serving", (signal.SIGINT, signal.SIGINT)),
        ("serving", (signal.SIGTERM, signal.SIGTERM)),  # what `timeout` does to `make demo`
        ("starting", (signal.SIGINT, signal.SIGTERM, signal.SIGINT)),
    ],
)
def test_a_second_signal_during_the_clean_up_stays_quiet(
    tmp_path: Path, when: str, signals: tuple[signal.Signals, ...]
) -> None:
    """Interrupted more than once (a second Ctrl-C, or `timeout`), the demo still stops every
    process it started and prints no traceback (issue 31)."""
    agentsafe = str(Path(sys.executable).parent / "agentsafe")
    output = tmp_path / "demo.out"
    marker = "Press Ctrl-C to stop." if when == "serving" else "starting"
    with output.open("wb") as out:
        demo = subprocess.Popen(
            [agentsafe, "demo"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "TERM": "dumb"},
        )
        try:
            deadline = time.monotonic() + 240
            while marker not in output.read_text(errors="replace"):
                assert demo.poll() is None, output.read_text(errors="replace")
                assert time.monotonic() < deadline, f"the demo never printed {marker!r}"
                time.sleep(0.05)
            children = _descendants(demo.pid)
            for sent in signals:
                demo.send_signal(sent)
            assert demo.wait(timeout=60) == 0, output.read_text(errors="replace")
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children):
        assert time.monotonic() < deadline, [pid for pid in children if _alive(pid)]
        time.sleep(0.1)
    text = output.read_text()
    assert "Traceback" not in text, text
    assert "KeyboardInterrupt" not in text, text
    assert "stopped." in text
