"""docs/quickstart.md, run as written (issue 31: ``init --shape legacy`` wrote no operator, and the
next documented step, ``agentsafe status --token-file ./agentsafe/secrets/operator-token``,
found no file).

Each ```` ```sh ```` block of the page is one path a newcomer follows. The test reads the
blocks from the markdown (so it breaks when the page changes), runs each block as one bash
script from an empty directory with this venv's ``agentsafe`` first on ``PATH``, and records every
command's output and exit status. The only changes to what the page says: port 8443 is a free
port (in the commands, and in the ``agentsafe.env`` each ``init`` writes), and the script waits for
its background job at the end. Then it checks what each command is documented to do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentsafe.executor.tools.harness import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"
BIN = Path(sys.executable).parent
_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.S | re.M)
_INIT_DIR = re.compile(r"agentsafe init .*--dir (\S+)")


def blocks(text: str) -> list[list[str]]:
    """The page's sh blocks, each a list of commands (continuation lines joined)."""
    out = []
    for body in _BLOCK.findall(text):
        commands: list[str] = []
        pending = ""
        for line in body.splitlines():
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            commands.append(pending + line)
            pending = ""
        out.append([c for c in commands if c.strip()])
    return out


@dataclass
class Ran:
    command: str
    rc: int
    out: str
    err: str


def run_block(commands: list[str], where: Path, port: int) -> list[Ran]:
    """One bash script: each command's stdout, stderr and status to files of its own."""
    logs = where / ".runs"
    logs.mkdir()
    script = []
    for n, command in enumerate(commands):
        command = command.replace("8443", str(port))
        script.append(f"{{ {command}\n}} >{logs}/{n}.out 2>{logs}/{n}.err; echo $? >{logs}/{n}.rc")
        init = _INIT_DIR.search(command)
        if init:  # the one change to a written file: the listener's port
            env = f"{init.group(1)}/agentsafe.env"
            script.append(f"sed -i 's/^PORT=8443$/PORT={port}/' {env}")
    script.append("wait")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "COLUMNS": "200"}
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=where, env=env, timeout=240, check=True)
    return [
        Ran(
            command,
            int((logs / f"{n}.rc").read_text()),
            (logs / f"{n}.out").read_text(),
            (logs / f"{n}.err").read_text(),
        )
        for n, command in enumerate(commands)
    ]


def _lines(report: str) -> dict[str, list[str]]:
    """doctor's lines by check."""
    found: dict[str, list[str]] = {}
    for line in report.splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[0] in ("ok", "warn", "fail", "skip"):
            found.setdefault(parts[1], []).append(line)
    return found


def _failing(report: str) -> set[str]:
    return {
        check for check, lines in _lines(report).items() if any(x.startswith("fail") for x in lines)
    }


PATHS = blocks(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_the_paths_this_test_checks() -> None:
    firsts = [block[0] for block in PATHS]
    assert firsts == [
        "agentsafe --version",
        "agentsafe init --shape legacy --dir ./agentsafe",
        "agentsafe init --shape mtls --dir ./agentsafe-mtls",
    ], "a new path on the page needs its checks here"


def test_version_and_agentsafe_test_as_written(tmp_path: Path) -> None:
    ran = run_block(PATHS[0], tmp_path, free_port())
    version, test = ran
    assert (version.rc, version.out.strip()) == (0, "agentsafe 0.1.0"), version
    assert test.rc == 0, test.out + test.err
    assert "agentsafe" in test.out


def test_the_laptop_path_as_written(tmp_path: Path) -> None:
    ran = run_block(PATHS[1], tmp_path, free_port())
    init, doctor, serve, ready, status, propose, again, kill = ran
    assert init.rc == 0, init.err
    # doctor: everything but the placeholder downstream holds; the failing lines say what to do
    assert doctor.rc == 1, doctor.out
    assert _failing(doctor.out) == {"downstream", "lookup"}, doctor.out
    assert _lines(doctor.out)["principals"][0].startswith("ok"), doctor.out
    assert all("->" in line for line in doctor.out.splitlines() if line.startswith("fail"))
    assert serve.rc == 0, serve.err
    assert ready.rc == 0, (tmp_path / "serve.log").read_text()[-4000:]
    # the next step: the operator token the legacy shape now writes
    assert status.rc == 0, status.out + status.err
    assert "mode          SHADOW" in status.out
    assert "0 proposal(s) observed" in status.out
    assert propose.rc == 0, propose.err
    decision = json.loads(propose.out)
    assert decision["mode"] == "SHADOW", decision
    assert decision["executed"] is False, decision
    assert again.rc == 0, again.out + again.err
    assert "1 proposal(s) observed, none executed" in again.out, again.out
    assert "create_payout" in again.out
    assert kill.rc == 0
    log = (tmp_path / "serve.log").read_text()
    assert '"event":"STOPPING"' in log, log[-2000:]


def test_the_production_shapes_as_written(tmp_path: Path) -> None:
    ran = run_block(PATHS[2], tmp_path, free_port())
    init_mtls, doctor_mtls, init_workload, doctor_workload = ran
    assert (init_mtls.rc, init_workload.rc) == (0, 0), init_mtls.err + init_workload.err
    for doctor in (doctor_mtls, doctor_workload):
        assert doctor.rc == 1, doctor.out
        secrets = _lines(doctor.out)["secrets"][0]
        assert secrets.startswith("fail"), doctor.out
        assert "EXECUTOR_TLS_KEY_FILE" in secrets
        assert _lines(doctor.out)["principals"][0].startswith("ok"), doctor.out
        assert all("->" in line for line in doctor.out.splitlines() if line.startswith("fail"))
    assert "jwks" in _failing(doctor_workload.out)
    assert "jwks" not in _lines(doctor_mtls.out)
