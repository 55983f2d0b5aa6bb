"""Run in a subprocess by tests/host/test_posture.py: a condition the test process must not have.

Usage: ``python posture_child.py <scenario>``; prints one JSON object with the posture's view.
Scenarios: ``trace`` (a trace function), ``profile``, ``thread-trace``, ``debugger`` (a
debugger module loaded), ``unverified-tls`` (the default HTTPS context swapped for the
unverified one), ``plain`` (nothing), and ``guarded`` (the process guard installed, its self-test
fed to an ENFORCED check; the host-specific failures are expected, the guard checks must hold).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

from agentsafe.executor.events import MemorySink
from agentsafe.executor.host.audithook import install_guard
from agentsafe.executor.host.posture import (
    PostureInputs,
    PostureMode,
    PostureRefused,
    check_posture,
    evaluate_posture,
)


def tracer(frame: types.FrameType, event: str, arg: Any) -> None:
    return None


def main() -> None:
    scenario = sys.argv[1]
    inputs = PostureInputs(mode=PostureMode.ENFORCED, production=True, environ={})
    if scenario == "guarded":
        state = Path(tempfile.mkdtemp())
        guard = install_guard(writable_dirs=[state])
        inputs = PostureInputs(
            mode=PostureMode.ENFORCED,
            production=True,
            environ={},
            guard_results=guard.self_test(),
        )
        try:
            check_posture(inputs, security=MemorySink())
        except PostureRefused as exc:
            print(json.dumps({"refused": list(exc.checks)}))
        return
    if scenario == "trace":
        sys.settrace(tracer)
    elif scenario == "profile":
        sys.setprofile(tracer)
    elif scenario == "thread-trace":
        threading.settrace(tracer)
    elif scenario == "debugger":
        sys.modules["debugpy"] = types.ModuleType("debugpy")
    elif scenario == "unverified-tls":
        ssl._create_default_https_context = ssl._create_unverified_context
    report = evaluate_posture(inputs, only=("TRACER_ACTIVE", "TLS_VERIFY_DISABLED"))
    sys.settrace(None)
    sys.setprofile(None)
    threading.settrace(None)  # type: ignore[arg-type]
    print(
        json.dumps(
            {
                r.name: {"ok": r.ok, "detail": r.detail, "dev": sys.flags.dev_mode}
                for r in report.results
            }
        )
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
