"""benchmarks/profile.py's reading of py-spy's collapsed stacks: parts, own time, and under
``--workers`` each process's samples alone (a worker's stacks sit under the supervisor's
``process`` frame, so the innermost one names the process)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from .scripts import load


def _profile_module() -> ModuleType:
    # profile.py imports its sibling as ``loadclient``; never under the stdlib's name ``profile``
    sys.modules.setdefault("loadclient", load("loadclient"))
    return load("profile", "agentsafe_bench_profile")


SUPERVISOR = 'process 10:"python -m agentsafe.executor.cli serve"'
WORKER_0 = 'process 11:"python -I -m agentsafe.executor.cli serve"'
WORKER_1 = 'process 110:"python -I -m agentsafe.executor.cli serve"'


def test_each_process_is_read_alone_and_the_group_as_a_whole(tmp_path: Path) -> None:
    collapsed = tmp_path / "stacks.txt"
    collapsed.write_text(
        "\n".join(
            [
                f"{SUPERVISOR};thread (10): MainThread;_pump (executor/supervisor.py:208) 4",
                f"{SUPERVISOR};{WORKER_0};thread (11): MainThread;"
                "commit (executor/state/usestore.py:1) 3",
                f"{SUPERVISOR};{WORKER_1};thread (110): MainThread;"
                "emit (executor/evidence/chain.py:2);sha256_hex (executor/canonical.py:3) 2",
                f"{SUPERVISOR};{WORKER_1};thread (110): MainThread;"
                "commit (executor/state/usestore.py:1) 1",
            ]
        )
        + "\n"
    )
    profile = _profile_module()
    total, parts, own = profile._parse(collapsed)
    assert total == 10
    assert parts["use store (SQLite commit)"] == 4
    assert own["_pump (executor/supervisor.py:208)"] == 4
    assert profile._parse(collapsed, "10")[0] == 4  # the supervisor's own stacks only
    assert profile._parse(collapsed, "11")[0] == 3  # never worker 1's (pid 110 starts with 11)
    total, parts, own = profile._parse(collapsed, "110")
    assert total == 3
    assert parts["evidence: chain (hash, line, write)"] == 2
    assert parts["evidence: RFC 8785 canonical JSON"] == 2
    assert parts["use store (SQLite commit)"] == 1


def test_cpu_mode_gives_each_sample_to_one_part_and_names_the_threads(tmp_path: Path) -> None:
    collapsed = tmp_path / "stacks.txt"
    loop = (
        "thread (7): MainThread;main (executor/serve.py:1);_run (asyncio/events.py:80);"
        "_handle (aiohttp/web_protocol.py:1)"
    )
    collapsed.write_text(
        "\n".join(
            [
                f"{loop};handle (executor/routes/app.py:5);"
                "emit (executor/evidence/chain.py:2);canonical_text (executor/canonical.py:3) 2",
                f"{loop};handle (executor/routes/app.py:5);uuid4_text (executor/ids.py:9) 3",
                f"{loop};data_received (aiohttp/http_parser.py:4) 1",
                "thread (8): agentsafe-usestore_0;_worker (concurrent/futures/thread.py:81);"
                "work (executor/state/usestore.py:217) 4",
                "thread (8): agentsafe-usestore_0;_worker (concurrent/futures/thread.py:81) 1",
                "thread (8): agentsafe-usestore_0;_worker (concurrent/futures/thread.py:90) 1",
            ]
        )
        + "\n"
    )
    profile = _profile_module()
    total, parts, names = profile._exclusive(collapsed)
    assert total == 12
    assert sum(parts.values()) == total  # each sample counted once
    assert parts["evidence: RFC 8785 canonical JSON"] == 2  # not the chain as well
    assert parts[profile.EXECUTOR_REST[0]] == 3
    assert parts["aiohttp server (parse, answer)"] == 1  # under serve.py's main, yet the loop's
    assert parts["use store (SQLite commit)"] == 4
    assert parts[profile.OTHER] == 2
    assert names == {"7": "MainThread", "8": "agentsafe-usestore_0"}
    modules = profile._by_module(collapsed)
    assert modules["executor/canonical.py"] == 2
    assert modules["executor/ids.py"] == 3
    assert modules["(the loop alone)"] == 3  # serve.py's main runs the loop: not a module's cost
    own = profile._parse(collapsed)[2]
    assert profile._by_function(own)["_worker (concurrent/futures/thread.py)"] == 2
