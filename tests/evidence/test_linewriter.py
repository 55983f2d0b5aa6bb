"""LineWriter on the interpreter's own standard streams: the same bytes as the stream would write,
in order with what the stream buffered, written with the GIL held where that cannot wait
(``host/heldwrite.py``), and the ordinary way for every other stream and every line that could.

Each case runs a child interpreter, because only its ``sys.__stdout__`` and ``sys.__stderr__``
take the held path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentsafe.executor.host.heldwrite import PIPE_BUF

LINES = [
    '{"event":"DECISION","seq":1}',
    '{"event":"NOTE","text":"é ☃ 𝄞 ünïcödé"}\n',
    '{"pad":"' + "x" * (PIPE_BUF + 100) + '"}',  # longer than PIPE_BUF: the ordinary way
    '{"event":"LAST"}',
]

CHILD = textwrap.dedent(
    """
    import json, sys
    from agentsafe.executor.evidence import chain

    lines = json.loads(sys.argv[1])
    held = []
    real = chain.HeldDescriptor.write

    def counting(self, data):
        written = real(self, data)
        held.append(written)
        return written

    chain.HeldDescriptor.write = counting
    for stream in (sys.stdout, sys.stderr):
        writer = chain.LineWriter.for_stream(stream)
        stream.write("buffered before|")  # not flushed: it must come first
        for line in lines:
            writer.write_line(line)
        stream.write("after\\n")
        stream.flush()
    print(json.dumps(held), file=open(sys.argv[2], "w"))
    """
)


def _expected(encoding: str = "utf-8") -> bytes:
    text = "buffered before|" + "".join(
        line if line.endswith("\n") else line + "\n" for line in LINES
    )
    return (text + "after\n").encode(encoding)


def _run(
    tmp_path: Path, *, to_files: bool, encoding: str = "utf-8"
) -> tuple[bytes, bytes, list[int]]:
    """The child's standard output and error, and what each held write wrote."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    report = tmp_path / "held.json"
    argv = [sys.executable, "-c", CHILD, json.dumps(LINES), str(report)]
    if to_files:
        out_path, err_path = tmp_path / "out", tmp_path / "err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            subprocess.run(argv, stdout=out, stderr=err, env=env, check=True, timeout=60)
        return out_path.read_bytes(), err_path.read_bytes(), json.loads(report.read_text())
    done = subprocess.run(argv, capture_output=True, env=env, check=True, timeout=60)
    return done.stdout, done.stderr, json.loads(report.read_text())


@pytest.mark.parametrize("to_files", [False, True], ids=["pipes", "files"])
def test_the_standard_streams_get_the_same_bytes_mostly_written_held(
    tmp_path: Path, to_files: bool
) -> None:
    out, err, held = _run(tmp_path, to_files=to_files)
    assert out == _expected()
    assert err == _expected()
    lengths = [len((line if line.endswith("\n") else line + "\n").encode()) for line in LINES]
    # every line but the long one was written whole with the GIL held, on both streams
    short = [n if n <= PIPE_BUF else 0 for n in lengths]
    assert held == short + short


def test_a_stream_in_another_encoding_is_written_the_ordinary_way(tmp_path: Path) -> None:
    text = _expected().decode()
    out, err, held = _run(tmp_path, to_files=False, encoding="utf-16")
    assert out.decode("utf-16") == text
    assert err.decode("utf-16") == text
    assert held == []
