"""The seam is composed once (``registration.compose_seam``): ``agentsafe doctor`` hands the
registration functions the same seam the serving process does.

Before, ``tools/doctor.py`` built its own: without the downstream's ``system`` and
``operation`` and with the raw transport as ``fetch``. The doctor runs for real here
(``run_checks`` on a workspace's environment); the registration function only records what it
was given.
"""

from __future__ import annotations

import ast
from pathlib import Path

from agentsafe.executor.config import load_config
from agentsafe.executor.dispatch.registration import Seam
from agentsafe.executor.dispatch.seam import DispatchBoundFetch
from agentsafe.executor.tools.doctor import run_checks
from agentsafe.executor.tools.harness import Workspace, free_port

REPO = Path(__file__).resolve().parents[2]
SEEN: list[Seam] = []


def register_seen(seam: Seam) -> list[str]:
    SEEN.append(seam)
    return []


async def test_doctor_hands_the_registrations_the_serving_seam(tmp_path: Path) -> None:
    SEEN.clear()
    ws = Workspace(tmp_path / "ws")
    env = ws.environment(provider_url="http://127.0.0.1:9", port=free_port())
    env["EXECUTOR_HANDLERS"] = f"{__name__}:register_seen"
    config = load_config(env)
    checks = await run_checks(env)
    [handlers] = [check for check in checks if check.check == "handlers"]
    assert handlers.status == "ok", handlers
    [seam] = SEEN
    assert seam.downstream.system == config.downstream_system == "synthetic-bank"
    assert seam.downstream.operation == config.downstream_operation
    assert isinstance(seam.fetch, DispatchBoundFetch)


def test_only_compose_seam_constructs_a_seam() -> None:
    """No module of the executor but ``dispatch/registration.py`` writes ``Seam(...)``."""
    builders = []
    for path in sorted((REPO / "executor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Seam"
            ):
                builders.append(path.relative_to(REPO).as_posix())
    assert builders == ["executor/dispatch/registration.py"]
